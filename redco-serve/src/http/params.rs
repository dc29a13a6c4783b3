//! The request fields shared by completions and chat completions, read from the JSON body
//! with OpenAI's types and ranges (a wrong type or value is a 400 naming the field).

use super::error::ApiError;
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
fn guide(body: &Map<String, Value>) -> Result<Option<GuideSpec>, ApiError> {
    let mut found: Vec<(&str, GuideSpec)> = Vec::new();
    match body.get("response_format") {
        None | Some(Value::Null) => {}
        Some(Value::Object(rf)) => match rf.get("type").and_then(Value::as_str) {
            Some("text") => {}
            Some("json_object") => found.push(("response_format", GuideSpec::JsonSchema(json!({"type": "object"})))),
            Some("json_schema") => {
                let schema = rf.get("json_schema").and_then(|j| j.get("schema")).cloned().ok_or_else(|| {
                    ApiError::invalid("response_format", "`json_schema` response formats need `json_schema.schema`")
                })?;
                found.push(("response_format", GuideSpec::JsonSchema(schema)));
            }
            other => {
                return Err(ApiError::invalid(
                    "response_format",
                    format!("`response_format.type` must be text, json_object or json_schema, got {other:?}"),
                ))
            }
        },
        Some(other) => {
            return Err(ApiError::invalid(
                "response_format",
                format!("`response_format` must be an object, got {}", kind(other)),
            ))
        }
    }
    match body.get("guided_json") {
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
    match body.get("guided_regex") {
        None | Some(Value::Null) => {}
        Some(Value::String(r)) => found.push(("guided_regex", GuideSpec::Regex(r.clone()))),
        Some(other) => {
            return Err(ApiError::invalid(
                "guided_regex",
                format!("`guided_regex` must be a string, got {}", kind(other)),
            ))
        }
    }
    match body.get("guided_choice") {
        None | Some(Value::Null) => {}
        Some(Value::Array(a)) if !a.is_empty() => {
            let c = a
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| ApiError::invalid("guided_choice", "`guided_choice` must be an array of strings"))?;
            found.push(("guided_choice", GuideSpec::Choice(c)));
        }
        Some(_) => {
            return Err(ApiError::invalid("guided_choice", "`guided_choice` must be a non-empty array of strings"))
        }
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

fn number(body: &Map<String, Value>, key: &str) -> Result<Option<f64>, ApiError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_f64()
            .filter(|x| x.is_finite())
            .map(Some)
            .ok_or_else(|| ApiError::invalid(key, format!("`{key}` must be a finite number"))),
        Some(other) => Err(ApiError::invalid(key, format!("`{key}` must be a number, got {}", kind(other)))),
    }
}

fn integer(body: &Map<String, Value>, key: &str) -> Result<Option<i64>, ApiError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => {
            n.as_i64().map(Some).ok_or_else(|| ApiError::invalid(key, format!("`{key}` must be an integer, got {n}")))
        }
        Some(other) => Err(ApiError::invalid(key, format!("`{key}` must be an integer, got {}", kind(other)))),
    }
}

fn boolean(body: &Map<String, Value>, key: &str) -> Result<bool, ApiError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(ApiError::invalid(key, format!("`{key}` must be a boolean, got {}", kind(other)))),
    }
}

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

