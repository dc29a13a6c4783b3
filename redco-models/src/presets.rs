//! Built-in starting points that need no download: model presets (Hugging Face LLaMA
//! configurations), the bundled synthetic text corpus, and the tokenizers that go with them
//! (written as ordinary `tokenizer.json` files, so a trained preset is a Hugging Face model
//! directory like any other).

use redco_core::{Error, Result};
use redco_pipeline::synthetic::MarkovCorpus;
use serde_json::{json, Value};
use std::path::Path;

/// Special tokens of the built-in tokenizers: `<unk>` = 0, `<s>` = 1, `</s>` = 2.
pub const SPECIALS: [&str; 3] = ["<unk>", "<s>", "</s>"];

/// The preset names.
pub const PRESETS: [&str; 7] =
    ["llama-tiny", "llama-small", "llama-134m", "llama-0.7b", "qwen3-moe-tiny", "qwen3-moe-small", "qwen3-moe-1b"];

/// The `config.json` of preset `name` for a vocabulary of `vocab` tokens.
pub fn config(name: &str, vocab: usize) -> Result<Value> {
    if let Some(moe) = moe_config(name, vocab) {
        return Ok(moe);
    }
    let (hidden, layers, heads, kv, inter) = match name {
        // trains in minutes on two CPU cores
        "llama-tiny" => (128, 4, 4, 2, 344),
        // the benchmark shape: hidden 512, 6 layers, 8 heads, intermediate 1408
        "llama-small" => (512, 6, 8, 8, 1408),
        // a middle size (134M parameters at vocab 32000): hidden 768, 12 layers, 12 heads,
        // intermediate 2048
        "llama-134m" => (768, 12, 12, 12, 2048),
        // a model that strains one 24 GiB host in f32 with AdamW (0.71B parameters in its
        // layers alone, 11.3 GB of weights, gradients and moments): hidden 1536, 25 layers,
        // 16 heads, intermediate 4096; the memory tools' proving size
        "llama-0.7b" => (1536, 25, 16, 16, 4096),
        other => {
            return Err(Error::invalid(
                "preset",
                format!("unknown preset `{other}` (available: {})", PRESETS.join(", ")),
            ))
        }
    };
    Ok(json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "vocab_size": vocab,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": false,
        "attention_bias": false,
        "mlp_bias": false,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32"
    }))
}

/// The Qwen3-MoE presets: `qwen3-moe-tiny` (8 experts, 2 per token: trains in seconds),
/// `qwen3-moe-small` (`llama-small`'s attention and, in place of its MLP, 32 experts of 352,
/// 4 per token: the same active parameters per token, eight times the MLP weights; the
/// benchmarks' mixture beside the dense model) and `qwen3-moe-1b`, the expert-parallel
/// proving size: 64 experts of intermediate 352, 4 per
/// token, over 12 layers of hidden 1024 (0.86B parameters, 0.08B active per token; its
/// experts are 96% of it, so split over four ranks each holds about a quarter, and four
/// f32 AdamW processes stay under 20 GB together).
fn moe_config(name: &str, vocab: usize) -> Option<Value> {
    let (hidden, layers, heads, kv, experts, top_k, inter) = match name {
        "qwen3-moe-tiny" => (64, 2, 4, 2, 8, 2, 48),
        "qwen3-moe-small" => (512, 6, 8, 8, 32, 4, 352),
        "qwen3-moe-1b" => (1024, 12, 16, 4, 64, 4, 352),
        _ => return None,
    };
    Some(json!({
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "hidden_size": hidden,
        "intermediate_size": 4 * hidden,
        "moe_intermediate_size": inter,
        "num_experts": experts,
        "num_experts_per_tok": top_k,
        "norm_topk_prob": true,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "head_dim": hidden / heads,
        "vocab_size": vocab,
        "max_position_embeddings": 512,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": false,
        "attention_bias": false,
        "output_router_logits": true,
        "router_aux_loss_coef": 0.001,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float32"
    }))
}

/// The bundled corpus: sentences from a Markov chain over made-up words, with a known
/// entropy rate, so the best achievable loss is known.
pub struct SyntheticText {
    /// The token chain (ids are word indices; tokenizer ids are these plus 3).
    pub corpus: MarkovCorpus,
    /// The words.
    pub words: Vec<String>,
}

