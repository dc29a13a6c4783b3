//! The llama-tiny tokenizer against transformers (`tokenizer_expected.json`, written by
//! `gen_fixtures.py`): ids with and without special tokens, decodes with and without them,
//! a left-padded batch; and the errors of a missing or corrupt tokenizer.

use redco_models::hf::tokenizer::{PaddingSide, Tokenizer};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/llama-tiny")
}

fn expected() -> Value {
    let text = std::fs::read_to_string(dir().join("tokenizer_expected.json")).unwrap();
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

#[test]
fn tokenizer_special_tokens_match_transformers() {
    let tok = Tokenizer::from_dir(dir()).unwrap();
    let e = expected();
    assert_eq!(tok.vocab_size() as u64, e["vocab_size"].as_u64().unwrap());
    assert_eq!(tok.bos_id(), opt_id(&e["bos_id"]));
    assert_eq!(tok.eos_id(), opt_id(&e["eos_id"]));
    assert_eq!(tok.pad_id(), opt_id(&e["pad_id"]));
    assert_eq!(tok.unk_id(), opt_id(&e["unk_id"]));
    assert_eq!(e["padding_side"], "left");
    assert_eq!(tok.padding_side(), PaddingSide::Left);
    assert_eq!(tok.token_to_id("<s>"), Some(1));
    assert_eq!(tok.token_to_id("no such token"), None);
}

#[test]
fn tokenizer_encode_decode_match_transformers() {
    let tok = Tokenizer::from_dir(dir()).unwrap();
    let e = expected();
    let cases = e["texts"].as_array().unwrap();
    assert!(cases.len() >= 3);
    for c in cases {
        let text = c["text"].as_str().unwrap();
        let ids = tok.encode(text, true).unwrap();
        assert_eq!(ids, i64s(&c["input_ids"]), "ids of {text:?}");
        assert_eq!(tok.encode(text, false).unwrap(), i64s(&c["input_ids_no_special"]), "ids of {text:?}");
        assert_eq!(tok.decode(&ids, true).unwrap(), c["decode_skip_special"].as_str().unwrap(), "{text:?}");
        assert_eq!(tok.decode(&ids, false).unwrap(), c["decode_with_special"].as_str().unwrap(), "{text:?}");
    }
}

#[test]
fn tokenizer_left_padded_batch_matches_transformers() {
    let tok = Tokenizer::from_dir(dir()).unwrap();
    let b = &expected()["batch"];
    let texts: Vec<&str> = b["texts"].as_array().unwrap().iter().map(|t| t.as_str().unwrap()).collect();
    let got = tok.encode_batch(&texts, true).unwrap();
    let rows = b["input_ids"].as_array().unwrap();
    assert_eq!((got.batch, got.seq), (rows.len(), rows[0].as_array().unwrap().len()));
    assert_eq!(got.ids, i64s_2d(&b["input_ids"]));
    assert_eq!(got.mask, i64s_2d(&b["attention_mask"]));
    // the same batch padded on the right: rows keep their tokens, padding moves to the end
    let right = tok.clone().with_padding_side(PaddingSide::Right).encode_batch(&texts, true).unwrap();
    for r in 0..got.batch {
        let row = |v: &[i64]| v[r * got.seq..(r + 1) * got.seq].to_vec();
        let n = row(&got.mask).iter().filter(|m| **m == 0).count();
        assert_eq!(row(&right.ids)[..got.seq - n], row(&got.ids)[n..]);
        assert!(row(&right.mask)[got.seq - n..].iter().all(|m| *m == 0));
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("redco-tokenizer-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn error_of(r: redco_core::Result<Tokenizer>) -> String {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn tokenizer_missing_dir_or_file_is_an_error_naming_it() {
    let missing = dir().join("no-such-dir");
    let msg = error_of(Tokenizer::from_dir(&missing));
    assert!(msg.contains("no-such-dir"), "{msg}");

    let empty = temp_dir("empty");
    let msg = error_of(Tokenizer::from_dir(&empty));
    assert!(msg.contains(&empty.join("tokenizer.json").display().to_string()), "{msg}");
    let msg = error_of(Tokenizer::from_file(empty.join("tokenizer.json")));
    assert!(msg.contains("tokenizer.json"), "{msg}");
    std::fs::remove_dir_all(&empty).unwrap();
}

#[test]
fn tokenizer_corrupt_files_are_errors_naming_them() {
    let d = temp_dir("corrupt");
    let file = |n: &str| d.join(n).display().to_string();
    let write = |n: &str, s: &str| std::fs::write(Path::new(&d).join(n), s).unwrap();

    write("tokenizer.json", "\u{0}\u{1} this is not JSON {");
    let msg = error_of(Tokenizer::from_dir(&d));
    assert!(msg.contains(&file("tokenizer.json")), "{msg}");
    write("tokenizer.json", r#"{"version": "1.0", "model": {"type": "BPE", "vocab": 3}}"#);
    let msg = error_of(Tokenizer::from_file(d.join("tokenizer.json")));
    assert!(msg.contains(&file("tokenizer.json")), "{msg}");

    // a valid tokenizer.json with a bad config next to it
    std::fs::copy(dir().join("tokenizer.json"), d.join("tokenizer.json")).unwrap();
    write("tokenizer_config.json", "not json");
    let msg = error_of(Tokenizer::from_dir(&d));
    assert!(msg.contains(&file("tokenizer_config.json")), "{msg}");
    write("tokenizer_config.json", r#"{"padding_side": "middle"}"#);
    let msg = error_of(Tokenizer::from_dir(&d));
    assert!(msg.contains(&file("tokenizer_config.json")) && msg.contains("middle"), "{msg}");

    // tokenizer.json alone: no named special tokens, right padding with id 0
    std::fs::remove_file(d.join("tokenizer_config.json")).unwrap();
    let tok = Tokenizer::from_dir(&d).unwrap();
    assert_eq!((tok.bos_id(), tok.eos_id(), tok.pad_id()), (None, None, None));
    assert_eq!(tok.padding_side(), PaddingSide::Right);
    let b = tok.encode_batch(&["the cat", "a"], true).unwrap();
    assert_eq!((b.batch, b.seq), (2, 3));
    assert_eq!((b.ids[5], b.mask[5], b.mask[4]), (0, 0, 1));
    std::fs::remove_dir_all(&d).unwrap();
}
