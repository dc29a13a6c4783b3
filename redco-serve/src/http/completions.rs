//! `POST /v1/completions`.

use super::choices::{stream, submit, Piece};
use super::error::ApiError;
use super::logprobs;
use super::params::{kind, Params};
use super::request::{self, CompletionFields};
use super::App;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use std::sync::Arc;

/// The prompts of a completion request: a string, an array of strings, an array of token
/// ids, or an array of arrays of token ids; each with its text, for `echo`.
fn prompts(app: &App, v: Option<&Value>) -> Result<Vec<(Vec<i64>, String)>, ApiError> {
    let text = |s: &str| -> Result<(Vec<i64>, String), ApiError> {
        let ids = app.tokenizer.encode(s, true).map_err(|e| ApiError::invalid("prompt", e.to_string()))?;
        Ok((ids, s.to_string()))
    };
    let ids = |a: &[Value]| -> Result<(Vec<i64>, String), ApiError> {
        let ids: Vec<i64> = a
            .iter()
            .map(|v| v.as_i64().filter(|&t| t >= 0 && (t as usize) < app.vocab))
            .collect::<Option<_>>()
            .ok_or_else(|| ApiError::invalid("prompt", format!("token ids must be integers in 0..{}", app.vocab)))?;
        let s = app.tokenizer.decode(&ids, false).map_err(|e| ApiError::invalid("prompt", e.to_string()))?;
        Ok((ids, s))
    };
    let out = match v {
        None | Some(Value::Null) => return Err(ApiError::invalid("prompt", "`prompt` is required")),
        Some(Value::String(s)) => vec![text(s)?],
        Some(Value::Array(a)) if a.iter().all(Value::is_number) => vec![ids(a)?],
        Some(Value::Array(a)) => a
            .iter()
            .map(|p| match p {
                Value::String(s) => text(s),
                Value::Array(t) => ids(t),
                other => Err(ApiError::invalid(
                    "prompt",
                    format!("a prompt must be a string or token ids, got {}", kind(other)),
                )),
            })
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(ApiError::invalid(
                "prompt",
                format!("`prompt` must be a string or an array, got {}", kind(other)),
            ))
        }
    };
    if out.is_empty() || out.len() > 64 {
        return Err(ApiError::invalid("prompt", "give 1 to 64 prompts"));
    }
    if out.iter().any(|(ids, _)| ids.is_empty()) {
        return Err(ApiError::invalid("prompt", "a prompt encodes to no tokens"));
    }
    Ok(out)
}

/// The handler.
pub async fn completions(State(app): State<Arc<App>>, body: Bytes) -> Response {
    match run(app, body).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn run(app: Arc<App>, body: Bytes) -> Result<Response, ApiError> {
    let body = app.parse_body(&body)?;
    super::fields::check(&body, request::fields_of::<CompletionFields>())?;
    let own: CompletionFields = request::read(&body)?;
    let p = Params::read(&body, 16)?;
    app.check_guide(&p)?;
    let prompts = prompts(&app, own.prompt.as_ref())?;
    let ids: Vec<Vec<i64>> = prompts.iter().map(|(i, _)| i.clone()).collect();
    let prompt_tokens: usize = ids.iter().map(Vec::len).sum();
    let choices = submit(&app, &ids, &p).await?;
    let (id, created, model) = (format!("cmpl-{}", app.engine.next_id()), app.now(), app.model_id.clone());
    let echo: Vec<String> = prompts.iter().flat_map(|(_, t)| std::iter::repeat_n(t.clone(), p.n)).collect();
    if p.stream {
        let include_usage = p.include_usage;
        let (cid, cmodel) = (id.clone(), model.clone());
        let mut echoed = vec![!p.echo; echo.len()];
        let (tapp, mut offsets) = (app.clone(), vec![0usize; echo.len()]);
        let sids: Vec<Vec<i64>> = ids.iter().flat_map(|t| std::iter::repeat_n(t.clone(), p.n)).collect();
        let chunk = move |i: usize, p: &Piece| {
            let text = if echoed[i] { p.delta.clone() } else { format!("{}{}", echo[i], p.delta) };
            echoed[i] = true;
            // the prompt's log-probabilities come first, in one chunk with the echoed text
            let lp = if p.prompt.is_empty() {
                p.logprob.as_ref().map(|e| logprobs::completion(&tapp.tokenizer, std::slice::from_ref(e), offsets[i]))
            } else {
                Some(logprobs::echoed(&tapp.tokenizer, &sids[i], &p.prompt, &[]))
            };
            offsets[i] += text.len();
            json!({"id": cid, "object": "text_completion", "created": created, "model": cmodel,
                "choices": [{"text": text, "index": i, "logprobs": lp, "finish_reason": p.end}]})
        };
        let chunk = std::sync::Mutex::new(chunk);
        let last = move |generated: usize| {
            include_usage.then(|| {
                json!({"id": id, "object": "text_completion", "created": created, "model": model,
                "choices": [], "usage": usage(prompt_tokens, generated)})
            })
        };
        let stop = p.stop.clone();
        return Ok(stream(app, choices, stop, move |i, p| (chunk.lock().expect("one task streams"))(i, p), last));
    }
    let mut out = Vec::new();
    let mut generated = 0;
    let done = futures_util::future::join_all(choices.into_iter().map(|c| c.collect(&app, &p.stop))).await;
    for (i, d) in done.into_iter().enumerate() {
        let d = d?;
        generated += d.tokens;
        let lp = match (p.logprobs, p.echo) {
            (Some(_), true) => Some(logprobs::echoed(&app.tokenizer, &ids[i / p.n], &d.prompt_logprobs, &d.logprobs)),
            (Some(_), false) => Some(logprobs::completion(&app.tokenizer, &d.logprobs, 0)),
            (None, _) => None,
        };
        let text = if p.echo { format!("{}{}", echo[i], d.text) } else { d.text };
        out.push(json!({"text": text, "index": i, "logprobs": lp, "finish_reason": d.reason}));
    }
    Ok(axum::Json(json!({"id": id, "object": "text_completion", "created": created, "model": model,
        "choices": out, "usage": usage(prompt_tokens, generated)}))
    .into_response())
}

/// OpenAI's `usage`.
pub fn usage(prompt: usize, completion: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion})
}
