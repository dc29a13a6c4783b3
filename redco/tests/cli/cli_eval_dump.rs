//! `redco eval-dump` against the transformers reference of the committed LLaMA fixture, split
//! over a 1x2 mesh, and its one-line errors.

use crate::common::{compare_dump, eval_dump_args, fixture_named};
use std::path::PathBuf;
use std::process::Command;

fn fixture() -> PathBuf {
    fixture_named("llama-tiny")
}

fn redco(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_redco")).args(args).output().expect("run redco");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into())
}

#[test]
fn eval_dump_at_1x2_matches_transformers() {
    for name in ["llama-tiny", "gptj-tiny", "opt-tiny", "opt-350m-shape", "t5-tiny", "t5-v1_1-tiny"] {
        dump_and_compare(name);
    }
}

fn dump_and_compare(name: &str) {
    let out = std::env::temp_dir().join(format!("redco-eval-dump-{name}-{}.safetensors", std::process::id()));
    let args = eval_dump_args(name, &out, &["--mesh", "1x2"]);
    let (code, err) = redco(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(code, 0, "{name}: {err}");
    compare_dump(name, &out);
}

#[test]
fn eval_dump_errors_are_one_line() {
    let f = fixture();
    let inputs = f.join("inputs.safetensors");
    let (code, err) =
        redco(&["eval-dump", "--model", "/nonexistent/model", "--inputs", inputs.to_str().unwrap(), "--out", "/tmp/x"]);
    assert_eq!(code, 2);
    assert!(
        err.starts_with("redco: error:") && err.contains("/nonexistent/model") && err.lines().count() == 1,
        "{err}"
    );
    // an inputs file without input_ids (the checkpoint itself)
    let weights = f.join("model.safetensors");
    let (code, err) =
        redco(&["eval-dump", "--model", f.to_str().unwrap(), "--inputs", weights.to_str().unwrap(), "--out", "/tmp/x"]);
    assert_eq!(code, 2);
    assert!(err.contains("has no `input_ids`") && err.lines().count() == 1, "{err}");
}
