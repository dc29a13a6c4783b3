//! A Hugging Face LLaMA directory written as a GGUF file that llama.cpp runs
//! (`general.architecture = "llama"`), in f32, f16 or bf16, its linear layers optionally
//! quantized to one of llama.cpp's block types: llama.cpp's tensor names, its
//! hyperparameter keys, the SentencePiece vocabulary of `tokenizer.json` and the chat
//! template ([`export`]); and such a file read back into a Hugging Face directory
//! ([`import`]: the float types as stored; `Q8_0`, `Q4_0`, `Q4_1`, `Q4_K` and `Q6_K` blocks
//! dequantized, or kept; other block types refused naming their type).
//!
//! transformers stores each head's query and key rows as two halves (the rotary pairs are
//! `(i, i + d/2)`); llama.cpp's LLaMA rotates adjacent pairs `(2i, 2i + 1)`. The query and
//! key matrices are permuted as llama.cpp's own converter does, so both compute the same
//! function: within each head, row `t * d/2 + j` moves to `2j + t`.

use super::format::{GgmlType, Value, Writer};
use super::vocab::spm_from_hf_json;
use crate::hf::checkpoint::Checkpoint;
use crate::hf::config::HfConfig;
use redco_core::quant::QuantFormat;
use redco_core::{DType, Error, Result};
use std::path::Path;

fn err(what: impl std::fmt::Display) -> Error {
    Error::invalid("gguf", what.to_string())
}

/// GGML's type and llama.cpp's `general.file_type` for a dtype written.
fn ggml_type(dtype: DType) -> Result<(GgmlType, u32)> {
    match dtype {
        DType::F32 => Ok((GgmlType::F32, 0)),
        DType::F16 => Ok((GgmlType::F16, 1)),
        DType::BF16 => Ok((GgmlType::BF16, 32)),
        d => Err(err(format!("GGUF export writes f32, f16 or bf16, not {d:?}"))),
    }
}

/// llama.cpp's name for a transformers LLaMA tensor (None: a buffer it does not store).
fn gguf_name(hf: &str) -> Result<Option<String>> {
    let fixed = match hf {
        "model.embed_tokens.weight" => Some("token_embd.weight"),
        "model.norm.weight" => Some("output_norm.weight"),
        "lm_head.weight" => Some("output.weight"),
        _ => None,
    };
    if let Some(n) = fixed {
        return Ok(Some(n.to_string()));
    }
    if hf.ends_with("rotary_emb.inv_freq") {
        return Ok(None);
    }
    let rest = hf.strip_prefix("model.layers.").ok_or_else(|| err(format!("tensor `{hf}` is not a LLaMA tensor")))?;
    let (layer, part) = rest.split_once('.').ok_or_else(|| err(format!("tensor `{hf}` is not a LLaMA tensor")))?;
    let short = match part {
        "input_layernorm.weight" => "attn_norm.weight",
        "self_attn.q_proj.weight" => "attn_q.weight",
        "self_attn.k_proj.weight" => "attn_k.weight",
        "self_attn.v_proj.weight" => "attn_v.weight",
        "self_attn.o_proj.weight" => "attn_output.weight",
        "post_attention_layernorm.weight" => "ffn_norm.weight",
        "mlp.gate_proj.weight" => "ffn_gate.weight",
        "mlp.up_proj.weight" => "ffn_up.weight",
        "mlp.down_proj.weight" => "ffn_down.weight",
        _ => return Err(err(format!("tensor `{hf}` has no llama.cpp counterpart (biases are not exported)"))),
    };
    Ok(Some(format!("blk.{layer}.{short}")))
}

