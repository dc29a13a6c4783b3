//! `cargo xtask bench` (or `bench llm`): the bench LLaMA (hidden 512, 6 layers, 8 heads,
//! intermediate 1408, vocab 8000, f32, random weights) measured three ways on every enabled
//! backend and mesh, and with `--torch PYTHON` on transformers + torch (eager attention, the
//! same thread count) in the same run:
//!
//! - training tokens/s: batch 4 x sequence 256, one step = forward with labels = ids (the
//!   causal-LM loss, shifted inside), backward, gradient sync over `dp`, AdamW update, timed
//!   around the whole step on rank 0 (own loop, not the `Trainer`: no clipping, checkpoints
//!   or metrics, like the torch loop it is compared with);
//! - forward tokens/s: the logits `[4, 256, 8000]` without gradients;
//! - decode tokens/s: greedy generation at batch 1 with the KV cache, 64 new tokens after a
//!   16-token prompt, over the whole `generate` call (prefill included, as `bench decode`).
//!
//! Each redco system runs in its own child process (`bench llm --child`), so its peak
//! resident set (`VmHWM`, all ranks of the mesh together) is its own; torch's is its peer
//! process's `ru_maxrss`. Repetitions are interleaved (every repetition measures every
//! system once: a warm-up then `--steps` timed runs of each measure, their median); the
//! table shows medians over repetitions. A second table splits the training step into
//! forward (with the loss), backward, gradient sync and optimizer update.
//!
//! `--preset NAME --vocab N` measures another preset of `redco_models::presets` instead,
//! e.g. `--preset llama-134m --vocab 32000` (hidden 768, 12 layers, 12 heads, intermediate
//! 2048: 134M parameters), the same on both sides.
//!
//! `--dtype bf16` computes in bf16 on both sides: redco trains with f32 master weights
//! (the `Trainer`'s mixed precision: the model's bf16 copies refreshed after each AdamW
//! step on the masters, gradients cast to f32 before the sync) and runs forward and decode
//! on the bf16 model; torch trains its f32 model under `torch.autocast("cpu",
//! torch.bfloat16)` and runs forward and decode on a bf16 copy.
//!
//! `--overlap` starts the data-parallel gradient buckets' all-reduces during backward (as
//! `TrainConfig::overlap_grad_sync`); "grad sync" is then the wait after backward.
//!
//! `--backend cpu,cpu-mpi` adds rows of CPU ranks as MPI processes (`redco-cpu-mpi-1x2`,
//! ...: one process per rank under `mpirun --mca btl tcp,self`, peak RSS summed over the
//! ranks; xtask's `mpi` feature), measured in the same run as the thread ranks.
//!
//! `--backend cpu,wgpu` adds the wgpu rows (`redco-wgpu-1x1`, ...: one wgpu device per rank;
//! xtask's `wgpu` feature: `cargo run --release -p xtask --features wgpu -- bench ...`). Their
//! peak RSS is host memory only (all of it on a CPU adapter such as lavapipe).
//!
//! For profiling, `xtask bench llm --child --backend cpu --mesh 1x1 --threads N --only
//! train|forward|decode` runs one measure of one system alone (e.g. under `perf record`) and
//! prints its JSON line.

use super::decode::torch_once;
use super::llm_child::child;
use super::stats::median;
use super::torch::TorchPeer;
use crate::args::Args;
use crate::machine;
use redco_core::optim::AdamWConfig;
use redco_core::runtime::Mesh;
use redco_core::Error;
use redco_models::hf::config::HfConfig;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Sequences per training step and forward pass.
pub(super) const BATCH: usize = 4;
/// Tokens per sequence.
pub(super) const SEQ: usize = 256;
/// Decode prompt length.
pub(super) const PROMPT: usize = 16;
/// AdamW as torch's defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 0.01.
pub(super) const ADAMW: AdamWConfig =
    AdamWConfig { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01, zero1: false };

