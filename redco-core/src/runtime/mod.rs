//! The parallel runtime: the device mesh, the world a job runs in (ranks, launcher, the
//! bootstrap store), collectives and process groups, the thread transport and its host
//! staging, and the SPMD runner that starts one closure per rank with its communicator.
//!
//! The runtime moves bytes; it knows nothing of ops, models or plans. Ops reach a rank's
//! communicator through [`current_comm`] (the one thread-scoped slot, see
//! `docs/ARCHITECTURE.md`); everything else is handed a [`Comm`].

pub mod factory;
pub mod group;
pub mod host;
pub mod spmd;
pub mod store;
pub mod threads;
pub mod world;

/// The collective trait and its vocabulary (defined beside the `Backend` trait).
pub use crate::backend::collective;
pub use crate::backend::collective::{
    Collective, CollectiveKind, CommCount, CommStats, Pending, ReduceKind, DEFAULT_BUCKET_BYTES,
};
pub use crate::backend::comm::{current_comm, Comm, CommGuard, CommSlot};
/// The device mesh (defined beside the `Backend` trait).
pub use crate::backend::mesh;
pub use crate::backend::mesh::Mesh;
pub use factory::{CommFactory, RunComms, Threads};
pub use group::{GroupAxis, ProcessGroup};
pub use spmd::{on_backend, spmd, spmd_with, Rank, SpmdOptions};
pub use store::Store;
pub use threads::{Hub, ThreadCollective};
pub use world::{Launcher, World};
