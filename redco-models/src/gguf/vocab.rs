//! SentencePiece vocabularies as GGUF stores them (`tokenizer.ggml.model = "llama"`:
//! tokens, scores and token types) and as `tokenizer.json` states them (a BPE model with
//! byte fallback and a `▁`-replacing normalizer, LLaMA's kind), converted both ways.
//!
//! The two tokenize alike. llama.cpp's SentencePiece tokenizer starts from characters and
//! repeatedly joins the adjacent pair whose join is the vocabulary piece of highest score
//! (the leftmost among equals); a BPE model applies its lowest-ranked merge first. So:
//!
//! - GGUF to JSON ([`hf_json_from_spm`]): every split of a piece into two pieces of the
//!   vocabulary is a merge, ranked by the joined piece's score, highest first (as
//!   transformers' `SentencePieceExtractor` derives LLaMA's `tokenizer.json`).
//! - JSON to GGUF ([`spm_from_hf_json`]): a piece's score is minus the rank of the first
//!   merge that makes it, so higher scores are the merges BPE applies first.

use redco_core::{Error, Result};
use serde_json::{json, Map, Value};
use std::collections::HashMap;

/// GGUF token types (`tokenizer.ggml.token_type`).
pub mod token_type {
    /// An ordinary piece.
    pub const NORMAL: i32 = 1;
    /// The unknown token.
    pub const UNKNOWN: i32 = 2;
    /// A control token (`<s>`, `</s>`).
    pub const CONTROL: i32 = 3;
    /// A piece added by the user.
    pub const USER_DEFINED: i32 = 4;
    /// A padding entry that no text maps to.
    pub const UNUSED: i32 = 5;
    /// A byte-fallback token `<0xNN>`.
    pub const BYTE: i32 = 6;
}

/// A SentencePiece vocabulary as GGUF stores it.
#[derive(Debug, Clone, PartialEq)]
pub struct SpmVocab {
    /// The pieces, by id.
    pub tokens: Vec<String>,
    /// Each piece's score.
    pub scores: Vec<f32>,
    /// Each piece's [`token_type`].
    pub types: Vec<i32>,
    /// The beginning-of-text token.
    pub bos: Option<u32>,
    /// The end-of-text token.
    pub eos: Option<u32>,
    /// The unknown token.
    pub unk: Option<u32>,
    /// Whether encoding starts with `bos`.
    pub add_bos: bool,
}

fn err(what: impl std::fmt::Display) -> Error {
    Error::invalid("tokenizer", what.to_string())
}

/// Whether `s` is a byte-fallback piece `<0xNN>`.
fn is_byte_piece(s: &str) -> bool {
    s.len() == 6 && s.starts_with("<0x") && s.ends_with('>') && u8::from_str_radix(&s[3..5], 16).is_ok()
}

/// The merges of a SentencePiece vocabulary: each split of an ordinary piece into two
/// pieces, ordered by the joined piece's score (highest first), then by the joined piece's
/// id, then by the two halves' ids.
fn merges_of(v: &SpmVocab) -> Vec<(u32, u32)> {
    let index: HashMap<&str, u32> = v.tokens.iter().enumerate().map(|(i, t)| (t.as_str(), i as u32)).collect();
    let ordinary = |id: usize| matches!(v.types[id], token_type::NORMAL | token_type::USER_DEFINED);
    let mut merges: Vec<(f32, u32, u32, u32)> = Vec::new();
    for (id, piece) in v.tokens.iter().enumerate() {
        if !ordinary(id) {
            continue;
        }
        for (at, _) in piece.char_indices().skip(1) {
            let (l, r) = piece.split_at(at);
            if let (Some(&a), Some(&b)) = (index.get(l), index.get(r)) {
                if ordinary(a as usize) && ordinary(b as usize) {
                    merges.push((v.scores[id], id as u32, a, b));
                }
            }
        }
    }
    merges.sort_by(|x, y| y.0.total_cmp(&x.0).then((x.1, x.2, x.3).cmp(&(y.1, y.2, y.3))));
    merges.into_iter().map(|(_, _, a, b)| (a, b)).collect()
}