/// transformers' name for a llama.cpp LLaMA tensor.
fn hf_name(g: &str) -> Result<String> {
    let fixed = match g {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(n) = fixed {
        return Ok(n.to_string());
    }
    let not = || err(format!("tensor `{g}` is not a LLaMA tensor this reader knows"));
    let rest = g.strip_prefix("blk.").ok_or_else(not)?;
    let (layer, part) = rest.split_once('.').ok_or_else(not)?;
    let long = match part {
        "attn_norm.weight" => "input_layernorm.weight",
        "attn_q.weight" => "self_attn.q_proj.weight",
        "attn_k.weight" => "self_attn.k_proj.weight",
        "attn_v.weight" => "self_attn.v_proj.weight",
        "attn_output.weight" => "self_attn.o_proj.weight",
        "ffn_norm.weight" => "post_attention_layernorm.weight",
        "ffn_gate.weight" => "mlp.gate_proj.weight",
        "ffn_up.weight" => "mlp.up_proj.weight",
        "ffn_down.weight" => "mlp.down_proj.weight",
        _ => return Err(not()),
    };
    Ok(format!("model.layers.{layer}.{long}"))
}

/// Writes the LLaMA model of GGUF file `file` as a Hugging Face directory `out`:
/// `config.json`, `model.safetensors` (float tensors in their stored type, quantized ones
/// dequantized to `dequant`: f32, bf16 or f16), `tokenizer.json` and
/// `tokenizer_config.json` from its SentencePiece vocabulary, and `chat_template.jinja`
/// when it has one. With `keep_blocks`, the linear layers' quantized weights stay the
/// file's blocks (`U8 [out, row_bytes]`, named in `config.json`'s `quantization_config`,
/// read in place by [`redco_core::Tensor::matmul_quant`]); the rest is dequantized.
/// Another architecture, a block type `redco_core::quant` does not read, a rotary scaling
/// or a tokenizer other than SentencePiece is refused by name.
pub fn import(file: &Path, out: &Path, dequant: DType, keep_blocks: bool) -> Result<()> {
    use super::format::Gguf;
    let (g, map) = Gguf::open(file)?;
    let arch = g.get("general.architecture").and_then(Value::as_str).unwrap_or("none");
    if arch != "llama" {
        return Err(err(format!("GGUF import reads LLaMA models; this file's architecture is `{arch}`")));
    }
    ggml_type(dequant)?;
    if let Some(t) = g.tensors.iter().find(|t| t.byte_len().is_none()) {
        return Err(err(format!(
            "tensor `{}` is {}; GGUF import reads f32, f16, bf16, Q8_0, Q4_0, Q4_1, Q4_K and Q6_K tensors",
            t.name,
            t.ty.name()
        )));
    }
    if let Some((k, _)) = g.metadata.iter().find(|(k, _)| k.starts_with("llama.rope.scaling")) {
        return Err(err(format!("GGUF import does not read rotary scaling (`{k}`)")));
    }
    let num = |k: &str| -> Result<usize> {
        g.get(k).and_then(Value::as_u64).map(|x| x as usize).ok_or_else(|| err(format!("the file has no `{k}`")))
    };
    let mut vocab = super::vocab::spm_from_gguf(&g)?;
    let rows = num("llama.vocab_size").unwrap_or(vocab.tokens.len());
    // the padding entries that fill the embedding's rows past the tokenizer (as `export`
    // and llama.cpp's converter write them) are no tokens of the tokenizer
    while vocab.types.last() == Some(&super::vocab::token_type::UNUSED)
        && vocab.tokens.last().is_some_and(|t| t.starts_with("[PAD"))
    {
        vocab.tokens.pop();
        vocab.scores.pop();
        vocab.types.pop();
    }
    let (hidden, heads) = (num("llama.embedding_length")?, num("llama.attention.head_count")?);
    let kv_heads = num("llama.attention.head_count_kv").unwrap_or(heads);
    let head_dim = num("llama.attention.key_length").unwrap_or(hidden / heads.max(1));
    let layers = num("llama.block_count")?;
    let float = |k: &str, d: f64| g.get(k).and_then(Value::as_f64).unwrap_or(d);
    let tied = !g.tensors.iter().any(|t| t.name == "output.weight");
    let mut config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "hidden_size": hidden, "intermediate_size": num("llama.feed_forward_length")?,
        "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
        "head_dim": head_dim, "max_position_embeddings": num("llama.context_length").unwrap_or(2048),
        "rms_norm_eps": float("llama.attention.layer_norm_rms_epsilon", 1e-6),
        "rope_theta": float("llama.rope.freq_base", 10000.0),
        "vocab_size": rows,
        "tie_word_embeddings": tied, "attention_bias": false, "mlp_bias": false,
    });
    for (k, id) in [("bos_token_id", vocab.bos), ("eos_token_id", vocab.eos)] {
        config[k] = id.map_or(serde_json::Value::Null, |i| serde_json::json!(i));
    }
    // what each tensor becomes, checked before anything is written; the bytes are made one
    // tensor at a time as the file is written, so a file several times the memory's size
    // reads into its directory holding one tensor at a time
    let mut planned = Vec::new();
    let mut formats = serde_json::Map::new();
    for t in &g.tensors {
        let name = hf_name(&t.name)?;
        let mut dims: Vec<usize> = t.dims.iter().rev().map(|&d| d as usize).collect();
        let raw_len = g.tensor_bytes(&map, t)?.len();
        let quantized = t.ty.elem_bytes().is_none();
        let linear = name.ends_with("proj.weight") || name == "lm_head.weight";
        let permute = if t.name.ends_with("attn_q.weight") || t.name.ends_with("attn_k.weight") {
            let h = if t.name.ends_with("attn_q.weight") { heads } else { kv_heads };
            if dims.len() != 2 || dims[0] != h * head_dim {
                return Err(err(format!("tensor `{}` has shape {dims:?}, not [{}, {hidden}]", t.name, h * head_dim)));
            }
            Some(h)
        } else {
            None
        };
        if let (true, true, Some(q), 2) = (keep_blocks, linear, t.ty.quant(), dims.len()) {
            // every row whole blocks (the file's length is only checked in all)
            if !dims[1].is_multiple_of(q.block_values()) || !raw_len.is_multiple_of(dims[0].max(1)) {
                return Err(err(format!(
                    "tensor `{}` of {}: rows of {} values are not whole blocks of {}",
                    t.name,
                    t.ty.name(),
                    dims[1],
                    q.block_values()
                )));
            }
            formats.insert(name.clone(), serde_json::json!(q.name()));
            dims[1] = raw_len / dims[0].max(1);
            planned.push(Planned { name, t, dims, dtype: DType::U8, len: raw_len, blocks: true, permute });
            continue;
        }
        let dtype = match t.ty {
            _ if quantized => {
                if t.ty.quant().is_none() {
                    return Err(err(format!(
                        "tensor `{}` is {}: blocks of that type are not read (Q8_0, Q4_0, Q4_1, Q4_K and Q6_K are)",
                        t.name,
                        t.ty.name()
                    )));
                }
                dequant
            }
            GgmlType::F32 => DType::F32,
            GgmlType::F16 => DType::F16,
            _ => DType::BF16,
        };
        let len = t.elems() as usize * dtype.size_in_bytes();
        if dims.iter().product::<usize>() != t.elems() as usize {
            return Err(err(format!("tensor `{}`: shape {dims:?} does not hold its {} values", t.name, t.elems())));
        }
        planned.push(Planned { name, t, dims, dtype, len, blocks: false, permute });
    }
    if !formats.is_empty() {
        config["quantization_config"] = serde_json::json!({"quant_method": "redco_blocks", "formats": formats});
    }
    std::fs::create_dir_all(out).map_err(|e| err(format!("{}: {e}", out.display())))?;
    let write = |f: &str, bytes: &[u8]| redco_pipeline::checkpoint::write_atomic(&out.join(f), bytes);
    let source = Source { g: &g, file: &map, head_dim, failed: std::cell::RefCell::new(None) };
    write_tensors(&out.join("model.safetensors"), &source, &planned)?;
    write("config.json", serde_json::to_string_pretty(&config).unwrap_or_default().as_bytes())?;
    let pretty = |v: &serde_json::Value| serde_json::to_string_pretty(v).unwrap_or_default();
    write("tokenizer.json", pretty(&super::vocab::hf_json_from_spm(&vocab)?).as_bytes())?;
    write("tokenizer_config.json", pretty(&super::vocab::hf_config_from_spm(&vocab)).as_bytes())?;
    if let Some(t) = g.get("tokenizer.chat_template").and_then(Value::as_str) {
        write("chat_template.jinja", t.as_bytes())?;
    }
    Ok(())
}

