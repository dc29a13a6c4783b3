//! `POST /v1/chat/completions`: the messages rendered with the model's chat template
//! (`chat_template.jinja`, or `tokenizer_config.json`'s `chat_template`: a Jinja template
//! run by minijinja).

use super::choices::{stream, submit, Piece};
use super::completions::usage;
use super::error::ApiError;
use super::logprobs;
use super::params::{kind, Params};
use super::request::{self, ChatFields};
use super::tools::{self, Parser, ToolChoice, Tools};
use super::App;
use crate::guide::GuideSpec;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use std::path::Path;
use std::sync::Arc;

/// A model's chat template with the special tokens it names.
pub struct ChatTemplate {
    env: minijinja::Environment<'static>,
    source: String,
    bos: String,
    eos: String,
}

/// A special token of `tokenizer_config.json`: a string, or an object with `content`.
fn token(cfg: &Value, key: &str) -> String {
    match cfg.get(key) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Object(o)) => o.get("content").and_then(Value::as_str).unwrap_or("").to_string(),
        _ => String::new(),
    }
}

impl ChatTemplate {
    /// The model's template: `dir/chat_template.jinja` (where current transformers saves
    /// it), else `tokenizer_config.json`'s `chat_template` (a string, or a list of named
    /// templates: the one named `default`, else the first); `None` when the model has none.
    /// The special tokens come from `tokenizer_config.json`.
    pub fn from_dir(dir: &Path) -> Result<Option<Self>, String> {
        let path = dir.join("tokenizer_config.json");
        let cfg: Value = match std::fs::read_to_string(&path) {
            Ok(text) => serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?,
            Err(_) => Value::Null,
        };
        let jinja = dir.join("chat_template.jinja");
        let (source, path) = match std::fs::read_to_string(&jinja) {
            Ok(t) => (t, jinja),
            Err(_) => match Self::from_config(&cfg) {
                Some(s) => (s, path),
                None => return Ok(None),
            },
        };
        let mut env = minijinja::Environment::new();
        env.add_function("raise_exception", |msg: String| -> Result<String, minijinja::Error> {
            Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
        });
        env.add_template_owned("chat", source.clone())
            .map_err(|e| format!("{}: the chat template: {e}", path.display()))?;
        Ok(Some(ChatTemplate { env, source, bos: token(&cfg, "bos_token"), eos: token(&cfg, "eos_token") }))
    }

    /// `tokenizer_config.json`'s `chat_template`: a string, or the `default` (else the
    /// first) of a list of named templates.
    fn from_config(cfg: &Value) -> Option<String> {
        Some(match cfg.get("chat_template") {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Array(a)) => {
                let named = |n: &str| a.iter().find(|t| t.get("name").and_then(Value::as_str) == Some(n));
                named("default").or(a.first())?.get("template")?.as_str()?.to_string()
            }
            _ => return None,
        })
    }

    /// The template's text (which tool-call format it teaches: [`super::tools::Parser::detect`]).
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The prompt text of `messages`, ready for the assistant's turn.
    pub fn render(&self, messages: &Value) -> Result<String, String> {
        self.render_with_tools(messages, None)
    }

    /// [`ChatTemplate::render`] with the request's tools in the template's `tools`, as
    /// transformers' `apply_chat_template(tools=...)` passes them.
    pub fn render_with_tools(&self, messages: &Value, tools: Option<&[Value]>) -> Result<String, String> {
        let t = self.env.get_template("chat").map_err(|e| e.to_string())?;
        let tools = tools.map(minijinja::Value::from_serialize);
        t.render(minijinja::context! {
            messages => minijinja::Value::from_serialize(messages),
            tools => tools,
            add_generation_prompt => true,
            bos_token => self.bos.clone(),
            eos_token => self.eos.clone(),
        })
        .map_err(|e| format!("the chat template failed on these messages: {e}"))
    }
}

