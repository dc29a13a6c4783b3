//! A rank's communicator ([`Comm`]: a [`Collective`] with its call counts) and the one
//! thread-scoped place the tensor ops find it: each backend's own typed slot
//! ([`Backend::comm_slot`], declared with [`comm_slot!`](crate::comm_slot)).
//!
//! Everything that communicates outside the tensor ops is handed its `Comm` as an argument
//! (the gradient path, ZeRO-3's gathers, the serving lockstep, `save_pretrained`, the CLI's
//! commands). The sharded tensor ops receive tensors only, so they read the rank's `Comm`
//! from the slot, which the SPMD runner fills once per rank thread
//! ([`crate::runtime::spmd_with`]) and [`crate::runtime::on_backend`] carries onto a
//! backend's worker threads. The slot is a `thread_local!` of `Option<Comm<B>>` per backend
//! type: no downcast on read.

use super::collective::{Collective, CollectiveKind, CommStats, Pending, ReduceKind};
use super::mesh::Mesh;
use crate::{Backend, MeshAxis, Result};
use std::cell::RefCell;
use std::sync::{Arc, Mutex};

/// A rank's communicator with its call counts.
pub struct Comm<B: Backend> {
    coll: Arc<dyn Collective<B>>,
    stats: Arc<Mutex<CommStats>>,
}

impl<B: Backend> Clone for Comm<B> {
    fn clone(&self) -> Self {
        Comm { coll: self.coll.clone(), stats: self.stats.clone() }
    }
}