/// One tensor of the directory [`import`] writes: its GGUF tensor and what it becomes.
struct Planned<'a> {
    name: String,
    t: &'a super::format::TensorInfo,
    dims: Vec<usize>,
    dtype: DType,
    len: usize,
    /// Kept as the file's blocks (`[rows, bytes a row]`), else values of `dtype`.
    blocks: bool,
    /// The heads of a query or key projection, whose rows go back to transformers' order.
    permute: Option<usize>,
}

/// The file the tensors come from, and the first error met making one.
struct Source<'a> {
    g: &'a super::format::Gguf,
    file: &'a [u8],
    head_dim: usize,
    failed: std::cell::RefCell<Option<Error>>,
}

impl Source<'_> {
    /// The bytes `p` holds in the directory.
    fn bytes(&self, p: &Planned<'_>) -> Result<Vec<u8>> {
        use redco_core::HostData;
        let (t, raw) = (p.t, self.g.tensor_bytes(self.file, p.t)?);
        if p.blocks {
            let row = raw.len() / p.dims[0].max(1);
            return Ok(match p.permute {
                Some(h) => permute_rows(raw, h, self.head_dim, 1, row, false),
                None => raw.to_vec(),
            });
        }
        let (mut bytes, elem) = match t.ty.quant() {
            Some(q) if t.ty.elem_bytes().is_none() => {
                let v = redco_core::quant::blocks::dequantize(q, raw, t.elems() as usize)
                    .map_err(|e| err(format!("tensor `{}`: {e}", t.name)))?;
                (bytemuck::cast_slice::<f32, u8>(&v).to_vec(), 4)
            }
            _ => (raw.to_vec(), t.ty.elem_bytes().unwrap_or(4) as usize),
        };
        if let Some(h) = p.permute {
            bytes = permute_rows(&bytes, h, self.head_dim, p.dims.last().copied().unwrap_or(1), elem, false);
        }
        if t.ty.elem_bytes().is_none() {
            bytes = HostData::from_bytes(DType::F32, &bytes)?.into_dtype(p.dtype).as_bytes().to_vec();
        }
        Ok(bytes)
    }
}

