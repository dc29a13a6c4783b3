//! `cargo xtask gpu-check bundle [--out DIR]`: the GPU checks for a machine that has a GPU but
//! no Rust toolchain (the lent GPU machines have none, and nothing to download one from).
//! Here it builds, in release, every program the `cuda` and `pjrt` checks run (the `redco`
//! and `xtask` binaries with both backends, redco-cuda's tests and GEMM example, redco-tpu's
//! tests, the CLI tests) and copies them, stripped, into `DIR` (default
//! `target/gpu-bundle`) with the workspace root they were built in. There, with the working
//! tree beside it, `DIR/xtask gpu-check cuda` (or `pjrt`) runs with `REDCO_GPU_BUNDLE=DIR`:
//! each `cargo test`/`cargo run` the checks would start runs the bundled program instead
//! ([`run`]), and the compiled-in paths (`CARGO_MANIFEST_DIR`, `CARGO_BIN_EXE_redco`) are
//! made to resolve by linking the build's root to the working tree when it is not there.

use crate::args::Args;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The environment variable naming the bundle's directory on the GPU machine.
pub const BUNDLE_ENV: &str = "REDCO_GPU_BUNDLE";

/// The bundle directory when running from one.
pub fn dir() -> Option<PathBuf> {
    std::env::var_os(BUNDLE_ENV).filter(|v| !v.is_empty()).map(PathBuf::from)
}

/// The cargo invocations that build what the checks run; every one with the same
/// features for `redco`, so one `redco` binary serves both backends.
const BUILDS: [&[&str]; 5] = [
    &["build", "--release", "-p", "redco", "-p", "xtask", "--features", "redco/cuda,redco/tpu,xtask/cuda,xtask/tpu"],
    &["build", "--release", "-p", "redco-cuda", "--examples"],
    &["test", "--release", "--no-run", "-p", "redco-cuda", "--lib", "--tests"],
    &["test", "--release", "--no-run", "-p", "redco-tpu", "--tests"],
    &["test", "--release", "--no-run", "-p", "redco", "--features", "cuda,tpu", "--test", "cli"],
];

/// The bundle's name for an artifact: `redco`, `xtask`, `example-<crate>-<name>` or
/// `test-<crate>-<target>` (`lib` for a library's unit tests).
fn bundle_name(package: &str, kind: &str, target: &str) -> String {
    match kind {
        "bin" => target.to_string(),
        "example" => format!("example-{package}-{target}"),
        _ => format!("test-{package}-{}", if kind == "lib" { "lib" } else { target }),
    }
}

/// Builds the programs and copies them into the bundle.
pub fn pack(argv: &[String]) -> Result<(), String> {
    let args = Args::parse(argv, &[])?;
    args.only(&["out"])?;
    let out = PathBuf::from(args.get("out").unwrap_or("target/gpu-bundle"));
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let mut copied = Vec::new();
    for build in BUILDS {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        eprintln!("xtask: cargo {}", build.join(" "));
        let mut child = Command::new(cargo)
            .args(build)
            .arg("--message-format=json")
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot run cargo: {e}"))?;
        let stdout = child.stdout.take().ok_or("no stdout from cargo")?;
        for line in BufReader::new(stdout).lines() {
            let line = line.map_err(|e| format!("reading cargo's output: {e}"))?;
            let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
            let Some(exe) = v["executable"].as_str() else { continue };
            let package = v["package_id"].as_str().unwrap_or_default();
            // `path+file:///work/main/redco-cuda#0.1.0` or `registry...#name@version`
            let package = package.rsplit('/').next().unwrap_or_default().split('#').next().unwrap_or_default();
            let kind = v["target"]["kind"][0].as_str().unwrap_or_default();
            let target = v["target"]["name"].as_str().unwrap_or_default();
            let name = bundle_name(package, kind, target);
            let to = out.join(&name);
            std::fs::copy(exe, &to).map_err(|e| format!("copying {exe}: {e}"))?;
            let _ = Command::new("strip").arg(&to).status();
            copied.push(name);
        }
        if !child.wait().map_err(|e| format!("waiting for cargo: {e}"))?.success() {
            return Err(format!("cargo {} failed", build.join(" ")));
        }
    }
    let root = std::env::current_dir().map_err(|e| e.to_string())?;
    std::fs::write(out.join("ROOT"), root.to_string_lossy().as_bytes()).map_err(|e| e.to_string())?;
    copied.sort();
    copied.dedup();
    println!("bundle {} ({} programs): {}", out.display(), copied.len(), copied.join(" "));
    println!(
        "on the GPU machine, in the working tree's root: {BUNDLE_ENV}={0} {0}/xtask gpu-check cuda (or pjrt)",
        out.display()
    );
    Ok(())
}

