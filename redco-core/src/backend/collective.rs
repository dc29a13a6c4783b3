//! The `Collective` trait and `CommStats`, the count of every collective call.
//!
//! Collectives are flat, as in NCCL: all-reduce combines equal-sized buffers elementwise,
//! all-gather concatenates the group's buffers in axis order, reduce-scatter sums and hands
//! each member its contiguous chunk. Layout along a tensor dimension is the caller's job
//! (`sharding::redistribute`). Every call has a timeout: a dead or diverging rank makes the
//! others return an error instead of hanging.

use super::mesh::Mesh;

/// Default size of a gradient bucket (one all-reduce): 25 MB, as in PyTorch DDP.
pub const DEFAULT_BUCKET_BYTES: usize = 25 << 20;
use crate::{Backend, HostData, MeshAxis, Result, Shape};
use std::collections::BTreeMap;
use std::fmt;

/// How all-reduce combines values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceKind {
    /// Elementwise sum.
    Sum,
    /// Elementwise maximum.
    Max,
}

/// The kinds of collective call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CollectiveKind {
    /// all_reduce (sum or max)
    AllReduce,
    /// all_gather
    AllGather,
    /// reduce_scatter
    ReduceScatter,
    /// broadcast
    Broadcast,
    /// barrier
    Barrier,
    /// all_to_all (uneven counts)
    AllToAll,
}

impl CollectiveKind {
    /// The call's name as errors and logs spell it (`all_reduce`, ...).
    pub fn name(self) -> &'static str {
        match self {
            CollectiveKind::AllReduce => "all_reduce",
            CollectiveKind::AllGather => "all_gather",
            CollectiveKind::ReduceScatter => "reduce_scatter",
            CollectiveKind::Broadcast => "broadcast",
            CollectiveKind::Barrier => "barrier",
            CollectiveKind::AllToAll => "all_to_all",
        }
    }
}

/// A collective started with [`Collective::all_reduce_async`]: [`Pending::wait`] gives its
/// result.
pub struct Pending<T>(Box<dyn FnOnce() -> Result<T> + Send>);

impl<T> Pending<T> {
    /// A result that is already there.
    pub fn ready(v: Result<T>) -> Self
    where
        T: Send + 'static,
    {
        Pending(Box::new(move || v))
    }
    /// A result that `f` will produce (e.g. by waiting on a transport's worker).
    pub fn later(f: impl FnOnce() -> Result<T> + Send + 'static) -> Self {
        Pending(Box::new(f))
    }
    /// Waits for the result.
    pub fn wait(self) -> Result<T> {
        (self.0)()
    }
}

