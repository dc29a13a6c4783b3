//! Running a request's choices on the engine, shared by completions and chat: each choice
//! submitted as an engine request, then collected whole or streamed as server-sent events.

use super::error::ApiError;
use super::params::Params;
use super::text::Detok;
use super::App;
use crate::engine::{Finish, Logprob, Refused, Request};
use crate::worker::Output;
use axum::body::Body;
use axum::http::{header, StatusCode};
use axum::response::Response;
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedReceiver;

/// A choice's outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct Done {
    /// Its text.
    pub text: String,
    /// OpenAI's `finish_reason`: `stop` or `length`.
    pub reason: &'static str,
    /// Tokens generated.
    pub tokens: usize,
    /// Each token's log-probability, when asked.
    pub logprobs: Vec<(i64, Logprob)>,
    /// The prompt's tokens' log-probabilities from its second token on, when asked
    /// (`echo` with `logprobs`).
    pub prompt_logprobs: Vec<(i64, Logprob)>,
}

/// What one output of a choice adds: text safe to hand out, the finish reason when it
/// ended, and the token's log-probability when asked.
pub struct Piece {
    /// New text.
    pub delta: String,
    /// `stop` or `length` once the choice ended.
    pub end: Option<&'static str>,
    /// The token and its log-probability.
    pub logprob: Option<(i64, Logprob)>,
    /// Prompt tokens' log-probabilities that arrived (before any token).
    pub prompt: Vec<(i64, Logprob)>,
}

/// One submitted choice.
pub struct Choice {
    id: u64,
    rx: UnboundedReceiver<Output>,
    detok: Detok,
    arrived: std::time::Instant,
    last: Option<std::time::Instant>,
}

fn reason(f: Finish) -> &'static str {
    match f {
        Finish::Stop => "stop",
        Finish::Length | Finish::Context => "length",
    }
}

/// Submits `n` choices of each prompt (`prompts[i]` gives choices `i * n..(i + 1) * n`);
/// a refusal cancels those already submitted.
pub async fn submit(app: &App, prompts: &[Vec<i64>], p: &Params) -> Result<Vec<Choice>, ApiError> {
    let arrived = std::time::Instant::now();
    let mut out = Vec::new();
    for prompt in prompts {
        if prompt.len() + p.max_tokens > app.context {
            let e = ApiError::invalid(
                "max_tokens",
                format!(
                    "This model's maximum context length is {} tokens. However, you requested {} tokens ({} in the \
                     prompt, {} for the completion).",
                    app.context,
                    prompt.len() + p.max_tokens,
                    prompt.len(),
                    p.max_tokens
                ),
            )
            .with_code("context_length_exceeded");
            cancel(app, &out);
            return Err(e);
        }
        for j in 0..p.n {
            let id = app.engine.next_id();
            let mut sampling = p.sampling.clone();
            if let redco_models::generate::Sampling::Sample { seed, .. } = &mut sampling {
                // each choice its own stream of draws
                *seed = seed.wrapping_add(j as u64);
            }
            let stop_tokens = p.stop_ids.iter().chain(&app.eos).copied().collect();
            let req = Request {
                id,
                prompt: prompt.clone(),
                max_tokens: p.max_tokens,
                sampling,
                stop_tokens,
                logprobs: p.logprobs,
                // `echo` with `logprobs`: the prompt's tokens scored too (an evaluation
                // harness's loglikelihood)
                prompt_logprobs: if p.echo { p.logprobs } else { None },
                guide: p.guide.clone().map(std::sync::Arc::new),
            };
            match app.engine.submit(req).await {
                Ok(rx) => out.push(Choice { id, rx, detok: Detok::after(prompt), arrived, last: None }),
                Err(refused) => {
                    cancel(app, &out);
                    let status = match refused {
                        Refused::Busy(_) => StatusCode::TOO_MANY_REQUESTS,
                        Refused::Invalid(_) => StatusCode::BAD_REQUEST,
                        Refused::Stopped => StatusCode::SERVICE_UNAVAILABLE,
                    };
                    return Err(ApiError { status, message: refused.to_string(), param: None, code: None });
                }
            }
        }
    }
    Ok(out)
}

fn cancel(app: &App, choices: &[Choice]) {
    for c in choices {
        app.engine.cancel(c.id);
    }
}

