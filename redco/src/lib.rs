//! `redco`: the facade of redco-rs.
//!
//! Re-exports [`redco_core`] (tensors, autograd, `nn`, the CPU backend) and
//! [`redco_models`]. Backends are picked with Cargo features: `cpu` (default) and `wgpu`
//! (the portable GPU backend, as `redco::wgpu`); `mpi` (ranks as
//! processes, as `redco::mpi`); `tpu` (the PJRT backend: TPUs, and GPUs and CPUs through
//! XLA's plugins, as `redco::tpu`); `cuda` arrives with its crate. The `redco`
//! command-line program (train, generate, plan, eval-dump, convert, info) is built on it.
//!
//! What core leaves to front ends is here too: [`observe`] (TensorBoard event files, a
//! progress bar and the loss plot, as observers of a training run; `observe::standard()`
//! installs them) and [`plot`] (PNG charts with plotters and a bundled font).

pub use redco_core as core;
pub use redco_core::*;
pub use redco_core::{cpu, nn, optim, pipeline, planning, runtime, sharding};
/// The CUDA backend ([`redco_cuda`]), with the `cuda` feature.
#[cfg(feature = "cuda")]
pub use redco_cuda as cuda;
pub use redco_models as models;
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
