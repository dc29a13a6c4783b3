//! T5 (v1.0 and v1.1), written only with `redco-core` ops and `nn`. Names, shapes and
//! numerics follow transformers' `T5ForConditionalGeneration`: RMS-style LayerNorm without
//! bias, attention without score scaling plus a relative-position bias (log buckets,
//! bidirectional in the encoder, causal in the decoder) from each stack's first layer, ReLU
//! (`wi`, `wo`) or gated-GELU (`wi_0`, `wi_1`, `wo`) feed-forward, and a head tied to the
//! shared embedding (scaled by `d_model ** -0.5`) or untied (unscaled).

use crate::build::{self, embedding, linear, rms_norm};
use crate::hf::config::HfConfig;
use crate::params::{ParamSource, RandomInit};
use redco_core::backend::CmpOp;
use redco_core::nn::{self, join, Activation, Embedding, Linear, Module, RmsNorm};
use redco_core::planning::ShardPlan;
use redco_core::recompute::Recompute;
use redco_core::{Backend, DType, Error, Result, Tensor};
use std::path::Path;

mod generate;

/// The most negative finite f32, added to masked scores as transformers does.
const MASKED: f64 = f32::MIN as f64;

/// One attention block (self or cross).
#[derive(Clone)]
pub struct T5Attention<B: Backend> {
    q: Linear<B>,
    k: Linear<B>,
    v: Linear<B>,
    o: Linear<B>,
    relative_attention_bias: Option<Embedding<B>>,
}

redco_core::module!(T5Attention { q: "q", k: "k", v: "v", o: "o", relative_attention_bias: "relative_attention_bias" });

/// The feed-forward block.
#[derive(Clone)]
pub enum T5Ff<B: Backend> {
    /// v1.0: `wo(relu(wi(x)))`.
    Dense {
        /// In.
        wi: Linear<B>,
        /// Out.
        wo: Linear<B>,
        /// Activation.
        act: Activation,
    },
    /// v1.1: `wo(act(wi_0(x)) * wi_1(x))`.
    Gated {
        /// Gate.
        wi_0: Linear<B>,
        /// Up.
        wi_1: Linear<B>,
        /// Out.
        wo: Linear<B>,
        /// Activation.
        act: Activation,
    },
}

impl<B: Backend> T5Ff<B> {
    fn forward(&self, x: &Tensor<B>) -> Result<Tensor<B>> {
        match self {
            T5Ff::Dense { wi, wo, act } => wo.forward(&act.forward(&wi.forward(x)?)?),
            T5Ff::Gated { wi_0, wi_1, wo, act } => wo.forward(&act.forward(&wi_0.forward(x)?)?.mul(&wi_1.forward(x)?)?),
        }
    }
}

impl<B: Backend> Module<B> for T5Ff<B> {
    fn visit(&self, p: &str, f: &mut dyn FnMut(&str, &Tensor<B>)) {
        match self {
            T5Ff::Dense { wi, wo, .. } => {
                wi.visit(&join(p, "wi"), f);
                wo.visit(&join(p, "wo"), f);
            }
            T5Ff::Gated { wi_0, wi_1, wo, .. } => {
                wi_0.visit(&join(p, "wi_0"), f);
                wi_1.visit(&join(p, "wi_1"), f);
                wo.visit(&join(p, "wo"), f);
            }
        }
    }
    fn visit_mut(&mut self, p: &str, f: &mut dyn FnMut(&str, &mut Tensor<B>)) {
        match self {
            T5Ff::Dense { wi, wo, .. } => {
                wi.visit_mut(&join(p, "wi"), f);
                wo.visit_mut(&join(p, "wo"), f);
            }
            T5Ff::Gated { wi_0, wi_1, wo, .. } => {
                wi_0.visit_mut(&join(p, "wi_0"), f);
                wi_1.visit_mut(&join(p, "wi_1"), f);
                wo.visit_mut(&join(p, "wo"), f);
            }
        }
    }
    fn visit_linears(&self, p: &str, f: &mut dyn FnMut(&str, &Linear<B>)) {
        match self {
            T5Ff::Dense { wi, wo, .. } => {
                wi.visit_linears(&join(p, "wi"), f);
                wo.visit_linears(&join(p, "wo"), f);
            }
            T5Ff::Gated { wi_0, wi_1, wo, .. } => {
                wi_0.visit_linears(&join(p, "wi_0"), f);
                wi_1.visit_linears(&join(p, "wi_1"), f);
                wo.visit_linears(&join(p, "wo"), f);
            }
        }
    }
    fn visit_linears_mut(&mut self, p: &str, f: &mut dyn FnMut(&str, &mut Linear<B>)) {
        match self {
            T5Ff::Dense { wi, wo, .. } => {
                wi.visit_linears_mut(&join(p, "wi"), f);
                wo.visit_linears_mut(&join(p, "wo"), f);
            }
            T5Ff::Gated { wi_0, wi_1, wo, .. } => {
                wi_0.visit_linears_mut(&join(p, "wi_0"), f);
                wi_1.visit_linears_mut(&join(p, "wi_1"), f);
                wo.visit_linears_mut(&join(p, "wo"), f);
            }
        }
    }
}

