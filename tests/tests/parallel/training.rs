//! Data + tensor parallel training steps: loss, gradients and the parameters after two
//! AdamW steps at meshes 1x2, 1x4, 2x1 and 2x2 equal the single-device run; ZeRO-1 gives
//! the same parameters as the replicated optimizer.

use redco_core::nn::ModuleExt;
use redco_core::optim::{AdamW, AdamWConfig};
use redco_core::{
    planning::ShardPlan,
    runtime::{CollectiveKind, Mesh, SpmdOptions},
};
use redco_core::{DType, MeshAxis, Result, Tensor};
use redco_cpu::spmd_cpu;
use redco_cpu::Cpu;
use redco_pipeline::data_parallel::{sync_grads, DEFAULT_BUCKET_BYTES};
use redco_tests::check::assert_close;
use redco_tests::models::{Config, Lm};
use std::collections::BTreeMap;

const BATCH: usize = 4;
const SEQ: usize = 5;

struct Trained {
    losses: Vec<f64>,
    params: BTreeMap<String, Vec<f64>>,
    dp_all_reduces: u64,
}

fn data(b: &Cpu, vocab: usize, step: usize) -> Result<[Tensor<Cpu>; 3]> {
    let ids: Vec<i64> = (0..BATCH * SEQ).map(|i| ((i * 7 + 3 + step * 11) % vocab) as i64).collect();
    let mut labels: Vec<i64> = (0..BATCH * SEQ).map(|i| ((i * 5 + 1 + step) % vocab) as i64).collect();
    labels[SEQ] = -100;
    let mask: Vec<i64> = (0..BATCH * SEQ).map(|i| if i == SEQ || i == 3 * SEQ { 0 } else { 1 }).collect();
    Ok([
        Tensor::from_vec(b, ids, [BATCH, SEQ])?,
        Tensor::from_vec(b, labels, [BATCH, SEQ])?,
        Tensor::from_vec(b, mask, [BATCH, SEQ])?,
    ])
}

/// [`data`] with every tensor split over `dp` along the batch.
fn dp_data(b: &Cpu, vocab: usize, step: usize) -> Result<[Tensor<Cpu>; 3]> {
    let [ids, labels, mask] = data(b, vocab, step)?;
    Ok([ids.shard_along(MeshAxis::Dp, 0)?, labels.shard_along(MeshAxis::Dp, 0)?, mask.shard_along(MeshAxis::Dp, 0)?])
}

fn train(b: &Cpu, cfg: Config, plan: Option<&ShardPlan>, dp: usize, zero1: bool) -> Result<Trained> {
    train_steps(b, cfg, plan, dp, zero1, 2)
}

fn train_steps(
    b: &Cpu,
    cfg: Config,
    plan: Option<&ShardPlan>,
    dp: usize,
    zero1: bool,
    steps: usize,
) -> Result<Trained> {
    let mut m = Lm::new(b, cfg, DType::F32, 5)?;
    if let Some(p) = plan {
        p.apply(&mut m, redco_core::runtime::current_comm::<Cpu>().as_ref())?;
    }
    // eps 1e-6: the gradient of a key bias is zero in exact arithmetic (softmax ignores a
    // per-row constant), so with a tiny eps Adam would turn rounding noise into full steps
    // of either sign and no two summation orders could agree.
    let comm = redco_core::runtime::current_comm::<Cpu>();
    let mut opt = AdamW::new(AdamWConfig { lr: 1e-2, weight_decay: 0.01, eps: 1e-6, zero1, ..Default::default() })
        .with_comm(comm.clone());
    let mut losses = Vec::new();
    for step in 0..steps {
        let [mut ids, mut labels, mut mask] = data(b, cfg.vocab, step)?;
        if dp > 1 {
            ids = ids.shard_along(MeshAxis::Dp, 0)?;
            labels = labels.shard_along(MeshAxis::Dp, 0)?;
            mask = mask.shard_along(MeshAxis::Dp, 0)?;
        }
        let loss = m.loss(&ids, Some(&mask), &labels)?;
        let mut grads = loss.backward()?;
        if !zero1 {
            let params: Vec<Tensor<Cpu>> = m.named_parameters().into_iter().map(|(_, t)| t).collect();
            sync_grads(comm.as_ref(), &params, &mut grads, DEFAULT_BUCKET_BYTES)?;
        }
        opt.step(&mut m, &grads)?;
        losses.push(loss.replicate()?.to_scalar()?);
    }
    let mut params = BTreeMap::new();
    for (n, p) in m.named_parameters() {
        params.insert(n, p.replicate()?.to_vec_f64()?);
    }
    let stats = redco_core::runtime::current_comm::<Cpu>().map(|c| c.stats()).unwrap_or_default();
    let dp_all_reduces = stats.get(CollectiveKind::AllReduce, MeshAxis::Dp).calls;
    Ok(Trained { losses, params, dp_all_reduces })
}

