//! `cargo run --release -p xtask --features mpi -- bench memory`: the memory tools at a size
//! that strains the machine, through `redco train` as a user runs it. Rows:
//!
//! - one process, unsharded (`--mesh 1x1 --zero 0 --recompute none`);
//! - `--np` MPI processes at `--mesh NPx1 --zero 3 --recompute block` (ZeRO-3 with block
//!   recompute, one rank per process).
//!
//! Each row: every process's peak resident set (GNU time's `%M`), the planner's predicted
//! peak per rank (what `redco train` prints before it allocates), their ratio, the peak heap
//! of the leader process (what `redco train` prints at its end: the bytes it held allocated at
//! once, the planner's kind of figure), the median
//! step time and tokens/s of the steps after the first, and the first and last losses (the
//! rows must agree). Then the ZeRO-3 peak as a fraction of the unsharded one. The `redco`
//! binary is the one beside this program, built with `cargo build --release -p redco
//! --features mpi`. Flags: `--preset` (default llama-0.7b), `--steps` (3), `--batch` (4),
//! `--seq` (256), `--np` (4), `--json FILE`.
//!
//! `--torch PYTHON` adds torch FSDP2 as the peer, in the same run: `torchrun
//! --nproc-per-node NP` over gloo (`python/fsdp_peer.py`), transformers' `LlamaForCausalLM`
//! of the preset's shape built on the meta device, `fully_shard` per decoder layer and on
//! the root, gradient checkpointing per layer, AdamW, the same batch and sequence (random
//! ids and weights: its losses are its own). Its row: each rank's peak RSS, the median
//! step time and tokens/s; and redco's ZeRO-3 tokens/s and peak against it.

use crate::args::Args;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What one row measured.
struct Row {
    what: String,
    peaks_kib: Vec<u64>,
    predicted: String,
    /// The leader process's peak heap as `redco train` printed it (`-` for the peer).
    heap: String,
    step_s: f64,
    tok_s: f64,
    losses: Vec<f64>,
}

/// The `redco` binary beside this program (the benchmarks that run the CLI as a user does),
/// built first by `build` (a no-op when it is up to date: a bench never measures a binary
/// older than the sources); missing, an error naming `build` and `bench`, who needs it.
pub(super) fn redco_beside(build: &str, bench: &str) -> Result<PathBuf, String> {
    // built first (a no-op when up to date): a bench must never run a stale binary
    let mut words = build.split_whitespace();
    if let Some(cargo) = words.next() {
        eprintln!("xtask: {build}");
        let st = std::process::Command::new(cargo).args(words).status().map_err(|e| format!("{build}: {e}"))?;
        if !st.success() {
            return Err(format!("{build} failed ({st})"));
        }
    }
    let redco = std::env::current_exe().map_err(|e| e.to_string())?.with_file_name("redco");
    if !redco.is_file() {
        return Err(format!("{} is missing: {build} ({bench} runs the CLI)", redco.display()));
    }
    Ok(redco)
}

/// The planner's prediction as `redco train` printed it: the `about X per rank` of its
/// `memory:` line.
fn predicted(stdout: &str) -> String {
    stdout
        .lines()
        .find(|l| l.starts_with("memory: "))
        .and_then(|l| l.split("about ").nth(1))
        .and_then(|r| r.split(" per rank").next())
        .unwrap_or("-")
        .to_string()
}

/// The peak heap `redco train` printed at its end (`peak heap: X (...)`).
fn heap(stdout: &str) -> String {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("peak heap: "))
        .and_then(|r| r.split(" (").next())
        .unwrap_or("-")
        .to_string()
}

/// Bytes from `redco`'s human sizes (`3.25 GB`, `512.0 MB`, `900 kB`).
fn bytes_of(h: &str) -> Option<f64> {
    let (n, unit) = h.trim().split_once(' ')?;
    let n: f64 = n.parse().ok()?;
    let mul = match unit {
        "B" => 1.0,
        "kB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        _ => return None,
    };
    Some(n * mul)
}

/// The losses, and the median step time and tokens/s of the steps after the first, from a
/// run's metrics.
pub(super) fn metrics(workdir: &Path) -> (Vec<f64>, f64, f64) {
    let text = std::fs::read_to_string(workdir.join("metrics.jsonl")).unwrap_or_default();
    let lines: Vec<serde_json::Value> = text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    let losses = lines.iter().filter_map(|v| v["loss"].as_f64()).collect();
    let mut times: Vec<f64> = lines.iter().skip(1).filter_map(|v| v["step_time_s"].as_f64()).collect();
    let mut toks: Vec<f64> = lines.iter().skip(1).filter_map(|v| v["tokens_per_s"].as_f64()).collect();
    let med = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
    };
    (losses, med(&mut times), med(&mut toks))
}

/// The `redco-peak-kib N` lines GNU time wrote.
pub(super) fn peaks(stderr: &str) -> Vec<u64> {
    stderr.lines().filter_map(|l| l.strip_prefix("redco-peak-kib ")?.trim().parse().ok()).collect()
}

