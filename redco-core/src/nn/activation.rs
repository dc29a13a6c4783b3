//! Activation functions by name, as Hugging Face configs spell them.

use crate::{Backend, Error, Result, Tensor};

/// An activation function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `relu`
    Relu,
    /// `gelu` (exact erf form)
    Gelu,
    /// `gelu_new` / `gelu_pytorch_tanh` (tanh approximation)
    GeluTanh,
    /// `silu` / `swish`
    Silu,
}

impl Activation {
    /// Parses a Hugging Face `hidden_act` / `activation_function` name.
    pub fn from_hf(name: &str) -> Result<Self> {
        Ok(match name {
            "relu" => Activation::Relu,
            "gelu" => Activation::Gelu,
            "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Activation::GeluTanh,
            "silu" | "swish" => Activation::Silu,
            other => return Err(Error::unsupported("Activation", format!("unsupported activation `{other}`"))),
        })
    }
    /// Applies the activation.
    pub fn forward<B: Backend>(self, x: &Tensor<B>) -> Result<Tensor<B>> {
        match self {
            Activation::Relu => x.relu(),
            Activation::Gelu => x.gelu(),
            Activation::GeluTanh => x.gelu_tanh(),
            Activation::Silu => x.silu(),
        }
    }
}
