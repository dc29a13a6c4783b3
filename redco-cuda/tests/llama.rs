//! A small LLaMA on CUDA equals the CPU backend: the logits, the loss and every parameter
//! after one AdamW training step, at mesh 1x1 and 1x2 (both ranks on GPU 0, collectives
//! staged through host memory), and at 1x2 over NCCL when the machine has two GPUs.
//!
//! Skipped without a GPU unless `REDCO_REQUIRE_CUDA=1`.

use redco_core::runtime::{spmd, spmd_with, Mesh, SpmdOptions, Threads};
use redco_cpu::Cpu;
use redco_cuda::{Cuda, NcclFactory};
use redco_tests::check::assert_close;
use redco_tests::one_step::{plan, step, worst, Step, TOL};
use std::sync::Arc;

fn gpus() -> usize {
    match redco_cuda::devices() {
        Ok(d) if !d.is_empty() => d.len(),
        r => {
            let why = r.map_or_else(|e| e.to_string(), |_| "the driver sees no GPU".into());
            assert!(
                std::env::var("REDCO_REQUIRE_CUDA").map_or(true, |v| v != "1"),
                "REDCO_REQUIRE_CUDA=1 but there is no GPU: {why}"
            );
            eprintln!("skipped: {why}");
            0
        }
    }
}

fn compare(mesh: Mesh, what: &str, gpu: &[Step], cpu: &[Step]) {
    let (c, g) = (&cpu[0], &gpu[0]);
    for (r, other) in gpu.iter().enumerate() {
        assert_eq!(other.loss, g.loss, "rank {r} disagrees with rank 0 at {mesh} ({what})");
    }
    assert_close(&g.logits, &c.logits, TOL, &format!("logits at {mesh} ({what})"));
    assert_close(&[g.loss], &[c.loss], TOL, &format!("loss at {mesh} ({what})"));
    let mut worst_param = 0.0f64;
    for (n, p) in &c.params {
        assert_close(&g.params[n], p, TOL, &format!("{n} after one AdamW step at {mesh} ({what})"));
        worst_param = worst_param.max(worst(&g.params[n], p));
    }
    println!(
        "{mesh} ({what}): loss cuda {:.7} cpu {:.7}; worst relative difference: logits {:.1e}, parameters {worst_param:.1e}",
        g.loss,
        c.loss,
        worst(&g.logits, &c.logits)
    );
}

#[test]
fn llama_logits_and_one_adamw_step_on_cuda_equal_cpu() {
    let n = gpus();
    if n == 0 {
        return;
    }
    let opts = SpmdOptions::default();
    for mesh in ["1x1", "1x2"] {
        let mesh: Mesh = mesh.parse().expect("mesh");
        let plan = plan(mesh);
        let cpu =
            spmd(mesh, &opts, |_, t| Cpu::try_new(t), |rk| step(&rk.backend, &plan, Some(&rk.comm))).expect("cpu run");
        let gpu =
            spmd(mesh, &opts, |_, _| Cuda::new(0), |rk| step(&rk.backend, &plan, Some(&rk.comm))).expect("cuda run");
        compare(mesh, "host-staged collectives", &gpu, &cpu);
        if mesh.size() > 1 && n >= mesh.size() {
            let nccl = NcclFactory::new(Arc::new(Threads::new()));
            let gpu =
                spmd_with(&nccl, mesh, &opts, |rank, _| Cuda::new(rank), |rk| step(&rk.backend, &plan, Some(&rk.comm)))
                    .expect("cuda run over NCCL");
            compare(mesh, "NCCL", &gpu, &cpu);
        }
    }
}
