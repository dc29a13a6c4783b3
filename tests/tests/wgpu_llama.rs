//! A small LLaMA on wgpu equals the CPU backend: the logits, the loss and every parameter
//! after one AdamW training step (forward, backward, update), at mesh 1x1 and 1x2 (one wgpu
//! device per rank, collectives staged through host memory; the plan from a CPU trace).
//!
//! Skipped without a wgpu adapter unless `REDCO_REQUIRE_WGPU=1`.

use redco_core::cpu::Cpu;
use redco_core::dist::trace::plan_from_trace;
use redco_core::dist::{spmd, Mesh, ShardPlan, SpmdOptions};
use redco_core::nn::ModuleExt;
use redco_core::optim::{AdamW, AdamWConfig};
use redco_core::{Backend, DType, Result, Tensor};
use redco_models::hf::config::HfConfig;
use redco_models::llama::Llama;
use redco_tests::check::assert_close;
use redco_wgpu::Wgpu;
use std::collections::BTreeMap;

const BATCH: usize = 2;
const SEQ: usize = 7;
/// `|wgpu - cpu| <= TOL * (1 + |cpu|)` for every value compared.
const TOL: f64 = 1e-4;

fn cfg() -> HfConfig {
    HfConfig::from_json(
        r#"{"model_type":"llama","hidden_size":32,"intermediate_size":64,"num_attention_heads":4,
            "num_key_value_heads":2,"num_hidden_layers":2,"vocab_size":64,"rope_theta":10000.0,
            "tie_word_embeddings":false,"max_position_embeddings":32}"#,
    )
    .expect("config")
}

fn batch<B: Backend>(b: &B) -> Result<[Tensor<B>; 3]> {
    let ids: Vec<i64> = (0..BATCH * SEQ).map(|i| ((i * 7 + 3) % 64) as i64).collect();
    let mask: Vec<i64> = (0..BATCH * SEQ).map(|i| if i == SEQ || i == SEQ + 1 { 0 } else { 1 }).collect();
    let labels: Vec<i64> = ids.iter().zip(&mask).map(|(&t, &m)| if m == 0 { -100 } else { t }).collect();
    Ok([
        Tensor::from_vec(b, ids, [BATCH, SEQ])?,
        Tensor::from_vec(b, mask, [BATCH, SEQ])?,
        Tensor::from_vec(b, labels, [BATCH, SEQ])?,
    ])
}

/// What one rank reports (replicated values, the same on every rank).
struct Step {
    logits: Vec<f64>,
    loss: f64,
    params: BTreeMap<String, Vec<f64>>,
}

/// The logits, then one training step: loss, backward, AdamW update.
fn step<B: Backend>(b: &B, plan: &ShardPlan) -> Result<Step> {
    let mut m = Llama::new(b, &cfg(), DType::F32, 5)?;
    plan.apply(&mut m)?;
    let [ids, mask, labels] = batch(b)?;
    // the model's own loss: under tensor parallelism the vocabulary-parallel cross-entropy
    let logits = m.forward(&ids, Some(&mask), None)?.replicate()?.to_vec_f64()?;
    let loss = m.loss(&ids, Some(&mask), &labels)?;
    let grads = loss.backward()?;
    // eps 1e-6: a gradient that is zero in exact arithmetic must not turn rounding noise
    // into a full step of either sign
    let mut opt = AdamW::new(AdamWConfig { lr: 1e-2, weight_decay: 0.01, eps: 1e-6, ..Default::default() });
    opt.step(&mut m, &grads)?;
    let mut params = BTreeMap::new();
    for (n, p) in m.named_parameters() {
        params.insert(n, p.replicate()?.to_vec_f64()?);
    }
    Ok(Step { logits, loss: loss.replicate()?.to_scalar()?, params })
}

/// The plan for `mesh` from a traced CPU loss.
fn plan(mesh: Mesh) -> ShardPlan {
    let b = Cpu::new(1);
    let m = Llama::new(&b, &cfg(), DType::F32, 5).expect("model");
    let [ids, mask, labels] = batch(&b).expect("batch");
    let loss = m.loss(&ids, Some(&mask), &labels).expect("loss");
    plan_from_trace(&m.named_parameters(), &[&loss], mesh, true).expect("plan")
}

/// The largest `|a - e| / (1 + |e|)`.
fn worst(a: &[f64], e: &[f64]) -> f64 {
    a.iter().zip(e).map(|(a, e)| (a - e).abs() / (1.0 + e.abs())).fold(0.0, f64::max)
}

#[test]
fn llama_logits_and_one_adamw_step_on_wgpu_equal_cpu_at_1x1_and_1x2() {
    if redco_tests::wgpu().is_none() {
        return;
    }
    for mesh in ["1x1", "1x2"] {
        let mesh: Mesh = mesh.parse().expect("mesh");
        let plan = plan(mesh);
        let opts = SpmdOptions::default();
        let cpu = spmd(mesh, &opts, |_, t| Cpu::try_new(t), |rk| step(&rk.backend, &plan)).expect("cpu run");
        // one wgpu device per rank
        let gpu = spmd(mesh, &opts, |_, _| Wgpu::new(), |rk| step(&rk.backend, &plan)).expect("wgpu run");
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
