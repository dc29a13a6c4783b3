//! LLaMA, written only with `redco-core` ops and `nn` (no sharding code: the split comes
//! from the rules). Parameter names, shapes and numerics follow transformers'
//! `LlamaForCausalLM`: RMSNorm, rotary embedding (half-split, configurable theta), grouped-
//! query attention, gated SiLU MLP, optional attention and MLP biases, tied or untied head.
//!
//! Mistral is the same model; Mixtral (`MixtralForCausalLM`) is Mistral with a sparse
//! mixture of experts in place of each MLP ([`Ffn::Moe`], `block_sparse_moe` in its
//! checkpoints), and its loss adds `router_aux_loss_coef` times transformers'
//! load-balancing loss when `output_router_logits` is set.

use crate::generate::{CausalLm, FixedKvCache, KvCache};
use crate::hf::checkpoint::Checkpoint;
use crate::hf::config::HfConfig;
use crate::params::{CheckpointSource, ParamSource, Placed, RandomInit};
use crate::stack::{LayerAttend, Stack, StackLayer};
use redco_core::nn::{
    self, Activation, Embedding, Experts, GatedMlp, Init, KeepWhole, Linear, ParamPlacer, RmsNorm, RotaryEmbedding,
    SparseMoe,
};
use redco_core::recompute::Recompute;
use redco_core::{Backend, DType, Error, Result, RotaryMode, Shape, Tensor};
use std::sync::{Arc, Mutex};

mod moe;
use moe::{flag, keep_flags, MoeCfg};
pub use moe::{Ffn, RouterLog};

/// A layer's attention given its index, queries, keys and values (with its cache).
type Attend<'a, B> = dyn FnMut(usize, Tensor<B>, Tensor<B>, Tensor<B>) -> Result<Tensor<B>> + 'a;

/// One decoder layer.
#[derive(Clone)]
pub struct LlamaLayer<B: Backend> {
    input_layernorm: RmsNorm<B>,
    q_proj: Linear<B>,
    k_proj: Linear<B>,
    v_proj: Linear<B>,
    o_proj: Linear<B>,
    /// Qwen3's QK-norm: an RMSNorm over each head's features of the queries and keys.
    q_norm: Option<RmsNorm<B>>,
    k_norm: Option<RmsNorm<B>>,
    post_attention_layernorm: RmsNorm<B>,
    mlp: Ffn<B>,
}

/// A LLaMA layer's attention sizes.
#[derive(Debug, Clone, Copy)]
pub struct Dims {
    /// Query heads.
    pub heads: usize,
    /// Key and value heads.
    pub kv_heads: usize,
    /// Features per head.
    pub head_dim: usize,
}

impl<B: Backend> LlamaLayer<B> {
    /// The layer over hidden states `h` `[batch, seq, hidden]` with rotary tables `cos`,
    /// `sin`; `attend(q, k, v)` is its attention (with its cache, if any).
    fn forward(
        &self,
        d: Dims,
        h: &Tensor<B>,
        cos: &Tensor<B>,
        sin: &Tensor<B>,
        attend: &mut dyn FnMut(Tensor<B>, Tensor<B>, Tensor<B>) -> Result<Tensor<B>>,
    ) -> Result<Tensor<B>> {
        let (bs, t) = (h.dims()[0], h.dims()[1]);
        let x = self.input_layernorm.forward(h)?;
        let split = |y: Tensor<B>, n: usize, norm: Option<&RmsNorm<B>>| {
            let y = y.reshape([bs, t, n, d.head_dim])?;
            match norm {
                Some(norm) => norm.forward(&y)?.transpose(1, 2),
                None => y.transpose(1, 2),
            }
        };
        let q =
            split(self.q_proj.forward(&x)?, d.heads, self.q_norm.as_ref())?.rotary(cos, sin, RotaryMode::HalfSplit)?;
        let k = split(self.k_proj.forward(&x)?, d.kv_heads, self.k_norm.as_ref())?.rotary(
            cos,
            sin,
            RotaryMode::HalfSplit,
        )?;
        let v = split(self.v_proj.forward(&x)?, d.kv_heads, None)?;
        let a = attend(q, k, v)?;
        let h = h.add(&self.o_proj.forward(&a.transpose(1, 2)?.reshape([bs, t, d.heads * d.head_dim])?)?)?;
        h.add(&self.mlp.forward(&self.post_attention_layernorm.forward(&h)?)?)
    }
}