/// One encoder or decoder block.
#[derive(Clone)]
pub struct T5Block<B: Backend> {
    self_norm: RmsNorm<B>,
    self_attn: T5Attention<B>,
    cross: Option<(RmsNorm<B>, T5Attention<B>)>,
    ff_norm: RmsNorm<B>,
    ff: T5Ff<B>,
}

impl<B: Backend> Module<B> for T5Block<B> {
    fn visit(&self, p: &str, f: &mut dyn FnMut(&str, &Tensor<B>)) {
        self.self_norm.visit(&join(p, "layer.0.layer_norm"), f);
        self.self_attn.visit(&join(p, "layer.0.SelfAttention"), f);
        if let Some((n, a)) = &self.cross {
            n.visit(&join(p, "layer.1.layer_norm"), f);
            a.visit(&join(p, "layer.1.EncDecAttention"), f);
        }
        let ff = if self.cross.is_some() { 2 } else { 1 };
        self.ff_norm.visit(&join(p, &format!("layer.{ff}.layer_norm")), f);
        self.ff.visit(&join(p, &format!("layer.{ff}.DenseReluDense")), f);
    }
    fn visit_mut(&mut self, p: &str, f: &mut dyn FnMut(&str, &mut Tensor<B>)) {
        self.self_norm.visit_mut(&join(p, "layer.0.layer_norm"), f);
        self.self_attn.visit_mut(&join(p, "layer.0.SelfAttention"), f);
        let ff = if self.cross.is_some() { 2 } else { 1 };
        if let Some((n, a)) = &mut self.cross {
            n.visit_mut(&join(p, "layer.1.layer_norm"), f);
            a.visit_mut(&join(p, "layer.1.EncDecAttention"), f);
        }
        self.ff_norm.visit_mut(&join(p, &format!("layer.{ff}.layer_norm")), f);
        self.ff.visit_mut(&join(p, &format!("layer.{ff}.DenseReluDense")), f);
    }
    fn visit_linears(&self, p: &str, f: &mut dyn FnMut(&str, &Linear<B>)) {
        self.self_norm.visit_linears(&join(p, "layer.0.layer_norm"), f);
        self.self_attn.visit_linears(&join(p, "layer.0.SelfAttention"), f);
        if let Some((n, a)) = &self.cross {
            n.visit_linears(&join(p, "layer.1.layer_norm"), f);
            a.visit_linears(&join(p, "layer.1.EncDecAttention"), f);
        }
        let ff = if self.cross.is_some() { 2 } else { 1 };
        self.ff_norm.visit_linears(&join(p, &format!("layer.{ff}.layer_norm")), f);
        self.ff.visit_linears(&join(p, &format!("layer.{ff}.DenseReluDense")), f);
    }
    fn visit_linears_mut(&mut self, p: &str, f: &mut dyn FnMut(&str, &mut Linear<B>)) {
        self.self_norm.visit_linears_mut(&join(p, "layer.0.layer_norm"), f);
        self.self_attn.visit_linears_mut(&join(p, "layer.0.SelfAttention"), f);
        let ff = if self.cross.is_some() { 2 } else { 1 };
        if let Some((n, a)) = &mut self.cross {
            n.visit_linears_mut(&join(p, "layer.1.layer_norm"), f);
            a.visit_linears_mut(&join(p, "layer.1.EncDecAttention"), f);
        }
        self.ff_norm.visit_linears_mut(&join(p, &format!("layer.{ff}.layer_norm")), f);
        self.ff.visit_linears_mut(&join(p, &format!("layer.{ff}.DenseReluDense")), f);
    }
}

