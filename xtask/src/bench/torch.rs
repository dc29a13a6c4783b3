//! A persistent PyTorch peer process, so torch is measured in the same run, interleaved
//! with redco, on the same thread count.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

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
}

impl Drop for TorchPeer {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "{}", serde_json::json!({"op": "quit"}));
        let _ = self.child.wait();
    }
}
