//! The three-function pipeline: learning, accumulation, kill-and-resume, bad input.

use redco_core::optim::{AdamWConfig, Decay, Schedule};
use redco_core::runtime::Mesh;
use redco_core::{Backend, DType, Result, Tensor};
use redco_cpu::Cpu;
use redco_pipeline::data::{Dataset, JsonlDataset};
use redco_pipeline::metrics::read_metrics;
use redco_pipeline::synthetic::MarkovCorpus;
use redco_pipeline::{Batch, Deployer, NanPolicy, OptimizerConfig, Predictor, StepCtx, TrainConfig, Trainer};
use redco_tests::models::{Config, Lm};
use std::path::{Path, PathBuf};

mod decoders;
mod experts;
mod lora;
mod observe;
mod offload;
mod seq2seq;
mod wgpu;
mod zero;
mod zero_units;

const CFG: Config = Config { vocab: 16, hidden: 32, layers: 1, heads: 4, kv_heads: 4, inter: 64, llama: true };

fn corpus() -> MarkovCorpus {
    MarkovCorpus::new(16, 12, 7)
}

fn collate<B: Backend>(b: &B, ex: &[Vec<i64>]) -> Result<Batch<B>> {
    let t = ex[0].len();
    let ids: Vec<i64> = ex.iter().flatten().copied().collect();
    let labels: Vec<i64> = ex.iter().flat_map(|s| s[1..].iter().copied().chain([-100])).collect();
    Ok(Batch::from([
        ("input_ids".to_string(), Tensor::from_vec(b, ids, [ex.len(), t])?),
        ("labels".to_string(), Tensor::from_vec(b, labels, [ex.len(), t])?),
    ]))
}

fn loss<B: Backend>(_: &StepCtx<B>, m: &Lm<B>, b: &Batch<B>) -> Result<Tensor<B>> {
    m.loss(&b["input_ids"], None, &b["labels"])
}

fn config(steps: u64, bs: usize, k: usize) -> TrainConfig {
    TrainConfig {
        batch_size: bs,
        accumulate: k,
        steps,
        schedule: Schedule { peak: 3e-3, warmup: 10.min(steps / 2), total: steps, decay: Decay::Cosine },
        optimizer: OptimizerConfig::AdamW(AdamWConfig { weight_decay: 0.0, ..Default::default() }),
        clip_norm: Some(1.0),
        log_every: 50,
        ..Default::default()
    }
}

fn trainer(cfg: TrainConfig) -> Trainer<Lm<Cpu>, Vec<i64>> {
    Trainer::new(|b| Lm::new(b, CFG, DType::F32, 1), collate, loss, cfg)
}

fn workdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("redco-pipe-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn read_model(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut v: Vec<(String, Vec<u8>)> = st.tensors().into_iter().map(|(n, t)| (n, t.data().to_vec())).collect();
    v.sort();
    v
}

/// Mean held-out loss through the Predictor (per-example losses, in order).
fn eval_loss(dep: &Deployer, report: &redco_pipeline::FitReport, data: &Vec<Vec<i64>>) -> f64 {
    let wd = dep.workdir.clone();
    let pred = Predictor::new(
        move |b: &Cpu| {
            let mut m = Lm::new(b, CFG, DType::F32, 1)?;
            let bytes = std::fs::read(wd.join("model.safetensors"))
                .map_err(|e| redco_core::Error::invalid("eval", e.to_string()))?;
            let st = safetensors::SafeTensors::deserialize(&bytes)
                .map_err(|e| redco_core::Error::invalid("eval", e.to_string()))?;
            let mut map = std::collections::BTreeMap::new();
            for (n, t) in st.tensors() {
                let v: Vec<f32> = t.data().chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
                map.insert(n, Tensor::from_vec(b, v, t.shape().to_vec())?);
            }
            redco_core::nn::ModuleExt::load_state_dict(&mut m, &map, true)?;
            Ok(m)
        },
        collate,
        |_: &StepCtx<Cpu>, m: &Lm<Cpu>, b: &Batch<Cpu>| {
            let per = m.forward(&b["input_ids"], None)?.cross_entropy_per_token(&b["labels"], -100)?;
            let rows = per.replicate()?.to_vec_f64()?;
            let t = b["input_ids"].dims()[1];
            Ok(rows.chunks(t).map(|r| r.iter().sum::<f64>() / (t - 1) as f64).collect())
        },
        8,
    );
    let out = pred.predict(dep, data, &report.plan).unwrap();
    assert_eq!(out.len(), data.len());
    out.iter().sum::<f64>() / out.len() as f64
}