/// A tensor as the safetensors writer takes it: its bytes made when they are written.
struct Lazy<'a>(&'a Source<'a>, &'a Planned<'a>);

impl safetensors::View for Lazy<'_> {
    fn dtype(&self) -> safetensors::Dtype {
        redco_pipeline::checkpoint::st_dtype(self.1.dtype)
    }
    fn shape(&self) -> &[usize] {
        &self.1.dims
    }
    fn data(&self) -> std::borrow::Cow<'_, [u8]> {
        // the writer takes no error: the first one is kept, the file finished with zeros and
        // then removed
        if self.0.failed.borrow().is_some() {
            return std::borrow::Cow::Owned(vec![0; self.1.len]);
        }
        let made = self.0.bytes(self.1).and_then(|b| {
            if b.len() == self.1.len {
                Ok(b)
            } else {
                Err(err(format!("tensor `{}`: {} bytes made, {} planned", self.1.t.name, b.len(), self.1.len)))
            }
        });
        match made {
            Ok(b) => std::borrow::Cow::Owned(b),
            Err(e) => {
                self.0.failed.borrow_mut().get_or_insert(e);
                std::borrow::Cow::Owned(vec![0; self.1.len])
            }
        }
    }
    fn data_len(&self) -> usize {
        self.1.len
    }
}

/// Flushes the file or directory `p` to the disk.
fn sync(p: &Path) -> Result<()> {
    std::fs::File::open(p).and_then(|f| f.sync_all()).map_err(|e| Error::io("gguf", "cannot sync", p, e))
}

