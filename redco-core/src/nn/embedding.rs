//! `Embedding`: a lookup table `[vocab, dim]`.

use super::{join, Init, Module};
use crate::{Backend, DType, Result, Tensor};

/// A token embedding table.
#[derive(Debug, Clone)]
pub struct Embedding<B: Backend> {
    /// `[vocab, dim]`
    pub weight: Tensor<B>,
}

impl<B: Backend> Embedding<B> {
    /// A table drawn from N(0, std) with `seed`.
    pub fn new(b: &B, vocab: usize, dim: usize, std: f64, dtype: DType, seed: u64) -> Result<Self> {
        Ok(Embedding { weight: Init::Normal(std).var(b, [vocab, dim], dtype, seed)? })
    }
    /// Rows for integer `ids` of any shape: `[..] -> [.., dim]`. An id outside the
    /// vocabulary is an error.
    pub fn forward(&self, ids: &Tensor<B>) -> Result<Tensor<B>> {
        self.weight.index_select(ids, 0)
    }
}

impl<B: Backend> Module<B> for Embedding<B> {
    fn visit(&self, p: &str, f: &mut dyn FnMut(&str, &Tensor<B>)) {
        f(&join(p, "weight"), &self.weight);
    }
    fn visit_mut(&mut self, p: &str, f: &mut dyn FnMut(&str, &mut Tensor<B>)) {
        f(&join(p, "weight"), &mut self.weight);
    }
}
