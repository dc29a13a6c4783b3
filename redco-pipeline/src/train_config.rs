//! The [`Trainer`](super::Trainer)'s options: the optimizer, the schedule, checkpoints,
//! mixed precision, and how a run relates to its workdir (resume, overwrite, identity).

use crate::optimizer::{Offloaded, OnDevice, TrainOptimizer};
use redco_core::optim::{AdamW, AdamWConfig, Decay, Optimizer, Schedule, Sgd};
use redco_core::{Backend, DType};
use redco_cpu::Cpu;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// What to do with a non-finite loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NanPolicy {
    /// Stop with an error naming the step and the examples (the default).
    Error,
    /// Skip the optimizer step and go on.
    Skip,
}

/// Which optimizer the trainer steps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OptimizerConfig {
    /// AdamW (optionally with ZeRO-1).
    AdamW(AdamWConfig),
    /// SGD with momentum and decoupled weight decay.
    Sgd {
        /// Momentum (0 for plain SGD).
        momentum: f64,
        /// Decoupled weight decay.
        weight_decay: f64,
    },
}

/// How much of a rank's training state is sharded over the data-parallel axis: ZeRO's
/// stages. Every stage computes the same update as the replicated one; each keeps less
/// per rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum ZeroStage {
    /// Nothing sharded: DDP (gradients all-reduced in buckets, every rank updates all).
    #[default]
    Off,
    /// Stage 1: AdamW's moments sharded (each gradient reduce-scattered in the optimizer,
    /// the updated slice all-gathered).
    Optimizer,
    /// Stage 2: the f32 masters, the optimizer state and the gradients sharded. Each
    /// gradient is reduce-scattered (in f32) as soon as the backward pass completes it and
    /// the full one dropped; clipping takes the global norm over the slices; the optimizer
    /// updates the slices (any elementwise optimizer: AdamW, SGD); the compute copies are
    /// all-gathered in the compute dtype.
    Gradients,
    /// Stage 3 (FSDP): stage 2, and the parameters of the model's units
    /// ([`Module::gather_units`](redco_core::nn::Module::gather_units), a transformer's blocks)
    /// are held only as f32 dp-slices: a unit's are all-gathered (in the compute dtype)
    /// just before it runs and dropped after, gathered again when a recomputed unit runs
    /// in backward, and their gradients reduce-scattered by the gather's backward. Without
    /// activation recompute a unit's gathered parameters stay alive, as the activations
    /// do, until its backward. Parameters outside the units (embeddings, the final norm,
    /// the head) are treated as at stage 2.
    Parameters,
}

impl ZeroStage {
    /// The stage's number (0 to 3).
    pub fn number(self) -> u8 {
        match self {
            ZeroStage::Off => 0,
            ZeroStage::Optimizer => 1,
            ZeroStage::Gradients => 2,
            ZeroStage::Parameters => 3,
        }
    }

    /// The stage numbered `n`; `None` for a stage redco does not have.
    pub fn from_number(n: u8) -> Option<Self> {
        match n {
            0 => Some(ZeroStage::Off),
            1 => Some(ZeroStage::Optimizer),
            2 => Some(ZeroStage::Gradients),
            3 => Some(ZeroStage::Parameters),
            _ => None,
        }
    }
}

impl OptimizerConfig {
    /// The optimizer for a run at ZeRO stage `zero` (AdamW shards its own moments at
    /// stage 1; at stage 2 it updates slices the trainer already cut), run on the host when
    /// `offload`.
    pub(crate) fn build_for<B: Backend>(&self, zero: ZeroStage, offload: bool) -> Box<dyn TrainOptimizer<B>> {
        if !offload {
            return Box::new(OnDevice(self.build(zero)));
        }
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        Box::new(Offloaded::<B>::new(self.build::<Cpu>(zero), threads))
    }

    /// The optimizer on `B` itself (see [`OptimizerConfig::build_for`]).
    pub(crate) fn build<B: Backend>(&self, zero: ZeroStage) -> Box<dyn Optimizer<B>> {
        match *self {
            OptimizerConfig::AdamW(c) => {
                let zero1 = match zero {
                    ZeroStage::Off => c.zero1,
                    ZeroStage::Optimizer => true,
                    ZeroStage::Gradients | ZeroStage::Parameters => false,
                };
                Box::new(AdamW::new(AdamWConfig { zero1, ..c }))
            }
            OptimizerConfig::Sgd { momentum, weight_decay } => Box::new(Sgd::new(0.0, momentum, weight_decay)),
        }
    }
}

