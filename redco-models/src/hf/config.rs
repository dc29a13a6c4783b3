//! Reading Hugging Face `config.json`: the architecture and the sizes the planner needs,
//! and the parameter names and shapes that transformers uses for it.

use super::fields;
use redco_core::planning::planner::{ModelDims, MoeDims};
use redco_core::{Error, Result, Shape};
use serde_json::Value;
use std::path::Path;

/// The fields of a `config.json` that redco reads, across the key variants transformers
/// writes.
#[derive(Debug, Clone, PartialEq)]
pub struct HfConfig {
    /// `model_type` (`llama`, `gptj`, `opt`, `t5`, ...).
    pub model_type: String,
    /// Hidden size.
    pub hidden: usize,
    /// Layers.
    pub layers: usize,
    /// Attention heads.
    pub heads: usize,
    /// Key/value heads (= heads without grouped-query attention).
    pub kv_heads: usize,
    /// Feed-forward size.
    pub intermediate: usize,
    /// Vocabulary size.
    pub vocab: usize,
    /// Head dimension (`head_dim`, else hidden / heads).
    pub head_dim: usize,
    /// Input and output embeddings share one matrix.
    pub tie_word_embeddings: bool,
    /// LLaMA `attention_bias`.
    pub attention_bias: bool,
    /// LLaMA `mlp_bias`.
    pub mlp_bias: bool,
    /// Rotary base: `rope_theta` at top level or under `rope_parameters` (10000 if absent).
    pub rope_theta: f64,
    /// Norm epsilon (`rms_norm_eps`, `layer_norm_epsilon`, ...).
    pub norm_eps: f64,
    /// Activation (`hidden_act` / `activation_function`).
    pub hidden_act: String,
    /// The context length (`max_position_embeddings` / `n_positions`), when the config says.
    pub max_positions: Option<usize>,
    /// `bos_token_id`.
    pub bos_token_id: Option<i64>,
    /// `eos_token_id` (one id or a list; `generation_config.json` overrides `config.json`).
    pub eos_token_ids: Vec<i64>,
    /// `pad_token_id`.
    pub pad_token_id: Option<i64>,
    /// GPT-J `rotary_dim` (features per head that rotate; all when absent).
    pub rotary_dim: Option<usize>,
    /// The whole `config.json`, written back unchanged when the model is saved.
    pub raw: Value,
}

fn ids(v: Option<&Value>) -> Vec<i64> {
    match v {
        Some(Value::Number(n)) => n.as_i64().into_iter().collect(),
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_i64).collect(),
        _ => Vec::new(),
    }
}

