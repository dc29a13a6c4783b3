//! The planner: for a model, a plan and a mesh, the bytes every rank holds, the
//! communication of one training step, a memory estimate for training and inference, and
//! the smallest model-parallel size that fits a device. Redco users guess
//! `n_model_shards` by trial; ours are told.

use super::plan::{Role, ShardPlan};
use crate::runtime::collective::{CollectiveKind, CommCount, CommStats};
use crate::runtime::Mesh;
use crate::runtime::DEFAULT_BUCKET_BYTES;
use crate::Recompute;
use crate::{MeshAxis, Placement};
use std::fmt;

/// The sizes of a transformer that the estimates need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelDims {
    /// Transformer layers.
    pub layers: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Attention heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// The MLP's intermediate size (its gate and up projections' outputs).
    pub intermediate: usize,
    /// The mixture of experts in place of the MLP of some layers (`None`: a dense model).
    pub moe: Option<MoeDims>,
}

/// The sizes of a mixture of experts that the estimates need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MoeDims {
    /// Experts per layer.
    pub experts: usize,
    /// Experts each token goes to.
    pub top_k: usize,
    /// Layers whose MLP is a mixture of experts.
    pub layers: usize,
    /// Each expert's intermediate size.
    pub intermediate: usize,
}

/// The workload the estimates are for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Workload {
    /// Global batch size (split over `dp`).
    pub batch: usize,
    /// Sequence length.
    pub seq: usize,
    /// Bytes per parameter and activation element (4 for f32, 2 for bf16).
    pub dtype_bytes: usize,
    /// ZeRO stage over `dp`: 0 (nothing sharded), 1 (AdamW's moments), 2 (the f32
    /// masters, the moments and the gradients), 3 (also the parameters of the decoder
    /// layers, gathered per unit of [`Workload::unit_layers`] layers: [`is_unit_param`]).
    pub zero: u8,
    /// What each transformer layer recomputes in the backward pass (activation
    /// checkpointing): nothing, the whole layer (one hidden state kept per layer, one more
    /// forward per layer) or its cheap ops (the outputs of its matmuls, attention and
    /// all-reduces kept).
    pub recompute: Recompute,
    /// ZeRO-3's unit: how many consecutive decoder layers are gathered together (one
    /// collective, prefetched together) and, with recompute, recomputed as one block. The
    /// estimates read 0 as 1; handed to [`strategies`](super::strategy::strategies), 0
    /// leaves it to the planner.
    pub unit_layers: usize,
}

impl Workload {
    /// The layers of a ZeRO-3 unit where stage `zero` on `dp` ranks gathers units (at
    /// least 1, at most `layers`); 1 otherwise.
    pub fn unit_layers_at(&self, zero: u8, dp: usize, layers: usize) -> usize {
        if zero == 3 && dp > 1 {
            self.unit_layers.clamp(1, layers.max(1))
        } else {
            1
        }
    }
}

/// Per-rank memory estimate in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Memory {
    /// Parameters.
    pub params: u64,
    /// Gradients.
    pub grads: u64,
    /// AdamW moments (f32), and the f32 master weights where they are not the parameters
    /// (a 16-bit run, or ZeRO-2's slices).
    pub optimizer: u64,
    /// Activations kept for backward.
    pub activations: u64,
}

impl Memory {
    /// The sum (at most `u64::MAX`: sizes that large are refused by whoever reports them).
    pub fn total(&self) -> u64 {
        self.params.saturating_add(self.grads).saturating_add(self.optimizer).saturating_add(self.activations)
    }
}

/// Everything the planner reports.
#[derive(Debug, Clone)]
pub struct PlanReport {
    /// The plan.
    pub plan: ShardPlan,
    /// Model sizes.
    pub dims: ModelDims,
    /// Workload.
    pub work: Workload,
    /// Predicted communication of one training step (per rank).
    pub comm: CommStats,
    /// Training memory per rank, with the optimizer as configured.
    pub train: Memory,
    /// Training memory per rank at the other ZeRO stages (0, 1, 2 where `dp > 1`), as
    /// (stage, memory).
    pub train_other: Vec<(u8, Memory)>,
    /// Inference memory per rank: parameters plus the KV cache at `batch x seq`.
    pub infer: u64,
}

