//! ZeRO-2 and ZeRO-3 on the training path: the f32 masters and the gradients held as this
//! rank's dp-slices ([`FlatShard`]). Gradients are reduce-scattered as the backward pass
//! completes them ([`SliceOnReady`]), the global norm is taken over the slices
//! ([`slice_norm`]), and the compute copies are all-gathered from the updated slices
//! (the training state's refresh). Under ZeRO-3 the
//! parameters of the model's units (its blocks) are not kept whole at all: the model holds
//! the f32 pieces themselves and gathers a unit's just before it runs ([`UnitPieces`]).

use redco_core::nn::ParamGather;
use redco_core::ops::gather_unit::{finish_gather_unit, gather_unit, start_gather_unit, UnitPiece};
use redco_core::runtime::{Comm, Pending, ReduceKind};
use redco_core::sharding::{FlatShard, ShardLayout};
use redco_core::{no_grad, Backend, DType, GradStore, MeshAxis, Result, Tensor, TensorId};
use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;

/// A gather started ahead: the ids of the pieces it moves, and the collective in flight.
type Ahead<B> = (Vec<TensorId>, Pending<<B as Backend>::Storage>);

/// ZeRO-3's pieces: for each parameter of the model's units held in pieces, its slicing
/// and its whole layout; gathered over the rank's communicator in the compute dtype.
pub struct UnitPieces<B: Backend> {
    comm: Comm<B>,
    dtype: DType,
    layouts: BTreeMap<String, (FlatShard, ShardLayout)>,
    /// Consecutive units gathered together ([`ParamGather::units_per_gather`]).
    group: usize,
    /// The gather started ahead ([`ParamGather::prefetch`]): the pieces' ids and the
    /// collective in flight.
    ahead: Mutex<Option<Ahead<B>>>,
}

impl<B: Backend> UnitPieces<B> {
    /// Pieces gathered over `comm` in `dtype`, for the parameters in `layouts`, `group`
    /// consecutive units at a time (at least 1).
    pub fn new(comm: Comm<B>, dtype: DType, layouts: BTreeMap<String, (FlatShard, ShardLayout)>, group: usize) -> Self {
        UnitPieces { comm, dtype, layouts, group: group.max(1), ahead: Mutex::new(None) }
    }

    /// The slicing and whole layout of parameter `name`, when it is held in pieces.
    pub fn layout(&self, name: &str) -> Option<&(FlatShard, ShardLayout)> {
        self.layouts.get(name)
    }

    /// The whole f32 parameter `name` from its piece (for an export or a checkpoint read
    /// elsewhere): one all-gather, not recorded.
    pub fn whole_f32(&self, name: &str, piece: &Tensor<B>) -> Result<Tensor<B>> {
        match self.layouts.get(name) {
            Some((shard, layout)) => no_grad(|| shard.gather(&self.comm, piece, layout)),
            None => Ok(piece.clone()),
        }
    }
}

impl<B: Backend> ParamGather<B> for UnitPieces<B> {
    fn gather(&self, name: &str, piece: &Tensor<B>) -> Result<Tensor<B>> {
        match self.layouts.get(name) {
            Some((shard, layout)) => {
                let one = [UnitPiece { piece, shard: *shard, layout }];
                let mut whole = gather_unit(&one, &self.comm, self.dtype)?;
                whole.pop().ok_or_else(|| redco_core::Error::invalid("gather_unit", "no whole parameter"))
            }
            None => Ok(piece.clone()),
        }
    }

    /// The unit's pieces in one all-gather (and their gradients in one reduce-scatter);
    /// parameters not in pieces come back as they are.
    fn gather_all(&self, params: &[(String, Tensor<B>)]) -> Result<Vec<Tensor<B>>> {
        let held: Vec<UnitPiece<'_, B>> = params
            .iter()
            .filter_map(|(n, p)| {
                self.layouts.get(n).map(|(shard, layout)| UnitPiece { piece: p, shard: *shard, layout })
            })
            .collect();
        let ids: Vec<TensorId> = held.iter().map(|p| p.piece.id()).collect();
        let ahead = self.ahead.lock().unwrap_or_else(|p| p.into_inner()).take();
        let wholes = match ahead {
            Some((was, pending)) if was == ids => finish_gather_unit(&held, &self.comm, self.dtype, pending.wait()?)?,
            Some((_, pending)) => {
                // prefetched for other pieces: completed (every rank started it), then unused
                pending.wait()?;
                gather_unit(&held, &self.comm, self.dtype)?
            }
            None => gather_unit(&held, &self.comm, self.dtype)?,
        };
        let mut wholes = wholes.into_iter();
        params
            .iter()
            .map(|(n, p)| match self.layouts.contains_key(n) {
                true => wholes
                    .next()
                    .ok_or_else(|| redco_core::Error::invalid("gather_unit", "a whole parameter is missing")),
                false => Ok(p.clone()),
            })
            .collect()
    }