impl<B: Backend> StackLayer<B> for LlamaLayer<B> {
    type Ctx = Dims;
    /// `side` is the rotary tables `[cos, sin]`.
    fn forward(
        &self,
        d: Dims,
        h: &Tensor<B>,
        side: &[Tensor<B>],
        attend: &mut LayerAttend<'_, B>,
    ) -> Result<Tensor<B>> {
        LlamaLayer::forward(self, d, h, &side[0], &side[1], attend)
    }
}

redco_core::module!(LlamaLayer {
    input_layernorm: "input_layernorm",
    q_proj: "self_attn.q_proj",
    k_proj: "self_attn.k_proj",
    v_proj: "self_attn.v_proj",
    o_proj: "self_attn.o_proj",
    q_norm: "self_attn.q_norm",
    k_norm: "self_attn.k_norm",
    post_attention_layernorm: "post_attention_layernorm",
    mlp: "mlp"
});

/// `LlamaForCausalLM`.
pub struct Llama<B: Backend> {
    /// The configuration.
    pub cfg: HfConfig,
    embed_tokens: Embedding<B>,
    layers: Vec<LlamaLayer<B>>,
    norm: RmsNorm<B>,
    lm_head: Option<Linear<B>>,
    /// How the layers run: gathered under ZeRO-3, recomputed in training.
    stack: Stack<B>,
    /// The mixture-of-experts layers' router statistics (Mixtral).
    router_log: Arc<Mutex<RouterLog<B>>>,
}

redco_core::module!(Llama {
    embed_tokens: "model.embed_tokens",
    layers: "model.layers",
    norm: "model.norm",
    lm_head: "lm_head"
}
    /// The decoder layers.
    fn gather_units(&self) -> Vec<String> {
        self.stack.units(self.layers.len())
    }
    fn set_param_gather(&mut self, g: Option<std::sync::Arc<dyn redco_core::nn::ParamGather<B>>>) -> redco_core::Result<()> {
        self.stack.set_gather(g);
        Ok(())
    }
);

impl<B: Backend> Llama<B> {
    /// A randomly initialised model for `cfg` (PyTorch's default initialisation).
    pub fn new(b: &B, cfg: &HfConfig, dtype: DType, seed: u64) -> Result<Self> {
        Self::build(cfg, &mut RandomInit::new(b, dtype, seed))
    }

    /// [`Llama::new`] with each parameter handed to `placer` as it is made (the trainer's
    /// keeps only this rank's part: [`redco_pipeline::Trainer::for_backend_placed`]).
    /// The values are [`Llama::new`]'s.
    pub fn new_placed(b: &B, cfg: &HfConfig, dtype: DType, seed: u64, placer: &dyn ParamPlacer<B>) -> Result<Self> {
        Self::build(cfg, &mut Placed::new(&mut RandomInit::new(b, dtype, seed), placer))
    }

