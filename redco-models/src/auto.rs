//! One type for every decoder-only architecture, picked by `config.json`'s `model_type`:
//! what the command line and other generic code load, run, train and generate with.

use crate::generate::{CausalLm, KvCache};
use crate::gptj::GptJ;
use crate::hf::config::HfConfig;
use crate::llama::Llama;
use crate::opt::Opt;
use redco_core::nn::{Linear, Module, ParamPlacer};
use redco_core::planning::ShardPlan;
use redco_core::recompute::Recompute;
use redco_core::{Backend, DType, Error, Result, Tensor};
use std::path::Path;

/// A decoder-only language model of any supported architecture.
pub enum AutoModel<B: Backend> {
    /// LLaMA (and Mistral-style configs).
    Llama(Llama<B>),
    /// GPT-J.
    GptJ(GptJ<B>),
    /// OPT.
    Opt(Opt<B>),
}

/// The `model_type`s [`AutoModel`] loads.
pub const SUPPORTED: [&str; 7] = ["llama", "mistral", "mixtral", "qwen3", "qwen3_moe", "gptj", "opt"];

impl<B: Backend> AutoModel<B> {
    /// Activation checkpointing per decoder layer, block or selective (see
    /// [`Llama::set_recompute`]), for every architecture.
    pub fn set_recompute(&mut self, mode: Recompute) {
        match self {
            AutoModel::Llama(m) => m.set_recompute(mode),
            AutoModel::GptJ(m) => m.set_recompute(mode),
            AutoModel::Opt(m) => m.set_recompute(mode),
        }
    }

    /// Sets a mixture of experts' capacity factor ([`Llama::set_capacity_factor`]); an error
    /// for a model without experts.
    pub fn set_capacity_factor(&mut self, factor: Option<f64>) -> Result<()> {
        match self {
            AutoModel::Llama(m) => m.set_capacity_factor(factor),
            _ if factor.is_none() => Ok(()),
            _ => Err(Error::config("moe", "a capacity factor for a model without experts")),
        }
    }

    /// The token slots a mixture of experts' capacity factor dropped and the slots routed
    /// since the last call ([`Llama::take_dropped`]); `(0, 0)` for other models.
    pub fn take_dropped(&self) -> Result<(u64, u64)> {
        match self {
            AutoModel::Llama(m) => m.take_dropped(),
            _ => Ok((0, 0)),
        }
    }

    /// Loads `dir` (under a plan, each rank reads only its slices).
    pub fn from_pretrained(b: &B, dir: &Path, dtype: DType, plan: Option<&ShardPlan>) -> Result<Self> {
        let cfg = HfConfig::from_dir(dir)?;
        Ok(match cfg.model_type.as_str() {
            "llama" | "mistral" | "mixtral" | "qwen3" | "qwen3_moe" => {
                AutoModel::Llama(Llama::from_pretrained_split(b, dir, dtype, plan)?)
            }
            "gptj" => AutoModel::GptJ(GptJ::from_pretrained(b, dir, dtype, plan)?),
            "opt" => AutoModel::Opt(Opt::from_pretrained(b, dir, dtype, plan)?),
            other => return Err(unsupported(other)),
        })
    }

    /// [`AutoModel::from_pretrained`] with the linear layers (not a mixture's routers)
    /// quantized to blocks of `format`: as each is read for the LLaMA family (the float
    /// model is never whole, [`crate::params::Quantizing`]), after loading for the others.
    /// The layers left in floats (rows not whole blocks) are [`AutoModel::float_linears`].
    pub fn from_pretrained_quantized(
        b: &B,
        dir: &Path,
        dtype: DType,
        plan: Option<&ShardPlan>,
        format: redco_core::quant::QuantFormat,
    ) -> Result<Self> {
        let cfg = HfConfig::from_dir(dir)?;
        Ok(match cfg.model_type.as_str() {
            "llama" | "mistral" | "mixtral" | "qwen3" | "qwen3_moe" => {
                AutoModel::Llama(Llama::from_pretrained_quantized(b, dir, dtype, plan, format)?)
            }
            _ => {
                let mut m = Self::from_pretrained(b, dir, dtype, plan)?;
                m.quantize(format)?;
                m
            }
        })
    }

