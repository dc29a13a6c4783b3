//! One optimizer step, two ways ([`StepStrategy`]): [`EagerStep`] runs the micro-batches
//! op by op (forward, backward into the compute copies' gradients, the data-parallel
//! sum, clipping and the update of the f32 masters), [`CompiledRun`] hands the batch to a
//! [`CompiledStep`] that does all of it as one program. The eager step runs every
//! configuration; what a compiled one can run is stated once, in
//! [`compiled::ineligible`](crate::compiled::ineligible). A non-finite loss meets the one
//! policy of [`non_finite`].

use super::rank_run::RankRun;
use crate::agree::dp_shard;
use crate::compiled::{pull_state, push_state, CompiledStep, StepInputs};
use crate::train_config::{NanPolicy, TrainConfig};
use crate::{Batch, StepCtx};
use redco_core::nn::Module;
use redco_core::{Backend, Error, GradStore, Result};
use std::sync::Arc;

/// A step that trained: its mean loss, the tokens of the whole batch and the global
/// gradient norm (NaN when not computed).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Trained {
    pub loss: f64,
    pub tokens: usize,
    pub grad_norm: f64,
}

/// How a step ended.
pub(crate) enum StepOutcome {
    /// The masters were updated.
    Trained(Trained),
    /// Nothing was updated (a skipped non-finite loss, f16 overflow).
    Skipped,
}

/// Where a non-finite loss was met: the step, the micro-batch (op-by-op steps), the
/// batch's examples in the shuffled order, and the value.
pub(crate) struct NonFinite {
    pub step: u64,
    pub micro: Option<usize>,
    pub examples: (usize, usize),
    pub loss: f64,
}

/// The one policy for a non-finite loss ([`TrainConfig::nan`]): an error naming the step
/// and the examples (the last checkpoint is intact), or a skipped step with a warning.
pub(crate) fn non_finite(cfg: &TrainConfig, rank: usize, at: NonFinite) -> Result<StepOutcome> {
    let NonFinite { step, micro, examples: (a, b), loss } = at;
    match cfg.nan {
        NanPolicy::Error => {
            let micro = micro.map_or(String::new(), |m| format!(", micro-batch {m}"));
            Err(Error::invalid(
                "fit",
                format!(
                    "loss is {loss} at step {step}{micro} (examples {a}..{b} of the shuffled order); the last \
                     checkpoint is intact"
                ),
            ))
        }
        NanPolicy::Skip => {
            if rank == 0 {
                tracing::warn!(step, ?micro, loss, "skipping a step with a non-finite loss");
            }
            Ok(StepOutcome::Skipped)
        }
    }
}