    /// Checks that `cfg` describes a LLaMA this implementation runs.
    pub fn check_config(cfg: &HfConfig) -> Result<()> {
        if !matches!(cfg.model_type.as_str(), "llama" | "mistral" | "mixtral" | "qwen3" | "qwen3_moe") {
            return Err(Error::config(
                "llama",
                format!("config has model_type `{}`, not llama, mistral, mixtral, qwen3 or qwen3_moe", cfg.model_type),
            ));
        }
        if let Some(m) = MoeCfg::of(cfg)? {
            if m.top_k == 0 || m.top_k > m.experts {
                return Err(Error::config("moe", format!("num_experts_per_tok {} of {} experts", m.top_k, m.experts)));
            }
        }
        if flag(cfg, "use_sliding_window") {
            return Err(Error::unsupported(
                "llama",
                "sliding-window attention (`use_sliding_window`) is not supported",
            ));
        }
        if cfg.kv_heads == 0 || !cfg.heads.is_multiple_of(cfg.kv_heads) {
            return Err(Error::config(
                "llama",
                format!("{} heads are not a multiple of {} key/value heads", cfg.heads, cfg.kv_heads),
            ));
        }
        if !cfg.head_dim.is_multiple_of(2) {
            return Err(Error::config(
                "llama",
                format!("rotary embedding needs an even head_dim, got {}", cfg.head_dim),
            ));
        }
        Activation::from_hf(&cfg.hidden_act).map(|_| ())
    }

    /// Builds the model with every parameter taken from `src` by its transformers name.
    pub fn build(cfg: &HfConfig, src: &mut dyn ParamSource<B>) -> Result<Self> {
        Self::check_config(cfg)?;
        let (h, hd, i) = (cfg.hidden, cfg.head_dim, cfg.intermediate);
        let act = Activation::from_hf(&cfg.hidden_act)?;
        let linear = |src: &mut dyn ParamSource<B>, name: String, inp: usize, out: usize, bias: bool| {
            crate::build::linear(src, &name, inp, out, bias)
        };
        let log = Arc::new(Mutex::new(RouterLog::default()));
        let mut layers = Vec::with_capacity(cfg.layers);
        for l in 0..cfg.layers {
            let p = |s: &str| format!("model.layers.{l}.{s}");
            let ab = cfg.attention_bias;
            let q_proj = linear(src, p("self_attn.q_proj"), h, cfg.heads * hd, ab)?;
            let k_proj = linear(src, p("self_attn.k_proj"), h, cfg.kv_heads * hd, ab)?;
            let v_proj = linear(src, p("self_attn.v_proj"), h, cfg.kv_heads * hd, ab)?;
            let o_proj = linear(src, p("self_attn.o_proj"), cfg.heads * hd, h, ab)?;
            let moe_cfg = MoeCfg::of(cfg)?.filter(|m| m.sparse(l));
            let mlp = match moe_cfg {
                None => {
                    let gate_proj = linear(src, p("mlp.gate_proj"), h, i, cfg.mlp_bias)?;
                    let up_proj = linear(src, p("mlp.up_proj"), h, i, cfg.mlp_bias)?;
                    let down_proj = linear(src, p("mlp.down_proj"), i, h, cfg.mlp_bias)?;
                    Ffn::Dense(GatedMlp { gate_proj, up_proj, down_proj, act })
                }
                Some(m) => {
                    let (e, i) = (m.experts, m.intermediate);
                    let (block, names) = m.names;
                    let router = linear(src, p(&format!("{block}.gate")), h, e, false)?;
                    let stacked = |src: &mut dyn ParamSource<B>, w: &str, out: usize, inp: usize| {
                        let bound = Init::Uniform(1.0 / (inp.max(1) as f64).sqrt());
                        let parts: Vec<String> =
                            (0..e).map(|j| p(&format!("{block}.experts.{j}.{w}.weight"))).collect();
                        src.stack(&p(&format!("{block}.experts.*.{w}.weight")), &parts, Shape::new([out, inp]), bound)
                    };
                    let experts = Experts {
                        gate: stacked(src, names[0], i, h)?,
                        up: stacked(src, names[1], i, h)?,
                        down: stacked(src, names[2], h, i)?,
                        names: names.map(|n| match n {
                            "w1" => "*.w1.weight",
                            "w3" => "*.w3.weight",
                            "w2" => "*.w2.weight",
                            "gate_proj" => "*.gate_proj.weight",
                            "up_proj" => "*.up_proj.weight",
                            _ => "*.down_proj.weight",
                        }),
                    };
                    let moe = SparseMoe {
                        router,
                        experts,
                        top_k: m.top_k,
                        norm_topk_prob: m.norm_topk_prob,
                        act,
                        capacity_factor: None,
                    };
                    Ffn::Moe { moe, name: block, log: log.clone() }
                }
            };
            layers.push((q_proj, k_proj, v_proj, o_proj, mlp));
        }
        let lm_head =
            if cfg.tie_word_embeddings { None } else { Some(linear(src, "lm_head".into(), h, cfg.vocab, false)?) };
        let mut norm = |name: String, dim: usize| -> Result<RmsNorm<B>> {
            Ok(RmsNorm { weight: src.param(&name, Shape::new([dim]), Init::Const(1.0))?, eps: cfg.norm_eps })
        };
        let qk_norm = matches!(cfg.model_type.as_str(), "qwen3" | "qwen3_moe");
        let layers = layers
            .into_iter()
            .enumerate()
            .map(|(l, (q_proj, k_proj, v_proj, o_proj, mlp))| {
                let qk = |n: &str, norm: &mut dyn FnMut(String, usize) -> Result<RmsNorm<B>>| {
                    qk_norm.then(|| norm(format!("model.layers.{l}.self_attn.{n}.weight"), hd)).transpose()
                };
                Ok(LlamaLayer {
                    input_layernorm: norm(format!("model.layers.{l}.input_layernorm.weight"), h)?,
                    q_proj,
                    k_proj,
                    v_proj,
                    o_proj,
                    q_norm: qk("q_norm", &mut norm)?,
                    k_norm: qk("k_norm", &mut norm)?,
                    post_attention_layernorm: norm(format!("model.layers.{l}.post_attention_layernorm.weight"), h)?,
                    mlp,
                })
            })
            .collect::<Result<_>>()?;
        let norm = norm("model.norm.weight".into(), h)?;
        let embed = src.param("model.embed_tokens.weight", Shape::new([cfg.vocab, h]), Init::Normal(0.02))?;
        Ok(Llama {
            cfg: cfg.clone(),
            embed_tokens: Embedding { weight: embed },
            layers,
            norm,
            lm_head,
            stack: Stack::new("model.layers"),
            router_log: log,
        })
    }

