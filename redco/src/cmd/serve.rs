//! `redco serve`: an OpenAI-compatible HTTP server over a model directory, on the
//! continuous-batching engine and paged KV cache of `redco-serve`.

use crate::cmd::error::CliResult;
use crate::cmd::{backends, check, cores, launch, model_config};
use redco_core::runtime::Comm;
use redco_core::Backend;
use redco_models::auto::AutoModel;
use redco_models::generate::GenerationConfig;
use redco_models::hf::config::HfConfig;
use redco_models::hf::tokenizer::Tokenizer;
use redco_serve::engine::{Engine, EngineConfig};
use redco_serve::guide::Guides;
use redco_serve::http::{chat::ChatTemplate, tools::Parser, App};
use redco_serve::kv::KvGeometry;
use redco_serve::lockstep::Lockstep;
use redco_serve::worker::{follow, lead, EngineHandle};
use std::path::PathBuf;
use std::sync::Arc;

/// `redco serve` flags.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// Hugging Face model directory of a LLaMA, GPT-J or OPT (config.json, safetensors,
    /// tokenizer.json), or a LLaMA-family GGUF file (as `generate --model`; served under
    /// the file's name).
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
    /// How the model writes tool calls, for chat requests with `tools` and `tool_choice`
    /// auto: hermes (`<tool_call>` JSON, Hermes and Qwen), llama3_json (Llama 3.1) or mistral
    /// (`[TOOL_CALLS]`). Default: the format the chat template shows, if it shows one.
    #[arg(long, value_parser = ["hermes", "llama3_json", "mistral"])]
    pub tool_call_parser: Option<String>,
    /// Mesh as 1xMP: the model split over MP tensor-parallel ranks (threads, or MPI
    /// processes under a launcher), rank 0 serving HTTP.
    #[arg(long, default_value = "1x1")]
    pub mesh: String,
    /// Compute backend: cpu, or a device backend built in (wgpu, cuda, pjrt). The paged
    /// attention is one fused kernel reading the pool in place on cpu and wgpu; on cuda and
    /// pjrt it runs the composite (each sequence's rows gathered, then attention).
    #[arg(long, default_value = "cpu")]
    pub backend: String,
    /// Quantize the linear layers to llama.cpp's blocks as the model loads (q8_0, q4_0,
    /// q4_1, q4_k or q6_k; rows must be whole blocks: 32 values, 256 for the K formats) and
    /// multiply from the blocks in place.
    #[arg(long)]
    pub quantize: Option<String>,
    /// Parameter dtype: f32, bf16 or f16 (also the KV cache's unless --kv-dtype says).
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    /// KV cache dtype: f32, bf16 or f16 (default: --dtype). A 16-bit cache under f32
    /// weights holds twice the tokens in --kv-memory and reads half the bytes per step; keys
    /// and values are rounded to it as they are written (vLLM's --kv-cache-dtype).
    #[arg(long)]
    pub kv_dtype: Option<String>,
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

