//! Feed-forward blocks: the plain MLP and the gated MLP (SwiGLU / GeGLU).

use super::{Activation, Linear};
use crate::{Backend, DType, Result, Tensor};

/// `fc_out(act(fc_in(x)))` (GPT-J, OPT, T5 v1.0).
#[derive(Debug, Clone)]
pub struct Mlp<B: Backend> {
    /// Up projection.
    pub fc_in: Linear<B>,
    /// Down projection.
    pub fc_out: Linear<B>,
    /// Activation.
    pub act: Activation,
}

impl<B: Backend> Mlp<B> {
    /// A new MLP `dim -> hidden -> dim`.
    pub fn new(b: &B, dim: usize, hidden: usize, bias: bool, act: Activation, dtype: DType, seed: u64) -> Result<Self> {
        Ok(Mlp {
            fc_in: Linear::new(b, dim, hidden, bias, dtype, seed)?,
            fc_out: Linear::new(b, hidden, dim, bias, dtype, seed.wrapping_add(1))?,
            act,
        })
    }
    /// Applies the block.
    pub fn forward(&self, x: &Tensor<B>) -> Result<Tensor<B>> {
        self.fc_out.forward(&self.act.forward(&self.fc_in.forward(x)?)?)
    }
}

crate::module!(Mlp { fc_in: "fc_in", fc_out: "fc_out" });

/// `down_proj(act(gate_proj(x)) * up_proj(x))` (LLaMA, T5 v1.1).
#[derive(Debug, Clone)]
pub struct GatedMlp<B: Backend> {
    /// Gate projection (activated).
    pub gate_proj: Linear<B>,
    /// Up projection.
    pub up_proj: Linear<B>,
    /// Down projection.
    pub down_proj: Linear<B>,
    /// Activation of the gate.
    pub act: Activation,
}

impl<B: Backend> GatedMlp<B> {
    /// A new gated MLP `dim -> hidden -> dim`.
    pub fn new(b: &B, dim: usize, hidden: usize, bias: bool, act: Activation, dtype: DType, seed: u64) -> Result<Self> {
        Ok(GatedMlp {
            gate_proj: Linear::new(b, dim, hidden, bias, dtype, seed)?,
            up_proj: Linear::new(b, dim, hidden, bias, dtype, seed.wrapping_add(1))?,
            down_proj: Linear::new(b, hidden, dim, bias, dtype, seed.wrapping_add(2))?,
            act,
        })
    }
    /// Applies the block.
    pub fn forward(&self, x: &Tensor<B>) -> Result<Tensor<B>> {
        let g = self.act.forward(&self.gate_proj.forward(x)?)?;
        self.down_proj.forward(&g.mul(&self.up_proj.forward(x)?)?)
    }
}

crate::module!(GatedMlp { gate_proj: "gate_proj", up_proj: "up_proj", down_proj: "down_proj" });
