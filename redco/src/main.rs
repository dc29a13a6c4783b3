//! The `redco` command-line program.

mod cmd;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use std::process::ExitCode;

/// Large freed buffers are kept and reused instead of being mapped and faulted in again
/// each training step (see `redco_cpu::LargeBlocks`).
#[global_allocator]
static ALLOC: redco_cpu::LargeBlocks = redco_cpu::LargeBlocks::new();

/// redco: automatic distributed training and inference of large language models.
#[derive(Parser)]
#[command(name = "redco", about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// The PJRT plugin for `--backend pjrt` (a shared library: libtpu.so, the XLA CPU or
    /// CUDA plugin); default: REDCO_PJRT_PLUGIN.
    #[cfg(feature = "tpu")]
    #[arg(long, global = true, value_name = "PATH")]
    pjrt_plugin: Option<std::path::PathBuf>,
    /// Run f32 matmuls on `--backend cuda` as TF32 on tensor cores (torch's `allow_tf32`:
    /// faster, about 10 mantissa bits in the products); off by default.
    #[cfg(feature = "cuda")]
    #[arg(long, global = true)]
    cuda_tf32: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Train a LLaMA (a built-in preset or a Hugging Face directory) on JSONL text or the
    /// bundled synthetic corpus, split over a DP x MP mesh; writes metrics, TensorBoard
    /// scalars, a loss plot, a log (redco.log), checkpoints and the trained model (a Hugging
    /// Face directory) into the workdir.
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
    /// Serve a Hugging Face model over HTTP with OpenAI's API (/v1/completions,
    /// /v1/chat/completions, /v1/models, /health, /metrics): continuous batching over a paged
    /// KV cache; runs until SIGTERM or Ctrl-C, then drains the requests in flight.
    Serve(cmd::serve::ServeArgs),
    /// Run a Hugging Face model on the inputs of a safetensors file and write its logits,
    /// loss, every parameter's gradient and greedy generations: the standard way to check a
    /// port against transformers (whose script writes the same keys).
    EvalDump(cmd::eval_dump::EvalDumpArgs),
    /// A causal model's perplexity on a text file, counted as llama.cpp's `llama-perplexity`
    /// counts it (chunks of --seq-len tokens, the second half of each scored).
    Perplexity(cmd::perplexity::PerplexityArgs),
    /// Show the backends compiled in, the devices found and the threads used.
    Info(cmd::info::InfoArgs),
    /// Print a shell completion script: `redco completions bash > /etc/bash_completion.d/redco`
    /// (bash, zsh, fish, elvish or powershell).
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
}

/// The command line, with `--version` naming the git revision and the compiled backends.
fn command() -> clap::Command {
    let version: &'static str = Box::leak(cmd::info::version().into_boxed_str());
    Cli::command().version(version)
}

fn main() -> ExitCode {
    // a program's choice, before any thread starts (see redco_cpu::malloc)
    redco_cpu::malloc::tune();
    let cli = match Cli::from_arg_matches(&command().get_matches()) {
        Ok(c) => c,
        Err(e) => e.exit(),
    };
    cmd::logging::init();
    #[cfg(feature = "tpu")]
    cmd::pjrt::set_plugin(cli.pjrt_plugin.clone());
    #[cfg(feature = "cuda")]
    cmd::cuda::set_tf32(cli.cuda_tf32);
    if let Err(e) = cmd::launch::init() {
        cmd::out::warn(format_args!("redco: error: {e}"));
        return ExitCode::from(2);
    }
    let r: cmd::error::CliResult<()> = match cli.command {
        Command::Train(a) => cmd::train::run(*a),
        Command::Generate(a) => cmd::generate::run(a),
        Command::Convert(a) => cmd::convert::run(a),
        Command::Plan(a) => cmd::plan::run(a),
        Command::Serve(a) => cmd::serve::run(a),
        Command::EvalDump(a) => cmd::eval_dump::run(a),
        Command::Perplexity(a) => cmd::perplexity::run(a),
        Command::Info(a) => cmd::info::run(a),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut command(), "redco", &mut std::io::stdout());
            Ok(())
        }
    };
    let rank = cmd::launch::world();
    // the command's result, then whether its output reached stdout
    let r = r.and_then(|()| cmd::out::finish().map_or(Ok(()), |m| Err(m.into())));
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

#[cfg(test)]
mod vocabulary {
    //! One command-line vocabulary: the same flag for the same concept in every command.

    use super::command;

    /// Spellings of a concept that the shared vocabulary replaces, and the flag to use.
    const SYNONYMS: [(&str, &str); 10] = [
        ("batch", "batch-size"),
        ("seq", "seq-len"),
        ("seq-length", "seq-len"),
        ("max-len", "seq-len"),
        ("num-threads", "threads"),
        ("model-dir", "model"),
        ("device", "backend"),
        ("num-steps", "steps"),
        ("max-tokens", "max-new-tokens"),
        ("precision", "dtype"),
    ];

    /// Flags several commands share, with the default each must have where it has one.
    const SHARED: [(&str, Option<&str>); 7] = [
        ("model", None),
        ("mesh", Some("1x1")),
        ("backend", Some("cpu")),
        ("dtype", None),
        ("threads", None),
        ("batch-size", None),
        ("seq-len", None),
    ];

    #[test]
    fn every_command_spells_a_concept_the_same_way() {
        let cli = command();
        let mut seen = std::collections::BTreeMap::<&str, Vec<String>>::new();
        for sub in cli.get_subcommands() {
            for arg in sub.get_arguments() {
                let Some(long) = arg.get_long() else { continue };
                if let Some((_, use_)) = SYNONYMS.iter().find(|(s, _)| *s == long) {
                    panic!("`redco {} --{long}`: the shared vocabulary says --{use_}", sub.get_name());
                }
                if let Some((name, default)) = SHARED.iter().find(|(n, _)| *n == long) {
                    seen.entry(name).or_default().push(sub.get_name().to_string());
                    if let Some(d) = default {
                        let got: Vec<String> =
                            arg.get_default_values().iter().map(|v| v.to_string_lossy().into()).collect();
                        assert_eq!(got, [d.to_string()], "`redco {} --{long}` default", sub.get_name());
                    }
                }
            }
        }
        // the concepts really are shared (the test would pass vacuously otherwise)
        for (name, cmds) in [("mesh", 4), ("model", 4), ("batch-size", 2), ("seq-len", 2), ("dtype", 5)] {
            assert!(seen.get(name).is_some_and(|c| c.len() >= cmds), "--{name} in {:?}", seen.get(name));
        }
    }

    #[test]
    fn version_names_the_revision_and_the_backends() {
        let v = command().render_version();
        assert!(v.contains(env!("CARGO_PKG_VERSION")) && v.contains("git ") && v.contains("backends: cpu"), "{v}");
    }
}
