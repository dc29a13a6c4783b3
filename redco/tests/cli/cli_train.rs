//! `redco train`, `generate` and `convert` as a user runs them: a short tensor-parallel run
//! whose outputs exist and whose loss falls, a model that generates and converts both ways,
//! and one-line errors with exit code 2 for bad input.

use crate::common::{losses, redco, s};
use std::path::PathBuf;

fn tmp(name: &str) -> PathBuf {
    crate::common::scratch_dir("train", name)
}

#[test]
fn a_short_tensor_parallel_run_writes_everything_and_its_model_generates_and_converts() {
    let w = tmp("run");
    let (code, out, err) = redco(&[
        "train",
        "--preset",
        "llama-tiny",
        "--mesh",
        "1x2",
        "--steps",
        "40",
        "--batch-size",
        "8",
        "--seq-len",
        "16",
        "--checkpoint-every",
        "20",
        "--lr",
        "1e-2",
        "--workdir",
        s(&w),
        "--threads",
        "2",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    for f in ["metrics.jsonl", "loss.png", "model.safetensors", "config.json", "tokenizer.json"] {
        assert!(w.join(f).exists(), "{f} missing:\n{out}");
    }
    assert!(w.join("checkpoints/step-00000040/manifest.json").exists());
    // the CLI's observers and log: TensorBoard scalars, the loss plot (a PNG), redco.log
    let png = std::fs::read(w.join("loss.png")).unwrap();
    assert_eq!(&png[1..4], b"PNG", "the loss plot is a PNG");
    let events: Vec<_> = std::fs::read_dir(w.join("tensorboard")).unwrap().flatten().collect();
    assert_eq!(events.len(), 1, "one event file");
    assert!(events[0].file_name().to_string_lossy().starts_with("events.out.tfevents."));
    assert!(events[0].metadata().unwrap().len() > 40 * 50, "40 steps of scalars");
    let log = std::fs::read_to_string(w.join("redco.log")).unwrap();
    assert!(log.contains("redco started") && log.contains("checkpoint saved"), "{log}");
    assert!(err.contains("step 40/40"), "plain progress lines when stderr is not a terminal:\n{err}");
    assert!(out.contains("sample:") && out.contains("wrote:"), "{out}");
    // the loss falls: the mean of the last 10 logged losses is well below the first
    let losses: Vec<f64> = std::fs::read_to_string(w.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()?["loss"].as_f64())
        .collect();
    assert_eq!(losses.len(), 40);
    let tail: f64 = losses[30..].iter().sum::<f64>() / 10.0;
    assert!(tail < 0.7 * losses[0], "loss {} -> {tail}", losses[0]);
    // resuming past the end is a no-op that still succeeds
    let (code, _, err) = redco(&[
        "train",
        "--preset",
        "llama-tiny",
        "--mesh",
        "1x2",
        "--steps",
        "40",
        "--batch-size",
        "8",
        "--seq-len",
        "16",
        "--workdir",
        s(&w),
        "--resume",
        "--threads",
        "2",
    ]);
    assert_eq!(code, 0, "{err}");

    // generation: greedy is the same on one device and split in two
    let gen = |mesh: &str| {
        let (code, out, err) =
            redco(&["generate", "--model", s(&w), "--prompt", "ba be", "--max-new-tokens", "6", "--mesh", mesh]);
        assert_eq!(code, 0, "{err}");
        out
    };
    let one = gen("1x1");
    assert!(one.starts_with("ba be") && one.split_whitespace().count() == 8, "{one}");
    assert_eq!(gen("1x2"), one);

    // convert: the newest checkpoint to Hugging Face equals the exported model
    let hf = tmp("hf");
    let (code, _, err) = redco(&["convert", "--to", "hf", "--input", s(&w), "--out", s(&hf)]);
    assert_eq!(code, 0, "{err}");
    let a = redco_models::hf::safetensors::read_all(&hf).unwrap();
    let b = redco_models::hf::safetensors::read_all(&w).unwrap();
    assert_eq!(a, b);
}

/// A backend that is not compiled into this build of redco, if there is one.
const MISSING_BACKEND: Option<&str> = if !cfg!(feature = "wgpu") {
    Some("wgpu")
} else if !cfg!(feature = "cuda") {
    Some("cuda")
} else if !cfg!(feature = "tpu") {
    Some("pjrt")
} else {
    None
};

#[test]
fn bad_input_gets_a_one_line_error_and_exit_code_2() {
    let w = tmp("bad");
    let mut cases: Vec<(&[&str], &str)> = vec![
        (&["train", "--model", "/nonexistent/model-dir", "--workdir"], "/nonexistent/model-dir"),
        (&["train", "--preset", "llama-huge", "--workdir"], "unknown preset `llama-huge`"),
        (&["train", "--preset", "llama-tiny", "--mesh", "8x8", "--workdir"], "needs 64 devices"),
        (
            &["train", "--preset", "llama-tiny", "--data", "/nonexistent/data.jsonl", "--workdir"],
            "/nonexistent/data.jsonl",
        ),
        (&["train", "--preset", "llama-tiny", "--backend", "npu", "--workdir"], "unknown backend `npu`"),
        (
            &["train", "--preset", "llama-tiny", "--offload", "--workdir"],
            "--offload moves the optimizer to host memory",
        ),
        (
            &["generate", "--model", "/nonexistent/model-dir", "--prompt", "x", "--mesh", "1x1", "--dtype"],
            "does not exist",
        ),
    ];
    // a backend this build lacks (wgpu trains when the feature is on: cli_wgpu.rs)
    let missing: [&str; 6] =
        ["train", "--preset", "llama-tiny", "--backend", MISSING_BACKEND.unwrap_or("-"), "--workdir"];
    if MISSING_BACKEND.is_some() {
        cases.push((&missing, "not compiled"));
    }
    for (args, want) in cases {
        let mut args = args.to_vec();
        args.push(if args[0] == "generate" { "f32" } else { s(&w) });
        let (code, out, err) = redco(&args);
        assert_eq!(code, 2, "{args:?}: {out} {err}");
        assert!(err.starts_with("redco: error: ") && err.trim_end().lines().count() == 1, "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
    // a usage mistake is clap's error, also non-zero
    let (code, _, _) = redco(&["train", "--steps", "x"]);
    assert_ne!(code, 0);
}

/// `--backend cuda` on a machine without an NVIDIA driver: one clear line and exit code 2,
/// never a panic (cudarc panics on a CUDA call without the driver library).
#[cfg(feature = "cuda")]
#[test]
fn cuda_without_a_driver_is_a_one_line_error() {
    if std::path::Path::new("/dev/nvidiactl").exists() {
        eprintln!("an NVIDIA driver is present: `gpu-check cuda` covers training on it");
        return;
    }
    let w = tmp("cuda-none");
    let (code, out, err) =
        redco(&["train", "--preset", "llama-tiny", "--backend", "cuda", "--steps", "2", "--workdir", s(&w)]);
    assert_eq!(code, 2, "{out} {err}");
    assert!(err.starts_with("redco: error: ") && err.trim_end().lines().count() == 1, "{err}");
    assert!(err.contains("no CUDA driver") && err.contains("libcuda"), "{err}");
    let (code, out, _) = redco(&["info"]);
    assert_eq!(code, 0);
    assert!(
        out.contains("backends: cpu (embedded)") && out.contains("cuda") && out.contains("no CUDA driver"),
        "{out}"
    );
}

#[test]
fn a_hugging_face_model_without_data_trains_on_the_corpus_through_its_own_tokenizer() {
    let model = crate::common::fixture_named("llama-tiny");
    // the command a new user typed (LoRA, --seq-len 16), then the same without --lora-rank
    // and without --seq-len (the model's context of 64 less one)
    for (name, extra) in [("lora", &["--lora-rank", "4", "--seq-len", "16"][..]), ("full", &[][..])] {
        let w = tmp(&format!("hf-corpus-{name}"));
        let mut args = vec!["train", "--model", s(&model), "--steps", "20", "--batch-size", "4", "--threads", "2"];
        args.extend(["--workdir", s(&w)]);
        args.extend(extra);
        let (code, out, err) = redco(&args);
        assert_eq!(code, 0, "{out}\n{err}");
        assert!(out.contains("the bundled corpus, encoded by") && out.contains("tokenizer.json"), "{out}");
        if extra.is_empty() {
            assert!(out.contains("4 x 63 tokens") && out.contains("the model's context of 64 less one"), "{out}");
        }
        let losses = losses(&w);
        assert_eq!(losses.len(), 20, "{out}");
        assert!(losses.iter().all(|l| l.is_finite()) && losses[19] < losses[0], "{losses:?}");
        let _ = std::fs::remove_dir_all(&w);
    }
}

/// The two mixtures of experts train from their Hugging Face directories (the loss with the
/// router's load-balancing term), and the workdir they leave is a model directory under the
/// checkpoint's own names (one tensor per expert) that `generate` runs.
#[test]
fn mixtures_of_experts_train_and_leave_a_model_directory_with_one_tensor_per_expert() {
    for (arch, expert) in [
        ("mixtral-tiny", "model.layers.0.block_sparse_moe.experts.3.w2.weight"),
        ("qwen3-moe-tiny", "model.layers.2.mlp.experts.3.down_proj.weight"),
    ] {
        let model = crate::common::fixture_named(arch);
        let w = tmp(&format!("moe-{arch}"));
        let args = ["train", "--model", s(&model), "--steps", "6", "--batch-size", "2", "--seq-len", "16"];
        let (code, out, err) = redco(&[&args[..], &["--threads", "2", "--workdir", s(&w)]].concat());
        assert_eq!(code, 0, "{arch}: {out}\n{err}");
        let losses = losses(&w);
        assert!(
            losses.len() == 6 && losses.iter().all(|l| l.is_finite()) && losses[5] < losses[0],
            "{arch}: {losses:?}"
        );
        let names = redco_models::hf::safetensors::read_all(&w.join("model.safetensors")).unwrap();
        assert!(names.contains_key(expert) && !names.keys().any(|k| k.contains('*')), "{arch}: {:?}", names.keys());
        let (code, out, err) = redco(&["generate", "--model", s(&w), "--prompt", "the", "--max-new-tokens", "4"]);
        assert_eq!(code, 0, "{arch}: {out}\n{err}");
        let _ = std::fs::remove_dir_all(&w);
    }
}

/// Expert parallelism from the CLI on thread ranks: the Qwen3-MoE preset (experts drawn
/// from the seed, each rank drawing only its own) at 2x1 with `--ep 2` trains as with every
/// expert on every rank, with ZeRO-2 too, and each run's checkpoint converts to the model
/// it exported; what it cannot split is refused before anything runs.
#[test]
fn ep_splits_the_experts_and_trains_as_ep1_and_refuses_what_it_cannot_split() {
    use redco_models::hf::safetensors::read_all;
    let run = |flags: &[&str]| {
        let w = tmp(&format!("ep-{}", flags.join("")));
        let args = ["train", "--preset", "qwen3-moe-tiny", "--mesh", "2x1", "--steps", "4"];
        let (code, out, err) = redco(&[&args[..], flags, &["--threads", "2", "--workdir", s(&w)]].concat());
        assert_eq!(code, 0, "{flags:?}: {out}\n{err}");
        let l = losses(&w);
        // the checkpoint (each rank's experts in its own file, ZeRO's slices) converts to
        // the Hugging Face model the run exported
        let hf = tmp(&format!("ep-hf-{}", flags.join("")));
        let (code, _, err) = redco(&["convert", "--to", "hf", "--input", s(&w), "--out", s(&hf)]);
        assert_eq!(code, 0, "{flags:?}: convert: {err}");
        let (a, b) = (read_all(&hf).unwrap(), read_all(&w).unwrap());
        assert!(a == b && !a.is_empty(), "{flags:?}: the converted checkpoint differs from the export");
        let _ = (std::fs::remove_dir_all(&w), std::fs::remove_dir_all(&hf));
        (l, out)
    };
    let ((one, _), (two, out), (two_z2, _)) =
        (run(&["--ep", "1"]), run(&["--ep", "2"]), run(&["--ep", "2", "--zero", "2"]));
    assert_eq!(one.len(), 4);
    for (a, b) in one.iter().zip(&two) {
        assert!((a - b).abs() <= 1e-5 * a.abs(), "ep 1 {one:?}, ep 2 {two:?}");
    }
    for (a, b) in one.iter().zip(&two_z2) {
        assert!((a - b).abs() <= 1e-5 * a.abs(), "ep 1 {one:?}, ep 2 with ZeRO-2 {two_z2:?}");
    }
    assert!(out.contains("expert parallelism:") && out.contains("all-to-alls over dp"), "{out}");
    let w = tmp("ep-bad");
    let args = ["train", "--preset", "qwen3-moe-tiny", "--mesh", "2x1", "--steps", "1", "--workdir", s(&w)];
    let (code, out, err) = redco(&[&args[..], &["--ep", "3"]].concat());
    assert_ne!(code, 0, "--ep 3: {out}");
    assert!(err.contains("part of dp"), "--ep 3: {err}");
    let _ = std::fs::remove_dir_all(&w);
}

/// `--capacity-factor` on the Qwen3-MoE preset: each expert takes at most its capacity of
/// a rank's token slots, the share dropped is logged every step (between 0 and 1, and
/// the same whether the experts are split over dp or not: each rank drops among its own
/// tokens), the losses equal at ep 1 and 2 and differ from the dropless run's; a factor
/// that is not positive, or one for a dense model, is refused.
#[test]
fn capacity_factor_drops_slots_and_logs_the_share() {
    let run = |flags: &[&str]| {
        let w = tmp(&format!("cap-{}", flags.join("")));
        let args = ["train", "--preset", "qwen3-moe-tiny", "--mesh", "2x1", "--steps", "3", "--no-save"];
        let (code, out, err) = redco(&[&args[..], flags, &["--threads", "2", "--workdir", s(&w)]].concat());
        assert_eq!(code, 0, "{flags:?}: {out}\n{err}");
        let text = std::fs::read_to_string(w.join("metrics.jsonl")).unwrap();
        let rows: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        let _ = std::fs::remove_dir_all(&w);
        let loss: Vec<f64> = rows.iter().map(|r| r["loss"].as_f64().unwrap()).collect();
        let dropped: Vec<Option<f64>> = rows.iter().map(|r| r["moe_dropped"].as_f64()).collect();
        (loss, dropped)
    };
    let (free, none) = run(&[]);
    assert!(none.iter().all(Option::is_none), "dropless runs log no drops: {none:?}");
    let (one, d1) = run(&["--capacity-factor", "1.0", "--ep", "1"]);
    let (two, d2) = run(&["--capacity-factor", "1.0", "--ep", "2"]);
    assert_eq!(d1.len(), 3);
    for (a, b) in d1.iter().zip(&d2) {
        let (a, b) = (a.expect("a share every step"), b.expect("a share every step"));
        assert!(a > 0.0 && a < 1.0, "dropped share {a}");
        assert!((a - b).abs() < 1e-12, "ep 1 drops {a}, ep 2 {b}");
    }
    for (a, b) in one.iter().zip(&two) {
        assert!((a - b).abs() <= 1e-5 * a.abs(), "ep 1 {one:?}, ep 2 {two:?}");
    }
    assert!((one[0] - free[0]).abs() > 1e-6, "dropping changes the loss: {one:?} {free:?}");
    let w = tmp("cap-bad");
    for (flags, want) in [
        (&["--preset", "qwen3-moe-tiny", "--capacity-factor", "0"][..], "positive"),
        (&["--preset", "llama-tiny", "--capacity-factor", "1.25"][..], "dense"),
    ] {
        let (code, out, err) = redco(&[&["train", "--steps", "1", "--workdir", s(&w)][..], flags].concat());
        assert_ne!(code, 0, "{flags:?}: {out}");
        assert!(err.contains(want), "{flags:?}: {err}");
    }
    let _ = std::fs::remove_dir_all(&w);
}

/// Each step's loss of a run, from its metrics.

#[test]
fn recompute_block_and_selective_train_as_keeping_activations_does_on_every_decoder() {
    // the same run with and without each layer recomputed (whole or selectively), at 1x1
    // and tensor-parallel 1x2: every step's loss equal
    for mesh in ["1x1", "1x2"] {
        let runs: Vec<Vec<f64>> = ["none", "block", "selective"]
            .iter()
            .map(|r| {
                let w = tmp(&format!("recompute-{mesh}-{r}"));
                let (code, out, err) = redco(&[
                    "train",
                    "--preset",
                    "llama-tiny",
                    "--steps",
                    "8",
                    "--batch-size",
                    "4",
                    "--seq-len",
                    "32",
                    "--mesh",
                    mesh,
                    "--threads",
                    "2",
                    "--recompute",
                    r,
                    "--workdir",
                    s(&w),
                ]);
                assert_eq!(code, 0, "{out}\n{err}");
                let l = losses(&w);
                let _ = std::fs::remove_dir_all(&w);
                l
            })
            .collect();
        assert_eq!(runs[0].len(), 8);
        for run in &runs[1..] {
            assert_eq!(run.len(), 8);
            for (i, (a, b)) in runs[0].iter().zip(run).enumerate() {
                assert!((a - b).abs() <= 1e-5 * a.abs(), "step {} at {mesh}: {a} kept, {b} recomputed", i + 1);
            }
        }
    }
    // without the flag the planner chooses, and the run says what and why
    let w = tmp("recompute-auto");
    let args = ["train", "--preset", "llama-tiny", "--steps", "1", "--batch-size", "2", "--seq-len", "16"];
    let (code, out, err) = redco(&[&args[..], &["--threads", "2", "--workdir", s(&w)]].concat());
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("memory: activations kept (auto: about"), "{out}");
    let _ = std::fs::remove_dir_all(&w);
    // GPT-J and OPT too: at 2x1 with ZeRO-3 and block recompute, and at 1x2 with selective
    // recompute, the losses of the run keeping every activation whole on each rank
    for arch in ["gptj-tiny", "opt-tiny"] {
        let model = crate::common::fixture_named(arch);
        let run = |mesh: &str, flags: &[&str]| {
            let w = tmp(&format!("recompute-{arch}-{mesh}-{}", flags.join("")));
            let args = ["train", "--model", s(&model), "--steps", "6", "--batch-size", "4", "--seq-len", "16"];
            let more = ["--mesh", mesh, "--threads", "2", "--strategy", "none", "--workdir", s(&w)];
            let (code, out, err) = redco(&[&args[..], &more, flags].concat());
            assert_eq!(code, 0, "{arch} {mesh} {flags:?}: {out}\n{err}");
            let l = losses(&w);
            let _ = std::fs::remove_dir_all(&w);
            l
        };
        let kept = run("2x1", &[]);
        assert_eq!(kept.len(), 6);
        for (mesh, flags) in
            [("2x1", &["--zero", "3", "--recompute", "block"][..]), ("1x2", &["--recompute", "selective"])]
        {
            let other = run(mesh, flags);
            assert_eq!(other.len(), 6);
            for (i, (a, b)) in kept.iter().zip(&other).enumerate() {
                assert!((a - b).abs() <= 1e-5 * a.abs(), "{arch} step {}: {a} kept, {b} at {mesh} {flags:?}", i + 1);
            }
        }
    }
    // T5 recomputes its blocks (`cli_datasets.rs`) but has no ZeRO-3: refused, naming both
    let model = crate::common::fixture_named("t5-tiny");
    let w = tmp("zero3-t5");
    let (code, _, err) =
        redco(&["train", "--model", s(&model), "--steps", "2", "--zero", "3", "--mesh", "2x1", "--workdir", s(&w)]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--zero 3") && err.contains("t5"), "{err}");
    let _ = std::fs::remove_dir_all(&w);
}

#[test]
fn zero_stages_1_to_3_train_as_replicated_adamw_does_and_resume_at_another_mesh_and_stage() {
    // the same run at 2x1 with the training state whole on each rank and sharded over dp
    let run_with = |zero: &str, w: &std::path::Path, extra: &[&str]| {
        let mut args = vec!["train", "--preset", "llama-tiny", "--steps", "6", "--batch-size", "4", "--seq-len", "16"];
        args.extend(["--mesh", "2x1", "--threads", "2", "--zero", zero, "--checkpoint-every", "3"]);
        args.extend_from_slice(extra);
        args.extend(["--workdir", s(w)]);
        redco(&args)
    };
    let run = |zero: &str, w: &std::path::Path| run_with(zero, w, &[]);
    let (w0, w1, w2, w3) = (tmp("zero-0"), tmp("zero-1"), tmp("zero-2"), tmp("zero-3"));
    let (code, out, err) = run("0", &w0);
    assert_eq!(code, 0, "{out}\n{err}");
    let (code, out, err) = run("1", &w1);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("AdamW state sharded over dp (ZeRO-1)"), "{out}");
    let (code, out, err) = run("2", &w2);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("gradients sharded over dp (ZeRO-2)"), "{out}");
    let (code, out, err) = run("3", &w3);
    assert_eq!(code, 0, "{out}\n{err}");
    // llama-tiny's layers are small: the planner gathers all four as one unit
    assert!(out.contains("4 layers at a time gathered where they run (ZeRO-3)"), "{out}");
    let w3one = tmp("zero-3-one");
    let (code, out, err) = run_with("3", &w3one, &["--unit-layers", "1"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("each layer gathered where it runs (ZeRO-3)"), "{out}");
    let a = losses(&w0);
    assert_eq!(a.len(), 6);
    let stages = [("ZeRO-1", losses(&w1)), ("ZeRO-2", losses(&w2)), ("ZeRO-3", losses(&w3))];
    for (stage, b) in stages.into_iter().chain([("ZeRO-3, one layer a unit", losses(&w3one))]) {
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            assert!((x - y).abs() <= 1e-5 * x.abs(), "step {}: {x} replicated, {y} {stage}", i + 1);
        }
    }
    assert_eq!(
        std::fs::read(w0.join("model.safetensors")).unwrap().len(),
        std::fs::read(w2.join("model.safetensors")).unwrap().len(),
        "ZeRO-2 exports the whole model"
    );
    assert_eq!(
        std::fs::read(w0.join("model.safetensors")).unwrap().len(),
        std::fs::read(w3.join("model.safetensors")).unwrap().len(),
        "ZeRO-3 exports the whole model"
    );
    // a run resumes at another mesh and stage (its checkpoint resharded): ZeRO-0 at 2x1 and
    // the ZeRO-3 run at 1x1 without ZeRO continue alike
    let resume = |w: &std::path::Path, mesh: &str, zero: &str| {
        redco(&[
            "train",
            "--preset",
            "llama-tiny",
            "--steps",
            "8",
            "--batch-size",
            "4",
            "--seq-len",
            "16",
            "--mesh",
            mesh,
            "--threads",
            "2",
            "--zero",
            zero,
            "--resume",
            "--workdir",
            s(w),
        ])
    };
    let (code, out, err) = resume(&w0, "2x1", "0");
    assert_eq!(code, 0, "{out}\n{err}");
    let (code, out, err) = resume(&w3, "1x1", "0");
    assert_eq!(code, 0, "{out}\n{err}");
    let (a, b) = (losses(&w0), losses(&w3));
    assert_eq!((a.len(), b.len()), (8, 8));
    for (i, (x, y)) in a.iter().zip(&b).enumerate().skip(6) {
        assert!((x - y).abs() <= 1e-5 * x.abs(), "step {}: {x} at 2x1, {y} resumed at 1x1 from ZeRO-3 at 2x1", i + 1);
    }
    for w in [w0, w1, w2, w3] {
        let _ = std::fs::remove_dir_all(&w);
    }
}

#[test]
fn strategy_auto_takes_the_planners_pick_for_the_memory_per_rank_and_refuses_what_fits_nothing() {
    let model = format!("{}/../tests/fixtures/llama-tiny", env!("CARGO_MANIFEST_DIR"));
    let shape = ["--mesh", "2x1", "--batch-size", "4", "--seq-len", "16", "--dtype", "f32"];
    // the planner's table for this run: the strategy that needs the least memory per rank
    let (code, out, err) = redco(&[&["plan", "--model", &model, "--json"][..], &shape[..]].concat());
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let rows = v["strategies"]["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 12, "ZeRO 0-3, each with recompute none, selective and block, at dp=2");
    let least = rows.iter().min_by_key(|r| r["peak_bytes_per_rank"].as_u64().unwrap()).unwrap();
    let budget = least["peak_bytes_per_rank"].as_u64().unwrap();
    let (zero, recompute) = (least["zero"].as_u64().unwrap(), least["recompute"].as_str().unwrap());
    // only that one fits a budget of its peak: `redco plan` marks it, and `train` runs it
    let budget_s = budget.to_string();
    let (code, out, err) =
        redco(&[&["plan", "--model", &model, "--json", "--device-memory", &budget_s][..], &shape[..]].concat());
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let pick = v["strategies"]["pick"].as_u64().expect("a pick") as usize;
    assert_eq!(&v["strategies"]["rows"][pick], least, "the plan's pick at its own peak");
    let run = |w: &std::path::Path, extra: &[&str]| {
        let base = ["train", "--model", &model, "--steps", "4", "--threads", "2", "--workdir", s(w)];
        redco(&[&base[..], &shape[..], extra].concat())
    };
    let (plain, auto) = (tmp("strategy-none"), tmp("strategy-auto"));
    let (code, out, err) = run(&plain, &["--strategy", "none"]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("memory: activations kept (as given;"), "{out}");
    let (code, out, err) = run(&auto, &["--device-memory", &budget_s]);
    assert_eq!(code, 0, "{out}\n{err}");
    let memory = out.lines().find(|l| l.starts_with("memory: ")).unwrap_or_default();
    assert!(memory.contains("auto: about") && memory.contains("the cheapest of 1 that fit, of 12"), "{memory}");
    assert_eq!(memory.contains(&format!("(ZeRO-{zero})")), zero > 0, "{memory}");
    assert_eq!(memory.contains("each layer recomputed"), recompute == "block", "{memory}");
    for (i, (x, y)) in losses(&plain).iter().zip(losses(&auto)).enumerate() {
        assert!((x - y).abs() <= 1e-5 * x.abs(), "step {}: {x} plain, {y} with ZeRO-{zero} {recompute}", i + 1);
    }
    // a byte less fits nothing: refused before anything is written, with the numbers
    let tight = tmp("strategy-tight");
    let (code, out, err) = run(&tight, &["--device-memory", &(budget - 1).to_string()]);
    assert_eq!(code, 2, "{out}\n{err}");
    assert!(err.contains("needs about") && err.contains("(--device-memory)"), "{err}");
    assert!(!tight.join("checkpoints").exists() && !tight.join("metrics.jsonl").exists());
    // a stage given pins it: ZeRO-0 does not fit that budget, and the error says what would
    let (code, _, err) = run(&tight, &["--device-memory", &budget_s, "--zero", "0"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("a higher --zero, or --strategy auto"), "{err}");
    for w in [plain, auto, tight] {
        let _ = std::fs::remove_dir_all(w);
    }
}

#[test]
fn profile_times_the_steps_after_the_first() {
    let w = tmp("profile");
    let args = ["train", "--preset", "llama-tiny", "--steps", "4", "--batch-size", "4", "--seq-len", "16"];
    let (code, out, err) = redco(&[&args[..], &["--profile", "--workdir", s(&w), "--threads", "2"]].concat());
    assert_eq!(code, 0, "{out}\n{err}");
    // 3 steps of 4 x 16 tokens after the first; the cpu backend has no device timers
    let line = out.lines().find(|l| l.starts_with("profile over 3 steps after the first")).expect(&out);
    let rate: f64 = line.split(", ").nth(1).and_then(|r| r.split(' ').next()).and_then(|r| r.parse().ok()).expect(line);
    assert!(rate > 0.0, "{line}");
    assert!(out.contains("no device timers"), "{out}");
    assert!(!out.contains("MFU"), "no peak on the cpu backend:\n{out}");
    // without the flag, no profile
    let w2 = tmp("no-profile");
    let (code, out, err) = redco(&[&args[..], &["--workdir", s(&w2), "--threads", "2"]].concat());
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(!out.contains("profile over"), "{out}");
}

#[test]
fn no_save_trains_and_writes_no_checkpoint_and_no_model() {
    let w = tmp("no-save");
    let args = ["train", "--preset", "llama-tiny", "--steps", "3", "--batch-size", "4", "--seq-len", "16"];
    let (code, out, err) =
        redco(&[&args[..], &["--no-save", "--checkpoint-every", "1", "--workdir", s(&w), "--threads", "2"]].concat());
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains("loss ") && out.contains("nothing saved (--no-save)"), "{out}");
    assert!(!out.contains("sample:"), "no model to sample from:\n{out}");
    assert!(w.join("metrics.jsonl").exists(), "the run's record is still kept");
    assert!(!w.join("checkpoints").exists() || std::fs::read_dir(w.join("checkpoints")).unwrap().next().is_none());
    assert!(!w.join("model.safetensors").exists());
    // and it cannot be asked to resume
    let (code, _, err) = redco(&[&args[..], &["--no-save", "--resume", "--workdir", s(&w)]].concat());
    assert_eq!(code, 2, "{err}");
}
