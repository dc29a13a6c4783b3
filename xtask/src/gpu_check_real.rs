//! `cargo xtask gpu-check cuda --real-size [--python PY] [--steps N] [--batch B] [--seq T]`:
//! training at real size on one GPU, next to torch on the same GPU in the same run.
//!
//! For the 0.7B preset's shape and a 1.3B shape (LLaMA, vocabulary 32000), a random bf16
//! checkpoint is written once (`target/real-size/<name>`, with a byte-level tokenizer) and
//! trained by `redco train --backend cuda --dtype bf16 --profile` at batch 8 x 1024 (f32
//! masters, AdamW): its tokens/s, MFU (6N + 12LHQT against the device's dense bf16 peak)
//! and table of device time by op family (`--no-save`: no checkpoint or model to write on
//! the GPU machine's disk). torch trains the same shapes on the same batch
//! (bf16 autocast over f32 weights, SDPA attention, fused AdamW), eager and under
//! `torch.compile`, through the peer (`python/torch_peer.py`'s `train_real`). The AdamW
//! row is set against its bound: the bytes a mixed-precision step moves
//! (`redco_core::ops::adamw::master_step_bytes`) over the device's copy rate (`gemm_tflops`'s `copy`
//! line).

use crate::bench::torch::TorchPeer;
use crate::gpu_check::cargo;
use redco_core::ops::adamw::master_step_bytes;
use redco_core::planning::flops::{matmul_params, train_flops_per_token};
use redco_core::planning::planner::ModelDims;
use redco_core::DType;
use redco_models::hf::config::HfConfig;
use std::path::{Path, PathBuf};

/// A LLaMA shape: (hidden, layers, heads, intermediate).
type Shape = (usize, usize, usize, usize);

/// The shapes trained at real size, by name.
const SHAPES: [(&str, Shape); 2] = [("llama-0.7b", (1536, 25, 16, 4096)), ("llama-1.3b", (2048, 24, 16, 5504))];

/// The vocabulary of the real-size shapes (LLaMA's).
const VOCAB: usize = 32000;

/// What `redco train --profile` printed: tokens/s, ms a step, MFU (a fraction), the
/// device's peak (TFLOP/s) and the AdamW row's ms a step.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Profiled {
    pub tok_s: f64,
    pub step_ms: f64,
    pub mfu: Option<f64>,
    pub peak_tflops: Option<f64>,
    pub adamw_ms: Option<f64>,
}

/// Reads `redco train --profile`'s lines: `profile over N steps after the first: X ms a
/// step, Y tokens/s`, `MFU Z% (... of the device's P dense)` and the table's `AdamW` row
/// (`AdamW  calls  ms/step  share`).
pub(crate) fn parse_profile(out: &str) -> Option<Profiled> {
    let line = out.lines().find(|l| l.starts_with("profile over "))?;
    let (_, rest) = line.split_once(": ")?;
    let mut parts = rest.split(", ");
    let step_ms = parts.next()?.split_whitespace().next()?.parse().ok()?;
    let tok_s = parts.next()?.split_whitespace().next()?.parse().ok()?;
    let mfu_line = out.lines().find(|l| l.starts_with("MFU "));
    let mfu = mfu_line
        .and_then(|l| l.split_whitespace().nth(1)?.trim_end_matches('%').parse::<f64>().ok())
        .map(|p| p / 100.0);
    let peak_tflops =
        mfu_line.and_then(|l| l.split("of the device's ").nth(1)?.split_whitespace().next()?.parse::<f64>().ok());
    let adamw_ms =
        out.lines().find(|l| l.starts_with("AdamW ")).and_then(|l| l.split_whitespace().nth(2)?.parse::<f64>().ok());
    Some(Profiled { tok_s, step_ms, mfu, peak_tflops, adamw_ms })
}

/// The `copy <GB/s> GB/s` line of `gemm_tflops`: bytes per second.
pub(crate) fn parse_copy_rate(out: &str) -> Option<f64> {
    let l = out.lines().find(|l| l.starts_with("copy "))?;
    Some(l.split_whitespace().nth(1)?.parse::<f64>().ok()? * 1e9)
}

/// The config.json of a real-size shape (bf16 weights, context 2048).
fn config_text((hidden, layers, heads, inter): Shape) -> String {
    serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
        "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": heads, "vocab_size": VOCAB, "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu", "tie_word_embeddings": false,
        "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16"
    })
    .to_string()
}

