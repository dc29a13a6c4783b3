//! The sharding vocabulary in motion: the propagation rules that give an op's output
//! placement from its inputs' (the two rules of the design), redistribution between
//! placements, and the sharded forms of the ops that need communication inside them
//! (vocab-parallel embedding lookup and cross-entropy).
//!
//! Ops import this module; it imports the runtime (for a rank's communicator) and never
//! the planning layer or the training path.

pub(crate) mod axis_index;
pub(crate) mod cross_entropy;
pub(crate) mod embed;
pub mod flat_shard;
pub mod local;
pub mod redistribute;
pub(crate) mod rules;

pub use flat_shard::{FlatShard, ShardLayout};
pub use local::{all_gather_counts, mesh_position};
pub use redistribute::axis_sizes;
