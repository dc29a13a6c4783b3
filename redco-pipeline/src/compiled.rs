//! The seam for compiled training steps: a backend that records and replays whole programs
//! (PJRT) hands the [`Trainer`](super::Trainer) a [`StepCompiler`], and the Trainer then
//! runs each optimizer step (forward, loss, backward, gradient sync, clipping, AdamW) as
//! one call per rank instead of op by op. Everything around the step (data order, the
//! schedule, metrics, evaluation, checkpoints, resume, the export) stays the Trainer's.
//!
//! The learning rate, the loss scale and the clipping norm are runtime inputs of every
//! step ([`StepInputs`]); what comes back ([`StepReport`]) is read once, at the end.

use super::train_config::{OptimizerConfig, TrainConfig, ZeroStage};
use super::Batch;
use crate::optimizer::{StateTensor, TrainOptimizer};
use redco_core::optim::AdamWConfig;
use redco_core::planning::ShardPlan;
use redco_core::{Backend, DType, Error, Result, Tensor};
use std::collections::BTreeMap;
use std::sync::Arc;

/// What one compiled step runs with: the runtime inputs of the program.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepInputs {
    /// The learning rate of this step.
    pub lr: f64,
    /// The loss is multiplied by this before backward and the gradients divided by it (for
    /// half-precision training; 1 for f32).
    pub loss_scale: f64,
    /// Clip the global gradient norm to this value (`None`: no clipping).
    pub clip_norm: Option<f64>,
}

/// What one compiled step gives back, read from the device once, at its end.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepReport {
    /// The mean loss over the mesh.
    pub loss: f64,
    /// The global gradient norm before clipping.
    pub grad_norm: f64,
    /// False when a gradient was not finite: the step then changed nothing (parameters,
    /// moments and the step count are as they were).
    pub finite: bool,
}

/// One rank's training state inside a compiled step: its local shard of every parameter
/// and of both AdamW moments (plain tensors of the local shape, by parameter name), and
/// the optimizer steps taken.
#[derive(Debug, Clone)]
pub struct StepState<B: Backend> {
    /// Parameter name -> the rank's shard.
    pub params: BTreeMap<String, Tensor<B>>,
    /// Parameter name -> the rank's shard of the first moment.
    pub m: BTreeMap<String, Tensor<B>>,
    /// Parameter name -> the rank's shard of the second moment.
    pub v: BTreeMap<String, Tensor<B>>,
    /// Optimizer steps taken (the bias corrections count them).
    pub steps: u64,
}

/// A training step compiled once for every rank of a mesh and driven by the ranks'
/// threads: each rank calls [`CompiledStep::step`] with its own slice of the batch, in
/// the same order, as it would call a collective.
pub trait CompiledStep<B: Backend>: Send + Sync {
    /// Runs rank `rank`'s part of one step on its local `batch` (the entries and shapes the
    /// step was compiled for). Returns when the whole mesh's step is done.
    fn step(&self, rank: usize, batch: &Batch<B>, inputs: &StepInputs) -> Result<StepReport>;
    /// Rank `rank`'s current state (for checkpoints, evaluation and the export).
    fn state(&self, rank: usize) -> Result<StepState<B>>;
    /// Replaces rank `rank`'s state (a resumed checkpoint, or the Trainer's initial
    /// parameters); shapes and dtypes must be the compiled ones.
    fn set_state(&self, rank: usize, state: StepState<B>) -> Result<()>;
}

/// Compiles the training step of a model of type `M` on backend `B`.
pub trait StepCompiler<M, B: Backend>: Send + Sync {
    /// One step of `model` (whole, unsharded values, on a device of the run) over the mesh
    /// of `plan` with AdamW `opt`, for per-rank batches shaped like `batch` (one rank's
    /// slice). An error says why this step cannot be compiled (the Trainer then stops: it
    /// never falls back silently).
    fn compile(
        &self,
        model: &M,
        plan: &ShardPlan,
        batch: &Batch<B>,
        opt: &AdamWConfig,
    ) -> Result<Arc<dyn CompiledStep<B>>>;
}