/// One optimizer step of a rank's run.
pub(crate) trait StepStrategy<M, E, B: Backend> {
    /// Runs step `step` with learning rate `lr`.
    fn step(&self, r: &mut RankRun<'_, M, E, B>, step: u64, lr: f64) -> Result<StepOutcome>;
    /// Makes the rank's [`TrainState`](crate::train_state::TrainState) and model current,
    /// before something reads them (an eval, a checkpoint).
    fn sync_state(&self, r: &mut RankRun<'_, M, E, B>) -> Result<()>;
    /// Prepares the strategy's own state from the rank's (after a resume).
    fn start(&self, r: &mut RankRun<'_, M, E, B>) -> Result<()>;
}

/// Every op run as it comes, on the rank's backend: accumulation, mixed precision, ZeRO-1,
/// SGD, frozen parameters; no restriction.
pub(crate) struct EagerStep;

impl<M: Module<B> + Send + Sync, E: Clone + Send + Sync, B: Backend> StepStrategy<M, E, B> for EagerStep {
    fn step(&self, r: &mut RankRun<'_, M, E, B>, step: u64, lr: f64) -> Result<StepOutcome> {
        let _ = lr;
        let t = r.trainer;
        let cfg = &t.config;
        let scale = r.state.scale.scale;
        let mut grads = GradStore::new();
        let (mut loss_sum, mut tokens) = (0.0, 0usize);
        for micro in 0..cfg.accumulate {
            let (value, first, n) = r.forward_backward(step, micro, scale, &mut grads)?;
            tokens += n;
            if !value.is_finite() {
                let at = NonFinite { step, micro: Some(micro), examples: (first, first + cfg.batch_size), loss: value };
                return non_finite(cfg, r.rk.rank, at);
            }
            loss_sum += value / cfg.accumulate as f64;
        }
        match r.update(grads, step)? {
            Some(grad_norm) => Ok(StepOutcome::Trained(Trained { loss: loss_sum, tokens, grad_norm })),
            None => Ok(StepOutcome::Skipped),
        }
    }

    fn sync_state(&self, _: &mut RankRun<'_, M, E, B>) -> Result<()> {
        Ok(())
    }

    fn start(&self, _: &mut RankRun<'_, M, E, B>) -> Result<()> {
        Ok(())
    }
}

/// The whole step as one compiled program per rank ([`CompiledStep`]); the rank's masters
/// and optimizer state move into it at the start and back out when read.
pub(crate) struct CompiledRun<B: Backend>(pub Arc<dyn CompiledStep<B>>);

impl<M: Module<B> + Send + Sync, E: Clone + Send + Sync, B: Backend> StepStrategy<M, E, B> for CompiledRun<B> {
    fn step(&self, r: &mut RankRun<'_, M, E, B>, step: u64, lr: f64) -> Result<StepOutcome> {
        let t = r.trainer;
        let cfg = &t.config;
        // this rank's slice of the batch through the compiled step
        let (local, first, tokens) = r.collated(step, 0)?;
        let inputs = StepInputs { lr, loss_scale: 1.0, clip_norm: cfg.clip_norm };
        let out = self.0.step(r.rk.rank, &local, &inputs)?;
        if !out.loss.is_finite() {
            // the step changed nothing (its gradients were not finite either)
            let at = NonFinite { step, micro: None, examples: (first, first + cfg.batch_size), loss: out.loss };
            return non_finite(cfg, r.rk.rank, at);
        }
        if !out.finite {
            if r.rk.rank == 0 {
                tracing::warn!(step, grad_norm = out.grad_norm, "non-finite gradients; the step was skipped");
            }
            return Ok(StepOutcome::Skipped);
        }
        Ok(StepOutcome::Trained(Trained { loss: out.loss, tokens, grad_norm: out.grad_norm }))
    }

    fn sync_state(&self, r: &mut RankRun<'_, M, E, B>) -> Result<()> {
        pull_state(self.0.as_ref(), r.rk.rank, &mut r.state.masters, r.state.opt.as_mut())?;
        r.state.refresh(&mut r.model, r.trainer.config.compute_dtype)
    }

    fn start(&self, r: &mut RankRun<'_, M, E, B>) -> Result<()> {
        if r.frozen > 0 {
            return Err(Error::invalid(
                "fit (compiled step)",
                "a compiled step trains every parameter; this model has frozen ones",
            ));
        }
        push_state(self.0.as_ref(), r.rk.rank, &r.state.masters, r.state.opt.as_ref())
    }
}

/// The batch entries of this rank's slice, each split over `dp` as the placements say.
pub(crate) fn shard_batch<B: Backend>(local: Batch<B>, dp: usize) -> Result<Batch<B>> {
    let mut batch = Batch::new();
    for (k, t) in local {
        let t = dp_shard(t, dp).map_err(|e| Error::invalid("fit", format!("batch entry `{k}`: {e}")))?;
        batch.insert(k, t);
    }
    Ok(batch)
}

/// The step context of micro-batch `micro` of step `step` on rank `r`.
pub(crate) fn train_ctx<'b, M, E, B: Backend>(r: &'b RankRun<'_, M, E, B>, step: u64, micro: usize) -> StepCtx<'b, B> {
    StepCtx { backend: &r.rk.backend, rank: r.rk.rank, mesh: r.dep.mesh, step, micro, train: true, seed: r.dep.seed }
}
