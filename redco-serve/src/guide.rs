//! Constrained decoding (structured output): a request's grammar ([`GuideSpec`]: a JSON
//! schema, any JSON object, a regular expression or a choice of strings) compiled by
//! llguidance over the model's vocabulary ([`Guides`], built once per model from its
//! `tokenizer.json`), and each step's token mask ([`Constraint`]): the tokens the grammar
//! allows next, every other one's logit set to minus infinity before the draw. Whatever the
//! weights, the text is one the grammar accepts; the grammar's end lets only the
//! end-of-sequence token through. JSON comes compact (no whitespace between its tokens);
//! a schema's own `x-guidance` options take precedence.

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, SimpleVob, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;
use std::path::Path;
use std::sync::Arc;

/// What a request's output must match.
#[derive(Debug, Clone, PartialEq)]
pub enum GuideSpec {
    /// A JSON value valid against this JSON schema (`{"type": "object"}` for any object).
    JsonSchema(Value),
    /// Text matching this regular expression, whole.
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
}

impl GuideSpec {
    /// The grammar llguidance compiles.
    fn grammar(&self) -> TopLevelGrammar {
        match self {
            // compact JSON: no whitespace between tokens (with whitespace allowed anywhere,
            // weights that favour a space could pad an object for ever)
            GuideSpec::JsonSchema(s) => {
                let mut s = s.clone();
                if let Some(o) = s.as_object_mut().filter(|o| !o.contains_key("x-guidance")) {
                    o.insert("x-guidance".into(), serde_json::json!({"whitespace_flexible": false}));
                }
                TopLevelGrammar::from_json_schema(s)
            }
            GuideSpec::Regex(r) => TopLevelGrammar::from_regex(r),
            // a Lark rule of string literals (JSON's string syntax is Lark's)
            GuideSpec::Choice(c) => {
                let alts: Vec<String> = c.iter().map(|s| Value::String(s.clone()).to_string()).collect();
                TopLevelGrammar::from_lark(format!("start: {}", alts.join(" | ")))
            }
        }
    }

    /// The spec as one JSON value (for the lockstep commands of tensor-parallel ranks).
    pub fn to_json(&self) -> Value {
        match self {
            GuideSpec::JsonSchema(s) => serde_json::json!({"json_schema": s}),
            GuideSpec::Regex(r) => serde_json::json!({"regex": r}),
            GuideSpec::Choice(c) => serde_json::json!({"choice": c}),
        }
    }

    /// Reads [`GuideSpec::to_json`]'s value.
    pub fn from_json(v: &Value) -> Option<GuideSpec> {
        if let Some(s) = v.get("json_schema") {
            return Some(GuideSpec::JsonSchema(s.clone()));
        }
        if let Some(r) = v.get("regex").and_then(Value::as_str) {
            return Some(GuideSpec::Regex(r.to_string()));
        }
        let c = v.get("choice")?.as_array()?;
        Some(GuideSpec::Choice(c.iter().map(|s| s.as_str().map(str::to_string)).collect::<Option<_>>()?))
    }
}

/// A model's vocabulary as llguidance reads it, and the parser factory over it: built once,
/// shared by every request (and every rank).
pub struct Guides {
    factory: ParserFactory,
}

impl std::fmt::Debug for Guides {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Guides")
    }
}

impl Guides {
    /// From `dir/tokenizer.json` for a model of `vocab` logits whose generation ends at the
    /// `eos` tokens (the first is the one the grammar's end allows; rows past the
    /// tokenizer's vocabulary are never allowed).
    pub fn from_dir(dir: &Path, vocab: usize, eos: &[i64]) -> Result<Guides, String> {
        let path = dir.join("tokenizer.json");
        let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let json: Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut words = llguidance::token_bytes_from_tokenizer_json(&json)
            .map_err(|e| format!("{}: llguidance cannot read its vocabulary: {e}", path.display()))?;
        if words.len() > vocab {
            return Err(format!("{}: {} tokens, more than the model's {vocab} logits", path.display(), words.len()));
        }
        // the model's rows without a token: special tokens nothing can produce
        while words.len() < vocab {
            let mut w = format!(".<[{}]>", words.len()).into_bytes();
            w[0] = TokTrie::SPECIAL_TOKEN_MARKER;
            words.push(w);
        }
        let ends: Vec<u32> = eos.iter().filter(|&&e| e >= 0 && (e as usize) < vocab).map(|&e| e as u32).collect();
        let Some(&first) = ends.first() else {
            return Err("the model has no end-of-sequence token: constrained output could never end".into());
        };
        let info = TokRxInfo::new(vocab as u32, first);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(&ends);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| format!("llguidance: {e}"))?;
        factory.quiet();
        Ok(Guides { factory })
    }

    /// A fresh constraint for `spec`; an error that says what is wrong with the grammar.
    pub fn constraint(&self, spec: &GuideSpec) -> Result<Constraint, String> {
        let parser = self.factory.create_parser(spec.grammar()).map_err(|e| e.to_string())?;
        let m = Matcher::new(Ok(parser));
        if let Some(e) = m.get_error() {
            return Err(e);
        }
        Ok(Constraint { matcher: m, mask: None })
    }
}

