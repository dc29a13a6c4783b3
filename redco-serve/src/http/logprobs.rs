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
    let all: Vec<(i64, Option<&Logprob>)> = entries.iter().map(|(id, lp)| (*id, Some(lp))).collect();
    scored(tok, &all, offset)
}

/// Completions' `logprobs` with `echo`: the prompt's tokens first (`prompt`, its first
/// token without a log-probability: `null`, as OpenAI's and vLLM's answers have it; the
/// others from `prompt_lps`, from its second token on), then the completion's `entries`;
/// offsets from the choice's text's start.
pub fn echoed(tok: &Tokenizer, prompt: &[i64], prompt_lps: &[(i64, Logprob)], entries: &[(i64, Logprob)]) -> Value {
    let mut all: Vec<(i64, Option<&Logprob>)> = Vec::with_capacity(prompt.len() + entries.len());
    for (k, &id) in prompt.iter().enumerate() {
        // prompt_lps[k - 1] scores prompt token k
        let lp = k.checked_sub(1).and_then(|j| prompt_lps.get(j)).filter(|(t, _)| *t == id).map(|(_, l)| l);
        all.push((id, lp));
    }
    all.extend(entries.iter().map(|(id, lp)| (*id, Some(lp))));
    scored(tok, &all, 0)
}

/// The four lists of completions' `logprobs` over `entries` (`None`: `null`).
fn scored(tok: &Tokenizer, entries: &[(i64, Option<&Logprob>)], offset: usize) -> Value {
    let mut at = offset;
    let (mut tokens, mut lps, mut tops, mut offsets) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (id, lp) in entries {
        let t = text(tok, *id);
        offsets.push(at);
        at += t.len();
        tokens.push(t);
        lps.push(lp.map_or(Value::Null, |l| json!(l.logprob)));
        tops.push(lp.map_or(Value::Null, |l| {
            Value::Object(l.top.iter().map(|(i, v)| (text(tok, *i), json!(v))).collect::<Map<String, Value>>())
        }));
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
