//! `cargo xtask gpu-check pjrt [--plugin PATH] [--allow-cpu]`: the PJRT backend on a machine
//! with a GPU. Takes the plugin from `--plugin`, `REDCO_PJRT_PLUGIN`, `python3`'s installed
//! `jax-cuda13-pjrt` (with the `nvidia-*` wheels' libraries on `LD_LIBRARY_PATH`; XLA's
//! GEMM autotuning off unless `XLA_FLAGS` is set), or fetches XLA's CUDA
//! plugin (`pip download --no-deps jax-cuda13-pjrt`; the CUDA libraries it loads must be
//! installed), shows the devices (`redco info`), refuses a CPU platform unless
//! `--allow-cpu`, then runs with that plugin: the conformance suite, the runtime and
//! bad-input tests, the compiled training step and compiled decoding against the CPU
//! backend, the CLI parity tests (eval-dump against the transformers fixtures of LLaMA,
//! GPT-J, OPT and T5; meshes 1x2 and 2x2 where the devices suffice), and the bench LLaMA (`bench llm
//! --backend cpu,pjrt-eager,pjrt`, one short repetition); prints a table at the end.

use crate::args::Args;
use crate::gpu_check::{cargo, counts, report};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The CUDA plugin's wheel and file.
const CUDA_WHEEL: &str = "jax-cuda13-pjrt";
const CUDA_PLUGIN: &str = "xla_cuda_plugin.so";

/// XLA's CUDA plugin as installed in `python3`'s site-packages (`jax-cuda13-pjrt`), if it is.
fn installed_cuda_plugin() -> Option<PathBuf> {
    let script = "import glob, os, site\n\
        for s in site.getsitepackages():\n    \
            for p in sorted(glob.glob(os.path.join(s, 'jax_plugins', '*', 'xla_cuda_plugin.so'))):\n        \
                print(p)\n";
    let out = Command::new("python3").args(["-c", script]).output().ok()?;
    String::from_utf8_lossy(&out.stdout).lines().map(PathBuf::from).find(|p| p.is_file())
}

fn fetch_cuda_plugin() -> Result<PathBuf, String> {
    if let Some(p) = installed_cuda_plugin() {
        return Ok(p);
    }
    let dir = Path::new("target").join("pjrt-cuda");
    let out = dir.join(CUDA_PLUGIN);
    if out.is_file() {
        return std::fs::canonicalize(&out).map_err(|e| e.to_string());
    }
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    eprintln!("xtask: fetching the CUDA PJRT plugin (pip download --no-deps {CUDA_WHEEL})");
    let ok = Command::new("python3")
        .args(["-m", "pip", "download", "--no-deps", "--quiet", "-d"])
        .arg(&dir)
        .arg(CUDA_WHEEL)
        .status()
        .is_ok_and(|s| s.success());
    let script = format!(
        "import glob, zipfile, sys\nw = sorted(glob.glob(sys.argv[1] + '/*.whl'))[-1]\nz = zipfile.ZipFile(w)\n\
         n = [m for m in z.namelist() if m.endswith('{CUDA_PLUGIN}')][0]\nopen(sys.argv[2], 'wb').write(z.read(n))\n"
    );
    let unpacked =
        ok && Command::new("python3").args(["-c", &script]).arg(&dir).arg(&out).status().is_ok_and(|s| s.success());
    if !unpacked {
        return Err(format!(
            "fetching {CUDA_WHEEL} failed: pass --plugin PATH (or set REDCO_PJRT_PLUGIN) to a PJRT plugin's shared library"
        ));
    }
    std::fs::canonicalize(&out).map_err(|e| e.to_string())
}

/// The platform and device count `redco info` reports for the plugin.
fn devices(envs: &[(&str, &str)]) -> Result<(String, usize), String> {
    let (ok, out) = cargo(&["run", "--release", "-q", "-p", "redco", "--features", "tpu", "--", "info"], envs, true)?;
    let line = out.lines().find(|l| l.starts_with("pjrt: ")).unwrap_or_default().to_string();
    let platform = line.split("platform ").nth(1).and_then(|r| r.split(',').next()).unwrap_or("").trim().to_string();
    let n = line
        .rsplit(", ")
        .next()
        .and_then(|r| r.split_whitespace().next())
        .and_then(|x| x.parse::<usize>().ok())
        .unwrap_or(0);
    if !ok || n == 0 {
        return Err(format!("the PJRT plugin opened no device: {line}"));
    }
    Ok((platform, n))
}