/// The bench model: a preset (`--preset`, default `llama-small`) at a vocabulary
/// (`--vocab`, default 8000), e.g. `--preset llama-134m --vocab 32000` for the middle size.
#[derive(Clone, Copy)]
pub(super) struct Shape<'a> {
    /// The preset name (see `redco_models::presets`).
    pub(super) preset: &'a str,
    /// Its vocabulary size.
    pub(super) vocab: usize,
    /// The compute dtype: `f32` or `bf16`.
    pub(super) dtype: &'a str,
}

impl<'a> Shape<'a> {
    /// The shape that `--preset` and `--vocab` ask for.
    pub(super) fn from_args(args: &'a Args) -> Result<Self, String> {
        let dtype = args.get("dtype").unwrap_or("f32");
        if !["f32", "bf16"].contains(&dtype) {
            return Err(format!("--dtype {dtype}: use f32 or bf16"));
        }
        Ok(Shape { preset: args.get("preset").unwrap_or("llama-small"), vocab: args.num("vocab", 8000)?, dtype })
    }
}

/// The bench config, as redco reads it.
pub(super) fn hf_config(shape: Shape) -> Result<(serde_json::Value, HfConfig), String> {
    let v = redco_models::presets::config(shape.preset, shape.vocab).map_err(|e| e.to_string())?;
    let cfg = HfConfig::from_json(&v.to_string()).map_err(|e| e.to_string())?;
    Ok((v, cfg))
}

/// A config's sizes, as the benchmark tables print them.
pub(super) fn sizes(cfg: &HfConfig) -> String {
    format!(
        "hidden {}, {} layers, {} heads ({} kv), intermediate {}, vocab {}",
        cfg.hidden, cfg.layers, cfg.heads, cfg.kv_heads, cfg.intermediate, cfg.vocab
    )
}

/// The same config as transformers' `LlamaConfig` keyword arguments.
fn torch_config(preset: &serde_json::Value) -> serde_json::Value {
    let mut v = preset.clone();
    if let Some(m) = v.as_object_mut() {
        for k in ["architectures", "model_type", "torch_dtype"] {
            m.remove(k);
        }
    }
    v
}

/// The parts of a training step: forward (with the loss), backward, gradient sync over
/// `dp`, optimizer update.
const PHASES: [&str; 4] = ["forward", "backward", "grad sync", "optimizer"];

/// One repetition's timings of one system, in seconds (medians of its timed runs).
#[derive(Debug, Clone, Copy)]
struct Rep {
    train: f64,
    fwd: f64,
    decode: f64,
    peak_rss: f64,
    /// The training step's parts, as [`PHASES`].
    phases: [f64; 4],
}

/// The median of each phase over `steps` (each the seconds of the [`PHASES`]).
fn phase_medians(steps: &[[f64; 4]]) -> [f64; 4] {
    std::array::from_fn(|i| median(&steps.iter().map(|p| p[i]).collect::<Vec<_>>()))
}

