//! ZeRO-2 through the Trainer: the masters, the optimizer state and the gradients sliced
//! over `dp` train as the replicated (DDP) run does, with the collectives counted.

use super::{config, corpus, read_model, trainer, workdir, CFG};
use redco_core::cpu::Cpu;
use redco_core::nn::ModuleExt;
use redco_core::pipeline::{Deployer, FitReport, OptimizerConfig, TrainConfig, ZeroStage};
use redco_core::runtime::CollectiveKind;
use redco_core::{DType, MeshAxis};
use redco_tests::models::Lm;

fn run(name: &str, mesh: &str, cfg: TrainConfig) -> (FitReport, Vec<(String, Vec<f64>)>) {
    let data = corpus().sequences(0, 512);
    let dep = Deployer::new(mesh.parse().unwrap(), 11, &workdir(name)).unwrap();
    let r = trainer(cfg).fit(&dep, &data, false).unwrap();
    let model = read_model(&dep.workdir)
        .into_iter()
        .map(|(n, v)| (n, v.chunks(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64).collect()))
        .collect();
    (r, model)
}

fn same(a: &(FitReport, Vec<(String, Vec<f64>)>), b: &(FitReport, Vec<(String, Vec<f64>)>), what: &str) {
    assert_eq!(a.0.losses.len(), b.0.losses.len(), "{what}: steps");
    for (i, (x, y)) in a.0.losses.iter().zip(&b.0.losses).enumerate() {
        assert!((x - y).abs() <= 1e-5 * x.abs().max(1e-3), "{what}: step {i} loss {x} against {y}");
    }
    for ((n, x), (_, y)) in a.1.iter().zip(&b.1) {
        redco_tests::check::assert_close(x, y, 1e-5, &format!("{what}: {n} after training"));
    }
}

fn zero(stage: ZeroStage, dtype: DType, accumulate: usize) -> TrainConfig {
    TrainConfig { zero: stage, compute_dtype: dtype, ..config(20, 8, accumulate) }
}

#[test]
fn zero2_trains_as_ddp_does_at_2x1_4x1_2x2_in_f32_and_bf16() {
    for (mesh, dtype, k) in
        [("2x1", DType::F32, 2), ("4x1", DType::F32, 1), ("2x2", DType::F32, 1), ("2x2", DType::BF16, 2)]
    {
        let tag = format!("{mesh}-{dtype:?}-{k}");
        let ddp = run(&format!("ddp-{tag}"), mesh, zero(ZeroStage::Off, dtype, k));
        let z2 = run(&format!("z2-{tag}"), mesh, zero(ZeroStage::Gradients, dtype, k));
        same(&ddp, &z2, &format!("ZeRO-2 against DDP at {mesh}, {dtype:?}, {k} micro-batches"));
        eprintln!("{tag}: loss {:.5} -> {:.5}", z2.0.losses[0], z2.0.losses[19]);
    }
}

#[test]
fn zero2_with_sgd_trains_as_ddp_does() {
    let sgd = |stage| TrainConfig {
        optimizer: OptimizerConfig::Sgd { momentum: 0.9, weight_decay: 0.01 },
        zero: stage,
        ..config(20, 8, 1)
    };
    same(&run("sgd-ddp", "2x1", sgd(ZeroStage::Off)), &run("sgd-z2", "2x1", sgd(ZeroStage::Gradients)), "SGD");
    // ZeRO-1 shards AdamW's moments: SGD has none, and is refused before the run
    let dep = Deployer::new("2x1".parse().unwrap(), 11, &workdir("sgd-z1")).unwrap();
    let err = trainer(sgd(ZeroStage::Optimizer)).fit(&dep, &corpus().sequences(0, 64), false).unwrap_err().to_string();
    assert!(err.contains("ZeRO-1") && err.contains("SGD"), "{err}");
}

/// One reduce-scatter (f32) and one all-gather (compute dtype) per parameter per step, of
/// the padded slices: `ceil(n / dp) * dp` elements each.
#[test]
fn zero2_moves_one_reduce_scatter_and_one_all_gather_per_parameter_per_step() {
    let steps = 3u64;
    let model = Lm::<Cpu>::new(&Cpu::default(), CFG, DType::F32, 1).unwrap();
    let sizes: Vec<u64> = model.trainable_parameters().iter().map(|(_, p)| p.elem_count() as u64).collect();
    for (dp, dtype) in [(2u64, DType::F32), (4, DType::BF16)] {
        let mesh = format!("{dp}x1");
        let cfg = TrainConfig { steps, ..zero(ZeroStage::Gradients, dtype, 1) };
        let (r, _) = run(&format!("count-{dp}"), &mesh, cfg);
        let padded: u64 = sizes.iter().map(|n| n.div_ceil(dp) * dp).sum();
        for (rank, stats) in &r.comm {
            let rs = stats.get(CollectiveKind::ReduceScatter, MeshAxis::Dp);
            let ag = stats.get(CollectiveKind::AllGather, MeshAxis::Dp);
            let p = sizes.len() as u64 * steps;
            assert_eq!((rs.calls, ag.calls), (p, p), "rank {rank} at {mesh}: calls");
            assert_eq!(rs.bytes, padded * 4 * steps, "rank {rank} at {mesh}: reduce-scatter bytes (f32)");
            let width = dtype.size_in_bytes() as u64;
            assert_eq!(ag.bytes, padded * width * steps, "rank {rank} at {mesh}: all-gather bytes ({dtype:?})");
        }
    }
}

#[test]
fn zero2_resumes_exactly_and_refuses_a_checkpoint_of_another_stage() {
    let data = corpus().sequences(0, 512);
    let cfg = |steps, stage| TrainConfig {
        checkpoint_every: Some(4),
        keep_last: 0,
        ..TrainConfig { steps, ..zero(stage, DType::F32, 1) }
    };
    let whole = Deployer::new("2x1".parse().unwrap(), 5, &workdir("z2-whole")).unwrap();
    let all = trainer(cfg(8, ZeroStage::Gradients)).fit(&whole, &data, false).unwrap();
    let split = Deployer::new("2x1".parse().unwrap(), 5, &workdir("z2-split")).unwrap();
    trainer(cfg(4, ZeroStage::Gradients)).fit(&split, &data, false).unwrap();
    let err = trainer(cfg(8, ZeroStage::Off)).fit(&split, &data, true).unwrap_err().to_string();
    assert!(err.contains("ZeRO-2") && err.contains("stage"), "{err}");
    let resumed = trainer(cfg(8, ZeroStage::Gradients)).fit(&split, &data, true).unwrap();
    assert_eq!(resumed.start_step, 4);
    assert_eq!(resumed.losses, all.losses[4..].to_vec(), "the continued losses");
    assert_eq!(read_model(&split.workdir), read_model(&whole.workdir), "masters and moments are checkpointed");
}