fn count(pl: Placement) -> bool {
    matches!(pl, Placement::Shard(_))
}

/// Whether parameter `name` belongs to a decoder layer (a ZeRO-3 unit: Hugging Face's
/// `model.layers.N.`, `model.decoder.layers.N.`, `transformer.h.N.`).
pub fn is_unit_param(name: &str) -> bool {
    unit_of(name).is_some()
}

/// The unit (decoder layer) parameter `name` belongs to: its name up to the layer's index
/// (`model.layers.3`), or `None` outside the layers.
pub fn unit_of(name: &str) -> Option<&str> {
    layer_of(name).map(|(_, _, end)| &name[..end])
}

/// The decoder layer parameter `name` belongs to: the layers' prefix (`model.layers`), the
/// layer's index, and where its name ends in `name`; `None` outside the layers.
fn layer_of(name: &str) -> Option<(&str, usize, usize)> {
    let at = ["layers.", "transformer.h."].iter().find_map(|k| name.find(k).map(|i| i + k.len()))?;
    let digits = name[at..].bytes().take_while(u8::is_ascii_digit).count();
    let index = name[at..at + digits].parse().ok()?;
    Some((&name[..at - 1], index, at + digits))
}

/// The ZeRO-3 unit parameter `name` belongs to when units are `k` consecutive layers: the
/// layers' prefix and the unit's index (layer index / `k`); `None` outside the layers.
pub fn unit_group(name: &str, k: usize) -> Option<(&str, usize)> {
    layer_of(name).map(|(prefix, i, _)| (prefix, i / k.max(1)))
}

/// Elements of `plan`'s local shards per rank: (in decoder layers, elsewhere), the experts
/// split over dp (expert parallelism, [`own_expert_elems`]) in neither.
pub(crate) fn local_elems(plan: &ShardPlan) -> (u64, u64) {
    let (mut unit, mut other) = (0u64, 0u64);
    for (name, p) in &plan.params {
        let n = p.shape.elem_count() as u64 / if count(p.placement) { plan.mesh.mp as u64 } else { 1 };
        if plan.ep > 1 && super::plan::is_expert_param(name) {
            continue;
        }
        if is_unit_param(name) {
            unit += n;
        } else {
            other += n;
        }
    }
    (unit, other)
}

/// Elements of the experts a rank holds as its own under expert parallelism (split over
/// dp: ZeRO neither slices nor gathers them); 0 without it.
pub(crate) fn own_expert_elems(plan: &ShardPlan) -> u64 {
    if plan.ep <= 1 {
        return 0;
    }
    let mp = |p: &super::ParamPlan| if count(p.placement) { plan.mesh.mp as u64 } else { 1 };
    let experts = plan.params.iter().filter(|(name, _)| super::plan::is_expert_param(name));
    experts.map(|(_, p)| p.shape.elem_count() as u64 / mp(p) / plan.ep as u64).sum()
}

