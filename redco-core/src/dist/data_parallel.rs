//! Data parallelism: gradients that are partial sums over the data-parallel axis are
//! summed in flat buckets (few large all-reduces instead of one per parameter).

use super::Comm;
use crate::{Backend, GradStore, MeshAxis, PartialOp, Placement, Result, Shape, Tensor};

/// Default bucket size: 25 MB, as in PyTorch DDP.
pub const DEFAULT_BUCKET_BYTES: usize = 25 << 20;

/// Sums, over the data-parallel axis, every gradient of `params` that is a partial sum
/// there, packing them into buckets of about `bucket_bytes`. Afterwards each gradient is
/// replicated over `dp` (and keeps its model-parallel layout), over `comm`, the rank's
/// communicator. A no-op when no gradient is partial (one device, or dp = 1).
pub fn sync_grads<B: Backend>(
    comm: Option<&Comm<B>>,
    params: &[Tensor<B>],
    grads: &mut GradStore<B>,
    bucket_bytes: usize,
) -> Result<()> {
    let partial = Placement::Partial(PartialOp::Sum);
    let todo: Vec<Tensor<B>> = params
        .iter()
        .filter_map(|p| grads.get(p).filter(|g| g.placements().get(MeshAxis::Dp) == partial).map(|_| p.clone()))
        .collect();
    if todo.is_empty() {
        return Ok(());
    }
    let c = comm.ok_or_else(|| {
        crate::Error::invalid("sync_grads", "gradients are partial over dp but no communicator was given")
    })?;
    let mut bucket: Vec<Tensor<B>> = Vec::new();
    let mut bytes = 0;
    for p in todo {
        let g = grads.get(&p).expect("filtered above");
        bytes += g.local_shape().elem_count() * g.dtype().size_in_bytes();
        bucket.push(p);
        if bytes >= bucket_bytes {
            flush(c, &mut bucket, grads)?;
            bytes = 0;
        }
    }
    flush(c, &mut bucket, grads)
}

/// All-reduces one bucket: the gradients' local storages flattened and concatenated.
fn flush<B: Backend>(c: &super::Comm<B>, bucket: &mut Vec<Tensor<B>>, grads: &mut GradStore<B>) -> Result<()> {
    if bucket.is_empty() {
        return Ok(());
    }
    let gs: Vec<Tensor<B>> = bucket.iter().map(|p| grads.get(p).expect("in bucket").clone()).collect();
    let b = gs[0].backend().clone();
    // group by dtype would be needed for mixed buckets; gradients share the params' dtype
    let dt = gs[0].dtype();
    let sizes: Vec<usize> = gs.iter().map(|g| g.local_shape().elem_count()).collect();
    let total: usize = sizes.iter().sum();
    let flat_shapes: Vec<Shape> = sizes.iter().map(|&n| Shape::new([n])).collect();
    let parts: Vec<(&B::Storage, &Shape)> = gs.iter().zip(&flat_shapes).map(|(g, s)| (g.storage(), s)).collect();
    let flat = if parts.len() == 1 { gs[0].storage().clone() } else { b.cat(&parts, 0)? };
    let summed = c.all_reduce(MeshAxis::Dp, &flat, super::ReduceKind::Sum, total * dt.size_in_bytes())?;
    let mut off = 0;
    for (p, (g, n)) in bucket.iter().zip(gs.iter().zip(&sizes)) {
        let s = b.narrow(&summed, &Shape::new([total]), 0, off, *n)?;
        off += n;
        let placed = g.placements().with(MeshAxis::Dp, Placement::Replicate);
        grads.insert(p, Tensor::from_local(&b, s, g.shape().clone(), g.local_shape().clone(), placed, dt));
    }
    bucket.clear();
    Ok(())
}
