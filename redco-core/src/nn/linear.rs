//! `Linear`: `y = x W^T + b` with the weight stored `[out, in]` (PyTorch layout), plus a
//! low-rank adapter's `scale * (x A^T) B^T` when one is attached ([`super::lora`]).

use super::lora::LoraAdapter;
use super::{join, Init, Module};
use crate::{Backend, DType, Error, MeshAxis, Placement, Result, Tensor};

/// A dense layer; `weight` is `[out_features, in_features]`.
#[derive(Debug, Clone)]
pub struct Linear<B: Backend> {
    /// `[out, in]`
    pub weight: Tensor<B>,
    /// `[out]`, when the layer has a bias.
    pub bias: Option<Tensor<B>>,
    /// A LoRA adapter added to the layer's output (see [`super::lora::add_lora`]).
    pub lora: Option<LoraAdapter<B>>,
}

impl<B: Backend> Linear<B> {
    /// A layer initialised as PyTorch does (uniform in `±1/sqrt(in)`), from `seed`.
    pub fn new(b: &B, in_features: usize, out_features: usize, bias: bool, dtype: DType, seed: u64) -> Result<Self> {
        let bound = 1.0 / (in_features.max(1) as f64).sqrt();
        let weight = Init::Uniform(bound).var(b, [out_features, in_features], dtype, seed)?;
        let bias = if bias { Some(Init::Uniform(bound).var(b, [out_features], dtype, seed ^ 0xb1a5)?) } else { None };
        Ok(Linear { weight, bias, lora: None })
    }
    /// A layer from existing tensors (checked for shape agreement; a ZeRO-3 piece, a flat
    /// dp-slice a [`ParamPlacer`](super::ParamPlacer) kept, is checked when it is gathered).
    pub fn from_tensors(weight: Tensor<B>, bias: Option<Tensor<B>>) -> Result<Self> {
        if matches!(weight.placements().get(MeshAxis::Dp), Placement::Shard(_)) {
            return Ok(Linear { weight, bias, lora: None });
        }
        if weight.rank() != 2 {
            return Err(Error::invalid("Linear", format!("weight must be [out, in], got {}", weight.shape())));
        }
        if let Some(b) = &bias {
            if b.dims() != [weight.dims()[0]] {
                return Err(Error::ShapeMismatch {
                    op: "Linear (bias)",
                    lhs: weight.shape().clone(),
                    rhs: b.shape().clone(),
                });
            }
        }
        Ok(Linear { weight, bias, lora: None })
    }
    /// `x [.., in] -> [.., out]`.
    pub fn forward(&self, x: &Tensor<B>) -> Result<Tensor<B>> {
        let y = x.matmul_t(&self.weight)?;
        let y = match &self.bias {
            Some(b) => y.add(b)?,
            None => y,
        };
        match &self.lora {
            Some(a) => y.add(&a.forward(x)?),
            None => Ok(y),
        }
    }
}

impl<B: Backend> Module<B> for Linear<B> {
    fn visit(&self, p: &str, f: &mut dyn FnMut(&str, &Tensor<B>)) {
        f(&join(p, "weight"), &self.weight);
        if let Some(b) = &self.bias {
            f(&join(p, "bias"), b);
        }
        if let Some(a) = &self.lora {
            f(&join(p, "lora_A.weight"), &a.a);
            f(&join(p, "lora_B.weight"), &a.b);
        }
    }
    fn visit_mut(&mut self, p: &str, f: &mut dyn FnMut(&str, &mut Tensor<B>)) {
        f(&join(p, "weight"), &mut self.weight);
        if let Some(b) = &mut self.bias {
            f(&join(p, "bias"), b);
        }
        if let Some(a) = &mut self.lora {
            f(&join(p, "lora_A.weight"), &mut a.a);
            f(&join(p, "lora_B.weight"), &mut a.b);
        }
    }
    fn visit_linears(&self, p: &str, f: &mut dyn FnMut(&str, &Linear<B>)) {
        f(p, self)
    }
    fn visit_linears_mut(&mut self, p: &str, f: &mut dyn FnMut(&str, &mut Linear<B>)) {
        f(p, self)
    }
}