/// A communicator for one rank of a mesh, over backend storage.
pub trait Collective<B: Backend>: Send + Sync {
    /// The mesh.
    fn mesh(&self) -> Mesh;
    /// This rank.
    fn rank(&self) -> usize;
    /// Elementwise reduction of `x` over the group along `axis`; every member gets it.
    fn all_reduce(&self, axis: MeshAxis, x: &B::Storage, op: ReduceKind) -> Result<B::Storage>;
    /// The group's buffers concatenated in axis order.
    fn all_gather(&self, axis: MeshAxis, x: &B::Storage) -> Result<B::Storage>;
    /// The group's sum split into equal contiguous chunks; member `i` gets chunk `i`.
    /// `x` must have a length divisible by the group size.
    fn reduce_scatter(&self, axis: MeshAxis, x: &B::Storage) -> Result<B::Storage>;
    /// The buffer of the member at position `root` along `axis`.
    fn broadcast(&self, axis: MeshAxis, x: &B::Storage, root: usize) -> Result<B::Storage>;
    /// Waits until every rank of the mesh arrives.
    fn barrier(&self) -> Result<()>;
    /// Each member sends a different piece to every member (MPI's `Alltoallv`): `x` holds
    /// `send[j]` elements for member `j` of the group along `axis`, in member order; the
    /// result holds the `recv[j]` elements member `j` sent to this one, in member order.
    /// Counts may differ and be zero (the tokens of a mixture of experts going to the ranks
    /// that hold their experts); `recv[j]` must equal member `j`'s `send[this member]`,
    /// which a transport checks where it can. The default says the transport has none.
    fn all_to_all(&self, axis: MeshAxis, x: &B::Storage, send: &[usize], recv: &[usize]) -> Result<B::Storage> {
        let _ = (axis, x, send, recv);
        Err(crate::Error::unsupported("all_to_all", "this transport has no all-to-all with uneven counts"))
    }
    /// Starts [`Collective::all_reduce`] and returns at once where the transport can move
    /// the data while the caller computes (the data-parallel gradient buckets of a
    /// backward pass); the default runs it now. Calls on one axis complete in the order
    /// they were started, and every member must start them in the same order.
    fn all_reduce_async(&self, axis: MeshAxis, x: &B::Storage, op: ReduceKind) -> Result<Pending<B::Storage>> {
        Ok(Pending::ready(self.all_reduce(axis, x, op)))
    }
    /// Starts [`Collective::all_gather`], as [`Collective::all_reduce_async`] starts its
    /// collective (ZeRO-3's prefetch of the next unit); the default runs it now.
    fn all_gather_async(&self, axis: MeshAxis, x: &B::Storage) -> Result<Pending<B::Storage>> {
        Ok(Pending::ready(self.all_gather(axis, x)))
    }
    /// Starts [`Collective::reduce_scatter`], queued behind the collectives started before
    /// it; the default runs it now.
    fn reduce_scatter_async(&self, axis: MeshAxis, x: &B::Storage) -> Result<Pending<B::Storage>> {
        Ok(Pending::ready(self.reduce_scatter(axis, x)))
    }
    /// Starts an all-reduce of a bucket: the buffers `xs` (each with its element count, all
    /// of one dtype) reduced as one flat buffer, their concatenation, in one call; the
    /// result is each buffer's reduction, in order. Every member passes buffers of the same
    /// sizes, and calls on one axis complete in the order they were started, as for
    /// [`Collective::all_reduce_async`]. The default concatenates them with `b`, runs
    /// [`Collective::all_reduce_async`] and cuts the sum apart ([`all_reduce_flat`]); a
    /// transport whose ranks share memory reads the members' buffers where they lie.
    fn all_reduce_bucket_async(
        &self,
        b: &B,
        axis: MeshAxis,
        xs: &[(B::Storage, usize)],
        op: ReduceKind,
    ) -> Result<Pending<Vec<B::Storage>>> {
        all_reduce_flat(self, b, axis, xs, op)
    }
    /// This rank's position along `axis` as a one-element `I64` storage of `b`: the value
    /// every rank-dependent offset is computed from on the device, so that one program
    /// serves every rank (a compiled SPMD step derives it from the device's replica id).
    /// The default uploads the host's index.
    fn axis_index(&self, b: &B, axis: MeshAxis) -> Result<B::Storage> {
        b.upload(&HostData::I64(vec![self.mesh().index_along(self.rank(), axis) as i64]))
    }
}

/// [`Collective::all_reduce_bucket_async`] through one flat buffer: `xs` concatenated with
/// `b`, all-reduced by `coll`, and the sum cut back into buffers of `xs`'s sizes (a single
/// buffer goes as it is).
pub fn all_reduce_flat<B: Backend, C: Collective<B> + ?Sized>(
    coll: &C,
    b: &B,
    axis: MeshAxis,
    xs: &[(B::Storage, usize)],
    op: ReduceKind,
) -> Result<Pending<Vec<B::Storage>>> {
    match xs {
        [] => Ok(Pending::ready(Ok(Vec::new()))),
        [(x, _)] => {
            let sum = coll.all_reduce_async(axis, x, op)?;
            Ok(Pending::later(move || Ok(vec![sum.wait()?])))
        }
        _ => {
            let shapes: Vec<Shape> = xs.iter().map(|&(_, n)| Shape::new([n])).collect();
            let parts: Vec<(&B::Storage, &Shape)> = xs.iter().map(|(s, _)| s).zip(&shapes).collect();
            let sum = coll.all_reduce_async(axis, &b.cat(&parts, 0)?, op)?;
            let (b, sizes): (B, Vec<usize>) = (b.clone(), xs.iter().map(|&(_, n)| n).collect());
            Ok(Pending::later(move || {
                let summed = sum.wait()?;
                let whole = Shape::new([sizes.iter().sum::<usize>()]);
                let mut off = 0;
                sizes
                    .iter()
                    .map(|&n| {
                        off += n;
                        b.narrow(&summed, &whole, 0, off - n, n)
                    })
                    .collect()
            }))
        }
    }
}

