//! The Trainer with the compiled step on PJRT devices against the eager Trainer on CPU
//! ranks: the same losses and trained weights at 1x1, 1x2 and 2x2, and a run resumed from a
//! checkpoint that ends where the uninterrupted one does.

use redco_core::optim::{AdamWConfig, Decay, Schedule};
use redco_core::runtime::{CollectiveKind, Mesh};
use redco_core::{Backend, DType, MeshAxis, Result, Tensor};
use redco_cpu::Cpu;
use redco_models::hf::config::HfConfig;
use redco_models::llama::Llama;
use redco_pipeline::{Batch, Deployer, FitReport, OptimizerConfig, TrainConfig, Trainer};
use redco_tpu::{Pjrt, PjrtStepCompiler, Tracer};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

const SEQ: usize = 12;

fn config() -> HfConfig {
    HfConfig::from_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/llama-tiny")).unwrap()
}

fn data() -> Vec<Vec<i64>> {
    (0..64).map(|s| (0..SEQ).map(|i| ((s * 13 + i * 7 + 3) % 64) as i64).collect()).collect()
}

fn collate<B: Backend>(b: &B, ex: &[Vec<i64>]) -> Result<Batch<B>> {
    let ids: Vec<i64> = ex.iter().flatten().copied().collect();
    Ok(Batch::from([("input_ids".to_string(), Tensor::from_vec(b, ids, [ex.len(), SEQ])?)]))
}

fn loss<B: Backend>(m: &Llama<B>, batch: &Batch<B>) -> Result<Tensor<B>> {
    let x = &batch["input_ids"];
    m.loss(x, None, x)
}

fn train_config(steps: u64) -> TrainConfig {
    TrainConfig {
        batch_size: 8,
        steps,
        schedule: Schedule { peak: 1e-2, warmup: 1, total: 4, decay: Decay::Cosine },
        optimizer: OptimizerConfig::AdamW(AdamWConfig { weight_decay: 0.01, ..AdamWConfig::default() }),
        clip_norm: Some(0.5),
        checkpoint_every: Some(2),
        keep_last: 0,
        log_every: 100,
        ..TrainConfig::default()
    }
}

fn workdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("redco-tpu-trainer-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn cpu_fit(mesh: Mesh, steps: u64, dir: &Path) -> FitReport {
    let cfg = config();
    let dep = Deployer::new(mesh, 3, dir).unwrap();
    let t = Trainer::new(
        move |b: &Cpu| Llama::new(b, &cfg, DType::F32, 7),
        collate,
        |_, m, batch| loss(m, batch),
        train_config(steps),
    );
    t.fit(&dep, &data(), false).unwrap()
}

/// The Trainer on PJRT devices with the compiled step.
fn pjrt_trainer(config: TrainConfig) -> Trainer<Llama<Pjrt>, Vec<i64>, Pjrt> {
    let (cfg, twin) = (self::config(), self::config());
    let compiler = PjrtStepCompiler::new(
        move |t: &Tracer| Llama::new(t, &twin, DType::F32, 7),
        |m: &Llama<Tracer>, batch: &Batch<Tracer>| loss(m, batch),
        Duration::from_secs(60),
    );
    Trainer::for_backend(
        move |b: &Pjrt| Llama::new(b, &cfg, DType::F32, 7),
        collate,
        |_, m, batch| loss(m, batch),
        config,
    )
    .with_compiled_step(Arc::new(compiler))
}

fn compiled_fit(base: &Pjrt, mesh: Mesh, steps: u64, dir: &Path, resume: bool) -> FitReport {
    let base = base.clone();
    let dep = Deployer::with_backend(mesh, 3, dir, move |rank, _| base.on_device(rank)).unwrap();
    pjrt_trainer(train_config(steps)).fit(&dep, &data(), resume).unwrap()
}

fn weights(dir: &Path) -> Vec<(String, Vec<f32>)> {
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut v: Vec<(String, Vec<f32>)> = st
        .tensors()
        .into_iter()
        .map(|(n, t)| (n, t.data().chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

fn assert_same(got: &FitReport, gdir: &Path, want: &FitReport, wdir: &Path, what: &str) {
    assert_eq!(got.losses.len(), want.losses.len(), "{what}");
    for (a, w) in got.losses.iter().zip(&want.losses) {
        assert!((a - w).abs() <= 1e-5 * w.abs(), "{what}: losses {:?} vs {:?}", got.losses, want.losses);
    }
    for ((n, a), (_, w)) in weights(gdir).iter().zip(weights(wdir)) {
        let e = a.iter().zip(&w).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
        assert!(e <= 1e-4, "{what}: `{n}` differs by {e}");
    }
}

#[test]
fn the_trainer_with_the_compiled_step_equals_the_cpu_trainer_and_resumes() {
    let base = Pjrt::from_env(4).expect("set REDCO_PJRT_PLUGIN to a PJRT plugin");
    for mesh in ["1x1", "1x2", "2x2"] {
        let mesh: Mesh = mesh.parse().unwrap();
        let (cd, pd) = (workdir(&format!("cpu-{mesh}")), workdir(&format!("pjrt-{mesh}")));
        let want = cpu_fit(mesh, 4, &cd);
        let got = compiled_fit(&base, mesh, 4, &pd, false);
        assert!(want.losses[3] < want.losses[0], "{:?}", want.losses);
        assert_same(&got, &pd, &want, &cd, &format!("compiled at {mesh}"));
        // the steps' collectives are the program's own: the ranks' communicators moved
        // nothing but the checkpoints' barriers (the eager run all-reduces over mp and dp)
        for (rank, c) in &got.comm {
            assert_eq!(c.get(CollectiveKind::AllReduce, MeshAxis::Mp).calls, 0, "rank {rank} at {mesh}:\n{c}");
            assert_eq!(c.get(CollectiveKind::AllReduce, MeshAxis::Dp).calls, 0, "rank {rank} at {mesh}:\n{c}");
        }
        if mesh.mp > 1 {
            assert!(want.comm[&0].get(CollectiveKind::AllReduce, MeshAxis::Mp).calls > 0);
        }
        if mesh.size() == 2 {
            // two steps, then two more from the step-2 checkpoint
            let rd = workdir(&format!("resumed-{mesh}"));
            compiled_fit(&base, mesh, 2, &rd, false);
            let resumed = compiled_fit(&base, mesh, 4, &rd, true);
            assert_eq!(resumed.start_step, 2);
            let tail = FitReport { losses: want.losses[2..].to_vec(), ..want.clone() };
            assert_same(&resumed, &rd, &tail, &cd, &format!("resumed at {mesh}"));
        }
    }
}

#[test]
fn a_configuration_the_compiled_step_cannot_run_is_refused_with_the_reason() {
    let base = Pjrt::from_env(1).expect("set REDCO_PJRT_PLUGIN to a PJRT plugin");
    let dep = Deployer::with_backend(Mesh::single(), 3, &workdir("refused"), move |r, _| base.on_device(r)).unwrap();
    let t = pjrt_trainer(TrainConfig { accumulate: 2, ..train_config(2) });
    let e = t.fit(&dep, &data(), false).unwrap_err().to_string();
    assert!(e.contains("one micro-batch per step"), "{e}");
}
