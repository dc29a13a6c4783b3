//! The trainer's [`ParamPlacer`]s: what a rank keeps of each parameter while its model is
//! built ([`RankPlacer`]: the plan's tensor-parallel shard, and under ZeRO-3 a unit
//! parameter's f32 piece, the whole tensor dropped before the next is made), and the
//! planning trace's ([`SharedByShape`]: parameters of one shape share one buffer, since the
//! trace reads the dataflow, not the values).

use redco_core::nn::ParamPlacer;
use redco_core::planning::plan::expert_index;
use redco_core::planning::ShardPlan;
use redco_core::runtime::Comm;
use redco_core::sharding::flat_shard::split_over_dp;
use redco_core::sharding::{FlatShard, ShardLayout};
use redco_core::{no_grad, Backend, DType, Error, MeshAxis, Result, Shape, Tensor};
use std::collections::BTreeMap;
use std::sync::Mutex;

/// A ZeRO-3 piece's slicing and its parameter's whole layout at this mesh.
pub(crate) type PieceLayouts = BTreeMap<String, (FlatShard, ShardLayout)>;

/// Whether `name` lies inside one of `units` (name prefixes from the root).
pub(crate) fn in_unit(units: &[String], name: &str) -> bool {
    units.iter().any(|u| name.strip_prefix(u.as_str()).is_some_and(|r| r.starts_with('.')))
}

/// A rank's placer: each trainable parameter is cut to the plan's shard over `mp` as it is
/// made, and a parameter of a ZeRO-3 unit further to this rank's f32 dp-piece (recorded,
/// so the training state takes it as the master). Frozen parameters are left whole (the
/// plan cuts them after the build).
pub(crate) struct RankPlacer<'a, B: Backend> {
    plan: &'a ShardPlan,
    comm: &'a Comm<B>,
    /// ZeRO-3's units (none below ZeRO-3).
    units: &'a [String],
    pieces: Mutex<PieceLayouts>,
}

impl<'a, B: Backend> RankPlacer<'a, B> {
    /// Cuts by `plan` over `comm`; parameters inside `units` become ZeRO-3 pieces.
    pub(crate) fn new(plan: &'a ShardPlan, comm: &'a Comm<B>, units: &'a [String]) -> Self {
        RankPlacer { plan, comm, units, pieces: Mutex::new(BTreeMap::new()) }
    }

    /// The pieces made, by parameter name.
    pub(crate) fn into_pieces(self) -> PieceLayouts {
        self.pieces.into_inner().unwrap_or_else(|p| p.into_inner())
    }
}

impl<B: Backend> ParamPlacer<B> for RankPlacer<'_, B> {
    fn place(&self, name: &str, _shape: &Shape, make: &mut dyn FnMut() -> Result<Tensor<B>>) -> Result<Tensor<B>> {
        let whole = make()?;
        if !whole.is_var() {
            return Ok(whole);
        }
        // an expert's tensor is stacked with the others of its layer once made: the stack
        // becomes the piece ([`ParamPlacer::place_stack`])
        self.keep(name, whole, expert_index(name).is_none())
    }

    fn expert_range(&self, stack: &str, count: usize) -> (usize, usize) {
        self.plan.expert_share(stack, count, self.comm.index_along(MeshAxis::Dp))
    }

    fn place_stack(&self, stack: &str, made: Tensor<B>) -> Result<Tensor<B>> {
        if !made.is_var() {
            return Ok(made);
        }
        self.keep(stack, made, true)
    }
}

impl<B: Backend> RankPlacer<'_, B> {
    /// What this rank keeps of trainable parameter `name`, made whole (or, for a stack of
    /// experts split over dp, as this rank's experts): the plan's shard, and with `piece`
    /// in a ZeRO-3 unit its f32 piece (recorded). A parameter split over dp (experts under
    /// expert parallelism) is this rank's alone: ZeRO-3 gathers nothing of it.
    fn keep(&self, name: &str, whole: Tensor<B>, piece: bool) -> Result<Tensor<B>> {
        let named = |e: Error| Error::Parameter { name: name.into(), msg: e.to_string() };
        let placed = self.plan.placements(name);
        let shard = match whole.placements() == placed {
            true => whole,
            false => whole.redistribute(placed).map_err(named)?.detach().into_var(),
        };
        if !piece || !in_unit(self.units, name) || split_over_dp(&shard) {
            return Ok(shard);
        }
        let flat = FlatShard::of(&shard, self.comm);
        let slice = no_grad(|| flat.own(self.comm, &shard.cast(DType::F32)?))?;
        let layout = ShardLayout::of(&shard);
        drop(shard);
        self.pieces.lock().unwrap_or_else(|p| p.into_inner()).insert(name.to_string(), (flat, layout));
        Ok(flat.piece(&slice).into_var())
    }
}

/// The planning trace's placer: the first parameter of each shape is made, and every later
/// one of that shape and dtype shares its buffer (a new variable of its own), so the traced
/// model holds one tensor per distinct shape, not the whole model.
pub(crate) struct SharedByShape<B: Backend> {
    made: Mutex<Vec<Tensor<B>>>,
}

impl<B: Backend> SharedByShape<B> {
    /// No parameter made yet.
    pub(crate) fn new() -> Self {
        SharedByShape { made: Mutex::new(Vec::new()) }
    }
}

impl<B: Backend> ParamPlacer<B> for SharedByShape<B> {
    fn shares_by_shape(&self) -> bool {
        true
    }

    fn place(&self, _name: &str, shape: &Shape, make: &mut dyn FnMut() -> Result<Tensor<B>>) -> Result<Tensor<B>> {
        let mut made = self.made.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = made.iter().find(|t| t.shape() == shape) {
            let shared = Tensor::from_storage(t.backend(), t.storage().clone(), shape.clone(), t.dtype());
            return Ok(shared.into_var());
        }
        let t = make()?;
        if t.shape() == shape && t.local_shape() == shape {
            made.push(t.clone());
        }
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redco_cpu::Cpu;

    #[test]
    fn shared_by_shape_makes_one_tensor_per_shape() {
        let b = Cpu::new(1);
        let p = SharedByShape::<Cpu>::new();
        let mut calls = 0;
        let mut make = |n: usize| {
            let mut f = || {
                calls += 1;
                Ok(Tensor::from_vec(&b, vec![n as f32; 6], [2, 3])?.into_var())
            };
            p.place("x", &Shape::new([2, 3]), &mut f)
        };
        let (a, c) = (make(1).unwrap(), make(2).unwrap());
        assert_eq!(calls, 1, "the second parameter of the shape is not made");
        assert_ne!(a.id(), c.id(), "each parameter is a variable of its own");
        assert_eq!(c.to_vec_f32().unwrap(), vec![1.0; 6], "it shares the first one's buffer");
        let mut other = || Ok(Tensor::from_vec(&b, vec![3.0f32; 4], [4])?.into_var());
        assert_eq!(p.place("y", &Shape::new([4]), &mut other).unwrap().to_vec_f32().unwrap(), vec![3.0; 4]);
    }
}
