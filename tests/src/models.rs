//! The small test language models (they live in `redco_models::tiny`, shared with the
//! examples).

pub use redco_models::tiny::*;