/// Runs one repetition of one redco system (`backend` on `mesh`) in a child process.
fn redco_rep(
    backend: &str,
    mesh: Mesh,
    threads_per_rank: usize,
    (steps, new, overlap): (usize, usize, bool),
    shape: Shape,
) -> Result<Rep, String> {
    // /proc/self/exe still runs this binary if a rebuild has replaced the file meanwhile
    let proc_exe = Path::new("/proc/self/exe");
    let exe = if proc_exe.exists() {
        proc_exe.to_path_buf()
    } else {
        std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?
    };
    let (m, t, s, n) = (mesh.to_string(), threads_per_rank.to_string(), steps.to_string(), new.to_string());
    let vocab = shape.vocab.to_string();
    let mut child = vec![
        "bench",
        "llm",
        "--child",
        "--backend",
        backend,
        "--mesh",
        &m,
        "--threads",
        &t,
        "--steps",
        &s,
        "--new",
        &n,
        "--preset",
        shape.preset,
        "--vocab",
        &vocab,
        "--dtype",
        shape.dtype,
    ];
    if overlap {
        child.push("--overlap");
    }
    let stdout = if backend == "cpu-mpi" {
        // one process per rank, under mpirun (rank 0 prints); mpirun needs the real path
        let real = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
        super::mpi::run_under_mpirun(&real, &child, mesh.size())?
    } else {
        let out = Command::new(&exe).args(&child).output().map_err(|e| format!("cannot run {}: {e}", exe.display()))?;
        if !out.status.success() {
            return Err(format!("redco {backend} {mesh}: {}", String::from_utf8_lossy(&out.stderr).trim()));
        }
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let v: serde_json::Value = serde_json::from_str(stdout.trim())
        .map_err(|e| format!("redco {backend} {mesh} child said `{}`: {e}", stdout.trim()))?;
    let times =
        |k: &str| -> Vec<f64> { v[k].as_array().map_or(vec![], |a| a.iter().filter_map(|x| x.as_f64()).collect()) };
    Ok(Rep {
        train: median(&times("train_s")),
        fwd: median(&times("fwd_s")),
        decode: median(&times("decode_s")),
        peak_rss: v["peak_rss"].as_f64().unwrap_or(f64::NAN),
        phases: phase_medians(&phases(&v["phases_s"])),
    })
}

/// Per-step phase times (`[[forward, backward, sync, optimizer], ..]`) from JSON.
fn phases(v: &serde_json::Value) -> Vec<[f64; 4]> {
    v.as_array().map_or(vec![], |a| {
        a.iter().map(|p| std::array::from_fn(|i| p.get(i).and_then(|x| x.as_f64()).unwrap_or(f64::NAN))).collect()
    })
}

/// Seconds per timed call of a torch peer op answering `times`, and the whole answer.
fn torch_times(p: &mut TorchPeer, req: serde_json::Value) -> Result<(Vec<f64>, serde_json::Value), String> {
    let v = p.ask(&req)?;
    let times: Vec<f64> = v["times"].as_array().map_or(vec![], |a| a.iter().filter_map(|x| x.as_f64()).collect());
    if times.is_empty() {
        return Err(format!("torch peer: no times for {}", req["op"]));
    }
    Ok((times, v))
}

/// One repetition of transformers + torch.
fn torch_rep(p: &mut TorchPeer, cfg: &serde_json::Value, steps: usize, new: usize, dtype: &str) -> Result<Rep, String> {
    let shape = |op: &str| serde_json::json!({"op": op, "config": cfg, "batch": BATCH, "seq": SEQ, "reps": steps, "warmup": 1, "dtype": dtype});
    let (train, answer) = torch_times(p, shape("train"))?;
    let (fwd, _) = torch_times(p, shape("forward"))?;
    let vocab = cfg["vocab_size"].as_u64().unwrap_or(8000) as i64;
    let prompt: Vec<i64> = (0..PROMPT as i64).map(|i| (i * 37 + 11) % vocab).collect();
    torch_once(p, cfg, &prompt, new, dtype)?; // warm-up
    let dec = (0..steps).map(|_| torch_once(p, cfg, &prompt, new, dtype)).collect::<Result<Vec<_>, _>>()?;
    // the peer's peak so far (every answer carries it)
    let peak = p.ask(&serde_json::json!({"op": "info"}))?["peak_rss_kib"].as_f64().map_or(f64::NAN, |k| k * 1024.0);
    Ok(Rep {
        train: median(&train),
        fwd: median(&fwd),
        decode: median(&dec),
        peak_rss: peak,
        phases: phase_medians(&phases(&answer["phases"])),
    })
}

/// A system's summary: tok/s of the three measures and the peak RSS in MiB.
#[derive(Debug, Clone)]
struct Row {
    system: String,
    train: f64,
    fwd: f64,
    decode: f64,
    rss_mib: f64,
    /// Seconds of each of the training step's [`PHASES`].
    phases: [f64; 4],
}

fn summarize(system: String, reps: &[Rep], new: usize) -> Row {
    let m = |f: fn(&Rep) -> f64| median(&reps.iter().map(f).collect::<Vec<_>>());
    // a measure a system does not take (no timed runs) is NaN, printed as `-`
    let rate = |n: usize, t: f64| if t > 0.0 { n as f64 / t } else { f64::NAN };
    Row {
        system,
        train: rate(BATCH * SEQ, m(|r| r.train)),
        fwd: rate(BATCH * SEQ, m(|r| r.fwd)),
        decode: rate(new, m(|r| r.decode)),
        rss_mib: reps.iter().map(|r| r.peak_rss).fold(f64::NAN, f64::max) / (1024.0 * 1024.0),
        phases: phase_medians(&reps.iter().map(|r| r.phases).collect::<Vec<_>>()),
    }
}

/// Parses `--mesh 1x1,1x2,2x1`.
fn meshes(s: &str) -> Result<Vec<Mesh>, String> {
    s.split(',').filter(|m| !m.trim().is_empty()).map(|m| m.parse::<Mesh>().map_err(|e| e.to_string())).collect()
}

/// Clock ticks of the whole machine (busy, all) and of this process tree.
#[derive(Debug, Clone, Copy, Default)]
struct CpuTicks {
    busy: u64,
    all: u64,
    ours: u64,
}

/// utime + stime (+ cutime + cstime with `children`) of `/proc/<pid>/stat`, in clock ticks.
fn process_ticks(pid: &str, children: bool) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // fields after the `(comm)`: state is field 3; utime..cstime are fields 14..17
    let rest = s.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<u64> = rest.split_whitespace().skip(11).take(4).filter_map(|x| x.parse().ok()).collect();
    f.iter().take(if children { 4 } else { 2 }).sum()
}

