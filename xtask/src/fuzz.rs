//! `cargo xtask fuzz [--cases N] [--only NAME]`: the hostile-input properties
//! (`tests/tests/hostile`: config.json fields and texts, safetensors files and sharded
//! indexes, tokenizer files, checkpoint manifests, JSONL files) with `N` generated inputs
//! per target (default 100,000; CI runs 256 through `cargo xtask test`), in the test
//! profile (optimised, with overflow checks: a release build would let an overflowing
//! size wrap silently), one target after another, then a table of inputs, time and result
//! per target.

use crate::args::Args;
use std::process::Command;
use std::time::Instant;

/// The properties of `tests/tests/hostile`, one per reader.
const TARGETS: &[&str] = &[
    "config_json_never_panics",
    "config_text_never_panics",
    "safetensors_files_never_panic",
    "sharded_indexes_never_panic",
    "tokenizer_files_never_panic",
    "manifests_never_panic",
    "jsonl_never_panics",
];

/// Runs the task.
pub fn run(argv: &[String]) -> Result<(), String> {
    let args = Args::parse(argv, &[])?;
    args.only(&["cases", "only"])?;
    let cases = args.num("cases", 100_000)?.max(1);
    let targets: Vec<&str> = match args.get("only") {
        Some(o) => {
            let t: Vec<&str> = TARGETS.iter().copied().filter(|t| t.contains(o)).collect();
            if t.is_empty() {
                return Err(format!("--only {o}: no target matches (targets: {})", TARGETS.join(", ")));
            }
            t
        }
        None => TARGETS.to_vec(),
    };
    let build = Command::new("cargo")
        .args(["test", "-p", "redco-tests", "--test", "hostile", "--no-run"])
        .status()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if !build.success() {
        return Err("building the hostile-input tests failed".into());
    }
    let mut rows = Vec::new();
    let mut failed = Vec::new();
    for t in &targets {
        eprintln!("fuzz: {t}, {cases} inputs");
        let start = Instant::now();
        let out = Command::new("cargo")
            .args(["test", "-q", "-p", "redco-tests", "--test", "hostile", "--", "--exact", t])
            .env("PROPTEST_CASES", cases.to_string())
            .output()
            .map_err(|e| format!("cannot run cargo: {e}"))?;
        let secs = start.elapsed().as_secs_f64();
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        // `--exact` matches the whole test path; a name that ran nothing is a failure too
        let ran = text.contains("1 passed") || text.contains("1 failed");
        // a panic caught inside a reader (turned into an error) counts as a failure too
        let ok = out.status.success() && text.contains("1 passed") && !text.contains("panicked at");
        if !ok {
            failed.push(format!("{t}:\n{}", text.trim()));
        }
        rows.push((
            t,
            secs,
            if !ran {
                "did not run"
            } else if ok {
                "ok: 0 panics"
            } else {
                "FAILED"
            },
        ));
    }
    println!();
    println!("hostile-input fuzzing, {cases} generated inputs per target");
    println!("{:<32} {:>10} {:>9}  result", "target", "inputs", "seconds");
    for (t, secs, result) in &rows {
        println!("{t:<32} {cases:>10} {secs:>9.1}  {result}");
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("{} target(s) failed:\n{}", failed.len(), failed.join("\n\n")))
    }
}