/// Makes the paths compiled into the bundled programs resolve here: the build's root (a link
/// to the working directory when it is absent) and `target/release/redco` in it.
fn prepare(dir: &Path) -> Result<(), String> {
    let root = std::fs::read_to_string(dir.join("ROOT")).map_err(|e| format!("{}/ROOT: {e}", dir.display()))?;
    let root = PathBuf::from(root.trim());
    let cwd = std::env::current_dir().map_err(|e| e.to_string())?;
    if !root.exists() {
        if let Some(parent) = root.parent() {
            std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
        }
        std::os::unix::fs::symlink(&cwd, &root).map_err(|e| format!("linking {}: {e}", root.display()))?;
    }
    let release = root.join("target").join("release");
    let redco = release.join("redco");
    if !redco.exists() {
        std::fs::create_dir_all(&release).map_err(|e| format!("{}: {e}", release.display()))?;
        let bundled = std::fs::canonicalize(dir.join("redco")).map_err(|e| format!("the bundled redco: {e}"))?;
        std::os::unix::fs::symlink(bundled, &redco).map_err(|e| format!("linking {}: {e}", redco.display()))?;
    }
    Ok(())
}

/// Runs, from the bundle in `dir`, what `cargo args` would: `build` does nothing (the bundle
/// is built), `run -p redco|xtask` and `run --example` run that program with the arguments
/// after `--`, `test -p CRATE --test T.. [--lib]` runs each test program with them. Returns
/// the success and stdout, as [`crate::gpu_check::cargo`] does.
pub fn run(dir: &Path, args: &[&str], envs: &[(&str, &str)], echo: bool) -> Result<(bool, String), String> {
    prepare(dir)?;
    let (head, tail) = match args.iter().position(|a| *a == "--") {
        Some(i) => (&args[..i], &args[i + 1..]),
        None => (args, &[][..]),
    };
    let value = |flag: &str| -> Vec<&str> { head.windows(2).filter(|w| w[0] == flag).map(|w| w[1]).collect() };
    let package = value("-p").first().copied().unwrap_or_default().to_string();
    let programs: Vec<String> = match head.first().copied() {
        Some("build") => return Ok((true, String::new())),
        Some("run") => match value("--example").first() {
            Some(e) => vec![format!("example-{package}-{e}")],
            None => vec![package.clone()],
        },
        Some("test") => {
            let mut p: Vec<String> = value("--test").iter().map(|t| format!("test-{package}-{t}")).collect();
            if head.contains(&"--lib") {
                p.push(format!("test-{package}-lib"));
            }
            p
        }
        _ => return Err(format!("the bundle cannot run `cargo {}`", args.join(" "))),
    };
    let (mut ok, mut out) = (true, String::new());
    for program in programs {
        let exe = dir.join(&program);
        if !exe.is_file() {
            return Err(format!("{} is not in the bundle (for `cargo {}`)", exe.display(), args.join(" ")));
        }
        eprintln!("xtask: {} {}", exe.display(), tail.join(" "));
        let mut c = Command::new(&exe);
        c.args(tail).envs(envs.iter().copied());
        let (success, text) = crate::gpu_check::piped(c, &program, echo)?;
        ok &= success;
        out.push_str(&text);
    }
    Ok((ok, out))
}
