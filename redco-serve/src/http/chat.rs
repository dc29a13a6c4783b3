//! `POST /v1/chat/completions`: the messages rendered with the model's chat template
//! (`tokenizer_config.json`'s `chat_template`, a Jinja template run by minijinja).

use super::choices::{stream, submit, Piece};
use super::completions::usage;
use super::error::ApiError;
use super::logprobs;
use super::params::{kind, Params};
use super::App;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use std::path::Path;
use std::sync::Arc;

/// A model's chat template with the special tokens it names.
pub struct ChatTemplate {
    env: minijinja::Environment<'static>,
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
    /// The template of `dir/tokenizer_config.json`; `None` when the model has none.
    pub fn from_dir(dir: &Path) -> Result<Option<Self>, String> {
        let path = dir.join("tokenizer_config.json");
        let Ok(text) = std::fs::read_to_string(&path) else { return Ok(None) };
        let cfg: Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let source = match cfg.get("chat_template") {
            Some(Value::String(s)) => s.clone(),
            // a list of named templates: the default one, else the first
            Some(Value::Array(a)) => {
                let named = |n: &str| a.iter().find(|t| t.get("name").and_then(Value::as_str) == Some(n));
                match named("default").or(a.first()).and_then(|t| t.get("template")).and_then(Value::as_str) {
                    Some(s) => s.to_string(),
                    None => return Ok(None),
                }
            }
            _ => return Ok(None),
        };
        let mut env = minijinja::Environment::new();
        env.add_function("raise_exception", |msg: String| -> Result<String, minijinja::Error> {
            Err(minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, msg))
        });
        env.add_template_owned("chat", source).map_err(|e| format!("{}: the chat template: {e}", path.display()))?;
        Ok(Some(ChatTemplate { env, bos: token(&cfg, "bos_token"), eos: token(&cfg, "eos_token") }))
    }

    /// The prompt text of `messages`, ready for the assistant's turn.
    pub fn render(&self, messages: &Value) -> Result<String, String> {
        let t = self.env.get_template("chat").map_err(|e| e.to_string())?;
        t.render(minijinja::context! {
            messages => minijinja::Value::from_serialize(messages),
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
    let Some(template) = &app.chat_template else {
        return Err(ApiError::bad_request(format!(
            "the model {} has no chat template (tokenizer_config.json has no chat_template): use /v1/completions",
            app.model_id
        )));
    };
    let msgs = messages(body.get("messages"))?;
    let p = Params::read(&body, app.context)?;
    let p = Params { max_tokens: p.max_tokens.min(app.context.saturating_sub(1)), ..p };
    let text = template.render(msgs).map_err(|e| ApiError::invalid("messages", e))?;
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