impl Choice {
    /// The next piece of the choice (`None` once its channel closed).
    async fn next(&mut self, app: &App, stop: &[String]) -> Option<Result<Piece, String>> {
        match self.rx.recv().await? {
            Output::Token(t, lp) => Some(self.detok.push(&app.tokenizer, t, stop).map(|delta| {
                app.latency.token(self.arrived, self.last);
                self.last = Some(std::time::Instant::now());
                let logprob = lp.map(|l| (t, l));
                if self.detok.stopped() {
                    // a stop string ended it: the engine need not go on
                    app.engine.cancel(self.id);
                    Piece { delta, end: Some("stop"), logprob, prompt: Vec::new() }
                } else {
                    Piece { delta, end: None, logprob, prompt: Vec::new() }
                }
            })),
            Output::PromptLogprobs(prompt) => {
                Some(Ok(Piece { delta: String::new(), end: None, logprob: None, prompt }))
            }
            Output::Finished(f) => Some(self.detok.finish(&app.tokenizer).map(|rest| Piece {
                delta: rest,
                end: Some(reason(f)),
                logprob: None,
                prompt: Vec::new(),
            })),
            Output::Failed(e) => Some(Err(e)),
        }
    }

    /// Runs the choice to its end.
    pub async fn collect(mut self, app: &App, stop: &[String]) -> Result<Done, ApiError> {
        let mut text = String::new();
        let (mut logprobs, mut prompt_logprobs) = (Vec::new(), Vec::new());
        let failed = |message| ApiError { status: StatusCode::INTERNAL_SERVER_ERROR, message, param: None, code: None };
        loop {
            match self.next(app, stop).await {
                Some(Ok(p)) => {
                    text.push_str(&p.delta);
                    logprobs.extend(p.logprob);
                    prompt_logprobs.extend(p.prompt);
                    if let Some(reason) = p.end {
                        let tokens = self.detok.tokens();
                        return Ok(Done { text, reason, tokens, logprobs, prompt_logprobs });
                    }
                }
                Some(Err(e)) => return Err(failed(e)),
                None => return Err(failed("the engine stopped".into())),
            }
        }
    }
}

/// Streams `choices` as server-sent events: `chunk(index, piece)` makes each event's JSON; after every choice ends, `last()` (usage, when asked) and `data: [DONE]`.
/// A client that goes away drops the stream, and with it the choices (cancelled).
pub fn stream(
    app: Arc<App>,
    choices: Vec<Choice>,
    stop: Vec<String>,
    chunk: impl Fn(usize, &Piece) -> serde_json::Value + Send + 'static,
    last: impl FnOnce(usize) -> Option<serde_json::Value> + Send + 'static,
) -> Response {
    let (tx, rx) = tokio::sync::mpsc::channel::<String>(64);
    tokio::spawn(async move {
        let send = |v: serde_json::Value| {
            let tx = tx.clone();
            async move { tx.send(format!("data: {v}\n\n")).await.is_ok() }
        };
        let mut generated = 0;
        // choices in turn would hold the later ones back: pull from all as they come
        let mut live: Vec<(usize, Choice)> = choices.into_iter().enumerate().collect();
        while !live.is_empty() {
            let (i, out) = {
                let futs = live.iter_mut().map(|(i, c)| {
                    let (i, app, stop) = (*i, &app, &stop);
                    Box::pin(async move { (i, c.next(app, stop).await) })
                });
                futures_util::future::select_all(futs).await.0
            };
            let at = live.iter().position(|(j, _)| *j == i).expect("the choice that answered is live");
            match out {
                Some(Ok(p)) => {
                    let news = !p.delta.is_empty() || p.end.is_some() || p.logprob.is_some() || !p.prompt.is_empty();
                    if news && !send(chunk(i, &p)).await {
                        return;
                    }
                    if p.end.is_some() {
                        generated += live.remove(at).1.detok.tokens();
                    }
                }
                Some(Err(e)) => {
                    let _ = send(
                        ApiError { status: StatusCode::INTERNAL_SERVER_ERROR, message: e, param: None, code: None }
                            .body(),
                    )
                    .await;
                    return;
                }
                None => return,
            }
        }
        if let Some(v) = last(generated) {
            if !send(v).await {
                return;
            }
        }
        let _ = tx.send("data: [DONE]\n\n".to_string()).await;
    });
    let body = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|s| (Ok::<_, std::convert::Infallible>(s), rx))
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| Response::new(Body::empty()))
}
