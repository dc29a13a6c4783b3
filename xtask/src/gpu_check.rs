//! `cargo xtask gpu-check wgpu [--allow-cpu-adapter]`: for a machine with a real GPU. Shows
//! the wgpu adapters, refuses to go on without a GPU adapter (unless `--allow-cpu-adapter`),
//! then runs on that adapter, with `REDCO_REQUIRE_WGPU=1` and `REDCO_WGPU_ADAPTER` set to
//! it: the conformance suite on wgpu, redco-wgpu's own tests (every matmul layout with both
//! tilings, bad input, a lost device), the 1024^3 f32 matmul throughput next to the CPU
//! backend, the small LLaMA (logits and one AdamW step equal to the CPU backend at 1x1
//! and 1x2), the pipeline and the CLI on wgpu ranks (`redco train --backend wgpu` among
//! them), and the bench LLaMA's training step (`bench llm --backend cpu,wgpu`, one short
//! repetition); prints a table at the end.

use crate::args::Args;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

/// An adapter as the `adapters` example of redco-wgpu lists it.
struct Adapter {
    name: String,
    api: String,
    kind: String,
    driver: String,
    used: bool,
}

/// Runs `cargo args` with `envs`, echoing its stdout as it comes when `echo`; returns its
/// success and its stdout.
/// From a bundle (`REDCO_GPU_BUNDLE`), the bundled program runs instead
/// ([`crate::gpu_bundle::run`]).
pub(crate) fn cargo(args: &[&str], envs: &[(&str, &str)], echo: bool) -> Result<(bool, String), String> {
    if let Some(dir) = crate::gpu_bundle::dir() {
        return crate::gpu_bundle::run(&dir, args, envs, echo);
    }
    eprintln!("xtask: cargo {}", args.join(" "));
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.args(args).envs(envs.iter().copied());
    piped(c, "cargo", echo)
}

/// Runs `c`, echoing its stdout as it comes when `echo`; its success and its stdout (`what`
/// names it in errors).
pub(crate) fn piped(mut c: Command, what: &str, echo: bool) -> Result<(bool, String), String> {
    let mut child = c.stdout(Stdio::piped()).spawn().map_err(|e| format!("cannot run {what}: {e}"))?;
    let mut out = String::new();
    if let Some(stdout) = child.stdout.take() {
        for line in BufReader::new(stdout).lines() {
            let line = line.map_err(|e| format!("reading {what}'s output: {e}"))?;
            if echo {
                println!("{line}");
            }
            out.push_str(&line);
            out.push('\n');
        }
    }
    let status = child.wait().map_err(|e| format!("waiting for {what}: {e}"))?;
    Ok((status.success(), out))
}

fn adapters() -> Result<Vec<Adapter>, String> {
    let (ok, out) = cargo(&["run", "-q", "-p", "redco-wgpu", "--example", "adapters"], &[], false)?;
    let list: Vec<Adapter> = out
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            (f.len() == 6).then(|| Adapter {
                name: f[1].into(),
                api: f[2].into(),
                kind: f[3].into(),
                driver: f[4].into(),
                used: f[5] == "used",
            })
        })
        .collect();
    if !ok && list.is_empty() {
        return Err("no wgpu adapter found (no Vulkan, Metal, DX12 or GL driver; see the error above)".into());
    }
    Ok(list)
}

/// `passed` and `failed` summed over every `test result:` line of libtest's output.
pub(crate) fn counts(out: &str) -> (u64, u64) {
    let (mut passed, mut failed) = (0, 0);
    for line in out.lines() {
        let Some((_, rest)) = line.strip_prefix("test result: ").and_then(|r| r.split_once(". ")) else { continue };
        for part in rest.split(';') {
            match part.trim().split_once(' ') {
                Some((n, "passed")) => passed += n.parse::<u64>().unwrap_or(0),
                Some((n, "failed")) => failed += n.parse::<u64>().unwrap_or(0),
                _ => {}
            }
        }
    }
    (passed, failed)
}

/// The `wgpu (...) X GFLOP/s, cpu Y GFLOP/s` numbers of the matmul test.
fn gflops(out: &str) -> Option<(f64, f64)> {
    let line = out.lines().find(|l| l.starts_with("matmul "))?;
    let nums: Vec<f64> = line
        .split_whitespace()
        .zip(line.split_whitespace().skip(1))
        .filter(|(_, unit)| unit.starts_with("GFLOP/s"))
        .filter_map(|(n, _)| n.parse().ok())
        .collect();
    Some((*nums.first()?, *nums.get(1)?))
}

/// The bench LLaMA's training tokens/s on wgpu and cpu (`bench llm`, mesh 1x1, one
/// repetition of one timed step), as a row of the table.
fn training_bench(envs: &[(&str, &str)]) -> Result<(String, String, bool), String> {
    let what = "LLaMA 512x6 training step (bench llm, 1x1)".to_string();
    let tmp = std::env::temp_dir();
    let json = tmp.join(format!("redco-gpu-check-bench-{}.json", std::process::id()));
    let png = tmp.join(format!("redco-gpu-check-bench-{}.png", std::process::id()));
    let (json_s, png_s) = (json.to_string_lossy().into_owned(), png.to_string_lossy().into_owned());
    let args = [
        "run",
        "--release",
        "-q",
        "-p",
        "xtask",
        "--features",
        "wgpu",
        "--",
        "bench",
        "llm",
        "--backend",
        "cpu,wgpu",
        "--mesh",
        "1x1",
        "--steps",
        "1",
        "--reps",
        "1",
        "--new",
        "16",
        "--json",
        &json_s,
        "--png",
        &png_s,
    ];
    let (ok, _) = cargo(&args, envs, true)?;
    let text = std::fs::read_to_string(&json).unwrap_or_default();
    let _ = (std::fs::remove_file(&json), std::fs::remove_file(&png));
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    let train = |system: &str| -> Option<f64> {
        v["rows"].as_array()?.iter().find(|r| r["system"] == system)?["train_tok_s"].as_f64()
    };
    Ok(match (ok, train("redco-wgpu-1x1"), train("redco-cpu-1x1")) {
        (true, Some(w), Some(c)) => (what, format!("wgpu {w:.0} tok/s, cpu {c:.0} tok/s"), true),
        _ => (what, "failed (see above)".into(), false),
    })
}

