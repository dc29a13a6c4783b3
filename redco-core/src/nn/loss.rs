//! Losses.

use crate::{Backend, Result, Tensor};

/// The target value that cross-entropy ignores (transformers' convention).
pub const IGNORE_INDEX: i64 = -100;

/// Mean cross-entropy of `logits` `[.., vocab]` against integer `targets` `[..]`, over the
/// tokens whose target is not [`IGNORE_INDEX`] (0 when every token is ignored).
pub fn cross_entropy<B: Backend>(logits: &Tensor<B>, targets: &Tensor<B>) -> Result<Tensor<B>> {
    logits.cross_entropy(targets, IGNORE_INDEX)
}