    /// Loads `dir` (config.json + safetensors, single or sharded) into a model whose
    /// parameters have `dtype`. Missing, unexpected or mis-shaped tensors are an error that
    /// names them.
    pub fn from_pretrained(b: &B, dir: &std::path::Path, dtype: DType) -> Result<Self> {
        Self::from_pretrained_split(b, dir, dtype, None)
    }

    /// Like [`Llama::from_pretrained`], laid out by `plan` (inside an SPMD run whose mesh is the
    /// plan's): each rank reads only the slice of each tensor it keeps.
    pub fn from_pretrained_split(
        b: &B,
        dir: &std::path::Path,
        dtype: DType,
        plan: Option<&redco_core::planning::ShardPlan>,
    ) -> Result<Self> {
        Self::load(b, dir, dtype, plan, &KeepWhole, None)
    }

    /// [`Llama::from_pretrained_split`] with the linear layers (not a mixture's routers)
    /// quantized to blocks of `format` as each is read (this rank's part of it), so that
    /// the float model is never whole: see [`crate::params::Quantizing`].
    pub fn from_pretrained_quantized(
        b: &B,
        dir: &std::path::Path,
        dtype: DType,
        plan: Option<&redco_core::planning::ShardPlan>,
        format: redco_core::quant::QuantFormat,
    ) -> Result<Self> {
        Self::load(b, dir, dtype, plan, &KeepWhole, Some(format))
    }

    /// [`Llama::from_pretrained`] with each tensor handed to `placer` as it is read (see
    /// [`Llama::new_placed`]).
    pub fn from_pretrained_placed(
        b: &B,
        dir: &std::path::Path,
        dtype: DType,
        placer: &dyn ParamPlacer<B>,
    ) -> Result<Self> {
        Self::load(b, dir, dtype, None, placer, None)
    }

