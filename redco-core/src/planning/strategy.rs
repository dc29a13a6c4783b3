//! Choosing the memory tools of a training run: for a plan on its mesh, every combination
//! of the tools redco has (ZeRO-1, 2 and 3 over `dp`, per-layer activation recompute, block
//! or selective, and on
//! a device backend optimizer offload to host memory) with its
//! predicted per-rank peak memory, the bytes it moves per step and the activation bytes it
//! recomputes, whether it fits a device budget, and the pick: among those that fit, the one
//! that moves and recomputes the fewest bytes (the tool's promise is that the user does not
//! configure this).

use super::planner::{predict_comm, train_memory, Memory, ModelDims, Workload};
use super::ShardPlan;
use crate::Recompute;
use std::fmt;

/// One combination of memory tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Strategy {
    /// ZeRO stage over `dp` (0 to 3).
    pub zero: u8,
    /// What each transformer layer recomputes in the backward pass.
    pub recompute: Recompute,
    /// The optimizer offloaded to host memory (its state and f32 host masters; the update
    /// on the host's cores).
    pub offload: bool,
    /// ZeRO-3's unit: consecutive decoder layers gathered (and recomputed) together
    /// ([`Workload::unit_layers`]); 1 below stage 3.
    pub unit_layers: usize,
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ZeRO-{}", self.zero)?;
        if self.unit_layers > 1 {
            write!(f, " ({} layers a unit)", self.unit_layers)?;
        }
        write!(f, ", recompute {}", self.recompute.name())?;
        if self.offload {
            write!(f, ", offload")?;
        }
        Ok(())
    }
}

/// A strategy with its predicted costs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StrategyRow {
    /// The strategy.
    pub strategy: Strategy,
    /// Per-rank training memory (its total is the predicted peak).
    pub memory: Memory,
    /// Bytes moved by one step's collectives, per rank.
    pub comm_bytes: u64,
    /// Activation bytes recomputed per step (those not kept), per rank.
    pub recomputed_bytes: u64,
    /// Host memory per rank beyond the device's (offload: the optimizer state and the f32
    /// host masters; 0 otherwise).
    pub host_bytes: u64,
    /// Whether the peak fits the budget.
    pub fits: bool,
}

impl StrategyRow {
    /// What the pick minimises: bytes moved plus bytes recomputed.
    pub fn cost(&self) -> u64 {
        self.comm_bytes.saturating_add(self.recomputed_bytes)
    }
}

/// Every strategy for `plan` (ZeRO only where `dp > 1`: on one data-parallel rank it
/// changes nothing; offload, at ZeRO-0, 2 and 3, only with `offload`: a device backend's), costed
/// for `work` (whose own `zero`/`recompute` are ignored) against `budget` bytes per rank;
/// `extra` bytes per rank are added to each peak (f32 master weights of a 16-bit run, say).
/// ZeRO-3 rows gather units of `work.unit_layers` layers where it is given (non-zero), and
/// otherwise of the planner's choice ([`unit_layers_for`]).
///
/// Offload takes the optimizer's moments and the f32 masters (of a 16-bit run; an f32
/// run's are its parameters) off the device, and moves each step's f32 gradients to the
/// host and the updated parameters back in the compute dtype: 4 + dtype bytes per local
/// parameter, counted with the bytes moved.
pub fn strategies(
    plan: &ShardPlan,
    dims: &ModelDims,
    work: &Workload,
    budget: u64,
    extra: u64,
    offload: bool,
) -> Vec<StrategyRow> {
    let zeros: &[u8] = if plan.mesh.dp > 1 { &[0, 1, 2, 3] } else { &[0] };
    let kept = train_memory(plan, dims, &Workload { recompute: Recompute::None, ..*work }, 0).activations;
    let local = plan.bytes_per_rank(1) as u64;
    let offloads: &[bool] = if offload { &[false, true] } else { &[false] };
    let mut rows = Vec::new();
    for &off in offloads {
        for &zero in zeros.iter().filter(|z| !off || **z != 1) {
            for recompute in [Recompute::None, Recompute::Selective, Recompute::Block] {
                let unit_layers = match (zero, work.unit_layers) {
                    (3, 0) => unit_layers_for(plan, dims, &Workload { zero, recompute, ..*work }, budget, extra),
                    (3, k) => k.clamp(1, dims.layers.max(1)),
                    _ => 1,
                };
                let w = Workload { zero, recompute, unit_layers, ..*work };
                let mut memory = train_memory(plan, dims, &w, zero);
                let mut comm_bytes = predict_comm(plan, dims, &w).entries().into_iter().map(|(_, _, c)| c.bytes).sum();
                let recomputed_bytes = kept.saturating_sub(memory.activations);
                let host_bytes = if off {
                    // the moments and (16-bit) the masters leave the device (ZeRO-3's f32
                    // pieces stay, counted with the parameters); at ZeRO-2 and 3 each rank's
                    // host holds and moves its dp-slice, and its device keeps the slice's
                    // compute copy (gathered into the parameters each step)
                    let mine = if zero >= 2 { local / plan.mesh.dp as u64 } else { local };
                    memory.optimizer = if zero >= 2 { work.dtype_bytes as u64 * mine } else { 0 };
                    comm_bytes += (4 + work.dtype_bytes as u64) * mine;
                    12 * mine
                } else {
                    0
                };
                let fits = memory.total().saturating_add(extra) <= budget;
                rows.push(StrategyRow {
                    strategy: Strategy { zero, recompute, offload: off, unit_layers },
                    memory,
                    comm_bytes,
                    recomputed_bytes,
                    host_bytes,
                    fits,
                });
            }
        }
    }
    rows
}