/// `T5ForConditionalGeneration`.
pub struct T5<B: Backend> {
    /// The configuration.
    pub cfg: HfConfig,
    shared: Embedding<B>,
    encoder: Vec<T5Block<B>>,
    encoder_norm: RmsNorm<B>,
    decoder: Vec<T5Block<B>>,
    decoder_norm: RmsNorm<B>,
    lm_head: Option<Linear<B>>,
    /// What each block recomputes in the backward pass of a training forward.
    recompute: Recompute,
}

redco_core::module!(T5 {
    shared: "shared",
    encoder: "encoder.block",
    encoder_norm: "encoder.final_layer_norm",
    decoder: "decoder.block",
    decoder_norm: "decoder.final_layer_norm",
    lm_head: "lm_head"
});

/// transformers' relative-position bucket of `rel` = key position - query position.
pub fn relative_bucket(rel: i64, bidirectional: bool, num_buckets: usize, max_distance: usize) -> i64 {
    let mut buckets = num_buckets as i64;
    let mut out = 0;
    let mut r = rel;
    if bidirectional {
        buckets /= 2;
        if r > 0 {
            out += buckets;
        }
        r = r.abs();
    } else {
        r = -r.min(0);
    }
    let max_exact = buckets / 2;
    if r < max_exact {
        return out + r;
    }
    // computed in f32 as torch does, then truncated
    let large = max_exact
        + ((r as f32 / max_exact as f32).ln() / (max_distance as f32 / max_exact as f32).ln()
            * (buckets - max_exact) as f32) as i64;
    out + large.min(buckets - 1)
}

/// The feed-forward activation and gating of `feed_forward_proj`.
fn ff_kind(cfg: &HfConfig) -> Result<(bool, Activation)> {
    let proj = cfg.hidden_act.as_str();
    let (gated, act) = match proj.strip_prefix("gated-") {
        Some(a) => (true, a),
        None => (false, proj),
    };
    // transformers maps "gated-gelu" to gelu_new
    let act = if gated && act == "gelu" { "gelu_new" } else { act };
    Ok((gated, Activation::from_hf(act)?))
}

/// The decoder's self-attention keys/values and the encoder's cross-attention keys/values.
pub struct T5Cache<B: Backend> {
    self_kv: Vec<Option<Kv<B>>>,
    cross_kv: Vec<Option<Kv<B>>>,
}

impl<B: Backend> T5Cache<B> {
    /// Decoder positions cached so far.
    pub fn len(&self) -> usize {
        self.self_kv.first().and_then(|l| l.as_ref()).map_or(0, |(k, _)| k.dims()[2])
    }
    /// Whether nothing is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Keeps the rows `rows` of the batch (beam reordering).
    pub fn select_rows(&mut self, rows: &Tensor<B>) -> Result<()> {
        for (k, v) in self.self_kv.iter_mut().chain(self.cross_kv.iter_mut()).flatten() {
            *k = k.index_select(rows, 0)?;
            *v = v.index_select(rows, 0)?;
        }
        Ok(())
    }
}

/// Keys and values `[batch, heads, len, head_dim]`.
type Kv<B> = (Tensor<B>, Tensor<B>);

fn heads<B: Backend>(x: &Tensor<B>, h: usize, d: usize) -> Result<Tensor<B>> {
    let (b, t) = (x.dims()[0], x.dims()[1]);
    x.reshape([b, t, h, d])?.transpose(1, 2)
}

impl<B: Backend> T5<B> {
    /// A randomly initialised model for `cfg`.
    pub fn new(b: &B, cfg: &HfConfig, dtype: DType, seed: u64) -> Result<Self> {
        Self::build(cfg, &mut RandomInit::new(b, dtype, seed))
    }

    /// Checks that `cfg` describes a T5 this implementation runs.
    pub fn check_config(cfg: &HfConfig) -> Result<()> {
        if cfg.model_type != "t5" {
            return Err(Error::config("t5", format!("config has model_type `{}`, not t5", cfg.model_type)));
        }
        ff_kind(cfg).map(|_| ())
    }

