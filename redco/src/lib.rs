//! `redco`: the facade of redco-rs.
//!
//! Re-exports [`redco_core`] (tensors, autograd, `nn`, the CPU backend, and its layers:
//! `runtime`, `sharding`, `planning`, `pipeline`) and [`redco_models`]. Backends are picked
//! with Cargo features, one name each across feature, module, type and `--backend` flag:
//! `cpu` (default; `cpu::Cpu`, `--backend cpu`), `wgpu` (the portable GPU backend;
//! `redco::wgpu`, `Wgpu`, `--backend wgpu`), `cuda` (`redco::cuda`, `Cuda`, `--backend
//! cuda`), and `mpi` (ranks as processes, `redco::mpi`; a transport, not a backend). One
//! backend keeps two names, for a reason: the PJRT backend's crate and feature are named
//! for the devices it exists for (`redco-tpu`, feature `tpu`, `redco::tpu`), its type and
//! flag for the API it drives (`Pjrt`, `--backend pjrt`), because PJRT runs XLA's CPU and
//! GPU plugins as well as TPUs; `--backend tpu` is accepted as an alias. The `redco`
//! command-line program (train, generate, plan, eval-dump, convert, info) is built on it.
//!
//! What core leaves to front ends is here too: [`observe`] (TensorBoard event files, a
//! progress bar and the loss plot, as observers of a training run; `observe::standard()`
//! installs them) and [`plot`] (PNG charts with plotters and a bundled font).

pub use redco_core as core;
pub use redco_core::*;
pub use redco_core::{nn, optim, planning, runtime, sharding};
/// The CPU backend ([`redco_cpu`]), the embedded default.
pub use redco_cpu as cpu;
/// The CUDA backend ([`redco_cuda`]), with the `cuda` feature.
#[cfg(feature = "cuda")]
pub use redco_cuda as cuda;
pub use redco_models as models;
/// The three-function pipeline ([`redco_pipeline`]): deployer, trainer, predictor, checkpoints.
pub use redco_pipeline as pipeline;
pub mod observe;
pub mod plot;
/// The wgpu backend ([`redco_wgpu`]), with the `wgpu` feature.
#[cfg(feature = "wgpu")]
pub use redco_wgpu as wgpu;

/// Ranks as processes over MPI ([`redco_mpi`]), with the `mpi` feature.
#[cfg(feature = "mpi")]
pub use redco_mpi as mpi;

/// The PJRT backend ([`redco_tpu`]), with the `tpu` feature.
#[cfg(feature = "tpu")]
pub use redco_tpu as tpu;

/// The README's Rust examples, compiled and run as doc tests (`cargo test --doc -p redco`).
#[cfg(doctest)]
#[doc = include_str!("../../README.md")]
pub struct ReadmeExamples;

/// The user guide's Rust examples (`docs/guide.md`), compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../docs/guide.md")]
pub struct GuideExamples;

/// The parallelism guide's Rust examples (`docs/parallelism.md`), compiled and run as doc tests.
#[cfg(doctest)]
#[doc = include_str!("../../docs/parallelism.md")]
pub struct ParallelismExamples;
