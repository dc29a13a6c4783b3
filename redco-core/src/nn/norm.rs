//! `LayerNorm` and `RmsNorm` layers over the last dimension.

use super::{join, Init, Module};
use crate::{Backend, DType, Result, Tensor};

/// LayerNorm with optional scale and bias.
#[derive(Debug, Clone)]
pub struct LayerNorm<B: Backend> {
    /// `[dim]` scale.
    pub weight: Option<Tensor<B>>,
    /// `[dim]` bias.
    pub bias: Option<Tensor<B>>,
    /// Added to the variance.
    pub eps: f64,
}

impl<B: Backend> LayerNorm<B> {
    /// Scale 1 and bias 0 (when present).
    pub fn new(b: &B, dim: usize, affine: bool, bias: bool, eps: f64, dtype: DType) -> Result<Self> {
        Ok(LayerNorm {
            weight: if affine { Some(Init::Const(1.0).var(b, [dim], dtype, 0)?) } else { None },
            bias: if bias { Some(Init::Const(0.0).var(b, [dim], dtype, 0)?) } else { None },
            eps,
        })
    }
    /// Normalises the last dim.
    pub fn forward(&self, x: &Tensor<B>) -> Result<Tensor<B>> {
        x.layer_norm(self.weight.as_ref(), self.bias.as_ref(), self.eps)
    }
}

impl<B: Backend> Module<B> for LayerNorm<B> {
    fn visit(&self, p: &str, f: &mut dyn FnMut(&str, &Tensor<B>)) {
        self.weight.visit(&join(p, "weight"), f);
        self.bias.visit(&join(p, "bias"), f);
    }
    fn visit_mut(&mut self, p: &str, f: &mut dyn FnMut(&str, &mut Tensor<B>)) {
        self.weight.visit_mut(&join(p, "weight"), f);
        self.bias.visit_mut(&join(p, "bias"), f);
    }
}

/// RMSNorm (LLaMA, T5's layer norm) with a scale.
#[derive(Debug, Clone)]
pub struct RmsNorm<B: Backend> {
    /// `[dim]` scale.
    pub weight: Tensor<B>,
    /// Added to the mean square.
    pub eps: f64,
}

impl<B: Backend> RmsNorm<B> {
    /// Scale 1.
    pub fn new(b: &B, dim: usize, eps: f64, dtype: DType) -> Result<Self> {
        Ok(RmsNorm { weight: Init::Const(1.0).var(b, [dim], dtype, 0)?, eps })
    }
    /// Normalises the last dim.
    pub fn forward(&self, x: &Tensor<B>) -> Result<Tensor<B>> {
        x.rms_norm(Some(&self.weight), self.eps)
    }
}

impl<B: Backend> Module<B> for RmsNorm<B> {
    fn visit(&self, p: &str, f: &mut dyn FnMut(&str, &Tensor<B>)) {
        f(&join(p, "weight"), &self.weight);
    }
    fn visit_mut(&mut self, p: &str, f: &mut dyn FnMut(&str, &mut Tensor<B>)) {
        f(&join(p, "weight"), &mut self.weight);
    }
}
