//! Rank-dependent values computed on the device from the rank's index along a mesh axis
//! ([`Comm::axis_index`]), never from a host constant: the chunk of a buffer a rank keeps,
//! the partial-sum seed that only the first member contributes, the offset of a rank's
//! slice of a split dimension. One traced program then serves every rank of a compiled
//! SPMD step (the index comes from the device's replica id there), and eager backends
//! compute the same values they computed from the host index before.

use crate::backend::comm::Comm;
use crate::backend::CmpOp;
use crate::{Backend, DType, Error, MeshAxis, Result, Shape, Tensor};

/// The dtype rank arithmetic runs in: f64 where the backend has it, else f32 (exact for
/// offsets below 2^24).
pub(crate) fn index_dtype<B: Backend>(b: &B) -> DType {
    if b.supports(DType::F64) {
        DType::F64
    } else {
        DType::F32
    }
}

/// This rank's chunk of `x` (local shape `shape`) along `d`: chunk `i` of the axis size
/// `k` equal chunks, `i` being the rank's index along `axis`. `d` must split `k` ways.
pub(crate) fn own_chunk<B: Backend>(
    c: &Comm<B>,
    b: &B,
    x: &B::Storage,
    shape: &Shape,
    d: usize,
    axis: MeshAxis,
) -> Result<B::Storage> {
    let k = c.mesh().axis_size(axis);
    let (outer, n, inner) = shape.split_at_dim(d);
    if !n.is_multiple_of(k) {
        return Err(Error::invalid("shard", format!("dim {d} of {shape} does not split {k} ways")));
    }
    if k == 1 {
        return Ok(x.clone());
    }
    // [outer, k, n / k * inner]: the rank's chunk is one contiguous row per outer index
    let i = c.axis_index(b, axis)?;
    b.index_select(x, &Shape::new([outer, k, n / k * inner]), 1, &i, 1)
}

/// `x` (`n` elements of `dtype`) on the first member along `axis`, zeros on the others:
/// a replicated value turned into a partial sum.
pub(crate) fn on_first_only<B: Backend>(
    c: &Comm<B>,
    b: &B,
    x: &B::Storage,
    n: usize,
    dtype: DType,
    axis: MeshAxis,
) -> Result<B::Storage> {
    let fd = index_dtype(b);
    let i = b.cast(&c.axis_index(b, axis)?, 1, fd)?;
    let zero = b.full(1, 0.0, fd)?;
    let one = Shape::new([1]);
    let first = b.compare(CmpOp::Eq, (&i, &one), (&zero, &one), &one)?;
    let zeros = b.full(1, 0.0, dtype)?;
    b.where_cond((&first, &one), (x, &Shape::new([n])), (&zeros, &one), &Shape::new([n]))
}

/// `index * stride` as a 0-d tensor of [`index_dtype`], `index` being the rank's position
/// along `axis`: where the rank's slice of a dimension split into `stride`-sized parts
/// starts.
pub(crate) fn axis_offset<B: Backend>(c: &Comm<B>, b: &B, axis: MeshAxis, stride: usize) -> Result<Tensor<B>> {
    let i = Tensor::from_storage(b, c.axis_index(b, axis)?, Shape::new([]), DType::I64);
    i.cast(index_dtype(b))?.scale(stride as f64)
}
