//! The real LLaMA (`redco_models::llama`, Hugging Face names) split by the rules alone
//! (parameter names hidden from the planner): the same loss and gradients at 1x2 and 1x4 as
//! on one device, Megatron's placements and Megatron's communication count.

use redco_core::nn::{Module, ModuleExt};
use redco_core::planning::trace::plan_from_trace;
use redco_core::{
    planning::ShardPlan,
    runtime::{current_comm, CollectiveKind, CommStats, Mesh, SpmdOptions},
};
use redco_core::{DType, MeshAxis, Placement, Recompute, Result, Tensor};
use redco_cpu::spmd_cpu;
use redco_cpu::Cpu;
use redco_models::hf::config::HfConfig;
use redco_models::llama::Llama;
use redco_tests::check::assert_close;
use std::collections::BTreeMap;

const BATCH: usize = 2;
const SEQ: usize = 7;

fn cfg() -> HfConfig {
    HfConfig::from_json(
        r#"{"model_type":"llama","hidden_size":32,"intermediate_size":48,"num_attention_heads":8,
            "num_key_value_heads":4,"num_hidden_layers":2,"vocab_size":64,"rope_theta":50000.0,
            "tie_word_embeddings":false,"max_position_embeddings":32}"#,
    )
    .unwrap()
}

fn batch(b: &Cpu) -> Result<[Tensor<Cpu>; 3]> {
    let ids: Vec<i64> = (0..BATCH * SEQ).map(|i| ((i * 7 + 3) % 64) as i64).collect();
    let mask: Vec<i64> = (0..BATCH * SEQ).map(|i| if i == SEQ || i == SEQ + 1 { 0 } else { 1 }).collect();
    let labels: Vec<i64> = ids.iter().zip(&mask).map(|(&t, &m)| if m == 0 { -100 } else { t }).collect();
    Ok([
        Tensor::from_vec(b, ids, [BATCH, SEQ])?,
        Tensor::from_vec(b, mask, [BATCH, SEQ])?,
        Tensor::from_vec(b, labels, [BATCH, SEQ])?,
    ])
}

struct Run {
    loss: f64,
    grads: BTreeMap<String, Vec<f64>>,
    stats: CommStats,
}

fn step(b: &Cpu, plan: Option<&ShardPlan>) -> Result<Run> {
    step_with(b, plan, Recompute::None)
}

fn step_with(b: &Cpu, plan: Option<&ShardPlan>, recompute: Recompute) -> Result<Run> {
    let mut m = Llama::new(b, &cfg(), DType::F32, 5)?;
    m.set_recompute(recompute);
    if let Some(p) = plan {
        p.apply(&mut m, redco_core::runtime::current_comm::<Cpu>().as_ref())?;
    }
    let [ids, mask, labels] = batch(b)?;
    if let Some(c) = current_comm::<Cpu>() {
        c.reset_stats();
    }
    let loss = m.loss(&ids, Some(&mask), &labels)?;
    let g = loss.backward()?;
    let stats = current_comm::<Cpu>().map(|c| c.stats()).unwrap_or_default();
    let mut grads = BTreeMap::new();
    for (n, p) in m.named_parameters() {
        grads.insert(n.clone(), g.get(&p).unwrap_or_else(|| panic!("no gradient for {n}")).replicate()?.to_vec_f64()?);
    }
    Ok(Run { loss: loss.replicate()?.to_scalar()?, grads, stats })
}

/// `run`'s loss and gradients against `base`'s, within `(loss, gradient)` tolerances.
fn assert_same(run: &Run, base: &Run, (loss_tol, grad_tol): (f64, f64), what: &str) {
    assert_close(&[run.loss], &[base.loss], loss_tol, &format!("loss, {what}"));
    for (n, g) in &base.grads {
        assert_close(&run.grads[n], g, grad_tol, &format!("gradient of {n}, {what}"));
    }
}

