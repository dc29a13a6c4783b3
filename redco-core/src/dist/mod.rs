//! Distribution: the device mesh, collectives, the SPMD runner, and (built on them) the
//! redistribution of tensors between placements.
//!
//! This module sits above [`Tensor`](crate::Tensor): tensors only carry their
//! [`Placements`](crate::Placements); moving data between placements happens here.

pub(crate) mod axis_index;
pub mod collective;
pub(crate) mod cross_entropy;
pub mod data_parallel;
pub(crate) mod embed;
pub mod factory;
pub mod group;
pub mod heuristics;
pub mod host;
pub mod mesh;
pub mod plan;
pub mod planner;
pub mod redistribute;
pub(crate) mod rules;
pub mod spmd;
pub mod store;
pub mod threads;
pub mod trace;
pub mod world;

pub use collective::{Collective, CollectiveKind, CommCount, CommStats, Pending, ReduceKind};
pub use factory::{CommFactory, RunComms, Threads};
pub use group::{GroupAxis, ProcessGroup};
pub use mesh::Mesh;
pub use plan::{ParamPlan, Role, ShardPlan};
pub use redistribute::axis_sizes;
pub use spmd::{current_comm, on_backend, spmd, spmd_cpu, spmd_with, Comm, CommGuard, Rank, SpmdOptions};
pub use store::Store;
pub use threads::{Hub, ThreadCollective};
pub use world::{Launcher, World};