/// Runs the server until SIGTERM or Ctrl-C (then drains): on one rank, or on the ranks of
/// a `1 x mp` mesh (threads, or MPI processes under a launcher), rank 0 serving HTTP and
/// leading the others in lockstep.
pub fn run(mut a: ServeArgs) -> CliResult<()> {
    super::quantize::format(a.quantize.as_deref())?;
    if super::gguf_model::is_gguf(&a.model) {
        // served under the file's name, from the directory it is read into
        let name = a.model.file_name().map(|n| n.to_string_lossy().into_owned());
        a.served_model_name = a.served_model_name.take().or(name);
        let blocks = backends::backend(&a.backend)?.reads_blocks();
        a.model = super::gguf_model::resolve(&a.model, check::dtype(&a.dtype)?, blocks)?;
    }
    let mesh = check::mesh(&a.mesh)?;
    if mesh.dp != 1 {
        return Err(format!(
            "--mesh {}: redco serve splits the model over tensor-parallel ranks only (--mesh 1xN); \
             run one server per data-parallel replica",
            a.mesh
        )
        .into());
    }
    let kind = backends::backend(&a.backend)?;
    let cfg = HfConfig::from_dir(&a.model)?;
    if !matches!(cfg.model_type.as_str(), "llama" | "mistral" | "mixtral" | "qwen3" | "qwen3_moe" | "gptj" | "opt") {
        return Err(format!(
            "redco serve runs the decoder-only models (LLaMA, Mistral, Mixtral, GPT-J, OPT); {} is {} (use redco generate)",
            a.model.display(),
            cfg.model_type
        )
        .into());
    }
    let dtype = check::dtype(&a.dtype)?;
    let kv_dtype = match &a.kv_dtype {
        Some(d) => check::dtype(d).map_err(|e| format!("--kv-dtype: {e}"))?,
        None => dtype,
    };
    let plan = model_config::plan(&cfg, mesh)?;
    let geometry = KvGeometry {
        layers: cfg.layers,
        kv_heads: cfg.kv_heads,
        head_dim: cfg.head_dim,
        dtype_bytes: kv_dtype.size_in_bytes(),
        block_size: a.block_size,
    }
    .split(mesh.mp);
    let blocks = geometry.blocks_in(a.kv_memory).map_err(|e| format!("--kv-memory: {e}"))?;
    let engine_cfg = EngineConfig {
        max_batch_tokens: a.max_batch_tokens,
        max_running: a.max_running,
        max_waiting: a.max_queue,
        block_size: a.block_size,
        blocks,
    };
    if kind == backends::BackendKind::Cpu {
        cores::check_devices(mesh, a.threads, false)?;
    }
    let threads = cores::threads_per_rank(a.threads, mesh);
    // the vocabulary for constrained decoding, read once for every rank; a tokenizer it
    // cannot read leaves structured output refused with the reason
    let guides = Tokenizer::from_dir(&a.model)
        .map_err(|e| e.to_string())
        .and_then(|tok| Guides::from_dir(&a.model, cfg.vocab, &end_tokens(&cfg, &tok)))
        .map(Arc::new);
    let on = OnMesh {
        a: &a,
        cfg: &cfg,
        plan: plan.as_ref(),
        engine: engine_cfg,
        dtype,
        kv_dtype,
        mesh,
        threads,
        guides: &guides,
    };
    Ok(backends::dispatch(kind, mesh, on)?)
}

/// The server on every rank of the mesh.
struct OnMesh<'a> {
    a: &'a ServeArgs,
    cfg: &'a HfConfig,
    plan: Option<&'a redco_core::planning::ShardPlan>,
    engine: EngineConfig,
    dtype: redco_core::DType,
    kv_dtype: redco_core::DType,
    mesh: redco_core::runtime::Mesh,
    threads: usize,
    guides: &'a Result<Arc<Guides>, String>,
}

/// The tokens that end a generation: the generation config's, and the tokenizer's
/// end-of-sequence token.
fn end_tokens(cfg: &HfConfig, tok: &Tokenizer) -> Vec<i64> {
    let mut eos = GenerationConfig::for_model(cfg).stop_tokens;
    eos.extend(tok.eos_id());
    eos
}

impl backends::OnBackend for OnMesh<'_> {
    type Out = ();
    fn run<B: backends::CliBackend>(self, d: backends::Devices<B>) -> redco_core::Result<()> {
        let rank = |b: &B, comm: Option<&Comm<B>>| -> redco_core::Result<()> {
            let plan = model_config::bind(self.plan, comm)?;
            let quant = super::quantize::format(self.a.quantize.as_deref())?;
            let speak = comm.is_none_or(|c| c.rank() == 0);
            let model = super::quantize::load(b, &self.a.model, self.dtype, plan.as_ref(), quant, speak)?;
            let mut engine = Engine::split(b, model, self.engine, self.kv_dtype, self.mesh.mp)?;
            if let Ok(g) = self.guides {
                engine = engine.with_guides(g.clone());
            }
            let sync = comm.map(|c| Lockstep::new(b, c.clone())).transpose()?;
            match &sync {
                Some(s) if s.rank() != 0 => {
                    if launch::is_multi_process() {
                        // a launcher passes SIGTERM and Ctrl-C to every process: a follower
                        // leaves when the leader, having drained, tells it to
                        ignore_stop_signals();
                    }
                    follow(engine, s)
                }
                _ => lead_and_serve(self.a, self.cfg, engine, sync.as_ref(), (self.engine.blocks, self.guides))
                    .map_err(|e| e.into_redco("serve")),
            }
        };
        d.on_mesh(self.mesh, self.threads, rank)
    }
}

