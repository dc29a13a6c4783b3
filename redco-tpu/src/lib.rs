//! `redco-tpu`: the PJRT backend of redco-rs (not yet implemented).
//!
//! This crate will implement the `redco_core::Backend` trait by emitting StableHLO text
//! programs and running them through the PJRT C API (loaded with `libloading`): TPUs
//! through libtpu, and any other PJRT plugin (the XLA CPU plugin in CI). Storage is lazy:
//! programs are built op by op and run when the host asks for data. It depends on
//! `redco-core` only. Until it lands, the crate exports nothing.
