//! OPT, written only with `redco-core` ops and `nn`. Names, shapes and numerics follow
//! transformers' `OPTForCausalLM`: learned positions looked up at `cumsum(mask) * mask - 1 +
//! 2` (so left-padded rows start at position 2 like unpadded ones), LayerNorm before
//! (`do_layer_norm_before`) or after each block, optional `project_in` / `project_out`
//! between a narrower embedding and the hidden size (the 350m shape), ReLU MLP, and the head
//! tied to the token embedding.

use crate::build::{self, embedding, layer_norm, linear};
use crate::generate::{CausalLm, KvCache, RaggedAttend};
use crate::hf::config::HfConfig;
use crate::params::{ParamSource, Placed, RandomInit};
use crate::stack::{LayerAttend, Stack, StackLayer};
use redco_core::backend::CmpOp;
use redco_core::nn::{self, Activation, Embedding, LayerNorm, Linear, ParamPlacer};
use redco_core::planning::ShardPlan;
use redco_core::recompute::Recompute;
use redco_core::{Backend, DType, Error, Result, Tensor};
use std::path::Path;

/// The offset OPT adds to positions (its table has two extra rows in front).
pub const POSITION_OFFSET: i64 = 2;

/// One OPT decoder layer.
#[derive(Clone)]
pub struct OptLayer<B: Backend> {
    q_proj: Linear<B>,
    k_proj: Linear<B>,
    v_proj: Linear<B>,
    out_proj: Linear<B>,
    self_attn_layer_norm: LayerNorm<B>,
    fc1: Linear<B>,
    fc2: Linear<B>,
    final_layer_norm: LayerNorm<B>,
}

/// What an OPT layer's forward needs besides its parameters.
#[derive(Debug, Clone, Copy)]
pub struct OptCtx {
    /// Attention heads.
    pub heads: usize,
    /// Features per head.
    pub head_dim: usize,
    /// LayerNorm before each block (`do_layer_norm_before`) or after it.
    pub pre_norm: bool,
    /// The MLP's activation.
    pub act: Activation,
}

impl<B: Backend> StackLayer<B> for OptLayer<B> {
    type Ctx = OptCtx;
    /// OPT's layers take no side inputs (the positions are added to the embeddings).
    fn forward(&self, c: OptCtx, h: &Tensor<B>, _: &[Tensor<B>], attend: &mut LayerAttend<'_, B>) -> Result<Tensor<B>> {
        let (bs, t) = (h.dims()[0], h.dims()[1]);
        let a_in = if c.pre_norm { self.self_attn_layer_norm.forward(h)? } else { h.clone() };
        let split = |y: Tensor<B>| y.reshape([bs, t, c.heads, c.head_dim])?.transpose(1, 2);
        let q = split(self.q_proj.forward(&a_in)?)?;
        let k = split(self.k_proj.forward(&a_in)?)?;
        let v = split(self.v_proj.forward(&a_in)?)?;
        let a = attend(q, k, v)?;
        let mut h = h.add(&self.out_proj.forward(&a.transpose(1, 2)?.reshape([bs, t, c.heads * c.head_dim])?)?)?;
        if !c.pre_norm {
            h = self.self_attn_layer_norm.forward(&h)?;
        }
        let f_in = if c.pre_norm { self.final_layer_norm.forward(&h)? } else { h.clone() };
        h = h.add(&self.fc2.forward(&c.act.forward(&self.fc1.forward(&f_in)?)?)?)?;
        if !c.pre_norm {
            h = self.final_layer_norm.forward(&h)?;
        }
        Ok(h)
    }
}

redco_core::module!(OptLayer {
    k_proj: "self_attn.k_proj",
    v_proj: "self_attn.v_proj",
    q_proj: "self_attn.q_proj",
    out_proj: "self_attn.out_proj",
    self_attn_layer_norm: "self_attn_layer_norm",
    fc1: "fc1",
    fc2: "fc2",
    final_layer_norm: "final_layer_norm"
});

