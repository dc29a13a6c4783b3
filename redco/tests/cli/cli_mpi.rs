//! The `redco` program with ranks as processes (the `mpi` feature) under `mpirun
//! --oversubscribe --mca btl tcp,self` (TCP between ranks: the path between hosts):
//! training at 2x2 equals the thread run (every step's loss, the final weights, each
//! rank's collective counts); eval-dump matches transformers for every model at 1x2 and
//! 2x2; a killed rank ends the job within the timeout and names it, and resuming ends
//! with the weights of an uninterrupted run; a stopped rank is named by the watchdog;
//! ZeRO-2 and ZeRO-3 (with block or selective recompute) over processes equal their thread runs and the
//! replicated one; a mesh that does not fit the world is refused; the workdir, identity, integrity and
//! input checks hold over processes as over threads; `redco serve` at 1x2 over two processes
//! gives `generate`'s greedy text and drains on SIGTERM; ranks configured differently are
//! refused; expert parallelism over processes equals the thread run and every expert on
//! every rank.

#![cfg(feature = "mpi")]

use crate::common::{compare_dump, eval_dump_args, fixture_named};
use redco_mpi::launch::{Job, Mpirun};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_redco"))
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("redco-cli-mpi-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn mpirun(np: usize) -> Mpirun {
    let m = Mpirun::new(np);
    assert!(
        m.available(),
        "mpirun is not installed: apt-get install openmpi-bin libopenmpi-dev (cargo xtask test does)"
    );
    m
}

/// `redco` on thread ranks in this process's environment (no launcher variables).
fn redco_threads(args: &[&str]) -> (i32, String, String) {
    let mut c = Command::new(exe());
    c.args(args);
    for (k, _) in std::env::vars() {
        if k.starts_with("OMPI_") || k.starts_with("PMIX_") || k.starts_with("PMI_") {
            c.env_remove(k);
        }
    }
    let o = c.output().unwrap();
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into(),
        String::from_utf8_lossy(&o.stderr).into(),
    )
}

fn train_args<'a>(workdir: &'a str, steps: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec![
        "train",
        "--preset",
        "llama-tiny",
        "--mesh",
        "2x2",
        "--steps",
        steps,
        "--batch-size",
        "4",
        "--seq-len",
        "16",
        "--checkpoint-every",
        "4",
        "--oversubscribe",
        "--sample-tokens",
        "2",
        "--workdir",
        workdir,
    ];
    v.extend_from_slice(extra);
    v
}

/// (step, loss) of every metrics line.
/// A rank's `--comm-stats` file: its calls and bytes by kind and axis, as JSON text (the
/// file's wall times differ from run to run).
fn comm_counts(file: &Path) -> String {
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    assert!(v["seconds"].is_array(), "{v}");
    v["stats"].to_string()
}

fn losses(workdir: &Path) -> Vec<(u64, f64)> {
    std::fs::read_to_string(workdir.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (v["step"].as_u64().unwrap(), v["loss"].as_f64().unwrap())
        })
        .collect()
}

