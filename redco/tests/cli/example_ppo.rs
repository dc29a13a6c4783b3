//! The PPO example (`examples/ppo.rs`) solves CartPole-v1: for 3 seeds the mean return of
//! 100 evaluation episodes (actions sampled from the policy) reaches 475 within 60,000
//! environment steps, and a seed run twice gives the same run.

use std::path::PathBuf;
use std::process::Command;

/// The environment steps each seed may take.
const BUDGET: &str = "60000";

/// The example's binary, built by `cargo test` beside the test binaries.
fn example() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target directory");
    dir.join("examples").join(if cfg!(windows) { "ppo.exe" } else { "ppo" })
}

/// The example's standard output for one seed (it fails when the budget ends unsolved).
fn run(seed: u64) -> String {
    let out = Command::new(example()).args([&seed.to_string(), BUDGET]).output().expect("the ppo example runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "seed {seed}:\n{text}\n{}", String::from_utf8_lossy(&out.stderr));
    text
}

/// The environment steps the run needed (its `result ppo N` line).
fn steps(text: &str) -> u64 {
    let line = text.lines().find(|l| l.starts_with("result ppo ")).unwrap_or_else(|| panic!("no result line:\n{text}"));
    line["result ppo ".len()..].trim().parse().unwrap_or_else(|_| panic!("not a step count: {line}"))
}

#[test]
fn ppo_solves_cartpole_for_three_seeds_and_is_reproducible() {
    if !example().exists() {
        // `cargo test` builds the examples; a run of this test alone does not
        let release = example().components().any(|c| c.as_os_str() == "release");
        let mut args = vec!["build", "-q", "-p", "redco", "--example", "ppo"];
        if release {
            args.push("--release");
        }
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        assert!(Command::new(cargo).args(&args).status().is_ok_and(|s| s.success()), "building the ppo example");
    }
    let runs: Vec<String> = (0..3).map(run).collect();
    for (seed, text) in runs.iter().enumerate() {
        let n = steps(text);
        assert!(n <= BUDGET.parse().expect("budget"), "seed {seed} took {n} steps");
        eprintln!("seed {seed}: solved after {n} environment steps");
    }
    assert_eq!(run(0), runs[0], "seed 0 run twice");
}
