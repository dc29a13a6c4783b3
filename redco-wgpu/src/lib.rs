//! `redco-wgpu`: the portable GPU backend of redco-rs (not yet implemented).
//!
//! This crate will implement the `redco_core::Backend` trait over wgpu with WGSL kernels,
//! one file per op family (`matmul.rs` + `kernels/matmul.wgsl`, ...), a buffer pool, and a
//! host-staged `Collective` so that several wgpu devices can act as ranks of one mesh.
//! It depends on `redco-core` only. Until it lands, the crate exports nothing: the
//! `redco` facade's `wgpu` feature is not offered.