/// Predicts one training step's collectives for `plan`.
///
/// Model-parallel axis (Megatron): one all-reduce of `local_batch x seq x hidden` per pair
/// plus one per vocabulary-split lookup table in the forward pass, one per pair plus one
/// per vocabulary-split head in the backward pass, and three all-reduces of
/// `local_batch x seq` scalars per vocabulary-split head (max, sum, target logit).
/// Data-parallel axis: one scalar all-reduce (the token count of the mean loss), then the
/// gradients summed in 25 MB buckets, or, with ZeRO-1 and ZeRO-2, a reduce-scatter (of the
/// f32 gradient) and an all-gather per parameter (ZeRO-1: of the f32 master; ZeRO-2: of
/// the compute copy, in the compute dtype) of its local shard padded to a multiple of
/// `dp`; ZeRO-3 gathers a unit's parameters (one flat buffer per unit of
/// [`Workload::unit_layers`] decoder layers) for its forward, and again for its
/// recomputation, and reduce-scatters their gradients once. Gradient clipping's norm (one scalar all-reduce per axis) is not counted.
/// A mixture of experts on `dp` > 1 gathers its router's counts per layer, and with the
/// experts split over `dp` ([`ShardPlan::ep`]) sends each token's slots to their experts
/// and back with four all-to-alls per layer (two in backward); those experts' gradients
/// are not summed over `dp`; with its experts split over `mp` by the rules, a layer is one
/// pair, and its routing weights' gradient (an f32 per token and chosen expert) is summed
/// over `mp` in backward. The load-balancing loss's one scalar all-reduce is not counted.
pub fn predict_comm(plan: &ShardPlan, dims: &ModelDims, work: &Workload) -> CommStats {
    let mesh = plan.mesh;
    let mut st = CommStats::default();
    let local_batch = work.batch / mesh.dp;
    let act = (local_batch * work.seq * dims.hidden * work.dtype_bytes) as u64;
    let tok = (local_batch * work.seq * work.dtype_bytes) as u64;
    if mesh.mp > 1 {
        let n = |r: Role| {
            plan.params
                .iter()
                .filter(|(name, p)| p.role == r && count(p.placement) && !super::plan::is_expert_param(name))
                .count() as u64
        };
        // a mixture whose experts the rules split: one pair per layer (the experts' partial
        // outputs summed once, after the combine), and in backward the routing weights'
        // gradient summed (one f32 per token and chosen expert)
        let split_experts =
            plan.params.iter().any(|(name, p)| super::plan::is_expert_param(name) && count(p.placement));
        let moe_pairs = match dims.moe {
            Some(m) if split_experts => m.layers as u64,
            _ => 0,
        };
        let (rows, tables, heads) = (n(Role::Row) + moe_pairs, n(Role::VocabTable), n(Role::VocabHead));
        if let Some(m) = dims.moe.filter(|_| split_experts) {
            // the routing weights are f32 (f64 in an f64 model)
            let weights = (local_batch * work.seq * m.top_k * work.dtype_bytes.max(4)) as u64;
            for _ in 0..m.layers {
                st.record(CollectiveKind::AllReduce, MeshAxis::Mp, weights);
            }
        }
        // a layer recomputed whole runs its forward twice: once more each row-parallel
        // all-reduce (selective recompute keeps their results)
        let again = if work.recompute == Recompute::Block { rows } else { 0 };
        for _ in 0..(2 * rows + again + tables + heads) {
            st.record(CollectiveKind::AllReduce, MeshAxis::Mp, act);
        }
        for _ in 0..3 * heads {
            st.record(CollectiveKind::AllReduce, MeshAxis::Mp, tok);
        }
    }
    if let Some(moe) = dims.moe.filter(|_| mesh.dp > 1) {
        // each mixture-of-experts layer's forward (run again under recompute): the
        // router's counts gathered over dp (every choice and the token count, i64), and
        // with the experts split, each expert's slot count; then the slots sent to their
        // experts and the outputs back, and in backward both again the other way. A rank
        // sends all its slots in the dispatch and in the combine's backward; what it sends
        // in the combine and the dispatch's backward is what it received, which routing
        // decides: the prediction is the balanced share, and the sum over dp is exact.
        let runs = if work.recompute.on() { 2 } else { 1 };
        let slots = (local_batch * work.seq * moe.top_k * dims.hidden * work.dtype_bytes) as u64;
        let gathered = |n: usize| (n * 8 * mesh.dp) as u64;
        for _ in 0..moe.layers * runs {
            st.record(CollectiveKind::AllGather, MeshAxis::Dp, gathered(moe.top_k * moe.experts + 1));
            if plan.ep > 1 {
                st.record(CollectiveKind::AllGather, MeshAxis::Dp, gathered(moe.experts));
                st.record(CollectiveKind::AllToAll, MeshAxis::Dp, slots);
                st.record(CollectiveKind::AllToAll, MeshAxis::Dp, slots);
            }
        }
        if plan.ep > 1 {
            for _ in 0..moe.layers {
                st.record(CollectiveKind::AllToAll, MeshAxis::Dp, slots);
                st.record(CollectiveKind::AllToAll, MeshAxis::Dp, slots);
            }
        }
    }
    if mesh.dp > 1 {
        let k = work.unit_layers_at(work.zero, mesh.dp, dims.layers);
        st.record(CollectiveKind::AllReduce, MeshAxis::Dp, work.dtype_bytes as u64);
        // experts split over dp (expert parallelism) have whole gradients on their rank:
        // nothing to sum, nothing for ZeRO to slice
        let local: Vec<(u64, Option<(&str, usize)>)> = plan
            .params
            .iter()
            .filter(|(name, _)| plan.ep <= 1 || !super::plan::is_expert_param(name))
            .map(|(name, p)| {
                let n = p.shape.elem_count() as u64;
                (if count(p.placement) { n / mesh.mp as u64 } else { n }, unit_group(name, k))
            })
            .collect();
        if work.zero > 0 {
            let gathered = if work.zero == 1 { 4 } else { work.dtype_bytes as u64 };
            // ZeRO-3 moves a unit's parameters together (one flat buffer): the padded
            // elements of each parameter summed per unit of `k` layers
            let mut units: std::collections::BTreeMap<(&str, usize), u64> = Default::default();
            let mut singles = Vec::new();
            for (n, unit) in local {
                let padded = n.div_ceil(mesh.dp as u64) * mesh.dp as u64;
                match unit {
                    Some(u) if work.zero == 3 => *units.entry(u).or_default() += padded,
                    _ => singles.push(padded),
                }
            }
            let again = if work.recompute.on() { 2 } else { 1 };
            let moves = units.values().map(|&n| (n, again)).chain(singles.into_iter().map(|n| (n, 1)));
            for (padded, times) in moves {
                st.record(CollectiveKind::ReduceScatter, MeshAxis::Dp, padded * 4);
                for _ in 0..times {
                    st.record(CollectiveKind::AllGather, MeshAxis::Dp, padded * gathered);
                }
            }
        } else {
            let local = local.into_iter().map(|(n, _)| n);
            let mut bucket = 0u64;
            for n in local {
                bucket += n * work.dtype_bytes as u64;
                if bucket >= DEFAULT_BUCKET_BYTES as u64 {
                    st.record(CollectiveKind::AllReduce, MeshAxis::Dp, bucket);
                    bucket = 0;
                }
            }
            if bucket > 0 {
                st.record(CollectiveKind::AllReduce, MeshAxis::Dp, bucket);
            }
        }
    }
    st
}