    /// Starts the unit's all-gather on the communicator's queue; the next
    /// [`ParamGather::gather_all`] of the same pieces takes it.
    fn prefetch(&self, params: &[(String, Tensor<B>)]) -> Result<()> {
        let held: Vec<UnitPiece<'_, B>> = params
            .iter()
            .filter_map(|(n, p)| {
                self.layouts.get(n).map(|(shard, layout)| UnitPiece { piece: p, shard: *shard, layout })
            })
            .collect();
        if held.is_empty() {
            return Ok(());
        }
        let mut ahead = self.ahead.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, earlier)) = ahead.take() {
            earlier.wait()?;
        }
        let pending = start_gather_unit(&held, &self.comm, self.dtype)?;
        *ahead = Some((held.iter().map(|p| p.piece.id()).collect(), pending));
        Ok(())
    }

    fn units_per_gather(&self) -> usize {
        self.group
    }
}

/// Reduce-scatters each gradient of the wanted parameters (in f32) as soon as the backward
/// pass completes it, and keeps only this rank's slice in the store: the full gradient is
/// dropped at once, so a rank never holds more than the gradients still being computed.
/// Hand [`SliceOnReady::ready`] to
/// [`backward_into_with`](redco_core::Tensor::backward_into_with) on the last micro-batch of a
/// step (earlier ones accumulate full gradients).
pub struct SliceOnReady<B: Backend> {
    comm: Comm<B>,
    wanted: HashSet<TensorId>,
}

impl<B: Backend> SliceOnReady<B> {
    /// Slices the gradients of `params` over `comm`'s data-parallel axis.
    pub fn new(comm: Comm<B>, params: &[Tensor<B>]) -> Self {
        SliceOnReady { comm, wanted: params.iter().map(Tensor::id).collect() }
    }

    /// `p`'s gradient in `grads` is complete: replaced by this rank's f32 slice of its sum
    /// over `dp`.
    pub fn ready(&mut self, p: &Tensor<B>, grads: &mut GradStore<B>) -> Result<()> {
        // (ZeRO-3's pieces, which get their slices from their gather's backward, are not
        // wanted; a gradient split over dp, an expert's, becomes the rank's whole shard)
        if !self.wanted.contains(&p.id()) {
            return Ok(());
        }
        let Some(g) = grads.remove(p) else { return Ok(()) };
        let slice = no_grad(|| {
            let g = if g.dtype() == DType::F32 { g } else { g.cast(DType::F32)? };
            FlatShard::of(p, &self.comm).reduce_scatter(&self.comm, &g)
        })?;
        grads.insert(p, slice);
        Ok(())
    }
}

/// The global L2 norm of gradient slices: `grads`' entries for `params` are dp-slices
/// (disjoint over `dp`); `split[i]` says whether `params[i]` is split over `mp` (its slices
/// add up over `mp` too) or replicated there (counted once). Two scalar all-reduces.
pub fn slice_norm<B: Backend>(
    comm: &Comm<B>,
    params: &[Tensor<B>],
    split: &[bool],
    grads: &GradStore<B>,
) -> Result<f64> {
    let Some(b) = params.first().map(|p| p.backend().clone()) else { return Ok(0.0) };
    // squares summed on the device (in f64 where the backend has it), read once
    let dt = if b.supports(DType::F64) { DType::F64 } else { DType::F32 };
    no_grad(|| {
        let zero = || Tensor::zeros(&b, [], dt);
        let (mut over_mp, mut once) = (zero()?, zero()?);
        for (p, &s) in params.iter().zip(split) {
            let Some(g) = grads.get(p) else { continue };
            let local = Tensor::from_storage(g.backend(), g.storage().clone(), g.local_shape().clone(), g.dtype());
            let sq = local.cast(dt)?.square()?.sum_all()?;
            if s {
                over_mp = over_mp.add(&sq)?;
            } else {
                once = once.add(&sq)?;
            }
        }
        let sum = |axis: MeshAxis, v: Tensor<B>| -> Result<Tensor<B>> {
            if comm.mesh().axis_size(axis) == 1 {
                return Ok(v);
            }
            let r = comm.all_reduce(axis, v.storage(), ReduceKind::Sum, dt.size_in_bytes())?;
            Ok(Tensor::from_storage(&b, r, [], dt))
        };
        let total = sum(MeshAxis::Mp, over_mp)?.add(&once)?;
        sum(MeshAxis::Dp, total)?.sqrt()?.to_scalar()
    })
}

/// Scales the gradient slices of `params` so that their global norm ([`slice_norm`]) is
/// at most `max_norm`; returns the norm before clipping (a non-finite one unchanged).
pub fn clip_slices<B: Backend>(
    comm: &Comm<B>,
    params: &[Tensor<B>],
    split: &[bool],
    grads: &mut GradStore<B>,
    max_norm: f64,
) -> Result<f64> {
    let norm = slice_norm(comm, params, split, grads)?;
    redco_core::optim::scale_to_norm(params, grads, norm, max_norm)?;
    Ok(norm)
}
