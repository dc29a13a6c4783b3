//! `cargo xtask test`: everything CI checks, in order, stopping at the first failure.

use crate::args::Args;
use std::process::Command;

fn cargo(args: &[&str]) -> Result<(), String> {
    cargo_env(args, &[])
}

fn cargo_env(args: &[&str], env: &[(&str, &str)]) -> Result<(), String> {
    eprintln!("xtask: cargo {}", args.join(" "));
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args(args)
        .envs(env.iter().copied())
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("`cargo {}` failed ({status})", args.join(" ")))
    }
}

fn has_nextest() -> bool {
    Command::new("cargo").args(["nextest", "--version"]).output().map(|o| o.status.success()).unwrap_or(false)
}

/// Optional backends compiled into the checks and tests: the facade's `wgpu` feature (its
/// CLI tests run on lavapipe in CI; redco-wgpu itself is always built, by redco-tests) and
/// xtask's (the wgpu rows of `bench llm`).
const FEATURES: &str = "redco/wgpu,xtask/wgpu";

/// Runs fmt, clippy, the API docs with warnings as errors (broken links), the tests
/// (nextest when installed) and the doc tests.
pub fn run(argv: &[String]) -> Result<(), String> {
    let args = Args::parse(argv, &["no-lint"])?;
    args.only(&["no-lint"])?;
    if !args.has("no-lint") {
        cargo(&["fmt", "--all", "--check"])?;
        cargo(&["clippy", "--workspace", "--all-targets", "--features", FEATURES, "--", "-D", "warnings"])?;
        cargo_env(&["doc", "--workspace", "--no-deps", "--features", FEATURES], &[("RUSTDOCFLAGS", "-D warnings")])?;
    }
    if has_nextest() {
        cargo(&["nextest", "run", "--workspace", "--features", FEATURES, "--no-fail-fast"])?;
    } else {
        cargo(&["test", "--workspace", "--features", FEATURES, "--no-fail-fast"])?;
    }
    cargo(&["test", "--workspace", "--doc"])?;
    eprintln!("xtask: all checks passed");
    Ok(())
}
