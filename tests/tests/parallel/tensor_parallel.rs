//! Tensor-parallel equivalence: the same model, loss and gradients at every mesh, and
//! Megatron's communication count.

use redco_core::nn::ModuleExt;
use redco_core::{
    planning::ShardPlan,
    runtime::{CollectiveKind, CommStats, Mesh, SpmdOptions},
};
use redco_core::{DType, MeshAxis, Result, Tensor};
use redco_cpu::spmd_cpu;
use redco_cpu::Cpu;
use redco_tests::check::assert_close;
use redco_tests::models::{Config, Lm};
use std::collections::BTreeMap;

const LLAMA: Config = Config { vocab: 48, hidden: 32, layers: 2, heads: 4, kv_heads: 2, inter: 40, llama: true };
const GPT: Config = Config { vocab: 40, hidden: 24, layers: 2, heads: 4, kv_heads: 4, inter: 32, llama: false };
const BATCH: usize = 2;
const SEQ: usize = 6;

struct Run {
    loss: f64,
    grads: BTreeMap<String, Vec<f64>>,
    stats: CommStats,
}

fn batch(b: &Cpu, vocab: usize) -> Result<(Tensor<Cpu>, Tensor<Cpu>, Tensor<Cpu>)> {
    let ids: Vec<i64> = (0..BATCH * SEQ).map(|i| ((i * 7 + 3) % vocab) as i64).collect();
    let mut labels: Vec<i64> = (0..BATCH * SEQ).map(|i| ((i * 5 + 1) % vocab) as i64).collect();
    labels[0] = -100;
    labels[SEQ] = -100; // the padded position of row 1
    let mask: Vec<i64> = (0..BATCH * SEQ).map(|i| if i == SEQ { 0 } else { 1 }).collect();
    Ok((
        Tensor::from_vec(b, ids, [BATCH, SEQ])?,
        Tensor::from_vec(b, labels, [BATCH, SEQ])?,
        Tensor::from_vec(b, mask, [BATCH, SEQ])?,
    ))
}

fn step(b: &Cpu, cfg: Config, plan: Option<&ShardPlan>) -> Result<Run> {
    let mut m = Lm::new(b, cfg, DType::F32, 11)?;
    if let Some(p) = plan {
        p.apply(&mut m, redco_core::runtime::current_comm::<Cpu>().as_ref())?;
    }
    let (ids, labels, mask) = batch(b, cfg.vocab)?;
    if let Some(c) = redco_core::runtime::current_comm::<Cpu>() {
        c.reset_stats();
    }
    let loss = m.loss(&ids, Some(&mask), &labels)?;
    let grads = loss.backward()?;
    let stats = redco_core::runtime::current_comm::<Cpu>().map(|c| c.stats()).unwrap_or_default();
    let mut out = BTreeMap::new();
    for (name, p) in m.named_parameters() {
        let g = grads.get(&p).unwrap_or_else(|| panic!("no gradient for {name}"));
        out.insert(name, g.replicate()?.to_vec_f64()?);
    }
    Ok(Run { loss: loss.replicate()?.to_scalar()?, grads: out, stats })
}

fn run_mesh(cfg: Config, mesh: Mesh) -> Run {
    // The plan comes from the traced dataflow (rule 1 and rule 2), not from names.
    let plan = crate::rules::traced(cfg, mesh, false, true).unwrap();
    let mut runs = spmd_cpu(mesh, &SpmdOptions::default(), |rk| step(&rk.backend, cfg, Some(&plan))).unwrap();
    runs.swap_remove(0)
}

fn check_equal(cfg: Config, mesh: Mesh) -> Run {
    let single = step(&Cpu::new(2), cfg, None).unwrap();
    let split = run_mesh(cfg, mesh);
    assert_close(&[split.loss], &[single.loss], 1e-5, &format!("loss at {mesh}"));
    for (name, g) in &single.grads {
        assert_close(&split.grads[name], g, 2e-4, &format!("gradient of {name} at {mesh}"));
    }
    split
}

/// Megatron's count for one training step of an `L`-layer model at mp > 1: forward, one
/// all-reduce of batch x seq x hidden per norm input (embedding + 2 per layer) and three
/// of batch x seq scalars in the vocab-parallel cross-entropy; backward, one per norm.
fn megatron(cfg: Config, stats: &CommStats) {
    let act = (BATCH * SEQ * cfg.hidden * 4) as u64;
    let tok = (BATCH * SEQ * 4) as u64;
    let l = cfg.layers as u64;
    let ar = stats.get(CollectiveKind::AllReduce, MeshAxis::Mp);
    let expect_calls = (2 * l + 1) * 2 + 3;
    let expect_bytes = (2 * l + 1) * 2 * act + 3 * tok;
    assert_eq!(ar.calls, expect_calls, "all-reduce calls:\n{stats}");
    assert_eq!(ar.bytes, expect_bytes, "all-reduce bytes:\n{stats}");
    assert_eq!(stats.get(CollectiveKind::AllGather, MeshAxis::Mp).calls, 0, "no activation gathers:\n{stats}");
    assert_eq!(stats.get(CollectiveKind::ReduceScatter, MeshAxis::Mp).calls, 0, "{stats}");
}

#[test]
fn llama_shaped_mp2_equals_single_device_with_megatron_comm() {
    let r = check_equal(LLAMA, Mesh::new(1, 2).unwrap());
    megatron(LLAMA, &r.stats);
}

#[test]
fn gpt_shaped_mp2_equals_single_device_with_megatron_comm() {
    let r = check_equal(GPT, Mesh::new(1, 2).unwrap());
    megatron(GPT, &r.stats);
}

#[test]
fn llama_shaped_mp4_equals_single_device() {
    let cfg = Config { kv_heads: 4, ..LLAMA };
    let r = check_equal(cfg, Mesh::new(1, 4).unwrap());
    megatron(cfg, &r.stats);
}
