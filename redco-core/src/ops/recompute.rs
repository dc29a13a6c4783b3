//! Activation checkpointing (rematerialisation): a block whose intermediate activations
//! are not kept. Its forward runs without recording a graph; the backward pass runs the
//! block again, with gradients, from its saved inputs, and differentiates that. A
//! transformer trained this way keeps one hidden state per block instead of every
//! activation inside it, for one more forward per block in the backward pass (as
//! `torch.utils.checkpoint` and Megatron's full recompute do).
//!
//! Under tensor parallelism the recomputed forward repeats the block's forward
//! communication (its all-reduces), as Megatron's recompute does: one more all-reduce per
//! row-parallel layer per step.

use crate::autograd::{is_grad_enabled, is_recompute_enabled, no_grad, GradModeGuard};
use crate::{Backend, Error, Result, Tensor};
use std::sync::Arc;

impl<B: Backend> Tensor<B> {
    /// `f(inputs)`, recomputed in the backward pass instead of keeping its activations.
    ///
    /// `params` are the variables `f` reads besides `inputs` (a block's weights): their
    /// gradients reach the store as if `f` had been recorded. `f` must compute the same
    /// values when called again (no dropout drawn from a changing state). With gradients
    /// off, or when nothing needs them, or inside
    /// [`record_inside_recompute`](crate::autograd::record_inside_recompute) (a planning
    /// trace), this is just `f(inputs)`, recorded. Second-order gradients through a
    /// recomputed block are refused.
    pub fn recompute<F>(inputs: &[&Tensor<B>], params: &[&Tensor<B>], f: F) -> Result<Tensor<B>>
    where
        F: Fn(&[Tensor<B>]) -> Result<Tensor<B>> + Send + Sync + 'static,
    {
        let owned: Vec<Tensor<B>> = inputs.iter().map(|t| (*t).clone()).collect();
        let needed = inputs.iter().chain(params).any(|t| t.requires_grad());
        if !is_grad_enabled() || !is_recompute_enabled() || !needed {
            return f(&owned);
        }
        let out = no_grad(|| f(&owned))?;
        let f = Arc::new(f);
        let kept: Vec<Tensor<B>> = params.iter().map(|t| (*t).clone()).collect();
        let all: Vec<&Tensor<B>> = inputs.iter().chain(params).copied().collect();
        let backward = move |g: &Tensor<B>| -> Result<Vec<Option<Tensor<B>>>> {
            if is_grad_enabled() {
                return Err(Error::unsupported(
                    "recompute",
                    "second-order gradients through a recomputed block are not supported: turn recompute off \
                     where a gradient graph is built (backward_graph, grad_graph)",
                ));
            }
            // the block again, recorded, from its saved inputs (fresh leaves for those that
            // need a gradient)
            let _on = GradModeGuard::set(true);
            let xs: Vec<Tensor<B>> =
                owned.iter().map(|x| if x.requires_grad() { x.detach().into_var() } else { x.detach() }).collect();
            let y = f(&xs)?;
            let wrt: Vec<&Tensor<B>> = xs.iter().chain(&kept).collect();
            if !y.requires_grad() {
                return Ok(vec![None; wrt.len()]);
            }
            drop(_on);
            let mut grads = y.grads_seeded(g.clone(), &wrt)?;
            // an input that needed no gradient gets none
            for (i, x) in owned.iter().enumerate() {
                if !x.requires_grad() {
                    grads[i] = None;
                }
            }
            Ok(grads)
        };
        Ok(Tensor::from_op_placed(
            out.backend(),
            out.storage().clone(),
            out.shape().clone(),
            out.local_shape().clone(),
            out.placements(),
            out.dtype(),
            "recompute",
            &all,
            backward,
        ))
    }
}