/// The `tokenizer.json` that tokenizes as llama.cpp's SentencePiece tokenizer does with `v`
/// (LLaMA's layout: a `▁` prepended and spaces replaced by `▁`, BPE with byte fallback,
/// the control tokens as special added tokens, `bos` added when `add_bos`).
pub fn hf_json_from_spm(v: &SpmVocab) -> Result<Value> {
    let n = v.tokens.len();
    if v.scores.len() != n || v.types.len() != n {
        return Err(err(format!(
            "the vocabulary has {n} tokens but {} scores and {} types",
            v.scores.len(),
            v.types.len()
        )));
    }
    let mut vocab = Map::new();
    for (i, t) in v.tokens.iter().enumerate() {
        if vocab.insert(t.clone(), json!(i)).is_some() {
            return Err(err(format!("token `{t}` appears twice in the vocabulary")));
        }
    }
    let name = |id: Option<u32>| -> Result<Option<String>> {
        id.map(|i| {
            v.tokens.get(i as usize).cloned().ok_or_else(|| err(format!("special token id {i} is past the vocabulary")))
        })
        .transpose()
    };
    let (bos, unk) = (name(v.bos)?, name(v.unk)?);
    let added: Vec<Value> = (0..n)
        .filter(|&i| matches!(v.types[i], token_type::CONTROL | token_type::UNKNOWN))
        .map(|i| {
            json!({"id": i, "content": v.tokens[i], "single_word": false, "lstrip": false, "rstrip": false,
                   "normalized": false, "special": true})
        })
        .collect();
    let merges: Vec<Value> =
        merges_of(v).into_iter().map(|(a, b)| json!([v.tokens[a as usize], v.tokens[b as usize]])).collect();
    let post = match (&bos, v.add_bos) {
        (Some(b), true) => json!({
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": b, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": b, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": b, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {b: {"id": b, "ids": [v.bos], "tokens": [b]}}
        }),
        _ => Value::Null,
    };
    Ok(json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}
        ]},
        "pre_tokenizer": null,
        "post_processor": post,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}
        ]},
        "model": {"type": "BPE", "dropout": null, "unk_token": unk, "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                  "vocab": vocab, "merges": merges}
    }))
}

/// The `tokenizer_config.json` beside [`hf_json_from_spm`]'s file.
pub fn hf_config_from_spm(v: &SpmVocab) -> Value {
    let name = |id: Option<u32>| id.and_then(|i| v.tokens.get(i as usize)).map_or(Value::Null, |s| json!(s));
    json!({"tokenizer_class": "LlamaTokenizerFast", "bos_token": name(v.bos), "eos_token": name(v.eos),
           "unk_token": name(v.unk), "add_bos_token": v.add_bos, "add_eos_token": false,
           "clean_up_tokenization_spaces": false, "legacy": false})
}

/// The SentencePiece vocabulary of a GGUF file (`tokenizer.ggml.model = "llama"`); another
/// tokenizer model is an error naming it.
pub fn spm_from_gguf(g: &super::format::Gguf) -> Result<SpmVocab> {
    use super::format::Value as V;
    let model = g.get("tokenizer.ggml.model").and_then(V::as_str).unwrap_or("none");
    if model != "llama" {
        return Err(err(format!("GGUF tokenizer model `{model}` is not supported (`llama`, SentencePiece, is)")));
    }
    let array =
        |k: &str| g.get(k).and_then(V::as_array).ok_or_else(|| err(format!("the GGUF file has no array `{k}`")));
    let tokens = array("tokenizer.ggml.tokens")?
        .iter()
        .map(|t| t.as_str().map(str::to_string).ok_or_else(|| err("tokenizer.ggml.tokens holds a non-string")))
        .collect::<Result<Vec<_>>>()?;
    let scores = match g.get("tokenizer.ggml.scores") {
        Some(_) => array("tokenizer.ggml.scores")?.iter().map(|x| x.as_f64().unwrap_or(0.0) as f32).collect(),
        None => vec![0.0; tokens.len()],
    };
    let types = match g.get("tokenizer.ggml.token_type") {
        Some(_) => array("tokenizer.ggml.token_type")?
            .iter()
            .map(|x| x.as_u64().map_or(token_type::NORMAL, |t| t as i32))
            .collect(),
        None => vec![token_type::NORMAL; tokens.len()],
    };
    let id = |k: &str| g.get(k).and_then(V::as_u64).map(|x| x as u32);
    let add_bos = !matches!(g.get("tokenizer.ggml.add_bos_token"), Some(V::Bool(false)));
    Ok(SpmVocab {
        bos: id("tokenizer.ggml.bos_token_id"),
        eos: id("tokenizer.ggml.eos_token_id"),
        unk: id("tokenizer.ggml.unknown_token_id"),
        add_bos,
        tokens,
        scores,
        types,
    })
}

/// A merge as `tokenizer.json` writes it: `["a", "b"]` or the older `"a b"`.
fn merge_pair(m: &Value) -> Option<(String, String)> {
    match m {
        Value::Array(a) if a.len() == 2 => Some((a[0].as_str()?.to_string(), a[1].as_str()?.to_string())),
        Value::String(s) => s.split_once(' ').map(|(a, b)| (a.to_string(), b.to_string())),
        _ => None,
    }
}

