//! One module per `redco` subcommand.

pub mod info;
pub mod plan;
