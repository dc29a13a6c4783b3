//! Optimizers: AdamW and SGD with momentum, updating each rank's local shard of every
//! parameter (the model-parallel layout needs no communication), with optional ZeRO-1
//! sharding of the optimizer state over the data-parallel axis.

mod adamw;
mod clip;
mod schedule;
mod sgd;

pub use adamw::{AdamW, AdamWConfig};
pub use clip::{clip_factor, clip_grad_norm, global_grad_norm, scale_to_norm};
pub use schedule::{Decay, Schedule};
pub use sgd::Sgd;

use crate::nn::Module;
use crate::{Backend, GradStore, Result, Tensor};
use std::collections::BTreeMap;

/// What the pipeline needs from an optimizer: set the learning rate, update a module,
/// and save / restore its state (by `kind/parameter` names) for checkpoints.
pub trait Optimizer<B: Backend>: Send {
    /// Sets the learning rate of the next updates.
    fn set_lr(&mut self, lr: f64);
    /// Hands the optimizer its rank's communicator (the trainer does, once), for updates
    /// that communicate (ZeRO-1); without one every update is local. The default ignores it.
    fn set_comm(&mut self, comm: Option<crate::runtime::Comm<B>>) {
        let _ = comm;
    }
    /// One update of every parameter of `model` that has a gradient.
    fn update(&mut self, model: &mut dyn Module<B>, grads: &GradStore<B>) -> Result<()>;
    /// Updates done so far.
    fn steps(&self) -> u64;
    /// The state tensors (this rank's local ones), named `kind/parameter`.
    fn state_tensors(&self) -> Result<Vec<(String, Tensor<B>)>>;
    /// Restores the update count and the state saved by [`Optimizer::state_tensors`].
    fn load_state(&mut self, steps: u64, state: BTreeMap<String, Tensor<B>>) -> Result<()>;
    /// The mixed-precision update in one pass, where the optimizer offers it: every
    /// parameter of `masters` (f32) with a gradient in `grads` (any float dtype) is
    /// updated with its gradient multiplied by `grad_scale` (the loss scale's inverse and
    /// the clipping factor folded in), and the new masters' compute copies in `dtype` are
    /// returned by parameter name, so the caller needs no separate scaling or casting
    /// pass. `None` (the default, and where the optimizer cannot: ZeRO-1 over dp, state on
    /// the host): nothing was done; scale the gradients, [`Optimizer::update`] and cast.
    fn update_with_copies(
        &mut self,
        masters: &mut dyn Module<B>,
        grads: &GradStore<B>,
        grad_scale: f64,
        dtype: crate::DType,
    ) -> Result<Option<BTreeMap<String, B::Storage>>> {
        let _ = (masters, grads, grad_scale, dtype);
        Ok(None)
    }
}

/// A rank-local view of a tensor's storage (replicated, no history), for elementwise
/// optimizer math.
pub(crate) fn local_view<B: Backend>(t: &Tensor<B>) -> Tensor<B> {
    Tensor::from_storage(t.backend(), t.storage().clone(), t.local_shape().clone(), t.dtype())
}

/// Runs `f(name, param)` for every parameter of `model` without recording gradients and,
/// where it returns new local storage, replaces the parameter by a fresh variable with the
/// same layout. Stops at the first error.
pub fn update_each<B: Backend, M: Module<B> + ?Sized>(
    model: &mut M,
    mut f: impl FnMut(&str, &Tensor<B>) -> Result<Option<B::Storage>>,
) -> Result<()> {
    let mut err = None;
    model.visit_mut("", &mut |name, p| {
        if err.is_some() {
            return;
        }
        match crate::no_grad(|| f(name, p)) {
            Ok(Some(s)) => {
                let (shape, local) = (p.shape().clone(), p.local_shape().clone());
                *p = Tensor::from_local(p.backend(), s, shape, local, p.placements(), p.dtype()).into_var();
            }
            Ok(None) => {}
            Err(e) => err = Some(e),
        }
    });
    err.map_or(Ok(()), Err)
}

/// The gradient of `p`, which must be complete on this rank (summed over the
/// data-parallel axis: see `pipeline::data_parallel::sync_grads`).
pub(crate) fn grad_of<'a, B: Backend>(
    name: &str,
    p: &Tensor<B>,
    grads: &'a GradStore<B>,
) -> Result<Option<&'a Tensor<B>>> {
    let Some(g) = grads.get(p) else { return Ok(None) };
    if g.placements() != crate::placement::without_partial(p.placements()) && g.placements() != p.placements() {
        return Err(crate::Error::Parameter {
            name: name.into(),
            msg: format!(
                "gradient laid out as {:?} but the parameter as {:?}; sum data-parallel gradients first (pipeline::data_parallel::sync_grads)",
                g.placements(),
                p.placements()
            ),
        });
    }
    Ok(Some(g))
}