/// The plan from the traced step with every parameter renamed `p<i>`: only dataflow counts.
fn opaque_plan(mesh: Mesh) -> ShardPlan {
    let b = Cpu::new(1);
    let m = Llama::new(&b, &cfg(), DType::F32, 5).unwrap();
    let [ids, mask, labels] = batch(&b).unwrap();
    let loss = m.loss(&ids, Some(&mask), &labels).unwrap();
    let named = m.named_parameters();
    let hidden: Vec<(String, Tensor<Cpu>)> =
        named.iter().enumerate().map(|(i, (_, t))| (format!("p{i}"), t.clone())).collect();
    let mut plan = plan_from_trace(&hidden, &[&loss], mesh, true).unwrap();
    let back: BTreeMap<String, String> =
        named.iter().enumerate().map(|(i, (n, _))| (format!("p{i}"), n.clone())).collect();
    plan.params = plan.params.into_iter().map(|(k, v)| (back[&k].clone(), v)).collect();
    plan
}

fn megatron_placement(name: &str) -> Placement {
    let owner = name.rsplit('.').nth(1).unwrap_or("");
    match owner {
        "q_proj" | "k_proj" | "v_proj" | "gate_proj" | "up_proj" => Placement::Shard(0),
        "o_proj" | "down_proj" => Placement::Shard(1),
        "embed_tokens" | "lm_head" => Placement::Shard(0),
        _ => Placement::Replicate,
    }
}

#[test]
fn llama_split_by_the_rules_equals_one_device_at_1x2_and_1x4_with_megatron_comm() {
    let single = step(&Cpu::new(2), None).unwrap();
    let c = cfg();
    for mesh in ["1x2", "1x4"] {
        let mesh: Mesh = mesh.parse().unwrap();
        let plan = opaque_plan(mesh);
        for (n, p) in &plan.params {
            assert_eq!(p.placement, megatron_placement(n), "{n} at {mesh}:\n{plan}");
        }
        let split =
            spmd_cpu(mesh, &SpmdOptions::default(), |rk| step(&rk.backend, Some(&plan))).unwrap().swap_remove(0);
        assert_same(&split, &single, (1e-5, 2e-4), &format!("at {mesh}"));
        // Megatron: forward, one all-reduce of batch x seq x hidden after the embedding and
        // after each attention and MLP block; backward, one per norm input; three of
        // batch x seq scalars in the vocabulary-parallel cross-entropy (the labels are
        // shifted, as in Megatron's data, so every position has a row; the last is ignored).
        let s = &split.stats;
        let l = c.layers as u64;
        let act = (BATCH * SEQ * c.hidden * 4) as u64;
        let tok = (BATCH * SEQ * 4) as u64;
        let ar = s.get(CollectiveKind::AllReduce, MeshAxis::Mp);
        assert_eq!(ar.calls, (2 * l + 1) * 2 + 3, "all-reduce calls at {mesh}:\n{s}");
        assert_eq!(ar.bytes, (2 * l + 1) * 2 * act + 3 * tok, "all-reduce bytes at {mesh}:\n{s}");
        assert_eq!(s.get(CollectiveKind::AllGather, MeshAxis::Mp).calls, 0, "{s}");
        assert_eq!(s.get(CollectiveKind::ReduceScatter, MeshAxis::Mp).calls, 0, "{s}");
    }
    // keep the Module import honest: the model's parameter count is the config's
    let m = Llama::new(&Cpu::new(1), &c, DType::F32, 5).unwrap();
    let mut n = 0;
    m.visit("", &mut |_, t| n += t.elem_count());
    assert_eq!(n, c.param_shapes().unwrap().iter().map(|(_, s)| s.elem_count()).sum::<usize>());
}