/// The messages, checked: an array of objects with a string `role` and a string (or null)
/// `content`.
fn messages(v: Option<&Value>) -> Result<&Value, ApiError> {
    let Some(v @ Value::Array(a)) = v else {
        return Err(ApiError::invalid("messages", "`messages` must be an array of messages"));
    };
    if a.is_empty() {
        return Err(ApiError::invalid("messages", "`messages` is empty"));
    }
    for (i, m) in a.iter().enumerate() {
        let ok = m.get("role").is_some_and(Value::is_string)
            && m.get("content").is_none_or(|c| c.is_string() || c.is_null());
        if !ok {
            return Err(ApiError::invalid(
                &format!("messages[{i}]"),
                format!("a message is an object with a string `role` and string `content`, got {}", kind(m)),
            ));
        }
        super::fields::check_role(i, m["role"].as_str().unwrap_or_default())?;
    }
    Ok(v)
}

/// The handler.
pub async fn chat(State(app): State<Arc<App>>, body: Bytes) -> Response {
    match run(app, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn run(app: Arc<App>, body: Bytes) -> Result<Response, ApiError> {
    let body = app.parse_body(&body)?;
    super::fields::check(&body, request::fields_of::<ChatFields>())?;
    let own: ChatFields = request::read(&body)?;
    let msgs = messages(own.messages.as_ref())?;
    let tools = Tools::read(&body)?;
    let Some(template) = &app.chat_template else {
        return Err(ApiError::bad_request(format!(
            "the model {} has no chat template (no chat_template.jinja, and tokenizer_config.json has no \
             chat_template): use /v1/completions",
            app.model_id
        )));
    };
    let mut p = Params::read(&body, app.context)?;
    // `required` or a named function: the answer is constrained to calls
    if let Some(schema) = tools.as_ref().and_then(Tools::forced_schema) {
        if p.guide.is_some() {
            return Err(ApiError::invalid("tool_choice", "a required tool call and an output format cannot both hold"));
        }
        p.guide = Some(GuideSpec::JsonSchema(schema));
    }
    app.check_guide(&p)?;
    let calling = tools.as_ref().filter(|t| t.choice != ToolChoice::None);
    let parser = match (calling.map(|t| &t.choice), app.tool_parser(template)) {
        (Some(ToolChoice::Auto), None) => {
            return Err(ApiError::invalid(
                "tool_choice",
                format!(
                    "`tool_choice` auto parses the model's calls, but its chat template shows no tool-call format: \
                     start the server with --tool-call-parser ({})",
                    Parser::NAMES.join(", ")
                ),
            ))
        }
        (_, parser) => parser,
    };
    let p = Params { max_tokens: p.max_tokens.min(app.context.saturating_sub(1)), ..p };
    let shown = tools::template_messages(msgs);
    let text = template
        .render_with_tools(&shown, tools.as_ref().map(|t| t.list.as_slice()))
        .map_err(|e| ApiError::invalid("messages", e))?;
    let ids = app.tokenizer.encode(&text, false).map_err(|e| ApiError::invalid("messages", e.to_string()))?;
    // without max_tokens, the completion may use what the context leaves
    let p = if body.get("max_tokens").is_none() && body.get("max_completion_tokens").is_none() {
        Params { max_tokens: app.context.saturating_sub(ids.len()).max(1), ..p }
    } else {
        p
    };
    let prompt_tokens = ids.len();
    let choices = submit(&app, std::slice::from_ref(&ids), &p).await?;
    let (id, created, model) = (format!("chatcmpl-{}", app.engine.next_id()), app.now(), app.model_id.clone());
    if let Some(t) = calling {
        let answer = Answer { id, created, model, prompt_tokens };
        return with_calls(&app, choices, &p, &t.choice, parser, answer).await;
    }
    if p.stream {
        let include_usage = p.include_usage;
        let (cid, cmodel) = (id.clone(), model.clone());
        let started = std::sync::Mutex::new(vec![false; p.n]);
        let tapp = app.clone();
        let chunk = move |i: usize, p: &Piece| {
            let mut started = started.lock().expect("one task streams");
            let delta = &p.delta;
            let d = if started[i] { json!({"content": delta}) } else { json!({"role": "assistant", "content": delta}) };
            started[i] = true;
            let lp = p.logprob.as_ref().map(|e| logprobs::chat(&tapp.tokenizer, std::slice::from_ref(e)));
            json!({"id": cid, "object": "chat.completion.chunk", "created": created, "model": cmodel,
                "choices": [{"index": i, "delta": d, "logprobs": lp, "finish_reason": p.end}]})
        };
        let last = move |generated: usize| {
            include_usage.then(|| {
                json!({"id": id, "object": "chat.completion.chunk", "created": created,
                "model": model, "choices": [], "usage": usage(prompt_tokens, generated)})
            })
        };
        return Ok(stream(app.clone(), choices, p.stop.clone(), chunk, last));
    }
    let done = futures_util::future::join_all(choices.into_iter().map(|c| c.collect(&app, &p.stop))).await;
    let mut out = Vec::new();
    let mut generated = 0;
    for (i, d) in done.into_iter().enumerate() {
        let d = d?;
        generated += d.tokens;
        let lp = p.logprobs.map(|_| logprobs::chat(&app.tokenizer, &d.logprobs));
        out.push(json!({"index": i, "message": {"role": "assistant", "content": d.text}, "logprobs": lp,
            "finish_reason": d.reason}));
    }
    Ok(axum::Json(json!({"id": id, "object": "chat.completion", "created": created, "model": model,
        "choices": out, "usage": usage(prompt_tokens, generated)}))
    .into_response())
}

/// What a chat answer names besides its choices.
struct Answer {
    id: String,
    created: u64,
    model: String,
    prompt_tokens: usize,
}

/// The answer of a request that may call tools: each choice run whole, its calls taken
/// from the constrained JSON (`required`, a named function) or parsed from the text
/// (`auto`), as `message.tool_calls` with `finish_reason` `tool_calls`; streamed, the same
/// answer as chunks (the role, the content, the calls as one tool-call delta each, the
/// finish reason), once the choice has ended.
async fn with_calls(
    app: &Arc<App>,
    choices: Vec<super::choices::Choice>,
    p: &Params,
    choice: &ToolChoice,
    parser: Option<Parser>,
    a: Answer,
) -> Result<Response, ApiError> {
    let done = futures_util::future::join_all(choices.into_iter().map(|c| c.collect(app, &p.stop))).await;
    let mut out = Vec::new();
    let mut generated = 0;
    for d in done {
        let d = d?;
        generated += d.tokens;
        let (content, calls) = match (choice, parser) {
            (ToolChoice::Required | ToolChoice::Named(_), _) if d.reason == "stop" => {
                let calls = tools::forced_calls(&d.text).map_err(|e| ApiError {
                    status: axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                    message: e,
                    param: None,
                    code: None,
                })?;
                (None, calls)
            }
            // cut by max_tokens before the calls were whole: the text as it is
            (ToolChoice::Required | ToolChoice::Named(_), _) => (Some(d.text.clone()), Vec::new()),
            (_, Some(parser)) => parser.parse(&d.text),
            (_, None) => (Some(d.text.clone()), Vec::new()),
        };
        let lp = p.logprobs.map(|_| logprobs::chat(&app.tokenizer, &d.logprobs));
        out.push((content, calls, d.reason, lp));
    }
    let usage = usage(a.prompt_tokens, generated);
    if !p.stream {
        let choices: Vec<Value> = out
            .into_iter()
            .enumerate()
            .map(|(i, (content, calls, reason, lp))| {
                let mut message = json!({"role": "assistant", "content": content});
                let reason = if calls.is_empty() { reason } else { "tool_calls" };
                if !calls.is_empty() {
                    message["tool_calls"] = tools::tool_calls_json(&calls, false);
                }
                json!({"index": i, "message": message, "logprobs": lp, "finish_reason": reason})
            })
            .collect();
        return Ok(axum::Json(json!({"id": a.id, "object": "chat.completion", "created": a.created,
            "model": a.model, "choices": choices, "usage": usage}))
        .into_response());
    }
    let chunk = |i: usize, delta: Value, reason: Option<&str>| {
        json!({"id": a.id, "object": "chat.completion.chunk", "created": a.created, "model": a.model,
            "choices": [{"index": i, "delta": delta, "logprobs": null, "finish_reason": reason}]})
    };
    let mut events = Vec::new();
    for (i, (content, calls, reason, _)) in out.into_iter().enumerate() {
        events.push(chunk(i, json!({"role": "assistant", "content": ""}), None));
        if let Some(c) = content {
            events.push(chunk(i, json!({"content": c}), None));
        }
        let reason = if calls.is_empty() { reason } else { "tool_calls" };
        for (k, call) in tools::tool_calls_json(&calls, true).as_array().into_iter().flatten().enumerate() {
            let mut call = call.clone();
            call["index"] = json!(k);
            events.push(chunk(i, json!({"tool_calls": [call]}), None));
        }
        events.push(chunk(i, json!({}), Some(reason)));
    }
    if p.include_usage {
        events.push(json!({"id": a.id, "object": "chat.completion.chunk", "created": a.created, "model": a.model,
            "choices": [], "usage": usage}));
    }
    let mut body: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
    body.push_str("data: [DONE]\n\n");
    Ok(Response::builder()
        .header(axum::http::header::CONTENT_TYPE, "text/event-stream")
        .header(axum::http::header::CACHE_CONTROL, "no-cache")
        .body(axum::body::Body::from(body))
        .unwrap_or_else(|_| Response::new(axum::body::Body::empty())))
}

#[cfg(test)]
mod tests {
    use super::ChatTemplate;
    use serde_json::json;

    fn dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("redco-chat-template-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn templates_are_read_from_the_jinja_file_the_config_or_its_named_list() {
        let msgs = json!([{"role": "user", "content": "hi"}]);
        let t = "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}";
        // transformers' current layout: chat_template.jinja beside a config without one
        let d = dir("jinja");
        std::fs::write(d.join("chat_template.jinja"), t).unwrap();
        std::fs::write(d.join("tokenizer_config.json"), json!({"bos_token": "<s>"}).to_string()).unwrap();
        assert_eq!(ChatTemplate::from_dir(&d).unwrap().unwrap().render(&msgs).unwrap(), "<s><user>hi");
        // the jinja file wins over the config's
        std::fs::write(
            d.join("tokenizer_config.json"),
            json!({"chat_template": "old", "bos_token": "<s>"}).to_string(),
        )
        .unwrap();
        assert_eq!(ChatTemplate::from_dir(&d).unwrap().unwrap().render(&msgs).unwrap(), "<s><user>hi");
        // the jinja file alone, no tokenizer_config.json
        std::fs::remove_file(d.join("tokenizer_config.json")).unwrap();
        assert_eq!(ChatTemplate::from_dir(&d).unwrap().unwrap().render(&msgs).unwrap(), "<user>hi");
        // a list of named templates in the config: `default`, else the first
        let d = dir("named");
        let list = json!({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": t}],
            "bos_token": {"content": "<s>"}});
        std::fs::write(d.join("tokenizer_config.json"), list.to_string()).unwrap();
        assert_eq!(ChatTemplate::from_dir(&d).unwrap().unwrap().render(&msgs).unwrap(), "<s><user>hi");
        let first = json!({"chat_template": [{"name": "rag", "template": "R"}]});
        std::fs::write(d.join("tokenizer_config.json"), first.to_string()).unwrap();
        assert_eq!(ChatTemplate::from_dir(&d).unwrap().unwrap().render(&msgs).unwrap(), "R");
        // none at all
        let d = dir("none");
        std::fs::write(d.join("tokenizer_config.json"), json!({"bos_token": "<s>"}).to_string()).unwrap();
        assert!(ChatTemplate::from_dir(&d).unwrap().is_none());
        // a broken template is an error naming the file
        std::fs::write(d.join("chat_template.jinja"), "{% for %}").unwrap();
        let e = ChatTemplate::from_dir(&d).err().unwrap();
        assert!(e.contains("chat_template.jinja"), "{e}");
    }
}