#[test]
fn training_at_2x2_over_processes_equals_the_thread_run() {
    let d = scratch("train");
    let (tw, pw) = (d.join("threads"), d.join("procs"));
    let (ts, ps) = (tw.to_str().unwrap(), pw.to_str().unwrap());
    let tstats = format!("{ts}/comm-{{rank}}.json");
    let pstats = format!("{ps}/comm-{{rank}}.json");
    let (code, _, err) = redco_threads(&train_args(ts, "6", &["--comm-stats", &tstats]));
    assert_eq!(code, 0, "{err}");
    let r =
        mpirun(4).run(&exe(), &train_args(ps, "6", &["--comm-stats", &pstats]), &d, Duration::from_secs(300)).unwrap();
    assert_eq!(r.code, Some(0), "{}\n{}", r.stdout, r.stderr);
    // rank 0 alone prints the run
    assert_eq!(r.stdout.matches("training llama-tiny").count(), 1, "{}", r.stdout);
    assert!(r.stdout.contains("in 4 processes"), "{}", r.stdout);
    let (lt, lp) = (losses(&tw), losses(&pw));
    assert_eq!(lt.len(), 6);
    assert_eq!(lt.len(), lp.len());
    for ((s, a), (_, b)) in lt.iter().zip(&lp) {
        assert!((a - b).abs() <= 1e-5 * a.abs(), "step {s}: loss {a} on threads, {b} over processes");
    }
    let bytes = |w: &Path| std::fs::read(w.join("model.safetensors")).unwrap();
    assert!(bytes(&tw) == bytes(&pw), "the final weights differ");
    for rank in 0..4 {
        let read = |w: &Path| comm_counts(&w.join(format!("comm-{rank}.json")));
        let (a, b) = (read(&tw), read(&pw));
        assert!(a.contains("AllReduce") && a.contains("Dp") && a.contains("Mp"), "{a}");
        assert_eq!(a, b, "rank {rank}'s collective calls");
    }
    // gradient buckets started during backward (on each process's MPI worker thread) give
    // the same bits
    let ow = d.join("overlap");
    let os = ow.to_str().unwrap();
    let r =
        mpirun(4).run(&exe(), &train_args(os, "6", &["--overlap-grad-sync"]), &d, Duration::from_secs(300)).unwrap();
    assert_eq!(r.code, Some(0), "{}\n{}", r.stdout, r.stderr);
    assert_eq!(losses(&ow), lp, "losses with --overlap-grad-sync");
    assert!(bytes(&ow) == bytes(&tw), "the final weights differ with --overlap-grad-sync");
}