impl SyntheticText {
    /// `words` words, sequences of `seq_len` words, from `seed`.
    pub fn new(n_words: usize, seq_len: usize, seed: u64) -> Self {
        const C: [&str; 16] = ["b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "sh", "ch"];
        const V: [&str; 5] = ["a", "e", "i", "o", "u"];
        let words: Vec<String> = (0..n_words)
            .map(|i| {
                let (a, b) = (i % (C.len() * V.len()), i / (C.len() * V.len()));
                let w = format!("{}{}", C[a % C.len()], V[a / C.len()]);
                if b == 0 {
                    w
                } else {
                    format!("{w}{}{}", C[(b - 1) % C.len()], V[((b - 1) / C.len()) % V.len()])
                }
            })
            .collect();
        SyntheticText { corpus: MarkovCorpus::new(n_words, seq_len, seed), words }
    }

    /// Token ids (tokenizer ids, `<s>` first) of sequence `i`.
    pub fn ids(&self, i: u64) -> Vec<i64> {
        std::iter::once(1).chain(self.corpus.sequence(i).into_iter().map(|t| t + 3)).collect()
    }

    /// The text of sequence `i`.
    pub fn text(&self, i: u64) -> String {
        let w: Vec<&str> = self.corpus.sequence(i).into_iter().map(|t| self.words[t as usize].as_str()).collect();
        w.join(" ")
    }

    /// The tokenizer vocabulary size (words + specials).
    pub fn vocab(&self) -> usize {
        self.words.len() + SPECIALS.len()
    }

    /// Writes its word-level `tokenizer.json` and `tokenizer_config.json` into `dir`.
    pub fn write_tokenizer(&self, dir: &Path) -> Result<()> {
        let mut vocab = serde_json::Map::new();
        for (i, t) in SPECIALS.iter().map(|s| s.to_string()).chain(self.words.iter().cloned()).enumerate() {
            vocab.insert(t, json!(i));
        }
        let model = json!({ "type": "WordLevel", "vocab": vocab, "unk_token": "<unk>" });
        write_tokenizer(dir, model, json!({ "type": "WhitespaceSplit" }), Value::Null)
    }
}

/// Writes a byte-level tokenizer (every byte is a token, ids 3..259; no merges) into `dir`:
/// it encodes any text, so a preset can train on any JSONL corpus.
pub fn write_byte_tokenizer(dir: &Path) -> Result<()> {
    let mut vocab = serde_json::Map::new();
    for (i, s) in SPECIALS.iter().enumerate() {
        vocab.insert(s.to_string(), json!(i));
    }
    for (b, c) in byte_chars().into_iter().enumerate() {
        vocab.insert(c.to_string(), json!(b + SPECIALS.len()));
    }
    let model = json!({
        "type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
        "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
        "vocab": vocab, "merges": []
    });
    let pre = json!({ "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true });
    let dec = json!({ "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true });
    write_tokenizer(dir, model, pre, dec)
}

/// The printable character GPT-2's byte-level scheme uses for each byte.
fn byte_chars() -> Vec<char> {
    let printable = |b: u32| (33..=126).contains(&b) || (161..=172).contains(&b) || (174..=255).contains(&b);
    let mut extra = 0;
    (0u32..256)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).unwrap_or('?')
            } else {
                extra += 1;
                char::from_u32(255 + extra).unwrap_or('?')
            }
        })
        .collect()
}

fn write_tokenizer(dir: &Path, model: Value, pre_tokenizer: Value, decoder: Value) -> Result<()> {
    let added: Vec<Value> = SPECIALS
        .iter()
        .enumerate()
        .map(|(i, s)| {
            json!({ "id": i, "content": s, "single_word": false, "lstrip": false, "rstrip": false,
                    "normalized": false, "special": true })
        })
        .collect();
    let bos = json!({ "SpecialToken": { "id": "<s>", "type_id": 0 } });
    let seq = |id: &str| json!({ "Sequence": { "id": id, "type_id": 0 } });
    let tok = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added, "normalizer": null,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [bos, seq("A")],
            "pair": [bos, seq("A"), seq("B")],
            "special_tokens": { "<s>": { "id": "<s>", "ids": [1], "tokens": ["<s>"] } }
        },
        "decoder": decoder, "model": model
    });
    let cfg = json!({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "pad_token": "</s>", "padding_side": "left", "clean_up_tokenization_spaces": false
    });
    let io = |e: std::io::Error| Error::io("tokenizer", "cannot create", dir, e);
    std::fs::create_dir_all(dir).map_err(io)?;
    let pretty = |v: &Value| serde_json::to_string_pretty(v).unwrap_or_default();
    redco_pipeline::checkpoint::write_atomic(&dir.join("tokenizer.json"), pretty(&tok).as_bytes())?;
    redco_pipeline::checkpoint::write_atomic(&dir.join("tokenizer_config.json"), pretty(&cfg).as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hf::tokenizer::Tokenizer;

    fn tmp(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("redco-presets-{name}-{}", std::process::id()))
    }

    #[test]
    fn the_word_tokenizer_round_trips_the_corpus() {
        let s = SyntheticText::new(64, 12, 3);
        let d = tmp("words");
        s.write_tokenizer(&d).unwrap();
        let t = Tokenizer::from_dir(&d).unwrap();
        assert_eq!(t.vocab_size(), s.vocab());
        assert_eq!(t.encode(&s.text(5), true).unwrap(), s.ids(5));
        assert_eq!(t.decode(&s.ids(5), true).unwrap(), s.text(5));
        assert_eq!(t.eos_id(), Some(2));
    }

    #[test]
    fn the_byte_tokenizer_encodes_any_text() {
        let d = tmp("bytes");
        write_byte_tokenizer(&d).unwrap();
        let t = Tokenizer::from_dir(&d).unwrap();
        assert_eq!(t.vocab_size(), 259);
        let text = "Grüße, 世界! tabs\tand\nnewlines";
        let ids = t.encode(text, true).unwrap();
        assert_eq!(ids[0], 1);
        assert_eq!(ids.len(), 1 + text.len());
        assert!(ids[1..].iter().zip(text.bytes()).all(|(&i, b)| i == i64::from(b) + 3));
        assert_eq!(t.decode(&ids, true).unwrap(), text);
        assert!(config("llama-huge", 10).is_err());
    }
}
