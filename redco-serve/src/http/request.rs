//! The request bodies, stated as serde types: the generation fields both endpoints share
//! ([`Generation`]) and each endpoint's own ([`CompletionFields`], [`ChatFields`]). Their
//! field names are the fields the endpoint implements ([`fields_of`]); every other field is
//! refused in one place ([`super::fields::check`]). A value of the wrong JSON type is a 400
//! naming the field by its path (`serde_path_to_error`); ranges and the fields that take
//! several shapes are checked where they are read (`Params::read`, `prompts`, `messages`,
//! `Tools::read`).

use super::error::ApiError;
use serde::de::{self, DeserializeOwned, Deserializer, Visitor};
use serde_json::{Map, Value};
use std::cell::Cell;

/// The generation fields of both endpoints (OpenAI's, with vLLM's `guided_*` and
/// `top_k`, `repetition_penalty`, `stop_token_ids`). Absent and `null` read as `None`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
pub struct Generation {
    /// The model name (any: the server serves one model).
    pub model: Option<String>,
    /// The most new tokens per choice.
    pub max_tokens: Option<i64>,
    /// Chat's newer name for `max_tokens`.
    pub max_completion_tokens: Option<i64>,
    /// 0 draws greedily; in [0, 2].
    pub temperature: Option<f64>,
    /// Nucleus sampling, in (0, 1].
    pub top_p: Option<f64>,
    /// The k most likely tokens only (-1 or 0: all).
    pub top_k: Option<i64>,
    /// The sampler's seed.
    pub seed: Option<i64>,
    /// Strings that end a choice.
    pub stop: Option<Stop>,
    /// Token ids that end a choice.
    pub stop_token_ids: Option<Vec<i64>>,
    /// Choices per prompt.
    pub n: Option<i64>,
    /// Server-sent events.
    pub stream: Option<bool>,
    /// What a stream ends with.
    pub stream_options: Option<StreamOptions>,
    /// Completions: how many alternatives per token; chat: a switch (`top_logprobs` counts).
    pub logprobs: Option<Logprobs>,
    /// Refused unless 0.
    pub presence_penalty: Option<f64>,
    /// Refused unless 0.
    pub frequency_penalty: Option<f64>,
    /// Refused unless 1.
    pub repetition_penalty: Option<f64>,
    /// Refused unless empty.
    pub logit_bias: Option<Map<String, Value>>,
    /// `text`, `json_object` or `json_schema`.
    pub response_format: Option<ResponseFormat>,
    /// vLLM's: a JSON schema, or its text.
    pub guided_json: Option<Value>,
    /// vLLM's: a regular expression the output matches.
    pub guided_regex: Option<String>,
    /// vLLM's: the output is one of these strings.
    pub guided_choice: Option<Vec<String>>,
}

/// `stop`: one string or several.
#[derive(Debug, serde::Deserialize)]
#[serde(untagged, expecting = "a string or an array of strings")]
pub enum Stop {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// `logprobs`: chat's switch or completions' count.
#[derive(Debug, Clone, Copy, PartialEq, serde::Deserialize)]
#[serde(untagged, expecting = "a boolean or an integer")]
pub enum Logprobs {
    /// Chat: on or off.
    Switch(bool),
    /// Completions: how many alternatives.
    Count(i64),
}

/// `stream_options`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
pub struct StreamOptions {
    /// A last chunk with the usage.
    pub include_usage: Option<bool>,
}

/// `response_format`, by its `type`.
#[derive(Debug, serde::Deserialize)]
#[serde(
    tag = "type",
    rename_all = "snake_case",
    expecting = "an object whose `type` is text, json_object or json_schema"
)]
pub enum ResponseFormat {
    /// Free text.
    Text,
    /// Any JSON object.
    JsonObject,
    /// JSON matching `json_schema.schema`.
    JsonSchema {
        /// The schema with its name.
        json_schema: JsonSchema,
    },
}

/// `response_format.json_schema`.
#[derive(Debug, serde::Deserialize)]
pub struct JsonSchema {
    /// The schema.
    pub schema: Value,
}

/// The fields only `/v1/completions` takes.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
pub struct CompletionFields {
    /// A string, strings, token ids, or arrays of token ids (checked by `prompts`).
    pub prompt: Option<Value>,
    /// The prompt before the completion.
    pub echo: Option<bool>,
}

