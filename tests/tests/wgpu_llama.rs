//! A small LLaMA on wgpu equals the CPU backend: the logits, the loss and every parameter
//! after one AdamW training step (forward, backward, update), at mesh 1x1 and 1x2 (one wgpu
//! device per rank, collectives staged through host memory; the plan from a CPU trace).
//!
//! Skipped without a wgpu adapter unless `REDCO_REQUIRE_WGPU=1`.

use redco_core::runtime::{spmd, Mesh, SpmdOptions};
use redco_cpu::Cpu;
use redco_tests::check::assert_close;
use redco_tests::one_step::{plan, step, worst, TOL};
use redco_wgpu::Wgpu;

#[test]
fn llama_logits_and_one_adamw_step_on_wgpu_equal_cpu_at_1x1_and_1x2() {
    if redco_tests::wgpu().is_none() {
        return;
    }
    for mesh in ["1x1", "1x2"] {
        let mesh: Mesh = mesh.parse().expect("mesh");
        let plan = plan(mesh);
        let opts = SpmdOptions::default();
        let cpu =
            spmd(mesh, &opts, |_, t| Cpu::try_new(t), |rk| step(&rk.backend, &plan, Some(&rk.comm))).expect("cpu run");
        // one wgpu device per rank
        let gpu =
            spmd(mesh, &opts, |_, _| Wgpu::new(), |rk| step(&rk.backend, &plan, Some(&rk.comm))).expect("wgpu run");
        let (c, g) = (&cpu[0], &gpu[0]);
        for (r, other) in gpu.iter().enumerate() {
            assert_eq!(other.loss, g.loss, "rank {r} disagrees with rank 0 at {mesh}");
        }
        assert_close(&g.logits, &c.logits, TOL, &format!("logits at {mesh}"));
        assert_close(&[g.loss], &[c.loss], TOL, &format!("loss at {mesh}"));
        assert_eq!(g.params.len(), c.params.len());
        let mut worst_param = 0.0f64;
        for (n, p) in &c.params {
            assert_close(&g.params[n], p, TOL, &format!("{n} after one AdamW step at {mesh}"));
            worst_param = worst_param.max(worst(&g.params[n], p));
        }
        println!(
            "{mesh}: loss wgpu {:.7} cpu {:.7}; worst |wgpu - cpu| / (1 + |cpu|): logits {:.1e}, loss {:.1e}, \
             parameters after the step {worst_param:.1e}",
            g.loss,
            c.loss,
            worst(&g.logits, &c.logits),
            worst(&[g.loss], &[c.loss]),
        );
    }
}
