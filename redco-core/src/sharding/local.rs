//! Local regions: a block that computes on each rank's piece as plain tensors and talks to
//! the other ranks itself (a mixture of experts sending tokens to the ranks that hold their
//! experts). [`Tensor::to_local`] enters one, [`Tensor::from_local_piece`] leaves it, and
//! [`Tensor::all_to_all_rows`] moves rows between ranks inside it; all three are
//! differentiable, so the gradients leave the region with the placements they need.

use super::redistribute::comm;
use crate::placement::{local_shape, without_partial};
use crate::{Backend, Error, MeshAxis, PartialOp, Placement, Placements, Result, Shape, Tensor};

impl<B: Backend> Tensor<B> {
    /// This rank's piece as a tensor of its own: unplaced, of the local shape, sharing the
    /// storage. `differs` names the mesh axes along which what each rank computes from its
    /// piece differs (those its data is split over): the gradient of a tensor replicated
    /// along such an axis is the sum of the ranks' gradients, a partial sum there; along the
    /// other axes the ranks compute the same thing and the gradient keeps the placement.
    /// A partial sum is summed first.
    pub fn to_local(&self, differs: &[MeshAxis]) -> Result<Tensor<B>> {
        let x = if self.placements() == without_partial(self.placements()) {
            self.clone()
        } else {
            self.redistribute(without_partial(self.placements()))?
        };
        let (shape, local, placed, dt) = (x.shape().clone(), x.local_shape().clone(), x.placements(), x.dtype());
        let mut grad_placed = placed;
        for &a in differs {
            if placed.get(a) == Placement::Replicate {
                grad_placed = grad_placed.with(a, Placement::Partial(PartialOp::Sum));
            }
        }
        let b = x.backend().clone();
        let bc = b.clone();
        Ok(Tensor::from_op_placed(
            &b,
            x.storage().clone(),
            local.clone(),
            local.clone(),
            Placements::REPLICATED,
            dt,
            "to_local",
            &[&x],
            move |g| {
                let g = if g.is_sharded() { g.redistribute(Placements::REPLICATED)? } else { g.clone() };
                let s = g.storage().clone();
                Ok(vec![Some(Tensor::from_local(&bc, s, shape.clone(), local.clone(), grad_placed, dt))])
            },
        ))
    }

    /// Wraps `local`, this rank's piece computed in a local region, as its part of the
    /// tensor of global `shape` laid out by `placements` (a partial sum where the ranks'
    /// pieces add up). `local` must have the local shape the placements give.
    pub fn from_local_piece(local: &Tensor<B>, shape: impl Into<Shape>, placements: Placements) -> Result<Tensor<B>> {
        let shape = shape.into();
        if local.is_sharded() {
            return Err(Error::invalid("from_local_piece", "the piece is itself placed over the mesh"));
        }
        let want = local_shape(&shape, placements, super::axis_sizes::<B>())?;
        if local.shape() != &want {
            return Err(Error::invalid(
                "from_local_piece",
                format!("a piece of shape {} for a tensor {shape} whose piece here is {want}", local.shape()),
            ));
        }
        let (b, dt, lshape) = (local.backend().clone(), local.dtype(), want.clone());
        let bc = b.clone();
        let whole = without_partial(placements);
        Ok(Tensor::from_op_placed(
            &b,
            local.storage().clone(),
            shape,
            want,
            placements,
            dt,
            "from_local_piece",
            &[local],
            move |g| {
                // the gradient of a partial sum is the same on every rank
                let g = if g.placements() == whole { g.clone() } else { g.redistribute(whole)? };
                Ok(vec![Some(Tensor::from_storage(&bc, g.storage().clone(), lshape.clone(), dt))])
            },
        ))
    }

