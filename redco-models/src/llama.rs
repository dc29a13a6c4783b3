//! LLaMA, written only with `redco-core` ops and `nn` (no sharding code: the split comes
//! from the rules). Parameter names, shapes and numerics follow transformers'
//! `LlamaForCausalLM`: RMSNorm, rotary embedding (half-split, configurable theta), grouped-
//! query attention, gated SiLU MLP, optional attention and MLP biases, tied or untied head.

use crate::hf::config::HfConfig;
use redco_core::nn::{self, join, Activation, Embedding, GatedMlp, Linear, Module, RmsNorm, RotaryEmbedding};
use redco_core::{Backend, DType, Error, Result, RotaryMode, Tensor};

/// One decoder layer.
pub struct LlamaLayer<B: Backend> {
    input_layernorm: RmsNorm<B>,
    q_proj: Linear<B>,
    k_proj: Linear<B>,
    v_proj: Linear<B>,
    o_proj: Linear<B>,
    post_attention_layernorm: RmsNorm<B>,
    mlp: GatedMlp<B>,
}

impl<B: Backend> Module<B> for LlamaLayer<B> {
    fn visit(&self, p: &str, f: &mut dyn FnMut(&str, &Tensor<B>)) {
        self.input_layernorm.visit(&join(p, "input_layernorm"), f);
        self.q_proj.visit(&join(p, "self_attn.q_proj"), f);
        self.k_proj.visit(&join(p, "self_attn.k_proj"), f);
        self.v_proj.visit(&join(p, "self_attn.v_proj"), f);
        self.o_proj.visit(&join(p, "self_attn.o_proj"), f);
        self.post_attention_layernorm.visit(&join(p, "post_attention_layernorm"), f);
        self.mlp.visit(&join(p, "mlp"), f);
    }
    fn visit_mut(&mut self, p: &str, f: &mut dyn FnMut(&str, &mut Tensor<B>)) {
        self.input_layernorm.visit_mut(&join(p, "input_layernorm"), f);
        self.q_proj.visit_mut(&join(p, "self_attn.q_proj"), f);
        self.k_proj.visit_mut(&join(p, "self_attn.k_proj"), f);
        self.v_proj.visit_mut(&join(p, "self_attn.v_proj"), f);
        self.o_proj.visit_mut(&join(p, "self_attn.o_proj"), f);
        self.post_attention_layernorm.visit_mut(&join(p, "post_attention_layernorm"), f);
        self.mlp.visit_mut(&join(p, "mlp"), f);
    }
}

/// `LlamaForCausalLM`.
pub struct Llama<B: Backend> {
    /// The configuration.
    pub cfg: HfConfig,
    embed_tokens: Embedding<B>,
    layers: Vec<LlamaLayer<B>>,
    norm: RmsNorm<B>,
    lm_head: Option<Linear<B>>,
}

impl<B: Backend> Module<B> for Llama<B> {
    fn visit(&self, p: &str, f: &mut dyn FnMut(&str, &Tensor<B>)) {
        self.embed_tokens.visit(&join(p, "model.embed_tokens"), f);
        self.layers.visit(&join(p, "model.layers"), f);
        self.norm.visit(&join(p, "model.norm"), f);
        self.lm_head.visit(&join(p, "lm_head"), f);
    }
    fn visit_mut(&mut self, p: &str, f: &mut dyn FnMut(&str, &mut Tensor<B>)) {
        self.embed_tokens.visit_mut(&join(p, "model.embed_tokens"), f);
        self.layers.visit_mut(&join(p, "model.layers"), f);
        self.norm.visit_mut(&join(p, "model.norm"), f);
        self.lm_head.visit_mut(&join(p, "lm_head"), f);
    }
}