    /// The linear layers (not a mixture's routers) whose weights are floats, by name.
    pub fn float_linears(&self) -> Vec<String> {
        let mut out = Vec::new();
        self.visit_linears("", &mut |name, l| {
            if l.quant.is_none() && !name.ends_with(".gate") {
                out.push(name.to_string());
            }
        });
        out
    }

    /// [`AutoModel::new`] with each parameter handed to `placer` as it is made (see
    /// [`Llama::new_placed`]): no rank holds more than its part of the model beyond the
    /// tensor being made.
    pub fn new_placed(b: &B, cfg: &HfConfig, dtype: DType, seed: u64, placer: &dyn ParamPlacer<B>) -> Result<Self> {
        Ok(match cfg.model_type.as_str() {
            "llama" | "mistral" | "mixtral" | "qwen3" | "qwen3_moe" => {
                AutoModel::Llama(Llama::new_placed(b, cfg, dtype, seed, placer)?)
            }
            "gptj" => AutoModel::GptJ(GptJ::new_placed(b, cfg, dtype, seed, placer)?),
            "opt" => AutoModel::Opt(Opt::new_placed(b, cfg, dtype, seed, placer)?),
            other => return Err(unsupported(other)),
        })
    }

    /// [`AutoModel::from_pretrained`] with each tensor handed to `placer` as it is read.
    /// A directory holding quantized blocks is refused: training updates float weights.
    pub fn from_pretrained_placed(b: &B, dir: &Path, dtype: DType, placer: &dyn ParamPlacer<B>) -> Result<Self> {
        let cfg = HfConfig::from_dir(dir)?;
        if !cfg.block_formats()?.is_empty() || cfg.int4()?.is_some() {
            return Err(redco_core::Error::unsupported(
                "load",
                format!(
                    "training from {}: its linear layers are quantized blocks or int4 (training updates floats)",
                    dir.display()
                ),
            ));
        }
        Ok(match cfg.model_type.as_str() {
            "llama" | "mistral" | "mixtral" | "qwen3" | "qwen3_moe" => {
                AutoModel::Llama(Llama::from_pretrained_placed(b, dir, dtype, placer)?)
            }
            "gptj" => AutoModel::GptJ(GptJ::from_pretrained_placed(b, dir, dtype, placer)?),
            "opt" => AutoModel::Opt(Opt::from_pretrained_placed(b, dir, dtype, placer)?),
            other => return Err(unsupported(other)),
        })
    }

    /// A randomly initialised model for `cfg`.
    pub fn new(b: &B, cfg: &HfConfig, dtype: DType, seed: u64) -> Result<Self> {
        Ok(match cfg.model_type.as_str() {
            "llama" | "mistral" | "mixtral" | "qwen3" | "qwen3_moe" => {
                AutoModel::Llama(Llama::new(b, cfg, dtype, seed)?)
            }
            "gptj" => AutoModel::GptJ(GptJ::new(b, cfg, dtype, seed)?),
            "opt" => AutoModel::Opt(Opt::new(b, cfg, dtype, seed)?),
            other => return Err(unsupported(other)),
        })
    }

    /// Quantizes the linear layers (not a mixture's routers) to blocks of `format`, each
    /// rank its part of a layer split over `mp` (`--quantize`); returns the layers
    /// quantized and those left in floats (rows not whole blocks).
    pub fn quantize(&mut self, format: redco_core::quant::QuantFormat) -> Result<(Vec<String>, Vec<String>)> {
        redco_core::nn::quantize_linears(self, format, &|name| !name.ends_with(".gate"))
    }

    /// The configuration.
    pub fn cfg(&self) -> &HfConfig {
        match self {
            AutoModel::Llama(m) => &m.cfg,
            AutoModel::GptJ(m) => &m.cfg,
            AutoModel::Opt(m) => &m.cfg,
        }
    }

    /// Logits `[batch, seq, vocab]` as transformers' forward computes them.
    pub fn forward(&self, ids: &Tensor<B>, mask: Option<&Tensor<B>>) -> Result<Tensor<B>> {
        match self {
            AutoModel::Llama(m) => m.forward(ids, mask, None),
            AutoModel::GptJ(m) => m.forward(ids, mask, None),
            AutoModel::Opt(m) => m.forward(ids, mask),
        }
    }

