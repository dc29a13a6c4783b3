//! `cargo xtask bench real-size --torch PYTHON`: the CPU backend at real model sizes, next to
//! transformers + torch in the same run, in one table:
//!
//! - a 1.1B LLaMA (TinyLlama's shape: hidden 2048, 22 layers, 32 heads, 4 kv heads,
//!   intermediate 5632, vocab 32000; random weights written in bf16 by the fixture generator,
//!   `gen_fixtures.py --only llama-1.1b`, into `target/bench-models/llama-1.1b` unless
//!   `--model DIR` names another), decoded in bf16 and in f32 (loaded from the bf16 file):
//!   load time, load + first token, decode tokens/s at batch 1, peak resident set, and the
//!   checkpoint's bytes (`bench decode --model`, one child process per dtype, so each peak is
//!   its own);
//! - the 134M LLaMA (`--preset llama-134m --vocab 32000` of `bench llm`: hidden 768, 12
//!   layers, 12 heads, intermediate 2048) training tokens/s in f32 and in bf16 (f32 master
//!   weights; torch under autocast), batch 4 x 256, AdamW.
//!
//! Flags: `--threads N`, `--reps N` (decode repetitions, default 3), `--new N` (new tokens,
//! default 32), `--skip-train`, `--skip-decode`, `--json FILE`.

use crate::args::Args;
use crate::machine;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs the benchmark.
pub fn run(argv: &[String]) -> Result<(), String> {
    let args = Args::parse(argv, &["skip-train", "skip-decode"])?;
    args.only(&["torch", "model", "threads", "reps", "new", "json", "skip-train", "skip-decode"])?;
    let py = args.get("torch").ok_or("bench real-size needs --torch PYTHON (transformers + torch: the peer)")?;
    let threads = args.num("threads", machine::cores())?.to_string();
    let reps = args.num("reps", 3)?.max(1).to_string();
    let new = args.num("new", 32)?.max(2).to_string();
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().ok_or("no workspace root")?.to_path_buf();
    let model = match args.get("model") {
        Some(d) => PathBuf::from(d),
        None => root.join("target/bench-models/llama-1.1b"),
    };
    let out_dir = root.join("target/bench-real-size");
    std::fs::create_dir_all(&out_dir).map_err(|e| format!("cannot create {}: {e}", out_dir.display()))?;
    let mut decode = Vec::new();
    if !args.has("skip-decode") {
        ensure_model(py, &root, &model)?;
        let bytes = checkpoint_bytes(&model)?;
        for dtype in ["bf16", "f32"] {
            let json = out_dir.join(format!("decode-{dtype}.json"));
            let m = model.to_string_lossy().into_owned();
            let j = json.to_string_lossy().into_owned();
            let a = ["bench", "decode", "--model", &m, "--dtype", dtype, "--torch", py, "--threads", &threads];
            child(&[&a[..], &["--reps", &reps, "--new", &new, "--json", &j]].concat())?;
            decode.push((dtype, read_json(&json)?));
        }
        print_decode(&model, bytes, &decode);
    }
    let mut train = serde_json::Map::new();
    if !args.has("skip-train") {
        for dtype in ["f32", "bf16"] {
            let json = out_dir.join(format!("train-134m-{dtype}.json"));
            let j = json.to_string_lossy().into_owned();
            let png = out_dir.join(format!("train-134m-{dtype}.png")).to_string_lossy().into_owned();
            let a = ["bench", "llm", "--preset", "llama-134m", "--vocab", "32000", "--mesh", "1x1", "--dtype", dtype];
            let b = ["--reps", "2", "--steps", "4", "--new", "8", "--torch", py, "--threads", &threads];
            child(&[&a[..], &b[..], &["--json", &j, "--png", &png]].concat())?;
            train.insert(dtype.to_string(), read_json(&json)?);
        }
        print_train(&train);
    }
    if let Some(path) = args.get("json") {
        let out = serde_json::json!({
            "machine": machine::describe(),
            "model_dir": model.to_string_lossy(),
            "decode": decode.iter().map(|(d, v)| (d.to_string(), v.clone())).collect::<serde_json::Map<_, _>>(),
            "train_134m": train,
        });
        std::fs::write(path, serde_json::to_string_pretty(&out).map_err(|e| e.to_string())?)
            .map_err(|e| format!("cannot write {path}: {e}"))?;
        eprintln!("wrote {path}");
    }
    Ok(())
}

