//! A persistent PyTorch peer process, so torch is measured in the same run, interleaved
//! with redco, on the same thread count.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// One `train_real` answer of the peer: real-size training steps of transformers + torch (f32 master
/// weights, bf16 autocast, AdamW), eager or `torch.compile`d.
#[derive(Debug, Clone, PartialEq)]
pub struct TorchTrain {
    /// Seconds of each timed step (the untimed warm-up steps left out).
    pub times: Vec<f64>,
    /// The loss of every step, warm-up steps included (NaN where the peer's was not finite).
    pub losses: Vec<f64>,
    /// The CUDA allocator's peak allocated bytes over the timed steps (`torch.cuda.max_memory_allocated`);
    /// `None` on the CPU.
    pub peak_bytes: Option<u64>,
    /// The model's parameter count (tied embeddings counted once).
    pub params: u64,
    /// The peer's `torch.__version__`.
    pub torch: String,
    /// The GPU's name (`torch.cuda.get_device_name()`), or `cpu`.
    pub device: String,
    /// The driver as the peer names it (NVIDIA driver and CUDA driver API versions), or `none` on the CPU.
    pub driver: String,
}

/// The Python peer (python/torch_peer.py) answering one JSON line per request.
pub struct TorchPeer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// What the peer reported about itself (torch version, threads, BLAS).
    pub info: serde_json::Value,
}

impl TorchPeer {
    /// Starts `python python/torch_peer.py --threads N`. Where the CPU backend runs as on an
    /// AVX2-only machine (`REDCO_ASSUME_NO_AVX512`), torch is held to AVX2 too (MKL's and
    /// ATen's own switches), so that the two sides of every ratio use the same vectors.
    pub fn start(python: &str, threads: usize) -> Result<Self, String> {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/torch_peer.py");
        let mut child = Command::new(python)
            .args([script, "--threads", &threads.to_string()])
            .envs(crate::machine::peer_isa_env())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start `{python}`: {e}"))?;
        let stdin = child.stdin.take().ok_or("no stdin")?;
        let stdout = BufReader::new(child.stdout.take().ok_or("no stdout")?);
        let mut peer = TorchPeer { child, stdin, stdout, info: serde_json::Value::Null };
        peer.info = peer.ask(&serde_json::json!({"op": "info"}))?;
        Ok(peer)
    }

    /// The peer's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends one request and reads its JSON answer.
    pub fn ask(&mut self, req: &serde_json::Value) -> Result<serde_json::Value, String> {
        writeln!(self.stdin, "{req}").map_err(|e| format!("torch peer: {e}"))?;
        self.stdin.flush().map_err(|e| format!("torch peer: {e}"))?;
        let mut line = String::new();
        self.stdout.read_line(&mut line).map_err(|e| format!("torch peer: {e}"))?;
        if line.is_empty() {
            return Err("torch peer exited (is torch installed for this python?)".into());
        }
        let v: serde_json::Value =
            serde_json::from_str(&line).map_err(|e| format!("torch peer said `{}`: {e}", line.trim()))?;
        if let Some(err) = v.get("error") {
            return Err(format!("torch peer: {err}"));
        }
        Ok(v)
    }

    /// Seconds per call of `torch.matmul` for each of `reps` timed calls.
    pub fn gemm_times(
        &mut self,
        m: usize,
        n: usize,
        k: usize,
        reps: usize,
        dtype: &str,
        (trans_a, trans_b): (bool, bool),
    ) -> Result<Vec<f64>, String> {
        let req = serde_json::json!({
            "op": "gemm", "m": m, "n": n, "k": k, "reps": reps, "dtype": dtype, "trans_a": trans_a, "trans_b": trans_b,
        });
        let v = self.ask(&req)?;
        v["times"]
            .as_array()
            .map(|a| a.iter().filter_map(|x| x.as_f64()).collect())
            .ok_or_else(|| "torch peer: no times".to_string())
    }