    /// transformers' causal-LM loss (shifted inside; -100 ignored).
    pub fn loss(&self, ids: &Tensor<B>, mask: Option<&Tensor<B>>, labels: &Tensor<B>) -> Result<Tensor<B>> {
        match self {
            AutoModel::Llama(m) => m.loss(ids, mask, labels),
            AutoModel::GptJ(m) => m.loss(ids, mask, labels),
            AutoModel::Opt(m) => m.loss(ids, mask, labels),
        }
    }
}

fn unsupported(t: &str) -> Error {
    Error::unsupported("model", format!("model_type `{t}` is not supported (supported: {})", SUPPORTED.join(", ")))
}

impl<B: Backend> Module<B> for AutoModel<B> {
    fn visit(&self, p: &str, f: &mut dyn FnMut(&str, &Tensor<B>)) {
        match self {
            AutoModel::Llama(m) => m.visit(p, f),
            AutoModel::GptJ(m) => m.visit(p, f),
            AutoModel::Opt(m) => m.visit(p, f),
        }
    }
    fn visit_mut(&mut self, p: &str, f: &mut dyn FnMut(&str, &mut Tensor<B>)) {
        match self {
            AutoModel::Llama(m) => m.visit_mut(p, f),
            AutoModel::GptJ(m) => m.visit_mut(p, f),
            AutoModel::Opt(m) => m.visit_mut(p, f),
        }
    }
    fn visit_linears(&self, p: &str, f: &mut dyn FnMut(&str, &Linear<B>)) {
        match self {
            AutoModel::Llama(m) => m.visit_linears(p, f),
            AutoModel::GptJ(m) => m.visit_linears(p, f),
            AutoModel::Opt(m) => m.visit_linears(p, f),
        }
    }
    fn visit_linears_mut(&mut self, p: &str, f: &mut dyn FnMut(&str, &mut Linear<B>)) {
        match self {
            AutoModel::Llama(m) => m.visit_linears_mut(p, f),
            AutoModel::GptJ(m) => m.visit_linears_mut(p, f),
            AutoModel::Opt(m) => m.visit_linears_mut(p, f),
        }
    }
    fn gather_units(&self) -> Vec<String> {
        match self {
            AutoModel::Llama(m) => m.gather_units(),
            AutoModel::GptJ(m) => m.gather_units(),
            AutoModel::Opt(m) => m.gather_units(),
        }
    }
    fn set_param_gather(&mut self, g: Option<std::sync::Arc<dyn redco_core::nn::ParamGather<B>>>) -> Result<()> {
        match self {
            AutoModel::Llama(m) => m.set_param_gather(g),
            AutoModel::GptJ(m) => m.set_param_gather(g),
            AutoModel::Opt(m) => m.set_param_gather(g),
        }
    }
}

impl<B: Backend> CausalLm<B> for AutoModel<B> {
    fn config(&self) -> &HfConfig {
        self.cfg()
    }
    fn runs_ragged(&self) -> bool {
        true
    }
    fn next_logits(
        &self,
        ids: &Tensor<B>,
        mask: &Tensor<B>,
        pos: &Tensor<B>,
        cache: &mut KvCache<B>,
    ) -> Result<Tensor<B>> {
        match self {
            AutoModel::Llama(m) => m.next_logits(ids, mask, pos, cache),
            AutoModel::GptJ(m) => m.next_logits(ids, mask, pos, cache),
            AutoModel::Opt(m) => m.next_logits(ids, mask, pos, cache),
        }
    }
    fn ragged_logits(
        &self,
        ids: &Tensor<B>,
        positions: &Tensor<B>,
        rows: &[usize],
        attend: &mut crate::generate::RaggedAttend<'_, B>,
    ) -> Result<Tensor<B>> {
        match self {
            AutoModel::Llama(m) => m.ragged_logits(ids, positions, rows, attend),
            AutoModel::GptJ(m) => m.ragged_logits(ids, positions, rows, attend),
            AutoModel::Opt(m) => m.ragged_logits(ids, positions, rows, attend),
        }
    }
}