/// `OPTForCausalLM`.
pub struct Opt<B: Backend> {
    /// The configuration.
    pub cfg: HfConfig,
    embed_tokens: Embedding<B>,
    embed_positions: Embedding<B>,
    project_in: Option<Linear<B>>,
    project_out: Option<Linear<B>>,
    final_layer_norm: Option<LayerNorm<B>>,
    layers: Vec<OptLayer<B>>,
    lm_head: Option<Linear<B>>,
    pre_norm: bool,
    act: Activation,
    /// How the layers run: gathered under ZeRO-3, recomputed in training.
    stack: Stack<B>,
}

redco_core::module!(Opt {
    embed_tokens: "model.decoder.embed_tokens",
    embed_positions: "model.decoder.embed_positions",
    project_out: "model.decoder.project_out",
    project_in: "model.decoder.project_in",
    final_layer_norm: "model.decoder.final_layer_norm",
    layers: "model.decoder.layers",
    lm_head: "lm_head"
}
    /// The decoder layers.
    fn gather_units(&self) -> Vec<String> {
        self.stack.units(self.layers.len())
    }
    fn set_param_gather(&mut self, g: Option<std::sync::Arc<dyn redco_core::nn::ParamGather<B>>>) -> Result<()> {
        self.stack.set_gather(g);
        Ok(())
    }
);

/// OPT's positions for a `[batch, seq]` attention mask: `cumsum(mask) * mask - 1`, plus the
/// offset (padding gets position `-1 + 2 = 1`).
pub fn positions_from_mask(mask: &[i64], seq: usize) -> Vec<i64> {
    let mut out = Vec::with_capacity(mask.len());
    for row in mask.chunks(seq) {
        let mut c = 0;
        for &m in row {
            let m = (m != 0) as i64;
            c += m;
            out.push(c * m - 1 + POSITION_OFFSET);
        }
    }
    out
}

impl<B: Backend> Opt<B> {
    /// A randomly initialised model for `cfg`.
    pub fn new(b: &B, cfg: &HfConfig, dtype: DType, seed: u64) -> Result<Self> {
        Self::build(cfg, &mut RandomInit::new(b, dtype, seed))
    }

    /// [`Opt::new`] with each parameter handed to `placer` as it is made (the trainer's
    /// keeps only this rank's part; see [`crate::llama::Llama::new_placed`]). The values are
    /// [`Opt::new`]'s.
    pub fn new_placed(b: &B, cfg: &HfConfig, dtype: DType, seed: u64, placer: &dyn ParamPlacer<B>) -> Result<Self> {
        Self::build(cfg, &mut Placed::new(&mut RandomInit::new(b, dtype, seed), placer))
    }

    /// What each layer recomputes in the backward pass of a training forward (see
    /// [`crate::llama::Llama::set_recompute`]; selective keeps the projections' and
    /// attention's outputs and recomputes the LayerNorms and the activation).
    pub fn set_recompute(&mut self, mode: Recompute) {
        self.stack.set_recompute(mode);
    }

    /// Checks that `cfg` describes an OPT this implementation runs.
    pub fn check_config(cfg: &HfConfig) -> Result<()> {
        if cfg.model_type != "opt" {
            return Err(Error::config("opt", format!("config has model_type `{}`, not opt", cfg.model_type)));
        }
        if !cfg.flag("layer_norm_elementwise_affine", true) {
            return Err(Error::unsupported("opt", "layer_norm_elementwise_affine = false is not supported"));
        }
        Activation::from_hf(&cfg.hidden_act).map(|_| ())
    }

