//! Property-based hostile inputs: generated `config.json` texts, safetensors files and
//! sharded indexes, tokenizer files, checkpoint manifests and JSONL files are read by the
//! library's readers, which must answer with a value or an error, never a panic, an abort
//! or a runaway allocation.
//!
//! Each property runs `PROPTEST_CASES` cases (default 256 here, so CI stays short; `cargo
//! xtask fuzz` runs 100,000 per target).

use proptest::prelude::*;
use redco_models::hf::config::HfConfig;
use redco_models::hf::safetensors::{files, read_all};
use redco_models::hf::tokenizer::Tokenizer;
use redco_pipeline::checkpoint::Manifest;
use redco_pipeline::data::{Dataset, JsonlDataset};
use serde_json::{json, Value};
use std::path::PathBuf;

fn scratch(tag: &str, case: u64) -> PathBuf {
    let d = std::env::temp_dir().join(format!("redco-hostile-{tag}-{}-{case}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Any JSON value a hostile config might hold in a field.
fn any_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (0u64..100_000).prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        "[a-z0-9_ ]{0,12}".prop_map(Value::from),
        Just(json!([1, 2])),
        Just(json!({"type": "yarn", "factor": 8})),
    ]
}

const FIELDS: &[&str] = &[
    "model_type",
    "hidden_size",
    "num_attention_heads",
    "num_key_value_heads",
    "num_hidden_layers",
    "intermediate_size",
    "vocab_size",
    "head_dim",
    "max_position_embeddings",
    "rms_norm_eps",
    "rope_theta",
    "rope_scaling",
    "tie_word_embeddings",
    "hidden_act",
    "eos_token_id",
    "rotary_dim",
];

fn base_config() -> Value {
    json!({
        "model_type": "llama", "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 2, "intermediate_size": 64, "vocab_size": 100, "max_position_embeddings": 64,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "eos_token_id": 2
    })
}

proptest! {
    /// A config with up to six fields replaced by arbitrary values parses or is refused; a
    /// parsed one describes sizes within the reader's limits, whose parameter shapes can be
    /// listed without overflow.
    #[test]
    fn config_json_never_panics(edits in prop::collection::vec((0..FIELDS.len(), any_value()), 0..6)) {
        let mut c = base_config();
        for (f, v) in edits {
            c[FIELDS[f]] = v;
        }
        if let Ok(cfg) = HfConfig::from_json(&c.to_string()) {
            prop_assert!(cfg.layers <= 10_000 && cfg.hidden <= 1 << 17 && cfg.vocab <= 1 << 24);
            let _ = cfg.param_shapes();
        }
    }

    /// Text that is not even JSON: an error.
    #[test]
    fn config_text_never_panics(text in "\\PC{0,200}") {
        let _ = HfConfig::from_json(&text);
    }

    /// A safetensors file with a random header length and bytes, or a valid file with bytes
    /// flipped or cut, is read or refused.
    #[test]
    fn safetensors_files_never_panic(
        case in any::<u64>(),
        header_len in prop_oneof![Just(None), any::<u64>().prop_map(Some), (0u64..512).prop_map(Some)],
        body in prop::collection::vec(any::<u8>(), 0..600),
        flips in prop::collection::vec((any::<usize>(), any::<u8>()), 0..4),
        cut in prop::option::of(any::<usize>()),
    ) {
        let d = scratch("st", case);
        let p = d.join("model.safetensors");
        let mut bytes = match header_len {
            Some(n) => {
                let mut b = n.to_le_bytes().to_vec();
                b.extend(&body);
                b
            }
            None => {
                let data: Vec<u8> = (0..64u8).collect();
                let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![4, 4], &data).unwrap();
                safetensors::serialize([("w", view)], &None).unwrap()
            }
        };
        mangle(&mut bytes, &flips, cut);
        std::fs::write(&p, &bytes).unwrap();
        let _ = read_all(&p);
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A checkpoint manifest with mangled fields is parsed or refused, and verifying a file
    /// against whatever parsed never panics.
    #[test]
    fn manifests_never_panic(
        case in any::<u64>(),
        step in any_value(),
        files in any_value(),
        text in prop::option::of("\\PC{0,80}"),
    ) {
        let d = scratch("manifest", case);
        let m = match text {
            Some(t) => t,
            None => json!({"step": step, "mesh": "1x1", "params": {}, "files": {"rank-0.safetensors": files}}).to_string(),
        };
        std::fs::write(d.join("manifest.json"), m).unwrap();
        std::fs::write(d.join("rank-0.safetensors"), b"not a checkpoint").unwrap();
        if let Ok(man) = Manifest::read(&d) {
            let _ = man.verify_file(&d, "rank-0.safetensors");
            let _ = man.verify(&d, "rank-0.safetensors", b"bytes");
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A JSONL file of arbitrary lines is indexed, and every record read or refused.
    #[test]
    fn jsonl_never_panics(case in any::<u64>(), lines in prop::collection::vec("\\PC{0,40}", 0..12)) {
        let d = scratch("jsonl", case);
        let p = d.join("data.jsonl");
        std::fs::write(&p, lines.join("\n")).unwrap();
        if let Ok(data) = JsonlDataset::open(&p) {
            for i in 0..data.len() {
                let _ = data.get(i);
            }
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A sharded index naming arbitrary files (paths out of the directory, absolute paths,
    /// non-strings) for arbitrary tensors is listed or refused.
    #[test]
    fn sharded_indexes_never_panic(
        case in any::<u64>(),
        entries in prop::collection::vec(("[a-z.]{0,12}", prop_oneof![
            any_value(),
            "(\\.\\./|/|[a-z]{1,4}/){0,3}[a-z\\-]{0,10}(\\.safetensors)?".prop_map(Value::from),
        ]), 0..6),
        text in prop::option::of("\\PC{0,80}"),
    ) {
        let d = scratch("index", case);
        let body = match text {
            Some(t) => t,
            None => json!({"weight_map": entries.into_iter().collect::<serde_json::Map<_, _>>()}).to_string(),
        };
        std::fs::write(d.join("model.safetensors.index.json"), body).unwrap();
        std::fs::write(d.join("a.safetensors"), b"x").unwrap();
        if let Ok(list) = files(&d) {
            for f in list {
                prop_assert!(f.starts_with(&d), "{} is outside {}", f.display(), d.display());
            }
        }
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A tokenizer.json with fields replaced, bytes flipped or the text cut is loaded or
    /// refused; a loaded one encodes arbitrary text and decodes arbitrary ids without a panic.
    #[test]
    fn tokenizer_files_never_panic(
        case in any::<u64>(),
        edits in prop::collection::vec((0..TOKENIZER_FIELDS.len(), any_value()), 0..3),
        flips in prop::collection::vec((any::<usize>(), any::<u8>()), 0..3),
        cut in prop::option::of(any::<usize>()),
        text in "\\PC{0,60}",
        ids in prop::collection::vec(prop_oneof![3 => any::<u32>().prop_map(i64::from), 1 => any::<i64>()], 0..8),
    ) {
        let d = scratch("tok", case);
        let mut v: Value = serde_json::from_str(tokenizer_json()).unwrap();
        for (f, x) in edits {
            let path: Vec<&str> = TOKENIZER_FIELDS[f].split('/').collect();
            let mut at = Some(&mut v);
            for p in &path[..path.len() - 1] {
                at = at.and_then(|a| a.get_mut(*p)).filter(|a| a.is_object());
            }
            if let Some(obj) = at.and_then(Value::as_object_mut) {
                obj.insert(path[path.len() - 1].to_string(), x);
            }
        }
        let mut bytes = v.to_string().into_bytes();
        mangle(&mut bytes, &flips, cut);
        std::fs::write(d.join("tokenizer.json"), &bytes).unwrap();
        if let Ok(tok) = Tokenizer::from_file(d.join("tokenizer.json")) {
            let _ = tok.encode(&text, true);
            let _ = tok.decode(&ids, true);
            let _ = tok.encode_batch(&[text.as_str(), "a b"], true);
        }
        let _ = std::fs::remove_dir_all(&d);
    }
}

/// Flips bytes of `bytes` (`(position, mask)`, positions wrapped) and cuts it (at a wrapped
/// length).
fn mangle(bytes: &mut Vec<u8>, flips: &[(usize, u8)], cut: Option<usize>) {
    for &(at, x) in flips {
        if !bytes.is_empty() {
            let i = at % bytes.len();
            bytes[i] ^= x;
        }
    }
    if let Some(c) = cut {
        bytes.truncate(c % (bytes.len() + 1));
    }
}

/// Fields of a BPE tokenizer.json the tokenizer property replaces (`/` separates levels).
const TOKENIZER_FIELDS: &[&str] = &[
    "model/type",
    "model/vocab",
    "model/merges",
    "model/unk_token",
    "model/byte_fallback",
    "added_tokens",
    "normalizer",
    "pre_tokenizer",
    "post_processor",
    "decoder",
    "truncation",
    "padding",
];

/// The committed llama-tiny tokenizer (read once).
fn tokenizer_json() -> &'static str {
    static TEXT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TEXT.get_or_init(|| {
        let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/llama-tiny/tokenizer.json");
        std::fs::read_to_string(p).unwrap()
    })
}