impl<B: Backend> Llama<B> {
    /// A randomly initialised model for `cfg` (use `hf::load` for a checkpoint).
    pub fn new(b: &B, cfg: &HfConfig, dtype: DType, seed: u64) -> Result<Self> {
        if !matches!(cfg.model_type.as_str(), "llama" | "mistral") {
            return Err(Error::invalid("llama", format!("config has model_type `{}`, not llama", cfg.model_type)));
        }
        if !cfg.heads.is_multiple_of(cfg.kv_heads.max(1)) {
            return Err(Error::invalid(
                "llama",
                format!("{} heads are not a multiple of {} key/value heads", cfg.heads, cfg.kv_heads),
            ));
        }
        let (h, hd, i) = (cfg.hidden, cfg.head_dim, cfg.intermediate);
        let act = Activation::from_hf(&cfg.hidden_act)?;
        let layers = (0..cfg.layers as u64)
            .map(|l| {
                let s = seed + 100 * (l + 1);
                Ok(LlamaLayer {
                    input_layernorm: RmsNorm::new(b, h, cfg.norm_eps, dtype)?,
                    q_proj: Linear::new(b, h, cfg.heads * hd, cfg.attention_bias, dtype, s + 1)?,
                    k_proj: Linear::new(b, h, cfg.kv_heads * hd, cfg.attention_bias, dtype, s + 2)?,
                    v_proj: Linear::new(b, h, cfg.kv_heads * hd, cfg.attention_bias, dtype, s + 3)?,
                    o_proj: Linear::new(b, cfg.heads * hd, h, cfg.attention_bias, dtype, s + 4)?,
                    post_attention_layernorm: RmsNorm::new(b, h, cfg.norm_eps, dtype)?,
                    mlp: GatedMlp::new(b, h, i, cfg.mlp_bias, act, dtype, s + 5)?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(Llama {
            cfg: cfg.clone(),
            embed_tokens: Embedding::new(b, cfg.vocab, h, 0.02, dtype, seed)?,
            layers,
            norm: RmsNorm::new(b, h, cfg.norm_eps, dtype)?,
            lm_head: if cfg.tie_word_embeddings {
                None
            } else {
                Some(Linear::new(b, h, cfg.vocab, false, dtype, seed + 7)?)
            },
        })
    }

    /// Loads `dir` (config.json + safetensors, single or sharded) into a model whose
    /// parameters have `dtype`. Missing, unexpected or mis-shaped tensors are an error that
    /// names them.
    pub fn from_pretrained(b: &B, dir: &std::path::Path, dtype: DType) -> Result<Self> {
        let cfg = HfConfig::from_dir(dir)?;
        let mut m = Llama::new(b, &cfg, dtype, 0)?;
        let mut map = std::collections::BTreeMap::new();
        for (name, t) in crate::hf::safetensors::read_all(dir)? {
            map.insert(name, Tensor::from_host(b, &t.data, t.shape)?);
        }
        nn::ModuleExt::load_state_dict(&mut m, &map, true)?;
        Ok(m)
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
        let c = &self.cfg;
        let (bs, t) = (ids.dims()[0], ids.dims()[1]);
        let hd = c.head_dim;
        let default_pos;
        let pos = match positions {
            Some(p) => p,
            None => {
                default_pos = Tensor::arange(ids.backend(), t)?;
                &default_pos
            }
        };
        let rope = RotaryEmbedding::new(hd, c.rope_theta, RotaryMode::HalfSplit)?;
        let (cos, sin) = rope.tables(pos, self.embed_tokens.weight.dtype())?;
        let mut h = self.embed_tokens.forward(ids)?;
        for l in &self.layers {
            let x = l.input_layernorm.forward(&h)?;
            let split = |y: Tensor<B>, n: usize| y.reshape([bs, t, n, hd])?.transpose(1, 2);
            let q = split(l.q_proj.forward(&x)?, c.heads)?.rotary(&cos, &sin, RotaryMode::HalfSplit)?;
            let k = split(l.k_proj.forward(&x)?, c.kv_heads)?.rotary(&cos, &sin, RotaryMode::HalfSplit)?;
            let v = split(l.v_proj.forward(&x)?, c.kv_heads)?;
            let a = nn::scaled_dot_product_attention(&q, &k, &v, mask, true, None)?;
            h = h.add(&l.o_proj.forward(&a.transpose(1, 2)?.reshape([bs, t, c.heads * hd])?)?)?;
            h = h.add(&l.mlp.forward(&l.post_attention_layernorm.forward(&h)?)?)?;
        }
        let h = self.norm.forward(&h)?;
        match &self.lm_head {
            Some(head) => head.forward(&h),
            None => h.matmul_t(&self.embed_tokens.weight),
        }
    }

    /// transformers' causal-LM loss: logits at `t` predict `labels` at `t + 1` (-100 ignored).
    pub fn loss(&self, ids: &Tensor<B>, mask: Option<&Tensor<B>>, labels: &Tensor<B>) -> Result<Tensor<B>> {
        let logits = self.forward(ids, mask, None)?;
        let t = ids.dims()[1];
        nn::cross_entropy(&logits.narrow(1, 0, t - 1)?, &labels.narrow(1, 1, t - 1)?)
    }
}
