//! Seeded dropout.

use crate::{Backend, Result, Tensor};

/// Inverted dropout with probability `p`; identity in eval mode.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dropout {
    /// Drop probability in `[0, 1)`.
    pub p: f64,
}

impl Dropout {
    /// Dropout with probability `p`.
    pub fn new(p: f64) -> Self {
        Dropout { p }
    }
    /// Drops with the mask drawn from `seed` when `train`, else returns `x`.
    pub fn forward<B: Backend>(&self, x: &Tensor<B>, seed: u64, train: bool) -> Result<Tensor<B>> {
        if train {
            x.dropout(self.p, seed)
        } else {
            Ok(x.clone())
        }
    }
}