/// Runs the task.
pub fn run(argv: &[String]) -> Result<(), String> {
    let (backend, rest) = match argv.split_first() {
        Some((b, rest)) if !b.starts_with("--") => (b.as_str(), rest),
        _ => {
            return Err(
                "usage: cargo xtask gpu-check wgpu [--allow-cpu-adapter] | pjrt [--plugin PATH] [--allow-cpu] | cuda [--python PY] [--real-size] | bundle [--out DIR]"
                    .into()
            )
        }
    };
    if backend == "pjrt" {
        return crate::gpu_check_pjrt::run(rest);
    }
    if backend == "cuda" {
        return crate::gpu_check_cuda::run(rest);
    }
    if backend == "bundle" {
        return crate::gpu_bundle::pack(rest);
    }
    if backend != "wgpu" {
        return Err(format!("gpu-check: unknown backend `{backend}` (available: wgpu, pjrt, cuda, bundle)"));
    }
    let args = Args::parse(rest, &["allow-cpu-adapter"])?;
    args.only(&["allow-cpu-adapter"])?;

    let list = adapters()?;
    println!("wgpu adapters:");
    for a in &list {
        println!("  {} ({}, {}, driver {}){}", a.name, a.api, a.kind, a.driver, if a.used { "  <- used" } else { "" });
    }
    let used = list.iter().find(|a| a.used).ok_or("no wgpu adapter could be opened (see the error above)")?;
    if used.kind == "Cpu" && !args.has("allow-cpu-adapter") {
        let why = if std::env::var("REDCO_WGPU_ADAPTER").is_ok_and(|v| !v.is_empty()) {
            "REDCO_WGPU_ADAPTER picks a CPU adapter"
        } else {
            "no GPU adapter found, only CPU adapters"
        };
        return Err(format!(
            "gpu-check needs a GPU: {why} ({} through {}). Install the GPU's Vulkan driver (check with `vulkaninfo \
             --summary`), or pass --allow-cpu-adapter to run the checks on the CPU adapter anyway",
            used.name, used.api
        ));
    }
    let envs = [("REDCO_REQUIRE_WGPU", "1"), ("REDCO_WGPU_ADAPTER", used.name.as_str())];

    let mut rows: Vec<(String, String, bool)> = Vec::new();
    let mut tests = |what: &str, args: &[&str]| -> Result<(), String> {
        let (ok, out) = cargo(args, &envs, true)?;
        let (p, f) = counts(&out);
        let ok = ok && p > 0 && f == 0;
        rows.push((what.into(), format!("{p} passed, {f} failed"), ok));
        Ok(())
    };
    tests("conformance suite on wgpu", &["test", "-p", "redco-tests", "--test", "conformance", "wgpu"])?;
    tests("redco-wgpu tests", &["test", "-p", "redco-wgpu", "--lib", "--test", "bad_input"])?;
    tests(
        "LLaMA on wgpu = cpu (1x1, 1x2)",
        &["test", "-p", "redco-tests", "--test", "wgpu_llama", "--", "--nocapture"],
    )?;
    tests("pipeline on wgpu ranks (Trainer, Predictor)", &["test", "-p", "redco-tests", "--test", "pipeline", "wgpu"])?;
    tests(
        "redco CLI on wgpu (eval-dump, generate, train)",
        &["test", "-p", "redco", "--features", "wgpu", "--test", "cli", "--", "cli_wgpu::"],
    )?;
    let (ok, out) = cargo(&["run", "--release", "-p", "redco-wgpu", "--example", "matmul_gflops"], &envs, true)?;
    match gflops(&out) {
        Some((w, c)) if ok => {
            rows.push(("matmul 1024^3 f32".into(), format!("wgpu {w:.1} GFLOP/s, cpu {c:.1} GFLOP/s"), true))
        }
        _ => rows.push(("matmul 1024^3 f32".into(), "failed (see above)".into(), false)),
    }
    rows.push(training_bench(&envs)?);

    let title = format!("gpu-check wgpu on {} ({}, {}, driver {})", used.name, used.api, used.kind, used.driver);
    report("wgpu", &title, &rows)
}

/// Prints the table of `rows` (what, result, ok) under `title`; an error names the failed
/// rows.
pub(crate) fn report(backend: &str, title: &str, rows: &[(String, String, bool)]) -> Result<(), String> {
    println!("\n{title}");
    let width = rows.iter().map(|r| r.0.len()).max().unwrap_or(0);
    for (what, result, ok) in rows {
        println!("  {what:<width$}  {}  {result}", if *ok { "ok  " } else { "FAIL" });
    }
    let failed: Vec<&str> = rows.iter().filter(|r| !r.2).map(|r| r.0.as_str()).collect();
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("gpu-check {backend} failed: {}", failed.join(", ")))
    }
}