/// Training memory per rank. Activations follow Korthikanti et al. (2022), per layer
/// `s*b*h*(10 + 24/t + 5*a*s/(h*t))` bytes at 2-byte precision, scaled to `dtype_bytes`;
/// with block recompute, each block (a layer; under ZeRO-3 a unit of
/// [`Workload::unit_layers`] layers) keeps only its input (`s*b*h` elements) and one
/// block's activations live at a time, during its recomputation; with selective
/// recompute, each layer keeps its input and the outputs of its matmuls, attention and
/// all-reduces ([`selective_kept`]), and one block's recomputed rest is live at a time. ZeRO stage `zero`: 1 divides the
/// moments by `dp`; 2 also the f32 masters and the gradients (kept as f32 slices, plus one
/// layer's full gradients in flight during backward); 3 also the decoder layers'
/// parameters, held as f32 slices (they are the masters) and gathered per unit: three
/// units whole at a time with recompute (the one running, the one being differentiated
/// and the next one's prefetched gather), every layer whole from its forward to its
/// backward without; plus one unit's flat collective buffers (the gathered buffer its
/// parameters are cut from, its gradients packed for the reduce-scatter) and its full
/// gradients in flight.
pub fn train_memory(plan: &ShardPlan, dims: &ModelDims, work: &Workload, zero: u8) -> Memory {
    let mesh = plan.mesh;
    let params = plan.bytes_per_rank(work.dtype_bytes) as u64;
    let n_local = params / work.dtype_bytes as u64;
    let dp = if zero > 0 { mesh.dp as u64 } else { 1 };
    // ZeRO's slices over dp: of everything but the experts a rank holds as its own
    let own = own_expert_elems(plan);
    let sliced = (n_local - own) / dp + own;
    let moments = 2 * 4 * sliced;
    // f32 masters: the parameters themselves in an f32 run below stage 2
    let masters = match (zero, work.dtype_bytes) {
        (2 | 3, _) => 4 * sliced,
        (_, 4) => 0,
        _ => 4 * n_local,
    };
    let layer = params / dims.layers.max(1) as u64;
    // ZeRO-3's unit: `k` consecutive layers gathered (and recomputed) together
    let k = work.unit_layers_at(zero, mesh.dp, dims.layers) as u64;
    let mut grads = if zero >= 2 && mesh.dp > 1 { 4 * sliced + k * layer } else { params };
    let (params, masters) = if zero == 3 && mesh.dp > 1 {
        // (the own experts are neither: f32 masters and compute copies, as at stage 2)
        let (unit, other) = local_elems(plan);
        let db = work.dtype_bytes as u64;
        // with recompute, three units whole at a time: the one running, the one being
        // differentiated and the next one's gather started ahead (the prefetch)
        let layers = dims.layers.max(1) as u64;
        let whole = if work.recompute.on() { (3 * k).min(layers) * unit / layers } else { unit };
        // the flat buffers of one unit's collectives beside what they carry: the gathered
        // buffer its parameters are cut from, and its f32 gradients packed for the
        // reduce-scatter (measured on the 0.7B bench model at 4x1: without these two
        // terms the prediction was 0.90x the run's peak heap)
        let flat = k * unit / layers;
        grads += 4 * flat;
        // pieces (the units' masters), the others' compute copies, the units gathered
        (4 * unit / dp + (other + own) * db + (whole + flat) * db, 4 * (other / dp + own))
    } else {
        (params, masters)
    };
    let (s, b, h, a, t) =
        (work.seq as f64, (work.batch / mesh.dp).max(1) as f64, dims.hidden as f64, dims.heads as f64, mesh.mp as f64);
    let per_layer = s * b * h * (10.0 + 24.0 / t + 5.0 * a * s / (h * t)) * work.dtype_bytes as f64 / 2.0;
    let logits = s * b * dims.vocab as f64 / t * 4.0;
    let layers = dims.layers as f64;
    // a recompute block is a unit: its input kept, its `k` layers live while it reruns
    let (blocks, k) = ((dims.layers as u64).div_ceil(k) as f64, k as f64);
    let kept = match work.recompute {
        Recompute::None => per_layer * layers,
        Recompute::Block => s * b * h * work.dtype_bytes as f64 * blocks + k * per_layer,
        Recompute::Selective => {
            let sel = s * b * selective_kept(dims, mesh.mp) * work.dtype_bytes as f64;
            sel * layers + k * (per_layer - sel).max(0.0)
        }
    };
    // a mixture of experts keeps, per token and chosen expert, the slot's input and output
    // and its gate, up and activated products (on top of the dense formula's MLP share,
    // which this overestimates); under block recompute only one layer's are live
    let experts = dims.moe.map_or(0.0, |m| {
        let per = s * b * m.top_k as f64 * (2.0 * h + 3.0 * m.intermediate as f64) * work.dtype_bytes as f64;
        per * if work.recompute == Recompute::Block { k.min(m.layers as f64) } else { m.layers as f64 }
    });
    Memory { params, grads, optimizer: moments + masters, activations: (kept + logits + experts) as u64 }
}