/// The collective size a ZeRO-3 unit reaches for: DDP's gradient bucket (25 MB), below
/// which a collective's fixed cost (a rendezvous of every rank, a message's latency) weighs
/// on what it moves.
pub const UNIT_TARGET_BYTES: u64 = crate::runtime::DEFAULT_BUCKET_BYTES as u64;

/// The layers of a ZeRO-3 unit the planner picks for `work` (its stage, recompute and
/// dtype) on `plan`: the fewest consecutive decoder layers whose gathered parameters (in
/// the compute dtype, on this rank's model-parallel part) reach [`UNIT_TARGET_BYTES`], at
/// most every layer; fewer where the run would then not fit `budget` (with `extra`), down
/// to one layer (a transformer block, FSDP's usual unit). The bytes moved are the same
/// for every size: a larger unit trades fewer, larger collectives for more parameters
/// whole at a time and, with recompute, longer recompute blocks.
pub fn unit_layers_for(plan: &ShardPlan, dims: &ModelDims, work: &Workload, budget: u64, extra: u64) -> usize {
    let layers = dims.layers.max(1);
    let per_layer = super::planner::local_elems(plan).0 * work.dtype_bytes as u64 / layers as u64;
    let want = UNIT_TARGET_BYTES.div_ceil(per_layer.max(1)).clamp(1, layers as u64) as usize;
    (1..=want)
        .rev()
        .find(|&k| {
            let w = Workload { zero: 3, unit_layers: k, ..*work };
            train_memory(plan, dims, &w, 3).total().saturating_add(extra) <= budget
        })
        .unwrap_or(1)
}