/// Writes `planned` to the safetensors file `path` tensor by tensor (a temporary name,
/// renamed when complete).
fn write_tensors(path: &Path, source: &Source<'_>, planned: &[Planned<'_>]) -> Result<()> {
    let tmp = path.with_extension("safetensors.part");
    let views = planned.iter().map(|p| (p.name.clone(), Lazy(source, p)));
    let written = safetensors::serialize_to_file(views, &None, &tmp)
        .map_err(|e| err(format!("cannot write {}: {e}", tmp.display())))
        .and_then(|()| source.failed.borrow_mut().take().map_or(Ok(()), Err))
        // on the disk before it is published (the directory is reused by later runs)
        .and_then(|()| sync(&tmp))
        .and_then(|()| std::fs::rename(&tmp, path).map_err(|e| Error::io("gguf", "cannot rename", tmp.clone(), e)))
        .and_then(|()| sync(path.parent().unwrap_or(Path::new("."))));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Rows of a `[heads * d, cols]` query or key matrix moved between transformers' order and
/// llama.cpp's (see the module docs; `to_llama` false undoes it), as bytes of `elem` bytes
/// per value.
fn permute_rows(bytes: &[u8], heads: usize, d: usize, cols: usize, elem: usize, to_llama: bool) -> Vec<u8> {
    let row = cols * elem;
    let mut out = vec![0u8; bytes.len()];
    for h in 0..heads {
        for t in 0..2 {
            for j in 0..d / 2 {
                let (hf, llama) = ((h * d + t * (d / 2) + j) * row, (h * d + 2 * j + t) * row);
                let (from, to) = if to_llama { (hf, llama) } else { (llama, hf) };
                out[to..to + row].copy_from_slice(&bytes[from..from + row]);
            }
        }
    }
    out
}

/// The chat template of `dir`: `chat_template.jinja`, else `tokenizer_config.json`'s
/// `chat_template` (the `default` one of a list of named templates).
fn chat_template(dir: &Path, tok_cfg: &serde_json::Value) -> Option<String> {
    if let Ok(t) = std::fs::read_to_string(dir.join("chat_template.jinja")) {
        return Some(t);
    }
    match &tok_cfg["chat_template"] {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Array(list) => list
            .iter()
            .find(|t| t["name"].as_str() == Some("default"))
            .and_then(|t| t["template"].as_str())
            .map(str::to_string),
        _ => None,
    }
}

/// llama.cpp's `general.file_type` of a model whose linear layers are `f` (its
/// `LLAMA_FTYPE_MOSTLY_*`; `Q4_K` as `Q4_K_S`, the layers all `Q4_K`).
fn file_type_of(f: QuantFormat) -> u32 {
    match f {
        QuantFormat::Q4_0 => 2,
        QuantFormat::Q4_1 => 3,
        QuantFormat::Q8_0 => 7,
        QuantFormat::Q4K => 14,
        QuantFormat::Q6K => 18,
    }
}

/// Writes the LLaMA model of Hugging Face directory `dir` to `out` as GGUF, its matrices in
/// `dtype` (norms stay f32, as llama.cpp keeps them). With `quantize`, the linear layers
/// (the projections and the output layer) whose rows are whole blocks are written as
/// blocks of that type, quantized as `--quantize` does at load (the token embedding stays
/// `dtype`: a lookup reads one row a token); the names of those left in `dtype` are
/// returned. Refused with the reason: another architecture, biases, rotary scaling, a
/// tokenizer that is not SentencePiece-style, a checkpoint already quantized.
pub fn export(dir: &Path, out: &Path, dtype: DType, quantize: Option<QuantFormat>) -> Result<Vec<String>> {
    let cfg = HfConfig::from_dir(dir)?;
    if cfg.int4()?.is_some() || !cfg.block_formats()?.is_empty() {
        return Err(err("GGUF export reads float checkpoints; this one's linear layers are already quantized"));
    }
    if cfg.model_type != "llama" {
        return Err(err(format!("GGUF export supports LLaMA models; this one is `{}`", cfg.model_type)));
    }
    if cfg.attention_bias || cfg.mlp_bias {
        return Err(err("GGUF export does not write LLaMA biases (attention_bias / mlp_bias are set)"));
    }
    if !cfg.raw["rope_scaling"].is_null() {
        return Err(err(format!("GGUF export does not write rope_scaling {}", cfg.raw["rope_scaling"])));
    }
    let (ty, mut file_type) = ggml_type(dtype)?;
    if let Some(f) = quantize {
        file_type = file_type_of(f);
    }
    let read = |f: &str| -> Result<serde_json::Value> {
        let p = dir.join(f);
        let text = std::fs::read_to_string(&p).map_err(|e| err(format!("{}: {e}", p.display())))?;
        serde_json::from_str(&text).map_err(|e| err(format!("{}: {e}", p.display())))
    };
    let tok = read("tokenizer.json")?;
    let tok_cfg = read("tokenizer_config.json").unwrap_or(serde_json::Value::Null);
    let special = |k: &str| match &tok_cfg[k] {
        serde_json::Value::String(s) => Some(s.clone()),
        v => v["content"].as_str().map(str::to_string),
    };
    let (bos, eos) = (special("bos_token"), special("eos_token"));
    let mut vocab = spm_from_hf_json(&tok, bos.as_deref(), eos.as_deref())?;
    if vocab.tokens.len() > cfg.vocab {
        return Err(err(format!("the tokenizer has {} tokens, the model {}", vocab.tokens.len(), cfg.vocab)));
    }
    // rows of the embedding no token reaches: padding entries, as llama.cpp's converter writes
    for i in vocab.tokens.len()..cfg.vocab {
        vocab.tokens.push(format!("[PAD{i}]"));
        vocab.scores.push(-1000.0);
        vocab.types.push(super::vocab::token_type::UNUSED);
    }
    let mut w = Writer::new();
    let name = dir.file_name().map_or("model".into(), |n| n.to_string_lossy().to_string());
    let set = |w: &mut Writer, k: &str, v: usize| w.set(k, Value::U32(v as u32));
    w.set("general.architecture", Value::Str("llama".into()));
    w.set("general.name", Value::Str(name));
    w.set("general.file_type", Value::U32(file_type));
    set(&mut w, "llama.vocab_size", cfg.vocab);
    set(&mut w, "llama.context_length", cfg.max_positions.unwrap_or(2048));
    set(&mut w, "llama.embedding_length", cfg.hidden);
    set(&mut w, "llama.block_count", cfg.layers);
    set(&mut w, "llama.feed_forward_length", cfg.intermediate);
    set(&mut w, "llama.rope.dimension_count", cfg.head_dim);
    set(&mut w, "llama.attention.head_count", cfg.heads);
    set(&mut w, "llama.attention.head_count_kv", cfg.kv_heads);
    set(&mut w, "llama.attention.key_length", cfg.head_dim);
    set(&mut w, "llama.attention.value_length", cfg.head_dim);
    w.set("llama.attention.layer_norm_rms_epsilon", Value::F32(cfg.norm_eps as f32));
    w.set("llama.rope.freq_base", Value::F32(cfg.rope_theta as f32));
    w.set("tokenizer.ggml.model", Value::Str("llama".into()));
    w.set("tokenizer.ggml.pre", Value::Str("default".into()));
    w.set("tokenizer.ggml.tokens", Value::strings(&vocab.tokens));
    w.set("tokenizer.ggml.scores", Value::f32s(&vocab.scores));
    w.set("tokenizer.ggml.token_type", Value::i32s(&vocab.types));
    for (k, id) in [("bos", vocab.bos), ("eos", vocab.eos), ("unknown", vocab.unk)] {
        if let Some(id) = id {
            w.set(&format!("tokenizer.ggml.{k}_token_id"), Value::U32(id));
        }
    }
    if let Some(pad) = cfg.pad_token_id.and_then(|p| u32::try_from(p).ok()) {
        w.set("tokenizer.ggml.padding_token_id", Value::U32(pad));
    }
    w.set("tokenizer.ggml.add_bos_token", Value::Bool(vocab.add_bos));
    w.set("tokenizer.ggml.add_eos_token", Value::Bool(false));
    if let Some(t) = chat_template(dir, &tok_cfg) {
        w.set("tokenizer.chat_template", Value::Str(t));
    }
    let ck = Checkpoint::open(dir)?;
    let names: Vec<(String, Vec<usize>)> = ck.tensors().map(|(n, s, _)| (n.to_string(), s.dims().to_vec())).collect();
    let (mut left, mut quantized) = (Vec::new(), 0usize);
    for (hf, dims) in names {
        let Some(gname) = gguf_name(&hf)? else { continue };
        let block = quantize.filter(|f| {
            dims.len() == 2 && gname != "token_embd.weight" && {
                let whole = dims[1].is_multiple_of(f.block_values());
                if !whole {
                    left.push(hf.clone());
                }
                whole
            }
        });
        let (t, d) = match block {
            Some(_) => (GgmlType::F32, DType::F32),
            None if dims.len() == 1 => (GgmlType::F32, DType::F32),
            None => (ty, dtype),
        };
        let data = ck.read_as(&hf, d)?.data;
        let mut bytes = data.as_bytes().to_vec();
        let elem = t.elem_bytes().unwrap_or(4) as usize;
        if hf.ends_with("q_proj.weight") {
            bytes = permute_rows(&bytes, cfg.heads, cfg.head_dim, dims[1], elem, true);
        } else if hf.ends_with("k_proj.weight") {
            bytes = permute_rows(&bytes, cfg.kv_heads, cfg.head_dim, dims[1], elem, true);
        }
        let (t, bytes) = match block {
            Some(f) => {
                quantized += 1;
                let values: Vec<f32> = bytemuck::pod_collect_to_vec(&bytes);
                (GgmlType::Other(f.ggml_type()), redco_core::quant::quantize(f, &values)?)
            }
            None => (t, bytes),
        };
        w.tensor(&gname, dims.iter().rev().map(|&x| x as u64).collect(), t, bytes)?;
    }
    if let Some(f) = quantize.filter(|_| quantized == 0) {
        return Err(err(format!(
            "no linear layer of this model has rows of whole {f} blocks ({} values)",
            f.block_values()
        )));
    }
    w.write(out)?;
    Ok(left)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_rows_move_to_adjacent_pairs_and_back() {
        // one head of d = 4, one column: rows [r0 r1 r2 r3] pair (0,2) and (1,3) in
        // transformers; llama.cpp wants the pairs adjacent: [r0 r2 r1 r3]
        let rows: Vec<u8> = vec![0, 1, 2, 3, 10, 11, 12, 13];
        assert_eq!(permute_rows(&rows, 2, 4, 1, 1, true), vec![0, 2, 1, 3, 10, 12, 11, 13]);
        let wide: Vec<u8> = (0..64).collect();
        assert_eq!(permute_rows(&permute_rows(&wide, 2, 8, 2, 2, true), 2, 8, 2, 2, false), wide);
        for g in ["blk.3.ffn_down.weight", "blk.0.attn_k.weight", "output.weight", "token_embd.weight"] {
            assert_eq!(gguf_name(&hf_name(g).unwrap()).unwrap().unwrap(), g);
        }
        assert!(hf_name("blk.0.attn_q.bias").is_err());
    }

    #[test]
    fn names_map_and_unknown_tensors_are_refused() {
        assert_eq!(gguf_name("model.layers.3.mlp.down_proj.weight").unwrap().unwrap(), "blk.3.ffn_down.weight");
        assert_eq!(gguf_name("model.layers.0.self_attn.rotary_emb.inv_freq").unwrap(), None);
        assert!(gguf_name("model.layers.0.self_attn.q_proj.bias").is_err());
        assert!(gguf_name("transformer.h.0.attn.weight").is_err());
    }
}
