//! `redco eval-dump` against the transformers reference of the committed LLaMA fixture, split
//! over a 1x2 mesh, and its one-line errors.

use redco_models::hf::safetensors::read_all;
use std::path::PathBuf;
use std::process::Command;

fn fixture() -> PathBuf {
    fixture_named("llama-tiny")
}

fn fixture_named(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures").join(name)
}

fn redco(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_redco")).args(args).output().expect("run redco");
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stderr).into())
}

fn rel_l2(a: &[f64], b: &[f64]) -> f64 {
    let num: f64 = a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum();
    let den: f64 = b.iter().map(|y| y * y).sum();
    (num / den.max(1e-300)).sqrt()
}

#[test]
fn eval_dump_at_1x2_matches_transformers() {
    for name in ["llama-tiny", "gptj-tiny", "opt-tiny", "opt-350m-shape", "t5-tiny", "t5-v1_1-tiny"] {
        dump_and_compare(name);
    }
}

fn dump_and_compare(name: &str) {
    let out = std::env::temp_dir().join(format!("redco-eval-dump-{name}-{}.safetensors", std::process::id()));
    let (f, o) = (fixture_named(name), out.to_str().unwrap().to_string());
    let inputs = f.join("inputs.safetensors");
    let (code, err) = redco(&[
        "eval-dump",
        "--model",
        f.to_str().unwrap(),
        "--inputs",
        inputs.to_str().unwrap(),
        "--out",
        &o,
        "--mesh",
        "1x2",
    ]);
    assert_eq!(code, 0, "{name}: {err}");
    let got = read_all(&out).unwrap();
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
