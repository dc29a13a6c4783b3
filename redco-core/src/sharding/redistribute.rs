//! Redistribution: moving a tensor between placements through the rank's communicator,
//! as a differentiable op whose backward is the conjugate move (all-reduce <-> identity,
//! all-gather <-> reduce-scatter or slice).

use super::axis_index::{on_first_only, own_chunk};
use crate::backend::comm::{current_comm, Comm};
use crate::placement::{local_shape, without_partial};
use crate::runtime::ReduceKind;
use crate::{Backend, Error, MeshAxis, PartialOp, Placement, Placements, Result, Shape, Tensor};

/// The communicator of this thread, or an error naming `op` (a sharded tensor is only
/// meaningful inside an SPMD run).
pub(crate) fn comm<B: Backend>(op: &'static str) -> Result<Comm<B>> {
    current_comm::<B>().ok_or_else(|| match B::comm_slot() {
        Some(_) => Error::invalid(op, "a sharded tensor is used outside an SPMD run (no communicator on this thread)"),
        None => Error::unsupported(
            op,
            format!(
                "backend type `{}` declares no communicator slot (`redco_core::comm_slot!`), so it runs single-rank ops only",
                std::any::type_name::<B>()
            ),
        ),
    })
}

/// `[dp, mp]` sizes of the current run (`[1, 1]` outside one).
pub fn axis_sizes<B: Backend>() -> [usize; 2] {
    current_comm::<B>().map(|c| [c.mesh().dp, c.mesh().mp]).unwrap_or([1, 1])
}

const AXES: [MeshAxis; 2] = [MeshAxis::Dp, MeshAxis::Mp];

/// One rank's shard in flight: storage, local shape, placements.
struct Local<B: Backend> {
    s: B::Storage,
    local: Shape,
    p: Placements,
}

/// Splits `local` around `d` into (outer, size, inner).
fn around(local: &Shape, d: usize) -> (usize, usize, usize) {
    local.split_at_dim(d)
}

fn step<B: Backend>(b: &B, c: &Comm<B>, x: Local<B>, axis: MeshAxis, to: Placement) -> Result<Local<B>> {
    let from = x.p.get(axis);
    if from == to {
        return Ok(x);
    }
    let k = c.mesh().axis_size(axis);
    let bytes = |shape: &Shape, s: &B::Storage| shape.elem_count() * b.storage_dtype(s).size_in_bytes();
    let with = |x: &Local<B>, s: B::Storage, local: Shape| Local { s, local, p: x.p.with(axis, to) };
    match (from, to) {
        (Placement::Shard(d), Placement::Replicate) => {
            let (outer, n, inner) = around(&x.local, d);
            let full = x.local.with_dim(d, n * k);
            let g = c.all_gather(axis, &x.s, bytes(&full, &x.s))?;
            let g = if outer > 1 { b.permute(&g, &Shape::new([k, outer, n * inner]), &[1, 0, 2])? } else { g };
            Ok(with(&x, g, full))
        }
        (Placement::Partial(op), Placement::Replicate) => {
            let kind = if op == PartialOp::Sum { ReduceKind::Sum } else { ReduceKind::Max };
            let s = c.all_reduce(axis, &x.s, kind, bytes(&x.local, &x.s))?;
            Ok(with(&x, s, x.local.clone()))
        }
        (Placement::Partial(PartialOp::Sum), Placement::Shard(d)) => {
            let (outer, n, inner) = around(&x.local, d);
            if n % k != 0 {
                return Err(Error::invalid(
                    "reduce_scatter",
                    format!("dim {d} of {} does not split {k} ways", x.local),
                ));
            }
            let arranged = if outer > 1 {
                b.permute(&x.s, &Shape::new([outer, k, n / k * inner]), &[1, 0, 2])?
            } else {
                x.s.clone()
            };
            let s = c.reduce_scatter(axis, &arranged, bytes(&x.local, &x.s))?;
            Ok(with(&x, s, x.local.with_dim(d, n / k)))
        }
        // the rank's own chunk and the first member's seed come from its index on the
        // device, so a traced step is the same program on every rank
        (Placement::Replicate, Placement::Shard(d)) => {
            let s = own_chunk(c, b, &x.s, &x.local, d, axis)?;
            let n = x.local.dims()[d];
            Ok(with(&x, s, x.local.with_dim(d, n / k)))
        }
        (Placement::Replicate, Placement::Partial(PartialOp::Sum)) => {
            let s = on_first_only(c, b, &x.s, x.local.elem_count(), b.storage_dtype(&x.s), axis)?;
            Ok(with(&x, s, x.local.clone()))
        }
        // Everything else goes through Replicate.
        (_, _) => {
            let r = step(b, c, x, axis, Placement::Replicate)?;
            step(b, c, r, axis, to)
        }
    }
}

impl<B: Backend> Tensor<B> {
    /// This tensor laid out as `target`, moving data through the current communicator
    /// (every call counted in `CommStats`). Differentiable: the gradient moves back with
    /// the conjugate collective.
    pub fn redistribute(&self, target: Placements) -> Result<Tensor<B>> {
        if self.placements() == target {
            return Ok(self.clone());
        }
        let c = comm::<B>("redistribute")?;
        let b = self.backend();
        // selective recompute keeps a redistribution's result rather than moving it again
        let expect = local_shape(self.shape(), target, [c.mesh().dp, c.mesh().mp])?;
        let (s, local) = crate::recompute::kept("redistribute", expect.elem_count(), || {
            let mut x = Local { s: self.storage().clone(), local: self.local_shape().clone(), p: self.placements() };
            for axis in AXES {
                x = step(b, &c, x, axis, target.get(axis))?;
            }
            Ok((x.s, x.local))
        })?;
        let x: Local<B> = Local { s, local, p: target };
        debug_assert_eq!(x.local, expect);
        let from = self.placements();
        Ok(Tensor::from_op_placed(
            b,
            x.s,
            self.shape().clone(),
            x.local,
            target,
            self.dtype(),
            "redistribute",
            &[self],
            move |g| Ok(vec![Some(g.redistribute(without_partial(from))?)]),
        ))
    }

    /// This tensor replicated on every axis.
    pub fn replicate(&self) -> Result<Tensor<B>> {
        self.redistribute(Placements::REPLICATED)
    }

    /// A replicated tensor split along `dim` over `axis` (a local slice, no communication).
    pub fn shard_along(&self, axis: MeshAxis, dim: usize) -> Result<Tensor<B>> {
        self.redistribute(self.placements().with(axis, Placement::Shard(dim)))
    }
}

/// The inputs, each replicated: the always-correct layout for an op without a sharding
/// rule (the gathers show up in `CommStats` and the plan report).
pub(crate) fn replicate_all<B: Backend, const N: usize>(ts: [&Tensor<B>; N]) -> Result<[Tensor<B>; N]> {
    let mut out = Vec::with_capacity(N);
    for t in ts {
        out.push(t.replicate()?);
    }
    Ok(out.try_into().unwrap_or_else(|_| unreachable!()))
}