/// `t`'s local shard as a plain tensor.
fn local<B: Backend>(t: &Tensor<B>) -> Tensor<B> {
    Tensor::from_storage(t.backend(), t.storage().clone(), t.local_shape().clone(), t.dtype())
}

/// Rank `rank`'s masters and AdamW moments (zeros before the first step) into `cs`.
pub(crate) fn push_state<B: Backend>(
    cs: &dyn CompiledStep<B>,
    rank: usize,
    masters: &BTreeMap<String, Tensor<B>>,
    opt: &dyn TrainOptimizer<B>,
) -> Result<()> {
    let mut saved = BTreeMap::new();
    for (k, t) in opt.state_tensors()? {
        let t = t.into_device(&k)?;
        saved.insert(k, t);
    }
    let mut st = StepState { params: BTreeMap::new(), m: BTreeMap::new(), v: BTreeMap::new(), steps: opt.steps() };
    for (name, p) in masters {
        let x = local(p);
        let moment = |key: &str| match saved.get(&format!("{key}/{name}")) {
            Some(t) => Ok(local(t)),
            None => x.zeros_like(),
        };
        st.m.insert(name.clone(), moment("adam_m")?);
        st.v.insert(name.clone(), moment("adam_v")?);
        st.params.insert(name.clone(), x);
    }
    cs.set_state(rank, st)
}

/// Rank `rank`'s state in `cs` back into its masters (laid out as they are) and `opt`.
pub(crate) fn pull_state<B: Backend>(
    cs: &dyn CompiledStep<B>,
    rank: usize,
    masters: &mut BTreeMap<String, Tensor<B>>,
    opt: &mut dyn TrainOptimizer<B>,
) -> Result<()> {
    let mut st = cs.state(rank)?;
    let mut moments = BTreeMap::new();
    for (name, p) in masters.iter_mut() {
        let missing = || Error::Parameter { name: name.clone(), msg: "the compiled step has no state for it".into() };
        let x = st.params.remove(name).ok_or_else(missing)?;
        if x.shape() != p.local_shape() {
            return Err(Error::Parameter {
                name: name.clone(),
                msg: format!("the compiled step holds {} but the rank's shard is {}", x.shape(), p.local_shape()),
            });
        }
        *p = Tensor::from_local(
            p.backend(),
            x.storage().clone(),
            p.shape().clone(),
            x.shape().clone(),
            p.placements(),
            p.dtype(),
        )
        .into_var();
        moments.insert(format!("adam_m/{name}"), StateTensor::Device(st.m.remove(name).ok_or_else(missing)?));
        moments.insert(format!("adam_v/{name}"), StateTensor::Device(st.v.remove(name).ok_or_else(missing)?));
    }
    opt.load_state(st.steps, moments)
}

/// Why a compiled step cannot run `cfg` (`None`: it can): it runs AdamW without ZeRO, f32
/// compute and one micro-batch per step. The one statement of these rules: the trainer
/// refuses such a configuration with it, and front ends ask it before choosing a compiled
/// step.
pub fn ineligible(cfg: &TrainConfig) -> Option<String> {
    if let OptimizerConfig::Sgd { .. } = cfg.optimizer {
        return Some("compiled steps run AdamW".into());
    }
    let zero = cfg.zero_stage();
    if zero != ZeroStage::Off {
        return Some(format!("compiled steps do not shard the training state over dp (ZeRO-{})", zero.number()));
    }
    if cfg.compute_dtype != DType::F32 {
        return Some(format!("compiled steps compute in f32 (got {:?})", cfg.compute_dtype));
    }
    if cfg.accumulate != 1 {
        return Some(format!("compiled steps take one micro-batch per step (got {})", cfg.accumulate));
    }
    None
}