/// The machine's and this process tree's CPU ticks now (`peer`: the torch peer's pid).
/// Children are counted once waited for, which `redco_rep` does.
fn cpu_ticks(peer: Option<u32>) -> CpuTicks {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let v: Vec<u64> =
        stat.lines().next().map_or(vec![], |l| l.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect());
    // user nice system idle iowait irq softirq steal (guest time is inside user)
    let get = |i: usize| v.get(i).copied().unwrap_or(0);
    let busy = get(0) + get(1) + get(2) + get(5) + get(6) + get(7);
    let ours = process_ticks("self", true) + peer.map_or(0, |p| process_ticks(&p.to_string(), false));
    CpuTicks { busy, all: busy + get(3) + get(4), ours }
}

/// The share of the machine's CPU time used by other processes (or stolen by the
/// hypervisor) between `a` and `b`.
fn foreign_share(a: CpuTicks, b: CpuTicks) -> f64 {
    let all = b.all.saturating_sub(a.all);
    if all == 0 {
        return 0.0;
    }
    let foreign = b.busy.saturating_sub(a.busy).saturating_sub(b.ours.saturating_sub(a.ours));
    foreign as f64 / all as f64
}

/// `x / y` as a ratio string, or `-`.
fn ratio(x: f64, y: Option<f64>) -> String {
    match y {
        Some(y) if y > 0.0 && x.is_finite() => format!("{:.2}x", x / y),
        _ => "-".into(),
    }
}

