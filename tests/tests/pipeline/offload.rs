//! Optimizer offload (`TrainConfig::offload`): AdamW's state and the f32 host masters in
//! host memory, the update on the CPU backend, the parameters uploaded. On CPU ranks it
//! trains as the run without offload does (the same kernels: bit for bit), resumes from its
//! checkpoints, and trains in bf16; with ZeRO-1 it is refused (ZeRO-2 and 3: `zero.rs`).

use super::{config, corpus, read_model, trainer, workdir};
use redco_core::optim::{Decay, Schedule};
use redco_core::DType;
use redco_pipeline::{Deployer, TrainConfig, ZeroStage};

fn cfg(steps: u64, offload: bool, dtype: DType) -> TrainConfig {
    TrainConfig {
        offload,
        compute_dtype: dtype,
        schedule: Schedule { peak: 3e-3, warmup: 1, total: 8, decay: Decay::Cosine },
        checkpoint_every: Some(4),
        keep_last: 0,
        ..config(steps, 8, 1)
    }
}

#[test]
fn offloaded_adamw_trains_as_on_the_device_at_1x2_and_2x1_in_f32_and_bf16_and_resumes() {
    let data = corpus().sequences(0, 256);
    for (mesh, dtype) in [("1x2", DType::F32), ("2x1", DType::F32), ("2x1", DType::BF16)] {
        let tag = format!("{mesh}-{dtype:?}");
        let dep =
            |name: &str| Deployer::new(mesh.parse().unwrap(), 5, &workdir(&format!("offload-{name}-{tag}"))).unwrap();
        let run = |dep: &Deployer, offload: bool, steps: u64, resume: bool| {
            trainer(cfg(steps, offload, dtype)).fit(dep, &data, resume).unwrap()
        };
        let (pd, od, rd) = (dep("plain"), dep("on"), dep("half"));
        let plain = run(&pd, false, 8, false);
        let off = run(&od, true, 8, false);
        assert_eq!(off.losses.len(), 8);
        assert_eq!(off.losses, plain.losses, "{tag}: losses with and without offload");
        assert_eq!(read_model(&od.workdir), read_model(&pd.workdir), "{tag}: trained weights");
        // four steps, then four more from the checkpoint (the host state saved and restored)
        run(&rd, true, 4, false);
        let resumed = run(&rd, true, 8, true);
        assert_eq!(resumed.start_step, 4);
        assert_eq!(resumed.losses, off.losses[4..].to_vec(), "{tag}: resumed losses");
        assert_eq!(read_model(&rd.workdir), read_model(&od.workdir), "{tag}: resumed weights");
    }
}

#[test]
fn offload_with_zero1_is_refused_naming_the_stage() {
    let data = corpus().sequences(0, 64);
    let dep = Deployer::new("2x1".parse().unwrap(), 5, &workdir("offload-zero1")).unwrap();
    let c = TrainConfig { zero: ZeroStage::Optimizer, ..cfg(2, true, DType::F32) };
    let e = trainer(c).fit(&dep, &data, false).expect_err("refused").to_string();
    assert!(e.contains("offload") && e.contains("ZeRO-1") && e.contains("ZeRO-2 or 3"), "{e}");
    assert!(!dep.workdir.join("metrics.jsonl").exists(), "nothing is written");
}

/// A bf16 checkpoint of another mesh and stage (2x1 ZeRO-2, its masters in dp-slices)
/// resumed at 1x1 with offload: the resharded f32 masters go to host memory and the run
/// continues bit for bit as the same resume without offload.
#[test]
fn a_resharded_bf16_checkpoint_resumes_offloaded_as_on_the_device() {
    let data = corpus().sequences(0, 256);
    let mut resumed = Vec::new();
    for offload in [false, true] {
        let dir = workdir(&format!("offload-reshard-{offload}"));
        let first = Deployer::new("2x1".parse().unwrap(), 5, &dir).unwrap();
        let z2 = TrainConfig { zero: ZeroStage::Gradients, ..cfg(4, false, DType::BF16) };
        trainer(z2).fit(&first, &data, false).unwrap();
        let then = Deployer::new("1x1".parse().unwrap(), 5, &dir).unwrap();
        let r = trainer(cfg(8, offload, DType::BF16)).fit(&then, &data, true).unwrap();
        assert_eq!(r.start_step, 4);
        resumed.push((r.losses, read_model(&dir)));
    }
    assert_eq!(resumed[1].0, resumed[0].0, "continued losses offloaded vs on the device");
    assert_eq!(resumed[1].1, resumed[0].1, "exported f32 weights");
}