#[test]
fn the_language_model_learns_the_corpus_at_1x1_and_2x2() {
    let c = corpus();
    let train = c.sequences(0, 4096);
    let held = c.sequences(1 << 20, 62); // not a multiple of the batch: padded last batch
    let mut curves = Vec::new();
    for mesh in ["1x1", "2x2"] {
        let dep = Deployer::new(mesh.parse().unwrap(), 3, &workdir(&format!("learn-{mesh}"))).unwrap();
        let r = trainer(config(160, 16, 1)).fit(&dep, &train, false).unwrap();
        let ev = eval_loss(&dep, &r, &held);
        eprintln!(
            "mesh {mesh}: first loss {:.3}, last {:.3}, eval {ev:.4}, entropy {:.4}",
            r.losses[0],
            r.losses.last().unwrap(),
            c.entropy()
        );
        assert!(ev <= 1.10 * c.entropy(), "eval loss {ev} is not within 10% of the entropy {} at {mesh}", c.entropy());
        curves.push(r.losses);
    }
    for (i, (a, b)) in curves[0].iter().zip(&curves[1]).enumerate() {
        assert!((a - b).abs() <= 2e-3 * (1.0 + a.abs()), "step {i}: 1x1 loss {a}, 2x2 loss {b}");
    }
}

#[test]
fn four_micro_batches_equal_one_batch_of_four_times_the_size() {
    let data = corpus().sequences(0, 256);
    let run = |bs, k, name: &str| {
        let dep = Deployer::new(Mesh::single(), 5, &workdir(name)).unwrap();
        trainer(config(6, bs, k)).fit(&dep, &data, false).unwrap();
        dep.workdir
    };
    let (a, b) = (run(4, 4, "acc4"), run(16, 1, "acc1"));
    for ((na, va), (_, vb)) in read_model(&a).iter().zip(read_model(&b)) {
        let fa: Vec<f64> = va.chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64).collect();
        let fb: Vec<f64> = vb.chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64).collect();
        redco_tests::check::assert_close(&fa, &fb, 1e-5, &format!("{na} after 6 steps"));
    }
    let sched = config(6, 4, 4).schedule;
    let logged = read_metrics(&a).unwrap();
    assert_eq!(logged.len(), 6, "one line per optimizer step, not per micro-batch");
    for m in logged {
        assert_eq!(m.lr, sched.lr(m.step - 1), "logged lr at step {}", m.step);
    }
}

const CHILD: &str = "REDCO_PIPELINE_CHILD_WORKDIR";

fn child_config() -> TrainConfig {
    TrainConfig { checkpoint_every: Some(4), keep_last: 0, ..config(12, 8, 1) }
}

/// The training process of the kill test (run by re-executing this test binary).
#[test]
fn kill_child_process() {
    let Ok(dir) = std::env::var(CHILD) else { return };
    let slow = std::env::var("REDCO_PIPELINE_CHILD_SLOW").is_ok();
    let data = corpus().sequences(0, 512);
    let dep = Deployer::new("1x2".parse().unwrap(), 9, Path::new(&dir)).unwrap();
    let t = Trainer::new(
        |b| Lm::new(b, CFG, DType::F32, 1),
        move |b: &Cpu, ex: &[Vec<i64>]| {
            if slow {
                std::thread::sleep(std::time::Duration::from_millis(150));
            }
            collate(b, ex)
        },
        loss,
        child_config(),
    );
    t.fit(&dep, &data, true).unwrap();
}

fn spawn_child(dir: &Path, slow: bool) -> std::process::Child {
    let mut c = std::process::Command::new(std::env::current_exe().unwrap());
    c.args(["--exact", "kill_child_process", "--nocapture", "--test-threads", "1"]).env(CHILD, dir);
    if slow {
        c.env("REDCO_PIPELINE_CHILD_SLOW", "1");
    }
    c.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null()).spawn().unwrap()
}

