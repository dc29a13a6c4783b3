//! One module per `redco` subcommand.

pub mod check;
pub mod common;
pub mod convert;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod data;
pub mod eval_dump;
pub mod generate;
pub mod info;
pub mod launch;
pub mod logging;
pub mod lora;
pub mod out;
#[cfg(feature = "tpu")]
pub mod pjrt;
pub mod plan;
pub mod seq2seq;
pub mod train;