/// The model directory of a shape: a random bf16 checkpoint and a byte-level tokenizer,
/// written once.
fn model_dir(name: &str, shape: Shape) -> Result<PathBuf, String> {
    let dir = Path::new("target").join("real-size").join(name);
    let text = config_text(shape);
    let cfg = HfConfig::from_json(&text).map_err(|e| e.to_string())?;
    let same = HfConfig::from_dir(&dir).is_ok_and(|c| c.raw == cfg.raw);
    if !same || !dir.join("model.safetensors").is_file() || !dir.join("tokenizer.json").is_file() {
        eprintln!("xtask: writing a random {name} checkpoint to {}", dir.display());
        let shapes = cfg.param_shapes().map_err(|e| e.to_string())?;
        crate::bench::random_ckpt::write(&dir, &text, &shapes)?;
        redco_models::presets::write_byte_tokenizer(&dir).map_err(|e| e.to_string())?;
    }
    Ok(dir)
}

/// `redco train --backend cuda --dtype bf16 --profile --no-save` of the model in `dir`
/// (with `extra` flags): its success and output.
fn train(
    envs: &[(&str, &str)],
    name: &str,
    dir: &Path,
    (steps, batch, seq): (usize, usize, usize),
    extra: &[&str],
) -> Result<(bool, String), String> {
    let wd = std::env::temp_dir().join(format!("redco-real-size-{name}-{}", std::process::id()));
    let (d, w) = (dir.to_string_lossy().into_owned(), wd.to_string_lossy().into_owned());
    let (st, b, t) = (steps.to_string(), batch.to_string(), seq.to_string());
    let head = ["run", "--release", "-q", "-p", "redco", "--features", "cuda", "--", "train", "--backend", "cuda"];
    let run = [
        "--model",
        &d,
        "--dtype",
        "bf16",
        "--batch-size",
        &b,
        "--seq-len",
        &t,
        "--steps",
        &st,
        "--warmup",
        "0",
        "--profile",
        "--no-save",
        "--workdir",
        &w,
        "--overwrite",
    ];
    let r = cargo(&[&head[..], &run[..], extra].concat(), envs, true);
    let _ = std::fs::remove_dir_all(&wd);
    r
}

/// The 7B row (`--with-7b`): the `llama-7b` shape of `redco plan` (hidden 4096, 32 layers,
/// 32 heads, intermediate 11008, vocabulary 32000) in bf16 with AdamW and block
/// recompute, the memory tools the planner picks for the device (optimizer offload where
/// the device does not hold the f32 masters and moments): tokens/s, MFU, the device's
/// peak and the planner's line.
pub(crate) fn row_7b(
    envs: &[(&str, &str)],
    (steps, batch, seq): (usize, usize, usize),
) -> Result<Vec<(String, String, bool)>, String> {
    let shape = (4096, 32, 32, 11008);
    let dir = model_dir("llama-7b", shape)?;
    let (ok, out) = train(envs, "llama-7b", &dir, (steps, batch, seq), &["--recompute", "block"])?;
    let what = format!("llama-7b bf16 training, batch {batch} x {seq}, block recompute");
    let memory = out.lines().find(|l| l.starts_with("memory: ")).unwrap_or("memory: (no line)").to_string();
    let peak = out.lines().find(|l| l.starts_with("peak device memory: ")).unwrap_or("").to_string();
    Ok(match parse_profile(&out).filter(|_| ok) {
        Some(p) => {
            let mfu = p.mfu.map_or("MFU unknown".into(), |m| format!("MFU {:.1}%", 100.0 * m));
            vec![
                (
                    format!("{what}: redco"),
                    format!("{:.0} tok/s, {mfu}, {:.1} ms a step; {peak}", p.tok_s, p.step_ms),
                    true,
                ),
                ("llama-7b: the planner's choice".into(), memory, true),
            ]
        }
        None => vec![(format!("{what}: redco"), "failed (see above)".into(), false)],
    })
}