impl Params {
    /// Reads the fields of `body`; `default_max` when `max_tokens` is absent.
    pub fn read(body: &Map<String, Value>, default_max: usize) -> Result<Self, ApiError> {
        let max_tokens = match integer(body, "max_tokens")?.or(integer(body, "max_completion_tokens")?) {
            None => default_max,
            Some(m) if m < 1 => {
                return Err(ApiError::invalid("max_tokens", format!("`max_tokens` must be at least 1, got {m}")))
            }
            Some(m) => usize::try_from(m).unwrap_or(usize::MAX),
        };
        let temperature = number(body, "temperature")?.unwrap_or(1.0);
        if !(0.0..=2.0).contains(&temperature) {
            return Err(ApiError::invalid(
                "temperature",
                format!("`temperature` must be in [0, 2], got {temperature}"),
            ));
        }
        let top_p = number(body, "top_p")?;
        if let Some(p) = top_p.filter(|p| !(*p > 0.0 && *p <= 1.0)) {
            return Err(ApiError::invalid("top_p", format!("`top_p` must be in (0, 1], got {p}")));
        }
        let top_k = match integer(body, "top_k")? {
            None | Some(-1) | Some(0) => None,
            Some(k) if k < 0 => return Err(ApiError::invalid("top_k", format!("`top_k` must be positive, got {k}"))),
            Some(k) => Some(k as usize),
        };
        let seed = integer(body, "seed")?;
        let sampling = if temperature == 0.0 {
            Sampling::Greedy
        } else {
            Sampling::Sample { temperature, top_k, top_p, seed: seed.map_or_else(rand_seed, |s| s as u64) }
        };
        let stop = match body.get("stop") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::String(s)) => vec![s.clone()],
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect::<Option<Vec<_>>>()
                .ok_or_else(|| ApiError::invalid("stop", "`stop` must be a string or an array of strings"))?,
            Some(other) => {
                return Err(ApiError::invalid(
                    "stop",
                    format!("`stop` must be a string or an array, got {}", kind(other)),
                ))
            }
        };
        if stop.len() > MAX_STOP || stop.iter().any(String::is_empty) {
            return Err(ApiError::invalid("stop", format!("`stop` takes up to {MAX_STOP} non-empty strings")));
        }
        let stop_ids =
            match body.get("stop_token_ids") {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Array(a)) => a.iter().map(Value::as_i64).collect::<Option<Vec<_>>>().ok_or_else(|| {
                    ApiError::invalid("stop_token_ids", "`stop_token_ids` must be an array of integers")
                })?,
                Some(other) => {
                    return Err(ApiError::invalid(
                        "stop_token_ids",
                        format!("`stop_token_ids` must be an array, got {}", kind(other)),
                    ))
                }
            };
        let n = match integer(body, "n")? {
            None => 1,
            Some(n) if n < 1 || n as usize > MAX_N => {
                return Err(ApiError::invalid("n", format!("`n` must be in 1..={MAX_N}, got {n}")))
            }
            Some(n) => n as usize,
        };
        let top = integer(body, "top_logprobs")?;
        let in_range = |key: &str, n: i64| {
            if (0..=MAX_TOP_LOGPROBS as i64).contains(&n) {
                Ok(n as usize)
            } else {
                Err(ApiError::invalid(key, format!("`{key}` must be in 0..={MAX_TOP_LOGPROBS}, got {n}")))
            }
        };
        let logprobs = match body.get("logprobs") {
            None | Some(Value::Null) | Some(Value::Bool(false)) => None,
            // chat: a switch, the alternatives in `top_logprobs`
            Some(Value::Bool(true)) => Some(top.map_or(Ok(0), |n| in_range("top_logprobs", n))?),
            // completions: the number of alternatives
            Some(Value::Number(n)) => match n.as_i64() {
                Some(n) => Some(in_range("logprobs", n)?),
                None => return Err(ApiError::invalid("logprobs", format!("`logprobs` must be an integer, got {n}"))),
            },
            Some(other) => {
                return Err(ApiError::invalid(
                    "logprobs",
                    format!("`logprobs` must be a boolean or an integer, got {}", kind(other)),
                ))
            }
        };
        if let Some(bad) = stop_ids.iter().find(|&&t| t < 0) {
            return Err(ApiError::invalid("stop_token_ids", format!("token ids are not negative, got {bad}")));
        }
        // sampling adjustments this server does not make: refused rather than ignored
        for (key, neutral) in [("presence_penalty", 0.0), ("frequency_penalty", 0.0), ("repetition_penalty", 1.0)] {
            if let Some(v) = number(body, key)?.filter(|&v| v != neutral) {
                return Err(ApiError::invalid(key, format!("`{key}` is not supported by this server (got {v})")));
            }
        }
        match body.get("logit_bias") {
            None | Some(Value::Null) => {}
            Some(Value::Object(m)) if m.is_empty() => {}
            Some(Value::Object(_)) => {
                return Err(ApiError::invalid("logit_bias", "`logit_bias` is not supported by this server"))
            }
            Some(other) => {
                return Err(ApiError::invalid(
                    "logit_bias",
                    format!("`logit_bias` must be an object, got {}", kind(other)),
                ))
            }
        }
        let include_usage = match body.get("stream_options") {
            None | Some(Value::Null) => false,
            Some(Value::Object(o)) => boolean(o, "include_usage")?,
            Some(other) => {
                return Err(ApiError::invalid(
                    "stream_options",
                    format!("`stream_options` must be an object, got {}", kind(other)),
                ))
            }
        };
        if top.is_some() && body.get("logprobs") != Some(&Value::Bool(true)) {
            return Err(ApiError::invalid("top_logprobs", "`top_logprobs` needs `logprobs: true`"));
        }
        Ok(Params {
            max_tokens,
            sampling,
            stop,
            stop_ids,
            n,
            stream: boolean(body, "stream")?,
            echo: boolean(body, "echo")?,
            logprobs,
            include_usage,
            guide: guide(body)?,
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