/// Elements per token one layer keeps under selective recompute on `mp` tensor-parallel
/// ranks: its input, the outputs of the column-parallel projections (queries, keys,
/// values, gate, up; split over `mp`) and of the attention, and the two row-parallel
/// outputs (whole, and again once all-reduced when `mp > 1`).
pub fn selective_kept(dims: &ModelDims, mp: usize) -> f64 {
    let (h, t) = (dims.hidden as f64, mp.max(1) as f64);
    let kv = h * dims.kv_heads as f64 / dims.heads.max(1) as f64;
    let column = (h + 2.0 * kv + 2.0 * dims.intermediate as f64) / t;
    let rows = if mp > 1 { 4.0 * h } else { 2.0 * h };
    h + column + h / t + rows
}

/// Inference memory per rank: parameters plus a KV cache of `batch x seq` tokens with the
/// key/value heads split over `mp`.
pub fn infer_memory(plan: &ShardPlan, dims: &ModelDims, work: &Workload) -> u64 {
    let head_dim = dims.hidden / dims.heads;
    let kv_local = (dims.kv_heads / plan.mesh.mp).max(1);
    let cache = [dims.layers, work.batch, work.seq, kv_local, head_dim, work.dtype_bytes]
        .iter()
        .fold(2u128, |acc, &x| acc.saturating_mul(x as u128));
    (plan.bytes_per_rank(work.dtype_bytes) as u128).saturating_add(cache).min(u64::MAX as u128) as u64
}

