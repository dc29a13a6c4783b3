//! `cargo xtask gpu-check cuda [--python PY] [--real-size [--with-7b] [--steps N] [--batch B] [--seq T]]`:
//! the CUDA backend on a machine with an NVIDIA GPU, in one prepared run (`--real-size`:
//! the real-size training rows instead, [`crate::gpu_check_real`]). `PY` (default `python3`) is a Python with torch and the
//! `nvidia-*` wheels (cuBLAS, NCCL, NVRTC; NVRTC is fetched like the CI's where they
//! lack it): their library
//! directories go on `LD_LIBRARY_PATH`, with a `libnccl.so` link to the wheel's
//! `libnccl.so.2` (cudarc looks the library up by that name). Refuses to go on without a
//! GPU, then runs, with `REDCO_REQUIRE_CUDA=1`: the conformance suite on CUDA, the kernel
//! compilation and no-driver tests, the small LLaMA's logits and AdamW step against the
//! CPU backend (1x1 and 1x2; 1x2 over NCCL with two GPUs), `redco train --backend cuda`,
//! the GEMM throughput in f32 and bf16 next to `torch.matmul` on the same GPU (and as a
//! fraction of the device's dense bf16 peak: `bench gemm --backend cuda`), and the bench LLaMA's training
//! step next to torch on the same GPU (`bench llm --backend cuda --torch PY`, torch with
//! `REDCO_TORCH_DEVICE=cuda`); prints a table at the end.

use crate::args::Args;
use crate::gpu_check::{cargo, counts, report};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The `nvidia/*/lib` directories of `python`'s site-packages (torch's CUDA wheels).
pub(crate) fn wheel_libs(python: &str) -> Vec<PathBuf> {
    let script = "import glob, os, site\n\
        for s in site.getsitepackages():\n    \
            for d in sorted(glob.glob(os.path.join(s, 'nvidia', '*', 'lib'))):\n        \
                print(d)\n";
    Command::new(python)
        .args(["-c", script])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).lines().map(PathBuf::from).collect())
        .unwrap_or_default()
}

/// A directory holding `libnccl.so` -> the wheel's `libnccl.so.2`, when one is found.
fn nccl_link(libs: &[PathBuf]) -> Option<PathBuf> {
    let so2 = libs.iter().map(|d| d.join("libnccl.so.2")).find(|p| p.is_file())?;
    let dir = Path::new("target").join("nccl-link");
    std::fs::create_dir_all(&dir).ok()?;
    let link = dir.join("libnccl.so");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&so2, &link).ok()?;
    std::fs::canonicalize(&dir).ok()
}

