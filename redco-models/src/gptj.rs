//! GPT-J, written only with `redco-core` ops and `nn` (the split comes from the rules).
//! Names, shapes and numerics follow transformers' `GPTJForCausalLM`: one LayerNorm per
//! block feeding attention and MLP in parallel (`h + attn(ln(h)) + mlp(ln(h))`), rotary
//! embedding on the first `rotary_dim` features of q and k with interleaved pairs, no
//! biases in attention, a biased MLP (`gelu_new`) and a biased `lm_head`.

use crate::build::{self, embedding, layer_norm, linear};
use crate::generate::{CausalLm, KvCache, RaggedAttend};
use crate::hf::config::HfConfig;
use crate::params::{ParamSource, Placed, RandomInit};
use crate::stack::{LayerAttend, Stack, StackLayer};
use redco_core::nn::{self, Activation, Embedding, LayerNorm, Linear, Mlp, ParamPlacer, RotaryEmbedding};
use redco_core::planning::ShardPlan;
use redco_core::recompute::Recompute;
use redco_core::{Backend, DType, Error, Result, RotaryMode, Tensor};
use std::path::Path;

/// One GPT-J block.
#[derive(Clone)]
pub struct GptJBlock<B: Backend> {
    ln_1: LayerNorm<B>,
    q_proj: Linear<B>,
    k_proj: Linear<B>,
    v_proj: Linear<B>,
    out_proj: Linear<B>,
    mlp: Mlp<B>,
}

/// A GPT-J block's attention sizes.
#[derive(Debug, Clone, Copy)]
pub struct Heads {
    /// Attention heads.
    pub heads: usize,
    /// Features per head.
    pub head_dim: usize,
}

impl<B: Backend> StackLayer<B> for GptJBlock<B> {
    type Ctx = Heads;
    /// `side` is the rotary tables `[cos, sin]` (interleaved pairs); attention and MLP read
    /// the same LayerNorm output and add to the residual together.
    fn forward(
        &self,
        d: Heads,
        h: &Tensor<B>,
        side: &[Tensor<B>],
        attend: &mut LayerAttend<'_, B>,
    ) -> Result<Tensor<B>> {
        let (bs, t) = (h.dims()[0], h.dims()[1]);
        let (cos, sin) = (&side[0], &side[1]);
        let x = self.ln_1.forward(h)?;
        let split = |y: Tensor<B>| y.reshape([bs, t, d.heads, d.head_dim])?.transpose(1, 2);
        let q = split(self.q_proj.forward(&x)?)?.rotary(cos, sin, RotaryMode::Interleaved)?;
        let k = split(self.k_proj.forward(&x)?)?.rotary(cos, sin, RotaryMode::Interleaved)?;
        let v = split(self.v_proj.forward(&x)?)?;
        let a = attend(q, k, v)?;
        let attn = self.out_proj.forward(&a.transpose(1, 2)?.reshape([bs, t, d.heads * d.head_dim])?)?;
        h.add(&attn)?.add(&self.mlp.forward(&x)?)
    }
}

redco_core::module!(GptJBlock {
    ln_1: "ln_1",
    q_proj: "attn.q_proj",
    k_proj: "attn.k_proj",
    v_proj: "attn.v_proj",
    out_proj: "attn.out_proj",
    mlp: "mlp"
});

/// `GPTJForCausalLM`.
pub struct GptJ<B: Backend> {
    /// The configuration.
    pub cfg: HfConfig,
    wte: Embedding<B>,
    h: Vec<GptJBlock<B>>,
    ln_f: LayerNorm<B>,
    lm_head: Linear<B>,
    /// How the blocks run: gathered under ZeRO-3, recomputed in training.
    stack: Stack<B>,
}

redco_core::module!(GptJ { wte: "transformer.wte", h: "transformer.h", ln_f: "transformer.ln_f", lm_head: "lm_head" }
    /// The blocks.
    fn gather_units(&self) -> Vec<String> {
        self.stack.units(self.h.len())
    }
    fn set_param_gather(&mut self, g: Option<std::sync::Arc<dyn redco_core::nn::ParamGather<B>>>) -> Result<()> {
        self.stack.set_gather(g);
        Ok(())
    }
);

/// Stored buffers of older GPT-J checkpoints that are not parameters.
fn ignored(name: &str) -> bool {
    name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias")
}

impl<B: Backend> GptJ<B> {
    /// A randomly initialised model for `cfg`.
    pub fn new(b: &B, cfg: &HfConfig, dtype: DType, seed: u64) -> Result<Self> {
        Self::build(cfg, &mut RandomInit::new(b, dtype, seed))
    }

