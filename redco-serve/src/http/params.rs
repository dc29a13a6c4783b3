//! The generation fields shared by completions and chat completions: the typed request
//! ([`Generation`], serde-derived in `request.rs`) checked against OpenAI's ranges (a
//! wrong type or value is a 400 naming the field).

use super::error::ApiError;
use super::request::{self, Generation, Logprobs, ResponseFormat, Stop};
use crate::guide::GuideSpec;
use redco_models::generate::Sampling;
use serde_json::{json, Map, Value};

/// The generation fields of a request.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    /// `max_tokens` (default 16 for completions).
    pub max_tokens: usize,
    /// From `temperature` (0: greedy), `top_p`, `top_k`, `seed`.
    pub sampling: Sampling,
    /// `stop` as strings.
    pub stop: Vec<String>,
    /// `stop` as token ids (redco's extension: `stop_token_ids`).
    pub stop_ids: Vec<i64>,
    /// `n`: choices per prompt.
    pub n: usize,
    /// `stream`.
    pub stream: bool,
    /// `echo` (completions): the prompt before the completion.
    pub echo: bool,
    /// `logprobs` (completions: how many alternatives; chat: `true`, with `top_logprobs`
    /// alternatives): each token's log-probability and the most likely alternatives.
    pub logprobs: Option<usize>,
    /// `stream_options.include_usage`: a last streamed chunk with the usage.
    pub include_usage: bool,
    /// What the output must match: `response_format` (`json_object`, `json_schema`) or
    /// vLLM's `guided_json`, `guided_regex`, `guided_choice` (at most one of them).
    pub guide: Option<GuideSpec>,
}

/// The output constraint of a request's `response_format` and vLLM's `guided_*` fields.
fn guide(g: &Generation) -> Result<Option<GuideSpec>, ApiError> {
    let mut found: Vec<(&str, GuideSpec)> = Vec::new();
    match &g.response_format {
        None | Some(ResponseFormat::Text) => {}
        Some(ResponseFormat::JsonObject) => {
            found.push(("response_format", GuideSpec::JsonSchema(json!({"type": "object"}))))
        }
        Some(ResponseFormat::JsonSchema { json_schema }) => {
            found.push(("response_format", GuideSpec::JsonSchema(json_schema.schema.clone())))
        }
    }
    match &g.guided_json {
        None | Some(Value::Null) => {}
        // a schema, or a schema's JSON text
        Some(Value::String(s)) => {
            let v = serde_json::from_str(s)
                .map_err(|e| ApiError::invalid("guided_json", format!("`guided_json` is not JSON: {e}")))?;
            found.push(("guided_json", GuideSpec::JsonSchema(v)));
        }
        Some(v @ Value::Object(_)) => found.push(("guided_json", GuideSpec::JsonSchema(v.clone()))),
        Some(other) => {
            return Err(ApiError::invalid(
                "guided_json",
                format!("`guided_json` must be a schema, got {}", kind(other)),
            ))
        }
    }
    if let Some(r) = &g.guided_regex {
        found.push(("guided_regex", GuideSpec::Regex(r.clone())));
    }
    match &g.guided_choice {
        None => {}
        Some(c) if c.is_empty() => {
            return Err(ApiError::invalid("guided_choice", "`guided_choice` must be a non-empty array of strings"))
        }
        Some(c) => found.push(("guided_choice", GuideSpec::Choice(c.clone()))),
    }
    if found.len() > 1 {
        let names: Vec<&str> = found.iter().map(|f| f.0).collect();
        return Err(ApiError::invalid(names[1], format!("give one output constraint, not {}", names.join(" and "))));
    }
    Ok(found.pop().map(|f| f.1))
}

/// At most this many alternatives per token.
pub const MAX_TOP_LOGPROBS: usize = 20;

/// At most this many choices per request.
pub const MAX_N: usize = 16;
/// At most this many stop strings.
pub const MAX_STOP: usize = 4;