    fn load(
        b: &B,
        dir: &std::path::Path,
        dtype: DType,
        plan: Option<&redco_core::planning::ShardPlan>,
        placer: &dyn ParamPlacer<B>,
        quantize: Option<redco_core::quant::QuantFormat>,
    ) -> Result<Self> {
        let cfg = HfConfig::from_dir(dir)?;
        Self::check_config(&cfg)?;
        let ckpt = Checkpoint::open(dir)?;
        let blocks = cfg.block_formats()?;
        let int4 = cfg.int4()?;
        let stored = crate::params::stored_shapes(cfg.param_shapes()?, &blocks, int4.as_ref())?;
        CheckpointSource::<B>::check(&ckpt, &stored, &|n| n.ends_with("rotary_emb.inv_freq"))?;
        let mut src = CheckpointSource::new(b, &ckpt, plan, dtype).with_blocks(blocks).with_int4(int4);
        match quantize {
            Some(f) => {
                let mut q = crate::params::Quantizing::new(&mut src, f);
                Self::build(&cfg, &mut Placed::new(&mut q, placer))
            }
            None => Self::build(&cfg, &mut Placed::new(&mut src, placer)),
        }
    }

    /// Logits `[batch, seq, vocab]` for `ids` `[batch, seq]`, with an optional `[batch, seq]`
    /// attention mask (0 = padding) and positions `[seq]` or `[batch, seq]` (default
    /// `0..seq`, as transformers' forward uses).
    pub fn forward(
        &self,
        ids: &Tensor<B>,
        mask: Option<&Tensor<B>>,
        positions: Option<&Tensor<B>>,
    ) -> Result<Tensor<B>> {
        let h = self.hidden_states(ids, mask, positions, None)?;
        self.head(&h)
    }

    /// The final hidden states `[batch, seq, hidden]` (after the last norm). With a cache,
    /// `ids` follow the cached positions, `mask` covers cached + new positions, and the new
    /// keys and values are appended to the cache.
    pub fn hidden_states(
        &self,
        ids: &Tensor<B>,
        mask: Option<&Tensor<B>>,
        positions: Option<&Tensor<B>>,
        mut cache: Option<&mut KvCache<B>>,
    ) -> Result<Tensor<B>> {
        let c = &self.cfg;
        if ids.rank() != 2 {
            return Err(Error::invalid("llama", format!("input ids must be [batch, seq], got {}", ids.shape())));
        }
        let t = ids.dims()[1];
        let past = cache.as_ref().map_or(0, |k| k.len());
        if let Some(ctx) = c.max_positions {
            if past + t > ctx {
                return Err(Error::invalid(
                    "llama",
                    format!("{} positions exceed the model's context of {ctx}", past + t),
                ));
            }
        }
        let default_pos;
        let pos = match positions {
            Some(p) => p,
            None => {
                default_pos = Tensor::arange(ids.backend(), past + t)?.narrow(0, past, t)?;
                &default_pos
            }
        };
        if cache.is_none() && self.stack.recomputes() {
            let (h, side, dims) = self.embedded(ids, pos)?;
            // the routers' statistics, when a loss records them, leave the recomputed blocks
            // as their outputs (with the gradient path a recomputation gives them)
            let router = {
                let log = self.log()?;
                log.on.then(|| log.keep.clone())
            };
            let (h, stats) = self.stack.run_recomputed_collecting(&self.layers, dims, h, &side, mask, router)?;
            if !stats.is_empty() {
                self.log()?.stats.extend(stats);
            }
            return self.norm.forward(&h);
        }
        self.layers_at(ids, pos, &mut |i, q, k, v| {
            let (k, v) = match cache.as_deref_mut() {
                Some(cache) => cache.append(i, k, v)?,
                None => (k, v),
            };
            nn::scaled_dot_product_attention(&q, &k, &v, mask, true, None)
        })
    }

