//! The pipeline on wgpu ranks (one device per rank, made by the deployer): the `Trainer`
//! gives the CPU backend's losses and resumes from its own checkpoints, the `Predictor`
//! gives the CPU backend's outputs. Skipped without a wgpu adapter unless
//! `REDCO_REQUIRE_WGPU=1`.

use super::{collate, config, corpus, loss, read_model, trainer, workdir, CFG};
use redco_core::nn::ModuleExt;
use redco_core::optim::{Decay, Schedule};
use redco_core::planning::heuristics::plan_by_names;
use redco_core::runtime::Mesh;
use redco_core::{Backend, DType, Result};
use redco_cpu::Cpu;
use redco_pipeline::{Batch, Deployer, Predictor, StepCtx, TrainConfig, Trainer, ZeroStage};
use redco_tests::check::assert_close;
use redco_tests::models::Lm;
use redco_wgpu::Wgpu;

/// `|wgpu - cpu| <= TOL * (1 + |cpu|)`.
const TOL: f64 = 1e-4;

/// A deployer on wgpu ranks, or `None` (a skip) without an adapter.
fn on_wgpu(mesh: &str, seed: u64, name: &str) -> Option<Deployer<Wgpu>> {
    redco_tests::wgpu()?;
    let mesh: Mesh = mesh.parse().expect("mesh");
    Some(Deployer::with_backend(mesh, seed, &workdir(name), |_, _| Wgpu::new()).expect("deployer"))
}

fn wgpu_trainer(cfg: TrainConfig) -> Trainer<Lm<Wgpu>, Vec<i64>, Wgpu> {
    Trainer::for_backend(|b: &Wgpu| Lm::new(b, CFG, DType::F32, 1), collate, loss, cfg)
}

/// The mean next-token loss of each example.
fn per_example<B: Backend>(_: &StepCtx<B>, m: &Lm<B>, b: &Batch<B>) -> Result<Vec<f64>> {
    let per = m.forward(&b["input_ids"], None)?.cross_entropy_per_token(&b["labels"], -100)?;
    let t = b["input_ids"].dims()[1];
    Ok(per.replicate()?.to_vec_f64()?.chunks(t).map(|r| r.iter().sum::<f64>() / (t - 1) as f64).collect())
}

/// The model bytes of a workdir's export, as f32 values.
fn model_values(dir: &std::path::Path) -> Vec<f64> {
    read_model(dir)
        .into_iter()
        .flat_map(|(_, b)| b.chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64).collect::<Vec<_>>())
        .collect()
}

#[test]
fn the_trainer_on_wgpu_ranks_gives_the_cpu_losses_and_resumes_from_its_checkpoints() {
    let (Some(whole), Some(split)) = (on_wgpu("1x2", 3, "wgpu-whole"), on_wgpu("1x2", 3, "wgpu-split")) else {
        return;
    };
    let data = corpus().sequences(0, 256);
    // one schedule for the whole and the split runs
    let schedule = Schedule { peak: 3e-3, warmup: 1, total: 4, decay: Decay::Cosine };
    let cfg = |steps| TrainConfig { schedule, checkpoint_every: Some(2), keep_last: 0, ..config(steps, 8, 1) };
    let cpu_dep = Deployer::new(whole.mesh, 3, &workdir("wgpu-cpu")).expect("deployer");
    let cpu = trainer(cfg(4)).fit(&cpu_dep, &data, false).expect("cpu fit");
    let gpu = wgpu_trainer(cfg(4)).fit(&whole, &data, false).expect("wgpu fit");
    assert_close(&gpu.losses, &cpu.losses, TOL, "losses on wgpu vs cpu");
    assert_close(&model_values(&whole.workdir), &model_values(&cpu_dep.workdir), TOL, "trained weights");
    // two steps, then two more from the step-2 checkpoint (downloaded, then uploaded back)
    wgpu_trainer(cfg(2)).fit(&split, &data, false).expect("first half");
    let resumed = wgpu_trainer(cfg(4)).fit(&split, &data, true).expect("resumed");
    assert_eq!(resumed.start_step, 2);
    assert_close(&resumed.losses, &gpu.losses[2..], TOL, "resumed losses");
    assert_close(&model_values(&split.workdir), &model_values(&whole.workdir), TOL, "resumed weights");
}

