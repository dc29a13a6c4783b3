//! ZeRO-3's gather as a recorded op: a parameter held as this rank's piece (its f32 flat
//! dp-slice, [`FlatShard::piece`]) made whole for a unit's forward, in the compute dtype;
//! the backward reduce-scatters the whole parameter's gradient (in f32) into the piece's,
//! so each rank keeps only its slice of every gradient. The communicator is handed in.

use crate::autograd::{is_grad_enabled, no_grad};
use crate::runtime::Comm;
use crate::sharding::{FlatShard, ShardLayout};
use crate::{Backend, DType, Error, Result, Tensor};

/// The name the op records (the autograd keeps the data-parallel partial sum of a gradient
/// arriving at its output: the reduce-scatter sums it).
pub(crate) const GATHER_PIECE: &str = "gather_piece";

impl<B: Backend> Tensor<B> {
    /// This piece (`[dp * per]` split over `dp`, as [`FlatShard::piece`] makes it) of the
    /// parameter laid out as `layout`, cast to `dtype` and all-gathered over `comm`'s
    /// data-parallel axis: the whole local shard. Its gradient reaches the piece
    /// reduce-scattered over `dp`, in f32.
    pub fn gather_piece(
        &self,
        shard: FlatShard,
        comm: &Comm<B>,
        layout: &ShardLayout,
        dtype: DType,
    ) -> Result<Tensor<B>> {
        if self.local_shape().elem_count() != shard.per || self.shape().elem_count() != shard.padded() {
            return Err(Error::invalid(
                GATHER_PIECE,
                format!(
                    "a piece of {} elements over dp={} has {} ({} local)",
                    shard.n,
                    shard.dp,
                    self.shape(),
                    self.local_shape()
                ),
            ));
        }
        let b = self.backend().clone();
        let local = Tensor::from_storage(&b, self.storage().clone(), [shard.per], self.dtype());
        let whole = no_grad(|| shard.gather(comm, &local.cast(dtype)?, layout))?;
        if !is_grad_enabled() || !self.requires_grad() {
            return Ok(whole);
        }
        let comm = comm.clone();
        let piece = ShardLayout::of(self);
        let backward = move |g: &Tensor<B>| -> Result<Vec<Option<Tensor<B>>>> {
            let g = if g.dtype() == DType::F32 { g.clone() } else { g.cast(DType::F32)? };
            let s = shard.reduce_scatter(&comm, &g)?;
            let placed = piece.placements;
            Ok(vec![Some(Tensor::from_local(
                &b,
                s.storage().clone(),
                piece.shape.clone(),
                piece.local.clone(),
                placed,
                DType::F32,
            ))])
        };
        Ok(Tensor::from_op_placed(
            self.backend(),
            whole.storage().clone(),
            whole.shape().clone(),
            whole.local_shape().clone(),
            whole.placements(),
            dtype,
            GATHER_PIECE,
            &[self],
            backward,
        ))
    }
}
