//! The trainer's gradient communication policy, in one place: how gradients that are
//! partial sums over `dp` are summed (DDP-style buckets, or ZeRO-1's reduce-scatter in the
//! optimizer), and the global norm over every shard. It is handed the rank's communicator;
//! nothing here looks one up.

use crate::optim::{clip_grad_norm, global_grad_norm};
use crate::pipeline::data_parallel::{sync_grads, OverlappedBuckets};
use crate::runtime::{Comm, Mesh};
use crate::{Backend, GradStore, Result, Tensor};

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
                sync_grads(self.comm(), params, grads, crate::runtime::DEFAULT_BUCKET_BYTES)
            }
            SyncStrategy::Zero1 => Ok(()),
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
        matches!(self.strategy, SyncStrategy::Buckets(_)) || mesh.dp == 1
    }

    /// The global gradient norm over every shard (gradients already summed over `dp`).
    pub fn norm(&self, params: &[Tensor<B>], grads: &GradStore<B>) -> Result<f64> {
        global_grad_norm(self.comm(), params, grads)
    }

    /// Clips to `max_norm` by the global norm; returns the norm before clipping.
    pub fn clip(&self, params: &[Tensor<B>], grads: &mut GradStore<B>, max_norm: f64) -> Result<f64> {
        clip_grad_norm(self.comm(), params, grads, max_norm)
    }
}