/// Runs the task.
pub fn run(argv: &[String]) -> Result<(), String> {
    let args = Args::parse(argv, &["allow-cpu"])?;
    args.only(&["plugin", "allow-cpu"])?;
    let plugin = match args
        .get("plugin")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("REDCO_PJRT_PLUGIN").map(PathBuf::from))
    {
        Some(p) if p.is_file() => std::fs::canonicalize(&p).map_err(|e| e.to_string())?,
        Some(p) => return Err(format!("the PJRT plugin {} is not a file", p.display())),
        None => fetch_cuda_plugin()?,
    };
    let plugin_s = plugin.to_string_lossy().into_owned();
    // the CUDA libraries the plugin loads, from the `nvidia-*` wheels where they are
    let mut ld: Vec<String> =
        crate::gpu_check_cuda::wheel_libs("python3").iter().map(|d| d.display().to_string()).collect();
    ld.extend(std::env::var("LD_LIBRARY_PATH").ok().filter(|p| !p.is_empty()));
    let ld = ld.join(":");
    let (platform, n) = devices(&[("REDCO_PJRT_PLUGIN", &plugin_s), ("LD_LIBRARY_PATH", &ld)])?;
    if platform.eq_ignore_ascii_case("cpu") && !args.has("allow-cpu") {
        return Err(format!(
            "gpu-check pjrt needs a GPU or TPU plugin: {plugin_s} is a CPU plugin (pass --allow-cpu to run anyway)"
        ));
    }
    let meshes = match n {
        0 | 1 => "1x1",
        2 | 3 => "1x1,1x2",
        _ => "1x1,1x2,2x2",
    };
    // XLA's GPU autotuning times every GEMM fusion of every program it compiles: the eager
    // path compiles one small program per op and shape, and with autotuning the T5 parity
    // test alone ran past a minute on an H200 (all five CLI tests: 20 s without it)
    let xla_flags = std::env::var("XLA_FLAGS").unwrap_or_else(|_| "--xla_gpu_autotune_level=0".into());
    let envs = [
        ("REDCO_PJRT_PLUGIN", plugin_s.as_str()),
        ("REDCO_PJRT_MESHES", meshes),
        ("LD_LIBRARY_PATH", &ld),
        ("XLA_FLAGS", &xla_flags),
    ];
    let mut rows: Vec<(String, String, bool)> = Vec::new();
    let mut tests = |what: &str, args: &[&str]| -> Result<(), String> {
        let (ok, out) = cargo(args, &envs, true)?;
        let (p, f) = counts(&out);
        rows.push((what.into(), format!("{p} passed, {f} failed"), ok && p > 0 && f == 0));
        Ok(())
    };
    tests("conformance suite on pjrt", &["test", "--release", "-p", "redco-tpu", "--test", "conformance"])?;
    tests("runtime and bad input", &["test", "--release", "-p", "redco-tpu", "--test", "runtime", "--test", "errors"])?;
    // the tests of several devices run where the plugin has them
    let mut compiled = vec!["test", "--release", "-p", "redco-tpu", "--test", "compiled", "--"];
    compiled.extend(["equals_the_eager", "another_shape", "overflowing"]);
    let mut trainer = vec!["test", "--release", "-p", "redco-tpu", "--test", "trainer", "--", "refused"];
    let mut cli = vec!["test", "--release", "-p", "redco", "--features", "tpu", "--test", "cli", "--"];
    cli.extend(["cli_pjrt::eval_dump", "cli_pjrt::generate"]);
    if n >= 2 {
        compiled.extend(["two_devices", "clipping", "outside_the_vocabulary"]);
        cli.push("cli_pjrt::train");
    }
    if n >= 4 {
        compiled.push("1x2_and_2x2");
        trainer.push("equals_the_cpu_trainer");
    }
    tests("compiled training step = eager = cpu (meshes the devices allow)", &compiled)?;
    tests("Trainer with the compiled step = cpu Trainer", &trainer)?;
    tests("compiled decoding = cpu tokens", &["test", "--release", "-p", "redco-tpu", "--test", "decode"])?;
    tests(&format!("CLI eval-dump parity ({meshes}), generate, train"), &cli)?;
    let json = std::env::temp_dir().join(format!("redco-gpu-check-pjrt-{}.json", std::process::id()));
    let json_s = json.to_string_lossy().into_owned();
    let bench = [
        "run",
        "--release",
        "-q",
        "-p",
        "xtask",
        "--features",
        "tpu",
        "--",
        "bench",
        "llm",
        "--backend",
        "cpu,pjrt-eager,pjrt",
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
    ];
    let (ok, _) = cargo(&bench, &envs, true)?;
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap_or_default()).unwrap_or_default();
    let _ = std::fs::remove_file(&json);
    let rate = |system: &str, key: &str| -> String {
        v["rows"]
            .as_array()
            .and_then(|rs| rs.iter().find(|r| r["system"] == system))
            .and_then(|r| r[key].as_f64())
            .map_or("-".into(), |x| format!("{x:.0}"))
    };
    for (key, what) in [("train_tok_s", "training tok/s"), ("decode_tok_s", "decode tok/s")] {
        rows.push((
            format!("bench LLaMA 512x6 {what}"),
            format!(
                "compiled {}, eager {}, cpu {}",
                rate("redco-pjrt-1x1", key),
                rate("redco-pjrt-eager-1x1", key),
                rate("redco-cpu-1x1", key)
            ),
            ok,
        ));
    }
    report("pjrt", &format!("gpu-check pjrt with {plugin_s} ({platform}, {n} device(s))"), &rows)
}