    /// Builds the model with every parameter taken from `src` by its transformers name.
    pub fn build(cfg: &HfConfig, src: &mut dyn ParamSource<B>) -> Result<Self> {
        Self::check_config(cfg)?;
        let (h, f, v, e) = (cfg.hidden, cfg.intermediate, cfg.vocab, cfg.opt_embed_dim());
        let bias = cfg.flag("enable_bias", true);
        let eps = cfg.norm_eps;
        let d = |s: &str| format!("model.decoder.{s}");
        let embed_tokens = embedding(src, &d("embed_tokens"), v, e, 0.02)?;
        let pos_rows = cfg.max_positions.unwrap_or(2048) + POSITION_OFFSET as usize;
        let embed_positions = embedding(src, &d("embed_positions"), pos_rows, h, 0.02)?;
        let (project_out, project_in) = if e != h {
            (Some(linear(src, &d("project_out"), h, e, false)?), Some(linear(src, &d("project_in"), e, h, false)?))
        } else {
            (None, None)
        };
        let final_layer_norm =
            if cfg.opt_final_norm() { Some(layer_norm(src, &d("final_layer_norm"), h, eps)?) } else { None };
        let layers = (0..cfg.layers)
            .map(|l| {
                let p = |s: &str| format!("model.decoder.layers.{l}.{s}");
                Ok(OptLayer {
                    k_proj: linear(src, &p("self_attn.k_proj"), h, h, bias)?,
                    v_proj: linear(src, &p("self_attn.v_proj"), h, h, bias)?,
                    q_proj: linear(src, &p("self_attn.q_proj"), h, h, bias)?,
                    out_proj: linear(src, &p("self_attn.out_proj"), h, h, bias)?,
                    fc1: linear(src, &p("fc1"), h, f, bias)?,
                    fc2: linear(src, &p("fc2"), f, h, bias)?,
                    self_attn_layer_norm: layer_norm(src, &p("self_attn_layer_norm"), h, eps)?,
                    final_layer_norm: layer_norm(src, &p("final_layer_norm"), h, eps)?,
                })
            })
            .collect::<Result<_>>()?;
        let lm_head = if cfg.tie_word_embeddings { None } else { Some(linear(src, "lm_head", e, v, false)?) };
        Ok(Opt {
            cfg: cfg.clone(),
            embed_tokens,
            embed_positions,
            project_in,
            project_out,
            final_layer_norm,
            layers,
            lm_head,
            pre_norm: cfg.flag("do_layer_norm_before", true),
            act: Activation::from_hf(&cfg.hidden_act)?,
            stack: Stack::new("model.decoder.layers"),
        })
    }

    /// Loads `dir` (config.json + safetensors) with parameters of `dtype`, laid out by `plan`
    /// when given (inside an SPMD run: each rank reads only its slices).
    pub fn from_pretrained(b: &B, dir: &Path, dtype: DType, plan: Option<&ShardPlan>) -> Result<Self> {
        let cfg = HfConfig::from_dir(dir)?;
        // a tied head may still be stored; it is the token embedding
        let tied = cfg.tie_word_embeddings;
        build::load(b, dir, dtype, plan, &["opt"], &|n| tied && n == "lm_head.weight", Self::build)
    }

    /// [`Opt::from_pretrained`] with each tensor handed to `placer` as it is read.
    pub fn from_pretrained_placed(b: &B, dir: &Path, dtype: DType, placer: &dyn ParamPlacer<B>) -> Result<Self> {
        let tied = HfConfig::from_dir(dir)?.tie_word_embeddings;
        build::load(b, dir, dtype, None, &["opt"], &|n| tied && n == "lm_head.weight", |cfg, src| {
            Self::build(cfg, &mut Placed::new(src, placer))
        })
    }

    /// Logits `[batch, seq, vocab]`; positions come from the mask as transformers computes
    /// them (all ones without a mask).
    pub fn forward(&self, ids: &Tensor<B>, mask: Option<&Tensor<B>>) -> Result<Tensor<B>> {
        if ids.rank() != 2 {
            return Err(Error::invalid("opt", format!("input ids must be [batch, seq], got {}", ids.shape())));
        }
        let (bs, t) = (ids.dims()[0], ids.dims()[1]);
        let pos = match mask {
            Some(m) => Tensor::from_vec(ids.backend(), positions_from_mask(&m.to_vec_i64()?, t), [bs, t])?,
            // every row at `2..t + 2`: one `[t]` row broadcast over the batch (a batch split
            // over dp keeps its split: the position embeddings are not made per row)
            None => Tensor::from_vec(ids.backend(), (POSITION_OFFSET..t as i64 + POSITION_OFFSET).collect(), [t])?,
        };
        let h = self.hidden_states(ids, mask, &pos, None)?;
        self.head(&h)
    }