/// The JSON type of `v`, for messages.
pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The fields `Params` reads that one endpoint only takes (each declared again in that
/// endpoint's struct, `CompletionFields` or `ChatFields`, which decides whether it is taken).
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
struct OneEndpoint {
    echo: Option<bool>,
    top_logprobs: Option<i64>,
}

impl Params {
    /// Reads the fields of `body`; `default_max` when `max_tokens` is absent.
    pub fn read(body: &Map<String, Value>, default_max: usize) -> Result<Self, ApiError> {
        let g: Generation = request::read(body)?;
        let one: OneEndpoint = request::read(body)?;
        let max_tokens = match g.max_tokens.or(g.max_completion_tokens) {
            None => default_max,
            Some(m) if m < 1 => {
                return Err(ApiError::invalid("max_tokens", format!("`max_tokens` must be at least 1, got {m}")))
            }
            Some(m) => usize::try_from(m).unwrap_or(usize::MAX),
        };
        let temperature = g.temperature.unwrap_or(1.0);
        if !(0.0..=2.0).contains(&temperature) {
            return Err(ApiError::invalid(
                "temperature",
                format!("`temperature` must be in [0, 2], got {temperature}"),
            ));
        }
        if let Some(p) = g.top_p.filter(|p| !(*p > 0.0 && *p <= 1.0)) {
            return Err(ApiError::invalid("top_p", format!("`top_p` must be in (0, 1], got {p}")));
        }
        let top_k = match g.top_k {
            None | Some(-1) | Some(0) => None,
            Some(k) if k < 0 => return Err(ApiError::invalid("top_k", format!("`top_k` must be positive, got {k}"))),
            Some(k) => Some(k as usize),
        };
        let sampling = if temperature == 0.0 {
            Sampling::Greedy
        } else {
            Sampling::Sample { temperature, top_k, top_p: g.top_p, seed: g.seed.map_or_else(rand_seed, |s| s as u64) }
        };
        let stop = match &g.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(a)) => a.clone(),
        };
        if stop.len() > MAX_STOP || stop.iter().any(String::is_empty) {
            return Err(ApiError::invalid("stop", format!("`stop` takes up to {MAX_STOP} non-empty strings")));
        }
        let stop_ids = g.stop_token_ids.clone().unwrap_or_default();
        if let Some(bad) = stop_ids.iter().find(|&&t| t < 0) {
            return Err(ApiError::invalid("stop_token_ids", format!("token ids are not negative, got {bad}")));
        }
        let n = match g.n {
            None => 1,
            Some(n) if n < 1 || n as usize > MAX_N => {
                return Err(ApiError::invalid("n", format!("`n` must be in 1..={MAX_N}, got {n}")))
            }
            Some(n) => n as usize,
        };
        let in_range = |key: &str, n: i64| {
            if (0..=MAX_TOP_LOGPROBS as i64).contains(&n) {
                Ok(n as usize)
            } else {
                Err(ApiError::invalid(key, format!("`{key}` must be in 0..={MAX_TOP_LOGPROBS}, got {n}")))
            }
        };
        let logprobs = match g.logprobs {
            None | Some(Logprobs::Switch(false)) => None,
            // chat: a switch, the alternatives in `top_logprobs`
            Some(Logprobs::Switch(true)) => Some(one.top_logprobs.map_or(Ok(0), |n| in_range("top_logprobs", n))?),
            // completions: the number of alternatives
            Some(Logprobs::Count(n)) => Some(in_range("logprobs", n)?),
        };
        if one.top_logprobs.is_some() && g.logprobs != Some(Logprobs::Switch(true)) {
            return Err(ApiError::invalid("top_logprobs", "`top_logprobs` needs `logprobs: true`"));
        }
        // sampling adjustments this server does not make: refused rather than ignored
        for (key, v, neutral) in [
            ("presence_penalty", g.presence_penalty, 0.0),
            ("frequency_penalty", g.frequency_penalty, 0.0),
            ("repetition_penalty", g.repetition_penalty, 1.0),
        ] {
            if let Some(v) = v.filter(|&v| v != neutral) {
                return Err(ApiError::invalid(key, format!("`{key}` is not supported by this server (got {v})")));
            }
        }
        if g.logit_bias.as_ref().is_some_and(|m| !m.is_empty()) {
            return Err(ApiError::invalid("logit_bias", "`logit_bias` is not supported by this server"));
        }
        Ok(Params {
            max_tokens,
            sampling,
            stop,
            stop_ids,
            n,
            stream: g.stream.unwrap_or(false),
            echo: one.echo.unwrap_or(false),
            logprobs,
            include_usage: g.stream_options.as_ref().and_then(|o| o.include_usage).unwrap_or(false),
            guide: guide(&g)?,
        })
    }
}

/// A seed for a request that gave none.
fn rand_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64));
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read(v: Value) -> Result<Params, ApiError> {
        Params::read(v.as_object().unwrap(), 16)
    }

    #[test]
    fn fields_are_read_with_openai_s_types_and_ranges() {
        let p = read(json!({"max_tokens": 5, "temperature": 0, "stop": "\n", "n": 2, "stream": true})).unwrap();
        assert_eq!((p.max_tokens, p.n, p.stream, p.echo), (5, 2, true, false));
        assert_eq!((p.sampling, p.stop), (Sampling::Greedy, vec!["\n".to_string()]));
        let p = read(json!({"temperature": 0.7, "top_p": 0.9, "top_k": 5, "seed": 3})).unwrap();
        assert_eq!(p.sampling, Sampling::Sample { temperature: 0.7, top_k: Some(5), top_p: Some(0.9), seed: 3 });
        assert_eq!((p.max_tokens, p.logprobs), (16, None));
        assert_eq!(read(json!({"logprobs": 3})).unwrap().logprobs, Some(3));
        assert_eq!(read(json!({"logprobs": true, "top_logprobs": 2})).unwrap().logprobs, Some(2));
        assert_eq!(read(json!({"logprobs": true})).unwrap().logprobs, Some(0));
        for (body, param) in [
            (json!({"max_tokens": -1}), "max_tokens"),
            (json!({"max_tokens": "5"}), "max_tokens"),
            (json!({"max_tokens": 1.5}), "max_tokens"),
            (json!({"temperature": 3}), "temperature"),
            (json!({"temperature": "hot"}), "temperature"),
            (json!({"top_p": 0}), "top_p"),
            (json!({"stop": 5}), "stop"),
            (json!({"stop": ["a", 1]}), "stop"),
            (json!({"stop": ["a", "b", "c", "d", "e"]}), "stop"),
            (json!({"n": 0}), "n"),
            (json!({"n": 1000}), "n"),
            (json!({"stream": "yes"}), "stream"),
            (json!({"logprobs": 21}), "logprobs"),
            (json!({"logprobs": "yes"}), "logprobs"),
            (json!({"logprobs": true, "top_logprobs": 50}), "top_logprobs"),
            (json!({"top_logprobs": 2}), "top_logprobs"),
            (json!({"stop_token_ids": [1, "x"]}), "stop_token_ids"),
        ] {
            let e = read(body.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {e:?}");
            assert_eq!(e.status.as_u16(), 400);
        }
    }
}
