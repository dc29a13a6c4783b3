//! The rules on GPT-J-, OPT- and T5-shaped models: Megatron's split found from the
//! dataflow (also with opaque names), and the split run equal to the single-device run.

use redco_core::nn::{Module, ModuleExt};
use redco_core::planning::trace::plan_from_trace;
use redco_core::{
    planning::ShardPlan,
    runtime::{Mesh, SpmdOptions},
};
use redco_core::{Placement, Result, Tensor};
use redco_cpu::spmd_cpu;
use redco_cpu::Cpu;
use redco_tests::blocks::{GptJ, Opt, T5};
use redco_tests::check::assert_close;
use std::collections::BTreeMap;

/// Megatron's split by transformers' names.
fn expected(name: &str) -> Placement {
    let mut it = name.rsplit('.');
    let (leaf, owner) = (it.next().unwrap_or(""), it.next().unwrap_or(""));
    let col = ["q_proj", "k_proj", "v_proj", "fc_in", "fc1", "q", "k", "v", "wi"];
    let row = ["out_proj", "fc_out", "fc2", "o", "wo"];
    let vocab = ["wte", "embed_tokens", "embed_positions", "shared", "lm_head"];
    if owner == "relative_attention_bias" {
        Placement::Shard(1)
    } else if col.contains(&owner) || vocab.contains(&owner) {
        Placement::Shard(0)
    } else if row.contains(&owner) && leaf == "weight" {
        Placement::Shard(1)
    } else {
        Placement::Replicate
    }
}

trait Arch: Module<Cpu> + Sized {
    fn build(b: &Cpu) -> Result<Self>;
    fn loss(&self, b: &Cpu) -> Result<Tensor<Cpu>>;
}

fn ids(b: &Cpu, off: usize) -> Result<Tensor<Cpu>> {
    Tensor::from_vec(b, (0..12).map(|i| ((i * 7 + off) % 40) as i64).collect::<Vec<_>>(), [2, 6])
}

impl Arch for GptJ<Cpu> {
    fn build(b: &Cpu) -> Result<Self> {
        GptJ::new(b)
    }
    fn loss(&self, b: &Cpu) -> Result<Tensor<Cpu>> {
        GptJ::loss(self, &ids(b, 1)?)
    }
}
impl Arch for Opt<Cpu> {
    fn build(b: &Cpu) -> Result<Self> {
        Opt::new(b)
    }
    fn loss(&self, b: &Cpu) -> Result<Tensor<Cpu>> {
        Opt::loss(self, &ids(b, 2)?)
    }
}
impl Arch for T5<Cpu> {
    fn build(b: &Cpu) -> Result<Self> {
        T5::new(b)
    }
    fn loss(&self, b: &Cpu) -> Result<Tensor<Cpu>> {
        T5::loss(self, &ids(b, 3)?, &ids(b, 5)?)
    }
}

fn plan<M: Arch>(mesh: Mesh, opaque: bool) -> ShardPlan {
    let b = Cpu::new(1);
    let m = M::build(&b).unwrap();
    let loss = m.loss(&b).unwrap();
    let named = m.named_parameters();
    let params: Vec<(String, Tensor<Cpu>)> = named
        .iter()
        .enumerate()
        .map(|(i, (n, t))| (if opaque { format!("p{i}") } else { n.clone() }, t.clone()))
        .collect();
    let mut p = plan_from_trace(&params, &[&loss], mesh, true).unwrap();
    if opaque {
        let back: BTreeMap<String, String> =
            named.iter().enumerate().map(|(i, (n, _))| (format!("p{i}"), n.clone())).collect();
        p.params = p.params.into_iter().map(|(k, v)| (back[&k].clone(), v)).collect();
    }
    p
}

fn check<M: Arch>() {
    let mesh = Mesh::new(1, 2).unwrap();
    let p = plan::<M>(mesh, false);
    for (name, pp) in &p.params {
        assert_eq!(pp.placement, expected(name), "{name}: {}\n{p}", pp.reason);
    }
    assert_eq!(plan::<M>(mesh, true).summary(), p.summary(), "opaque names give the same plan");
    let shapes: Vec<_> = p.params.iter().map(|(n, pp)| (n.clone(), pp.shape.clone())).collect();
    assert_eq!(
        redco_core::planning::heuristics::plan_by_names(&shapes, mesh).summary(),
        p.summary(),
        "the name heuristics agree with the trace"
    );
    // the split run equals the single-device run
    let b = Cpu::new(2);
    let m = M::build(&b).unwrap();
    let loss = m.loss(&b).unwrap();
    let g = loss.backward().unwrap();
    let want: BTreeMap<String, Vec<f64>> =
        m.named_parameters().into_iter().map(|(n, t)| (n, g.get(&t).unwrap().to_vec_f64().unwrap())).collect();
    for mesh in ["1x2", "2x2"] {
        let mesh: Mesh = mesh.parse().unwrap();
        let p = plan::<M>(mesh, false);
        let (l, got) = spmd_cpu(mesh, &SpmdOptions::default(), |rk| {
            let mut m = M::build(&rk.backend)?;
            p.apply(&mut m, Some(&rk.comm))?;
            let loss = m.loss(&rk.backend)?;
            let g = loss.backward()?;
            let mut out = BTreeMap::new();
            for (n, t) in m.named_parameters() {
                out.insert(n, g.get(&t).expect("gradient").replicate()?.to_vec_f64()?);
            }
            Ok((loss.replicate()?.to_scalar()?, out))
        })
        .unwrap()
        .swap_remove(0);
        assert_close(&[l], &[loss.to_scalar().unwrap()], 1e-5, &format!("loss at {mesh}"));
        for (n, v) in &want {
            assert_close(&got[n], v, 2e-4, &format!("gradient of {n} at {mesh}"));
        }
    }
}

#[test]
fn gptj_split_found_from_the_dataflow() {
    check::<GptJ<Cpu>>();
}

#[test]
fn opt_split_found_from_the_dataflow() {
    check::<Opt<Cpu>>();
}

#[test]
fn t5_split_found_from_the_dataflow() {
    check::<T5<Cpu>>();
}
