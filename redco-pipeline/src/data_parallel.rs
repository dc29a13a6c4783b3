//! Data parallelism: gradients that are partial sums over the data-parallel axis are
//! summed in flat buckets (few large all-reduces instead of one per parameter).

use redco_core::runtime::Comm;
use redco_core::{Backend, GradStore, MeshAxis, PartialOp, Placement, Result, Tensor};

pub use redco_core::runtime::DEFAULT_BUCKET_BYTES;

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
        redco_core::Error::invalid("sync_grads", "gradients are partial over dp but no communicator was given")
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
fn flush<B: Backend>(
    c: &redco_core::runtime::Comm<B>,
    bucket: &mut Vec<Tensor<B>>,
    grads: &mut GradStore<B>,
) -> Result<()> {
    if bucket.is_empty() {
        return Ok(());
    }
    let pairs: Vec<(Tensor<B>, Tensor<B>)> =
        bucket.iter().map(|p| (p.clone(), grads.get(p).expect("in bucket").clone())).collect();
    bucket.clear();
    start_bucket(c, pairs)?.land(grads)
}

/// A bucket whose all-reduce has started: its (parameter, gradient) pairs and the pending
/// sums of the gradients' local storages, reduced as one flat buffer.
struct InFlight<B: Backend> {
    pairs: Vec<(Tensor<B>, Tensor<B>)>,
    sums: redco_core::runtime::Pending<Vec<B::Storage>>,
}

fn start_bucket<B: Backend>(
    c: &redco_core::runtime::Comm<B>,
    pairs: Vec<(Tensor<B>, Tensor<B>)>,
) -> Result<InFlight<B>> {
    let b = pairs[0].1.backend().clone();
    // gradients share the parameters' dtype
    let dt = pairs[0].1.dtype();
    let xs: Vec<(B::Storage, usize)> =
        pairs.iter().map(|(_, g)| (g.storage().clone(), g.local_shape().elem_count())).collect();
    let bytes = xs.iter().map(|x| x.1).sum::<usize>() * dt.size_in_bytes();
    let sums = c.all_reduce_bucket_async(&b, MeshAxis::Dp, &xs, redco_core::runtime::ReduceKind::Sum, bytes)?;
    Ok(InFlight { pairs, sums })
}

impl<B: Backend> InFlight<B> {
    /// Waits for the sums and stores each gradient's, replicated over `dp`.
    fn land(self, grads: &mut GradStore<B>) -> Result<()> {
        let sums = self.sums.wait()?;
        if sums.len() != self.pairs.len() {
            return Err(redco_core::Error::invalid(
                "sync_grads",
                format!("a bucket of {} gradients came back as {} sums", self.pairs.len(), sums.len()),
            ));
        }
        for ((p, g), s) in self.pairs.iter().zip(sums) {
            let placed = g.placements().with(MeshAxis::Dp, Placement::Replicate);
            let b = g.backend();
            grads.insert(p, Tensor::from_local(b, s, g.shape().clone(), g.local_shape().clone(), placed, g.dtype()));
        }
        Ok(())
    }
}

/// Data-parallel gradient buckets that start their all-reduce during the backward pass:
/// hand [`OverlappedBuckets::ready`] to
/// [`backward_into_with`](redco_core::Tensor::backward_into_with), then call
/// [`OverlappedBuckets::finish`]. Gradients join a bucket as they become complete (the
/// same order on every rank); a full bucket starts at once, so the transport moves it
/// while the rest of backward computes. The sums are the same bits as [`sync_grads`]'s.
pub struct OverlappedBuckets<B: Backend> {
    comm: Comm<B>,
    bucket_bytes: usize,
    wanted: std::collections::HashSet<redco_core::TensorId>,
    open: Vec<(Tensor<B>, Tensor<B>)>,
    open_bytes: usize,
    inflight: Vec<InFlight<B>>,
}

impl<B: Backend> OverlappedBuckets<B> {
    /// Buckets of about `bucket_bytes` for the gradients of `params`, over `comm`.
    pub fn new(comm: Comm<B>, params: &[Tensor<B>], bucket_bytes: usize) -> Self {
        OverlappedBuckets {
            comm,
            bucket_bytes,
            wanted: params.iter().map(Tensor::id).collect(),
            open: Vec::new(),
            open_bytes: 0,
            inflight: Vec::new(),
        }
    }

    /// `p`'s gradient in `grads` is complete: it joins the open bucket (when it is a
    /// partial sum over `dp`), which starts when full.
    pub fn ready(&mut self, p: &Tensor<B>, grads: &GradStore<B>) -> Result<()> {
        if !self.wanted.contains(&p.id()) {
            return Ok(());
        }
        let Some(g) = grads.get(p).filter(|g| g.placements().get(MeshAxis::Dp) == Placement::Partial(PartialOp::Sum))
        else {
            return Ok(());
        };
        self.open_bytes += g.local_shape().elem_count() * g.dtype().size_in_bytes();
        self.open.push((p.clone(), g.clone()));
        if self.open_bytes >= self.bucket_bytes {
            self.start()?;
        }
        Ok(())
    }

    fn start(&mut self) -> Result<()> {
        if !self.open.is_empty() {
            let pairs = std::mem::take(&mut self.open);
            self.inflight.push(start_bucket(&self.comm, pairs)?);
        }
        self.open_bytes = 0;
        Ok(())
    }

    /// Starts the last bucket, waits for every bucket in order and stores the summed
    /// gradients (replicated over `dp`) in `grads`.
    pub fn finish(mut self, grads: &mut GradStore<B>) -> Result<()> {
        self.start()?;
        for b in self.inflight {
            b.land(grads)?;
        }
        Ok(())
    }
}
