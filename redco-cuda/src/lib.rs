//! redco-cuda: the CUDA backend of redco-rs.
//!
//! [`Cuda`] implements `redco_core::Backend` on one NVIDIA GPU: GEMMs through cuBLAS
//! (bf16 and f16 on tensor cores with f32 accumulation), every other op as a CUDA C kernel
//! of `kernels/` compiled by NVRTC for the GPU's architecture at first use, one stream,
//! and a caching allocator (size classes, buffers reused across steps, its high-water
//! mark in [`Cuda::memory`]).
//!
//! Every CUDA library is loaded at run time, so the crate builds with no toolkit and runs
//! its host-side tests with no GPU; without a driver [`Cuda::new`] and [`devices`] return
//! an error that says so.

#![warn(missing_docs)]

mod adamw;
mod alloc;
mod attention;
mod backend;
mod bounds;
mod context;
pub mod cudnn;
mod device;
mod elementwise;
mod fused;
mod index;
pub mod kernels;
mod launch;
mod layout;
mod matmul;
mod nccl;
mod nccl_run;
mod paged_attention;
mod profile;
mod quant;
mod reduce;
mod storage;

pub use alloc::MemoryStats;
pub use context::Cuda;
pub use device::{cublas_present, dense_peak_flops, devices, driver_present, nvrtc_present, GpuInfo};
pub use nccl::{nccl_present, Nccl};
pub use nccl_run::NcclFactory;
pub use profile::op_family;
pub use storage::CudaStorage;