/// One request's grammar state: the mask of its next token, then the token it took.
pub struct Constraint {
    matcher: Matcher,
    mask: Option<SimpleVob>,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Constraint")
    }
}

impl Constraint {
    /// Computes the next token's mask (llguidance's work; run while the forward pass runs).
    pub fn prepare(&mut self) -> Result<(), String> {
        self.mask = Some(self.matcher.compute_mask_or_eos().map_err(|e| e.to_string())?);
        Ok(())
    }

    /// Sets the logit of every token the grammar does not allow next to minus infinity
    /// (computing the mask first if [`Constraint::prepare`] did not); an error when it
    /// allows none.
    pub fn apply(&mut self, logits: &mut [f32]) -> Result<(), String> {
        let mask = match self.mask.take() {
            Some(m) => m,
            None => self.matcher.compute_mask_or_eos().map_err(|e| e.to_string())?,
        };
        if mask.is_zero() {
            return Err("the grammar allows no token here".into());
        }
        for (i, l) in logits.iter_mut().enumerate() {
            if !mask.is_allowed(i as u32) {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    /// Advances past the chosen `token`.
    pub fn consume(&mut self, token: i64) -> Result<(), String> {
        self.matcher.consume_token(token as u32).map_err(|e| e.to_string())
    }

    /// True once the grammar can take nothing more.
    pub fn is_stopped(&self) -> bool {
        self.matcher.is_stopped()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model directory with a byte-level tokenizer (every byte a token) and `</s>` = 2.
    fn guides() -> Guides {
        let dir = std::env::temp_dir().join(format!("redco-guide-{}", std::process::id()));
        redco_models::presets::write_byte_tokenizer(&dir).unwrap();
        let tok = redco_models::hf::tokenizer::Tokenizer::from_dir(&dir).unwrap();
        Guides::from_dir(&dir, tok.vocab_size() + 5, &[2]).unwrap()
    }

    /// Drives `c` with a "model" of random logits (seeded): whatever it prefers, what comes
    /// out is what the grammar allows.
    fn run(c: &mut Constraint, vocab: usize, dir_tok: &redco_models::hf::tokenizer::Tokenizer) -> String {
        let mut ids = Vec::new();
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..2000 {
            let mut logits: Vec<f32> = (0..vocab)
                .map(|_| {
                    state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    (state >> 40) as f32 / (1u64 << 24) as f32
                })
                .collect();
            c.apply(&mut logits).unwrap();
            let t = logits.iter().enumerate().max_by(|a, b| a.1.total_cmp(b.1)).unwrap().0 as i64;
            if t == 2 {
                break;
            }
            c.consume(t).unwrap();
            ids.push(t);
        }
        dir_tok.decode(&ids, true).unwrap()
    }

    #[test]
    fn masks_keep_any_preference_inside_the_grammar() {
        let g = guides();
        let dir = std::env::temp_dir().join(format!("redco-guide-{}", std::process::id()));
        let tok = redco_models::hf::tokenizer::Tokenizer::from_dir(&dir).unwrap();
        let vocab = tok.vocab_size() + 5;
        let schema = serde_json::json!({"type": "object", "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}},
            "required": ["n", "ok"], "additionalProperties": false});
        let text = run(&mut g.constraint(&GuideSpec::JsonSchema(schema)).unwrap(), vocab, &tok);
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert!(v["n"].is_i64() && v["ok"].is_boolean(), "{v}");
        let text = run(&mut g.constraint(&GuideSpec::Regex("[a-c]{2,4}x".into())).unwrap(), vocab, &tok);
        assert!(
            text.len() >= 3 && text.ends_with('x') && text[..text.len() - 1].chars().all(|c| "abc".contains(c)),
            "{text}"
        );
        let choice = GuideSpec::Choice(vec!["yes".into(), "no".into(), "maybe so".into()]);
        let text = run(&mut g.constraint(&choice).unwrap(), vocab, &tok);
        assert!(["yes", "no", "maybe so"].contains(&text.as_str()), "{text}");
        // a bad grammar is an error, not a panic
        assert!(g.constraint(&GuideSpec::Regex("(".into())).is_err());
        assert!(g.constraint(&GuideSpec::JsonSchema(serde_json::json!({"type": 5}))).is_err());
        // the spec travels as JSON
        for s in [choice, GuideSpec::Regex("a+".into()), GuideSpec::JsonSchema(serde_json::json!({"type": "object"}))] {
            assert_eq!(GuideSpec::from_json(&s.to_json()), Some(s));
        }
    }
}
