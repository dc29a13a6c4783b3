//! One module per `redco` subcommand (`train/` is a folder: the training command's parts),
//! and the pieces they share: [`backends`] (the one match from `--backend` to a backend
//! type), [`check`] (flag parsers), [`cores`] (the CPU's devices), [`fits`] (refusing work
//! that cannot fit), [`model_config`], [`launch`] (ranks as processes), [`out`] and
//! [`logging`].

pub mod backends;
pub mod check;
pub mod convert;
pub mod cores;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod error;
pub mod eval_dump;
pub mod fits;
pub mod generate;
pub mod gguf_model;
pub mod info;
pub mod launch;
pub mod logging;
pub mod model_config;
pub mod out;
pub mod perplexity;
#[cfg(feature = "tpu")]
pub mod pjrt;
pub mod plan;
pub mod quantize;
pub mod serve;
pub mod train;