/// The SentencePiece vocabulary of a LLaMA-style `tokenizer.json` (a BPE model, usually with
/// byte fallback, whose text reaches it with spaces as `▁`), for a GGUF file. `bos`/`eos` name the
/// special tokens (from `tokenizer_config.json`). A tokenizer of another kind (byte-level
/// BPE, WordPiece, word-level, ...) is an error saying so.
pub fn spm_from_hf_json(tok: &Value, bos: Option<&str>, eos: Option<&str>) -> Result<SpmVocab> {
    let model = &tok["model"];
    if model["type"].as_str() != Some("BPE") {
        return Err(err(format!(
            "only SentencePiece-style tokenizers (BPE over `▁`-marked text, as LLaMA's) convert to GGUF; this one is {}",
            model["type"].as_str().unwrap_or("of no known type")
        )));
    }
    // LLaMA's layout: spaces become `▁` in the normalizer (or a Metaspace pre-tokenizer);
    // a byte-level BPE (GPT-2's) maps bytes to printable characters instead
    let marks = |v: &Value| v.to_string().contains('▁');
    if !marks(&tok["normalizer"]) && !marks(&tok["pre_tokenizer"]) {
        return Err(err(format!(
            "only SentencePiece-style tokenizers (BPE over `▁`-marked text, as LLaMA's) convert to GGUF; this one's pre-tokenizer is {}",
            tok["pre_tokenizer"]["type"].as_str().unwrap_or("absent")
        )));
    }
    let mut tokens: Vec<Option<String>> = Vec::new();
    let mut put = |id: u64, s: &str| {
        let id = id as usize;
        if tokens.len() <= id {
            tokens.resize(id + 1, None);
        }
        tokens[id] = Some(s.to_string());
    };
    for (s, id) in model["vocab"].as_object().ok_or_else(|| err("tokenizer.json has no BPE vocabulary"))? {
        put(id.as_u64().ok_or_else(|| err(format!("token `{s}` has no id")))?, s);
    }
    let mut special = Vec::new();
    for a in tok["added_tokens"].as_array().into_iter().flatten() {
        if let (Some(id), Some(s)) = (a["id"].as_u64(), a["content"].as_str()) {
            put(id, s);
            if a["special"].as_bool() == Some(true) {
                special.push(id as usize);
            }
        }
    }
    let tokens: Vec<String> = tokens
        .into_iter()
        .enumerate()
        .map(|(i, t)| t.ok_or_else(|| err(format!("the vocabulary has no token of id {i}"))))
        .collect::<Result<_>>()?;
    let index: HashMap<&str, usize> = tokens.iter().enumerate().map(|(i, t)| (t.as_str(), i)).collect();
    let unk = model["unk_token"].as_str().and_then(|u| index.get(u).copied());
    let merges = model["merges"].as_array().ok_or_else(|| err("tokenizer.json has no BPE merges"))?;
    let mut rank: Vec<Option<usize>> = vec![None; tokens.len()];
    for (r, m) in merges.iter().enumerate() {
        let (a, b) = merge_pair(m).ok_or_else(|| err(format!("merge {r} is not a pair: {m}")))?;
        if let Some(&id) = index.get(format!("{a}{b}").as_str()) {
            rank[id].get_or_insert(r);
        }
    }
    let n_merges = merges.len();
    let scores = (0..tokens.len())
        .map(|i| match rank[i] {
            Some(r) => -(r as f32),
            // pieces no merge makes (characters, bytes, specials): below every merge
            None => -((n_merges + i) as f32),
        })
        .collect();
    let types = (0..tokens.len())
        .map(|i| {
            if Some(i) == unk {
                token_type::UNKNOWN
            } else if special.contains(&i) {
                token_type::CONTROL
            } else if is_byte_piece(&tokens[i]) {
                token_type::BYTE
            } else {
                token_type::NORMAL
            }
        })
        .collect();
    let id_of = |s: Option<&str>| s.and_then(|s| index.get(s)).map(|&i| i as u32);
    let add_bos = tok["post_processor"].to_string().contains("SpecialToken")
        && bos.is_some_and(|b| tok["post_processor"].to_string().contains(b));
    Ok(SpmVocab { bos: id_of(bos), eos: id_of(eos), unk: unk.map(|u| u as u32), add_bos, tokens, scores, types })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small SentencePiece vocabulary: unk, bos, eos, the 256 byte pieces, then characters
    /// and joined pieces with distinct scores.
    fn vocab() -> SpmVocab {
        let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
        let mut types = vec![token_type::UNKNOWN, token_type::CONTROL, token_type::CONTROL];
        for b in 0..=255u8 {
            tokens.push(format!("<0x{b:02X}>"));
            types.push(token_type::BYTE);
        }
        let pieces = [
            "▁", "a", "b", "c", "d", "é", "ab", "▁a", "▁ab", "cd", "bc", "abc", "▁abc", "da", "▁d", "dd", "▁dd", "aa",
            "▁b", "bb", "abcd", "▁c", "cc", "ba",
        ];
        for p in pieces {
            tokens.push(p.into());
            types.push(token_type::NORMAL);
        }
        // scores: a fixed scramble, all distinct
        let scores = (0..tokens.len()).map(|i| if i < 259 { 0.0 } else { -(((i * 7) % 31) as f32) - 1.0 }).collect();
        SpmVocab { tokens, scores, types, bos: Some(1), eos: Some(2), unk: Some(0), add_bos: true }
    }

    /// llama.cpp's SentencePiece algorithm: `▁` prepended, spaces as `▁`, characters joined
    /// pair by pair (the join of highest score first, the leftmost among equals), then
    /// characters outside the vocabulary as their UTF-8 bytes.
    fn reference(v: &SpmVocab, text: &str) -> Vec<u32> {
        let index: HashMap<&str, usize> = v.tokens.iter().enumerate().map(|(i, t)| (t.as_str(), i)).collect();
        let s = format!("▁{}", text.replace(' ', "▁"));
        let mut sym: Vec<String> = s.chars().map(String::from).collect();
        loop {
            let mut best: Option<(f32, usize)> = None;
            for i in 0..sym.len().saturating_sub(1) {
                if let Some(&id) = index.get(format!("{}{}", sym[i], sym[i + 1]).as_str()) {
                    if v.types[id] == token_type::NORMAL && best.is_none_or(|(sc, _)| v.scores[id] > sc) {
                        best = Some((v.scores[id], i));
                    }
                }
            }
            let Some((_, i)) = best else { break };
            let r = sym.remove(i + 1);
            sym[i].push_str(&r);
        }
        let mut out = vec![1];
        for s in sym {
            match index.get(s.as_str()) {
                Some(&id) => out.push(id as u32),
                None => out.extend(s.bytes().map(|b| index[format!("<0x{b:02X}>").as_str()] as u32)),
            }
        }
        out
    }

    fn tokenizer(j: &Value) -> tokenizers::Tokenizer {
        tokenizers::Tokenizer::from_bytes(j.to_string().as_bytes()).unwrap()
    }

    #[test]
    fn the_converted_json_tokenizes_as_sentencepiece() {
        let v = vocab();
        let t = tokenizer(&hf_json_from_spm(&v).unwrap());
        let alphabet = ['a', 'b', 'c', 'd', ' ', 'é', 'x', '€'];
        let mut state = 12345u64;
        for _ in 0..400 {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let len = 1 + (state >> 60) as usize;
            let text: String =
                (0..len).map(|k| alphabet[((state >> (k * 3 + 5)) % alphabet.len() as u64) as usize]).collect();
            let got = t.encode(text.as_str(), true).unwrap().get_ids().to_vec();
            assert_eq!(got, reference(&v, &text), "{text:?}");
            let back = t.decode(&got, true).unwrap();
            assert_eq!(back, text, "decoding {got:?}");
        }
    }

    #[test]
    fn json_to_spm_and_back_tokenizes_the_same() {
        let v = vocab();
        let j = hf_json_from_spm(&v).unwrap();
        let w = spm_from_hf_json(&j, Some("<s>"), Some("</s>")).unwrap();
        assert_eq!(w.tokens, v.tokens);
        assert_eq!(w.types, v.types);
        assert_eq!((w.bos, w.eos, w.unk, w.add_bos), (Some(1), Some(2), Some(0), true));
        // the scores differ, their order over merged pieces does not: the same tokens
        for text in ["abcd ab", "dda bc abc", "  a", "é€x", "ccba dd"] {
            assert_eq!(reference(&w, text), reference(&v, text), "{text:?}");
        }
        let j2 = hf_json_from_spm(&w).unwrap();
        assert_eq!(j2["model"]["merges"], j["model"]["merges"]);
    }

    #[test]
    fn other_tokenizer_kinds_are_refused_by_name() {
        let d = std::env::temp_dir().join(format!("redco-gguf-vocab-{}", std::process::id()));
        crate::presets::write_byte_tokenizer(&d).unwrap();
        let j: Value = serde_json::from_str(&std::fs::read_to_string(d.join("tokenizer.json")).unwrap()).unwrap();
        let e = spm_from_hf_json(&j, None, None).unwrap_err().to_string();
        assert!(e.contains("pre-tokenizer is ByteLevel"), "{e}");
        std::fs::remove_dir_all(d).ok();
    }
}