impl<B: Backend> Comm<B> {
    /// Wraps a collective.
    pub fn new(coll: Arc<dyn Collective<B>>) -> Self {
        Comm { coll, stats: Arc::new(Mutex::new(CommStats::default())) }
    }
    /// The mesh.
    pub fn mesh(&self) -> Mesh {
        self.coll.mesh()
    }
    /// This rank.
    pub fn rank(&self) -> usize {
        self.coll.rank()
    }
    /// The position of this rank along `axis`.
    pub fn index_along(&self, axis: MeshAxis) -> usize {
        self.mesh().index_along(self.rank(), axis)
    }
    /// This rank's position along `axis` as a one-element `I64` device value
    /// ([`Collective::axis_index`]); not a collective, so not counted.
    pub fn axis_index(&self, b: &B, axis: MeshAxis) -> Result<B::Storage> {
        self.coll.axis_index(b, axis)
    }
    /// The calls made so far.
    pub fn stats(&self) -> CommStats {
        self.stats.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
    /// Forgets the counts so far.
    pub fn reset_stats(&self) {
        *self.stats.lock().unwrap_or_else(|p| p.into_inner()) = CommStats::default();
    }
    fn count(&self, kind: CollectiveKind, axis: MeshAxis, bytes: usize) {
        self.stats.lock().unwrap_or_else(|p| p.into_inner()).record(kind, axis, bytes as u64);
    }
    /// Runs the synchronous call `f`, adding its wall time to the counts.
    fn timed<T>(&self, kind: CollectiveKind, axis: MeshAxis, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let t0 = std::time::Instant::now();
        let out = f();
        self.stats.lock().unwrap_or_else(|p| p.into_inner()).record_time(kind, axis, t0.elapsed().as_secs_f64());
        out
    }
    /// Counted [`Collective::all_reduce`]; `bytes` is the buffer size.
    pub fn all_reduce(&self, axis: MeshAxis, x: &B::Storage, op: ReduceKind, bytes: usize) -> Result<B::Storage> {
        self.count(CollectiveKind::AllReduce, axis, bytes);
        self.timed(CollectiveKind::AllReduce, axis, || self.coll.all_reduce(axis, x, op))
    }
    /// Counted [`Collective::all_reduce_async`]; `bytes` is the buffer size.
    pub fn all_reduce_async(
        &self,
        axis: MeshAxis,
        x: &B::Storage,
        op: ReduceKind,
        bytes: usize,
    ) -> Result<Pending<B::Storage>> {
        self.count(CollectiveKind::AllReduce, axis, bytes);
        self.coll.all_reduce_async(axis, x, op)
    }
    /// Counted [`Collective::all_reduce_bucket_async`] (one all-reduce of `bytes`, the
    /// bucket's size).
    pub fn all_reduce_bucket_async(
        &self,
        b: &B,
        axis: MeshAxis,
        xs: &[(B::Storage, usize)],
        op: ReduceKind,
        bytes: usize,
    ) -> Result<Pending<Vec<B::Storage>>> {
        self.count(CollectiveKind::AllReduce, axis, bytes);
        self.coll.all_reduce_bucket_async(b, axis, xs, op)
    }
    /// Counted [`Collective::all_gather`]; `bytes` is the gathered size.
    pub fn all_gather(&self, axis: MeshAxis, x: &B::Storage, bytes: usize) -> Result<B::Storage> {
        self.count(CollectiveKind::AllGather, axis, bytes);
        self.timed(CollectiveKind::AllGather, axis, || self.coll.all_gather(axis, x))
    }
    /// Counted [`Collective::all_gather_async`] (counted when started); `bytes` is the
    /// gathered size.
    pub fn all_gather_async(&self, axis: MeshAxis, x: &B::Storage, bytes: usize) -> Result<Pending<B::Storage>> {
        self.count(CollectiveKind::AllGather, axis, bytes);
        self.coll.all_gather_async(axis, x)
    }
    /// Counted [`Collective::reduce_scatter_async`]; `bytes` is the input size.
    pub fn reduce_scatter_async(&self, axis: MeshAxis, x: &B::Storage, bytes: usize) -> Result<Pending<B::Storage>> {
        self.count(CollectiveKind::ReduceScatter, axis, bytes);
        self.coll.reduce_scatter_async(axis, x)
    }
    /// Counted [`Collective::reduce_scatter`]; `bytes` is the input size.
    pub fn reduce_scatter(&self, axis: MeshAxis, x: &B::Storage, bytes: usize) -> Result<B::Storage> {
        self.count(CollectiveKind::ReduceScatter, axis, bytes);
        self.timed(CollectiveKind::ReduceScatter, axis, || self.coll.reduce_scatter(axis, x))
    }
    /// Counted [`Collective::broadcast`].
    pub fn broadcast(&self, axis: MeshAxis, x: &B::Storage, root: usize, bytes: usize) -> Result<B::Storage> {
        self.count(CollectiveKind::Broadcast, axis, bytes);
        self.timed(CollectiveKind::Broadcast, axis, || self.coll.broadcast(axis, x, root))
    }
    /// Counted [`Collective::all_to_all`]; `bytes` is what this rank sends (its own piece
    /// included).
    pub fn all_to_all(
        &self,
        axis: MeshAxis,
        x: &B::Storage,
        send: &[usize],
        recv: &[usize],
        bytes: usize,
    ) -> Result<B::Storage> {
        let n = self.mesh().axis_size(axis);
        if send.len() != n || recv.len() != n {
            return Err(crate::Error::invalid(
                "all_to_all",
                format!("{} send and {} receive counts for a group of {n}", send.len(), recv.len()),
            ));
        }
        self.count(CollectiveKind::AllToAll, axis, bytes);
        self.timed(CollectiveKind::AllToAll, axis, || self.coll.all_to_all(axis, x, send, recv))
    }
    /// Counted [`Collective::barrier`].
    pub fn barrier(&self) -> Result<()> {
        self.count(CollectiveKind::Barrier, MeshAxis::Dp, 0);
        self.coll.barrier()
    }
}

/// A backend's per-thread communicator slot: the rank's [`Comm`] while an SPMD rank (or a
/// step it hands to the backend's threads) runs on this thread. Declared per backend type
/// with [`comm_slot!`](crate::comm_slot).
pub struct CommSlot<B: Backend>(RefCell<Option<Comm<B>>>);

impl<B: Backend> CommSlot<B> {
    /// An empty slot (usable in a `const` thread-local initializer).
    pub const fn new() -> Self {
        CommSlot(RefCell::new(None))
    }
}

impl<B: Backend> Default for CommSlot<B> {
    fn default() -> Self {
        Self::new()
    }
}

/// Declares a backend's [`Backend::comm_slot`] inside its `impl Backend for T` block:
/// `redco_core::comm_slot!(T);`. A backend that declares none runs single-rank ops only;
/// a sharded op on it says so.
#[macro_export]
macro_rules! comm_slot {
    ($t:ty) => {
        fn comm_slot() -> Option<&'static ::std::thread::LocalKey<$crate::backend::comm::CommSlot<$t>>> {
            ::std::thread_local! {
                static SLOT: $crate::backend::comm::CommSlot<$t> = const { $crate::backend::comm::CommSlot::new() };
            }
            Some(&SLOT)
        }
    };
}

/// The communicator of the rank running on this thread, if any (`None` outside SPMD runs:
/// everything is then local and replicated, and on a backend without a slot).
pub fn current_comm<B: Backend>() -> Option<Comm<B>> {
    B::comm_slot().and_then(|k| k.with(|s| s.0.borrow().clone()))
}

/// Installs a communicator as this thread's current one for backend `B` until the guard
/// drops (then the previous one is current again).
pub struct CommGuard<B: Backend> {
    prev: Option<Comm<B>>,
}

impl<B: Backend> CommGuard<B> {
    /// Makes `comm` current on this thread. On a backend that declares no slot this does
    /// nothing, and the sharded ops report that the backend has no communicator slot.
    pub fn install(comm: Comm<B>) -> Self {
        let prev = B::comm_slot().and_then(|k| k.with(|s| s.0.borrow_mut().replace(comm)));
        CommGuard { prev }
    }
}

impl<B: Backend> Drop for CommGuard<B> {
    fn drop(&mut self) {
        let prev = self.prev.take();
        if let Some(k) = B::comm_slot() {
            k.with(|s| *s.0.borrow_mut() = prev);
        }
    }
}
