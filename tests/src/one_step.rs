//! One training step of a small LLaMA, run the same way on any backend, for the device
//! parity tests (wgpu, CUDA): the logits, then loss, backward and one AdamW update.

use redco_core::nn::ModuleExt;
use redco_core::optim::{AdamW, AdamWConfig};
use redco_core::planning::trace::plan_from_trace;
use redco_core::planning::ShardPlan;
use redco_core::runtime::{Comm, Mesh};
use redco_core::{Backend, DType, Result, Tensor};
use redco_cpu::Cpu;
use redco_models::hf::config::HfConfig;
use redco_models::llama::Llama;
use std::collections::BTreeMap;

/// Sequences in the batch.
pub const BATCH: usize = 2;
/// Tokens per sequence.
pub const SEQ: usize = 7;
/// `|device - cpu| <= TOL * (1 + |cpu|)` for every value compared.
pub const TOL: f64 = 1e-4;

/// The small LLaMA's config (grouped-query heads, untied head).
pub fn cfg() -> HfConfig {
    HfConfig::from_json(
        r#"{"model_type":"llama","hidden_size":32,"intermediate_size":64,"num_attention_heads":4,
            "num_key_value_heads":2,"num_hidden_layers":2,"vocab_size":64,"rope_theta":10000.0,
            "tie_word_embeddings":false,"max_position_embeddings":32}"#,
    )
    .expect("config")
}

/// Ids, attention mask (two padded positions) and labels.
pub fn batch<B: Backend>(b: &B) -> Result<[Tensor<B>; 3]> {
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
pub struct Step {
    /// The logits before the step.
    pub logits: Vec<f64>,
    /// The loss.
    pub loss: f64,
    /// Every parameter after the step.
    pub params: BTreeMap<String, Vec<f64>>,
}

/// The logits, then one training step: loss, backward, AdamW update, on the rank whose
/// communicator is `comm`.
pub fn step<B: Backend>(b: &B, plan: &ShardPlan, comm: Option<&Comm<B>>) -> Result<Step> {
    let mut m = Llama::new(b, &cfg(), DType::F32, 5)?;
    plan.apply(&mut m, comm)?;
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
pub fn plan(mesh: Mesh) -> ShardPlan {
    let b = Cpu::new(1);
    let m = Llama::new(&b, &cfg(), DType::F32, 5).expect("model");
    let [ids, mask, labels] = batch(&b).expect("batch");
    let loss = m.loss(&ids, Some(&mask), &labels).expect("loss");
    plan_from_trace(&m.named_parameters(), &[&loss], mesh, true).expect("plan")
}

/// The largest `|a - e| / (1 + |e|)`.
pub fn worst(a: &[f64], e: &[f64]) -> f64 {
    a.iter().zip(e).map(|(a, e)| (a - e).abs() / (1.0 + e.abs())).fold(0.0, f64::max)
}