    /// Final hidden states (after `project_out`) for `ids` at table rows `pos` (offset
    /// included); with a cache, `ids` follow the cached positions and `mask` covers both.
    pub fn hidden_states(
        &self,
        ids: &Tensor<B>,
        mask: Option<&Tensor<B>>,
        pos: &Tensor<B>,
        mut cache: Option<&mut KvCache<B>>,
    ) -> Result<Tensor<B>> {
        let c = &self.cfg;
        let t = ids.dims()[1];
        let past = cache.as_ref().map_or(0, |k| k.len());
        crate::generate::check_context("opt", past + t, c.max_positions)?;
        if cache.is_none() && self.stack.recomputes() {
            let h = self.embedded(ids, pos)?;
            return self.finished(self.stack.run_recomputed(&self.layers, self.ctx(), h, &[], mask)?);
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

    /// What every layer's forward needs besides its parameters.
    fn ctx(&self) -> OptCtx {
        OptCtx { heads: self.cfg.heads, head_dim: self.cfg.head_dim, pre_norm: self.pre_norm, act: self.act }
    }

    /// The layers' input: the token embeddings of `ids` (through `project_in`) plus the
    /// position embeddings at table rows `pos`.
    fn embedded(&self, ids: &Tensor<B>, pos: &Tensor<B>) -> Result<Tensor<B>> {
        let mut x = self.embed_tokens.forward(ids)?;
        if let Some(pad) = self.cfg.pad_token_id {
            // `padding_idx`: the padding row's lookups pass no gradient to the table
            let is_pad = ids.compare_scalar(pad as f64, CmpOp::Eq)?.unsqueeze(-1)?;
            x = is_pad.where_cond(&x.detach(), &x)?;
        }
        if let Some(p) = &self.project_in {
            x = p.forward(&x)?;
        }
        x.add(&self.embed_positions.forward(pos)?)
    }

    /// The final LayerNorm (if any) and `project_out` (if any) over the last layer's output.
    fn finished(&self, mut h: Tensor<B>) -> Result<Tensor<B>> {
        if let Some(n) = &self.final_layer_norm {
            h = n.forward(&h)?;
        }
        match &self.project_out {
            Some(p) => p.forward(&h),
            None => Ok(h),
        }
    }

    /// The decoder over `ids` (`[batch, t]`) at table rows `pos`; `attend(layer, q, k, v)`
    /// is each layer's attention (with its cache). After `project_out`.
    fn layers_at(&self, ids: &Tensor<B>, pos: &Tensor<B>, attend: &mut RaggedAttend<'_, B>) -> Result<Tensor<B>> {
        let h = self.embedded(ids, pos)?;
        self.finished(self.stack.run(&self.layers, self.ctx(), h, &[], attend)?)
    }

    /// The head over final hidden states (the token embedding when tied).
    pub fn head(&self, h: &Tensor<B>) -> Result<Tensor<B>> {
        match &self.lm_head {
            Some(head) => head.forward(h),
            None => h.matmul_t(&self.embed_tokens.weight),
        }
    }

    /// transformers' causal-LM loss (logits at `t` predict `labels` at `t + 1`, -100 ignored).
    pub fn loss(&self, ids: &Tensor<B>, mask: Option<&Tensor<B>>, labels: &Tensor<B>) -> Result<Tensor<B>> {
        crate::generate::shifted_loss(&self.forward(ids, mask)?, labels)
    }
}

impl<B: Backend> CausalLm<B> for Opt<B> {
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
        // generation positions are cumsum - 1 (padding 1); OPT's table is offset by 2
        let shifted: Vec<i64> = positions.to_vec_i64()?.into_iter().map(|p| p + POSITION_OFFSET).collect();
        let pos = Tensor::from_vec(ids.backend(), shifted, positions.shape().clone())?;
        let h = self.hidden_states(ids, Some(mask), &pos, Some(cache))?;
        self.head(&crate::generate::last_position(&h)?)
    }
    fn ragged_logits(
        &self,
        ids: &Tensor<B>,
        positions: &Tensor<B>,
        rows: &[usize],
        attend: &mut RaggedAttend<'_, B>,
    ) -> Result<Tensor<B>> {
        crate::generate::check_ragged("opt", ids, positions, rows)?;
        // OPT's position table is offset by 2
        let shifted: Vec<i64> = positions.to_vec_i64()?.into_iter().map(|p| p + POSITION_OFFSET).collect();
        let pos = Tensor::from_vec(ids.backend(), shifted, positions.shape().clone())?;
        let h = self.layers_at(ids, &pos, attend)?;
        self.head(&crate::generate::pick_rows(&h, rows)?)
    }
}
