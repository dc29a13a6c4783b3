//! `redco-pipeline`: the three-function pipeline, on redco-core and the CPU backend (the
//! default backend of its types, and the host of offloaded optimizers).
//!
//! A [`Deployer`] (mesh, seed, workdir), a [`Trainer`] built from `collate_fn`, `loss_fn`
//! and the model, and a [`Predictor`] built from `collate_fn` and `pred_fn`; with
//! checkpoints, metrics, data sources and the observer seam ([`observe::TrainObserver`])
//! that front ends watch a run through. It owns what a training run keeps on disk and
//! across ranks: checkpoints and resharding ([`checkpoint`]), run directories ([`run_dir`],
//! [`workdir`]), datasets ([`data`]), the gradient sync and ZeRO ([`grad_sync`], [`zero`])
//! and the optimizer as the trainer drives it ([`optimizer`]).

pub mod agree;
mod cadence;
pub mod checkpoint;
pub mod compiled;
pub mod data;
pub mod data_parallel;
mod deployer;
pub mod grad_sync;
pub mod integrity;
pub mod metrics;
pub mod observe;
pub mod optimizer;
mod placing;
mod predictor;
mod reshard;
pub use reshard::for_each_whole_param;
pub mod run_dir;
mod st_writer;
pub mod synthetic;
pub mod token_ids;
mod train_config;
mod train_state;
mod trainer;
pub mod workdir;
pub mod zero;

pub use deployer::{Deployer, MakeBackend, StepCtx};
pub use predictor::Predictor;
pub use run_dir::{ClaimOptions, RunDir};
pub use train_config::{NanPolicy, OptimizerConfig, TrainConfig, ZeroStage};
pub use trainer::{FitReport, StepProfile, Trainer};

use redco_core::Tensor;
use std::collections::BTreeMap;

/// A batch: named tensors, whole (the pipeline splits their first dim over `dp`).
pub type Batch<B> = BTreeMap<String, Tensor<B>>;