/// The fields only `/v1/chat/completions` takes.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(default)]
pub struct ChatFields {
    /// The conversation (checked by `messages`).
    pub messages: Option<Value>,
    /// Alternatives per token when `logprobs` is true.
    pub top_logprobs: Option<i64>,
    /// Functions the model may call (read by `Tools::read`).
    pub tools: Option<Value>,
    /// `none`, `auto`, `required` or a named function.
    pub tool_choice: Option<Value>,
    /// Whether several calls may come in one answer.
    pub parallel_tool_calls: Option<bool>,
}

/// Reads `T` from `body`; a value of the wrong type is a 400 whose `param` is the request
/// field and whose message names the value's whole path (`stream_options.include_usage`).
pub fn read<T: DeserializeOwned>(body: &Map<String, Value>) -> Result<T, ApiError> {
    // a `Value` to deserialize from: the body is small beside what a generation costs
    let v = Value::Object(body.clone());
    serde_path_to_error::deserialize(&v).map_err(|e| {
        let field = match e.path().iter().next() {
            Some(serde_path_to_error::Segment::Map { key }) => key.clone(),
            _ => "body".to_string(),
        };
        ApiError::invalid(&field, format!("`{}`: {}", e.path(), e.inner()))
    })
}

/// The field names of the request struct `T`, as its derive states them.
pub fn fields_of<T: DeserializeOwned>() -> &'static [&'static str] {
    let seen = Cell::new(None);
    let _ = T::deserialize(FieldProbe(&seen));
    seen.get().unwrap_or(&[])
}

/// A deserializer that records the field names a struct asks for, and nothing else.
struct FieldProbe<'a>(&'a Cell<Option<&'static [&'static str]>>);

#[derive(Debug)]
struct Probed;

impl std::fmt::Display for Probed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("field names probed")
    }
}

impl std::error::Error for Probed {}

impl de::Error for Probed {
    fn custom<M: std::fmt::Display>(_: M) -> Self {
        Probed
    }
}

impl<'de> Deserializer<'de> for FieldProbe<'_> {
    type Error = Probed;
    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Probed> {
        Err(Probed)
    }
    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Probed> {
        self.0.set(Some(fields));
        Err(Probed)
    }
    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
        unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_endpoint_s_fields_are_its_struct_s() {
        assert_eq!(fields_of::<CompletionFields>(), ["prompt", "echo"]);
        assert_eq!(
            fields_of::<ChatFields>(),
            ["messages", "top_logprobs", "tools", "tool_choice", "parallel_tool_calls"]
        );
        let g = fields_of::<Generation>();
        assert_eq!(g.len(), 21);
        assert!(g.contains(&"guided_choice") && g.contains(&"max_completion_tokens"), "{g:?}");
    }

    #[test]
    fn a_wrong_type_is_a_400_naming_its_path() {
        let read_g = |v: Value| read::<Generation>(v.as_object().unwrap());
        let g = read_g(json!({"max_tokens": 3, "stop": ["a"], "logprobs": true, "stop_token_ids": null})).unwrap();
        assert_eq!((g.max_tokens, g.logprobs, g.stop_token_ids), (Some(3), Some(Logprobs::Switch(true)), None));
        for (body, param) in [
            (json!({"max_tokens": "5"}), "max_tokens"),
            (json!({"stream_options": {"include_usage": "x"}}), "stream_options"),
            (json!({"stop": 5}), "stop"),
            (json!({"response_format": {"type": "yaml"}}), "response_format"),
            (json!({"guided_choice": ["a", 1]}), "guided_choice"),
        ] {
            let e = read_g(body.clone()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(param), "{body}: {e:?}");
            assert!(e.message.contains(param), "{}", e.message);
            assert_eq!(e.status.as_u16(), 400);
        }
        // the message names the whole path
        let e = read_g(json!({"stream_options": {"include_usage": "x"}})).unwrap_err();
        assert!(e.message.contains("`stream_options.include_usage`"), "{}", e.message);
        let e = read_g(json!({"guided_choice": ["a", 1]})).unwrap_err();
        assert!(e.message.contains("`guided_choice[1]`"), "{}", e.message);
    }
}
