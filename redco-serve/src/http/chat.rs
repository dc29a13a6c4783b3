//! `POST /v1/chat/completions`: the messages rendered with the model's chat template
//! (`chat_template.jinja`, or `tokenizer_config.json`'s `chat_template`: a Jinja template
//! run by minijinja).

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
        env.add_template_owned("chat", source).map_err(|e| format!("{}: the chat template: {e}", path.display()))?;
        Ok(Some(ChatTemplate { env, bos: token(&cfg, "bos_token"), eos: token(&cfg, "eos_token") }))
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
        super::fields::check_role(i, m["role"].as_str().unwrap_or_default(), m)?;
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
    super::fields::check(&body, &["messages", "top_logprobs"])?;
    let msgs = messages(body.get("messages"))?;
    let Some(template) = &app.chat_template else {
        return Err(ApiError::bad_request(format!(
            "the model {} has no chat template (no chat_template.jinja, and tokenizer_config.json has no \
             chat_template): use /v1/completions",
            app.model_id
        )));
    };
    let p = Params::read(&body, app.context)?;
    app.check_guide(&p)?;
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