/// Trains every shape with redco and torch; the rows of `gpu-check cuda`'s table.
pub(crate) fn rows(
    envs: &[(&str, &str)],
    python: &str,
    (steps, batch, seq): (usize, usize, usize),
) -> Result<Vec<(String, String, bool)>, String> {
    let mut rows = Vec::new();
    // the device's copy rate, for AdamW's bound
    let (_, out) =
        cargo(&["run", "--release", "-p", "redco-cuda", "--example", "gemm_tflops", "--", "1024"], envs, true)?;
    let copy = parse_copy_rate(&out);
    std::env::set_var("REDCO_TORCH_DEVICE", "cuda");
    let mut peer = match TorchPeer::start(python, crate::machine::cores()) {
        Ok(p) => Some(p),
        Err(e) => {
            rows.push(("torch peer".into(), format!("not started: {e}"), false));
            None
        }
    };
    for (name, shape) in SHAPES {
        let (hidden, layers, heads, inter) = shape;
        let dims = ModelDims { layers, hidden, heads, kv_heads: heads, vocab: VOCAB, intermediate: inter, moe: None };
        let flops = train_flops_per_token(&dims, seq);
        let dir = model_dir(name, shape)?;
        let (ok, out) = train(envs, name, &dir, (steps, batch, seq), &[])?;
        let what = format!("{name} bf16 training, batch {batch} x {seq}");
        let redco = parse_profile(&out).filter(|_| ok);
        match &redco {
            Some(p) => {
                let mfu = p.mfu.map_or("MFU unknown".into(), |m| format!("MFU {:.1}%", 100.0 * m));
                rows.push((
                    format!("{what}: redco"),
                    format!("{:.0} tok/s, {mfu}, {:.1} ms a step", p.tok_s, p.step_ms),
                    true,
                ));
                if let (Some(ms), Some(c)) = (p.adamw_ms, copy) {
                    let bytes = master_step_bytes(DType::BF16, DType::BF16);
                    let bound = (matmul_params(&dims) + (hidden * VOCAB) as u64) as f64 * bytes as f64 / c * 1e3;
                    rows.push((
                        format!("{name} AdamW against its bound"),
                        format!(
                            "{ms:.2} ms a step, bound {bound:.2} ms ({bytes} B a parameter at {:.0} GB/s): {:.2}x",
                            c / 1e9,
                            ms / bound
                        ),
                        true,
                    ));
                }
            }
            None => rows.push((format!("{what}: redco"), "failed (see above)".into(), false)),
        }
        let Some(peer) = peer.as_mut() else { continue };
        let config = serde_json::json!({
            "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": heads, "vocab_size": VOCAB,
            "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false,
        });
        for compile in [false, true] {
            let label = if compile { "torch.compile" } else { "torch eager" };
            let req = serde_json::json!({
                "config": config, "batch": batch, "seq": seq, "warmup": 2, "reps": steps.max(3), "compile": compile,
                "attn": "sdpa",
            });
            match peer.train_real(&req) {
                Ok(r) => {
                    let s = crate::bench::stats::median(&r.times);
                    let tok_s = (batch * seq) as f64 / s;
                    let peak = redco.as_ref().and_then(|p| p.peak_tflops);
                    let mfu = peak
                        .map_or("MFU unknown".into(), |p| format!("MFU {:.1}%", 100.0 * flops * tok_s / (p * 1e12)));
                    let ratio = redco.as_ref().map_or(String::new(), |p| format!("; redco {:.2}x", p.tok_s / tok_s));
                    let text =
                        format!("{tok_s:.0} tok/s, {mfu}{ratio} (torch {}, {}, {})", r.torch, r.device, r.driver);
                    rows.push((format!("{what}: {label}"), text, true));
                }
                Err(e) => rows.push((format!("{what}: {label}"), format!("failed: {e}"), false)),
            }
        }
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_profile_lines_of_redco_train_are_read() {
        let out = "loss 10.4 -> 9.8\n\nprofile over 5 steps after the first: 103.2 ms a step, 79380 tokens/s\n\
                   MFU 40.3% (5.01 GFLOP a token, 6N + 12LHQT; 397.7 TFLOP/s of the device's 989 dense)\n\
                   op family                                     calls    ms/step   share\n\
                   matmul                                          350      60.10   58.2%\n\
                   AdamW                                             1       4.31    4.2%\n";
        let p = parse_profile(out).unwrap();
        assert_eq!((p.step_ms, p.tok_s), (103.2, 79380.0));
        assert!((p.mfu.unwrap() - 0.403).abs() < 1e-12);
        assert_eq!((p.peak_tflops, p.adamw_ms), (Some(989.0), Some(4.31)));
        // a backend without timers: tokens/s alone
        let cpu =
            "profile over 3 steps after the first: 40.0 ms a step, 1600 tokens/s\n(this backend has no device timers)";
        assert_eq!(parse_profile(cpu).unwrap(), Profiled { tok_s: 1600.0, step_ms: 40.0, ..Default::default() });
        assert_eq!(parse_profile("loss 1 -> 0.5"), None);
        assert_eq!(parse_copy_rate("gemm bf16 1024^3 300.0 TFLOP/s\ncopy 3950 GB/s\n"), Some(3.95e12));
    }

    #[test]
    fn the_shapes_are_the_sizes_they_are_named_for() {
        for (name, (hidden, layers, heads, inter)) in SHAPES {
            let dims =
                ModelDims { layers, hidden, heads, kv_heads: heads, vocab: VOCAB, intermediate: inter, moe: None };
            let total = matmul_params(&dims) + (hidden * VOCAB) as u64;
            let want = if name == "llama-0.7b" { 0.806e9 } else { 1.345e9 };
            assert!((total as f64 / want - 1.0).abs() < 0.02, "{name}: {total}");
            let cfg = HfConfig::from_json(&config_text((hidden, layers, heads, inter))).unwrap();
            let n: usize = cfg.param_shapes().unwrap().iter().map(|(_, s)| s.elem_count()).sum();
            assert_eq!(n as u64, total, "{name}: the checkpoint holds what the FLOPs count, and the embedding");
        }
    }
}