    fn buckets(&self) -> (usize, usize) {
        (
            self.cfg.num("relative_attention_num_buckets").unwrap_or(32),
            self.cfg.num("relative_attention_max_distance").unwrap_or(128),
        )
    }

    /// Builds the model with every parameter taken from `src` by its transformers name.
    pub fn build(cfg: &HfConfig, src: &mut dyn ParamSource<B>) -> Result<Self> {
        Self::check_config(cfg)?;
        let (d, inner, ff, eps) = (cfg.hidden, cfg.heads * cfg.head_dim, cfg.intermediate, cfg.norm_eps);
        let (gated, act) = ff_kind(cfg)?;
        let nb = cfg.num("relative_attention_num_buckets").unwrap_or(32);
        let shared = embedding(src, "shared", cfg.vocab, d, 1.0)?;
        let attn = |src: &mut dyn ParamSource<B>, p: &str, rel: bool| -> Result<T5Attention<B>> {
            Ok(T5Attention {
                q: linear(src, &format!("{p}.q"), d, inner, false)?,
                k: linear(src, &format!("{p}.k"), d, inner, false)?,
                v: linear(src, &format!("{p}.v"), d, inner, false)?,
                o: linear(src, &format!("{p}.o"), inner, d, false)?,
                relative_attention_bias: if rel {
                    Some(embedding(src, &format!("{p}.relative_attention_bias"), nb, cfg.heads, 1.0)?)
                } else {
                    None
                },
            })
        };
        let stack = |src: &mut dyn ParamSource<B>, name: &str, n: usize, decoder: bool| -> Result<Vec<T5Block<B>>> {
            (0..n)
                .map(|l| {
                    let p = |s: &str| format!("{name}.block.{l}.{s}");
                    let self_norm = rms_norm(src, &p("layer.0.layer_norm"), d, eps)?;
                    let self_attn = attn(src, &p("layer.0.SelfAttention"), l == 0)?;
                    let cross = if decoder {
                        Some((
                            rms_norm(src, &p("layer.1.layer_norm"), d, eps)?,
                            attn(src, &p("layer.1.EncDecAttention"), false)?,
                        ))
                    } else {
                        None
                    };
                    let f = if decoder { 2 } else { 1 };
                    let fp = |s: &str| p(&format!("layer.{f}.{s}"));
                    let ffb = if gated {
                        T5Ff::Gated {
                            wi_0: linear(src, &fp("DenseReluDense.wi_0"), d, ff, false)?,
                            wi_1: linear(src, &fp("DenseReluDense.wi_1"), d, ff, false)?,
                            wo: linear(src, &fp("DenseReluDense.wo"), ff, d, false)?,
                            act,
                        }
                    } else {
                        T5Ff::Dense {
                            wi: linear(src, &fp("DenseReluDense.wi"), d, ff, false)?,
                            wo: linear(src, &fp("DenseReluDense.wo"), ff, d, false)?,
                            act,
                        }
                    };
                    Ok(T5Block {
                        self_norm,
                        self_attn,
                        cross,
                        ff_norm: rms_norm(src, &fp("layer_norm"), d, eps)?,
                        ff: ffb,
                    })
                })
                .collect()
        };
        let encoder = stack(src, "encoder", cfg.layers, false)?;
        let encoder_norm = rms_norm(src, "encoder.final_layer_norm", d, eps)?;
        let decoder = stack(src, "decoder", cfg.num("num_decoder_layers").unwrap_or(cfg.layers), true)?;
        let decoder_norm = rms_norm(src, "decoder.final_layer_norm", d, eps)?;
        let lm_head = if cfg.tie_word_embeddings { None } else { Some(linear(src, "lm_head", d, cfg.vocab, false)?) };
        let recompute = Recompute::None;
        Ok(T5 { cfg: cfg.clone(), shared, encoder, encoder_norm, decoder, decoder_norm, lm_head, recompute })
    }

    /// Loads `dir` (config.json + safetensors) with parameters of `dtype`, laid out by `plan`
    /// when given. The encoder/decoder copies of the shared embedding are accepted.
    pub fn from_pretrained(b: &B, dir: &Path, dtype: DType, plan: Option<&ShardPlan>) -> Result<Self> {
        let cfg = HfConfig::from_dir(dir)?;
        let tied = cfg.tie_word_embeddings;
        let ignore = move |n: &str| {
            n == "encoder.embed_tokens.weight" || n == "decoder.embed_tokens.weight" || (tied && n == "lm_head.weight")
        };
        build::load(b, dir, dtype, plan, &["t5"], &ignore, Self::build)
    }