#[test]
fn llama_with_each_layer_recomputed_equals_keeping_activations_at_1x1_and_1x2() {
    let kept = step(&Cpu::new(2), None).unwrap();
    let again = step_with(&Cpu::new(2), None, Recompute::Block).unwrap();
    assert_same(&again, &kept, (1e-6, 1e-5), "recomputed");
    // tensor-parallel: the recomputed forward repeats each layer's two forward all-reduces
    // (after attention and after the MLP), as Megatron's full recompute does; nothing else
    let c = cfg();
    let mesh: Mesh = "1x2".parse().unwrap();
    let plan = opaque_plan(mesh);
    let split = spmd_cpu(mesh, &SpmdOptions::default(), |rk| step_with(&rk.backend, Some(&plan), Recompute::Block))
        .unwrap()
        .swap_remove(0);
    assert_same(&split, &kept, (1e-5, 2e-4), "recomputed at 1x2");
    let s = &split.stats;
    let l = c.layers as u64;
    let act = (BATCH * SEQ * c.hidden * 4) as u64;
    let tok = (BATCH * SEQ * 4) as u64;
    let ar = s.get(CollectiveKind::AllReduce, MeshAxis::Mp);
    assert_eq!(ar.calls, (2 * l + 1) * 2 + 3 + 2 * l, "all-reduce calls, recomputed:\n{s}");
    assert_eq!(ar.bytes, ((2 * l + 1) * 2 + 2 * l) * act + 3 * tok, "all-reduce bytes, recomputed:\n{s}");
    // and the planner predicts exactly that
    use redco_core::planning::planner::{predict_comm, Workload};
    let work =
        Workload { batch: BATCH, seq: SEQ, dtype_bytes: 4, zero: 0, recompute: Recompute::Block, unit_layers: 1 };
    let predicted = predict_comm(&plan, &c.dims(), &work).get(CollectiveKind::AllReduce, MeshAxis::Mp);
    assert_eq!((predicted.calls, predicted.bytes), (ar.calls, ar.bytes), "predicted against measured:\n{s}");
}

#[test]
fn llama_with_selective_recompute_equals_keeping_activations_and_repeats_no_all_reduce() {
    let kept = step(&Cpu::new(2), None).unwrap();
    let again = step_with(&Cpu::new(2), None, Recompute::Selective).unwrap();
    assert_same(&again, &kept, (1e-6, 1e-5), "selective");
    // tensor-parallel: the all-reduces' results are kept, so the count is the one without
    // recompute (each layer's two forward all-reduces once, not twice as block recompute)
    let c = cfg();
    let mesh: Mesh = "1x2".parse().unwrap();
    let plan = opaque_plan(mesh);
    let run = |rc| {
        spmd_cpu(mesh, &SpmdOptions::default(), |rk| step_with(&rk.backend, Some(&plan), rc)).unwrap().swap_remove(0)
    };
    let (split, plain) = (run(Recompute::Selective), run(Recompute::None));
    assert_same(&split, &kept, (1e-5, 2e-4), "selective at 1x2");
    assert_same(&split, &plain, (1e-6, 1e-5), "selective against none at 1x2");
    let l = c.layers as u64;
    let act = (BATCH * SEQ * c.hidden * 4) as u64;
    let tok = (BATCH * SEQ * 4) as u64;
    let s = &split.stats;
    let ar = s.get(CollectiveKind::AllReduce, MeshAxis::Mp);
    assert_eq!(ar.calls, (2 * l + 1) * 2 + 3, "all-reduce calls, selective:\n{s}");
    assert_eq!(ar.bytes, (2 * l + 1) * 2 * act + 3 * tok, "all-reduce bytes, selective:\n{s}");
    assert_eq!(s.total_calls(), plain.stats.total_calls(), "selective against none:\n{s}\n{}", plain.stats);
    use redco_core::planning::planner::{predict_comm, Workload};
    let work =
        Workload { batch: BATCH, seq: SEQ, dtype_bytes: 4, zero: 0, recompute: Recompute::Selective, unit_layers: 1 };
    let predicted = predict_comm(&plan, &c.dims(), &work).get(CollectiveKind::AllReduce, MeshAxis::Mp);
    assert_eq!((predicted.calls, predicted.bytes), (ar.calls, ar.bytes), "predicted against measured:\n{s}");
}
