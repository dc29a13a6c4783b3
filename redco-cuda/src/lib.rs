//! `redco-cuda`: the CUDA backend of redco-rs (not yet implemented).
//!
//! This crate will implement the `redco_core::Backend` trait over cudarc (cuBLAS for
//! matmul, NVRTC-compiled kernels from `kernels/<family>.cu`, no nvcc at build time) and
//! the NCCL `Collective`. It depends on `redco-core` only. Until it lands, the crate
//! exports nothing: the `redco` facade's `cuda` feature is not offered.