    /// The relative-position bias `[1, heads, q_len, k_len]` of the first layer's table, for
    /// queries at positions `past..past + q_len`.
    fn position_bias(
        &self,
        table: &Embedding<B>,
        q_len: usize,
        k_len: usize,
        past: usize,
        bidir: bool,
    ) -> Result<Tensor<B>> {
        let (nb, md) = self.buckets();
        let ids: Vec<i64> = (0..q_len * k_len)
            .map(|p| relative_bucket((p % k_len) as i64 - (past + p / k_len) as i64, bidir, nb, md))
            .collect();
        let ids = Tensor::from_vec(table.weight.backend(), ids, [q_len, k_len])?;
        table.forward(&ids)?.permute(&[2, 0, 1])?.unsqueeze(0)
    }

    /// `[batch, 1, 1, k]` additive mask: 0 where `mask` is 1, the most negative value elsewhere.
    fn additive(mask: &Tensor<B>, dtype: DType) -> Result<Tensor<B>> {
        let (b, k) = (mask.dims()[0], mask.dims()[1]);
        let keep = mask.compare_scalar(0.0, CmpOp::Ne)?;
        let zero = Tensor::scalar(mask.backend(), 0.0, dtype)?;
        let low = Tensor::scalar(mask.backend(), MASKED, dtype)?;
        keep.where_cond(&zero, &low)?.reshape([b, 1, 1, k])
    }

    fn attend(
        a: &T5Attention<B>,
        x: &Tensor<B>,
        kv: Option<Kv<B>>,
        src: &Tensor<B>,
        bias: &Tensor<B>,
        h: usize,
        dh: usize,
    ) -> Result<(Tensor<B>, Kv<B>)> {
        let q = heads(&a.q.forward(x)?, h, dh)?;
        let (k, v) = match kv {
            Some(kv) => kv,
            None => (heads(&a.k.forward(src)?, h, dh)?, heads(&a.v.forward(src)?, h, dh)?),
        };
        let s = q.matmul_t(&k)?.add(bias)?;
        let o = s.softmax(-1)?.matmul(&v)?;
        let (b, t) = (o.dims()[0], o.dims()[2]);
        Ok((a.o.forward(&o.transpose(1, 2)?.reshape([b, t, h * dh])?)?, (k, v)))
    }

    /// The encoder's output `[batch, seq, d_model]` for `ids` with padding `mask`.
    pub fn encode(&self, ids: &Tensor<B>, mask: Option<&Tensor<B>>) -> Result<Tensor<B>> {
        let (h, dh) = (self.cfg.heads, self.cfg.head_dim);
        let t = ids.dims()[1];
        let mut x = self.shared.forward(ids)?;
        let table = self.encoder[0].self_attn.relative_attention_bias.as_ref().ok_or_else(|| no_table("encoder"))?;
        let mut bias = self.position_bias(table, t, t, 0, true)?;
        if let Some(m) = mask {
            bias = bias.add(&Self::additive(m, x.dtype())?)?;
        }
        for blk in &self.encoder {
            x =
                self.block(blk, vec![x, bias.clone()], move |blk, xs| Self::encoder_block(blk, &xs[0], &xs[1], h, dh))?;
        }
        self.encoder_norm.forward(&x)
    }

    /// What each encoder and decoder block recomputes in the backward pass of a training
    /// forward (without a cache): nothing (the default), the whole block from its inputs
    /// ([`Recompute::Block`]), or its cheap ops ([`Recompute::Selective`]: the outputs of
    /// its matmuls kept, its norms, softmax and activations recomputed). The
    /// relative-position bias is made once per stack outside the blocks and handed in.
    pub fn set_recompute(&mut self, mode: Recompute) {
        self.recompute = mode;
    }