    /// The final hidden states of `ids` (`[batch, t]`) following the positions written in
    /// a fixed-capacity `cache`, whose new keys and values are written and length advanced.
    /// `mask`, if any, is `[batch, capacity]` (the padding of the prompt). Nothing is read
    /// from the host: the step a compiled backend records for every token.
    pub fn hidden_states_fixed(
        &self,
        ids: &Tensor<B>,
        mask: Option<&Tensor<B>>,
        cache: &mut FixedKvCache<B>,
    ) -> Result<Tensor<B>> {
        if ids.rank() != 2 {
            return Err(Error::invalid("llama", format!("input ids must be [batch, seq], got {}", ids.shape())));
        }
        let t = ids.dims()[1];
        let pos = cache.positions(t)?;
        let keep = cache.keep_mask(t, mask)?;
        let scale = 1.0 / (self.cfg.head_dim as f64).sqrt();
        let h = self.layers_at(ids, &pos, &mut |i, q, k, v| {
            let (k, v) = cache.write(i, k, v)?;
            q.attention(&k, &v, Some(&keep), false, scale)
        })?;
        cache.advance(t)?;
        Ok(h)
    }

    /// The embedded `ids`, the side inputs of every layer (the rotary tables at `pos`) and
    /// the layers' attention sizes.
    fn embedded(&self, ids: &Tensor<B>, pos: &Tensor<B>) -> Result<(Tensor<B>, [Tensor<B>; 2], Dims)> {
        let c = &self.cfg;
        let rope = RotaryEmbedding::new(c.head_dim, c.rope_theta, RotaryMode::HalfSplit)?;
        let (cos, sin) = rope.tables(pos, self.embed_tokens.weight.dtype())?;
        let dims = Dims { heads: c.heads, kv_heads: c.kv_heads, head_dim: c.head_dim };
        Ok((self.embed_tokens.forward(ids)?, [cos, sin], dims))
    }

    /// The decoder layers over `ids` at `pos`; `attend(layer, q, k, v)` is each layer's
    /// attention (with its cache).
    fn layers_at(&self, ids: &Tensor<B>, pos: &Tensor<B>, attend: &mut Attend<'_, B>) -> Result<Tensor<B>> {
        let (h, side, dims) = self.embedded(ids, pos)?;
        self.norm.forward(&self.stack.run(&self.layers, dims, h, &side, attend)?)
    }

    /// What each layer recomputes in the backward pass: nothing (the default), the whole
    /// layer from its input ([`Recompute::Block`]: one hidden state kept per layer instead
    /// of every activation inside it), or its cheap ops ([`Recompute::Selective`]: the
    /// outputs of its projections and attention kept, its norms, rotary embeddings, SiLU
    /// and product recomputed). Applies to training forwards without a KV cache.
    pub fn set_recompute(&mut self, mode: Recompute) {
        self.stack.set_recompute(mode);
    }

    /// The language-model head over final hidden states.
    pub fn head(&self, h: &Tensor<B>) -> Result<Tensor<B>> {
        match &self.lm_head {
            Some(head) => head.forward(h),
            None => h.matmul_t(&self.embed_tokens.weight),
        }
    }

    /// transformers' causal-LM loss: logits at `t` predict `labels` at `t + 1` (-100 ignored);
    /// for a mixture of experts whose config sets `output_router_logits`, plus
    /// `router_aux_loss_coef` times the load-balancing loss over every layer's router (the
    /// tokens `mask` keeps), as transformers adds it.
    /// With a capacity factor ([`Llama::set_capacity_factor`]) the routers' dropped slots
    /// are counted ([`Llama::take_dropped`]).
    pub fn loss(&self, ids: &Tensor<B>, mask: Option<&Tensor<B>>, labels: &Tensor<B>) -> Result<Tensor<B>> {
        let aux = flag(&self.cfg, "output_router_logits");
        let moe = MoeCfg::of(&self.cfg)?.filter(|_| aux || self.capacity_factor().is_some());
        let Some(MoeCfg { experts: e, top_k, .. }) = moe else {
            return crate::generate::shifted_loss(&self.forward(ids, mask, None)?, labels);
        };
        let keep = match mask {
            Some(m) => Some(keep_flags(m)?),
            None => None,
        };
        self.log()?.start(keep);
        let logits = self.forward(ids, mask, None);
        let stats = self.log()?.finish(top_k);
        let lm = crate::generate::shifted_loss(&logits?, labels)?;
        if !aux {
            return Ok(lm);
        }
        let coef = self.cfg.raw.get("router_aux_loss_coef").and_then(|v| v.as_f64()).unwrap_or(0.001);
        lm.add(&nn::load_balancing_loss(&stats, e)?.cast(lm.dtype())?.scale(coef)?)
    }

