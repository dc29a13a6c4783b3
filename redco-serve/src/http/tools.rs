//! Tool calling, as OpenAI's chat API and vLLM define it: a request's `tools` (functions
//! with JSON-schema parameters) and `tool_choice` ([`Tools::read`]); the chat template
//! rendered with the tools, as transformers' `apply_chat_template(tools=...)` does; with
//! `tool_choice` `required` or a named function, the answer constrained to a JSON array of
//! calls whose arguments are valid against their function's schema ([`Tools::forced_schema`],
//! vLLM's way); with `auto`, the calls parsed from the text in the format the model writes
//! ([`Parser`]: Hermes/Qwen `<tool_call>`, Llama 3.1 JSON, Mistral `[TOOL_CALLS]`).

use super::error::ApiError;
use super::params::kind;
use serde_json::{json, Map, Value};

/// `tool_choice`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// No call: the tools are shown to the model, the answer is text.
    None,
    /// The model decides; calls are parsed from what it writes.
    Auto,
    /// At least one call, of any of the tools.
    Required,
    /// One call of this function.
    Named(String),
}

/// A request's tools.
#[derive(Debug, Clone, PartialEq)]
pub struct Tools {
    /// The tools as the request gave them (what the chat template renders).
    pub list: Vec<Value>,
    /// Each function's name and parameters schema.
    pub functions: Vec<(String, Value)>,
    /// `tool_choice`.
    pub choice: ToolChoice,
    /// `parallel_tool_calls` (default true): several calls in one answer; false, one.
    pub parallel: bool,
}

/// One call the model made.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    /// The function's name.
    pub name: String,
    /// Its arguments, as JSON text.
    pub arguments: String,
}

impl Tools {
    /// Reads `tools` and `tool_choice` (`None`: the request has no tools); a 400 naming the
    /// field for anything malformed, a named function that is not among the tools, or a
    /// choice that needs tools without any.
    pub fn read(body: &Map<String, Value>) -> Result<Option<Tools>, ApiError> {
        let list = match body.get("tools") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(a)) => a.clone(),
            Some(other) => {
                return Err(ApiError::invalid("tools", format!("`tools` must be an array, got {}", kind(other))))
            }
        };
        let mut functions = Vec::new();
        for (i, t) in list.iter().enumerate() {
            let at = format!("tools[{i}]");
            if t.get("type").and_then(Value::as_str) != Some("function") {
                return Err(ApiError::invalid(&at, format!("`{at}.type` must be \"function\"")));
            }
            let f = t
                .get("function")
                .and_then(Value::as_object)
                .ok_or_else(|| ApiError::invalid(&at, format!("`{at}.function` must be an object with a `name`")))?;
            let name = f.get("name").and_then(Value::as_str).unwrap_or("");
            let ok = !name.is_empty()
                && name.len() <= 64
                && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if !ok {
                return Err(ApiError::invalid(
                    &at,
                    format!("`{at}.function.name` must be 1 to 64 letters, digits, `_` or `-`, got {name:?}"),
                ));
            }
            let params = match f.get("parameters") {
                None | Some(Value::Null) => json!({"type": "object", "properties": {}}),
                Some(p @ Value::Object(_)) => p.clone(),
                Some(other) => {
                    return Err(ApiError::invalid(
                        &at,
                        format!("`{at}.function.parameters` must be a JSON schema object, got {}", kind(other)),
                    ))
                }
            };
            if functions.iter().any(|(n, _)| n == name) {
                return Err(ApiError::invalid(&at, format!("two tools are named `{name}`")));
            }
            functions.push((name.to_string(), params));
        }
        let choice = match body.get("tool_choice") {
            None | Some(Value::Null) => {
                if list.is_empty() {
                    ToolChoice::None
                } else {
                    ToolChoice::Auto
                }
            }
            Some(Value::String(s)) => match s.as_str() {
                "none" => ToolChoice::None,
                "auto" => ToolChoice::Auto,
                "required" => ToolChoice::Required,
                other => {
                    return Err(ApiError::invalid(
                        "tool_choice",
                        format!("`tool_choice` must be none, auto, required or a function, got {other:?}"),
                    ))
                }
            },
            Some(v @ Value::Object(_)) => {
                let name = v.get("function").and_then(|f| f.get("name")).and_then(Value::as_str).ok_or_else(|| {
                    ApiError::invalid(
                        "tool_choice",
                        "a named `tool_choice` is {\"type\": \"function\", \"function\": {\"name\": ...}}",
                    )
                })?;
                if !functions.iter().any(|(n, _)| n == name) {
                    return Err(ApiError::invalid(
                        "tool_choice",
                        format!("`tool_choice` names `{name}`, not among the tools"),
                    ));
                }
                ToolChoice::Named(name.to_string())
            }
            Some(other) => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!("`tool_choice` must be a string or an object, got {}", kind(other)),
                ))
            }
        };
        if list.is_empty() {
            if choice != ToolChoice::None {
                return Err(ApiError::invalid(
                    "tool_choice",
                    "`tool_choice` asks for a call, but the request has no `tools`",
                ));
            }
            return Ok(None);
        }
        let parallel = match body.get("parallel_tool_calls") {
            None | Some(Value::Null) => true,
            Some(Value::Bool(b)) => *b,
            Some(other) => {
                return Err(ApiError::invalid(
                    "parallel_tool_calls",
                    format!("`parallel_tool_calls` must be a boolean, got {}", kind(other)),
                ))
            }
        };
        Ok(Some(Tools { list, functions, choice, parallel }))
    }

    /// With `required` or a named function: the schema the answer is constrained to, a
    /// JSON array of calls (one for a named function or without `parallel_tool_calls`, at
    /// least one otherwise: as many as `max_tokens` leaves room for), each
    /// `{"name": ..., "arguments": {...}}` with the arguments valid against the function's
    /// parameters. `None` for `none` and `auto`.
    pub fn forced_schema(&self) -> Option<Value> {
        let call = |name: &str, params: &Value| {
            json!({"type": "object", "properties": {"name": {"const": name}, "arguments": params},
                "required": ["name", "arguments"], "additionalProperties": false})
        };
        match &self.choice {
            ToolChoice::None | ToolChoice::Auto => None,
            ToolChoice::Named(n) => {
                let params = &self.functions.iter().find(|(f, _)| f == n)?.1;
                Some(json!({"type": "array", "items": call(n, params), "minItems": 1, "maxItems": 1}))
            }
            ToolChoice::Required => {
                let any: Vec<Value> = self.functions.iter().map(|(n, p)| call(n, p)).collect();
                let mut s = json!({"type": "array", "items": {"anyOf": any}, "minItems": 1});
                if !self.parallel {
                    s["maxItems"] = json!(1);
                }
                Some(s)
            }
        }
    }
}