    /// `f(blk, inputs)`, as a recomputed block when recompute is on and gradients are
    /// recorded (its parameters: the block's, less the position table it does not read).
    fn block(
        &self,
        blk: &T5Block<B>,
        inputs: Vec<Tensor<B>>,
        f: impl Fn(&T5Block<B>, &[Tensor<B>]) -> Result<Tensor<B>> + Send + Sync + 'static,
    ) -> Result<Tensor<B>> {
        if !(self.recompute.on() && redco_core::is_grad_enabled()) {
            return f(blk, &inputs);
        }
        let mut params = Vec::new();
        blk.visit("", &mut |n, p| {
            if !n.ends_with("relative_attention_bias.weight") {
                params.push(p.clone())
            }
        });
        let owned = blk.clone();
        let run = move |xs: &[Tensor<B>]| f(&owned, xs);
        let (inputs, params) = (inputs.iter().collect::<Vec<_>>(), params.iter().collect::<Vec<_>>());
        match self.recompute {
            Recompute::Selective => Tensor::recompute_selective(&inputs, &params, run),
            _ => Tensor::recompute(&inputs, &params, run),
        }
    }

    /// An encoder block over `x` with the self-attention bias `bias`.
    fn encoder_block(blk: &T5Block<B>, x: &Tensor<B>, bias: &Tensor<B>, h: usize, dh: usize) -> Result<Tensor<B>> {
        let n = blk.self_norm.forward(x)?;
        let x = x.add(&Self::attend(&blk.self_attn, &n, None, &n, bias, h, dh)?.0)?;
        x.add(&blk.ff.forward(&blk.ff_norm.forward(&x)?)?)
    }

    /// A decoder block over `x` without a cache: self-attention under `self_bias`, then
    /// attention over the encoder output `enc` under `cross_bias`, then the feed-forward.
    #[allow(clippy::too_many_arguments)]
    fn decoder_block(
        blk: &T5Block<B>,
        x: &Tensor<B>,
        self_bias: &Tensor<B>,
        enc: &Tensor<B>,
        cross_bias: &Tensor<B>,
        h: usize,
        dh: usize,
    ) -> Result<Tensor<B>> {
        let n = blk.self_norm.forward(x)?;
        let x = x.add(&Self::attend(&blk.self_attn, &n, None, &n, self_bias, h, dh)?.0)?;
        let (cn, ca) =
            blk.cross.as_ref().ok_or_else(|| Error::invalid("t5", "a decoder block lacks cross-attention"))?;
        let x = x.add(&Self::attend(ca, &cn.forward(&x)?, None, enc, cross_bias, h, dh)?.0)?;
        x.add(&blk.ff.forward(&blk.ff_norm.forward(&x)?)?)
    }

