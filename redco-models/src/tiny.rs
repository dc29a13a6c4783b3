//! A small transformer language model built only from `redco-core` `nn` (no sharding code),
//! for examples and tests (not a Hugging Face architecture): LLaMA-shaped (RMSNorm, rotary, grouped-query
//! attention, gated SiLU MLP, no biases) and a GPT-shaped one (LayerNorm with bias, biased
//! projections, GELU MLP).

use redco_core::nn::{self, Activation, Embedding, GatedMlp, LayerNorm, Linear, Mlp, Module, RmsNorm, RotaryEmbedding};
use redco_core::{Backend, DType, Result, RotaryMode, Tensor};

/// Sizes of a test model.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// Vocabulary.
    pub vocab: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Layers.
    pub layers: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// MLP size.
    pub inter: usize,
    /// LLaMA-shaped (true) or GPT-shaped (false).
    pub llama: bool,
}

/// A norm of either kind.
pub enum Norm<B: Backend> {
    /// RMSNorm.
    Rms(RmsNorm<B>),
    /// LayerNorm with bias.
    Ln(LayerNorm<B>),
}

impl<B: Backend> Norm<B> {
    fn new(b: &B, c: &Config, dt: DType) -> Result<Self> {
        Ok(if c.llama {
            Norm::Rms(RmsNorm::new(b, c.hidden, 1e-5, dt)?)
        } else {
            Norm::Ln(LayerNorm::new(b, c.hidden, true, true, 1e-5, dt)?)
        })
    }
    fn forward(&self, x: &Tensor<B>) -> Result<Tensor<B>> {
        match self {
            Norm::Rms(n) => n.forward(x),
            Norm::Ln(n) => n.forward(x),
        }
    }
}

impl<B: Backend> Module<B> for Norm<B> {
    fn visit(&self, p: &str, f: &mut dyn FnMut(&str, &Tensor<B>)) {
        match self {
            Norm::Rms(n) => n.visit(p, f),
            Norm::Ln(n) => n.visit(p, f),
        }
    }
    fn visit_mut(&mut self, p: &str, f: &mut dyn FnMut(&str, &mut Tensor<B>)) {
        match self {
            Norm::Rms(n) => n.visit_mut(p, f),
            Norm::Ln(n) => n.visit_mut(p, f),
        }
    }
}

/// An MLP of either kind.
pub enum Ffn<B: Backend> {
    /// Gated SiLU.
    Gated(GatedMlp<B>),
    /// GELU.
    Plain(Mlp<B>),
}

impl<B: Backend> Module<B> for Ffn<B> {
    fn visit(&self, p: &str, f: &mut dyn FnMut(&str, &Tensor<B>)) {
        match self {
            Ffn::Gated(m) => m.visit(p, f),
            Ffn::Plain(m) => m.visit(p, f),
        }
    }
    fn visit_mut(&mut self, p: &str, f: &mut dyn FnMut(&str, &mut Tensor<B>)) {
        match self {
            Ffn::Gated(m) => m.visit_mut(p, f),
            Ffn::Plain(m) => m.visit_mut(p, f),
        }
    }
    fn visit_linears(&self, p: &str, f: &mut dyn FnMut(&str, &Linear<B>)) {
        match self {
            Ffn::Gated(m) => m.visit_linears(p, f),
            Ffn::Plain(m) => m.visit_linears(p, f),
        }
    }
    fn visit_linears_mut(&mut self, p: &str, f: &mut dyn FnMut(&str, &mut Linear<B>)) {
        match self {
            Ffn::Gated(m) => m.visit_linears_mut(p, f),
            Ffn::Plain(m) => m.visit_linears_mut(p, f),
        }
    }
}

/// One transformer block.
pub struct Block<B: Backend> {
    /// Pre-attention norm.
    pub norm1: Norm<B>,
    /// Query projection.
    pub q_proj: Linear<B>,
    /// Key projection.
    pub k_proj: Linear<B>,
    /// Value projection.
    pub v_proj: Linear<B>,
    /// Output projection.
    pub o_proj: Linear<B>,
    /// Pre-MLP norm.
    pub norm2: Norm<B>,
    /// The MLP.
    pub mlp: Ffn<B>,
}

/// The language model.
pub struct Lm<B: Backend> {
    /// Sizes.
    pub cfg: Config,
    /// Token embedding.
    pub embed: Embedding<B>,
    /// Blocks.
    pub layers: Vec<Block<B>>,
    /// Final norm.
    pub norm: Norm<B>,
    /// Output head.
    pub lm_head: Linear<B>,
}

