//! `cargo xtask bench zero`: what the memory tools cost in speed, through `redco train` as a
//! user runs it, on thread ranks in one process (the binary beside this program: `cargo
//! build --release -p redco`), or with `--procs` on MPI processes, one per rank (`cargo
//! build --release -p redco --features mpi`, and xtask with `--features mpi`). Rows, all at
//! `--mesh` (default 4x1):
//!
//! - DDP (`--zero 0 --recompute none`), the peer;
//! - ZeRO-3 (`--zero 3 --recompute none`): each unit's parameters all-gathered before its
//!   forward (kept, with its activations, for its backward) and its gradients
//!   reduce-scattered, in units of the planner's size (its fewest layers reaching a 25 MB
//!   collective), and again pinned to one layer a unit (`--unit-layers 1`);
//! - DDP and ZeRO-3 with selective recompute (each layer's matmul, attention and all-reduce
//!   outputs kept, its norms, rotary embeddings, SiLU and product recomputed) and with block
//!   recompute (the layer recomputed from its input; ZeRO-3 gathers it a second time for
//!   either).
//!
//! Repetitions are interleaved (each repetition runs every row once); a row's figure is
//! the median over repetitions of its run's median tokens/s over the steps after the
//! first. Each run's peak RSS (GNU time's `%M`: the process holding every thread rank) is
//! printed (with `--procs`, the largest process's), and for the DDP rows the activations it
//! implies: the peak less the floor, a DDP run at `--seq-len 8` (the same state, almost no
//! activations). Printed: tokens/s, step time,
//! the ratio to DDP, peak RSS, activations, and the first and last losses (every row must
//! agree). Flags: `--preset` (default llama-small, the bench LLaMA's shape), `--mesh`
//! (4x1), `--steps` (6), `--batch` (8), `--seq` (256), `--reps` (2), `--json FILE`, `--procs`.

use super::memory::{metrics, peaks, redco_beside, under_mpirun};
use super::stats::median;
use crate::args::Args;
use std::path::PathBuf;
use std::process::Command;

/// The rows: name, `--zero`, `--recompute`, `--unit-layers` (empty: the planner's).
const ROWS: [(&str, &str, &str, &str); 8] = [
    ("DDP", "0", "none", ""),
    ("ZeRO-3", "3", "none", ""),
    ("DDP + selective recompute", "0", "selective", ""),
    ("DDP + block recompute", "0", "block", ""),
    ("ZeRO-3 + selective recompute", "3", "selective", ""),
    ("ZeRO-3 + block recompute", "3", "block", ""),
    ("ZeRO-3, 1 layer a unit", "3", "none", "1"),
    ("ZeRO-3 + block, 1 layer a unit", "3", "block", "1"),
];

/// One `redco train` run under GNU time, in one process or as `procs` MPI processes: its
/// losses, step time, tokens/s and peak RSS (bytes; the largest process's).
fn train(
    redco: &std::path::Path,
    args: &[String],
    w: &std::path::Path,
    procs: Option<usize>,
) -> Result<(Vec<f64>, f64, f64, f64), String> {
    if let Some(np) = procs {
        let mut a = args.to_vec();
        a.push(w.to_string_lossy().into_owned());
        let dir = w.with_extension("mpirun");
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let (_, err) = under_mpirun(np, redco, &a, &dir)?;
        let peak = peaks(&err).into_iter().max().map_or(f64::NAN, |k| k as f64 * 1024.0);
        let (l, step_s, tok_s) = metrics(w);
        return Ok((l, step_s, tok_s, peak));
    }
    let o = Command::new("/usr/bin/time")
        .args(["-f", "redco-peak-kib %M"])
        .arg(redco)
        .args(args)
        .arg(w)
        .output()
        .map_err(|e| format!("/usr/bin/time (GNU time: apt-get install time): {e}"))?;
    let err = String::from_utf8_lossy(&o.stderr);
    if !o.status.success() {
        return Err(err.trim().to_string());
    }
    let peak = peaks(&err).first().map_or(f64::NAN, |k| *k as f64 * 1024.0);
    let (l, step_s, tok_s) = metrics(w);
    Ok((l, step_s, tok_s, peak))
}