impl HfConfig {
    /// Reads `<dir>/config.json`.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        if !dir.is_dir() {
            return Err(Error::config("config", format!("model directory {} does not exist", dir.display())));
        }
        let path = dir.join("config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io("config", "cannot read", &path, e))?;
        // the error keeps its kind (a bad value, an unsupported variant) and gains the path
        let mut cfg = Self::from_json(&text).map_err(|e| match e {
            Error::Config { op, msg } => Error::Config { op, msg: format!("{}: {msg}", path.display()) },
            Error::Unsupported { op, msg } => Error::Unsupported { op, msg: format!("{}: {msg}", path.display()) },
            other => Error::config("config", format!("{}: {other}", path.display())),
        })?;
        // generation_config.json, when present, holds the ids generation stops and pads with
        let gen = dir.join("generation_config.json");
        if let Ok(text) = std::fs::read_to_string(&gen) {
            let v: Value = serde_json::from_str(&text)
                .map_err(|e| Error::config("config", format!("{}: not valid JSON: {e}", gen.display())))?;
            let eos = ids(v.get("eos_token_id"));
            if !eos.is_empty() {
                cfg.eos_token_ids = eos;
            }
            if let Some(p) = v.get("pad_token_id").and_then(Value::as_i64) {
                cfg.pad_token_id = Some(p);
            }
        }
        Ok(cfg)
    }

    /// Parses the text of a `config.json`.
    pub fn from_json(text: &str) -> Result<Self> {
        let v: Value =
            serde_json::from_str(text).map_err(|e| Error::config("config", format!("not valid JSON: {e}")))?;
        let model_type = fields::string(&v, &["model_type"])?.unwrap_or("").to_string();
        let need = |keys: &[&str]| -> Result<usize> {
            fields::uint(&v, keys)?.map(|x| x as usize).ok_or_else(|| {
                Error::config("config", format!("model_type `{model_type}`: missing `{}`", keys.join("` or `")))
            })
        };
        let opt = |keys: &[&str]| -> Result<Option<usize>> { Ok(fields::uint(&v, keys)?.map(|x| x as usize)) };
        let hidden = need(&["hidden_size", "n_embd", "d_model"])?;
        let heads = need(&["num_attention_heads", "n_head", "num_heads"])?;
        if heads == 0 || hidden == 0 {
            return Err(Error::config("config", "hidden size and heads must be positive"));
        }
        let explicit_head_dim = opt(&["head_dim", "d_kv"])?;
        if explicit_head_dim.is_none() && !hidden.is_multiple_of(heads) {
            return Err(Error::config(
                "config",
                format!("{heads} attention heads do not divide the hidden size {hidden} (and no `head_dim` is given)"),
            ));
        }
        let kv_heads = opt(&["num_key_value_heads"])?.unwrap_or(heads);
        if kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
            return Err(Error::config(
                "config",
                format!("`num_key_value_heads` = {kv_heads} must be positive and divide the {heads} attention heads"),
            ));
        }
        fields::plain_rope(&v)?;
        if model_type == "t5" {
            fields::t5_buckets(&v)?;
        }
        let cfg = HfConfig {
            hidden,
            layers: need(&["num_hidden_layers", "n_layer", "num_layers"])?,
            heads,
            kv_heads,
            intermediate: opt(&["intermediate_size", "n_inner", "ffn_dim", "d_ff"])?
                .unwrap_or(hidden.saturating_mul(4)),
            vocab: need(&["vocab_size"])?,
            head_dim: explicit_head_dim.unwrap_or(hidden / heads),
            tie_word_embeddings: fields::boolean(&v, "tie_word_embeddings")?.unwrap_or(model_type != "llama"),
            attention_bias: fields::boolean(&v, "attention_bias")?.unwrap_or(false),
            mlp_bias: fields::boolean(&v, "mlp_bias")?.unwrap_or(false),
            rope_theta: match fields::float(&v, &["rope_theta"])? {
                Some(t) => t,
                None => match v.get("rope_parameters").filter(|r| !r.is_null()) {
                    Some(r) => fields::float(r, &["rope_theta"])?.unwrap_or(10000.0),
                    None => 10000.0,
                },
            },
            norm_eps: fields::float(&v, &["rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps"])?.unwrap_or(1e-5),
            hidden_act: fields::string(&v, &["hidden_act", "activation_function", "feed_forward_proj"])?
                .unwrap_or("silu")
                .to_string(),
            max_positions: opt(&["max_position_embeddings", "n_positions", "n_ctx"])?,
            bos_token_id: v.get("bos_token_id").and_then(Value::as_i64),
            eos_token_ids: ids(v.get("eos_token_id")),
            pad_token_id: v.get("pad_token_id").and_then(Value::as_i64),
            rotary_dim: opt(&["rotary_dim"])?,
            model_type,
            raw: v.clone(),
        };
        cfg.check_sizes()?;
        Ok(cfg)
    }

    /// Refuses sizes beyond [`fields::LIMITS`] and more than [`fields::MAX_PARAMS`]
    /// parameters in all, naming the field (before anything is sized from them).
    fn check_sizes(&self) -> Result<()> {
        if self.vocab == 0 || self.layers == 0 || self.head_dim == 0 {
            let field = if self.vocab == 0 {
                "vocab_size"
            } else if self.layers == 0 {
                "num_hidden_layers"
            } else {
                "head_dim"
            };
            return Err(Error::config("config", format!("`{field}` is 0: a model needs at least one")));
        }
        fields::within("layers", "num_hidden_layers", self.layers)?;
        fields::within("hidden size", "hidden_size", self.hidden)?;
        fields::within("attention heads", "num_attention_heads", self.heads)?;
        fields::within("intermediate size", "intermediate_size", self.intermediate)?;
        fields::within("vocabulary", "vocab_size", self.vocab)?;
        fields::within("head dim", "head_dim", self.head_dim)?;
        if let Some(p) = self.max_positions {
            fields::within("max positions", "max_position_embeddings", p)?;
        }
        // a norm divides by sqrt(variance + eps) and RoPE raises the base to fractional powers:
        // either at zero or below gives infinities or NaNs in the first forward pass
        if !(self.norm_eps > 0.0 && self.norm_eps < 1.0) {
            return Err(Error::config(
                "config",
                format!(
                    "the norm epsilon (`rms_norm_eps` / `layer_norm_epsilon`) is {}: expected 0 < eps < 1",
                    self.norm_eps
                ),
            ));
        }
        if self.rope_theta.is_nan() || self.rope_theta <= 1.0 {
            return Err(Error::config(
                "config",
                format!("`rope_theta` is {}: expected a base above 1", self.rope_theta),
            ));
        }
        let (h, l, v, f) = (self.hidden as u128, self.layers as u128, self.vocab as u128, self.intermediate as u128);
        let attn = 2 * h * (self.heads * self.head_dim) as u128 + 2 * h * (self.kv_heads * self.head_dim) as u128;
        // a mixture of experts: every expert's three projections (with its own intermediate
        // size) and the router, besides the dense MLP the count above already holds
        let experts = self.num("num_local_experts").or(self.num("num_experts")).unwrap_or(0);
        if experts > 0 {
            fields::within(
                "experts",
                if self.num("num_experts").is_some() { "num_experts" } else { "num_local_experts" },
                experts,
            )?;
        }
        if let Some(mi) = self.num("moe_intermediate_size") {
            fields::within("experts' intermediate size", "moe_intermediate_size", mi)?;
        }
        let moe_f = self.num("moe_intermediate_size").map_or(f, |x| x as u128);
        let params = l * (attn + 3 * h * f + experts as u128 * (3 * h * moe_f + h)) + 2 * v * h;
        if params > fields::MAX_PARAMS {
            return Err(Error::config(
                "config",
                format!(
                    "these sizes describe about {params} parameters, beyond any model redco can hold (at most {})",
                    fields::MAX_PARAMS
                ),
            ));
        }
        Ok(())
    }

    /// The sizes the planner needs.
    pub fn dims(&self) -> ModelDims {
        ModelDims {
            layers: self.layers,
            hidden: self.hidden,
            heads: self.heads,
            kv_heads: self.kv_heads,
            vocab: self.vocab,
            intermediate: self.intermediate,
            moe: self.moe_dims(),
        }
    }

    /// The mixture of experts of a Mixtral or Qwen3-MoE config, read off its checkpoint
    /// names ([`HfConfig::param_shapes`]): the experts, the layers that have them and an
    /// expert's intermediate size; `None` for a dense model.
    pub fn moe_dims(&self) -> Option<MoeDims> {
        let shapes = self.param_shapes().ok()?;
        let mut layers = std::collections::BTreeSet::new();
        let (mut experts, mut inter) = (0, 0);
        for (n, s) in &shapes {
            if let Some(e) = redco_core::planning::expert_index(n) {
                experts = experts.max(e + 1);
                layers.insert(n.split(".experts.").next().unwrap_or("").to_string());
                if e == 0 && s.rank() == 2 && s.dims()[1] == self.hidden {
                    inter = s.dims()[0];
                }
            }
        }
        (experts > 0).then(|| MoeDims {
            experts,
            top_k: self.num("num_experts_per_tok").unwrap_or(2),
            layers: layers.len(),
            intermediate: inter,
        })
    }

    /// An integer field of the raw config.
    pub fn num(&self, key: &str) -> Option<usize> {
        self.raw.get(key).and_then(Value::as_u64).map(|x| x as usize)
    }

    /// A boolean field of the raw config, or `default`.
    pub fn flag(&self, key: &str, default: bool) -> bool {
        self.raw.get(key).and_then(Value::as_bool).unwrap_or(default)
    }

    /// The linear weights stored as blocks, by name, from `quantization_config` (redco's
    /// own `{"quant_method": "redco_blocks", "formats": {name: "Q4_K", ..}}`, as
    /// `--model FILE.gguf` writes it); empty without one. The layers of an AWQ or GPTQ
    /// checkpoint that load as `Q4_1` blocks are listed as such ([`HfConfig::int4`]);
    /// other methods (bitsandbytes, ...) are refused by name.
    pub fn block_formats(&self) -> Result<std::collections::BTreeMap<String, redco_core::quant::QuantFormat>> {
        let Some(q) = self.raw.get("quantization_config").filter(|q| !q.is_null()) else {
            return Ok(Default::default());
        };
        if let Some(layout) = self.int4()? {
            return Ok(self
                .param_shapes()?
                .into_iter()
                .filter(|(n, s)| s.rank() == 2 && layout.quantizes(n) && layout.as_blocks(s.dims()[1]))
                .map(|(n, _)| (n, redco_core::quant::QuantFormat::Q4_1))
                .collect());
        }
        let method = q.get("quant_method").and_then(Value::as_str).unwrap_or("(no quant_method)");
        if method != "redco_blocks" {
            return Err(Error::unsupported(
                "config",
                format!(
                    "`quantization_config` with quant_method `{method}`: checkpoints quantized that way are not \
                     read (redco reads AWQ and GPTQ int4 checkpoints and GGUF files, and quantizes at load with \
                     --quantize q8_0|q4_0|q4_1|q4_k|q6_k)"
                ),
            ));
        }
        let formats = q.get("formats").and_then(Value::as_object).ok_or_else(|| {
            Error::config("config", "`quantization_config` of `redco_blocks` needs an object `formats`")
        })?;
        formats
            .iter()
            .map(|(n, f)| {
                let f =
                    f.as_str().ok_or_else(|| Error::config("config", format!("format of `{n}` is not a string")))?;
                Ok((n.clone(), redco_core::quant::QuantFormat::parse(f)?))
            })
            .collect()
    }

    /// The AWQ or GPTQ layout of an int4 checkpoint (`quantization_config.quant_method`
    /// `awq` or `gptq`), `None` for any other; read for the dense LLaMA family only.
    pub fn int4(&self) -> Result<Option<super::int4::Int4Layout>> {
        let Some(q) = self.raw.get("quantization_config").filter(|q| !q.is_null()) else {
            return Ok(None);
        };
        let Some(layout) = super::int4::Int4Layout::from_config(q)? else { return Ok(None) };
        if !matches!(self.model_type.as_str(), "llama" | "mistral" | "qwen3") {
            return Err(Error::unsupported(
                "config",
                format!(
                    "{} int4 checkpoints are read for llama, mistral and qwen3, not `{}`",
                    layout.name().to_uppercase(),
                    self.model_type
                ),
            ));
        }
        Ok(Some(layout))
    }

    /// Parameter names and shapes as transformers stores them (tied weights once).
    /// Supported: `llama`, `mistral`, `gptj`, `opt`.
    pub fn param_shapes(&self) -> Result<Vec<(String, Shape)>> {
        match self.model_type.as_str() {
            "llama" | "mistral" => Ok(self.llama_params()),
            "mixtral" => self.mixtral_params(),
            "qwen3" | "qwen3_moe" => self.qwen3_params(),
            "gptj" => Ok(self.gptj_params()),
            "opt" => Ok(self.opt_params()),
            "t5" => Ok(self.t5_params()),
            other => Err(Error::unsupported(
                "config",
                format!(
                    "model_type `{other}` is not supported yet (supported: llama, mistral, mixtral, qwen3, qwen3_moe, gptj, opt, t5)"
                ),
            )),
        }
    }

    /// Mixtral's checkpoint tensors: LLaMA's with each layer's MLP replaced by
    /// `block_sparse_moe.gate` (the router, `[experts, hidden]`) and each expert's `w1`, `w3`
    /// (`[intermediate, hidden]`) and `w2` (`[hidden, intermediate]`).
    fn mixtral_params(&self) -> Result<Vec<(String, Shape)>> {
        let e = self
            .num("num_local_experts")
            .ok_or_else(|| Error::config("config", "a mixtral config.json needs `num_local_experts`"))?;
        let (h, i) = (self.hidden, self.intermediate);
        let mut out = Vec::new();
        for (name, shape) in self.llama_params() {
            let Some((layer, leaf)) = name.split_once(".mlp.") else {
                out.push((name, shape));
                continue;
            };
            // one router and E experts in place of the three MLP projections
            if leaf == "gate_proj.weight" {
                out.push((format!("{layer}.block_sparse_moe.gate.weight"), Shape::new([e, h])));
                for j in 0..e {
                    for (w, s) in [("w1", [i, h]), ("w2", [h, i]), ("w3", [i, h])] {
                        out.push((format!("{layer}.block_sparse_moe.experts.{j}.{w}.weight"), Shape::new(s)));
                    }
                }
            }
        }
        Ok(out)
    }

    /// Qwen3's checkpoint tensors: LLaMA's with each layer's `self_attn.q_norm` and
    /// `self_attn.k_norm` (`[head_dim]`); for Qwen3-MoE, each sparse layer's MLP is `mlp.gate`
    /// (`[experts, hidden]`) and each expert's `gate_proj`, `up_proj` (`[moe_intermediate,
    /// hidden]`) and `down_proj`, where `mlp_only_layers` and `decoder_sparse_step` make it
    /// sparse.
    fn qwen3_params(&self) -> Result<Vec<(String, Shape)>> {
        let (h, hd) = (self.hidden, self.head_dim);
        let moe = if self.model_type == "qwen3_moe" {
            let need = |k: &str| {
                self.num(k).ok_or_else(|| Error::config("config", format!("a qwen3_moe config.json needs `{k}`")))
            };
            let e = match self.num("num_experts") {
                Some(e) => e,
                None => need("num_local_experts")?,
            };
            let only: Vec<usize> = self
                .raw
                .get("mlp_only_layers")
                .and_then(|v| v.as_array())
                .map(|a| a.iter().filter_map(|v| v.as_u64().map(|x| x as usize)).collect())
                .unwrap_or_default();
            let step = self.num("decoder_sparse_step").unwrap_or(1).max(1);
            Some((e, need("moe_intermediate_size")?, only, step))
        } else {
            None
        };
        let mut out = Vec::new();
        for (name, shape) in self.llama_params() {
            let Some((layer, leaf)) = name.split_once(".mlp.") else {
                let qk = name.strip_suffix(".self_attn.k_proj.weight").map(str::to_string);
                out.push((name, shape));
                if let Some(layer) = qk {
                    out.push((format!("{layer}.self_attn.q_norm.weight"), Shape::new([hd])));
                    out.push((format!("{layer}.self_attn.k_norm.weight"), Shape::new([hd])));
                }
                continue;
            };
            let l: usize = layer.rsplit('.').next().and_then(|x| x.parse().ok()).unwrap_or(0);
            match &moe {
                Some((e, mi, only, step)) if !only.contains(&l) && (l + 1).is_multiple_of(*step) => {
                    if leaf == "gate_proj.weight" {
                        out.push((format!("{layer}.mlp.gate.weight"), Shape::new([*e, h])));
                        for j in 0..*e {
                            for (w, s) in [("gate_proj", [*mi, h]), ("up_proj", [*mi, h]), ("down_proj", [h, *mi])] {
                                out.push((format!("{layer}.mlp.experts.{j}.{w}.weight"), Shape::new(s)));
                            }
                        }
                    }
                }
                _ => out.push((name, shape)),
            }
        }
        Ok(out)
    }

    fn gptj_params(&self) -> Vec<(String, Shape)> {
        let (h, i, v) = (self.hidden, self.intermediate, self.vocab);
        let mut out = vec![("transformer.wte.weight".to_string(), Shape::new([v, h]))];
        for l in 0..self.layers {
            let p = |s: &str| format!("transformer.h.{l}.{s}");
            out.push((p("ln_1.weight"), Shape::new([h])));
            out.push((p("ln_1.bias"), Shape::new([h])));
            for n in ["q_proj", "k_proj", "v_proj", "out_proj"] {
                out.push((p(&format!("attn.{n}.weight")), Shape::new([h, h])));
            }
            out.push((p("mlp.fc_in.weight"), Shape::new([i, h])));
            out.push((p("mlp.fc_in.bias"), Shape::new([i])));
            out.push((p("mlp.fc_out.weight"), Shape::new([h, i])));
            out.push((p("mlp.fc_out.bias"), Shape::new([h])));
        }
        out.push(("transformer.ln_f.weight".to_string(), Shape::new([h])));
        out.push(("transformer.ln_f.bias".to_string(), Shape::new([h])));
        out.push(("lm_head.weight".to_string(), Shape::new([v, h])));
        out.push(("lm_head.bias".to_string(), Shape::new([v])));
        out
    }

    fn t5_params(&self) -> Vec<(String, Shape)> {
        let (d, inner, ff, v) = (self.hidden, self.heads * self.head_dim, self.intermediate, self.vocab);
        let nb = self.num("relative_attention_num_buckets").unwrap_or(32);
        let gated = self.hidden_act.starts_with("gated-");
        let mut out = vec![("shared.weight".to_string(), Shape::new([v, d]))];
        for (stack, n) in [("encoder", self.layers), ("decoder", self.num("num_decoder_layers").unwrap_or(self.layers))]
        {
            let dec = stack == "decoder";
            for l in 0..n {
                let p = |s: &str| format!("{stack}.block.{l}.{s}");
                let mut attn = |prefix: String, rel: bool| {
                    for m in ["q", "k", "v"] {
                        out.push((format!("{prefix}.{m}.weight"), Shape::new([inner, d])));
                    }
                    out.push((format!("{prefix}.o.weight"), Shape::new([d, inner])));
                    if rel {
                        out.push((format!("{prefix}.relative_attention_bias.weight"), Shape::new([nb, self.heads])));
                    }
                };
                attn(p("layer.0.SelfAttention"), l == 0);
                if dec {
                    attn(p("layer.1.EncDecAttention"), false);
                }
                out.push((p("layer.0.layer_norm.weight"), Shape::new([d])));
                if dec {
                    out.push((p("layer.1.layer_norm.weight"), Shape::new([d])));
                }
                let f = if dec { 2 } else { 1 };
                let wi: &[&str] = if gated { &["wi_0", "wi_1"] } else { &["wi"] };
                for w in wi {
                    out.push((p(&format!("layer.{f}.DenseReluDense.{w}.weight")), Shape::new([ff, d])));
                }
                out.push((p(&format!("layer.{f}.DenseReluDense.wo.weight")), Shape::new([d, ff])));
                out.push((p(&format!("layer.{f}.layer_norm.weight")), Shape::new([d])));
            }
            out.push((format!("{stack}.final_layer_norm.weight"), Shape::new([d])));
        }
        if !self.tie_word_embeddings {
            out.push(("lm_head.weight".to_string(), Shape::new([v, d])));
        }
        out
    }

    /// OPT: the embedding width (`word_embed_proj_dim`, the hidden size when absent).
    pub fn opt_embed_dim(&self) -> usize {
        self.num("word_embed_proj_dim").unwrap_or(self.hidden)
    }

    /// OPT: whether the decoder ends with a LayerNorm (pre-norm models that keep it).
    pub fn opt_final_norm(&self) -> bool {
        self.flag("do_layer_norm_before", true) && !self.flag("_remove_final_layer_norm", false)
    }

    fn opt_params(&self) -> Vec<(String, Shape)> {
        let (h, f, v, e) = (self.hidden, self.intermediate, self.vocab, self.opt_embed_dim());
        let bias = self.flag("enable_bias", true);
        let pos = self.max_positions.unwrap_or(2048) + 2;
        let d = |s: &str| format!("model.decoder.{s}");
        let mut out =
            vec![(d("embed_tokens.weight"), Shape::new([v, e])), (d("embed_positions.weight"), Shape::new([pos, h]))];
        if e != h {
            out.push((d("project_out.weight"), Shape::new([e, h])));
            out.push((d("project_in.weight"), Shape::new([h, e])));
        }
        if self.opt_final_norm() {
            out.push((d("final_layer_norm.weight"), Shape::new([h])));
            out.push((d("final_layer_norm.bias"), Shape::new([h])));
        }
        for l in 0..self.layers {
            let p = |s: &str| format!("model.decoder.layers.{l}.{s}");
            let mut lin = |name: String, o: usize, i: usize| {
                out.push((format!("{name}.weight"), Shape::new([o, i])));
                if bias {
                    out.push((format!("{name}.bias"), Shape::new([o])));
                }
            };
            for n in ["k_proj", "v_proj", "q_proj", "out_proj"] {
                lin(p(&format!("self_attn.{n}")), h, h);
            }
            lin(p("fc1"), f, h);
            lin(p("fc2"), h, f);
            for n in ["self_attn_layer_norm", "final_layer_norm"] {
                out.push((p(&format!("{n}.weight")), Shape::new([h])));
                out.push((p(&format!("{n}.bias")), Shape::new([h])));
            }
        }
        if !self.tie_word_embeddings {
            out.push(("lm_head.weight".to_string(), Shape::new([v, e])));
        }
        out
    }

    fn llama_params(&self) -> Vec<(String, Shape)> {
        let (h, hd, i) = (self.hidden, self.head_dim, self.intermediate);
        let mut v = vec![("model.embed_tokens.weight".to_string(), Shape::new([self.vocab, h]))];
        for l in 0..self.layers {
            let p = |s: &str| format!("model.layers.{l}.{s}");
            v.push((p("input_layernorm.weight"), Shape::new([h])));
            for (n, out) in
                [("q_proj", self.heads * hd), ("k_proj", self.kv_heads * hd), ("v_proj", self.kv_heads * hd)]
            {
                v.push((p(&format!("self_attn.{n}.weight")), Shape::new([out, h])));
                if self.attention_bias {
                    v.push((p(&format!("self_attn.{n}.bias")), Shape::new([out])));
                }
            }
            v.push((p("self_attn.o_proj.weight"), Shape::new([h, self.heads * hd])));
            if self.attention_bias {
                v.push((p("self_attn.o_proj.bias"), Shape::new([h])));
            }
            v.push((p("post_attention_layernorm.weight"), Shape::new([h])));
            for (n, shape) in [("gate_proj", [i, h]), ("up_proj", [i, h]), ("down_proj", [h, i])] {
                v.push((p(&format!("mlp.{n}.weight")), Shape::new(shape)));
                if self.mlp_bias {
                    v.push((p(&format!("mlp.{n}.bias")), Shape::new([shape[0]])));
                }
            }
        }
        v.push(("model.norm.weight".to_string(), Shape::new([h])));
        if !self.tie_word_embeddings {
            v.push(("lm_head.weight".to_string(), Shape::new([self.vocab, h])));
        }
        v
    }
}
