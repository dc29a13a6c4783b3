//! One module per `redco` subcommand.

pub mod common;
pub mod convert;
pub mod eval_dump;
pub mod generate;
pub mod info;
pub mod launch;
pub mod plan;
pub mod train;