/// Calls and bytes of one (kind, axis).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CommCount {
    /// Number of calls.
    pub calls: u64,
    /// Bytes: the buffer each rank passes in for all-reduce, reduce-scatter, broadcast and
    /// all-to-all (what it sends, its own piece included), the gathered result for
    /// all-gather.
    pub bytes: u64,
}

/// Per-rank counts of collective calls by kind and mesh axis, and the wall time of the
/// synchronous ones (two counts are equal when their calls and bytes are: times differ
/// from run to run).
#[derive(Debug, Clone, Default)]
pub struct CommStats {
    counts: BTreeMap<(CollectiveKind, u8), CommCount>,
    seconds: BTreeMap<(CollectiveKind, u8), f64>,
}

impl PartialEq for CommStats {
    fn eq(&self, other: &Self) -> bool {
        self.counts == other.counts
    }
}

impl Eq for CommStats {}

impl CommStats {
    /// Records one call.
    pub fn record(&mut self, kind: CollectiveKind, axis: MeshAxis, bytes: u64) {
        let c = self.counts.entry((kind, axis as u8)).or_default();
        c.calls += 1;
        c.bytes += bytes;
    }
    /// Adds `seconds` of wall time spent in a synchronous call of `kind` over `axis` (the
    /// wait for the other ranks included).
    pub fn record_time(&mut self, kind: CollectiveKind, axis: MeshAxis, seconds: f64) {
        *self.seconds.entry((kind, axis as u8)).or_default() += seconds;
    }
    /// The wall time spent in synchronous calls of one (kind, axis) (started collectives,
    /// which the transport moves while the rank computes, are not timed).
    pub fn seconds(&self, kind: CollectiveKind, axis: MeshAxis) -> f64 {
        self.seconds.get(&(kind, axis as u8)).copied().unwrap_or(0.0)
    }
    /// The count of one (kind, axis).
    pub fn get(&self, kind: CollectiveKind, axis: MeshAxis) -> CommCount {
        self.counts.get(&(kind, axis as u8)).copied().unwrap_or_default()
    }
    /// Total calls over every kind and axis.
    pub fn total_calls(&self) -> u64 {
        self.counts.values().map(|c| c.calls).sum()
    }
    /// Total bytes over every kind and axis.
    pub fn total_bytes(&self) -> u64 {
        self.counts.values().map(|c| c.bytes).sum()
    }
    /// Adds another count.
    pub fn merge(&mut self, other: &CommStats) {
        for (k, v) in &other.counts {
            let c = self.counts.entry(*k).or_default();
            c.calls += v.calls;
            c.bytes += v.bytes;
        }
        for (k, v) in &other.seconds {
            *self.seconds.entry(*k).or_default() += v;
        }
    }
    /// `(kind, axis, count)` for every non-zero entry.
    pub fn entries(&self) -> Vec<(CollectiveKind, MeshAxis, CommCount)> {
        self.counts.iter().map(|((k, a), c)| (*k, if *a == 0 { MeshAxis::Dp } else { MeshAxis::Mp }, *c)).collect()
    }
}

impl fmt::Display for CommStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (k, a, c) in self.entries() {
            writeln!(f, "{k:?} over {a:?}: {} calls, {} bytes", c.calls, c.bytes)?;
        }
        Ok(())
    }
}