/// `redco args` as `np` MPI processes (each under GNU time, which writes its peak RSS to
/// stderr), run in `dir`: its stdout and stderr.
#[cfg(feature = "mpi")]
pub(super) fn under_mpirun(np: usize, redco: &Path, args: &[String], dir: &Path) -> Result<(String, String), String> {
    let m = redco_mpi::launch::Mpirun::new(np);
    if !m.available() {
        return Err("mpirun is not installed (apt-get install openmpi-bin libopenmpi-dev)".into());
    }
    let mut a: Vec<&str> = vec!["-f", "redco-peak-kib %M"];
    let redco_s = redco.to_string_lossy().into_owned();
    a.push(&redco_s);
    a.extend(args.iter().map(String::as_str));
    let r = m
        .run(Path::new("/usr/bin/time"), &a, dir, std::time::Duration::from_secs(7200))
        .map_err(|e| format!("cannot start mpirun: {e}"))?;
    if r.code != Some(0) {
        return Err(format!("mpirun -np {np} failed: {}", r.stderr.trim()));
    }
    Ok((r.stdout, r.stderr))
}

/// Without the mpi feature: refused, saying how to build it.
#[cfg(not(feature = "mpi"))]
pub(super) fn under_mpirun(_: usize, _: &Path, _: &[String], _: &Path) -> Result<(String, String), String> {
    Err("ranks as MPI processes need xtask built with the mpi feature: cargo run --release -p xtask --features mpi \
         -- bench ..."
        .into())
}

/// Runs the benchmark.
pub fn run(argv: &[String]) -> Result<(), String> {
    let a = Args::parse(argv, &[])?;
    a.only(&["preset", "steps", "batch", "seq", "np", "json", "torch"])?;
    let preset = a.get("preset").unwrap_or("llama-0.7b").to_string();
    let (steps, batch, seq, np) = (a.num("steps", 3)?, a.num("batch", 4)?, a.num("seq", 256)?, a.num("np", 4)?);
    let redco = redco_beside("cargo build --release -p redco --features mpi", "bench memory")?;
    let scratch = std::env::temp_dir().join(format!("redco-bench-memory-{}", std::process::id()));
    let common = |mesh: &str, w: &Path| -> Vec<String> {
        let s = [
            "train",
            "--preset",
            &preset,
            "--mesh",
            mesh,
            "--steps",
            &steps.to_string(),
            "--batch-size",
            &batch.to_string(),
            "--seq-len",
            &seq.to_string(),
            "--checkpoint-every",
            "100000",
            "--sample-tokens",
            "0",
            "--oversubscribe",
            "--overwrite",
            "--workdir",
            &w.to_string_lossy(),
        ];
        s.iter().map(|x| x.to_string()).collect()
    };
    println!("machine: {}", crate::machine::describe());
    println!("redco train --preset {preset}, batch {batch} x {seq}, {steps} steps, f32, AdamW");
    let mut rows = Vec::new();

    // one process, nothing sharded
    let w = scratch.join("unsharded");
    let mut args = common("1x1", &w);
    args.extend(["--zero", "0", "--recompute", "none"].map(String::from));
    eprintln!("xtask: one process, unsharded");
    let o = Command::new("/usr/bin/time")
        .args(["-f", "redco-peak-kib %M"])
        .arg(&redco)
        .args(&args)
        .output()
        .map_err(|e| format!("/usr/bin/time (GNU time: apt-get install time): {e}"))?;
    let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    if !o.status.success() {
        return Err(format!("the unsharded row failed: {}", err.trim()));
    }
    let (losses, step_s, tok_s) = metrics(&w);
    rows.push(Row {
        what: "1 process, unsharded".into(),
        peaks_kib: peaks(&err),
        predicted: predicted(&out),
        heap: heap(&out),
        step_s,
        tok_s,
        losses,
    });

    // NP processes, ZeRO-3 with block recompute
    let w = scratch.join("zero3");
    let mut args = common(&format!("{np}x1"), &w);
    args.extend(["--zero", "3", "--recompute", "block"].map(String::from));
    eprintln!("xtask: {np} MPI processes, ZeRO-3 + block recompute");
    let (out, err) = under_mpirun(np, &redco, &args, &scratch.join("mpirun"))?;
    let (losses, step_s, tok_s) = metrics(&w);
    rows.push(Row {
        what: format!("{np} MPI processes, {np}x1 ZeRO-3 + recompute"),
        peaks_kib: peaks(&err),
        predicted: predicted(&out),
        heap: heap(&out),
        step_s,
        tok_s,
        losses,
    });
    let _ = std::fs::remove_dir_all(&scratch);
    if let Some(python) = a.get("torch") {
        eprintln!("xtask: torch FSDP2, {np} processes (torchrun, gloo) + activation checkpointing");
        rows.push(fsdp_row(python, &preset, vocab_of(&out), (batch, seq, steps, np))?);
    }

    println!(
        "\n{:<40} {:>22} {:>12} {:>10} {:>12} {:>10} {:>10}  losses (first, last)",
        "row", "peak RSS/process (GB)", "planner", "planner/m", "heap rank 0", "step (s)", "tok/s"
    );
    let max_gb = |r: &Row| r.peaks_kib.iter().copied().max().unwrap_or(0) as f64 * 1024.0 / 1e9;
    for r in &rows {
        let lo = r.peaks_kib.iter().copied().min().unwrap_or(0) as f64 * 1024.0 / 1e9;
        let ratio = bytes_of(&r.predicted).map_or("-".into(), |p| format!("{:.2}", p / 1e9 / max_gb(r)));
        println!(
            "{:<40} {:>22} {:>12} {:>10} {:>12} {:>10.2} {:>10.1}  {:.6}, {:.6}",
            r.what,
            format!("{lo:.2}-{:.2}", max_gb(r)),
            r.predicted,
            ratio,
            r.heap,
            r.step_s,
            r.tok_s,
            r.losses.first().copied().unwrap_or(f64::NAN),
            r.losses.last().copied().unwrap_or(f64::NAN)
        );
    }
    let frac = max_gb(&rows[1]) / max_gb(&rows[0]);
    println!("\nZeRO-3 peak per process / unsharded peak: {frac:.2}x");
    if let Some(t) = rows.get(2) {
        println!(
            "redco ZeRO-3 / torch FSDP2: tokens/s {:.2}x, peak RSS per process {:.2}x",
            rows[1].tok_s / t.tok_s,
            max_gb(&rows[1]) / max_gb(t)
        );
    }
    if let Some(path) = a.get("json") {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                serde_json::json!({"row": r.what, "peak_kib": r.peaks_kib, "predicted": r.predicted, "peak_heap": r.heap,
                    "step_s": r.step_s, "tokens_per_s": r.tok_s, "losses": r.losses})
            })
            .collect();
        let doc = serde_json::json!({"machine": crate::machine::describe(), "preset": preset, "rows": v, "zero3_over_unsharded": frac});
        std::fs::write(PathBuf::from(path), doc.to_string()).map_err(|e| format!("{path}: {e}"))?;
    }
    Ok(())
}