fn on_mesh(cfg: Config, mesh: Mesh, zero1: bool) -> Trained {
    let plan = crate::rules::traced(cfg, mesh, false, true).unwrap();
    let mut r =
        spmd_cpu(mesh, &SpmdOptions::default(), |rk| train(&rk.backend, cfg, Some(&plan), mesh.dp, zero1)).unwrap();
    r.swap_remove(0)
}

fn compare(cfg: Config, mesh: Mesh, zero1: bool) -> Trained {
    let single = train(&Cpu::new(2), cfg, None, 1, false).unwrap();
    let split = on_mesh(cfg, mesh, zero1);
    assert_close(&split.losses, &single.losses, 1e-5, &format!("losses at {mesh}"));
    for (n, v) in &single.params {
        assert_close(&split.params[n], v, 1e-4, &format!("{n} after two AdamW steps at {mesh} (zero1 {zero1})"));
    }
    split
}

const LLAMA: Config = Config { vocab: 48, hidden: 32, layers: 2, heads: 4, kv_heads: 2, inter: 40, llama: true };
const GPT: Config = Config { vocab: 40, hidden: 24, layers: 2, heads: 4, kv_heads: 4, inter: 32, llama: false };

#[test]
fn llama_two_adamw_steps_match_at_1x2_2x1_2x2() {
    for mesh in ["1x2", "2x1", "2x2"] {
        let t = compare(LLAMA, mesh.parse().unwrap(), false);
        if mesh.starts_with('2') {
            assert!(t.dp_all_reduces > 0, "data-parallel gradients were summed");
        }
    }
}

#[test]
fn llama_two_adamw_steps_match_at_1x4() {
    compare(Config { kv_heads: 4, ..LLAMA }, "1x4".parse().unwrap(), false);
}

#[test]
fn layernorm_gpt_two_adamw_steps_match_at_1x2_1x4_2x1_2x2() {
    for mesh in ["1x2", "1x4", "2x1", "2x2"] {
        compare(GPT, mesh.parse().unwrap(), false);
    }
}

#[test]
fn zero1_gives_the_same_parameters() {
    for mesh in ["2x1", "2x2"] {
        let mesh: Mesh = mesh.parse().unwrap();
        let plain = on_mesh(LLAMA, mesh, false);
        let zero = on_mesh(LLAMA, mesh, true);
        assert_eq!(zero.losses, plain.losses);
        for (n, v) in &plain.params {
            assert_close(&zero.params[n], v, 1e-6, &format!("{n} with ZeRO-1 at {mesh}"));
        }
    }
}

/// The planner's prediction of one training step equals what the step did, collective by
/// collective, at 2x2 with and without ZeRO-1. (The final `replicate` calls that read the
/// parameters back for the comparisons are excluded by measuring before them.)
#[test]
fn planner_predicts_the_measured_communication() {
    use redco_core::planning::planner::{predict_comm, ModelDims, Workload};
    let mesh: Mesh = "2x2".parse().unwrap();
    let plan = crate::rules::traced(LLAMA, mesh, false, true).unwrap();
    let dims = ModelDims {
        layers: LLAMA.layers,
        hidden: LLAMA.hidden,
        heads: LLAMA.heads,
        kv_heads: LLAMA.kv_heads,
        vocab: LLAMA.vocab,
        intermediate: LLAMA.inter,
        moe: None,
    };
    for zero1 in [false, true] {
        let measured = spmd_cpu(mesh, &SpmdOptions::default(), |rk| {
            let mut m = Lm::new(&rk.backend, LLAMA, DType::F32, 5)?;
            plan.apply(&mut m, Some(&rk.comm))?;
            let [ids, labels, mask] = dp_data(&rk.backend, LLAMA.vocab, 0)?;
            let mut opt = AdamW::new(AdamWConfig { zero1, ..Default::default() }).with_comm(Some(rk.comm.clone()));
            rk.comm.reset_stats();
            let loss = m.loss(&ids, Some(&mask), &labels)?;
            let mut grads = loss.backward()?;
            if !zero1 {
                let params: Vec<Tensor<Cpu>> = m.named_parameters().into_iter().map(|(_, t)| t).collect();
                sync_grads(Some(&rk.comm), &params, &mut grads, DEFAULT_BUCKET_BYTES)?;
            }
            opt.step(&mut m, &grads)?;
            Ok(rk.comm.stats())
        })
        .unwrap()
        .swap_remove(0);
        let predicted = predict_comm(
            &plan,
            &dims,
            &Workload {
                batch: BATCH,
                seq: SEQ,
                dtype_bytes: 4,
                zero: zero1 as u8,
                recompute: redco_core::Recompute::None,
                unit_layers: 1,
            },
        );
        assert_eq!(predicted, measured, "zero1 {zero1}\npredicted:\n{predicted}\nmeasured:\n{measured}");
    }
}