/// Training options.
#[derive(Debug, Clone)]
pub struct TrainConfig {
    /// Examples per micro-batch (global: split over `dp`).
    pub batch_size: usize,
    /// Micro-batches per optimizer step.
    pub accumulate: usize,
    /// Optimizer steps.
    pub steps: u64,
    /// Learning rate per optimizer step.
    pub schedule: Schedule,
    /// The optimizer (its learning rate is replaced by the schedule's).
    pub optimizer: OptimizerConfig,
    /// Clip the global gradient norm to this value.
    pub clip_norm: Option<f64>,
    /// Checkpoint every N optimizer steps (and at the end).
    pub checkpoint_every: Option<u64>,
    /// Also checkpoint at the step where an epoch of the data ends.
    pub checkpoint_at_epoch_end: bool,
    /// Complete checkpoints to keep (0: all).
    pub keep_last: usize,
    /// Non-finite losses.
    pub nan: NanPolicy,
    /// ZeRO stage over the data-parallel axis (see [`TrainConfig::zero_stage`]; `Off` with
    /// an [`AdamWConfig::zero1`] optimizer is stage 1). Inert at dp = 1.
    pub zero: ZeroStage,
    /// ZeRO-3: how many consecutive units of the model ([`Module::gather_units`](redco_core::nn::Module::gather_units),
    /// its transformer blocks) one gather moves (and one recompute block spans): fewer,
    /// larger collectives against more parameters whole at a time. 1 (the default) gathers
    /// each block on its own; `redco_core::planning::strategy::strategies` picks it for a
    /// run the planner configures. 0 is refused; inert below stage 3.
    pub unit_layers: usize,
    /// Expert parallelism: a mixture of experts' experts split over this many ranks of the
    /// data-parallel axis, each rank holding its share and the tokens sent to it
    /// ([`ShardPlan::with_ep`](redco_core::planning::ShardPlan::with_ep)); 1 (the default)
    /// keeps every expert on every rank. It must be 1 or `dp`. Under ZeRO the experts are not
    /// sliced again: each rank's experts, their masters and optimizer state are its own.
    pub ep: usize,
    /// Write checkpoints and the final model export (the default). False: neither, for a
    /// benchmark or profiling run that keeps nothing (a 7B run's checkpoint is 80 GB of
    /// masters and moments); the run cannot be resumed.
    pub save: bool,
    /// Time the device's work by op family ([`Backend::profile_ops`](redco_core::Backend::profile_ops))
    /// over every step of the run after its first (compilation and first allocations are
    /// not steady state): [`FitReport::profile`](super::FitReport::profile). Each timed
    /// call costs the host a few microseconds; off by default.
    pub profile: bool,
    /// Offload the optimizer ([`Offloaded`](crate::optimizer::Offloaded)): its state and the
    /// f32 masters in host memory, the update on the host's CPU cores, the updated
    /// parameters uploaded in the compute dtype (a 16-bit run's device holds no f32
    /// master); for a device backend whose memory is short. With ZeRO-2 or 3, each rank's
    /// host holds its slice. Not with ZeRO-1 at dp > 1 or a compiled step (refused).
    pub offload: bool,
    /// Print a progress line every N steps (with `progress_lines`).
    pub log_every: u64,
    /// Print plain progress lines on stderr (every `log_every` steps, from the logging
    /// rank). A front end with its own progress display turns them off, or installs an
    /// observer that [shows progress](super::observe::TrainObserver::shows_progress).
    pub progress_lines: bool,
    /// The batch entry whose elements count as tokens for tokens/s.
    pub tokens_key: Option<String>,
    /// The model's vocabulary size: when set, the `tokens_key` entry of the first collated
    /// training batch (and of the first held-out batch) is checked against it once, before
    /// the first step, and an id outside `0..vocab_size` is an error naming the entry, the
    /// id and the size (instead of an out-of-range lookup inside the embedding).
    pub vocab_size: Option<usize>,
    /// Compute dtype: `F32`, or `BF16`/`F16` for mixed precision (half-precision
    /// parameters and activations, f32 master weights and optimizer state; f16 with
    /// dynamic loss scaling).
    pub compute_dtype: DType,
    /// f16 only: initial loss scale, and the number of overflow-free steps after which it
    /// doubles (it halves, and the step is skipped, when gradients overflow).
    pub loss_scale: (f64, u64),
    /// f32 data parallelism: start each gradient bucket's all-reduce during backward, as
    /// soon as its gradients are complete, instead of after it (the same sums). It pays
    /// where a core is free to move data while the others compute; on a host whose cores
    /// all compute it costs more than it saves (measured on 2 cores over MPI: the step
    /// 15% slower), so it is off by default.
    pub overlap_grad_sync: bool,
    /// With `fit(.., resume = true)`: resume from this checkpoint directory (a `step-*`
    /// directory of the workdir) instead of the newest one, e.g. an older verified one when
    /// the newest is refused as corrupt.
    pub resume_from: Option<PathBuf>,
    /// What makes this run this run (e.g. seed, data file and digest, model, dtype,
    /// vocabulary): recorded in every checkpoint; resuming requires every key to match.
    pub identity: BTreeMap<String, String>,
    /// Whether a run that does not resume may replace an earlier run in its workdir (its
    /// checkpoints and metrics); if false, such a run is refused.
    pub overwrite: bool,
}

impl TrainConfig {
    /// The ZeRO stage the run uses: [`TrainConfig::zero`], or stage 1 when it is `Off` and
    /// the optimizer is AdamW with [`AdamWConfig::zero1`].
    pub fn zero_stage(&self) -> ZeroStage {
        match (self.zero, self.optimizer) {
            (ZeroStage::Off, OptimizerConfig::AdamW(c)) if c.zero1 => ZeroStage::Optimizer,
            (z, _) => z,
        }
    }
}

impl Default for TrainConfig {
    fn default() -> Self {
        TrainConfig {
            batch_size: 8,
            accumulate: 1,
            steps: 100,
            schedule: Schedule { peak: 1e-3, warmup: 0, total: 100, decay: Decay::Constant },
            optimizer: OptimizerConfig::AdamW(AdamWConfig::default()),
            clip_norm: Some(1.0),
            checkpoint_every: None,
            checkpoint_at_epoch_end: true,
            keep_last: 2,
            nan: NanPolicy::Error,
            zero: ZeroStage::Off,
            unit_layers: 1,
            ep: 1,
            save: true,
            profile: false,
            offload: false,
            log_every: 10,
            progress_lines: true,
            tokens_key: Some("input_ids".into()),
            vocab_size: None,
            compute_dtype: DType::F32,
            loss_scale: (65536.0, 200),
            overlap_grad_sync: false,
            resume_from: None,
            identity: BTreeMap::new(),
            overwrite: false,
        }
    }
}