/// The calls of an answer constrained by [`Tools::forced_schema`].
pub fn forced_calls(text: &str) -> Result<Vec<Call>, String> {
    let v: Value = serde_json::from_str(text).map_err(|e| format!("the constrained answer is not JSON: {e}"))?;
    let a = v.as_array().ok_or("the constrained answer is not an array")?;
    a.iter().map(call_of).collect::<Option<Vec<_>>>().ok_or_else(|| "a call without a name or arguments".to_string())
}

/// `{"name": ..., "arguments" | "parameters": {...}}` as a call.
fn call_of(v: &Value) -> Option<Call> {
    let name = v.get("name")?.as_str()?.to_string();
    let args = v.get("arguments").or_else(|| v.get("parameters")).cloned().unwrap_or_else(|| json!({}));
    // arguments given as JSON text stay that text
    let arguments = match args {
        Value::String(s) => s,
        other => other.to_string(),
    };
    Some(Call { name, arguments })
}

/// How a model writes its tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parser {
    /// Hermes / Qwen: `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, one per call.
    Hermes,
    /// Llama 3.1: the answer is `{"name": ..., "parameters": {...}}` (after an optional
    /// `<|python_tag|>`), calls separated by `;`.
    Llama3Json,
    /// Mistral: `[TOOL_CALLS]` then a JSON array of `{"name": ..., "arguments": {...}}`.
    Mistral,
}

