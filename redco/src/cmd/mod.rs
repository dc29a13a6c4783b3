//! One module per `redco` subcommand.

pub mod common;
pub mod eval_dump;
pub mod info;
pub mod plan;
pub mod train;