/// The vocabulary `redco train` printed (`..., vocab N)`), or the synthetic corpus's 67.
fn vocab_of(stdout: &str) -> usize {
    stdout
        .split("vocab ")
        .nth(1)
        .and_then(|r| r.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(67)
}

/// The torch FSDP2 row: `python -m torch.distributed.run` of `python/fsdp_peer.py` at the
/// preset's shape, one JSON file per rank.
fn fsdp_row(
    python: &str,
    preset: &str,
    vocab: usize,
    (batch, seq, steps, np): (usize, usize, usize, usize),
) -> Result<Row, String> {
    let cfg = redco_models::presets::config(preset, vocab).map_err(|e| e.to_string())?;
    let dim = |k: &str| cfg[k].as_u64().map(|v| v.to_string()).ok_or(format!("preset {preset} has no {k}"));
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/python/fsdp_peer.py");
    let threads = (crate::machine::cores() / np).max(1);
    let out = std::env::temp_dir().join(format!("redco-bench-fsdp-{}", std::process::id()));
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let o = Command::new(python)
        .args(["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", &np.to_string(), script])
        .args(["--hidden", &dim("hidden_size")?, "--layers", &dim("num_hidden_layers")?])
        .args(["--heads", &dim("num_attention_heads")?, "--intermediate", &dim("intermediate_size")?])
        .args(["--vocab", &vocab.to_string(), "--batch", &batch.to_string(), "--seq", &seq.to_string()])
        .args(["--steps", &steps.to_string(), "--threads", &threads.to_string(), "--recompute", "--out"])
        .arg(&out)
        .envs(crate::machine::peer_isa_env())
        .env("OMP_NUM_THREADS", threads.to_string())
        .output()
        .map_err(|e| format!("cannot start `{python}`: {e}"))?;
    if !o.status.success() {
        return Err(format!("the torch FSDP row failed: {}", String::from_utf8_lossy(&o.stderr).trim()));
    }
    let lines: Vec<serde_json::Value> = (0..np)
        .filter_map(|r| std::fs::read_to_string(out.join(format!("rank-{r}.json"))).ok())
        .filter_map(|l| serde_json::from_str(&l).ok())
        .collect();
    let _ = std::fs::remove_dir_all(&out);
    if lines.len() != np {
        return Err(format!("the torch FSDP row reported {} of {np} ranks", lines.len()));
    }
    let mut times: Vec<f64> =
        lines[0]["step_s"].as_array().into_iter().flatten().skip(1).filter_map(|v| v.as_f64()).collect();
    times.sort_by(f64::total_cmp);
    let step_s = times.get(times.len() / 2).copied().unwrap_or(f64::NAN);
    Ok(Row {
        what: format!("torch {} FSDP2, {np} processes + ckpt", lines[0]["torch"].as_str().unwrap_or("?")),
        peaks_kib: lines.iter().filter_map(|l| l["peak_kib"].as_u64()).collect(),
        predicted: "-".into(),
        heap: "-".into(),
        step_s,
        tok_s: (batch * seq) as f64 / step_s,
        losses: lines[0]["losses"].as_array().into_iter().flatten().filter_map(|v| v.as_f64()).collect(),
    })
}
