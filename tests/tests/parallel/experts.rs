//! Mixtures of experts on a mesh: data parallelism with every expert on every rank, expert
//! parallelism (the experts split over `dp`, tokens sent to them with all-to-all), and each
//! expert split over `mp` by the two rules, against one device: the loss (with the
//! load-balancing loss) and every gradient; the all-to-all bytes and the all-reduces over
//! `mp` against the counts the planner predicts.

use redco_core::nn::ModuleExt;
use redco_core::planning::heuristics::plan_by_names;
use redco_core::planning::planner::{predict_comm, Workload};
use redco_core::planning::ShardPlan;
use redco_core::runtime::{current_comm, CollectiveKind, CommStats, Mesh, SpmdOptions};
use redco_core::{DType, MeshAxis, Placement, Result, Tensor};
use redco_cpu::{spmd_cpu, Cpu};
use redco_models::hf::config::HfConfig;
use redco_models::llama::Llama;
use redco_tests::check::assert_close;
use std::collections::BTreeMap;

const BATCH: usize = 4;
const SEQ: usize = 6;

fn cfg() -> HfConfig {
    HfConfig::from_json(
        r#"{"model_type":"mixtral","hidden_size":32,"intermediate_size":24,"num_attention_heads":4,
            "num_key_value_heads":2,"num_hidden_layers":2,"vocab_size":64,"num_local_experts":8,
            "num_experts_per_tok":2,"output_router_logits":true,"router_aux_loss_coef":0.02,
            "tie_word_embeddings":false,"max_position_embeddings":32}"#,
    )
    .unwrap()
}

