//! The `redco` command-line program.

mod cmd;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Large freed buffers are kept and reused instead of being mapped and faulted in again
/// each training step (see `redco_core::cpu::LargeBlocks`).
#[global_allocator]
static ALLOC: redco_core::cpu::LargeBlocks = redco_core::cpu::LargeBlocks::new();

/// redco: automatic distributed training and inference of large language models.
#[derive(Parser)]
#[command(name = "redco", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// The PJRT plugin for `--backend pjrt` (a shared library: libtpu.so, the XLA CPU or
    /// CUDA plugin); default: REDCO_PJRT_PLUGIN.
    #[cfg(feature = "tpu")]
    #[arg(long, global = true, value_name = "PATH")]
    pjrt_plugin: Option<std::path::PathBuf>,
}

#[derive(Subcommand)]
enum Command {
    /// Train a LLaMA (a built-in preset or a Hugging Face directory) on JSONL text or the
    /// bundled synthetic corpus, split over a DP x MP mesh; writes metrics, a loss plot,
    /// checkpoints and the trained model (a Hugging Face directory) into the workdir.
    Train(Box<cmd::train::TrainArgs>),
    /// Generate text from a Hugging Face model directory: one prompt streams token by token,
    /// several run as a left-padded batch; greedy, or sampled with temperature/top-k/top-p.
    Generate(cmd::generate::GenerateArgs),
    /// Convert between a Hugging Face directory and a sharded redco checkpoint
    /// (`--to redco --mesh DPxMP`, or `--to hf` from a workdir or `step-*` directory).
    Convert(cmd::convert::ConvertArgs),
    /// Show how a model splits over a mesh: every parameter's placement and bytes per
    /// device, the communication of one training step, memory for training and inference,
    /// and the smallest model-parallel size that fits a device.
    Plan(cmd::plan::PlanArgs),
    /// Run a Hugging Face model on the inputs of a safetensors file and write its logits,
    /// loss, every parameter's gradient and greedy generations: the standard way to check a
    /// port against transformers (whose script writes the same keys).
    EvalDump(cmd::eval_dump::EvalDumpArgs),
    /// Show the backends compiled in, the devices found and the threads used.
    Info,
}

/// The library's log events on stderr: warnings (a checkpoint without checksums, a
/// resume with nothing to resume, skipped steps) and errors by default; `RUST_LOG=info`,
/// `debug` or `trace` shows more, `RUST_LOG=off` nothing.
fn init_logging() {
    let level = match std::env::var("RUST_LOG").map(|v| v.trim().to_ascii_lowercase()).as_deref() {
        Ok("off") => tracing::level_filters::LevelFilter::OFF,
        Ok("error") => tracing::level_filters::LevelFilter::ERROR,
        Ok("info") => tracing::level_filters::LevelFilter::INFO,
        Ok("debug") => tracing::level_filters::LevelFilter::DEBUG,
        Ok("trace") => tracing::level_filters::LevelFilter::TRACE,
        _ => tracing::level_filters::LevelFilter::WARN,
    };
    let _ = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .with_target(false)
        .without_time()
        .with_ansi(false)
        .try_init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    #[cfg(feature = "tpu")]
    cmd::pjrt::set_plugin(cli.pjrt_plugin.clone());
    if let Err(e) = cmd::launch::init() {
        cmd::out::warn(format_args!("redco: error: {e}"));
        return ExitCode::from(2);
    }
    let r = match cli.command {
        Command::Train(a) => cmd::train::run(*a),
        Command::Generate(a) => cmd::generate::run(a),
        Command::Convert(a) => cmd::convert::run(a),
        Command::Plan(a) => cmd::plan::run(a),
        Command::EvalDump(a) => cmd::eval_dump::run(a),
        Command::Info => cmd::info::run(),
    };
    let rank = cmd::launch::world();
    // the command's result, then whether its output reached stdout
    let r = r.and_then(|()| cmd::out::finish().map_or(Ok(()), Err));
    match r {
        Ok(()) => {
            cmd::launch::finish(true, 0);
            ExitCode::SUCCESS
        }
        Err(e) => {
            if rank.size > 1 {
                cmd::out::warn(format_args!("redco: error: rank {} on {}: {e}", rank.rank, rank.host));
            } else {
                cmd::out::warn(format_args!("redco: error: {e}"));
            }
            cmd::launch::finish(false, 2);
            ExitCode::from(2)
        }
    }
}
