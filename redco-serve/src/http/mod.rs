//! The OpenAI-compatible HTTP front end (axum on tokio): `POST /v1/completions`, `POST
//! /v1/chat/completions` (streamed as server-sent events with `stream: true`), `GET
//! /v1/models`, `GET /health`, `GET /metrics` (Prometheus text). Requests go to the engine's
//! thread ([`EngineHandle`]); bad requests answer OpenAI's error JSON with a 4xx and the
//! server keeps serving.

pub mod chat;
pub mod choices;
pub mod completions;
pub mod error;
pub mod fields;
pub mod latency;
pub mod logprobs;
pub mod params;
pub mod request;
pub mod text;
pub mod tools;

use crate::worker::EngineHandle;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::Router;
use chat::ChatTemplate;
use error::ApiError;
use redco_models::hf::tokenizer::Tokenizer;
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// What every handler reads.
pub struct App {
    /// The engine.
    pub engine: EngineHandle,
    /// The model's tokenizer.
    pub tokenizer: Tokenizer,
    /// The name `/v1/models` lists and requests name.
    pub model_id: String,
    /// The model's context in tokens.
    pub context: usize,
    /// The vocabulary size (token ids in prompts are checked against it).
    pub vocab: usize,
    /// Tokens that end every generation (the model's end-of-sequence tokens).
    pub eos: Vec<i64>,
    /// The chat template, when the model has one.
    pub chat_template: Option<ChatTemplate>,
    /// The model's vocabulary for constrained decoding, or why there is none.
    pub guides: Result<Arc<crate::guide::Guides>, String>,
    /// The tool-call format `--tool-call-parser` named (else the chat template's, detected).
    pub tool_parser: Option<tools::Parser>,
    /// When the server started (Unix seconds).
    pub started: u64,
    /// Latency histograms and the output rate.
    pub latency: latency::Latency,
}

impl App {
    /// How the model writes tool calls: `--tool-call-parser`'s, else what `template` shows.
    pub fn tool_parser(&self, template: &ChatTemplate) -> Option<tools::Parser> {
        self.tool_parser.or_else(|| tools::Parser::detect(template.source()))
    }

    /// Checks a request's output constraint against the model's vocabulary: a 400 naming
    /// the field for a grammar llguidance refuses, or where the model has no vocabulary
    /// for it.
    pub fn check_guide(&self, p: &params::Params) -> Result<(), ApiError> {
        let Some(spec) = &p.guide else { return Ok(()) };
        let field = match spec {
            crate::guide::GuideSpec::Regex(_) => "guided_regex",
            crate::guide::GuideSpec::Choice(_) => "guided_choice",
            crate::guide::GuideSpec::JsonSchema(_) => "response_format",
        };
        match &self.guides {
            Ok(g) => g.constraint(spec).map(drop).map_err(|e| ApiError::invalid(field, format!("the grammar: {e}"))),
            Err(why) => {
                Err(ApiError::invalid(field, format!("structured output is not available for this model: {why}")))
            }
        }
    }

    /// Unix seconds now.
    pub fn now(&self) -> u64 {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
    }

    /// The request body as a JSON object naming this model (or none).
    pub fn parse_body(&self, body: &[u8]) -> Result<Map<String, Value>, ApiError> {
        let v: Value = serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))?;
        let Value::Object(o) = v else {
            return Err(ApiError::bad_request("the body must be a JSON object"));
        };
        match o.get("model") {
            None | Some(Value::Null) => {}
            Some(Value::String(m)) if *m == self.model_id => {}
            Some(Value::String(m)) => {
                return Err(ApiError {
                    status: StatusCode::NOT_FOUND,
                    message: format!("The model `{m}` does not exist; this server serves `{}`", self.model_id),
                    param: Some("model".into()),
                    code: Some("model_not_found"),
                })
            }
            Some(other) => {
                return Err(ApiError::invalid(
                    "model",
                    format!("`model` must be a string, got {}", params::kind(other)),
                ))
            }
        }
        Ok(o)
    }
}

async fn models(State(app): State<Arc<App>>) -> impl IntoResponse {
    axum::Json(json!({"object": "list", "data": [{"id": app.model_id, "object": "model", "created": app.started,
        "owned_by": "redco", "max_model_len": app.context}]}))
}

