//! `Linear`: `y = x W^T + b` with the weight stored `[out, in]` (PyTorch layout), plus a
//! low-rank adapter's `scale * (x A^T) B^T` when one is attached ([`super::lora`]). A
//! layer's weight may be block-quantized ([`crate::quant`]): `weight` then holds the blocks
//! (`U8 [out, row_bytes]`) and `quant` their format.

use super::lora::LoraAdapter;
use super::{join, Init, Module};
use crate::quant::QuantFormat;
use crate::{Backend, DType, Error, HostData, MeshAxis, Placement, Result, Shape, Tensor};

/// A dense layer; `weight` is `[out_features, in_features]`.
#[derive(Debug, Clone)]
pub struct Linear<B: Backend> {
    /// `[out, in]`; with `quant`, its blocks `U8 [out, row_bytes]`.
    pub weight: Tensor<B>,
    /// `[out]`, when the layer has a bias.
    pub bias: Option<Tensor<B>>,
    /// A LoRA adapter added to the layer's output (see [`super::lora::add_lora`]).
    pub lora: Option<LoraAdapter<B>>,
    /// The format of `weight`'s blocks, when it is block-quantized.
    pub quant: Option<QuantFormat>,
}

impl<B: Backend> Linear<B> {
    /// A layer initialised as PyTorch does (uniform in `±1/sqrt(in)`), from `seed`.
    pub fn new(b: &B, in_features: usize, out_features: usize, bias: bool, dtype: DType, seed: u64) -> Result<Self> {
        let bound = 1.0 / (in_features.max(1) as f64).sqrt();
        let weight = Init::Uniform(bound).var(b, [out_features, in_features], dtype, seed)?;
        let bias = if bias { Some(Init::Uniform(bound).var(b, [out_features], dtype, seed ^ 0xb1a5)?) } else { None };
        Ok(Linear { weight, bias, lora: None, quant: None })
    }
    /// A layer from existing tensors (checked for shape agreement; a ZeRO-3 piece, a flat
    /// dp-slice a [`ParamPlacer`](super::ParamPlacer) kept, is checked when it is gathered).
    pub fn from_tensors(weight: Tensor<B>, bias: Option<Tensor<B>>) -> Result<Self> {
        if matches!(weight.placements().get(MeshAxis::Dp), Placement::Shard(_)) {
            return Ok(Linear { weight, bias, lora: None, quant: None });
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
        Ok(Linear { weight, bias, lora: None, quant: None })
    }
    /// A layer whose weight `[out, in]` is the blocks `blocks` (`U8 [out, row_bytes]`) of
    /// `format`.
    pub fn from_blocks(blocks: Tensor<B>, format: QuantFormat, bias: Option<Tensor<B>>) -> Result<Self> {
        if blocks.dtype() != DType::U8 || blocks.rank() != 2 {
            return Err(Error::invalid(
                "Linear",
                format!("{format} blocks must be U8 [out, bytes], got {:?} {}", blocks.dtype(), blocks.shape()),
            ));
        }
        format.row_values(blocks.dims()[1])?;
        Ok(Linear { weight: blocks, bias, lora: None, quant: Some(format) })
    }
    /// Quantizes the weight to blocks of `format` (rows of whole blocks), in place: the
    /// float weight is replaced by its blocks. A weight split over `mp` is quantized where
    /// it lies, each rank its part (split along `in`, each part must be whole blocks).
    /// Refused for a layer with an adapter, a weight split over dp, or one already quantized.
    pub fn quantize(&mut self, format: QuantFormat) -> Result<()> {
        if let Some(q) = self.quant {
            return Err(Error::invalid("quantize", format!("the layer is already quantized ({q})")));
        }
        let w = &self.weight;
        if self.lora.is_some() || w.rank() != 2 || !matches!(w.placements().get(MeshAxis::Dp), Placement::Replicate) {
            return Err(Error::unsupported(
                "quantize",
                format!("a layer with an adapter or a weight split over dp ({})", w.shape()),
            ));
        }
        let (n, k) = (w.dims()[0], w.dims()[1]);
        let (nl, kl) = (w.local_shape().dims()[0], w.local_shape().dims()[1]);
        let (row, row_l) = (format.row_bytes(k)?, format.row_bytes(kl)?);
        let b = w.backend().clone();
        let bytes = crate::quant::quantize(format, &b.download(w.storage())?.to_f32_vec())?;
        let s = b.upload_owned(HostData::U8(bytes))?;
        let blocks =
            Tensor::from_local(&b, s, Shape::new([n, row]), Shape::new([nl, row_l]), w.placements(), DType::U8);
        self.weight = blocks;
        self.quant = Some(format);
        Ok(())
    }
    /// Input features.
    pub fn in_features(&self) -> Result<usize> {
        match self.quant {
            Some(f) => f.row_values(self.weight.dims()[1]),
            None => Ok(self.weight.dims()[1]),
        }
    }
    /// `x [.., in] -> [.., out]`.
    pub fn forward(&self, x: &Tensor<B>) -> Result<Tensor<B>> {
        let y = match self.quant {
            Some(f) => x.matmul_quant(&self.weight, f)?,
            None => x.matmul_t(&self.weight)?,
        };
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

/// Quantizes every linear layer of `m` that `keep` accepts (by its name) to blocks of
/// `format` ([`Linear::quantize`]), as llama.cpp's quantizer does leaving in floats the
/// layers whose rows (this rank's part of them) are not whole blocks; returns the names
/// quantized and the names left in floats.
pub fn quantize_linears<B: Backend, M: Module<B> + ?Sized>(
    m: &mut M,
    format: QuantFormat,
    keep: &dyn Fn(&str) -> bool,
) -> Result<(Vec<String>, Vec<String>)> {
    let mut res = Ok((Vec::new(), Vec::new()));
    m.visit_linears_mut("", &mut |name, l| {
        if let Ok((done, left)) = &mut res {
            if !keep(name) || l.quant.is_some() {
                return;
            }
            // a rank's part of a row that is not whole blocks: Q8_0 for a K format where
            // it is whole blocks of 32 (`QuantFormat::held_as`), else left in floats
            let held = match l.weight.rank() {
                2 => format.held_as(l.weight.dims()[1], l.weight.local_shape().dims()[1]),
                _ => Some(format),
            };
            let Some(held) = held else {
                left.push(name.to_string());
                return;
            };
            match l.quantize(held) {
                Ok(()) => done.push(name.to_string()),
                Err(e) => res = Err(Error::invalid("quantize", format!("`{name}`: {e}"))),
            }
        }
    });
    res
}
