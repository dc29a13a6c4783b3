//! One module per `redco` subcommand.

pub mod common;
pub mod convert;
pub mod eval_dump;
pub mod generate;
pub mod info;
pub mod launch;
#[cfg(feature = "tpu")]
pub mod pjrt;
pub mod plan;
pub mod train;