/// Rank 0: the HTTP server on a thread of its own, the engine's loop on this one (which
/// holds the rank's communicator); when the loop fails, the server stops.
fn lead_and_serve<B: Backend>(
    a: &ServeArgs,
    cfg: &HfConfig,
    engine: Engine<B, AutoModel<B>>,
    sync: Option<&Lockstep<B>>,
    (blocks, guides): (usize, &Result<Arc<Guides>, String>),
) -> CliResult<()> {
    let tokenizer = Tokenizer::from_dir(&a.model)?;
    let chat_template = ChatTemplate::from_dir(&a.model)?;
    let (handle, inbox) = EngineHandle::channel();
    let eos = end_tokens(cfg, &tokenizer);
    let model_id = a.served_model_name.clone().unwrap_or_else(|| {
        let canon = a.model.canonicalize().unwrap_or_else(|_| a.model.clone());
        canon.file_name().map_or_else(|| "model".to_string(), |n| n.to_string_lossy().into_owned())
    });
    let context = cfg.max_positions.unwrap_or(usize::MAX / 2);
    let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let app = Arc::new(App {
        engine: handle,
        tokenizer,
        model_id: model_id.clone(),
        context,
        vocab: cfg.vocab,
        eos,
        chat_template,
        guides: guides.clone(),
        tool_parser: a.tool_call_parser.as_deref().map(Parser::from_name).transpose()?,
        started,
        latency: Default::default(),
    });
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the HTTP runtime: {e}"))?;
    let listener = rt
        .block_on(tokio::net::TcpListener::bind((a.host.as_str(), a.port)))
        .map_err(|e| format!("cannot listen on {}:{}: {e}", a.host, a.port))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let ranks = sync.map_or(1, Lockstep::size);
    crate::outln!(
        "redco serve: listening on http://{addr} (model {model_id}, {} rank{}, {blocks} KV blocks of {} tokens each in {}, {})",
        ranks,
        if ranks == 1 { "" } else { "s in lockstep" },
        a.block_size,
        a.kv_dtype.as_deref().unwrap_or(&a.dtype),
        if app.chat_template.is_some() { "chat template" } else { "no chat template: completions only" }
    );
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let drain = std::time::Duration::from_secs(a.drain_timeout);
    let http = std::thread::Builder::new()
        .name("redco-http".into())
        .spawn(move || {
            let stop = async move {
                tokio::select! {
                    _ = shutdown() => {}
                    _ = stop_rx => {}
                }
            };
            let r = rt.block_on(redco_serve::http::serve(listener, app, stop, drain));
            // the runtime's tasks, and with them every engine handle, go now
            drop(rt);
            r.map_err(|e| format!("the server failed: {e}"))
        })
        .map_err(|e| format!("cannot start the HTTP thread: {e}"))?;
    let led = lead(engine, inbox, sync);
    drop(stop_tx);
    let served = http.join().map_err(|_| "the HTTP thread panicked".to_string())?;
    led.map_err(|e| format!("the engine stopped: {e}"))?;
    served?;
    crate::outln!("redco serve: stopped");
    Ok(())
}

/// Keeps SIGTERM and SIGINT from ending this process (a follower rank's: the leader's
/// stop command ends it): the signals are taken by a listener that does nothing.
fn ignore_stop_signals() {
    let _ = std::thread::Builder::new().name("redco-signals".into()).spawn(|| {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
        rt.block_on(async {
            use tokio::signal::unix::{signal, SignalKind};
            let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
                return;
            };
            loop {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
        });
    });
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