async fn health() -> &'static str {
    "ok"
}

async fn metrics(State(app): State<Arc<App>>) -> impl IntoResponse {
    let Some(s) = app.engine.stats().await else {
        return (StatusCode::SERVICE_UNAVAILABLE, "the engine has stopped\n".to_string());
    };
    let lines = [
        ("redco_queue_length", "gauge", "Requests waiting.", s.waiting as u64),
        ("redco_running_sequences", "gauge", "Sequences running.", s.running as u64),
        ("redco_kv_blocks_used", "gauge", "KV blocks used by running sequences.", s.kv.used as u64),
        ("redco_kv_blocks_free", "gauge", "KV blocks holding nothing.", s.kv.free as u64),
        ("redco_kv_blocks_cached", "gauge", "KV blocks holding a reusable prefix.", s.kv.cached as u64),
        ("redco_kv_blocks_total", "gauge", "KV blocks in the pool.", s.kv.total as u64),
        ("redco_generated_tokens_total", "counter", "Tokens generated.", s.generated),
        ("redco_prompt_tokens_total", "counter", "Prompt tokens admitted.", s.kv.prompt_tokens),
        (
            "redco_prefix_cache_hit_tokens_total",
            "counter",
            "Prompt tokens found in the prefix cache.",
            s.kv.prefix_hit_tokens,
        ),
        (
            "redco_prefill_tokens_total",
            "counter",
            "Tokens run outside decode steps (prompts, recomputations).",
            s.prefilled,
        ),
        ("redco_preemptions_total", "counter", "Sequences preempted for blocks.", s.preemptions),
        ("redco_kv_evictions_total", "counter", "Cached KV blocks given to other tokens.", s.kv.evictions),
        ("redco_engine_steps_total", "counter", "Engine steps run.", s.steps),
    ];
    let mut out = String::new();
    for (name, kind, help, v) in lines {
        out.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}\n"));
    }
    let rate = app.latency.rate(s.generated);
    let name = "redco_output_tokens_per_second";
    out.push_str(&format!(
        "# HELP {name} Tokens generated per second since the previous scrape.\n# TYPE {name} gauge\n{name} {rate}\n"
    ));
    let lock = |m: &std::sync::Mutex<latency::Histogram>| m.lock().unwrap_or_else(|p| p.into_inner()).clone();
    out.push_str(
        &lock(&app.latency.first_token)
            .render("redco_time_to_first_token_seconds", "Seconds from a request's arrival to its first token."),
    );
    out.push_str(
        &lock(&app.latency.between_tokens)
            .render("redco_time_per_output_token_seconds", "Seconds between a request's tokens."),
    );
    (StatusCode::OK, out)
}

/// The routes over `app`.
pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/v1/completions", post(completions::completions))
        .route("/v1/chat/completions", post(chat::chat))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .method_not_allowed_fallback(|| async {
            let message = "this route does not take that method (POST for completions, GET for the rest)";
            ApiError { status: StatusCode::METHOD_NOT_ALLOWED, message: message.into(), param: None, code: None }
        })
        .fallback(|| async {
            ApiError { status: StatusCode::NOT_FOUND, message: "no such route".into(), param: None, code: None }
        })
        .with_state(app)
}

/// Serves `app` on `listener` until `shutdown` resolves, then lets the requests in flight
/// finish (at most `drain`; what is left after is cut).
pub async fn serve(
    listener: tokio::net::TcpListener,
    app: Arc<App>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    drain: std::time::Duration,
) -> std::io::Result<()> {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let server = axum::serve(listener, router(app)).with_graceful_shutdown(async move {
        shutdown.await;
        let _ = tx.send(());
    });
    let mut server = std::pin::pin!(std::future::IntoFuture::into_future(server));
    tokio::select! {
        r = &mut server => r?,
        // shut down, and the requests in flight outlived the drain: cut them
        _ = async {
            match rx.await {
                Ok(()) => tokio::time::sleep(drain).await,
                Err(_) => std::future::pending::<()>().await,
            }
        } => {}
    }
    Ok(())
}