impl Parser {
    /// The names `--tool-call-parser` takes (vLLM's).
    pub const NAMES: [&'static str; 3] = ["hermes", "llama3_json", "mistral"];

    /// The parser named `name`.
    pub fn from_name(name: &str) -> Result<Parser, String> {
        match name {
            "hermes" => Ok(Parser::Hermes),
            "llama3_json" => Ok(Parser::Llama3Json),
            "mistral" => Ok(Parser::Mistral),
            other => Err(format!("unknown tool-call parser `{other}` (available: {})", Parser::NAMES.join(", "))),
        }
    }

    /// The format a chat template teaches its model, read from its text.
    pub fn detect(template: &str) -> Option<Parser> {
        if template.contains("<tool_call>") {
            Some(Parser::Hermes)
        } else if template.contains("[TOOL_CALLS]") {
            Some(Parser::Mistral)
        } else if template.contains("<|python_tag|>") || template.contains("<|eom_id|>") {
            Some(Parser::Llama3Json)
        } else {
            None
        }
    }

    /// The calls in `text` and the text before them (`None` when there is none); no call:
    /// the whole text, as it is, is the content.
    pub fn parse(self, text: &str) -> (Option<String>, Vec<Call>) {
        let (content, calls) = self.calls(text);
        if calls.is_empty() {
            return (Some(text.to_string()), calls);
        }
        (content, calls)
    }

    fn calls(self, text: &str) -> (Option<String>, Vec<Call>) {
        let keep = |s: &str| Some(s.trim().to_string()).filter(|s| !s.is_empty());
        match self {
            Parser::Hermes => {
                let Some(first) = text.find("<tool_call>") else { return (keep(text), Vec::new()) };
                let mut calls = Vec::new();
                let mut rest = &text[first..];
                while let Some(start) = rest.find("<tool_call>") {
                    let body = &rest[start + "<tool_call>".len()..];
                    let (inner, after) = match body.find("</tool_call>") {
                        Some(end) => (&body[..end], &body[end + "</tool_call>".len()..]),
                        None => (body, ""),
                    };
                    match serde_json::from_str::<Value>(inner.trim()).ok().as_ref().and_then(call_of) {
                        Some(c) => calls.push(c),
                        // not a call after all: the text stays text
                        None => return (keep(text), Vec::new()),
                    }
                    rest = after;
                }
                (keep(&text[..first]), calls)
            }
            Parser::Mistral => {
                let (before, body) = match text.find("[TOOL_CALLS]") {
                    Some(at) => (&text[..at], &text[at + "[TOOL_CALLS]".len()..]),
                    // the marker is a special token, which decoding may leave out
                    None if text.trim_start().starts_with("[{") => ("", text),
                    None => return (keep(text), Vec::new()),
                };
                let calls = serde_json::from_str::<Value>(body.trim())
                    .ok()
                    .and_then(|v| v.as_array()?.iter().map(call_of).collect::<Option<Vec<_>>>());
                match calls {
                    Some(c) if !c.is_empty() => (keep(before), c),
                    _ => (keep(text), Vec::new()),
                }
            }
            Parser::Llama3Json => {
                let body = text.trim().trim_start_matches("<|python_tag|>").trim();
                if !body.starts_with('{') {
                    return (keep(text), Vec::new());
                }
                let calls = body
                    .split(';')
                    .map(|part| serde_json::from_str::<Value>(part.trim()).ok().as_ref().and_then(call_of))
                    .collect::<Option<Vec<_>>>();
                match calls {
                    Some(c) if !c.is_empty() => (None, c),
                    _ => (keep(text), Vec::new()),
                }
            }
        }
    }
}

/// `message.tool_calls` (and each stream delta's, with `index`) for `calls`; each call
/// gets an id of its own.
pub fn tool_calls_json(calls: &[Call], with_index: bool) -> Value {
    let ids = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    Value::Array(
        calls
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let mut v = json!({"id": format!("call_{:x}{i}", ids & 0xffff_ffff_ffff), "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments}});
                if with_index {
                    v["index"] = json!(i);
                }
                v
            })
            .collect(),
    )
}

/// The messages as a chat template expects them: an assistant's `tool_calls` arguments
/// given as JSON text (as OpenAI clients send them) made objects, as transformers'
/// templates read them.
pub fn template_messages(messages: &Value) -> Value {
    let mut m = messages.clone();
    for msg in m.as_array_mut().into_iter().flatten() {
        for call in msg.get_mut("tool_calls").and_then(Value::as_array_mut).into_iter().flatten() {
            if let Some(f) = call.get_mut("function") {
                if let Some(Value::String(s)) = f.get("arguments") {
                    if let Ok(v) = serde_json::from_str::<Value>(s) {
                        f["arguments"] = v;
                    }
                }
            }
        }
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools(choice: Value) -> Result<Option<Tools>, ApiError> {
        let body = json!({"tools": [
            {"type": "function", "function": {"name": "get_weather", "description": "Weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
            {"type": "function", "function": {"name": "now"}}],
            "tool_choice": choice});
        Tools::read(body.as_object().unwrap())
    }

    #[test]
    fn tools_and_choices_are_read_and_bad_ones_named() {
        let t = tools(Value::Null).unwrap().unwrap();
        assert_eq!((t.choice.clone(), t.functions.len()), (ToolChoice::Auto, 2));
        assert_eq!(t.functions[1].1, json!({"type": "object", "properties": {}}), "no parameters: none");
        assert_eq!(tools(json!("required")).unwrap().unwrap().choice, ToolChoice::Required);
        let named = tools(json!({"type": "function", "function": {"name": "now"}})).unwrap().unwrap();
        assert_eq!(named.choice, ToolChoice::Named("now".into()));
        let s = named.forced_schema().unwrap();
        assert_eq!((s["minItems"].clone(), s["maxItems"].clone()), (json!(1), json!(1)));
        assert!(tools(json!("none")).unwrap().unwrap().forced_schema().is_none());
        for (choice, param) in [
            (json!("sometimes"), "tool_choice"),
            (json!({"type": "function", "function": {"name": "fly"}}), "tool_choice"),
            (json!(5), "tool_choice"),
        ] {
            assert_eq!(tools(choice).unwrap_err().param.as_deref(), Some(param));
        }
        let bad = json!({"tools": [{"type": "function", "function": {"name": "has space"}}]});
        assert_eq!(Tools::read(bad.as_object().unwrap()).unwrap_err().param.as_deref(), Some("tools[0]"));
        let none = json!({"tool_choice": "required"});
        assert_eq!(Tools::read(none.as_object().unwrap()).unwrap_err().param.as_deref(), Some("tool_choice"));
        assert_eq!(Tools::read(json!({}).as_object().unwrap()).unwrap(), None);
    }

    #[test]
    fn calls_are_parsed_in_each_model_s_format() {
        let hermes = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>";
        let (content, calls) = Parser::Hermes.parse(hermes);
        assert_eq!(content.as_deref(), Some("Let me check."));
        assert_eq!(
            calls,
            vec![
                Call { name: "get_weather".into(), arguments: r#"{"city":"Paris"}"#.into() },
                Call { name: "now".into(), arguments: "{}".into() }
            ]
        );
        let (c, calls) = Parser::Hermes.parse("no call here");
        assert_eq!((c.as_deref(), calls.len()), (Some("no call here"), 0));
        let (c, calls) = Parser::Hermes.parse("<tool_call>not json</tool_call>");
        assert_eq!(
            (c.as_deref(), calls.len()),
            (Some("<tool_call>not json</tool_call>"), 0),
            "a broken call stays text"
        );
        let (c, calls) = Parser::Llama3Json.parse("<|python_tag|>{\"name\": \"now\", \"parameters\": {}}; {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}");
        assert_eq!((c, calls.len()), (None, 2));
        assert_eq!(calls[1].arguments, r#"{"city":"Rome"}"#);
        let (c, calls) = Parser::Mistral.parse("[TOOL_CALLS] [{\"name\": \"now\", \"arguments\": {}}]");
        assert_eq!((c, calls[0].name.as_str()), (None, "now"));
        // the marker left out by decoding
        assert_eq!(Parser::Mistral.parse("[{\"name\": \"now\", \"arguments\": {}}]").1.len(), 1);
        assert_eq!(forced_calls(r#"[{"name":"now","arguments":{}}]"#).unwrap()[0].name, "now");
        assert!(forced_calls("{").is_err());
        assert_eq!(Parser::detect("{% if tools %}<tool_call>{% endif %}"), Some(Parser::Hermes));
        assert_eq!(Parser::detect("[TOOL_CALLS]"), Some(Parser::Mistral));
        assert_eq!(Parser::detect("<|python_tag|>"), Some(Parser::Llama3Json));
        assert_eq!(Parser::detect("{{ messages }}"), None);
        assert!(Parser::from_name("xml").is_err());
        let j = tool_calls_json(&calls, true);
        assert_eq!((j[0]["type"].clone(), j[0]["index"].clone()), (json!("function"), json!(0)));
        assert!(j[0]["id"].as_str().unwrap().starts_with("call_"));
    }

    #[test]
    fn assistant_calls_reach_the_template_with_object_arguments() {
        let m = json!([{"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "now", "arguments": "{\"tz\": \"UTC\"}"}}]}, {"role": "tool", "tool_call_id": "c1", "content": "12:00"}]);
        let t = template_messages(&m);
        assert_eq!(t[0]["tool_calls"][0]["function"]["arguments"], json!({"tz": "UTC"}));
        assert_eq!(t[1], m[1]);
    }
}
