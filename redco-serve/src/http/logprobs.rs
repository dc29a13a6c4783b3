//! Log-probabilities in OpenAI's two shapes: completions' (`tokens`, `token_logprobs`,
//! `top_logprobs`, `text_offset`) and chat's (`content`: per token its text, log-probability,
//! bytes and top alternatives).

use crate::engine::Logprob;
use redco_models::hf::tokenizer::Tokenizer;
use serde_json::{json, Map, Value};

/// One token as text (special tokens included: the client sees what was chosen).
fn text(tok: &Tokenizer, id: i64) -> String {
    tok.decode(&[id], false).unwrap_or_default()
}

/// Completions' `logprobs` of `entries`, whose text starts at `offset` in the choice's text.
pub fn completion(tok: &Tokenizer, entries: &[(i64, Logprob)], offset: usize) -> Value {
    let mut at = offset;
    let (mut tokens, mut lps, mut tops, mut offsets) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (id, lp) in entries {
        let t = text(tok, *id);
        offsets.push(at);
        at += t.len();
        tokens.push(t);
        lps.push(lp.logprob);
        let top: Map<String, Value> = lp.top.iter().map(|(i, l)| (text(tok, *i), json!(l))).collect();
        tops.push(Value::Object(top));
    }
    json!({"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets})
}

/// Chat's `logprobs` of `entries`.
pub fn chat(tok: &Tokenizer, entries: &[(i64, Logprob)]) -> Value {
    let one = |id: i64, l: f32| {
        let t = text(tok, id);
        json!({"token": t, "logprob": l, "bytes": t.as_bytes()})
    };
    let content: Vec<Value> = entries
        .iter()
        .map(|(id, lp)| {
            let mut v = one(*id, lp.logprob);
            v["top_logprobs"] = Value::Array(lp.top.iter().map(|(i, l)| one(*i, *l)).collect());
            v
        })
        .collect();
    json!({"content": content})
}