/// Runs the benchmark.
pub fn run(argv: &[String]) -> Result<(), String> {
    let a = Args::parse(argv, &["procs"])?;
    a.only(&["preset", "mesh", "steps", "batch", "seq", "reps", "json", "procs"])?;
    let preset = a.get("preset").unwrap_or("llama-small").to_string();
    let mesh = a.get("mesh").unwrap_or("4x1").to_string();
    let (steps, batch, seq, reps) = (a.num("steps", 6)?, a.num("batch", 8)?, a.num("seq", 256)?, a.num("reps", 2)?);
    let procs = a.has("procs");
    let np = mesh.parse::<redco_core::runtime::Mesh>().map_err(|e| format!("--mesh {mesh}: {e}"))?.size();
    let procs = procs.then_some(np);
    let build = if procs.is_some() {
        "cargo build --release -p redco --features mpi"
    } else {
        "cargo build --release -p redco"
    };
    let redco = redco_beside(build, "bench zero")?;
    let scratch = std::env::temp_dir().join(format!("redco-bench-zero-{}", std::process::id()));
    println!("machine: {}", crate::machine::describe());
    let ranks = if procs.is_some() { format!("{np} MPI processes") } else { "thread ranks".to_string() };
    println!("redco train --preset {preset} --mesh {mesh} ({ranks}), batch {batch} x {seq}, {steps} steps, f32, AdamW");
    let args = |seq: usize, zero: &str, recompute: &str, unit: &str| -> Vec<String> {
        let steps = steps.to_string();
        let (batch, seq) = (batch.to_string(), seq.to_string());
        ["train", "--preset", &preset, "--mesh", &mesh, "--steps", &steps, "--batch-size", &batch, "--seq-len", &seq]
            .into_iter()
            .chain(["--checkpoint-every", "100000", "--sample-tokens", "0", "--overwrite", "--oversubscribe"])
            .chain(["--zero", zero, "--recompute", recompute])
            .chain(if unit.is_empty() { vec![] } else { vec!["--unit-layers", unit] })
            .chain(["--workdir"])
            .map(String::from)
            .collect()
    };
    eprintln!("xtask: the floor (DDP at --seq-len 8)");
    let (_, _, _, floor) = train(&redco, &args(8, "0", "none", ""), &scratch.join("floor"), procs)
        .map_err(|e| format!("the floor run failed: {e}"))?;
    let mut toks = vec![Vec::new(); ROWS.len()];
    let mut times = vec![Vec::new(); ROWS.len()];
    let mut rss = vec![Vec::new(); ROWS.len()];
    let mut losses = vec![Vec::new(); ROWS.len()];
    for rep in 0..reps {
        for (i, (what, zero, recompute, unit)) in ROWS.iter().enumerate() {
            eprintln!("xtask: repetition {}/{reps}: {what}", rep + 1);
            let (l, step_s, tok_s, peak) =
                train(&redco, &args(seq, zero, recompute, unit), &scratch.join(format!("row{i}")), procs)
                    .map_err(|e| format!("the {what} row failed: {e}"))?;
            toks[i].push(tok_s);
            times[i].push(step_s);
            rss[i].push(peak);
            losses[i] = l;
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    let tok: Vec<f64> = toks.iter().map(|v| median(v)).collect();
    let time: Vec<f64> = times.iter().map(|v| median(v)).collect();
    let peak: Vec<f64> = rss.iter().map(|v| median(v)).collect();
    let act: Vec<f64> = peak.iter().map(|p| p - floor).collect();
    let gb = |b: f64| b / 1e9;
    println!("\nfloor (DDP at --seq-len 8): peak RSS {:.2} GB", gb(floor));
    println!(
        "{:<32} {:>9} {:>9} {:>7} {:>9} {:>11}  losses (first, last)",
        "row", "tok/s", "step (s)", "x DDP", "peak GB", "activ. GB"
    );
    for (i, (what, zero, _, _)) in ROWS.iter().enumerate() {
        // the floor holds DDP's training state: the activations of the DDP rows only
        let act = if *zero == "0" { format!("{:.2}", gb(act[i])) } else { "-".into() };
        println!(
            "{what:<32} {:>9.1} {:>9.3} {:>7.2} {:>9.2} {:>11}  {:.6}, {:.6}",
            tok[i],
            time[i],
            tok[i] / tok[0],
            gb(peak[i]),
            act,
            losses[i].first().copied().unwrap_or(f64::NAN),
            losses[i].last().copied().unwrap_or(f64::NAN)
        );
    }
    let (z3, rc, sel) = (tok[1] / tok[0], time[3] / time[0], time[2] / time[0]);
    println!(
        "\nZeRO-3 tokens/s / DDP's: {z3:.2}x; step / DDP's step: selective recompute {sel:.2}x, block recompute \
         {rc:.2}x; activations / DDP's: selective {:.2}x, block {:.2}x",
        act[2] / act[0],
        act[3] / act[0]
    );
    println!(
        "the planner's ZeRO-3 unit / one layer a unit, tokens/s: {:.2}x without recompute, {:.2}x with block \
         recompute",
        tok[1] / tok[6],
        tok[5] / tok[7]
    );
    if let Some(path) = a.get("json") {
        let rows: Vec<serde_json::Value> = ROWS
            .iter()
            .enumerate()
            .map(|(i, (what, _, _, _))| {
                serde_json::json!({"row": what, "tokens_per_s": tok[i], "step_s": time[i], "peak_rss_bytes": peak[i],
                    "activation_bytes": act[i], "losses": losses[i]})
            })
            .collect();
        let doc = serde_json::json!({"machine": crate::machine::describe(), "preset": preset, "mesh": mesh,
            "floor_rss_bytes": floor, "rows": rows, "zero3_over_ddp": z3, "recompute_step_over_ddp": rc,
            "selective_step_over_ddp": sel});
        std::fs::write(PathBuf::from(path), doc.to_string()).map_err(|e| format!("{path}: {e}"))?;
    }
    Ok(())
}
