//! The two rules: placements read off the traced dataflow equal Megatron's split, equal the
//! name heuristics, and do not depend on the parameter names.

use redco_core::nn::ModuleExt;
use redco_core::planning::heuristics::plan_by_names;
use redco_core::planning::trace::plan_from_trace;
use redco_core::{planning::ShardPlan, runtime::Mesh};
use redco_core::{DType, Placement, Tensor};
use redco_cpu::Cpu;
use redco_tests::models::{Config, Lm};
use std::collections::BTreeMap;

pub const LLAMA: Config = Config { vocab: 48, hidden: 32, layers: 2, heads: 4, kv_heads: 2, inter: 40, llama: true };
pub const GPT: Config = Config { vocab: 40, hidden: 24, layers: 2, heads: 4, kv_heads: 4, inter: 32, llama: false };

/// The plan the trace gives for `cfg` on `mesh`, with parameters optionally renamed to
/// opaque names (mapped back for comparison).
pub fn traced(cfg: Config, mesh: Mesh, opaque: bool, strict: bool) -> redco_core::Result<ShardPlan> {
    let b = Cpu::new(1);
    let m = Lm::new(&b, cfg, DType::F32, 3).unwrap();
    let ids = Tensor::from_vec(&b, (0..10).map(|i| (i * 3 % cfg.vocab) as i64).collect::<Vec<_>>(), [2, 5]).unwrap();
    let loss = m.loss(&ids, None, &ids).unwrap();
    let named = m.named_parameters();
    let rename: Vec<(String, String)> =
        named.iter().enumerate().map(|(i, (n, _))| (n.clone(), format!("p{i}"))).collect();
    let params: Vec<(String, Tensor<Cpu>)> = if opaque {
        named.iter().zip(&rename).map(|((_, t), (_, o))| (o.clone(), t.clone())).collect()
    } else {
        named.clone()
    };
    let mut plan = plan_from_trace(&params, &[&loss], mesh, strict)?;
    if opaque {
        let back: BTreeMap<String, String> = rename.iter().map(|(n, o)| (o.clone(), n.clone())).collect();
        plan.params = plan.params.into_iter().map(|(k, v)| (back[&k].clone(), v)).collect();
    }
    Ok(plan)
}

/// Megatron's split for the test models.
fn megatron(name: &str) -> Placement {
    let col = ["q_proj", "k_proj", "v_proj", "gate_proj", "up_proj", "fc_in"];
    let row = ["o_proj", "down_proj", "fc_out"];
    let owner = name.rsplit('.').nth(1).unwrap_or("");
    let leaf = name.rsplit('.').next().unwrap_or("");
    let vocab = (owner == "embed" || owner == "lm_head") && leaf == "weight";
    if vocab || col.contains(&owner) {
        Placement::Shard(0)
    } else if row.contains(&owner) && leaf == "weight" {
        Placement::Shard(1)
    } else {
        Placement::Replicate
    }
}

fn check(cfg: Config) {
    let mesh = Mesh::new(1, 2).unwrap();
    let plan = traced(cfg, mesh, false, true).unwrap();
    for (name, p) in &plan.params {
        assert_eq!(p.placement, megatron(name), "{name}: {}\n{plan}", p.reason);
    }
    let opaque = traced(cfg, mesh, true, true).unwrap();
    assert_eq!(opaque.summary(), plan.summary(), "renaming every parameter changes nothing");
    let shapes: Vec<_> = plan.params.iter().map(|(n, p)| (n.clone(), p.shape.clone())).collect();
    assert_eq!(plan_by_names(&shapes, mesh).summary(), plan.summary(), "the name heuristics agree with the trace");
}

#[test]
fn llama_shaped_plan_is_megatron_from_the_dataflow() {
    check(LLAMA);
}

#[test]
fn gpt_shaped_plan_is_megatron_from_the_dataflow() {
    check(GPT);
}

#[test]
fn heads_the_mesh_cannot_split_are_replicated_or_rejected() {
    let mesh = Mesh::new(1, 3).unwrap();
    let cfg = Config { vocab: 48, hidden: 24, heads: 4, kv_heads: 4, inter: 36, ..LLAMA };
    let plan = traced(cfg, mesh, false, false).unwrap();
    let q = &plan.params["layers.0.attn.q_proj.weight"];
    assert_eq!(q.placement, Placement::Replicate, "{}", q.reason);
    assert!(q.reason.contains("does not split 3 ways"), "{}", q.reason);
    // the MLP still splits (36 % 3 == 0)
    assert_eq!(plan.params["layers.0.mlp.gate_proj.weight"].placement, Placement::Shard(0));
    let err = traced(cfg, mesh, false, true).unwrap_err();
    assert!(err.to_string().contains("does not split 3 ways"), "{err}");
}

#[test]
fn overrides_apply_and_a_regex_that_matches_nothing_is_an_error() {
    let mesh = Mesh::new(1, 2).unwrap();
    let plan = traced(LLAMA, mesh, false, true).unwrap();
    let o = plan.clone().with_overrides(&[(r"mlp\.(gate|up)_proj", Placement::Replicate)]).unwrap();
    assert_eq!(o.params["layers.1.mlp.up_proj.weight"].placement, Placement::Replicate);
    assert!(o.params["layers.1.mlp.up_proj.weight"].reason.contains("override"));
    let e = plan.clone().with_overrides(&[(r"^no_such_param$", Placement::Replicate)]).unwrap_err();
    assert!(e.to_string().contains("matches no parameter"), "{e}");
    let e = plan.clone().with_overrides(&[(r"([", Placement::Replicate)]).unwrap_err();
    assert!(e.to_string().contains("not a valid regex"), "{e}");
    let e = plan.with_overrides(&[(r"norm1", Placement::Shard(1))]).unwrap_err();
    assert!(e.to_string().contains("does not divide") || e.to_string().contains("splits dim"), "{e}");
}

#[test]
fn a_plan_for_another_mesh_is_rejected() {
    use redco_core::runtime::SpmdOptions;
    use redco_cpu::spmd_cpu;
    let plan = traced(LLAMA, Mesh::new(1, 2).unwrap(), false, true).unwrap();
    let err = spmd_cpu(Mesh::new(1, 4).unwrap(), &SpmdOptions::default(), |rk| {
        let mut m = Lm::new(&rk.backend, LLAMA, DType::F32, 3)?;
        plan.apply(&mut m, Some(&rk.comm))
    })
    .unwrap_err();
    assert!(err.to_string().contains("plan is for mesh 1x2 but this run has mesh 1x4"), "{err}");
    let mut m = Lm::new(&Cpu::new(1), LLAMA, DType::F32, 3).unwrap();
    let err = plan.apply(&mut m, None).unwrap_err();
    assert!(err.to_string().contains("inside an SPMD run"), "{err}");
}