    /// Sets the capacity factor of every mixture-of-experts layer ([`SparseMoe::capacity_factor`];
    /// `None`: dropless, as loaded). An error for a factor that is not positive and finite,
    /// and for a factor on a dense model.
    pub fn set_capacity_factor(&mut self, factor: Option<f64>) -> Result<()> {
        if factor.is_some_and(|f| !(f.is_finite() && f > 0.0)) {
            return Err(Error::config("moe", format!("capacity factor {factor:?}: it must be positive and finite")));
        }
        if MoeCfg::of(&self.cfg)?.is_none() {
            return match factor {
                None => Ok(()),
                Some(_) => {
                    Err(Error::config("moe", format!("a capacity factor for a dense {} model", self.cfg.model_type)))
                }
            };
        }
        for l in &mut self.layers {
            if let Ffn::Moe { moe, .. } = &mut l.mlp {
                moe.capacity_factor = factor;
            }
        }
        Ok(())
    }

    /// The capacity factor of the mixture-of-experts layers (`None`: dropless, or dense).
    pub fn capacity_factor(&self) -> Option<f64> {
        self.layers.iter().find_map(|l| match &l.mlp {
            Ffn::Moe { moe, .. } => moe.capacity_factor,
            Ffn::Dense(_) => None,
        })
    }

    /// The token slots the capacity factor dropped and the slots routed (every layer,
    /// every rank's tokens) over the losses since the last call, which resets both.
    pub fn take_dropped(&self) -> Result<(u64, u64)> {
        Ok(std::mem::take(&mut self.log()?.dropped))
    }

    /// transformers' load-balancing loss of a mixture of experts over one forward pass of
    /// `ids` (the tokens `mask` keeps), without the coefficient; an error for a dense model.
    pub fn router_aux_loss(&self, ids: &Tensor<B>, mask: Option<&Tensor<B>>) -> Result<Tensor<B>> {
        let m = MoeCfg::of(&self.cfg)?.ok_or_else(|| Error::invalid("llama", "a dense model has no router"))?;
        let (e, top_k) = (m.experts, m.top_k);
        let keep = match mask {
            Some(m) => Some(keep_flags(m)?),
            None => None,
        };
        self.log()?.start(keep);
        let out = self.forward(ids, mask, None);
        let stats = self.log()?.finish(top_k);
        out?;
        nn::load_balancing_loss(&stats, e)
    }

    fn log(&self) -> Result<std::sync::MutexGuard<'_, RouterLog<B>>> {
        self.router_log.lock().map_err(|_| Error::invalid("llama", "the router log was poisoned"))
    }
}

impl<B: Backend> CausalLm<B> for Llama<B> {
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
        self.head(&crate::generate::last_position(&h)?)
    }

    fn ragged_logits(
        &self,
        ids: &Tensor<B>,
        positions: &Tensor<B>,
        rows: &[usize],
        attend: &mut crate::generate::RaggedAttend<'_, B>,
    ) -> Result<Tensor<B>> {
        crate::generate::check_ragged("llama", ids, positions, rows)?;
        let h = self.layers_at(ids, positions, attend)?;
        self.head(&crate::generate::pick_rows(&h, rows)?)
    }
}
