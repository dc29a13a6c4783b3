//! `redco-tpu`: the PJRT backend of redco-rs.
//!
//! PJRT is the plugin interface of every XLA device: `libtpu` for TPUs, the CUDA plugin of
//! `jax-cuda13-pjrt` for NVIDIA GPUs, the XLA CPU plugin for CPUs (which CI uses). This
//! crate talks to a plugin through the PJRT C API, loaded at run time with `libloading`
//! from bindings generated once (`src/ffi`), so it builds with no XLA, no libclang and no
//! download.
//!
//! - [`Api`]: a plugin, from `REDCO_PJRT_PLUGIN` or a path, version-checked;
//! - [`Client`]: created with named options (e.g. `cpu_device_count`), its [`Device`]s;
//! - [`Buffer`]: arrays on a device, every redco dtype, host to device and back;
//! - [`Executable`]: StableHLO programs compiled with [`CompileOptions`] and executed;
//! - [`Pjrt`]: the eager [`redco_core::Backend`]: each op a StableHLO program ([`hlo`])
//!   recorded by the [`Tracer`] (itself a `Backend` whose storage is symbolic), compiled
//!   once per program and cached; fused ops are their composite defaults traced into one
//!   program, so XLA fuses them.
//!
//! Every PJRT error becomes a [`redco_core::Error::Backend`] carrying the plugin's message,
//! its code and the entry point (and, for compiles, the redco op the program was built for).

pub mod api;
mod backend;
mod buffer;
mod client;
pub mod collective;
mod decode;
mod eager;
mod event;
mod executable;
pub mod ffi;
pub mod hlo;
mod kv;
mod proto;
mod shared_step;
mod step;
mod storage;
pub mod trace;

pub use api::Api;
pub use buffer::Buffer;
pub use client::{Client, Device, OptionValue};
pub use collective::TracedCollective;
pub use decode::{CacheShape, CompiledDecode, KvPair};
pub use eager::{Pjrt, ProgramStats};
pub use executable::Executable;
pub use kv::KvStore;
pub use proto::CompileOptions;
pub use redco_pipeline::compiled::{StepInputs, StepReport};
pub use shared_step::{PjrtStepCompiler, SharedStep};
pub use step::CompiledTrainStep;
pub use storage::PjrtStorage;
pub use trace::Tracer;