/// The global gradient norm (for clipping) counts every element once across the mesh.
#[test]
fn global_grad_norm_counts_every_shard_once() {
    use redco_core::optim::{clip_grad_norm, global_grad_norm};
    let norm = |b: &Cpu, plan: Option<&ShardPlan>, dp: usize| -> Result<(f64, f64)> {
        let mut m = Lm::new(b, LLAMA, DType::F32, 5)?;
        if let Some(p) = plan {
            p.apply(&mut m, redco_core::runtime::current_comm::<Cpu>().as_ref())?;
        }
        let [mut ids, mut labels, mut mask] = data(b, LLAMA.vocab, 0)?;
        if dp > 1 {
            ids = ids.shard_along(MeshAxis::Dp, 0)?;
            labels = labels.shard_along(MeshAxis::Dp, 0)?;
            mask = mask.shard_along(MeshAxis::Dp, 0)?;
        }
        let mut grads = m.loss(&ids, Some(&mask), &labels)?.backward()?;
        let params: Vec<Tensor<Cpu>> = m.named_parameters().into_iter().map(|(_, t)| t).collect();
        let comm = redco_core::runtime::current_comm::<Cpu>();
        sync_grads(comm.as_ref(), &params, &mut grads, DEFAULT_BUCKET_BYTES)?;
        let before = clip_grad_norm(comm.as_ref(), &params, &mut grads, 0.5)?;
        Ok((before, global_grad_norm(comm.as_ref(), &params, &grads)?))
    };
    let (want, _) = norm(&Cpu::new(2), None, 1).unwrap();
    let mesh: Mesh = "2x2".parse().unwrap();
    let plan = crate::rules::traced(LLAMA, mesh, false, true).unwrap();
    for (before, after) in spmd_cpu(mesh, &SpmdOptions::default(), |rk| norm(&rk.backend, Some(&plan), 2)).unwrap() {
        assert_close(&[before], &[want], 1e-5, "global norm at 2x2");
        assert!(want > 0.5, "the test clips");
        assert_close(&[after], &[0.5], 1e-6, "norm after clipping");
    }
}

#[test]
fn schedules_warm_up_and_decay() {
    use redco_core::optim::{Decay, Schedule};
    let s = Schedule { peak: 1.0, warmup: 4, total: 14, decay: Decay::Linear };
    let lrs: Vec<f64> = (0..15).map(|i| s.lr(i)).collect();
    assert_close(&lrs[..5], &[0.25, 0.5, 0.75, 1.0, 1.0], 1e-12, "warmup then peak");
    assert_close(&lrs[9..], &[0.5, 0.4, 0.3, 0.2, 0.1, 0.0], 1e-12, "linear decay");
    let c = Schedule { decay: Decay::Cosine, ..s };
    assert_close(&[c.lr(9), c.lr(14)], &[0.5, 0.0], 1e-12, "cosine half-way and end");
    assert_eq!(Schedule { decay: Decay::Constant, ..s }.lr(100), 1.0);
}

/// Buckets that start during backward (`OverlappedBuckets`, small so there are many) sum
/// the same bits as `sync_grads` after backward, at 2x2.
#[test]
fn overlapped_buckets_sum_the_same_bits_as_sync_grads() {
    use redco_core::{GradStore, Placement};
    use redco_pipeline::data_parallel::OverlappedBuckets;
    let mesh: Mesh = "2x2".parse().unwrap();
    let plan = crate::rules::traced(LLAMA, mesh, false, true).unwrap();
    spmd_cpu(mesh, &SpmdOptions::default(), |rk| {
        let mut m = Lm::new(&rk.backend, LLAMA, DType::F32, 5)?;
        plan.apply(&mut m, Some(&rk.comm))?;
        let [ids, labels, mask] = dp_data(&rk.backend, LLAMA.vocab, 0)?;
        let params: Vec<Tensor<Cpu>> = m.named_parameters().into_iter().map(|(_, t)| t).collect();
        let loss = m.loss(&ids, Some(&mask), &labels)?;
        let mut after = loss.backward()?;
        sync_grads(Some(&rk.comm), &params, &mut after, 4096)?;
        rk.comm.reset_stats();
        let mut during = GradStore::new();
        let mut buckets = OverlappedBuckets::new(rk.comm.clone(), &params, 4096);
        loss.backward_into_with(&mut during, &mut |p, g| buckets.ready(p, g))?;
        buckets.finish(&mut during)?;
        let calls = rk.comm.stats().get(CollectiveKind::AllReduce, MeshAxis::Dp).calls;
        assert!(calls > 3, "{calls} buckets");
        for p in &params {
            let (a, b) = (after.get(p).unwrap(), during.get(p).unwrap());
            assert_eq!(b.placements().get(MeshAxis::Dp), Placement::Replicate);
            assert_eq!(a.placements(), b.placements());
            let bits = |t: &Tensor<Cpu>| t.local_to_host().unwrap().as_bytes().to_vec();
            assert!(bits(a) == bits(b), "a gradient differs");
        }
        Ok(())
    })
    .unwrap();
}