/// Writes the 1.1B model with the fixture generator unless `dir` already holds one.
fn ensure_model(py: &str, root: &Path, dir: &Path) -> Result<(), String> {
    if dir.join("config.json").exists() {
        return Ok(());
    }
    let parent = dir.parent().ok_or("the model directory has no parent")?;
    if dir.file_name().and_then(|n| n.to_str()) != Some("llama-1.1b") {
        return Err(format!(
            "{} holds no config.json (the generator writes only a `llama-1.1b` directory)",
            dir.display()
        ));
    }
    eprintln!("writing the 1.1B benchmark model (2.2 GB, random weights) into {}", dir.display());
    let script = root.join("xtask/python/gen_fixtures.py");
    let status = Command::new(py)
        .arg(&script)
        .args(["--only", "llama-1.1b", "--out"])
        .arg(parent)
        .status()
        .map_err(|e| format!("cannot run {py}: {e}"))?;
    if !status.success() {
        return Err(format!("the generator failed ({status}): does `{py}` have torch and transformers?"));
    }
    Ok(())
}

/// The bytes of the checkpoint's safetensors files.
fn checkpoint_bytes(dir: &Path) -> Result<u64, String> {
    let mut total = 0;
    for e in std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))? {
        let e = e.map_err(|e| e.to_string())?;
        if e.path().extension().is_some_and(|x| x == "safetensors") {
            total += e.metadata().map_err(|e| e.to_string())?.len();
        }
    }
    Ok(total)
}

/// Runs this binary with `argv`, its output passing through.
fn child(argv: &[&str]) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    eprintln!("bench real-size: xtask {}", argv.join(" "));
    let status = Command::new(&exe).args(argv).status().map_err(|e| format!("cannot run {}: {e}", exe.display()))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`xtask {}` failed ({status})", argv.join(" ")))
    }
}

fn read_json(path: &Path) -> Result<serde_json::Value, String> {
    let s = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    serde_json::from_str(&s).map_err(|e| format!("{}: {e}", path.display()))
}

/// The row of `system` in a bench JSON.
fn row<'a>(v: &'a serde_json::Value, system: &str) -> Option<&'a serde_json::Value> {
    v["rows"].as_array()?.iter().find(|r| r["system"].as_str().is_some_and(|s| s.starts_with(system)))
}

fn print_decode(model: &Path, bytes: u64, decode: &[(&str, serde_json::Value)]) {
    println!();
    println!(
        "1.1B LLaMA {} ({:.2} GB of bf16 checkpoint), batch 1, {}",
        model.display(),
        bytes as f64 / 1e9,
        machine::describe()
    );
    println!(
        "{:<6} {:<10} {:>8} {:>15} {:>13} {:>13} {:>14}",
        "dtype", "system", "load s", "load+1st tok s", "decode ms/tok", "decode tok/s", "peak RSS / ckpt"
    );
    let f = |x: Option<f64>, scale: f64, p: usize| x.map_or("-".to_string(), |x| format!("{:.*}", p, x * scale));
    for (dtype, v) in decode {
        for system in ["redco-cpu", "torch"] {
            let Some(r) = row(v, system) else { continue };
            let step = r["decode_s_per_token"].as_f64();
            println!(
                "{:<6} {:<10} {:>8} {:>15} {:>13} {:>13} {:>14}",
                dtype,
                system,
                f(r["load_s"].as_f64(), 1.0, 2),
                f(r["load_and_first_token_s"].as_f64(), 1.0, 2),
                f(step, 1e3, 1),
                f(step.map(|s| 1.0 / s), 1.0, 2),
                f(r["peak_rss_bytes"].as_f64().map(|b| b / bytes as f64), 1.0, 2),
            );
        }
    }
    let step = |d: &str, s: &str| {
        decode.iter().find(|(x, _)| *x == d).and_then(|(_, v)| row(v, s)?["decode_s_per_token"].as_f64())
    };
    if let (Some(rb), Some(tb), Some(rf)) = (step("bf16", "redco-cpu"), step("bf16", "torch"), step("f32", "redco-cpu"))
    {
        println!("bf16 decode: {:.2}x torch's bf16 tokens/s, {:.2}x redco's own f32", tb / rb, rf / rb);
    }
}

fn print_train(runs: &serde_json::Map<String, serde_json::Value>) {
    println!();
    println!("134M LLaMA (hidden 768, 12 layers, 12 heads, intermediate 2048, vocab 32000), batch 4 x 256, AdamW");
    let rate = |d: &str, s: &str| runs.get(d).and_then(|v| row(v, s)?["train_tok_s"].as_f64());
    for dtype in ["f32", "bf16"] {
        match (rate(dtype, "redco-cpu-1x1"), rate(dtype, "torch")) {
            (Some(r), Some(t)) => println!("training {dtype}: redco {r:.1} tok/s, torch {t:.1} tok/s: {:.2}x", r / t),
            (r, t) => println!("training {dtype}: redco {r:?} tok/s, torch {t:?} tok/s"),
        }
    }
    if let (Some(b), Some(f)) = (rate("bf16", "redco-cpu-1x1"), rate("f32", "redco-cpu-1x1")) {
        println!("redco bf16 training: {:.2}x its own f32", b / f);
    }
}