/// Runs the benchmark (or, with `--child`, one repetition of one redco system).
pub fn run(argv: &[String]) -> Result<(), String> {
    let args = Args::parse(argv, &["child", "overlap"])?;
    args.only(&[
        "child", "mesh", "reps", "steps", "torch", "json", "png", "threads", "backend", "new", "only", "overlap",
        "preset", "vocab", "dtype",
    ])?;
    let shape = Shape::from_args(&args)?;
    let overlap = args.has("overlap");
    let steps = args.num("steps", 3)?.max(1);
    let new = args.num("new", 64)?.max(1);
    if args.has("child") {
        let mesh: Mesh = args.get("mesh").unwrap_or("1x1").parse().map_err(|e: Error| e.to_string())?;
        let backend = args.get("backend").unwrap_or("cpu");
        return child(backend, mesh, args.num("threads", 1)?.max(1), (steps, new), args.get("only"), overlap, shape);
    }
    let threads = args.num("threads", machine::cores())?.max(1);
    let reps = args.num("reps", 3)?.max(1);
    let meshes = meshes(args.get("mesh").unwrap_or("1x1"))?;
    if meshes.is_empty() {
        return Err("--mesh needs at least one mesh, e.g. 1x1,1x2,2x1".into());
    }
    let backends = super::backends::parse(args.get("backend").unwrap_or("cpu"))?;
    let png = PathBuf::from(args.get("png").unwrap_or("target/bench-llm.png"));
    let (preset, cfg) = hf_config(shape)?;
    let tcfg = torch_config(&preset);
    let describe = machine::describe();
    let model_line = format!(
        "LLaMA {}, {}; train/forward batch {BATCH} x seq {SEQ}, AdamW; decode batch 1, prompt {PROMPT}, {new} new \
         tokens, KV cache",
        sizes(&cfg),
        if shape.dtype == "bf16" { "bf16 compute (f32 master weights in training)" } else { "f32" }
    );
    eprintln!("machine: {describe} | threads: {threads}");
    let mut torch = match args.get("torch") {
        Some(py) => {
            let p = TorchPeer::start(py, threads)?;
            eprintln!("torch peer: {}", p.info);
            Some(p)
        }
        None => None,
    };
    let systems: Vec<(String, &str, Mesh)> =
        backends.iter().flat_map(|b| meshes.iter().map(move |m| (format!("redco-{b}-{m}"), b.as_str(), *m))).collect();
    for (name, _, m) in &systems {
        if threads < m.size() {
            eprintln!("note: {name} has {} ranks for {threads} threads: 1 thread per rank, oversubscribed", m.size());
        }
    }
    let mut ours: Vec<Vec<Rep>> = vec![Vec::new(); systems.len()];
    let mut theirs: Vec<Rep> = Vec::new();
    let peer_pid = torch.as_ref().map(TorchPeer::pid);
    let mut foreign = Vec::new();
    for rep in 0..reps {
        let t0 = cpu_ticks(peer_pid);
        for (i, (name, backend, mesh)) in systems.iter().enumerate() {
            let r = redco_rep(backend, *mesh, (threads / mesh.size()).max(1), (steps, new, overlap), shape)?;
            eprintln!(
                "rep {}/{reps} {name}: step {:.3} s, forward {:.3} s, generate {:.3} s",
                rep + 1,
                r.train,
                r.fwd,
                r.decode
            );
            ours[i].push(r);
        }
        if let Some(p) = torch.as_mut() {
            let r = torch_rep(p, &tcfg, steps, new, shape.dtype)?;
            eprintln!(
                "rep {}/{reps} torch: step {:.3} s, forward {:.3} s, generate {:.3} s",
                rep + 1,
                r.train,
                r.fwd,
                r.decode
            );
            theirs.push(r);
        }
        let share = foreign_share(t0, cpu_ticks(peer_pid));
        eprintln!("rep {}/{reps}: other processes used {:.0}% of the machine's CPU", rep + 1, share * 100.0);
        foreign.push(share);
    }
    let busiest = foreign.iter().copied().fold(0.0, f64::max);
    let mut rows: Vec<Row> = systems.iter().zip(&ours).map(|((n, _, _), r)| summarize(n.clone(), r, new)).collect();
    let torch_row = torch.as_ref().map(|_| summarize("torch".into(), &theirs, new));
    let reference = torch_row.clone();
    rows.extend(torch_row);
    println!();
    println!("{model_line}");
    println!("machine: {describe}; {threads} threads (shared by a mesh's ranks; torch gets all)");
    println!(
        "medians of {reps} interleaved repetitions, each a warm-up then {steps} timed runs per measure; training step = \
         forward + backward + dp gradient sync + AdamW (own loop, timed on rank 0); peak RSS = the whole process"
    );
    if let Some(p) = &torch {
        println!("torch: {}", p.info);
    }
    println!(
        "other processes' share of the CPU during the repetitions: {}",
        foreign.iter().map(|f| format!("{:.0}%", f * 100.0)).collect::<Vec<_>>().join(", ")
    );
    if busiest > 0.05 {
        println!(
            "WARNING: the machine was busy (up to {:.0}% of its CPU used by other processes): the timings and \
             ratios are unreliable; rerun on an idle machine",
            busiest * 100.0
        );
    }
    println!(
        "{:<16} {:>11} {:>11} {:>11} {:>13} {:>9} {:>9} {:>9} {:>9}",
        "system", "train tok/s", "fwd tok/s", "dec tok/s", "peak RSS MiB", "train/t", "fwd/t", "dec/t", "RSS/t"
    );
    let refv = |f: fn(&Row) -> f64| reference.as_ref().map(f);
    for r in &rows {
        println!(
            "{:<16} {:>11} {:>11} {:>11} {:>13.0} {:>9} {:>9} {:>9} {:>9}",
            r.system,
            tok_s(r.train),
            tok_s(r.fwd),
            tok_s(r.decode),
            r.rss_mib,
            ratio(r.train, refv(|t| t.train)),
            ratio(r.fwd, refv(|t| t.fwd)),
            ratio(r.decode, refv(|t| t.decode)),
            ratio(r.rss_mib, refv(|t| t.rss_mib)),
        );
    }
    println!();
    println!("training step split, ms (medians; forward includes the loss and reading it)");
    println!("{:<16} {:>10} {:>10} {:>10} {:>10} {:>10}", "system", PHASES[0], PHASES[1], PHASES[2], PHASES[3], "step");
    for r in &rows {
        let [f, b, s, o] = r.phases.map(|x| x * 1e3);
        let step = (BATCH * SEQ) as f64 / r.train * 1e3;
        println!("{:<16} {f:>10.1} {b:>10.1} {s:>10.1} {o:>10.1} {step:>10.1}", r.system);
    }
    let num = |x: f64| if x.is_finite() { serde_json::json!(x) } else { serde_json::Value::Null };
    if let Some(path) = args.get("json") {
        let out = serde_json::json!({
            "machine": describe,
            "threads": threads,
            "model": preset,
            "batch": BATCH,
            "seq": SEQ,
            "decode": {"prompt": PROMPT, "new_tokens": new, "batch": 1},
            "reps": reps,
            "steps": steps,
            "foreign_cpu_share_per_rep": foreign,
            "torch": torch.as_ref().map(|p| p.info.clone()),
            "rows": rows.iter().map(|r| serde_json::json!({
                "system": r.system,
                "train_tok_s": num(r.train),
                "fwd_tok_s": num(r.fwd),
                "decode_tok_s": num(r.decode),
                "peak_rss_mib": num(r.rss_mib),
                "train_step_phases_s": PHASES.iter().zip(r.phases).map(|(k, v)| (k.to_string(), num(v)))
                    .collect::<serde_json::Map<_, _>>(),
            })).collect::<Vec<_>>(),
        });
        std::fs::write(path, serde_json::to_string_pretty(&out).map_err(|e| e.to_string())?)
            .map_err(|e| format!("cannot write {path}: {e}"))?;
        eprintln!("wrote {path}");
    }
    chart(&rows, threads, &describe, &png)?;
    eprintln!("wrote {}", png.display());
    Ok(())
}

/// The PNG bar chart: one group per measure, one bar per system.
/// A rate with one decimal, or `-` for a measure not taken.
fn tok_s(x: f64) -> String {
    if x.is_nan() {
        "-".into()
    } else {
        format!("{x:.1}")
    }
}

fn chart(rows: &[Row], threads: usize, describe: &str, path: &Path) -> Result<(), String> {
    let group = |name: &str, f: fn(&Row) -> f64| -> (String, Vec<(String, f64)>) {
        (name.to_string(), rows.iter().map(|r| (r.system.clone(), if f(r).is_nan() { 0.0 } else { f(r) })).collect())
    };
    let groups = [
        group("train tok/s", |r| r.train),
        group("forward tok/s", |r| r.fwd),
        group("decode tok/s", |r| r.decode),
        group("peak RSS MiB", |r| r.rss_mib),
    ];
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    let title = format!("bench LLaMA 512x6, f32, {threads} threads: {describe}");
    redco::plot::bar_chart(&title, &groups, "", path).map_err(|e| e.to_string())
}