impl PlanReport {
    /// Builds the report for `plan`.
    pub fn new(plan: ShardPlan, dims: ModelDims, work: Workload) -> Self {
        let comm = predict_comm(&plan, &dims, &work);
        let train = train_memory(&plan, &dims, &work, work.zero);
        let stages: &[u8] = if plan.mesh.dp > 1 { &[0, 1, 2] } else { &[0] };
        let train_other =
            stages.iter().filter(|z| **z != work.zero).map(|&z| (z, train_memory(&plan, &dims, &work, z))).collect();
        let infer = infer_memory(&plan, &dims, &work);
        PlanReport { plan, dims, work, comm, train, train_other, infer }
    }
}

/// The smallest `mp` (dividing the heads, at most `max_mp`) whose plan, made by
/// `make_plan(mesh)`, fits `device_bytes` for training (`train = true`) or inference, with
/// `dp` data-parallel ranks; `None` when even `max_mp` does not fit.
pub fn smallest_mp(
    dims: &ModelDims,
    work: &Workload,
    dp: usize,
    max_mp: usize,
    device_bytes: u64,
    train: bool,
    make_plan: impl Fn(Mesh) -> ShardPlan,
) -> Option<(usize, u64)> {
    (1..=max_mp).filter(|m| dims.heads.is_multiple_of(*m) && dims.kv_heads.is_multiple_of(*m)).find_map(|mp| {
        let plan = make_plan(Mesh { dp, mp });
        let need =
            if train { train_memory(&plan, dims, work, work.zero).total() } else { infer_memory(&plan, dims, work) };
        (need <= device_bytes).then_some((mp, need))
    })
}

/// The smallest mesh (the fewest ranks, at most `max_ranks`) whose plan fits `device_bytes`
/// for training (`train = true`) or inference, for a mixture of experts: `dp` ranks that
/// split the experts between them (expert parallelism, `ep = dp`) times `mp` ranks
/// dividing the heads; `make_plan(mesh)` gives the plan with the experts split (`None`
/// where they do not split over that `dp`), and the global batch must split over `dp`.
/// Among meshes of one size, the one needing the least memory per device. Returns the
/// mesh and its bytes per device.
pub fn smallest_mesh(
    dims: &ModelDims,
    work: &Workload,
    max_ranks: usize,
    device_bytes: u64,
    train: bool,
    make_plan: impl Fn(Mesh) -> Option<ShardPlan>,
) -> Option<(Mesh, u64)> {
    (1..=max_ranks).find_map(|n| {
        (1..=n)
            .filter(|dp| n.is_multiple_of(*dp) && work.batch.is_multiple_of(*dp))
            .map(|dp| Mesh { dp, mp: n / dp })
            .filter(|m| dims.heads.is_multiple_of(m.mp) && dims.kv_heads.is_multiple_of(m.mp))
            .filter_map(|m| {
                let plan = make_plan(m)?;
                let need = if train {
                    train_memory(&plan, dims, work, work.zero).total()
                } else {
                    infer_memory(&plan, dims, work)
                };
                (need <= device_bytes).then_some((m, need))
            })
            .min_by_key(|(_, need)| *need)
    })
}

