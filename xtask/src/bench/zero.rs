//! `cargo xtask bench zero`: what the memory tools cost in speed, through `redco train` as a
//! user runs it, on thread ranks in one process (the binary beside this program: `cargo
//! build --release -p redco`). Rows, all at `--mesh` (default 4x1):
//!
//! - DDP (`--zero 0 --recompute none`), the peer;
//! - ZeRO-3 (`--zero 3 --recompute none`): each layer's parameters all-gathered before its
//!   forward (kept, with its activations, for its backward) and its gradients
//!   reduce-scattered;
//! - DDP with block recompute, and ZeRO-3 with block recompute (gathered a second time for
//!   the recomputed forward).
//!
//! Repetitions are interleaved (each repetition runs every row once); a row's figure is
//! the median over repetitions of its run's median tokens/s over the steps after the
//! first. Printed: tokens/s, step time, the ratio to DDP, and the first and last losses
//! (every row must agree). Flags: `--preset` (default llama-small, the bench LLaMA's
//! shape), `--mesh` (4x1), `--steps` (6), `--batch` (8), `--seq` (256), `--reps` (2),
//! `--json FILE`.

use super::memory::{metrics, redco_beside};
use super::stats::median;
use crate::args::Args;
use std::path::PathBuf;
use std::process::Command;

/// The rows: name, `--zero`, `--recompute`.
const ROWS: [(&str, &str, &str); 4] = [
    ("DDP", "0", "none"),
    ("ZeRO-3", "3", "none"),
    ("DDP + block recompute", "0", "block"),
    ("ZeRO-3 + block recompute", "3", "block"),
];

/// Runs the benchmark.
pub fn run(argv: &[String]) -> Result<(), String> {
    let a = Args::parse(argv, &[])?;
    a.only(&["preset", "mesh", "steps", "batch", "seq", "reps", "json"])?;
    let preset = a.get("preset").unwrap_or("llama-small").to_string();
    let mesh = a.get("mesh").unwrap_or("4x1").to_string();
    let (steps, batch, seq, reps) = (a.num("steps", 6)?, a.num("batch", 8)?, a.num("seq", 256)?, a.num("reps", 2)?);
    let redco = redco_beside("cargo build --release -p redco", "bench zero")?;
    let scratch = std::env::temp_dir().join(format!("redco-bench-zero-{}", std::process::id()));
    println!("machine: {}", crate::machine::describe());
    println!(
        "redco train --preset {preset} --mesh {mesh} (thread ranks), batch {batch} x {seq}, {steps} steps, f32, AdamW"
    );
    let mut toks = vec![Vec::new(); ROWS.len()];
    let mut times = vec![Vec::new(); ROWS.len()];
    let mut losses = vec![Vec::new(); ROWS.len()];
    for rep in 0..reps {
        for (i, (what, zero, recompute)) in ROWS.iter().enumerate() {
            eprintln!("xtask: repetition {}/{reps}: {what}", rep + 1);
            let w = scratch.join(format!("row{i}"));
            let o = Command::new(&redco)
                .args(["train", "--preset", &preset, "--mesh", &mesh, "--steps", &steps.to_string()])
                .args(["--batch-size", &batch.to_string(), "--seq-len", &seq.to_string()])
                .args(["--checkpoint-every", "100000", "--sample-tokens", "0", "--overwrite", "--oversubscribe"])
                .args(["--zero", zero, "--recompute", recompute, "--workdir"])
                .arg(&w)
                .output()
                .map_err(|e| format!("{}: {e}", redco.display()))?;
            if !o.status.success() {
                return Err(format!("the {what} row failed: {}", String::from_utf8_lossy(&o.stderr).trim()));
            }
            let (l, step_s, tok_s) = metrics(&w);
            toks[i].push(tok_s);
            times[i].push(step_s);
            losses[i] = l;
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    let tok: Vec<f64> = toks.iter().map(|v| median(v)).collect();
    let time: Vec<f64> = times.iter().map(|v| median(v)).collect();
    println!("\n{:<28} {:>10} {:>10} {:>10}  losses (first, last)", "row", "tok/s", "step (s)", "x DDP");
    for (i, (what, _, _)) in ROWS.iter().enumerate() {
        println!(
            "{what:<28} {:>10.1} {:>10.3} {:>10.2}  {:.6}, {:.6}",
            tok[i],
            time[i],
            tok[i] / tok[0],
            losses[i].first().copied().unwrap_or(f64::NAN),
            losses[i].last().copied().unwrap_or(f64::NAN)
        );
    }
    let (z3, rc) = (tok[1] / tok[0], time[2] / time[0]);
    println!("\nZeRO-3 tokens/s / DDP's: {z3:.2}x; block recompute step / DDP's step: {rc:.2}x");
    if let Some(path) = a.get("json") {
        let rows: Vec<serde_json::Value> = ROWS
            .iter()
            .enumerate()
            .map(|(i, (what, _, _))| {
                serde_json::json!({"row": what, "tokens_per_s": tok[i], "step_s": time[i], "losses": losses[i]})
            })
            .collect();
        let doc = serde_json::json!({"machine": crate::machine::describe(), "preset": preset, "mesh": mesh,
            "rows": rows, "zero3_over_ddp": z3, "recompute_step_over_ddp": rc});
        std::fs::write(PathBuf::from(path), doc.to_string()).map_err(|e| format!("{path}: {e}"))?;
    }
    Ok(())
}
