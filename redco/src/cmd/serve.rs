//! `redco serve`: an OpenAI-compatible HTTP server over a model directory, on the
//! continuous-batching engine and paged KV cache of `redco-serve`.

use crate::cmd::check;
use redco_core::cpu::Cpu;
use redco_models::auto::AutoModel;
use redco_models::generate::GenerationConfig;
use redco_models::hf::config::HfConfig;
use redco_models::hf::tokenizer::Tokenizer;
use redco_serve::engine::{Engine, EngineConfig};
use redco_serve::http::{chat::ChatTemplate, App};
use redco_serve::kv::KvGeometry;
use redco_serve::worker::EngineHandle;
use std::path::PathBuf;
use std::sync::Arc;

/// `redco serve` flags.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Hugging Face model directory (a LLaMA: config.json, safetensors, tokenizer.json).
    #[arg(long)]
    pub model: PathBuf,
    /// Address to listen on (loopback by default).
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port, printed).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// The model's name in requests and `/v1/models` (default: the directory's name).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Mesh as DPxMP (1x1 only so far).
    #[arg(long, default_value = "1x1")]
    pub mesh: String,
    /// Compute backend (cpu only so far).
    #[arg(long, default_value = "cpu")]
    pub backend: String,
    /// Parameter and KV cache dtype: f32, bf16 or f16.
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    /// Memory for the paged KV cache (e.g. 512MB, 2GiB): sets how many blocks the pool has.
    #[arg(long, value_parser = check::bytes, default_value = "512MB")]
    pub kv_memory: u64,
    /// Tokens per KV block.
    #[arg(long, value_parser = check::count, default_value_t = 16)]
    pub block_size: usize,
    /// Tokens one engine step runs at most (decode tokens first, then prompt chunks).
    #[arg(long, value_parser = check::count, default_value_t = 256)]
    pub max_batch_tokens: usize,
    /// Sequences running at once at most.
    #[arg(long, value_parser = check::count, default_value_t = 64)]
    pub max_running: usize,
    /// Requests waiting at most; more are answered 429.
    #[arg(long, value_parser = check::count, default_value_t = 256)]
    pub max_queue: usize,
    /// Seconds a SIGTERM or Ctrl-C waits for the requests in flight before exiting.
    #[arg(long, default_value_t = 30)]
    pub drain_timeout: u64,
    /// CPU threads for the model (default: every core).
    #[arg(long, value_parser = check::threads)]
    pub threads: Option<usize>,
}

/// Runs the server until SIGTERM or Ctrl-C (then drains).
pub fn run(a: ServeArgs) -> Result<(), String> {
    if a.mesh != "1x1" {
        return Err(format!("--mesh {}: redco serve runs on one rank so far (--mesh 1x1)", a.mesh));
    }
    if a.backend != "cpu" {
        return Err(format!("--backend {}: redco serve runs on the cpu backend so far", a.backend));
    }
    let cfg = HfConfig::from_dir(&a.model).map_err(|e| e.to_string())?;
    if !matches!(cfg.model_type.as_str(), "llama" | "mistral") {
        return Err(format!(
            "redco serve runs LLaMA models so far; {} is {} (use redco generate)",
            a.model.display(),
            cfg.model_type
        ));
    }
    let dtype = check::dtype(&a.dtype)?;
    let tokenizer = Tokenizer::from_dir(&a.model).map_err(|e| e.to_string())?;
    let chat_template = ChatTemplate::from_dir(&a.model)?;
    let geometry = KvGeometry {
        layers: cfg.layers,
        kv_heads: cfg.kv_heads,
        head_dim: cfg.head_dim,
        dtype_bytes: dtype.size_in_bytes(),
        block_size: a.block_size,
    };
    let blocks = geometry.blocks_in(a.kv_memory).map_err(|e| format!("--kv-memory: {e}"))?;
    let engine_cfg = EngineConfig {
        max_batch_tokens: a.max_batch_tokens,
        max_running: a.max_running,
        max_waiting: a.max_queue,
        block_size: a.block_size,
        blocks,
    };
    let threads = a.threads.unwrap_or_else(crate::cmd::cores::host_cores);
    let dir = a.model.clone();
    let engine = EngineHandle::start(move || {
        let b = Cpu::new(threads);
        let m = AutoModel::from_pretrained(&b, &dir, dtype, None)?;
        Engine::new(&b, m, engine_cfg, dtype)
    })?;
    let mut eos = GenerationConfig::for_model(&cfg).stop_tokens;
    eos.extend(tokenizer.eos_id());
    let model_id = a.served_model_name.clone().unwrap_or_else(|| {
        let canon = a.model.canonicalize().unwrap_or_else(|_| a.model.clone());
        canon.file_name().map_or_else(|| "model".to_string(), |n| n.to_string_lossy().into_owned())
    });
    let context = cfg.max_positions.unwrap_or(usize::MAX / 2);
    let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let app = Arc::new(App {
        engine,
        tokenizer,
        model_id: model_id.clone(),
        context,
        vocab: cfg.vocab,
        eos,
        chat_template,
        started,
        latency: Default::default(),
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the HTTP runtime: {e}"))?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind((a.host.as_str(), a.port))
            .await
            .map_err(|e| format!("cannot listen on {}:{}: {e}", a.host, a.port))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        crate::outln!(
            "redco serve: listening on http://{addr} (model {model_id}, {blocks} KV blocks of {} tokens, {})",
            a.block_size,
            if app.chat_template.is_some() { "chat template" } else { "no chat template: completions only" }
        );
        redco_serve::http::serve(listener, app, shutdown(), std::time::Duration::from_secs(a.drain_timeout))
            .await
            .map_err(|e| format!("the server failed: {e}"))
    })?;
    crate::outln!("redco serve: stopped");
    Ok(())
}

/// Resolves at SIGTERM or Ctrl-C.
async fn shutdown() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}