    /// Decoder logits `[batch, tgt, vocab]` for `dec_ids` after the cached positions, over the
    /// encoder output `enc` (padding `enc_mask`).
    pub fn decode(
        &self,
        dec_ids: &Tensor<B>,
        enc: &Tensor<B>,
        enc_mask: Option<&Tensor<B>>,
        mut cache: Option<&mut T5Cache<B>>,
    ) -> Result<Tensor<B>> {
        let (h, dh) = (self.cfg.heads, self.cfg.head_dim);
        let t = dec_ids.dims()[1];
        let past = cache.as_ref().map_or(0, |c| c.len());
        let mut x = self.shared.forward(dec_ids)?;
        let table = self.decoder[0].self_attn.relative_attention_bias.as_ref().ok_or_else(|| no_table("decoder"))?;
        let mut self_bias = self.position_bias(table, t, past + t, past, false)?;
        if t > 1 {
            let causal = redco_core::ops::attention::causal_mask(x.backend(), t, past + t)?;
            let zero = Tensor::scalar(x.backend(), 0.0, x.dtype())?;
            let low = Tensor::scalar(x.backend(), MASKED, x.dtype())?;
            self_bias = self_bias.add(&causal.where_cond(&zero, &low)?)?;
        }
        let cross_bias = match enc_mask {
            Some(m) => Self::additive(m, x.dtype())?,
            None => Tensor::scalar(x.backend(), 0.0, x.dtype())?,
        };
        let incremental = cache.is_some();
        if !incremental {
            for blk in &self.decoder {
                let inputs = vec![x, self_bias.clone(), enc.clone(), cross_bias.clone()];
                x = self.block(blk, inputs, move |blk, xs| {
                    Self::decoder_block(blk, &xs[0], &xs[1], &xs[2], &xs[3], h, dh)
                })?;
            }
        }
        for (i, blk) in self.decoder.iter().enumerate().filter(|_| incremental) {
            let n = blk.self_norm.forward(&x)?;
            let q_in = n.clone();
            // self-attention over cached + new positions
            let a = &blk.self_attn;
            let (k_new, v_new) = (heads(&a.k.forward(&n)?, h, dh)?, heads(&a.v.forward(&n)?, h, dh)?);
            let (k, v) = match cache.as_deref_mut() {
                Some(c) => {
                    let slot = &mut c.self_kv[i];
                    let kv = match slot.take() {
                        Some((pk, pv)) => (Tensor::cat(&[&pk, &k_new], 2)?, Tensor::cat(&[&pv, &v_new], 2)?),
                        None => (k_new, v_new),
                    };
                    *slot = Some(kv.clone());
                    kv
                }
                None => (k_new, v_new),
            };
            x = x.add(&Self::attend(a, &q_in, Some((k, v)), &n, &self_bias, h, dh)?.0)?;
            let (cn, ca) =
                blk.cross.as_ref().ok_or_else(|| Error::invalid("t5", "a decoder block lacks cross-attention"))?;
            let n = cn.forward(&x)?;
            let cached = cache.as_deref_mut().and_then(|c| c.cross_kv[i].clone());
            let (out, kv) = Self::attend(ca, &n, cached, enc, &cross_bias, h, dh)?;
            if let Some(c) = cache.as_deref_mut() {
                c.cross_kv[i] = Some(kv);
            }
            x = x.add(&out)?;
            x = x.add(&blk.ff.forward(&blk.ff_norm.forward(&x)?)?)?;
        }
        let x = self.decoder_norm.forward(&x)?;
        // transformers scales by d_model ** -0.5 when `scale_decoder_outputs` (default: tied)
        let x = if self.cfg.flag("scale_decoder_outputs", self.cfg.tie_word_embeddings) {
            x.scale((self.cfg.hidden as f64).powf(-0.5))?
        } else {
            x
        };
        match &self.lm_head {
            Some(head) => head.forward(&x),
            None => x.matmul_t(&self.shared.weight),
        }
    }

    /// An empty decoding cache.
    pub fn new_cache(&self) -> T5Cache<B> {
        let n = self.decoder.len();
        T5Cache { self_kv: (0..n).map(|_| None).collect(), cross_kv: (0..n).map(|_| None).collect() }
    }

    /// `labels` shifted right behind `decoder_start_token_id`, -100 replaced by the pad id
    /// (transformers' `_shift_right`).
    pub fn shift_right(&self, labels: &Tensor<B>) -> Result<Tensor<B>> {
        let (b, t) = (labels.dims()[0], labels.dims()[1]);
        let start = self.cfg.num("decoder_start_token_id").unwrap_or(0) as i64;
        let pad = self.cfg.pad_token_id.unwrap_or(0);
        let l = labels.to_vec_i64()?;
        let mut out = Vec::with_capacity(b * t);
        for row in l.chunks(t) {
            out.push(start);
            out.extend(row[..t - 1].iter().map(|&x| if x == -100 { pad } else { x }));
        }
        Tensor::from_vec(labels.backend(), out, [b, t])
    }

    /// Decoder logits for `ids` (encoder input, `mask`) and `dec_ids` (the shifted labels
    /// when not given).
    pub fn forward(&self, ids: &Tensor<B>, mask: Option<&Tensor<B>>, dec_ids: &Tensor<B>) -> Result<Tensor<B>> {
        let enc = self.encode(ids, mask)?;
        self.decode(dec_ids, &enc, mask, None)
    }

    /// transformers' loss: cross-entropy of the decoder logits against `labels` (no shift;
    /// -100 ignored), the decoder reading `dec_ids` or, when absent, the shifted labels.
    pub fn loss(
        &self,
        ids: &Tensor<B>,
        mask: Option<&Tensor<B>>,
        labels: &Tensor<B>,
        dec_ids: Option<&Tensor<B>>,
    ) -> Result<Tensor<B>> {
        let shifted;
        let dec = match dec_ids {
            Some(d) => d,
            None => {
                shifted = self.shift_right(labels)?;
                &shifted
            }
        };
        nn::cross_entropy(&self.forward(ids, mask, dec)?, labels)
    }
}

fn no_table(stack: &str) -> Error {
    Error::invalid("t5", format!("the {stack}'s first layer has no relative_attention_bias table"))
}