/// Runs the task.
pub fn run(argv: &[String]) -> Result<(), String> {
    let args = Args::parse(argv, &["real-size", "with-7b"])?;
    args.only(&["python", "real-size", "with-7b", "steps", "batch", "seq"])?;
    let python = args.get("python").unwrap_or("python3").to_string();
    let real = (args.num("steps", 6)?.max(2), args.num("batch", 8)?.max(1), args.num("seq", 1024)?.max(2));
    let libs = wheel_libs(&python);
    // NVRTC from torch's wheels where they have it (a GPU machine without a network), else
    // fetched
    let mut path: Vec<String> = Vec::new();
    if !libs.iter().any(|d| d.join("libnvrtc.so.13").is_file()) {
        path.push(crate::nvrtc::ensure()?.display().to_string());
    }
    path.extend(nccl_link(&libs).map(|d| d.display().to_string()));
    path.extend(libs.iter().map(|d| d.display().to_string()));
    path.extend(std::env::var("LD_LIBRARY_PATH").ok().filter(|p| !p.is_empty()));
    let ld = path.join(":");
    let envs = [("LD_LIBRARY_PATH", ld.as_str()), ("REDCO_REQUIRE_CUDA", "1"), ("REDCO_REQUIRE_NVRTC", "1")];
    // one build of everything first, so the timed parts do not compile
    let (built, _) = cargo(&["build", "--release", "-p", "redco-cuda", "--tests", "--examples"], &envs, true)?;
    let (built2, _) = cargo(
        &["build", "--release", "-p", "redco", "-p", "xtask", "--features", "redco/cuda,xtask/cuda"],
        &envs,
        true,
    )?;
    if !built || !built2 {
        return Err("gpu-check cuda: the build failed".into());
    }
    let (ok, info) =
        cargo(&["run", "--release", "-q", "-p", "redco", "--features", "cuda", "--", "info"], &envs, true)?;
    let gpus = info.lines().filter(|l| l.starts_with("cuda: cuda:")).count();
    if !ok || gpus == 0 {
        return Err(format!(
            "gpu-check cuda needs an NVIDIA GPU: {}",
            info.lines().find(|l| l.starts_with("cuda")).unwrap_or("redco info failed")
        ));
    }
    if args.has("real-size") {
        let mut rows = crate::gpu_check_real::rows(&envs, &python, real)?;
        if args.has("with-7b") {
            rows.extend(crate::gpu_check_real::row_7b(&envs, (real.0.min(4), real.1 / 2, real.2))?);
        }
        let device = info.lines().find(|l| l.starts_with("cuda: cuda:")).unwrap_or("cuda").trim_start_matches("cuda: ");
        return report("cuda", &format!("gpu-check cuda --real-size on {device}"), &rows);
    }
    let mut rows: Vec<(String, String, bool)> = Vec::new();
    let mut tests = |what: &str, a: &[&str]| -> Result<(), String> {
        let (ok, out) = cargo(a, &envs, true)?;
        let (p, f) = counts(&out);
        rows.push((what.into(), format!("{p} passed, {f} failed"), ok && p > 0 && f == 0));
        Ok(())
    };
    tests("conformance suite on cuda", &["test", "--release", "-p", "redco-cuda", "--test", "conformance"])?;
    tests(
        "NVRTC kernels, allocator, launch, no-driver paths",
        &["test", "--release", "-p", "redco-cuda", "--lib", "--test", "nvrtc", "--test", "no_gpu"],
    )?;
    tests(
        "LLaMA logits + AdamW step = cpu (1x1, 1x2)",
        &["test", "--release", "-p", "redco-cuda", "--test", "llama", "--", "--nocapture"],
    )?;
    let workdir = std::env::temp_dir().join(format!("redco-gpu-check-cuda-{}", std::process::id()));
    let wd = workdir.to_string_lossy().into_owned();
    let train = ["run", "--release", "-q", "-p", "redco", "--features", "cuda", "--", "train", "--backend", "cuda"];
    let (ok, out) = cargo(
        &[&train[..], &["--preset", "llama-tiny", "--steps", "60", "--workdir", &wd, "--overwrite"]].concat(),
        &envs,
        true,
    )?;
    let _ = std::fs::remove_dir_all(&workdir);
    let loss = out.lines().find(|l| l.starts_with("loss ")).unwrap_or("no loss line").to_string();
    rows.push(("redco train --backend cuda (llama-tiny, 60 steps)".into(), loss, ok));

    // GEMM throughput next to torch.matmul on the same GPU
    rows.extend(crate::bench::gemm_cuda::rows(&envs, Some(&python), &[4096, 8192])?);

    // the bench LLaMA's step, next to torch on the same GPU
    let json = std::env::temp_dir().join(format!("redco-gpu-check-cuda-{}.json", std::process::id()));
    let json_s = json.to_string_lossy().into_owned();
    let bench =
        ["run", "--release", "-q", "-p", "xtask", "--features", "cuda", "--", "bench", "llm", "--backend", "cuda"];
    let tail = ["--mesh", "1x1", "--steps", "3", "--reps", "1", "--new", "16", "--torch", &python, "--json", &json_s];
    let mut benv = envs.to_vec();
    benv.push(("REDCO_TORCH_DEVICE", "cuda"));
    let (ok, _) = cargo(&[&bench[..], &tail[..]].concat(), &benv, true)?;
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap_or_default()).unwrap_or_default();
    let _ = std::fs::remove_file(&json);
    let rate = |system: &str, key: &str| -> Option<f64> {
        v["rows"].as_array()?.iter().find(|r| r["system"] == system)?[key].as_f64()
    };
    for (key, what) in [("train_tok_s", "training"), ("fwd_tok_s", "forward"), ("decode_tok_s", "decode")] {
        let (r, t) = (rate("redco-cuda-1x1", key), rate("torch", key));
        let text = match (r, t) {
            (Some(r), Some(t)) => format!("cuda {r:.0} tok/s, torch (cuda) {t:.0} tok/s: {:.2}x", r / t),
            (Some(r), None) => format!("cuda {r:.0} tok/s (no torch row)"),
            _ => "failed (see above)".into(),
        };
        rows.push((format!("bench LLaMA 512x6 {what}"), text, ok && r.is_some()));
    }
    report("cuda", &format!("gpu-check cuda ({gpus} GPU(s))"), &rows)
}