/// `bytes` in human units.
pub fn human(bytes: u64) -> String {
    let b = bytes as f64;
    if b >= 1e9 {
        format!("{:.2} GB", b / 1e9)
    } else if b >= 1e6 {
        format!("{:.2} MB", b / 1e6)
    } else if b >= 1e3 {
        format!("{:.1} kB", b / 1e3)
    } else {
        format!("{bytes} B")
    }
}

impl fmt::Display for PlanReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mesh = self.plan.mesh;
        writeln!(f, "{:<52} {:<16} {:<14} {:>12}", "parameter", "shape", "placement", "per device")?;
        // the experts of a layer's mixture, one row per projection: `*` for the expert
        let mut experts: std::collections::BTreeMap<String, (usize, &super::ParamPlan)> = Default::default();
        for (name, p) in &self.plan.params {
            if let Some(i) = super::plan::expert_index(name) {
                let starred = name.replacen(&format!("experts.{i}."), "experts.*.", 1);
                experts.entry(starred).or_insert((0, p)).0 += 1;
                continue;
            }
            let local = match p.placement {
                Placement::Shard(_) => p.shape.elem_count() / mesh.mp,
                _ => p.shape.elem_count(),
            } * self.work.dtype_bytes;
            let pl = match p.placement {
                Placement::Shard(d) => format!("split dim {d}"),
                _ => "replicated".into(),
            };
            writeln!(f, "{name:<52} {:<16} {pl:<14} {:>12}   {}", p.shape.to_string(), human(local as u64), p.reason)?;
        }
        let ep = self.plan.ep.max(1);
        for (name, (n, p)) in experts {
            let each = match p.placement {
                Placement::Shard(_) => p.shape.elem_count() / mesh.mp,
                _ => p.shape.elem_count(),
            };
            let local = (n / ep) * each * self.work.dtype_bytes;
            let split = match p.placement {
                Placement::Shard(d) => format!(", dim {d} split"),
                _ => String::new(),
            };
            let pl = if ep > 1 {
                format!("{} per rank{split}", n / ep)
            } else if split.is_empty() {
                "replicated".into()
            } else {
                format!("all{split}")
            };
            let shape = format!("{n} x {}", p.shape);
            let why =
                if ep > 1 { format!("{n} experts split over {ep} ranks of dp (--ep {ep})") } else { p.reason.clone() };
            writeln!(f, "{name:<52} {shape:<16} {pl:<14} {:>12}   {why}", human(local as u64))?;
        }
        writeln!(f)?;
        writeln!(
            f,
            "communication per training step (mesh {mesh}, batch {}, seq {}):",
            self.work.batch, self.work.seq
        )?;
        if self.comm.total_calls() == 0 {
            writeln!(f, "  none")?;
        }
        for (k, a, CommCount { calls, bytes }) in self.comm.entries() {
            writeln!(f, "  {k:?} over {a:?}: {calls} calls, {}", human(bytes))?;
        }
        writeln!(f)?;
        let m = &self.train;
        let o = &self.train_other;
        writeln!(
            f,
            "memory per device, training (AdamW{}{}):",
            if self.work.zero > 0 { format!(", ZeRO-{}", self.work.zero) } else { String::new() },
            match self.work.recompute {
                Recompute::None => "",
                Recompute::Block => ", each layer recomputed",
                Recompute::Selective => ", each layer's cheap ops recomputed",
            }
        )?;
        writeln!(
            f,
            "  params {}  grads {}  optimizer {}  activations {}  total {}",
            human(m.params),
            human(m.grads),
            human(m.optimizer),
            human(m.activations),
            human(m.total())
        )?;
        for (z, o) in o {
            writeln!(f, "  (at ZeRO-{z}: total {})", human(o.total()))?;
        }
        writeln!(
            f,
            "memory per device, inference with a KV cache of {} x {} tokens: {}",
            self.work.batch,
            self.work.seq,
            human(self.infer)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planning::heuristics::plan_by_names;
    use crate::Shape;

    #[test]
    fn recompute_keeps_one_hidden_state_per_layer_and_one_layer_of_activations() {
        // a 0.7B-class LLaMA at sequence 512
        let dims = ModelDims {
            layers: 24,
            hidden: 1536,
            heads: 16,
            kv_heads: 16,
            vocab: 32000,
            intermediate: 4096,
            moe: None,
        };
        let shapes = vec![("model.embed_tokens.weight".to_string(), Shape::new([32000, 1536]))];
        let plan = plan_by_names(&shapes, Mesh { dp: 1, mp: 1 });
        let work = Workload { batch: 4, seq: 512, dtype_bytes: 4, zero: 0, recompute: Recompute::None, unit_layers: 1 };
        let kept = train_memory(&plan, &dims, &work, 0);
        let again = train_memory(&plan, &dims, &Workload { recompute: Recompute::Block, ..work }, 0);
        let (s, b, h) = (512.0, 4.0, 1536.0);
        let per_layer = s * b * h * (10.0 + 24.0 + 5.0 * 16.0 * s / h) * 4.0 / 2.0;
        let logits = s * b * 32000.0 * 4.0;
        assert_eq!(kept.activations, (per_layer * 24.0 + logits) as u64);
        assert_eq!(again.activations, (s * b * h * 4.0 * 24.0 + per_layer + logits) as u64);
        // the layers' share of activations shrinks more than tenfold; the rest is unchanged
        let layers = |m: &Memory| m.activations as f64 - logits;
        assert!(layers(&kept) / layers(&again) > 10.0, "{kept:?} {again:?}");
        assert_eq!((kept.params, kept.grads, kept.optimizer), (again.params, again.grads, again.optimizer));
    }

    #[test]
    fn selective_recompute_keeps_the_matmul_outputs_of_every_layer() {
        let dims = ModelDims {
            layers: 24,
            hidden: 1536,
            heads: 16,
            kv_heads: 16,
            vocab: 32000,
            intermediate: 4096,
            moe: None,
        };
        let shapes = vec![("model.embed_tokens.weight".to_string(), Shape::new([32000, 1536]))];
        let (s, b, h, i) = (512.0, 4.0, 1536.0, 4096.0);
        for mp in [1, 2] {
            let plan = plan_by_names(&shapes, Mesh { dp: 1, mp });
            let work = Workload {
                batch: 4,
                seq: 512,
                dtype_bytes: 4,
                zero: 0,
                recompute: Recompute::Selective,
                unit_layers: 1,
            };
            let t = mp as f64;
            let logits = s * b * 32000.0 / t * 4.0;
            // input, q k v attention out over mp, gate and up over mp, o and down (and their all-reduced copies)
            let per_token = h + 4.0 * h / t + 2.0 * i / t + if mp > 1 { 4.0 * h } else { 2.0 * h };
            assert_eq!(selective_kept(&dims, mp), per_token);
            let sel = train_memory(&plan, &dims, &work, 0).activations as f64 - logits;
            let none = train_memory(&plan, &dims, &Workload { recompute: Recompute::None, ..work }, 0).activations;
            let block = train_memory(&plan, &dims, &Workload { recompute: Recompute::Block, ..work }, 0).activations;
            let per_layer = s * b * h * (10.0 + 24.0 / t + 5.0 * 16.0 * s / (h * t)) * 2.0;
            assert!((sel - (s * b * per_token * 4.0 * 23.0 + per_layer)).abs() < 2.0, "mp {mp}: {sel}");
            assert!(sel < none as f64 - logits && sel > block as f64 - logits, "mp {mp}");
        }
    }
}
