//! A rank's local shard cut once more over the data-parallel axis, as a flat buffer (the
//! ZeRO layout): the local shard's `n` elements, flattened and zero-padded to `dp * per`,
//! and the member at position `d` along `dp` owns elements `d * per .. (d + 1) * per`.
//! ZeRO-1 keeps the optimizer's moments this way, ZeRO-2 also the f32 masters and the
//! gradients. The padding is zeros in every slice and stays zero under any elementwise
//! optimizer (its gradient is zero).
//!
//! A local shard already split over `dp` (a mixture's stacked experts under expert
//! parallelism: each rank holds other experts) is not cut again: its rank holds it whole,
//! as a slicing over one member ([`FlatShard::of`]), and none of the methods communicates
//! for it.

use crate::runtime::Comm;
use crate::sharding::axis_index::own_chunk;
use crate::{Backend, MeshAxis, PartialOp, Placement, Placements, Result, Shape, Tensor};

/// Whether `t` is split over the data-parallel axis (each dp rank holds another part of
/// it: a mixture's experts under expert parallelism, a ZeRO-3 piece).
pub fn split_over_dp<B: Backend>(t: &Tensor<B>) -> bool {
    matches!(t.placements().get(MeshAxis::Dp), Placement::Shard(_))
}

/// Where a rank's local shard sits in its global tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardLayout {
    /// The global shape.
    pub shape: Shape,
    /// The local shard's shape.
    pub local: Shape,
    /// The placements.
    pub placements: Placements,
}

impl ShardLayout {
    /// `t`'s layout.
    pub fn of<B: Backend>(t: &Tensor<B>) -> Self {
        ShardLayout { shape: t.shape().clone(), local: t.local_shape().clone(), placements: t.placements() }
    }
}

/// The flat dp-slicing of a local shard of `n` elements over `dp` members.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlatShard {
    /// Elements of the local shard.
    pub n: usize,
    /// Elements of each member's slice (`n` divided by `dp`, rounded up).
    pub per: usize,
    /// Members along `dp`.
    pub dp: usize,
}

impl FlatShard {
    /// The slicing of a local shard of `n` elements over `dp` members.
    pub fn new(n: usize, dp: usize) -> Self {
        let dp = dp.max(1);
        FlatShard { n, per: n.div_ceil(dp), dp }
    }

    /// The slicing of `t`'s local shard over `comm`'s data-parallel axis; over one member
    /// (the rank keeps its local shard whole) when `t` is already split over `dp`.
    pub fn of<B: Backend>(t: &Tensor<B>, comm: &Comm<B>) -> Self {
        let dp = if split_over_dp(t) { 1 } else { comm.mesh().dp };
        FlatShard::new(t.local_shape().elem_count(), dp)
    }

    /// Elements of the padded flat buffer (`dp * per`).
    pub fn padded(&self) -> usize {
        self.per * self.dp
    }

    /// `t`'s local shard flattened and zero-padded to [`FlatShard::padded`] elements.
    pub(crate) fn flat<B: Backend>(&self, t: &Tensor<B>) -> Result<Tensor<B>> {
        let v = Tensor::from_storage(t.backend(), t.storage().clone(), [self.n], t.dtype());
        if self.padded() == self.n {
            return Ok(v);
        }
        Tensor::cat(&[&v, &Tensor::zeros(t.backend(), [self.padded() - self.n], t.dtype())?], 0)
    }

    /// This member's slice of `t`'s local shard (`[per]`, a plain local tensor), cut on the
    /// device from the rank's index along `dp`.
    pub fn own<B: Backend>(&self, comm: &Comm<B>, t: &Tensor<B>) -> Result<Tensor<B>> {
        let b = t.backend();
        if self.dp == 1 {
            return Ok(Tensor::from_storage(b, t.storage().clone(), [self.n], t.dtype()));
        }
        let s = own_chunk(comm, b, self.flat(t)?.storage(), &Shape::new([self.padded()]), 0, MeshAxis::Dp)?;
        Ok(Tensor::from_storage(b, s, [self.per], t.dtype()))
    }

    /// This member's slice of the sum over `dp` of `g` (one reduce-scatter when `g` is a
    /// partial sum over `dp`; the own slice when it is already summed).
    pub fn reduce_scatter<B: Backend>(&self, comm: &Comm<B>, g: &Tensor<B>) -> Result<Tensor<B>> {
        if self.dp == 1 && comm.mesh().dp > 1 && g.placements().get(MeshAxis::Dp) == Placement::Partial(PartialOp::Sum)
        {
            return Err(crate::Error::invalid(
                "FlatShard::reduce_scatter",
                "a gradient summed over dp for a tensor held whole by one member (split over dp): its rank's \
                 gradient must arrive whole",
            ));
        }
        if self.dp == 1 || g.placements().get(MeshAxis::Dp) != Placement::Partial(PartialOp::Sum) {
            return self.own(comm, g);
        }
        let bytes = self.padded() * g.dtype().size_in_bytes();
        let s = comm.reduce_scatter(MeshAxis::Dp, self.flat(g)?.storage(), bytes)?;
        Ok(Tensor::from_storage(g.backend(), s, [self.per], g.dtype()))
    }

    /// This member's slice `slice` (`[per]`, plain) as a piece of the padded flat buffer:
    /// global shape `[dp * per]`, split over `dp` (ZeRO-3 holds parameters so).
    pub fn piece<B: Backend>(&self, slice: &Tensor<B>) -> Tensor<B> {
        let placed = Placements::default().with(MeshAxis::Dp, Placement::Shard(0));
        let (shape, local) = (Shape::new([self.padded()]), Shape::new([self.per]));
        Tensor::from_local(slice.backend(), slice.storage().clone(), shape, local, placed, slice.dtype())
    }

    /// The members' slices gathered back into a local shard laid out as `like` (its global
    /// shape, local shape and placements, replicated over `dp`), in the slice's dtype: one
    /// all-gather of `slice` (its local storage).
    pub fn gather<B: Backend>(&self, comm: &Comm<B>, slice: &Tensor<B>, like: &ShardLayout) -> Result<Tensor<B>> {
        let b = slice.backend();
        if self.dp == 1 {
            // held whole by this rank: laid out as `like`, its placements kept
            let s = slice.storage().clone();
            return Ok(Tensor::from_local(
                b,
                s,
                like.shape.clone(),
                like.local.clone(),
                like.placements,
                slice.dtype(),
            ));
        }
        let bytes = self.padded() * slice.dtype().size_in_bytes();
        let full = comm.all_gather(MeshAxis::Dp, slice.storage(), bytes)?;
        let local =
            if self.padded() == self.n { full } else { b.narrow(&full, &Shape::new([self.padded()]), 0, 0, self.n)? };
        let placed = like.placements.with(MeshAxis::Dp, Placement::Replicate);
        Ok(Tensor::from_local(b, local, like.shape.clone(), like.local.clone(), placed, slice.dtype()))
    }
}
