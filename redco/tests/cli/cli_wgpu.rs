//! `--backend wgpu` in the CLI (with the `wgpu` feature): `eval-dump` on the committed LLaMA
//! fixture matches transformers, `generate` gives the CPU backend's text, `serve` gives
//! `generate`'s, `info` lists the adapters. Skipped without a wgpu adapter unless `REDCO_REQUIRE_WGPU=1`.
#![cfg(feature = "wgpu")]

use crate::common::losses;
use std::path::PathBuf;
use std::process::Command;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/llama-tiny")
}

/// Exit code, stdout and stderr of `redco args`.
fn redco(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_redco")).args(args).output().expect("run redco");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

/// Whether a wgpu adapter is there (a missing one fails with `REDCO_REQUIRE_WGPU=1`).
fn have_wgpu() -> bool {
    match redco::wgpu::Wgpu::new() {
        Ok(_) => true,
        Err(e) if std::env::var("REDCO_REQUIRE_WGPU").is_ok_and(|v| v == "1") => {
            panic!("REDCO_REQUIRE_WGPU=1 but no wgpu adapter: {e}")
        }
        Err(e) => {
            eprintln!("skipped: no wgpu adapter: {e}");
            false
        }
    }
}

#[test]
fn eval_dump_on_wgpu_matches_transformers() {
    if !have_wgpu() {
        return;
    }
    let out = std::env::temp_dir().join(format!("redco-eval-dump-wgpu-{}.safetensors", std::process::id()));
    let args = crate::common::eval_dump_args("llama-tiny", &out, &["--backend", "wgpu"]);
    let (code, _, err) = redco(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(code, 0, "{err}");
    crate::common::compare_dump("llama-tiny", &out);
    let _ = std::fs::remove_file(&out);
}

#[test]
fn generate_on_wgpu_gives_the_cpu_text_and_info_lists_adapters() {
    if !have_wgpu() {
        return;
    }
    let f = fixture();
    let gen = |backend: &str| {
        let args = ["generate", "--model", f.to_str().unwrap(), "--prompt", "hello world", "--max-new-tokens", "5"];
        let (code, out, err) = redco(&[&args[..], &["--backend", backend]].concat());
        assert_eq!(code, 0, "{backend}: {err}");
        out
    };
    let cpu = gen("cpu");
    assert!(cpu.starts_with("hello"), "{cpu}");
    assert_eq!(gen("wgpu"), cpu);
    let (code, out, err) = redco(&["info"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("wgpu adapter 0:") && out.contains("<- used"), "{out}");
}

#[test]
fn train_on_wgpu_at_1x2_writes_everything_its_loss_falls_from_the_cpu_first_loss_and_it_resumes() {
    if !have_wgpu() {
        return;
    }
    let started = std::time::Instant::now();
    let dir = |b: &str| {
        let d = std::env::temp_dir().join(format!("redco-cli-train-{b}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    };
    let train = |backend: &str, w: &std::path::Path, steps: &str, extra: &[&str]| {
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
            "--checkpoint-every",
            "4",
            "--sample-tokens",
            "4",
            "--threads",
            "2",
            "--steps",
            steps,
            "--backend",
            backend,
            "--workdir",
            w.to_str().unwrap(),
        ];
        let (code, out, err) = redco(&[&args[..], extra].concat());
        assert_eq!(code, 0, "{backend}: {out}\n{err}");
        out
    };
    // the "peak device memory" line's figure, in bytes
    let peak = |out: &str| -> f64 {
        let line = out.lines().find_map(|l| l.strip_prefix("peak device memory: ")).expect("a device peak line");
        let mut w = line.split_whitespace();
        let x: f64 = w.next().and_then(|x| x.parse().ok()).expect("a number");
        x * match w.next() {
            Some("GB") => 1e9,
            Some("MB") => 1e6,
            Some("kB") => 1e3,
            _ => 1.0,
        }
    };
    let (gpu, cpu) = (dir("wgpu"), dir("cpu"));
    let out = train("wgpu", &gpu, "8", &[]);
    let device_peak = peak(&out);
    for f in ["metrics.jsonl", "loss.png", "model.safetensors", "config.json", "tokenizer.json"] {
        assert!(gpu.join(f).exists(), "{f} missing:\n{out}");
    }
    assert!(gpu.join("checkpoints/step-00000008/manifest.json").exists(), "{out}");
    assert!(out.contains("of wgpu ranks") && out.contains("sample:") && out.contains("wrote:"), "{out}");
    let l = losses(&gpu);
    assert_eq!(l.len(), 8);
    assert!(l[7] < l[0], "the loss does not fall: {l:?}");
    // the optimizer offloaded to host memory: the same run (AdamW on the CPU cores)
    let off = dir("wgpu-offload");
    let out = train("wgpu", &off, "8", &["--offload"]);
    assert!(out.contains("AdamW state and f32 masters offloaded to host memory"), "{out}");
    // the moments (8 bytes a parameter) never on the device: its peak is lower
    assert!(peak(&out) < device_peak, "peak device memory {} offloaded, {device_peak} not", peak(&out));
    for (i, (x, y)) in l.iter().zip(losses(&off)).enumerate() {
        assert!((x - y).abs() <= 1e-4 * x.abs(), "step {}: {x} on the device, {y} offloaded", i + 1);
    }
    let _ = std::fs::remove_dir_all(&off);
    // offload with ZeRO-1 (its moments sharded by collectives on the device) is refused
    let w = dir("wgpu-offload-zero1");
    let (code, _, err) = redco(&[
        "train",
        "--preset",
        "llama-tiny",
        "--backend",
        "wgpu",
        "--mesh",
        "2x1",
        "--zero",
        "1",
        "--offload",
        "--workdir",
        w.to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--offload with --zero 1 is not supported") && err.contains("--zero 2 or 3"), "{err}");
    // the same seed on the cpu backend: the same first loss (the same weights and batch)
    train("cpu", &cpu, "1", &[]);
    let c = losses(&cpu);
    assert!((l[0] - c[0]).abs() <= 1e-4 * c[0].abs(), "first loss: wgpu {} cpu {}", l[0], c[0]);
    // resuming from the step-8 checkpoint (uploaded back to the devices) runs steps 9..10
    let out = train("wgpu", &gpu, "10", &["--resume"]);
    assert!(out.contains("over steps 9..10"), "{out}");
    let l = losses(&gpu);
    assert_eq!(l.len(), 10, "{l:?}");
    assert!(l[8..].iter().all(|x| x.is_finite() && *x < l[0]), "{l:?}");
    println!("wgpu train test: {:.1} s", started.elapsed().as_secs_f64());
    let _ = (std::fs::remove_dir_all(&gpu), std::fs::remove_dir_all(&cpu));
}

/// `redco serve --backend wgpu`: the paged cache in wgpu buffers (written through the
/// composite `write_rows`, read by the composite paged attention), and the greedy text of
/// `redco generate --backend wgpu` for requests batched together.
#[test]
fn serve_on_wgpu_gives_generate_s_text() {
    if !have_wgpu() {
        return;
    }
    use crate::cli_serve::{post, start};
    let prompts = ["Hello world", "the cat sat"];
    let want: Vec<String> = prompts
        .iter()
        .map(|p| {
            let m = fixture();
            let (code, out, err) = redco(&[
                "generate",
                "--backend",
                "wgpu",
                "--model",
                m.to_str().unwrap(),
                "--prompt",
                p,
                "--max-new-tokens",
                "8",
            ]);
            assert_eq!(code, 0, "{err}");
            out.trim_end_matches('\n').to_string()
        })
        .collect();
    let srv = start(&fixture(), &["--backend", "wgpu"]);
    let clients: Vec<_> = prompts
        .iter()
        .map(|p| {
            let (a, p) = (srv.addr.clone(), p.to_string());
            std::thread::spawn(move || {
                post(&a, "/v1/completions", &serde_json::json!({"prompt": p, "max_tokens": 8, "temperature": 0}))
            })
        })
        .collect();
    for (c, want) in clients.into_iter().zip(&want) {
        let (st, r) = c.join().unwrap();
        assert_eq!(st, 200, "{r}");
        let text = r["choices"][0]["text"].as_str().unwrap();
        assert!(!text.is_empty() && want.ends_with(text), "served on wgpu {text:?}, generate printed {want:?}");
    }
}