#[test]
fn the_predictor_on_wgpu_ranks_gives_the_cpu_outputs() {
    let Some(gpu_dep) = on_wgpu("2x1", 2, "wgpu-predict") else { return };
    let data = corpus().sequences(100, 10);
    let plan = plan_by_names(&[], gpu_dep.mesh);
    let cpu = Predictor::new(|b: &Cpu| Lm::new(b, CFG, DType::F32, 1), collate, per_example, 4);
    let cpu_dep = Deployer::new(gpu_dep.mesh, 2, &workdir("wgpu-predict-cpu")).expect("deployer");
    let want = cpu.predict(&cpu_dep, &data, &plan).expect("cpu predict");
    let gpu = Predictor::for_backend(|b: &Wgpu| Lm::new(b, CFG, DType::F32, 1), collate, per_example, 4);
    let got = gpu.predict(&gpu_dep, &data, &plan).expect("wgpu predict");
    assert_eq!(got.len(), data.len());
    assert_close(&got, &want, TOL, "per-example losses on wgpu vs cpu");
}

/// The offload tests' run: `steps` of a 4-step schedule, a checkpoint every 2.
fn offload_cfg(steps: u64, offload: bool, compute_dtype: DType) -> TrainConfig {
    let schedule = Schedule { peak: 3e-3, warmup: 1, total: 4, decay: Decay::Cosine };
    TrainConfig { schedule, checkpoint_every: Some(2), keep_last: 0, offload, compute_dtype, ..config(steps, 8, 1) }
}

/// Optimizer offload on wgpu ranks: AdamW runs on the CPU backend with its state in host
/// memory and the parameters are uploaded after each update; the run gives the wgpu run
/// without offload and the CPU run, and resumes from its own checkpoints.
#[test]
fn offloaded_adamw_on_wgpu_ranks_gives_the_device_run_and_resumes() {
    let (Some(dev), Some(off), Some(split)) =
        (on_wgpu("1x2", 3, "wgpu-dev"), on_wgpu("1x2", 3, "wgpu-offload"), on_wgpu("1x2", 3, "wgpu-offload-split"))
    else {
        return;
    };
    let data = corpus().sequences(0, 256);
    let cfg = |steps, offload| offload_cfg(steps, offload, DType::F32);
    let on_device = wgpu_trainer(cfg(4, false)).fit(&dev, &data, false).expect("wgpu fit");
    let offloaded = wgpu_trainer(cfg(4, true)).fit(&off, &data, false).expect("offloaded fit");
    assert_eq!(offloaded.losses.len(), 4);
    assert_close(&offloaded.losses, &on_device.losses, TOL, "losses offloaded vs on the device");
    assert_close(&model_values(&off.workdir), &model_values(&dev.workdir), TOL, "trained weights");
    wgpu_trainer(cfg(2, true)).fit(&split, &data, false).expect("first half");
    let resumed = wgpu_trainer(cfg(4, true)).fit(&split, &data, true).expect("resumed");
    assert_eq!(resumed.start_step, 2);
    assert_close(&resumed.losses, &offloaded.losses[2..], TOL, "resumed losses");
    assert_close(&model_values(&split.workdir), &model_values(&off.workdir), TOL, "resumed weights");
}