#[cfg(unix)]
#[test]
fn sigkill_between_checkpoints_then_resume_equals_an_uninterrupted_run() {
    let whole = workdir("whole");
    assert!(spawn_child(&whole, false).wait().unwrap().success());
    let killed = workdir("killed");
    let mut child = spawn_child(&killed, true);
    let first = killed.join("checkpoints/step-00000004/manifest.json");
    let start = std::time::Instant::now();
    while !first.exists() {
        assert!(start.elapsed().as_secs() < 120, "no checkpoint appeared");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::thread::sleep(std::time::Duration::from_millis(300)); // mid-way to the next one
    let pid = child.id().to_string();
    assert!(std::process::Command::new("kill").args(["-9", &pid]).status().unwrap().success());
    let _ = child.wait();
    assert!(!killed.join("model.safetensors").exists(), "the run was killed before the end");
    assert!(!killed.join("checkpoints/step-00000012").exists());
    assert!(spawn_child(&killed, false).wait().unwrap().success(), "the resumed run finishes");
    assert_eq!(read_model(&killed), read_model(&whole), "final parameters identical");
    // the loss curve: the last entry logged for each step equals the uninterrupted run's
    let mut by_step = std::collections::BTreeMap::new();
    for m in read_metrics(&killed).unwrap() {
        by_step.insert(m.step, m.loss);
    }
    let want: Vec<(u64, f64)> = read_metrics(&whole).unwrap().into_iter().map(|m| (m.step, m.loss)).collect();
    assert_eq!(by_step.into_iter().collect::<Vec<_>>(), want);
}

#[test]
fn a_nan_loss_stops_with_its_step_and_keeps_the_last_checkpoint() {
    let data = corpus().sequences(0, 128);
    let dep = Deployer::new(Mesh::single(), 1, &workdir("nan")).unwrap();
    let cfg = TrainConfig { checkpoint_every: Some(2), ..config(8, 4, 1) };
    let t = Trainer::new(
        |b| Lm::new(b, CFG, DType::F32, 1),
        collate,
        |ctx: &StepCtx<Cpu>, m: &Lm<Cpu>, b: &Batch<Cpu>| {
            let l = m.loss(&b["input_ids"], None, &b["labels"])?;
            if ctx.step == 5 {
                l.scale(f64::NAN)
            } else {
                Ok(l)
            }
        },
        cfg.clone(),
    );
    let err = t.fit(&dep, &data, false).unwrap_err().to_string();
    assert!(err.contains("loss is NaN at step 5") && err.contains("last checkpoint is intact"), "{err}");
    let ck = redco_pipeline::checkpoint::Checkpointer::new(&dep.workdir, 0);
    assert_eq!(ck.latest().unwrap().unwrap().0, 4);
    // skipping instead of stopping
    let skip = Trainer::new(
        |b| Lm::new(b, CFG, DType::F32, 1),
        collate,
        |ctx: &StepCtx<Cpu>, m: &Lm<Cpu>, b: &Batch<Cpu>| {
            let l = m.loss(&b["input_ids"], None, &b["labels"])?;
            if ctx.step == 5 {
                l.scale(f64::NAN)
            } else {
                Ok(l)
            }
        },
        TrainConfig { nan: NanPolicy::Skip, ..cfg },
    );
    let r = skip.fit(&Deployer::new(Mesh::single(), 1, &workdir("nan-skip")).unwrap(), &data, false).unwrap();
    assert_eq!(r.losses.len(), 7);
}

#[test]
fn a_malformed_jsonl_line_is_reported_with_its_line_number() {
    let d = workdir("jsonl");
    std::fs::create_dir_all(&d).unwrap();
    let p = d.join("data.jsonl");
    std::fs::write(&p, "{\"text\": \"a\"}\n\n{\"text\": oops}\n{\"text\": \"c\"}\n").unwrap();
    let ds = JsonlDataset::open(&p).unwrap();
    assert_eq!(ds.len(), 3);
    assert_eq!(ds.get(0).unwrap()["text"], "a");
    let err = ds.validate().unwrap_err().to_string();
    assert!(err.contains("line 3") && err.contains("malformed"), "{err}");
    assert!(JsonlDataset::open(&d.join("missing.jsonl")).is_err());
}

#[test]
fn a_collate_error_names_the_step_and_examples() {
    let data = corpus().sequences(0, 64);
    let dep = Deployer::new(Mesh::single(), 1, &workdir("collate")).unwrap();
    let t = Trainer::new(
        |b| Lm::new(b, CFG, DType::F32, 1),
        |b: &Cpu, ex: &[Vec<i64>]| {
            if ex.iter().any(|s| s[0] == 15) {
                Err(redco_core::Error::invalid("my collate", "token 15 first"))
            } else {
                collate(b, ex)
            }
        },
        loss,
        config(20, 4, 1),
    );
    let err = t.fit(&dep, &data, false).unwrap_err().to_string();
    assert!(err.contains("collate_fn: step") && err.contains("examples") && err.contains("token 15 first"), "{err}");
}

#[test]
fn token_ids_past_the_vocabulary_are_refused_before_the_first_step_and_a_finished_run_is_left_alone() {
    // the corpus has 16 words; a model told it has 12 rows refuses the first batch by name,
    // before any step (no metrics, no checkpoint)
    let data = corpus().sequences(0, 64);
    let w = workdir("vocab");
    let dep = Deployer::new(Mesh::single(), 1, &w).unwrap();
    let t = trainer(TrainConfig { vocab_size: Some(12), ..config(4, 4, 1) });
    let err = t.fit(&dep, &data, false).unwrap_err().to_string();
    assert!(err.contains("collate_fn's `input_ids`") && err.contains("vocab_size 12"), "{err}");
    assert!(!w.join("metrics.jsonl").exists() && !w.join("checkpoints").exists());
    // the right size trains; resuming it with fewer steps trains nothing and rewrites nothing
    let t = trainer(TrainConfig { vocab_size: Some(16), checkpoint_every: Some(2), ..config(4, 4, 1) });
    let first = t.fit(&dep, &data, false).unwrap();
    assert_eq!(first.losses.len(), 4);
    let model = std::fs::read(w.join("model.safetensors")).unwrap();
    let metrics = std::fs::read(w.join("metrics.jsonl")).unwrap();
    let t = trainer(TrainConfig { vocab_size: Some(16), ..config(3, 4, 1) });
    let again = t.fit(&dep, &data, true).unwrap();
    assert_eq!((again.start_step, again.losses.len()), (4, 0));
    assert_eq!(std::fs::read(w.join("model.safetensors")).unwrap(), model);
    assert_eq!(std::fs::read(w.join("metrics.jsonl")).unwrap(), metrics);
    let _ = std::fs::remove_dir_all(&w);
}

#[test]
fn a_checkpoint_from_another_model_is_refused_with_the_differences_and_one_from_another_mesh_resharded() {
    let data = corpus().sequences(0, 64);
    let dir = workdir("other");
    let dep = Deployer::new("1x2".parse().unwrap(), 1, &dir).unwrap();
    trainer(config(2, 4, 1)).fit(&dep, &data, false).unwrap();
    let bigger = Config { hidden: 48, ..CFG };
    let t = Trainer::new(move |b| Lm::new(b, bigger, DType::F32, 1), collate, loss, config(4, 4, 1));
    let err = t.fit(&dep, &data, true).unwrap_err().to_string();
    assert!(err.contains("from another model") && err.contains("embed.weight"), "{err}");
    let other_mesh = Deployer::new("2x1".parse().unwrap(), 1, &dir).unwrap();
    let r = trainer(config(4, 4, 1)).fit(&other_mesh, &data, true).unwrap();
    assert_eq!((r.start_step, r.losses.len()), (2, 2), "resumed at 2x1 from the 1x2 checkpoint");
}

#[test]
fn bf16_and_f16_mixed_precision_reach_the_f32_loss() {
    let c = corpus();
    let train = c.sequences(0, 4096);
    let held = c.sequences(1 << 20, 64);
    let mut evals = Vec::new();
    for dt in [DType::F32, DType::BF16, DType::F16] {
        let dep = Deployer::new(Mesh::single(), 3, &workdir(&format!("mixed-{dt:?}"))).unwrap();
        let r = trainer(TrainConfig { compute_dtype: dt, ..config(160, 16, 1) }).fit(&dep, &train, false).unwrap();
        evals.push(eval_loss(&dep, &r, &held));
    }
    eprintln!("eval loss: f32 {:.4}, bf16 {:.4}, f16 {:.4}, entropy {:.4}", evals[0], evals[1], evals[2], c.entropy());
    for (name, e) in [("bf16", evals[1]), ("f16", evals[2])] {
        assert!((e - evals[0]).abs() <= 0.05 * evals[0], "{name} {e} vs f32 {} (tolerance 5%)", evals[0]);
    }
}

#[test]
fn eval_is_logged_and_the_best_checkpoint_is_kept() {
    let c = corpus();
    let dep = Deployer::new("1x2".parse().unwrap(), 3, &workdir("eval")).unwrap();
    let cfg = TrainConfig { keep_last: 1, ..config(60, 16, 1) };
    let t = trainer(cfg).with_eval(
        c.sequences(1 << 20, 40),
        |_: &StepCtx<Cpu>, m: &Lm<Cpu>, b: &Batch<Cpu>| {
            m.loss(&b["input_ids"], None, &b["labels"])?.replicate()?.to_scalar()
        },
        20,
        true,
    );
    t.fit(&dep, &c.sequences(0, 1024), false).unwrap();
    let evals: Vec<(u64, f64)> =
        read_metrics(&dep.workdir).unwrap().iter().filter_map(|m| m.eval.map(|e| (m.step, e))).collect();
    assert_eq!(evals.iter().map(|e| e.0).collect::<Vec<_>>(), vec![20, 40, 60]);
    let (best_step, best) = evals.iter().cloned().fold((0, f64::INFINITY), |a, b| if b.1 < a.1 { b } else { a });
    let ck = redco_pipeline::checkpoint::Checkpointer::new(&dep.workdir, 1);
    let (dir, metric) = ck.best().expect("a best checkpoint");
    assert_eq!(metric, best);
    assert!(dir.ends_with(format!("step-{best_step:08}")) && dir.join("manifest.json").exists(), "{}", dir.display());
}

#[test]
fn checkpoints_at_epoch_ends_and_at_the_end() {
    let dep = Deployer::new(Mesh::single(), 3, &workdir("epochs")).unwrap();
    let cfg = TrainConfig { keep_last: 0, ..config(10, 8, 1) };
    trainer(cfg).fit(&dep, &corpus().sequences(0, 32), false).unwrap();
    let ck = redco_pipeline::checkpoint::Checkpointer::new(&dep.workdir, 0);
    let mut steps: Vec<u64> = ck.complete().unwrap().into_iter().map(|(s, _)| s).collect();
    steps.sort();
    assert_eq!(steps, vec![4, 8, 10], "32 examples, 8 per step: an epoch every 4 steps, plus the last");
}

#[test]
fn the_predictor_returns_outputs_in_input_order_with_a_padded_last_batch() {
    let data = corpus().sequences(100, 10);
    let dep = Deployer::new("2x1".parse().unwrap(), 3, &workdir("predict")).unwrap();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let s2 = seen.clone();
    let pred = Predictor::new(
        |b: &Cpu| Lm::new(b, CFG, DType::F32, 1),
        collate,
        |_: &StepCtx<Cpu>, _m: &Lm<Cpu>, b: &Batch<Cpu>| {
            let ids = b["input_ids"].replicate()?.to_vec_i64()?;
            let t = b["input_ids"].dims()[1];
            Ok(ids.chunks(t).map(|r| r[0]).collect::<Vec<i64>>())
        },
        4,
    )
    .with_output(move |i, o| {
        s2.lock().unwrap().push((i, *o));
        Ok(())
    });
    let plan = redco_core::planning::heuristics::plan_by_names(&[], "2x1".parse().unwrap());
    let out = pred.predict(&dep, &data, &plan).unwrap();
    let want: Vec<i64> = data.iter().map(|s| s[0]).collect();
    assert_eq!(out, want);
    assert_eq!(*seen.lock().unwrap(), want.iter().copied().enumerate().collect::<Vec<_>>());
}

#[test]
fn sgd_with_momentum_trains_and_resumes_exactly() {
    let data = corpus().sequences(0, 256);
    let cfg = |steps| TrainConfig {
        optimizer: OptimizerConfig::Sgd { momentum: 0.9, weight_decay: 0.0 },
        schedule: Schedule { peak: 0.1, warmup: 0, total: 6, decay: Decay::Linear },
        checkpoint_every: Some(3),
        keep_last: 0,
        ..config(steps, 8, 1)
    };
    let whole = Deployer::new(Mesh::single(), 2, &workdir("sgd-whole")).unwrap();
    let r = trainer(cfg(6)).fit(&whole, &data, false).unwrap();
    assert!(r.losses[5] < r.losses[0], "SGD lowers the loss: {:?}", r.losses);
    let split = Deployer::new(Mesh::single(), 2, &workdir("sgd-split")).unwrap();
    trainer(cfg(3)).fit(&split, &data, false).unwrap();
    let resumed = trainer(cfg(6)).fit(&split, &data, true).unwrap();
    assert_eq!(resumed.start_step, 3);
    assert_eq!(read_model(&split.workdir), read_model(&whole.workdir), "momentum is checkpointed");
}
