//! The tokenizers of the other fixtures against transformers (`tokenizer_expected.json`, written by
//! `gen_fixtures.py`), one test per fixture: GPT-2's byte-level BPE (gptj-tiny: nothing added;
//! opt-tiny, opt-350m-shape: `</s>` first), T5's Unigram with Metaspace (t5-tiny, t5-v1_1-tiny:
//! `</s>` last, right padding, clean-up of spaces on decode). Checked: the special ids (and that
//! they are those of the model's `config.json`), ids with and without special tokens, decodes with
//! and without them, the batch padded on the tokenizer's side (ids and mask). Every mismatch is
//! listed, not only the first.

use redco_models::hf::tokenizer::{PaddingSide, Tokenizer};
use serde_json::Value;
use std::path::PathBuf;

fn dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures").join(name)
}

fn read_json(name: &str, file: &str) -> Value {
    let text = std::fs::read_to_string(dir(name).join(file)).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn i64s(v: &Value) -> Vec<i64> {
    v.as_array().unwrap().iter().map(|x| x.as_i64().unwrap()).collect()
}

fn i64s_2d(v: &Value) -> Vec<i64> {
    v.as_array().unwrap().iter().flat_map(|r| r.as_array().unwrap().iter().map(|x| x.as_i64().unwrap())).collect()
}

fn opt_id(v: &Value) -> Option<i64> {
    v.as_i64()
}

/// Collects the mismatches of one fixture and panics with all of them at the end.
struct Check {
    name: &'static str,
    failures: Vec<String>,
}

impl Check {
    fn eq<T: PartialEq + std::fmt::Debug>(&mut self, what: String, got: T, expected: T) {
        if got != expected {
            self.failures.push(format!("{what}: expected {expected:?}, got {got:?}"));
        }
    }

    fn finish(self) {
        assert!(
            self.failures.is_empty(),
            "{}: {} mismatch(es)\n{}",
            self.name,
            self.failures.len(),
            self.failures.join("\n")
        );
    }
}

fn check_fixture(name: &'static str, padding_side: PaddingSide) {
    let tok = Tokenizer::from_dir(dir(name)).unwrap();
    let e = read_json(name, "tokenizer_expected.json");
    let mut c = Check { name, failures: Vec::new() };

    // special tokens and padding side, as transformers reads them
    c.eq("len(tokenizer)".into(), tok.vocab_size() as u64, e["vocab_size"].as_u64().unwrap());
    c.eq("bos id".into(), tok.bos_id(), opt_id(&e["bos_id"]));
    c.eq("eos id".into(), tok.eos_id(), opt_id(&e["eos_id"]));
    c.eq("pad id".into(), tok.pad_id(), opt_id(&e["pad_id"]));
    c.eq("unk id".into(), tok.unk_id(), opt_id(&e["unk_id"]));
    c.eq("padding side".into(), tok.padding_side(), PaddingSide::parse(e["padding_side"].as_str().unwrap()).unwrap());
    c.eq("padding side (fixture design)".into(), tok.padding_side(), padding_side);
    c.eq("padding id".into(), tok.padding_id(), tok.pad_id().unwrap());

    // ... and the model's: every id fits the embedding, the ids config.json names are the tokenizer's
    let cfg = read_json(name, "config.json");
    let vocab = cfg["vocab_size"].as_u64().unwrap();
    assert!(tok.vocab_size() as u64 <= vocab, "{name}: {} tokens for a vocab of {vocab}", tok.vocab_size());
    for (key, got) in [("bos_token_id", tok.bos_id()), ("eos_token_id", tok.eos_id()), ("pad_token_id", tok.pad_id())] {
        if let Some(id) = opt_id(&cfg[key]) {
            c.eq(format!("config.json {key}"), got, Some(id));
        }
    }

    let cases = e["texts"].as_array().unwrap();
    assert!(cases.len() >= 3, "{name}: {} texts", cases.len());
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let ids = tok.encode(text, true).unwrap();
        c.eq(format!("ids of {text:?}"), ids.clone(), i64s(&case["input_ids"]));
        c.eq(
            format!("ids without special tokens of {text:?}"),
            tok.encode(text, false).unwrap(),
            i64s(&case["input_ids_no_special"]),
        );
        // decode transformers' ids, so that a decode mismatch shows even where the ids differ
        let ids = i64s(&case["input_ids"]);
        c.eq(
            format!("decode(skip_special_tokens=True) of {text:?} = {ids:?}"),
            tok.decode(&ids, true).unwrap(),
            case["decode_skip_special"].as_str().unwrap().to_string(),
        );
        c.eq(
            format!("decode(skip_special_tokens=False) of {text:?} = {ids:?}"),
            tok.decode(&ids, false).unwrap(),
            case["decode_with_special"].as_str().unwrap().to_string(),
        );
    }

    let b = &e["batch"];
    let texts: Vec<&str> = b["texts"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    let got = tok.encode_batch(&texts, true).unwrap();
    let rows = b["input_ids"].as_array().unwrap();
    c.eq(format!("batch shape of {texts:?}"), (got.batch, got.seq), (rows.len(), rows[0].as_array().unwrap().len()));
    c.eq(format!("batch ids of {texts:?}"), got.ids, i64s_2d(&b["input_ids"]));
    c.eq(format!("batch mask of {texts:?}"), got.mask, i64s_2d(&b["attention_mask"]));
    c.finish();
}

#[test]
fn gptj_tiny_tokenizer_matches_transformers() {
    check_fixture("gptj-tiny", PaddingSide::Left);
}

#[test]
fn opt_tiny_tokenizer_matches_transformers() {
    check_fixture("opt-tiny", PaddingSide::Left);
}

#[test]
fn opt_350m_shape_tokenizer_matches_transformers() {
    check_fixture("opt-350m-shape", PaddingSide::Left);
}

#[test]
fn t5_tiny_tokenizer_matches_transformers() {
    check_fixture("t5-tiny", PaddingSide::Right);
}

#[test]
fn t5_v1_1_tiny_tokenizer_matches_transformers() {
    check_fixture("t5-v1_1-tiny", PaddingSide::Right);
}