    /// Rows of this local `[rows, ..]` tensor sent to the members of the group along
    /// `axis`: `send[j]` rows (in order) to member `j`; the result holds the `recv[j]` rows
    /// each member `j` sent here, in member order ([`crate::runtime::Comm::all_to_all`],
    /// counted). The gradient goes back the same way with the counts swapped.
    pub fn all_to_all_rows(&self, axis: MeshAxis, send: &[usize], recv: &[usize]) -> Result<Tensor<B>> {
        if self.is_sharded() || self.rank() == 0 {
            return Err(Error::invalid("all_to_all_rows", "rows of a local tensor of rank 1 or more are moved"));
        }
        let rows = self.dims()[0];
        if send.iter().sum::<usize>() != rows {
            return Err(Error::invalid("all_to_all_rows", format!("send counts {send:?} for {rows} rows")));
        }
        let c = comm::<B>("all_to_all_rows")?;
        let row: usize = self.dims()[1..].iter().product();
        let (dt, b) = (self.dtype(), self.backend().clone());
        let elems = |v: &[usize]| v.iter().map(|r| r * row).collect::<Vec<_>>();
        let bytes = rows * row * dt.size_in_bytes();
        let y = c.all_to_all(axis, self.storage(), &elems(send), &elems(recv), bytes)?;
        let mut dims = self.dims().to_vec();
        dims[0] = recv.iter().sum();
        let (send_b, recv_b) = (send.to_vec(), recv.to_vec());
        Ok(Tensor::from_op(&b, y, Shape::new(dims), dt, "all_to_all_rows", &[self], move |g| {
            Ok(vec![Some(g.all_to_all_rows(axis, &recv_b, &send_b)?)])
        }))
    }
}

impl<B: Backend> Tensor<B> {
    /// The same local tensor, whose gradient is summed over the group along `axis` (one
    /// counted all-reduce in the backward pass: Megatron's `f`). What a value computed
    /// alike on every rank of `axis` needs where its gradient comes back as a partial sum
    /// there (the routing weights of experts split over `mp`).
    pub fn grad_summed_over(&self, axis: MeshAxis) -> Result<Tensor<B>> {
        if self.is_sharded() {
            return Err(Error::invalid("grad_summed_over", "a local tensor is expected"));
        }
        let b = self.backend().clone();
        Ok(Tensor::from_op(
            &b,
            self.storage().clone(),
            self.shape().clone(),
            self.dtype(),
            "grad_summed_over",
            &[self],
            move |g| {
                let c = comm::<B>("grad_summed_over")?;
                let bytes = g.elem_count() * g.dtype().size_in_bytes();
                let s = c.all_reduce(axis, g.storage(), crate::runtime::ReduceKind::Sum, bytes)?;
                Ok(vec![Some(Tensor::from_storage(g.backend(), s, g.shape().clone(), g.dtype()))])
            },
        ))
    }
}

/// This rank's position along `axis` and the axis's size (`(0, 1)` outside an SPMD run).
pub fn mesh_position<B: Backend>(axis: MeshAxis) -> (usize, usize) {
    crate::backend::comm::current_comm::<B>().map(|c| (c.index_along(axis), c.mesh().axis_size(axis))).unwrap_or((0, 1))
}

/// Every member's `v` along `axis`, in member order: a small host vector (counts) shared
/// with one counted all-gather through `b`. All members pass vectors of one length.
pub fn all_gather_counts<B: Backend>(b: &B, axis: MeshAxis, v: &[i64]) -> Result<Vec<Vec<i64>>> {
    let (_, n) = mesh_position::<B>(axis);
    if n == 1 {
        return Ok(vec![v.to_vec()]);
    }
    let c = comm::<B>("all_gather_counts")?;
    let s = b.upload(&crate::HostData::I64(v.to_vec()))?;
    let all = b.download(&c.all_gather(axis, &s, v.len() * n * 8)?)?.to_i64_vec()?;
    if all.len() != v.len() * n {
        return Err(Error::invalid(
            "all_gather_counts",
            format!("{} counts from {n} members of {}", all.len(), v.len()),
        ));
    }
    Ok(all.chunks(v.len().max(1)).map(<[i64]>::to_vec).collect())
}