/// Offload in a bf16 run on a wgpu rank: the f32 masters and AdamW's moments live in host
/// memory (the checkpoint reads them there), so the device's peak drops by at least their
/// 12 bytes a parameter against the run without offload, while the losses, the exported
/// f32 weights and a resume stay the device run's.
#[test]
fn offload_keeps_the_bf16_runs_masters_and_moments_off_the_wgpu_device() {
    let Some(_) = redco_tests::wgpu() else { return };
    // a device of its own: its memory counts this test's tensors only
    let w = Wgpu::new().expect("device");
    let on = |name: &str| {
        let w = w.clone();
        Deployer::with_backend("1x1".parse().unwrap(), 3, &workdir(name), move |_, _| Ok(w.clone())).expect("deployer")
    };
    let (dev, off, split) = (on("wgpu-bf16-dev"), on("wgpu-bf16-offload"), on("wgpu-bf16-offload-split"));
    let data = corpus().sequences(0, 256);
    let cfg = |steps, offload| offload_cfg(steps, offload, DType::BF16);
    let peak_of = |dep: &Deployer<Wgpu>, steps, offload, resume| {
        w.reset_peak_memory();
        let r = wgpu_trainer(cfg(steps, offload)).fit(dep, &data, resume).expect("bf16 fit");
        (r, w.memory_stats().expect("wgpu counts its memory").peak)
    };
    let (on_device, dev_peak) = peak_of(&dev, 4, false, false);
    let (offloaded, off_peak) = peak_of(&off, 4, true, false);
    assert_close(&offloaded.losses, &on_device.losses, TOL, "bf16 losses offloaded vs on the device");
    assert_close(&model_values(&off.workdir), &model_values(&dev.workdir), TOL, "exported f32 weights");
    let n = Lm::new(&Cpu::new(1), CFG, DType::F32, 1).expect("model").num_parameters() as u64;
    assert!(
        dev_peak >= off_peak + 12 * n,
        "device peak {dev_peak} B on the device, {off_peak} B offloaded: not 12 B x {n} parameters apart"
    );
    assert_eq!(w.memory_stats().map(|m| m.in_use), Some(0), "every device buffer given back after the runs");
    // two steps, then two more from the checkpoint: the f32 host masters saved and restored
    peak_of(&split, 2, true, false);
    let (resumed, _) = peak_of(&split, 4, true, true);
    assert_eq!(resumed.start_step, 2);
    assert_close(&resumed.losses, &offloaded.losses[2..], TOL, "resumed bf16 losses");
    assert_close(&model_values(&split.workdir), &model_values(&off.workdir), TOL, "resumed weights");
}

/// Offload with ZeRO-2 on two wgpu ranks (2x1, bf16): each rank's host keeps its slice of
/// the f32 masters and AdamW's moments, its device the slice's compute copy, so each
/// rank's device peaks lower than without offload by at least the moments' 8 bytes a
/// parameter over dp (and the masters' 4 less the compute copy's: nothing more here,
/// where lavapipe keeps bf16 in f32 words), each device's own count from the run's
/// report, with the device run's losses and weights.
#[test]
fn offload_with_zero2_keeps_each_ranks_slice_off_its_wgpu_device() {
    let (Some(dev), Some(off)) = (on_wgpu("2x1", 3, "wgpu-z2-dev"), on_wgpu("2x1", 3, "wgpu-z2-offload")) else {
        return;
    };
    let data = corpus().sequences(0, 256);
    let cfg = |offload| TrainConfig { zero: ZeroStage::Gradients, ..offload_cfg(4, offload, DType::BF16) };
    let on_device = wgpu_trainer(cfg(false)).fit(&dev, &data, false).expect("wgpu fit");
    let offloaded = wgpu_trainer(cfg(true)).fit(&off, &data, false).expect("offloaded fit");
    assert_close(&offloaded.losses, &on_device.losses, TOL, "losses offloaded vs on the device");
    assert_close(&model_values(&off.workdir), &model_values(&dev.workdir), TOL, "exported f32 weights");
    let n = Lm::new(&Cpu::new(1), CFG, DType::F32, 1).expect("model").num_parameters() as u64;
    assert_eq!(on_device.device_memory.len(), 2, "both ranks' devices report");
    for (rank, m) in &on_device.device_memory {
        let o = offloaded.device_memory[rank].peak;
        assert!(m.peak >= o + 8 * n / 2, "rank {rank}: device peak {} B, {o} B offloaded ({n} parameters)", m.peak);
    }
}
