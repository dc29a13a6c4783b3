//! `--backend pjrt` in the CLI (with the `tpu` feature), on the plugin of
//! `REDCO_PJRT_PLUGIN` (`cargo xtask test` fetches XLA's CPU plugin): `eval-dump` matches
//! the transformers fixtures of LLaMA, GPT-J, OPT and T5 at meshes 1x1, 1x2 and 2x2 (as
//! many devices of one client), `generate` gives the CPU backend's text, `info` lists the
//! devices, `train` runs at 1x2, and a missing plugin is a clear error.
#![cfg(feature = "tpu")]

use crate::common::losses;
use std::process::Command;

/// Exit code, stdout and stderr of `redco args`.
fn redco(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_redco")).args(args).output().expect("run redco");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

/// The plugin under test; these tests fail (never pass) without one.
fn plugin() -> String {
    std::env::var("REDCO_PJRT_PLUGIN")
        .ok()
        .filter(|p| std::path::Path::new(p).is_file())
        .expect("REDCO_PJRT_PLUGIN must name a PJRT plugin (cargo xtask test fetches the XLA CPU plugin)")
}

/// The meshes of the eval-dump tests: `REDCO_PJRT_MESHES` (comma-separated; `cargo xtask
/// gpu-check pjrt` sets 1x1 on a one-GPU machine), else 1x1, 1x2 and 2x2 (four devices
/// of the CPU plugin).
fn meshes() -> Vec<String> {
    let v = std::env::var("REDCO_PJRT_MESHES").unwrap_or_else(|_| "1x1,1x2,2x2".into());
    v.split(',').map(|m| m.trim().to_string()).filter(|m| !m.is_empty()).collect()
}

fn eval_dump_matches(name: &str) {
    plugin();
    for mesh in meshes() {
        let mesh = mesh.as_str();
        let out =
            std::env::temp_dir().join(format!("redco-eval-dump-pjrt-{name}-{mesh}-{}.safetensors", std::process::id()));
        let args = crate::common::eval_dump_args(name, &out, &["--backend", "pjrt", "--mesh", mesh]);
        let (code, _, err) = redco(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(code, 0, "{name} at {mesh}: {err}");
        crate::common::compare_dump(name, &out);
        let _ = std::fs::remove_file(&out);
    }
}

#[test]
fn eval_dump_llama_on_pjrt_matches_transformers() {
    eval_dump_matches("llama-tiny");
}

#[test]
fn eval_dump_gptj_on_pjrt_matches_transformers() {
    eval_dump_matches("gptj-tiny");
}

#[test]
fn eval_dump_opt_on_pjrt_matches_transformers() {
    eval_dump_matches("opt-tiny");
}

#[test]
fn eval_dump_t5_on_pjrt_matches_transformers() {
    eval_dump_matches("t5-tiny");
}

#[test]
fn generate_on_pjrt_gives_the_cpu_text_and_info_lists_devices() {
    plugin();
    let f = crate::common::fixture_named("llama-tiny");
    let gen = |backend: &str| {
        let args = ["generate", "--model", f.to_str().unwrap(), "--prompt", "hello world", "--max-new-tokens", "5"];
        let (code, out, err) = redco(&[&args[..], &["--backend", backend]].concat());
        assert_eq!(code, 0, "{backend}: {err}");
        out
    };
    let cpu = gen("cpu");
    assert!(cpu.starts_with("hello"), "{cpu}");
    assert_eq!(gen("pjrt"), cpu);
    let (code, out, err) = redco(&["info"]);
    assert_eq!(code, 0, "{err}");
    // the platform the plugin names (cpu in CI, cuda or tpu on a lent machine)
    assert!(out.contains("pjrt device 0:") && out.contains(", platform "), "{out}");
}

#[test]
fn a_missing_plugin_is_a_clear_error() {
    let f = crate::common::fixture_named("llama-tiny");
    let args = ["generate", "--model", f.to_str().unwrap(), "--prompt", "hi", "--backend", "pjrt"];
    let (code, _, err) = redco(&[&args[..], &["--pjrt-plugin", "/nonexistent/libtpu.so"]].concat());
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("cannot open the PJRT plugin /nonexistent/libtpu.so"), "{err}");
}

#[test]
fn train_on_pjrt_at_1x2_compiled_matches_the_cpu_losses() {
    plugin();
    let dir = |b: &str| {
        let d = std::env::temp_dir().join(format!("redco-cli-train-pjrt-{b}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    };
    let train = |backend: &str, w: &std::path::Path| {
        let args = [
            "train",
            "--preset",
            "llama-tiny",
            "--mesh",
            "1x2",
            "--batch-size",
            "8",
            "--seq-len",
            "16",
            "--lr",
            "1e-2",
            "--sample-tokens",
            "4",
            "--threads",
            "2",
            "--steps",
            "4",
            "--backend",
            backend,
            "--workdir",
            w.to_str().unwrap(),
        ];
        let (code, out, err) = redco(&args);
        assert_eq!(code, 0, "{backend}: {out}\n{err}");
        out
    };
    let (p, c) = (dir("pjrt"), dir("cpu"));
    let out = train("pjrt", &p);
    assert!(p.join("model.safetensors").exists() && out.contains("sample:"), "{out}");
    assert!(out.contains("the training step is compiled into one program"), "{out}");
    train("cpu", &c);
    let (lp, lc) = (losses(&p), losses(&c));
    assert_eq!(lp.len(), 4);
    for (a, b) in lp.iter().zip(&lc) {
        assert!((a - b).abs() <= 1e-4 * b.abs(), "pjrt {lp:?} cpu {lc:?}");
    }
    let _ = (std::fs::remove_dir_all(&p), std::fs::remove_dir_all(&c));
}
