//! The MAML example (`examples/maml.rs`) learns to adapt: after a short meta-training, one
//! inner step on a held-out task's 10 support points more than halves its query error and
//! beats a model pretrained on all tasks and fine-tuned the same way; with the tasks split
//! over dp = 2 the numbers are those of one rank.

use std::path::PathBuf;
use std::process::Command;

/// The example's binary, built by `cargo test` beside the test binaries.
fn example() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target directory");
    dir.join("examples").join(if cfg!(windows) { "maml.exe" } else { "maml" })
}

/// The table rows (`MAML ...` and `pretrained ...`) of one run: before, 1 step, 10 steps.
fn run(mesh: &str) -> (Vec<String>, [f64; 3], [f64; 3]) {
    let out = Command::new(example()).args([mesh, "1500"]).output().expect("the maml example runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    let row = |prefix: &str| -> [f64; 3] {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("  {prefix}")))
            .unwrap_or_else(|| panic!("no {prefix} row:\n{text}"));
        let v: Vec<f64> = line.split_whitespace().rev().take(3).filter_map(|x| x.parse().ok()).collect();
        [v[2], v[1], v[0]]
    };
    let lines =
        text.lines().filter(|l| !l.starts_with("step ") && !l.starts_with("MAML (")).map(String::from).collect();
    (lines, row("MAML ("), row("pretrained"))
}

#[test]
fn maml_adapts_in_one_step_and_dp2_matches_one_rank() {
    if !example().exists() {
        // `cargo test` builds the examples; a run of this test alone does not
        let release = example().components().any(|c| c.as_os_str() == "release");
        let mut args = vec!["build", "-q", "-p", "redco", "--example", "maml"];
        if release {
            args.push("--release");
        }
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        assert!(Command::new(cargo).args(&args).status().is_ok_and(|s| s.success()), "building the maml example");
    }
    let (one, maml, joint) = run("1x1");
    assert!(maml[1] < 0.5 * maml[0], "one inner step: {maml:?}");
    assert!(maml[1] < joint[1] && maml[2] < joint[2], "MAML {maml:?} against pretrained {joint:?}");
    let (two, _, _) = run("2x1");
    assert_eq!(one, two, "dp = 2 against one rank");
}
