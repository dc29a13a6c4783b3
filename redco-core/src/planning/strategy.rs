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
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ZeRO-{}, recompute {}", self.zero, self.recompute.name())?;
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
                let w = Workload { zero, recompute, ..*work };
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
                    strategy: Strategy { zero, recompute, offload: off },
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

/// The index of the row to run: the cheapest (bytes moved plus recomputed) of those that
/// fit, the first on a tie; `None` when none fits.
pub fn pick(rows: &[StrategyRow]) -> Option<usize> {
    rows.iter().enumerate().filter(|(_, r)| r.fits).min_by_key(|(i, r)| (r.cost(), *i)).map(|(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::planning::heuristics::plan_by_names;
    use crate::runtime::Mesh;
    use crate::Shape;

    fn llama(mesh: Mesh) -> (ShardPlan, ModelDims) {
        let (h, i, l, v) = (1536, 4096, 24, 32000);
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
            ModelDims { layers: l, hidden: h, heads: 16, kv_heads: 16, vocab: v, intermediate: i },
        )
    }

    #[test]
    fn the_pick_is_the_cheapest_that_fits_and_none_when_nothing_does() {
        // at dp=4 (at dp=2 in f32, ZeRO-2's master slices cost what its gradient slices save)
        let (plan, dims) = llama(Mesh { dp: 4, mp: 1 });
        let work = Workload { batch: 8, seq: 512, dtype_bytes: 4, zero: 0, recompute: Recompute::None };
        let all = strategies(&plan, &dims, &work, u64::MAX, 0, false);
        assert_eq!(all.len(), 12);
        // everything fits: nothing recomputed, no ZeRO (DDP's buckets move the fewest bytes)
        assert_eq!(all[pick(&all).unwrap()].strategy, Strategy { zero: 0, recompute: Recompute::None, offload: false });
        let peak = |s: Strategy| all.iter().find(|r| r.strategy == s).unwrap().memory.total();
        let (plain, zero, rec, both) = (
            peak(Strategy { zero: 0, recompute: Recompute::None, offload: false }),
            peak(Strategy { zero: 1, recompute: Recompute::None, offload: false }),
            peak(Strategy { zero: 0, recompute: Recompute::Block, offload: false }),
            peak(Strategy { zero: 1, recompute: Recompute::Block, offload: false }),
        );
        let (zero2, least) = (
            peak(Strategy { zero: 2, recompute: Recompute::None, offload: false }),
            peak(Strategy { zero: 2, recompute: Recompute::Block, offload: false }),
        );
        assert!(both < zero && both < rec && zero < plain && rec < plain);
        assert!(zero2 < zero && least < both && least < zero2);
        let (zero3, fsdp) = (
            peak(Strategy { zero: 3, recompute: Recompute::None, offload: false }),
            peak(Strategy { zero: 3, recompute: Recompute::Block, offload: false }),
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
            .find(|r| r.strategy == Strategy { zero: 0, recompute: Recompute::Block, offload: false })
            .unwrap();
        assert_eq!(r.recomputed_bytes, all[0].memory.activations - r.memory.activations);
        assert_eq!(r.comm_bytes, all[0].comm_bytes);
        // selective recompute sits between: less kept than with none, more than block, and
        // fewer bytes recomputed than block; a budget it fits (and none does not) picks it
        let row =
            |rc: Recompute| all.iter().find(|r| r.strategy == Strategy { zero: 0, recompute: rc, offload: false });
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
        let z2 =
            |off| with.iter().find(|r| r.strategy == Strategy { zero: 2, recompute: Recompute::None, offload: off });
        let (z2, z2off) = (z2(false).unwrap(), z2(true).unwrap());
        let dp = plan.mesh.dp as u64;
        assert_eq!(
            z2off.memory.total(),
            z2.memory.total() - z2.memory.optimizer + 4 * plan.bytes_per_rank(1) as u64 / dp
        );
        assert_eq!(z2off.host_bytes, 12 * plan.bytes_per_rank(1) as u64 / dp);
        let off = with
            .iter()
            .find(|r| r.strategy == Strategy { zero: 0, recompute: Recompute::None, offload: true })
            .unwrap();
        let n = plan.bytes_per_rank(1) as u64;
        assert_eq!(off.memory.total(), all[0].memory.total() - 8 * n);
        assert_eq!((off.comm_bytes, off.host_bytes), (all[0].comm_bytes + 8 * n, 12 * n));
        assert_eq!(
            with[pick(&with).unwrap()].strategy,
            Strategy { zero: 0, recompute: Recompute::None, offload: false }
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
        assert_eq!(rows[i].strategy, Strategy { zero: 0, recompute: Recompute::Block, offload: true });
        // on one data-parallel rank ZeRO is not offered
        let (one, _) = llama(Mesh { dp: 1, mp: 2 });
        assert!(strategies(&one, &dims, &work, u64::MAX, 0, false).iter().all(|r| r.strategy.zero == 0));
    }
}