/// The index of the row to run: the cheapest (bytes moved plus recomputed) of those that
/// fit, the first on a tie; `None` when none fits.
pub fn pick(rows: &[StrategyRow]) -> Option<usize> {
    rows.iter().enumerate().filter(|(_, r)| r.fits).min_by_key(|(i, r)| (r.cost(), *i)).map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planning::heuristics::plan_by_names;
    use crate::runtime::{CollectiveKind, Mesh};
    use crate::{MeshAxis, Shape};

    fn llama(mesh: Mesh) -> (ShardPlan, ModelDims) {
        llama_of(mesh, (1536, 4096, 24, 32000))
    }

    /// A LLaMA of hidden size, intermediate size, layers and vocabulary `(h, i, l, v)`.
    fn llama_of(mesh: Mesh, (h, i, l, v): (usize, usize, usize, usize)) -> (ShardPlan, ModelDims) {
        let mut shapes = vec![("model.embed_tokens.weight".to_string(), Shape::new([v, h]))];
        for n in 0..l {
            let p = |s: &str| format!("model.layers.{n}.{s}.weight");
            for s in ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"] {
                shapes.push((p(s), Shape::new([h, h])));
            }
            shapes.push((p("mlp.gate_proj"), Shape::new([i, h])));
            shapes.push((p("mlp.up_proj"), Shape::new([i, h])));
            shapes.push((p("mlp.down_proj"), Shape::new([h, i])));
        }
        shapes.push(("lm_head.weight".to_string(), Shape::new([v, h])));
        (
            plan_by_names(&shapes, mesh),
            ModelDims { layers: l, hidden: h, heads: 16, kv_heads: 16, vocab: v, intermediate: i, moe: None },
        )
    }

    #[test]
    fn the_pick_is_the_cheapest_that_fits_and_none_when_nothing_does() {
        // at dp=4 (at dp=2 in f32, ZeRO-2's master slices cost what its gradient slices save)
        let (plan, dims) = llama(Mesh { dp: 4, mp: 1 });
        let work = Workload { batch: 8, seq: 512, dtype_bytes: 4, zero: 0, recompute: Recompute::None, unit_layers: 0 };
        let all = strategies(&plan, &dims, &work, u64::MAX, 0, false);
        assert_eq!(all.len(), 12);
        // everything fits: nothing recomputed, no ZeRO (DDP's buckets move the fewest bytes)
        assert_eq!(
            all[pick(&all).unwrap()].strategy,
            Strategy { zero: 0, recompute: Recompute::None, offload: false, unit_layers: 1 }
        );
        let peak = |s: Strategy| all.iter().find(|r| r.strategy == s).unwrap().memory.total();
        let (plain, zero, rec, both) = (
            peak(Strategy { zero: 0, recompute: Recompute::None, offload: false, unit_layers: 1 }),
            peak(Strategy { zero: 1, recompute: Recompute::None, offload: false, unit_layers: 1 }),
            peak(Strategy { zero: 0, recompute: Recompute::Block, offload: false, unit_layers: 1 }),
            peak(Strategy { zero: 1, recompute: Recompute::Block, offload: false, unit_layers: 1 }),
        );
        let (zero2, least) = (
            peak(Strategy { zero: 2, recompute: Recompute::None, offload: false, unit_layers: 1 }),
            peak(Strategy { zero: 2, recompute: Recompute::Block, offload: false, unit_layers: 1 }),
        );
        assert!(both < zero && both < rec && zero < plain && rec < plain);
        assert!(zero2 < zero && least < both && least < zero2);
        let (zero3, fsdp) = (
            peak(Strategy { zero: 3, recompute: Recompute::None, offload: false, unit_layers: 1 }),
            peak(Strategy { zero: 3, recompute: Recompute::Block, offload: false, unit_layers: 1 }),
        );
        // without recompute every layer is whole from its forward to its backward: the peak of
        // ZeRO-2 and one layer's two flat collective buffers (f32 here)
        let unit: u64 = plan
            .params
            .iter()
            .filter(|(n, _)| super::super::planner::is_unit_param(n))
            .map(|(_, p)| p.shape.elem_count() as u64)
            .sum();
        assert_eq!(zero3, zero2 + 2 * 4 * (unit / dims.layers as u64));
        assert!(fsdp < least && fsdp < zero3, "ZeRO-3 with recompute holds the least");
        // a budget between each peak picks the cheapest strategy under it
        for budget in [plain, zero.max(rec), zero.min(rec), both, zero2, least, zero3, fsdp] {
            let rows = strategies(&plan, &dims, &work, budget, 0, false);
            let i = pick(&rows).unwrap();
            assert!(rows[i].memory.total() <= budget);
            let cheaper_fit = rows.iter().any(|r| r.fits && r.cost() < rows[i].cost());
            assert!(!cheaper_fit, "budget {budget}: picked {}", rows[i].strategy);
        }
        assert_eq!(pick(&strategies(&plan, &dims, &work, fsdp - 1, 0, false)), None);
        // the recomputed bytes are the activations not kept; recompute moves bytes only under mp
        let r = all
            .iter()
            .find(|r| r.strategy == Strategy { zero: 0, recompute: Recompute::Block, offload: false, unit_layers: 1 })
            .unwrap();
        assert_eq!(r.recomputed_bytes, all[0].memory.activations - r.memory.activations);
        assert_eq!(r.comm_bytes, all[0].comm_bytes);
        // selective recompute sits between: less kept than with none, more than block, and
        // fewer bytes recomputed than block; a budget it fits (and none does not) picks it
        let row = |rc: Recompute| {
            all.iter().find(|r| r.strategy == Strategy { zero: 0, recompute: rc, offload: false, unit_layers: 1 })
        };
        let sel = row(Recompute::Selective).unwrap();
        assert!(sel.memory.activations < all[0].memory.activations && sel.memory.activations > r.memory.activations);
        assert!(sel.recomputed_bytes > 0 && sel.recomputed_bytes < r.recomputed_bytes);
        assert_eq!(sel.comm_bytes, all[0].comm_bytes);
        let rows = strategies(&plan, &dims, &work, sel.memory.total(), 0, false);
        let i = pick(&rows).unwrap();
        assert!(rows[i].strategy.recompute != Recompute::Block || rows[i].strategy.zero > 0, "{}", rows[i].strategy);
        // offload (a device backend's), f32: moments off the device, 8 bytes a parameter moved
        let with = strategies(&plan, &dims, &work, u64::MAX, 0, true);
        assert_eq!(with.len(), 21, "ZeRO-0, 2 and 3 with each recompute, offloaded");
        // offloaded at ZeRO-2: nothing of the optimizer's on the device, each rank's slice on its host
        let z2 = |off| {
            with.iter()
                .find(|r| r.strategy == Strategy { zero: 2, recompute: Recompute::None, offload: off, unit_layers: 1 })
        };
        let (z2, z2off) = (z2(false).unwrap(), z2(true).unwrap());
        let dp = plan.mesh.dp as u64;
        assert_eq!(
            z2off.memory.total(),
            z2.memory.total() - z2.memory.optimizer + 4 * plan.bytes_per_rank(1) as u64 / dp
        );
        assert_eq!(z2off.host_bytes, 12 * plan.bytes_per_rank(1) as u64 / dp);
        let off = with
            .iter()
            .find(|r| r.strategy == Strategy { zero: 0, recompute: Recompute::None, offload: true, unit_layers: 1 })
            .unwrap();
        let n = plan.bytes_per_rank(1) as u64;
        assert_eq!(off.memory.total(), all[0].memory.total() - 8 * n);
        assert_eq!((off.comm_bytes, off.host_bytes), (all[0].comm_bytes + 8 * n, 12 * n));
        assert_eq!(
            with[pick(&with).unwrap()].strategy,
            Strategy { zero: 0, recompute: Recompute::None, offload: false, unit_layers: 1 }
        );
        // in bf16 the f32 masters leave the device too: 12 bytes a parameter, 6 moved
        let bf16 = Workload { dtype_bytes: 2, ..work };
        let plain = strategies(&plan, &dims, &bf16, u64::MAX, 0, false);
        let with = strategies(&plan, &dims, &bf16, u64::MAX, 0, true);
        let off = with.iter().find(|r| r.strategy.offload && r.strategy.recompute == Recompute::None).unwrap();
        assert_eq!(off.memory.total(), plain[0].memory.total() - 12 * n);
        assert_eq!((off.comm_bytes, off.host_bytes), (plain[0].comm_bytes + 6 * n, 12 * n));
        // on one rank, a byte under the least of the others: offload (with recompute) is the pick
        let (single, _) = llama(Mesh { dp: 1, mp: 1 });
        let rows = strategies(&single, &dims, &work, u64::MAX, 0, true);
        let least = rows.iter().filter(|r| !r.strategy.offload).map(|r| r.memory.total()).min().unwrap();
        let rows = strategies(&single, &dims, &work, least - 1, 0, true);
        let i = pick(&rows).expect("offload fits where nothing else does");
        assert_eq!(rows[i].strategy, Strategy { zero: 0, recompute: Recompute::Block, offload: true, unit_layers: 1 });
        // on one data-parallel rank ZeRO is not offered
        let (one, _) = llama(Mesh { dp: 1, mp: 2 });
        assert!(strategies(&one, &dims, &work, u64::MAX, 0, false).iter().all(|r| r.strategy.zero == 0));
    }

    /// ZeRO-3's unit: one layer where a layer's parameters already make a 25 MB collective
    /// (the 0.7B bench model's 113 MB in f32); on a model of smaller layers the fewest
    /// layers that reach it, fewer under a budget the larger unit does not fit; the bytes
    /// moved the same for every unit, the collectives fewer, the peak higher.
    #[test]
    fn the_planner_picks_the_fewest_layers_a_unit_whose_collective_reaches_the_target() {
        let work = Workload { batch: 8, seq: 512, dtype_bytes: 4, zero: 0, recompute: Recompute::None, unit_layers: 0 };
        let (big, dims) = llama(Mesh { dp: 4, mp: 1 });
        assert!(strategies(&big, &dims, &work, u64::MAX, 0, false).iter().all(|r| r.strategy.unit_layers == 1));
        // hidden 512, intermediate 1376: 3.16M parameters a layer, 12.6 MB in f32, 6.3 MB in bf16
        let (plan, dims) = llama_of(Mesh { dp: 4, mp: 1 }, (512, 1376, 24, 32000));
        let layer = 4 * 512 * 512 + 3 * 512 * 1376;
        for (dtype_bytes, want) in [(4usize, 3usize), (2, 5)] {
            let bytes = (layer * dtype_bytes) as u64;
            assert!((want as u64 - 1) * bytes < UNIT_TARGET_BYTES && want as u64 * bytes >= UNIT_TARGET_BYTES);
            let w = Workload { dtype_bytes, ..work };
            for r in strategies(&plan, &dims, &w, u64::MAX, 0, false) {
                assert_eq!(r.strategy.unit_layers, if r.strategy.zero == 3 { want } else { 1 }, "{}", r.strategy);
            }
        }
        let at = |k: usize, recompute: Recompute| {
            let w = Workload { zero: 3, recompute, unit_layers: k, ..work };
            (train_memory(&plan, &dims, &w, 3).total(), predict_comm(&plan, &dims, &w))
        };
        for recompute in [Recompute::None, Recompute::Block, Recompute::Selective] {
            let ((one, c1), (three, c3)) = (at(1, recompute), at(3, recompute));
            assert!(three > one, "{recompute:?}: a unit of three layers holds more");
            let again = if recompute.on() { 2 } else { 1 };
            for kind in [CollectiveKind::AllGather, CollectiveKind::ReduceScatter] {
                let (a, b) = (c1.get(kind, MeshAxis::Dp), c3.get(kind, MeshAxis::Dp));
                assert_eq!(a.bytes, b.bytes, "{recompute:?} {kind:?}: the same bytes");
                let fewer = if kind == CollectiveKind::AllGather { (24 - 8) * again } else { 24 - 8 };
                assert_eq!(a.calls - b.calls, fewer, "{recompute:?} {kind:?}: 8 units instead of 24");
            }
            // a budget the unit of three does not fit, the unit of one does: one layer
            let rows = strategies(&plan, &dims, &work, one, 0, false);
            let row = rows.iter().find(|r| r.strategy.zero == 3 && r.strategy.recompute == recompute).unwrap();
            assert!(row.fits && row.strategy.unit_layers < 3, "{recompute:?}: {}", row.strategy);
            // pinned: as given
            let pinned = Workload { unit_layers: 2, ..work };
            let rows = strategies(&plan, &dims, &pinned, u64::MAX, 0, false);
            assert!(rows.iter().all(|r| r.strategy.unit_layers == if r.strategy.zero == 3 { 2 } else { 1 }));
        }
    }
}
