//! Helpers the CLI tests share: the committed fixtures and the check of an `eval-dump`
//! output against transformers' reference.

#![allow(dead_code)]

use redco_models::hf::safetensors::read_all;
use std::path::{Path, PathBuf};

/// Runs the `redco` binary: exit code (-1 if killed), stdout, stderr. GGUF files are read
/// into a cache under the build's temporary directory ([`cache_home`]), not the user's.
pub fn redco(args: &[&str]) -> (i32, String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_redco"))
        .args(args)
        .env("XDG_CACHE_HOME", cache_home())
        .output()
        .expect("run redco");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

/// The `XDG_CACHE_HOME` of the tests' runs: one directory under the build's own temporary
/// directory, shared by the tests (a GGUF file read once is read from there after).
pub fn cache_home() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("redco-cli-cache")
}

/// An empty scratch directory path for test file `file`'s case `name` (removed if it
/// exists; not created).
pub fn scratch_dir(file: &str, name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("redco-cli-{file}-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// A path as `&str` (test paths are UTF-8).
pub fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A committed transformers fixture directory.
pub fn fixture_named(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name)
}

/// The arguments of `redco eval-dump` on fixture `name`, writing `out`, then `extra`.
pub fn eval_dump_args(name: &str, out: &Path, extra: &[&str]) -> Vec<String> {
    let f = fixture_named(name);
    let mut v: Vec<String> = vec![
        "eval-dump".into(),
        "--model".into(),
        f.to_string_lossy().into(),
        "--inputs".into(),
        f.join("inputs.safetensors").to_string_lossy().into(),
        "--out".into(),
        out.to_string_lossy().into(),
    ];
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

fn rel_l2(a: &[f64], b: &[f64]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    (num / den.max(1e-300)).sqrt()
}

/// Checks `out` (written by `redco eval-dump` on fixture `name`) against transformers'
/// reference: the same tensors, token ids identical, logits and loss to 1e-4 and every
/// gradient to 1e-3 relative L2.
pub fn compare_dump(name: &str, out: &Path) {
    let f = fixture_named(name);
    let inputs = f.join("inputs.safetensors");
    let got = read_all(out).unwrap();
    let want = read_all(&f.join("reference.safetensors")).unwrap();
    let mut keys: Vec<_> = got.keys().collect();
    keys.sort();
    let mut want_keys: Vec<_> = want.keys().collect();
    want_keys.sort();
    assert_eq!(keys, want_keys, "{name}: the same tensors as transformers' dump");
    assert_eq!(got["generated_ids"], want["generated_ids"], "{name}");
    let mask = read_all(&inputs).unwrap()["attention_mask"].data.to_f64_vec();
    for (k, w) in &want {
        assert_eq!(got[k].shape, w.shape, "{name}: {k}");
        let (mut g, mut w) = (got[k].data.to_f64_vec(), w.data.to_f64_vec());
        if k.ends_with("_ids") {
            assert_eq!(g, w, "{name}: {k}");
            continue;
        }
        if k == "logits" && name == "llama-tiny" {
            // padded positions attend to nothing: compare the real ones
            let v = want[k].shape.dims()[2];
            let keep = |x: Vec<f64>| -> Vec<f64> {
                x.chunks(v).zip(&mask).filter(|(_, m)| **m != 0.0).flat_map(|(c, _)| c.to_vec()).collect()
            };
            (g, w) = (keep(g), keep(w));
        }
        let tol = if k.starts_with("grad.") { 1e-3 } else { 1e-4 };
        let norm = w.iter().map(|x| x * x).sum::<f64>().sqrt();
        // a gradient that is zero in exact arithmetic (a key bias) compares absolutely
        let e =
            if norm < 1e-5 { g.iter().zip(&w).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max) } else { rel_l2(&g, &w) };
        assert!(e <= tol, "{name}: {k}: error {e}");
    }
}

/// The per-step losses of a run's `metrics.jsonl` (none while the file does not exist yet).
pub fn losses(workdir: &Path) -> Vec<f64> {
    std::fs::read_to_string(workdir.join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()?["loss"].as_f64())
        .collect()
}