    /// Runs one `train_real` request (its `op` is set here): a fresh random LlamaForCausalLM of `config`
    /// (transformers.LlamaConfig's keyword arguments), `warmup` untimed then `reps` timed steps on random ids
    /// `[batch, seq]`, attention `attn` (`sdpa` or `eager`), `torch.compile`d where `compile` is true, AdamW of
    /// `lr` and `weight_decay`; the peer frees the model before it answers.
    pub fn train_real(&mut self, req: &serde_json::Value) -> Result<TorchTrain, String> {
        let mut req = req.clone();
        let obj = req.as_object_mut().ok_or("torch peer: a train_real request must be a JSON object")?;
        obj.insert("op".into(), "train_real".into());
        parse_train(&self.ask(&req)?)
    }
}

/// A `train_real` answer as a [`TorchTrain`], naming the first field missing or of the wrong type.
fn parse_train(v: &serde_json::Value) -> Result<TorchTrain, String> {
    let field = |k: &str| v.get(k).ok_or_else(|| format!("torch peer: the train_real answer has no `{k}`"));
    let bad = |k: &str, x: &serde_json::Value, want: &str| format!("torch peer: train_real `{k}` is {x}, not {want}");
    let numbers = |k: &str, null_is_nan: bool| -> Result<Vec<f64>, String> {
        let a = field(k)?;
        let a = a.as_array().ok_or_else(|| bad(k, a, "an array"))?;
        a.iter()
            .map(|x| match x.as_f64() {
                Some(f) => Ok(f),
                None if null_is_nan && x.is_null() => Ok(f64::NAN),
                None => Err(bad(k, x, "a number")),
            })
            .collect()
    };
    let text = |k: &str| -> Result<String, String> {
        let x = field(k)?;
        x.as_str().map(str::to_string).ok_or_else(|| bad(k, x, "a string"))
    };
    let count = |k: &str| -> Result<u64, String> {
        let x = field(k)?;
        x.as_u64().ok_or_else(|| bad(k, x, "a count"))
    };
    Ok(TorchTrain {
        times: numbers("times", false)?,
        losses: numbers("losses", true)?,
        peak_bytes: if field("peak_bytes")?.is_null() { None } else { Some(count("peak_bytes")?) },
        params: count("params")?,
        torch: text("torch")?,
        device: text("device")?,
        driver: text("driver")?,
    })
}

impl Drop for TorchPeer {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "{}", serde_json::json!({"op": "quit"}));
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::parse_train;
    use serde_json::json;

    #[test]
    fn train_real_answers_parse_and_missing_or_mistyped_fields_are_named() {
        let v = json!({
            "times": [0.5, 0.25], "losses": [10.5, 10.25, null, 10.0], "peak_bytes": 123456789, "params": 1100048384,
            "torch": "2.5.1+cu124", "device": "NVIDIA H100 80GB HBM3", "driver": "nvidia 550.54.15",
            "compiled": true, "peak_rss_kib": 4096,
        });
        let t = parse_train(&v).unwrap();
        assert_eq!(t.times, [0.5, 0.25]);
        assert!(t.losses.len() == 4 && t.losses[..2] == [10.5, 10.25] && t.losses[2].is_nan() && t.losses[3] == 10.0);
        assert_eq!((t.peak_bytes, t.params), (Some(123456789), 1100048384));
        assert_eq!(
            (t.torch.as_str(), t.device.as_str(), t.driver.as_str()),
            ("2.5.1+cu124", "NVIDIA H100 80GB HBM3", "nvidia 550.54.15")
        );
        // on the CPU the peak is null
        let mut cpu = v.clone();
        cpu["peak_bytes"] = serde_json::Value::Null;
        assert_eq!(parse_train(&cpu).unwrap().peak_bytes, None);
        for k in ["times", "losses", "peak_bytes", "params", "torch", "device", "driver"] {
            let mut missing = v.clone();
            missing.as_object_mut().unwrap().remove(k);
            let e = parse_train(&missing).unwrap_err();
            assert!(e.contains(&format!("no `{k}`")), "{e}");
        }
        let mistyped = [
            ("times", json!([0.5, null])),
            ("times", json!("fast")),
            ("losses", json!([1.0, "x"])),
            ("peak_bytes", json!(1.5)),
            ("params", json!(-1)),
            ("torch", json!(2)),
            ("driver", json!(null)),
        ];
        for (k, x) in mistyped {
            let mut bad = v.clone();
            bad[k] = x;
            let e = parse_train(&bad).unwrap_err();
            assert!(e.contains(&format!("`{k}` is")), "{e}");
        }
    }
}