redco_core::module!(Block {
    norm1: "norm1",
    q_proj: "attn.q_proj",
    k_proj: "attn.k_proj",
    v_proj: "attn.v_proj",
    o_proj: "attn.o_proj",
    norm2: "norm2",
    mlp: "mlp",
});

redco_core::module!(Lm { embed: "embed", layers: "layers", norm: "norm", lm_head: "lm_head" });

impl<B: Backend> Lm<B> {
    /// A model with deterministic weights from `seed` (the same on every rank).
    pub fn new(b: &B, cfg: Config, dt: DType, seed: u64) -> Result<Self> {
        let hd = cfg.hidden / cfg.heads;
        let bias = !cfg.llama;
        let mut layers = Vec::new();
        for l in 0..cfg.layers as u64 {
            let s = seed + 100 * (l + 1);
            let mlp = if cfg.llama {
                Ffn::Gated(GatedMlp::new(b, cfg.hidden, cfg.inter, false, Activation::Silu, dt, s + 10)?)
            } else {
                Ffn::Plain(Mlp::new(b, cfg.hidden, cfg.inter, true, Activation::Gelu, dt, s + 10)?)
            };
            layers.push(Block {
                norm1: Norm::new(b, &cfg, dt)?,
                q_proj: Linear::new(b, cfg.hidden, cfg.heads * hd, bias, dt, s + 1)?,
                k_proj: Linear::new(b, cfg.hidden, cfg.kv_heads * hd, bias, dt, s + 2)?,
                v_proj: Linear::new(b, cfg.hidden, cfg.kv_heads * hd, bias, dt, s + 3)?,
                o_proj: Linear::new(b, cfg.heads * hd, cfg.hidden, bias, dt, s + 4)?,
                norm2: Norm::new(b, &cfg, dt)?,
                mlp,
            });
        }
        Ok(Lm {
            cfg,
            embed: Embedding::new(b, cfg.vocab, cfg.hidden, 0.5, dt, seed)?,
            layers,
            norm: Norm::new(b, &cfg, dt)?,
            lm_head: Linear::new(b, cfg.hidden, cfg.vocab, false, dt, seed + 7)?,
        })
    }

    /// Logits `[batch, seq, vocab]` for `ids` `[batch, seq]` with an optional padding mask.
    pub fn forward(&self, ids: &Tensor<B>, mask: Option<&Tensor<B>>) -> Result<Tensor<B>> {
        let c = self.cfg;
        let (bs, t) = (ids.dims()[0], ids.dims()[1]);
        let hd = c.hidden / c.heads;
        let pos = Tensor::arange(ids.backend(), t)?;
        let rope = RotaryEmbedding::new(hd, 10000.0, RotaryMode::HalfSplit)?;
        let mut h = self.embed.forward(ids)?;
        for l in &self.layers {
            let x = l.norm1.forward(&h)?;
            let split = |y: Tensor<B>, n: usize| y.reshape([bs, t, n, hd])?.transpose(1, 2);
            let q = split(l.q_proj.forward(&x)?, c.heads)?;
            let k = split(l.k_proj.forward(&x)?, c.kv_heads)?;
            let v = split(l.v_proj.forward(&x)?, c.kv_heads)?;
            let (q, k) = if c.llama { (rope.forward(&q, &pos)?, rope.forward(&k, &pos)?) } else { (q, k) };
            let a = nn::scaled_dot_product_attention(&q, &k, &v, mask, true, None)?;
            let a = a.transpose(1, 2)?.reshape([bs, t, c.hidden])?;
            h = h.add(&l.o_proj.forward(&a)?)?;
            let x = l.norm2.forward(&h)?;
            let m = match &l.mlp {
                Ffn::Gated(m) => m.forward(&x)?,
                Ffn::Plain(m) => m.forward(&x)?,
            };
            h = h.add(&m)?;
        }
        self.lm_head.forward(&self.norm.forward(&h)?)
    }

    /// Mean next-token cross-entropy of `ids` under `labels` (-100 ignored), with an
    /// optional padding `mask`. The arguments come in transformers' order, the same as
    /// every other decoder-only model of this crate: `(ids, mask, labels)`. `labels` are
    /// already aligned with the logits (the label at `t` is the token predicted at `t`).
    pub fn loss(&self, ids: &Tensor<B>, mask: Option<&Tensor<B>>, labels: &Tensor<B>) -> Result<Tensor<B>> {
        nn::cross_entropy(&self.forward(ids, mask)?, labels)
    }
}