    /// [`GptJ::new`] with each parameter handed to `placer` as it is made (the trainer's
    /// keeps only this rank's part; see [`crate::llama::Llama::new_placed`]). The values are
    /// [`GptJ::new`]'s.
    pub fn new_placed(b: &B, cfg: &HfConfig, dtype: DType, seed: u64, placer: &dyn ParamPlacer<B>) -> Result<Self> {
        Self::build(cfg, &mut Placed::new(&mut RandomInit::new(b, dtype, seed), placer))
    }

    /// What each block recomputes in the backward pass of a training forward (see
    /// [`crate::llama::Llama::set_recompute`]; selective keeps the projections' and
    /// attention's outputs and recomputes the LayerNorm, rotary embeddings and GELU).
    pub fn set_recompute(&mut self, mode: Recompute) {
        self.stack.set_recompute(mode);
    }

    /// Checks that `cfg` describes a GPT-J this implementation runs.
    pub fn check_config(cfg: &HfConfig) -> Result<()> {
        if cfg.model_type != "gptj" {
            return Err(Error::config("gptj", format!("config has model_type `{}`, not gptj", cfg.model_type)));
        }
        let rd = cfg.rotary_dim.unwrap_or(cfg.head_dim);
        if rd > cfg.head_dim || !rd.is_multiple_of(2) {
            return Err(Error::config(
                "gptj",
                format!("rotary_dim {rd} must be even and at most the head dim {}", cfg.head_dim),
            ));
        }
        Activation::from_hf(&cfg.hidden_act).map(|_| ())
    }

    /// Builds the model with every parameter taken from `src` by its transformers name.
    pub fn build(cfg: &HfConfig, src: &mut dyn ParamSource<B>) -> Result<Self> {
        Self::check_config(cfg)?;
        let (h, i, eps) = (cfg.hidden, cfg.intermediate, cfg.norm_eps);
        let act = Activation::from_hf(&cfg.hidden_act)?;
        let wte = embedding(src, "transformer.wte", cfg.vocab, h, 0.02)?;
        let blocks = (0..cfg.layers)
            .map(|l| {
                let p = |s: &str| format!("transformer.h.{l}.{s}");
                Ok(GptJBlock {
                    ln_1: layer_norm(src, &p("ln_1"), h, eps)?,
                    q_proj: linear(src, &p("attn.q_proj"), h, h, false)?,
                    k_proj: linear(src, &p("attn.k_proj"), h, h, false)?,
                    v_proj: linear(src, &p("attn.v_proj"), h, h, false)?,
                    out_proj: linear(src, &p("attn.out_proj"), h, h, false)?,
                    mlp: Mlp {
                        fc_in: linear(src, &p("mlp.fc_in"), h, i, true)?,
                        fc_out: linear(src, &p("mlp.fc_out"), i, h, true)?,
                        act,
                    },
                })
            })
            .collect::<Result<_>>()?;
        let ln_f = layer_norm(src, "transformer.ln_f", h, eps)?;
        let lm_head = linear(src, "lm_head", h, cfg.vocab, true)?;
        Ok(GptJ { cfg: cfg.clone(), wte, h: blocks, ln_f, lm_head, stack: Stack::new("transformer.h") })
    }

    /// Loads `dir` (config.json + safetensors) with parameters of `dtype`, laid out by `plan`
    /// when given (inside an SPMD run: each rank reads only its slices).
    pub fn from_pretrained(b: &B, dir: &Path, dtype: DType, plan: Option<&ShardPlan>) -> Result<Self> {
        build::load(b, dir, dtype, plan, &["gptj"], &ignored, Self::build)
    }

    /// [`GptJ::from_pretrained`] with each tensor handed to `placer` as it is read.
    pub fn from_pretrained_placed(b: &B, dir: &Path, dtype: DType, placer: &dyn ParamPlacer<B>) -> Result<Self> {
        build::load(b, dir, dtype, None, &["gptj"], &ignored, |cfg, src| {
            Self::build(cfg, &mut Placed::new(src, placer))
        })
    }

    /// Logits `[batch, seq, vocab]` (positions `0..seq` unless given, as transformers'
    /// forward).
    pub fn forward(
        &self,
        ids: &Tensor<B>,
        mask: Option<&Tensor<B>>,
        positions: Option<&Tensor<B>>,
    ) -> Result<Tensor<B>> {
        let h = self.hidden_states(ids, mask, positions, None)?;
        self.lm_head.forward(&h)
    }