/// Expert parallelism: Mixtral's four experts split over the four dp ranks of a 4x1 mesh,
/// over four processes (gradient buckets overlapped on the collective worker) and over four
/// threads, against every expert on every rank (ep 1):
/// every step's loss and the final weights within 1e-5; processes and threads make the
/// same collective calls (the all-to-alls included) and the same bits.
#[test]
fn expert_parallelism_over_processes_equals_threads_and_ep1() {
    let d = scratch("experts");
    let model = fixture_named("mixtral-tiny");
    let args = |w: &'static str, ep: &'static str, stats: &str| -> Vec<String> {
        let mut v: Vec<String> = [
            "train",
            "--model",
            model.to_str().unwrap(),
            "--mesh",
            "4x1",
            "--ep",
            ep,
            "--steps",
            "4",
            "--batch-size",
            "4",
            "--seq-len",
            "16",
            "--oversubscribe",
            "--sample-tokens",
            "2",
            "--workdir",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        v.push(d.join(w).to_str().unwrap().to_string());
        v.extend(["--comm-stats".to_string(), stats.to_string()]);
        v
    };
    let run_threads = |w: &'static str, ep: &'static str| {
        let stats = format!("{}/comm-{{rank}}.json", d.join(w).display());
        let a = args(w, ep, &stats);
        let (code, _, err) = redco_threads(&a.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(code, 0, "{w}: {err}");
    };
    run_threads("ep1", "1");
    run_threads("threads", "4");
    let stats = format!("{}/comm-{{rank}}.json", d.join("procs").display());
    // gradient buckets started on each process's collective worker while the all-to-alls
    // of the next steps run: the blocking collectives queue behind them, in one order
    let mut a = args("procs", "4", &stats);
    a.push("--overlap-grad-sync".into());
    let r =
        mpirun(4).run(&exe(), &a.iter().map(String::as_str).collect::<Vec<_>>(), &d, Duration::from_secs(300)).unwrap();
    assert_eq!(r.code, Some(0), "{}\n{}", r.stdout, r.stderr);
    let (l1, lt, lp) = (losses(&d.join("ep1")), losses(&d.join("threads")), losses(&d.join("procs")));
    assert_eq!(l1.len(), 4);
    for (((s, a), (_, b)), (_, c)) in l1.iter().zip(&lt).zip(&lp) {
        assert!((a - b).abs() <= 1e-5 * a.abs(), "step {s}: loss {a} at ep 1, {b} at ep 4 on threads");
        assert!((b - c).abs() <= 1e-5 * b.abs(), "step {s}: loss {b} on threads, {c} over processes");
    }
    let weights = |w: &str| redco_models::hf::safetensors::read_all(&d.join(w).join("model.safetensors")).unwrap();
    let (w1, wt, wp) = (weights("ep1"), weights("threads"), weights("procs"));
    assert_eq!(w1.len(), wt.len());
    for (n, t) in &w1 {
        let (a, b, c) = (t.data.to_f64_vec(), wt[n].data.to_f64_vec(), wp[n].data.to_f64_vec());
        let worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0f64, f64::max);
        assert!(worst <= 1e-5, "{n}: the ep 4 weights differ from ep 1's by {worst}");
        assert_eq!(b, c, "{n}: the weights over processes differ from the thread run's");
    }
    for rank in 0..4 {
        let read = |w: &str| comm_counts(&d.join(w).join(format!("comm-{rank}.json")));
        let (a, b) = (read("threads"), read("procs"));
        assert!(a.contains("AllToAll"), "rank {rank}: {a}");
        assert_eq!(a, b, "rank {rank}'s collective calls");
        assert!(!read("ep1").contains("AllToAll"), "ep 1 sends no tokens");
    }
}

/// ZeRO-2, and ZeRO-3 without recompute, with block and with selective recompute (the
/// prefetch of the next layer on the collective worker), at 2x2 over four processes: every step's loss
/// equals the thread run's at the same stage and the replicated (ZeRO-0) thread run's, and
/// each rank's collective calls are the thread run's.
#[test]
fn zero2_and_zero3_over_processes_equal_the_thread_runs() {
    let d = scratch("zero");
    let base = d.join("threads-zero0");
    let bs = base.to_str().unwrap();
    let (code, _, err) = redco_threads(&train_args(bs, "6", &["--strategy", "none"]));
    assert_eq!(code, 0, "{err}");
    let replicated = losses(&base);
    assert_eq!(replicated.len(), 6);
    for (zero, recompute) in [("2", "none"), ("3", "none"), ("3", "block"), ("3", "selective")] {
        let (tw, pw) =
            (d.join(format!("threads-zero{zero}-{recompute}")), d.join(format!("procs-zero{zero}-{recompute}")));
        let (ts, ps) = (tw.to_str().unwrap(), pw.to_str().unwrap());
        let (tstats, pstats) = (format!("{ts}/comm-{{rank}}.json"), format!("{ps}/comm-{{rank}}.json"));
        let flags = ["--zero", zero, "--recompute", recompute];
        let (code, _, err) = redco_threads(&train_args(ts, "6", &[&flags[..], &["--comm-stats", &tstats]].concat()));
        assert_eq!(code, 0, "{err}");
        let args = train_args(ps, "6", &[&flags[..], &["--comm-stats", &pstats]].concat());
        let r = mpirun(4).run(&exe(), &args, &d, Duration::from_secs(300)).unwrap();
        assert_eq!(r.code, Some(0), "{}\n{}", r.stdout, r.stderr);
        assert!(r.stdout.contains(&format!("(ZeRO-{zero})")), "{}", r.stdout);
        let (lt, lp) = (losses(&tw), losses(&pw));
        assert_eq!(lp.len(), 6, "ZeRO-{zero}");
        for (((s, a), (_, b)), (_, c)) in lt.iter().zip(&lp).zip(&replicated) {
            assert!((a - b).abs() <= 1e-5 * a.abs(), "ZeRO-{zero} step {s}: {a} on threads, {b} over processes");
            assert!((c - b).abs() <= 1e-5 * c.abs(), "ZeRO-{zero} step {s}: {c} replicated, {b} over processes");
        }
        for rank in 0..4 {
            let read = |w: &Path| comm_counts(&w.join(format!("comm-{rank}.json")));
            let (a, b) = (read(&tw), read(&pw));
            assert!(a.contains("ReduceScatter") && a.contains("AllGather"), "ZeRO-{zero}: {a}");
            assert_eq!(a, b, "ZeRO-{zero}: rank {rank}'s collective calls");
        }
    }
}

#[test]
fn eval_dump_over_processes_matches_transformers_at_1x2_and_2x2() {
    let d = scratch("parity");
    for name in ["llama-tiny", "gptj-tiny", "opt-tiny", "t5-tiny"] {
        for (np, mesh) in [(2, "1x2"), (4, "2x2")] {
            let out = d.join(format!("{name}-{mesh}.safetensors"));
            let owned = eval_dump_args(name, &out, &["--mesh", mesh]);
            let args: Vec<&str> = owned.iter().map(String::as_str).collect();
            let r = mpirun(np).run(&exe(), &args, &d.join(format!("{name}-{mesh}")), Duration::from_secs(300)).unwrap();
            assert_eq!(r.code, Some(0), "{name} at {mesh}:\n{}\n{}", r.stdout, r.stderr);
            assert_eq!(r.stdout.matches("wrote ").count(), 1, "rank 0 alone writes --out: {}", r.stdout);
            compare_dump(name, &out);
        }
    }
}

fn wait_for(what: &str, deadline: Duration, mut ok: impl FnMut() -> bool) {
    let t = Instant::now();
    while !ok() {
        assert!(t.elapsed() < deadline, "{what} did not happen within {deadline:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn latest_step(w: &Path) -> u64 {
    std::fs::read_to_string(w.join("checkpoints/latest"))
        .ok()
        .and_then(|s| s.trim().strip_prefix("step-").and_then(|n| n.parse().ok()))
        .unwrap_or(0)
}

#[test]
fn a_killed_rank_ends_the_job_and_resuming_over_processes_is_exact() {
    let d = scratch("kill");
    let (kw, uw) = (d.join("killed"), d.join("whole"));
    let (ks, us) = (kw.to_str().unwrap(), uw.to_str().unwrap());
    let job = mpirun(4).spawn(&exe(), &train_args(ks, "16", &["--timeout", "20"]), &d.join("first")).unwrap();
    // mid-run: after the first checkpoint, before the end
    wait_for("the first checkpoint", Duration::from_secs(240), || latest_step(&kw) >= 4);
    let victim = job.rank_pid(1).expect("rank 1's process");
    Job::signal(victim, "KILL").unwrap();
    let killed_at = Instant::now();
    let r = job.wait(Duration::from_secs(120)).unwrap();
    let took = killed_at.elapsed();
    assert!(!r.timed_out && r.code != Some(0), "the job went on: {:?}\n{}", r.code, r.stderr);
    assert!(took < Duration::from_secs(20), "the job took {took:?} to end (timeout 20 s)");
    assert!(r.stderr.contains("rank 1"), "the dead rank is named:\n{}", r.stderr);
    let done = latest_step(&kw);
    assert!(done < 16, "the run was killed mid-way (last checkpoint {done})");
    // resume over processes; then the same run uninterrupted, on threads
    let r = mpirun(4)
        .run(&exe(), &train_args(ks, "16", &["--resume"]), &d.join("resume"), Duration::from_secs(300))
        .unwrap();
    assert_eq!(r.code, Some(0), "{}\n{}", r.stdout, r.stderr);
    assert!(r.stdout.contains(&format!("over steps {}..16", done + 1)), "{}", r.stdout);
    let (code, _, err) = redco_threads(&train_args(us, "16", &[]));
    assert_eq!(code, 0, "{err}");
    let bytes = |w: &Path| std::fs::read(w.join("model.safetensors")).unwrap();
    assert!(bytes(&kw) == bytes(&uw), "resumed weights differ from the uninterrupted run's");
}

#[test]
fn a_stopped_rank_is_named_by_the_watchdog_and_the_job_ends() {
    let d = scratch("stop");
    let w = d.join("w");
    let job =
        mpirun(4).spawn(&exe(), &train_args(w.to_str().unwrap(), "400", &["--timeout", "4"]), &d.join("run")).unwrap();
    wait_for("the first step", Duration::from_secs(240), || {
        std::fs::read_to_string(w.join("metrics.jsonl")).is_ok_and(|t| t.lines().count() >= 2)
    });
    let pids = job.rank_pids();
    let victim = job.rank_pid(3).expect("rank 3's process");
    Job::signal(victim, "STOP").unwrap();
    let stopped_at = Instant::now();
    let r = job.wait(Duration::from_secs(120)).unwrap();
    let took = stopped_at.elapsed();
    for p in pids {
        let _ = Job::signal(p, "KILL");
    }
    assert!(!r.timed_out && r.code != Some(0), "{:?}\n{}", r.code, r.stderr);
    assert!(took < Duration::from_secs(30), "the job took {took:?} to end (timeout 4 s)");
    assert!(r.stderr.contains("watchdog") && r.stderr.contains("rank 3 is not responding"), "{}", r.stderr);
}

/// Ranks that are processes build their own configuration: where they disagree on what
/// decides their collectives (here rank 3 given another ZeRO-3 unit), the run is refused
/// naming the rank and both settings, never a hang.
#[test]
fn ranks_configured_differently_are_refused_naming_the_rank_and_the_settings() {
    let d = scratch("differ");
    let w = d.join("w");
    let exe = exe();
    let run = |k: &str| {
        let args = train_args(w.to_str().unwrap(), "2", &["--zero", "3", "--unit-layers", k]).join(" ");
        format!("exec '{}' {args}", exe.display())
    };
    let script = format!("if [ \"$OMPI_COMM_WORLD_RANK\" = 3 ]; then {}; else {}; fi", run("2"), run("1"));
    let r = mpirun(4).run(Path::new("/bin/sh"), &["-c", &script], &d, Duration::from_secs(120)).unwrap();
    assert!(!r.timed_out, "the job ended on its own: {}", r.stderr);
    assert_ne!(r.code, Some(0), "{}", r.stderr);
    assert!(
        r.stderr.contains("rank 3 on host") && r.stderr.contains("layers a ZeRO-3 unit 2 (rank 0: 1)"),
        "{}",
        r.stderr
    );
}

#[test]
fn a_mesh_that_does_not_fit_the_world_is_refused() {
    let d = scratch("misfit");
    let w = d.join("w");
    let r = mpirun(2).run(&exe(), &train_args(w.to_str().unwrap(), "2", &[]), &d, Duration::from_secs(60)).unwrap();
    assert_ne!(r.code, Some(0));
    assert!(r.stderr.contains("mesh 2x2 has 4 ranks but the job has 2 processes"), "{}", r.stderr);
}

#[test]
fn generate_over_processes_prints_once_what_threads_print() {
    let d = scratch("generate");
    let f = fixture_named("llama-tiny");
    let args = [
        "generate",
        "--model",
        f.to_str().unwrap(),
        "--mesh",
        "1x2",
        "--prompt",
        "hello",
        "--prompt",
        "a b",
        "--max-new-tokens",
        "5",
    ];
    let (code, want, err) = redco_threads(&args);
    assert_eq!(code, 0, "{err}");
    let r = mpirun(2).run(&exe(), &args, &d, Duration::from_secs(120)).unwrap();
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert_eq!(r.stdout, want);
}

#[test]
fn the_workdir_and_input_checks_hold_with_process_ranks() {
    let d = scratch("reliability");
    let w = d.join("w");
    let ws = w.to_str().unwrap();
    let args = |extra: &[&'static str]| -> Vec<String> {
        let mut v: Vec<String> = [
            "train",
            "--preset",
            "llama-tiny",
            "--mesh",
            "2x1",
            "--seq-len",
            "16",
            "--checkpoint-every",
            "2",
            "--oversubscribe",
            "--sample-tokens",
            "1",
            "--workdir",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        v.push(ws.to_string());
        v.extend(extra.iter().map(|s| s.to_string()));
        v
    };
    let job = |name: &str, extra: &[&'static str]| {
        let a = args(extra);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        let r = mpirun(2).run(&exe(), &a, &d.join(name), Duration::from_secs(180)).unwrap();
        assert!(!r.timed_out, "{name}: the job hung\n{}", r.stderr);
        r
    };
    let r = job("first", &["--steps", "4"]);
    assert_eq!(r.code, Some(0), "{}\n{}", r.stdout, r.stderr);
    let model = std::fs::read(w.join("model.safetensors")).unwrap();
    // a fresh run into the workdir: refused on every rank, the first run untouched
    let r = job("again", &["--steps", "2"]);
    assert_ne!(r.code, Some(0));
    assert!(r.stderr.contains("earlier run") && r.stderr.contains("--overwrite"), "{}", r.stderr);
    assert_eq!(std::fs::read(w.join("model.safetensors")).unwrap(), model);
    // resuming with another seed: refused
    let r = job("seed", &["--steps", "6", "--resume", "--seed", "7"]);
    assert_ne!(r.code, Some(0));
    assert!(r.stderr.contains("seed was 42, is now 7"), "{}", r.stderr);
    // the batch does not split over dp: refused before anything starts
    let r = job("batch", &["--steps", "6", "--resume", "--batch-size", "3"]);
    assert_ne!(r.code, Some(0));
    assert!(r.stderr.contains("--batch-size 3 must be divisible"), "{}", r.stderr);
    // one flipped bit in rank 1's shard of the newest checkpoint: refused naming the file,
    // and the job ends on both ranks
    let shard = w.join("checkpoints/step-00000004/rank-1.safetensors");
    let mut bytes = std::fs::read(&shard).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x40;
    std::fs::write(&shard, &bytes).unwrap();
    let r = job("corrupt", &["--steps", "6", "--resume"]);
    assert_ne!(r.code, Some(0));
    assert!(r.stderr.contains("rank-1.safetensors is corrupt") && r.stderr.contains("step-00000002"), "{}", r.stderr);
    // the user picks the older verified checkpoint: it resumes over processes
    let older = w.join("checkpoints/step-00000002");
    let a = args(&["--steps", "6", "--resume-from"]);
    let mut a: Vec<&str> = a.iter().map(String::as_str).collect();
    a.push(older.to_str().unwrap());
    let r = mpirun(2).run(&exe(), &a, &d.join("older"), Duration::from_secs(180)).unwrap();
    assert_eq!(r.code, Some(0), "{}\n{}", r.stdout, r.stderr);
    let steps: Vec<u64> = losses(&w).iter().map(|(s, _)| *s).collect();
    assert_eq!(steps, (1..=6).collect::<Vec<_>>());
}

/// `redco serve --mesh 1x2` over two MPI processes: rank 0 serves HTTP and leads rank 1 in
/// lockstep over TCP; the greedy text is `redco generate`'s (alone and with `n: 2`), and
/// SIGTERM to the ranks drains the server: rank 0 stops its follower and both exit 0.
#[test]
fn serve_over_two_processes_gives_generate_s_text_and_drains_on_sigterm() {
    use crate::cli_serve::{generated, http, post};
    use serde_json::json;
    let d = scratch("serve");
    let model = fixture_named("llama-tiny");
    let args = ["serve", "--model", model.to_str().unwrap(), "--mesh", "1x2", "--port", "0", "--kv-memory", "4MB"];
    let job = mpirun(2).spawn(&exe(), &args, &d).unwrap();
    let t = Instant::now();
    let addr = loop {
        let out = std::fs::read_to_string(d.join("mpirun.out")).unwrap_or_default();
        if let Some(a) = out.split("http://").nth(1).and_then(|r| r.split_whitespace().next()) {
            break a.to_string();
        }
        if t.elapsed() > Duration::from_secs(120) {
            let f = job.wait(Duration::ZERO).unwrap();
            panic!("the server did not start:\n{}\n{}", f.stdout, f.stderr);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let out = std::fs::read_to_string(d.join("mpirun.out")).unwrap();
    assert!(out.contains("2 ranks in lockstep"), "{out}");
    for prompt in ["Hello world", "the cat sat"] {
        let want = generated(&model, prompt, 10);
        let ask = json!({"prompt": prompt, "max_tokens": 10, "temperature": 0, "n": 2});
        let (st, r) = post(&addr, "/v1/completions", &ask);
        assert_eq!(st, 200, "{r}");
        for c in r["choices"].as_array().unwrap() {
            let text = c["text"].as_str().unwrap();
            assert!(!text.is_empty() && want.ends_with(text), "served over processes {text:?}, generate {want:?}");
        }
    }
    assert_eq!(http(&addr, "GET", "/health", b"").0, 200);
    // SIGTERM to every rank, as a launcher forwards it (mpirun, itself signalled, exits 1
    // whatever its ranks return: Open MPI 4.1): the follower ignores it, the leader drains,
    // stops the follower and both exit 0
    let ranks = job.rank_pids();
    assert_eq!(ranks.len(), 2, "the ranks under mpirun");
    for pid in ranks {
        Job::signal(pid, "TERM").unwrap();
    }
    let f = job.wait(Duration::from_secs(120)).unwrap();
    assert!(!f.timed_out, "the server did not stop after SIGTERM:\n{}\n{}", f.stdout, f.stderr);
    assert_eq!(f.code, Some(0), "{}\n{}", f.stdout, f.stderr);
    assert!(f.stdout.contains("redco serve: stopped"), "{}", f.stdout);
}