fn batch(b: &Cpu) -> Result<[Tensor<Cpu>; 3]> {
    let ids: Vec<i64> = (0..BATCH * SEQ).map(|i| ((i * 11 + 5) % 64) as i64).collect();
    let mask: Vec<i64> = (0..BATCH * SEQ).map(|i| if i % SEQ == 0 && i / SEQ == 2 { 0 } else { 1 }).collect();
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

/// One forward and backward pass; under a plan the batch is split over `dp`.
fn step(b: &Cpu, plan: Option<&ShardPlan>) -> Result<Run> {
    let mut m = Llama::new(b, &cfg(), DType::F32, 11)?;
    let comm = current_comm::<Cpu>();
    if let Some(p) = plan {
        p.apply(&mut m, comm.as_ref())?;
    }
    let [mut ids, mut mask, mut labels] = batch(b)?;
    if plan.is_some_and(|p| p.mesh.dp > 1) {
        ids = ids.shard_along(MeshAxis::Dp, 0)?;
        mask = mask.shard_along(MeshAxis::Dp, 0)?;
        labels = labels.shard_along(MeshAxis::Dp, 0)?;
    }
    if let Some(c) = &comm {
        c.reset_stats();
    }
    let loss = m.loss(&ids, Some(&mask), &labels)?;
    let g = loss.backward()?;
    let stats = comm.map(|c| c.stats()).unwrap_or_default();
    let mut grads = BTreeMap::new();
    for (n, p) in m.named_parameters() {
        let gp = g.get(&p).unwrap_or_else(|| panic!("no gradient for {n}"));
        grads.insert(n.clone(), gp.replicate()?.to_vec_f64()?);
    }
    Ok(Run { loss: loss.replicate()?.to_scalar()?, grads, stats })
}

/// The model's parameter names and shapes.
fn shapes() -> Vec<(String, redco_core::Shape)> {
    Llama::new(&Cpu::new(1), &cfg(), DType::F32, 11)
        .unwrap()
        .named_parameters()
        .into_iter()
        .map(|(n, p)| (n, p.shape().clone()))
        .collect()
}

fn plan(mesh: Mesh, ep: usize) -> ShardPlan {
    plan_by_names(&shapes(), mesh).with_ep(ep).unwrap()
}

#[test]
fn experts_split_over_dp_equal_one_device_with_the_planned_all_to_all_bytes() {
    let single = step(&Cpu::new(2), None).unwrap();
    let c = cfg();
    for (mesh, ep) in [("2x1", 1), ("2x1", 2), ("4x1", 4), ("2x2", 2)] {
        let mesh: Mesh = mesh.parse().unwrap();
        let p = plan(mesh, ep);
        let stack = p.params.keys().find(|n| n.contains(".*.")).expect("a stack of experts").clone();
        let want = if ep > 1 { Placement::Shard(0) } else { Placement::Replicate };
        assert_eq!(p.placements(&stack).get(MeshAxis::Dp), want, "{stack} at {mesh}, ep {ep}");
        let runs = spmd_cpu(mesh, &SpmdOptions::default(), |rk| step(&rk.backend, Some(&p))).unwrap();
        let what = format!("mesh {mesh}, ep {ep}");
        for r in &runs {
            assert_close(&[r.loss], &[single.loss], 1e-5, &format!("loss, {what}"));
            for (n, g) in &single.grads {
                assert_close(&r.grads[n], g, 1e-5, &format!("gradient of {n}, {what}"));
            }
        }
        // the tokens and their gradients cross over dp twice per layer each way; summed over
        // the ranks of one dp group, the bytes are the planner's
        let dp_group: Vec<&Run> = (0..mesh.dp).map(|d| &runs[mesh.rank_of(d, 0)]).collect();
        let sent: u64 = dp_group.iter().map(|r| r.stats.get(CollectiveKind::AllToAll, MeshAxis::Dp).bytes).sum();
        let calls = dp_group[0].stats.get(CollectiveKind::AllToAll, MeshAxis::Dp).calls;
        let work = Workload {
            batch: BATCH,
            seq: SEQ,
            dtype_bytes: 4,
            zero: 0,
            recompute: redco_core::Recompute::None,
            unit_layers: 1,
        };
        let predicted = predict_comm(&p, &c.dims(), &work).get(CollectiveKind::AllToAll, MeshAxis::Dp);
        assert_eq!(sent, predicted.bytes * mesh.dp as u64, "all-to-all bytes over dp at {what}");
        assert_eq!(calls, predicted.calls, "all-to-all calls at {what}");
        assert_eq!(calls, if ep > 1 { 4 * c.layers as u64 } else { 0 }, "all-to-all calls at {what}");
        // the router's counts: one small all-gather per layer, one more with the experts split
        let gathers = dp_group[0].stats.get(CollectiveKind::AllGather, MeshAxis::Dp);
        let want = predict_comm(&p, &c.dims(), &work).get(CollectiveKind::AllGather, MeshAxis::Dp);
        assert_eq!(gathers, want, "all-gathers over dp at {what}");
        // over mp the experts are pairs of the rules: Megatron's all-reduces, plus the
        // routing weights' gradient, as the planner predicts
        if mesh.mp > 1 {
            assert!(p.params.iter().any(|(n, q)| n.contains(".*.") && q.placement != Placement::Replicate), "{p}");
            let got = runs[0].stats.get(CollectiveKind::AllReduce, MeshAxis::Mp);
            let want = predict_comm(&p, &c.dims(), &work).get(CollectiveKind::AllReduce, MeshAxis::Mp);
            assert_eq!(got, want, "all-reduces over mp at {what}");
        }
    }
}

#[test]
fn expert_parallelism_refuses_what_it_cannot_split() {
    let mesh: Mesh = "4x1".parse().unwrap();
    let shapes = shapes();
    let e = plan_by_names(&shapes, mesh).with_ep(2).unwrap_err().to_string();
    assert!(e.contains("part of dp"), "{e}");
    let e = plan_by_names(&shapes, "3x1".parse().unwrap()).with_ep(3).unwrap_err().to_string();
    assert!(e.contains("do not split"), "{e}");
    let dense: Vec<_> = shapes.iter().filter(|(n, _)| !n.contains(".*.")).cloned().collect();
    let e = plan_by_names(&dense, mesh).with_ep(4).unwrap_err().to_string();
    assert!(e.contains("no experts"), "{e}");
}