    /// Final hidden states; with a cache, `ids` follow the cached positions and `mask` covers
    /// cached + new positions.
    pub fn hidden_states(
        &self,
        ids: &Tensor<B>,
        mask: Option<&Tensor<B>>,
        positions: Option<&Tensor<B>>,
        mut cache: Option<&mut KvCache<B>>,
    ) -> Result<Tensor<B>> {
        let c = &self.cfg;
        if ids.rank() != 2 {
            return Err(Error::invalid("gptj", format!("input ids must be [batch, seq], got {}", ids.shape())));
        }
        let t = ids.dims()[1];
        let past = cache.as_ref().map_or(0, |k| k.len());
        crate::generate::check_context("gptj", past + t, c.max_positions)?;
        let default_pos;
        let pos = match positions {
            Some(p) => p,
            None => {
                default_pos = Tensor::arange(ids.backend(), past + t)?.narrow(0, past, t)?;
                &default_pos
            }
        };
        if cache.is_none() && self.stack.recomputes() {
            let (h, side) = self.embedded(ids, pos)?;
            return self.ln_f.forward(&self.stack.run_recomputed(&self.h, self.heads(), h, &side, mask)?);
        }
        let mut attend = |i: usize, q: Tensor<B>, k: Tensor<B>, v: Tensor<B>| -> Result<Tensor<B>> {
            let (k, v) = match cache.as_deref_mut() {
                Some(cache) => cache.append(i, k, v)?,
                None => (k, v),
            };
            nn::scaled_dot_product_attention(&q, &k, &v, mask, true, None)
        };
        self.layers_at(ids, pos, &mut attend)
    }

    /// The blocks' attention sizes.
    fn heads(&self) -> Heads {
        Heads { heads: self.cfg.heads, head_dim: self.cfg.head_dim }
    }

    /// The embedded `ids` and every block's side inputs: the rotary tables at `pos`.
    fn embedded(&self, ids: &Tensor<B>, pos: &Tensor<B>) -> Result<(Tensor<B>, [Tensor<B>; 2])> {
        let hd = self.cfg.head_dim;
        let rope = RotaryEmbedding::new(self.cfg.rotary_dim.unwrap_or(hd), 10000.0, RotaryMode::Interleaved)?;
        let (cos, sin) = rope.tables(pos, self.wte.weight.dtype())?;
        Ok((self.wte.forward(ids)?, [cos, sin]))
    }

    /// The blocks over `ids` (`[batch, t]`) at `pos`; `attend(layer, q, k, v)` is each
    /// layer's attention (with its cache). The final norm applied.
    fn layers_at(&self, ids: &Tensor<B>, pos: &Tensor<B>, attend: &mut RaggedAttend<'_, B>) -> Result<Tensor<B>> {
        let (h, side) = self.embedded(ids, pos)?;
        self.ln_f.forward(&self.stack.run(&self.h, self.heads(), h, &side, attend)?)
    }

    /// transformers' causal-LM loss (logits at `t` predict `labels` at `t + 1`, -100 ignored).
    pub fn loss(&self, ids: &Tensor<B>, mask: Option<&Tensor<B>>, labels: &Tensor<B>) -> Result<Tensor<B>> {
        let logits = self.forward(ids, mask, None)?;
        crate::generate::shifted_loss(&logits, labels)
    }
}

impl<B: Backend> CausalLm<B> for GptJ<B> {
    fn config(&self) -> &HfConfig {
        &self.cfg
    }
    fn runs_ragged(&self) -> bool {
        true
    }
    fn next_logits(
        &self,
        ids: &Tensor<B>,
        mask: &Tensor<B>,
        positions: &Tensor<B>,
        cache: &mut KvCache<B>,
    ) -> Result<Tensor<B>> {
        let h = self.hidden_states(ids, Some(mask), Some(positions), Some(cache))?;
        self.lm_head.forward(&crate::generate::last_position(&h)?)
    }
    fn ragged_logits(
        &self,
        ids: &Tensor<B>,
        positions: &Tensor<B>,
        rows: &[usize],
        attend: &mut RaggedAttend<'_, B>,
    ) -> Result<Tensor<B>> {
        crate::generate::check_ragged("gptj", ids, positions, rows)?;
        let h = self.layers_at(ids, positions, attend)?;
        self.lm_head.forward(&crate::generate::pick_rows(&h, rows)?)
    }
}
