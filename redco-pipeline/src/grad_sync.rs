//! The trainer's gradient communication policy, in one place: how gradients that are
//! partial sums over `dp` are summed (DDP-style buckets, ZeRO-1's reduce-scatter in the
//! optimizer, or ZeRO-2's reduce-scatter during backward into slices), and the global norm
//! over every shard. It is handed the rank's communicator; nothing here looks one up.

use crate::data_parallel::{sync_grads, OverlappedBuckets};
use crate::zero::{clip_slices, slice_norm, SliceOnReady};
use redco_core::optim::{clip_grad_norm, global_grad_norm};
use redco_core::runtime::{Comm, Mesh};
use redco_core::{Backend, GradStore, Result, Tensor};

/// How data-parallel gradients are summed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncStrategy {
    /// All-reduce the gradients in flat buckets of about this many bytes (PyTorch DDP's
    /// 25 MB by default), so every rank holds the summed gradient.
    Buckets(usize),
    /// ZeRO stage 1: the optimizer reduce-scatters each gradient and updates its slice; the
    /// gradients are summed here only when a global norm is needed (clipping, f16 overflow
    /// checks).
    Zero1,
    /// ZeRO stages 2 and 3: each gradient is reduce-scattered into this rank's f32 slice
    /// as the backward pass of a step's last micro-batch completes it ([`SliceOnReady`];
    /// ZeRO-3's pieces get theirs from their gather's backward); the masters and the
    /// optimizer state are slices too.
    Slices,
}

/// What runs during a step's last backward pass: bucketed all-reduces, or ZeRO-2's slicing.
pub enum DuringBackward<B: Backend> {
    /// DDP buckets ([`OverlappedBuckets`]).
    Buckets(OverlappedBuckets<B>),
    /// ZeRO-2 slices ([`SliceOnReady`]).
    Slices(SliceOnReady<B>),
}

impl<B: Backend> DuringBackward<B> {
    /// `p`'s gradient in `grads` is complete.
    pub fn ready(&mut self, p: &Tensor<B>, grads: &mut GradStore<B>) -> Result<()> {
        match self {
            DuringBackward::Buckets(b) => b.ready(p, grads),
            DuringBackward::Slices(s) => s.ready(p, grads),
        }
    }

    /// Completes what is in flight into `grads`.
    pub fn finish(self, grads: &mut GradStore<B>) -> Result<()> {
        match self {
            DuringBackward::Buckets(b) => b.finish(grads),
            DuringBackward::Slices(_) => Ok(()),
        }
    }
}

/// A rank's gradient sync: the strategy and the communicator it runs over.
pub struct GradSync<B: Backend> {
    comm: Option<Comm<B>>,
    strategy: SyncStrategy,
}

impl<B: Backend> GradSync<B> {
    /// The policy `strategy` over `comm` (none: one device, nothing to sum).
    pub fn new(comm: Option<Comm<B>>, strategy: SyncStrategy) -> Self {
        GradSync { comm, strategy }
    }

    /// The communicator.
    pub fn comm(&self) -> Option<&Comm<B>> {
        self.comm.as_ref()
    }

    /// The strategy.
    pub fn strategy(&self) -> SyncStrategy {
        self.strategy
    }

    /// Sums the gradients of `params` that are partial over `dp`, as the strategy says;
    /// `need_norm`: a global norm follows (ZeRO-1 then sums here too).
    pub fn sync(&self, params: &[Tensor<B>], grads: &mut GradStore<B>, need_norm: bool) -> Result<()> {
        match self.strategy {
            SyncStrategy::Buckets(bytes) => sync_grads(self.comm(), params, grads, bytes),
            SyncStrategy::Zero1 if need_norm => {
                sync_grads(self.comm(), params, grads, redco_core::runtime::DEFAULT_BUCKET_BYTES)
            }
            SyncStrategy::Zero1 | SyncStrategy::Slices => Ok(()),
        }
    }

    /// What runs during the backward pass of a step's last micro-batch: ZeRO-2's slicing
    /// (always: it is what keeps the full gradients from piling up), or, with `overlap`,
    /// the DDP buckets; `None` otherwise.
    pub fn during_backward(&self, params: &[Tensor<B>], overlap: bool) -> Option<DuringBackward<B>> {
        match (self.strategy, &self.comm) {
            (SyncStrategy::Slices, Some(c)) => Some(DuringBackward::Slices(SliceOnReady::new(c.clone(), params))),
            _ if overlap => self.overlap(params).map(DuringBackward::Buckets),
            _ => None,
        }
    }

    /// Buckets that sum the gradients of `params` during the backward pass (see
    /// [`OverlappedBuckets`]), when this strategy sums in buckets and there is a `dp` axis
    /// to sum over; otherwise `None` (sum afterwards with [`GradSync::sync`]).
    pub fn overlap(&self, params: &[Tensor<B>]) -> Option<OverlappedBuckets<B>> {
        match (self.strategy, &self.comm) {
            (SyncStrategy::Buckets(bytes), Some(c)) if c.mesh().dp > 1 => {
                Some(OverlappedBuckets::new(c.clone(), params, bytes))
            }
            _ => None,
        }
    }

    /// Whether, after [`GradSync::sync`] without a norm, every gradient is summed over `dp`.
    pub fn all_summed(&self, mesh: Mesh) -> bool {
        matches!(self.strategy, SyncStrategy::Buckets(_) | SyncStrategy::Slices) || mesh.dp == 1
    }

    /// The global gradient norm over every shard (gradients already summed over `dp`, or
    /// ZeRO-2's slices, for which `mp_split[i]` says whether `params[i]` is split over
    /// `mp`: slices carry no placement).
    pub fn norm(&self, params: &[Tensor<B>], grads: &GradStore<B>, mp_split: &[bool]) -> Result<f64> {
        match (self.strategy, &self.comm) {
            (SyncStrategy::Slices, Some(c)) => slice_norm(c, params, mp_split, grads),
            _ => global_grad_norm(self.comm(), params, grads),
        }
    }

    /// Clips to `max_norm` by the global norm ([`GradSync::norm`]); returns the norm
    /// before clipping.
    pub fn clip(
        &self,
        params: &[Tensor<B>],
        grads: &mut GradStore<B>,
        max_norm: f64,
        mp_split: &[bool],
    ) -> Result<f64> {
        match (self.strategy, &self.comm) {
            (SyncStrategy::Slices, Some(c)) => clip_slices(c, params, mp_split, grads, max_norm),
            _ => clip_grad_norm(self.comm(), params, grads, max_norm),
        }
    }
}
