//! `redco train`: a decoder-only model (a Hugging Face LLaMA, GPT-J or OPT directory, or a
//! built-in preset) trained on text (JSONL, Parquet, Arrow, `datasets` directories:
//! [`data`]) or the bundled synthetic corpus ([`corpus`]), or a T5 on pairs ([`seq2seq`]);
//! LoRA adapters instead of full fine-tuning ([`lora`]); split over a DP x MP mesh of ranks
//! on any compiled-in backend, through the three functions. The workdir ends up a Hugging
//! Face model directory (config.json, model.safetensors, tokenizer) beside metrics.jsonl,
//! tensorboard/, loss.png, redco.log and checkpoints/.
//!
//! [`run`] checks the flags, claims the workdir ([`RunDir`]) and reads the model's
//! configuration, then hands over to [`lm::run`] or [`seq2seq::run`]; both end through
//! [`finish`].

mod args;
mod corpus;
mod data;
mod finish;
mod lm;
mod lora;
mod seq2seq;

pub use args::TrainArgs;

use super::backends::{self, BackendKind};
use super::{check, cores};
use crate::cmd::error::CliResult;
use redco_core::nn::lora::LoraConfig;
use redco_core::runtime::Mesh;
use redco_core::DType;
use redco_models::hf::config::HfConfig;
use redco_models::hf::tokenizer::Tokenizer;
use redco_models::presets::{self, SyntheticText};
use redco_pipeline::{ClaimOptions, RunDir};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// What every training run has settled before it reads its data: the backend, mesh and
/// dtype, the claimed workdir, the run's identity, and where the model comes from.
pub(super) struct RunSetup {
    /// The backend.
    kind: BackendKind,
    /// The mesh.
    mesh: Mesh,
    /// The compute dtype.
    compute: DType,
    /// The run's identity (checked on resume).
    identity: BTreeMap<String, String>,
    /// The claimed workdir (locked by the leader until the run ends).
    run: RunDir,
    /// The step of the checkpoint it resumes from, when there is one.
    resumed: Option<u64>,
    /// Whether this process writes the run's files and prints.
    leader: bool,
    /// LoRA adapters (the base frozen), or full fine-tuning.
    lora: Option<LoraConfig>,
    /// The model's configuration.
    cfg: HfConfig,
    /// Where its tokenizer (and, for `--model`, its weights) are.
    tok_dir: PathBuf,
    /// Where the default `--seq-len` came from, when it is a default.
    seq_from: Option<String>,
}

/// Runs `redco train`.
pub fn run(mut a: TrainArgs) -> CliResult<()> {
    let kind = backends::backend(&a.backend)?;
    let mesh = check::mesh(&a.mesh)?;
    if !a.batch_size.is_multiple_of(mesh.dp) {
        return Err(format!(
            "--batch-size {} must be divisible by the mesh's data-parallel size {} (--mesh {mesh})",
            a.batch_size, mesh.dp
        )
        .into());
    }
    if kind == BackendKind::Cpu {
        cores::check_devices(mesh, a.threads, a.oversubscribe)?;
    }
    let compute = check::dtype(&a.dtype)?;
    match a.zero {
        Some(1) if a.optimizer != "adamw" => {
            return Err(format!(
                "--zero 1 shards AdamW's moments; --optimizer {} has none to shard (--zero 2 shards its masters and \
                 gradients)",
                a.optimizer
            )
            .into())
        }
        _ => {}
    }
    let lora = a.lora.config()?;
    if lora.is_some() && a.lora.peft() && a.model.is_none() {
        return Err("--lora-export peft writes adapters for a base model on disk: give it with --model".into());
    }
    let seq_from = match a.seq_len {
        Some(_) => None,
        None => {
            let (n, why) = args::default_seq_len(&a)?;
            a.seq_len = Some(n);
            Some(why)
        }
    };
    if a.seq() < 2 {
        return Err(match seq_from {
            Some(why) => {
                format!("the default --seq-len is {} ({why}): too short to train on; give --seq-len", a.seq()).into()
            }
            None => "--seq-len must be at least 2".into(),
        });
    }
    std::fs::create_dir_all(&a.workdir).map_err(|e| format!("cannot create workdir {}: {e}", a.workdir.display()))?;
    let w = a.workdir.clone();
    // under a launcher, rank 0's process prints and writes the run's files
    let leader = super::launch::is_leader();
    let resume = a.resume || a.resume_from.is_some();
    let resumed = if resume { args::resume_step(&a)? } else { None };
    if a.epochs.is_none() && args::already_past(&a, resumed, a.steps.unwrap_or(300), leader) {
        return Ok(());
    }
    let mut identity = args::run_identity(&a)?;
    if let Some(l) = &lora {
        identity.insert("lora".into(), lora::identity(l));
    }
    // the workdir is this run's from here on: locked (by the leader) until the run ends, and
    // claimed (a resumed run is the run that wrote its checkpoint, the vocabulary aside,
    // which is known once the tokenizer is read; a fresh one replaces no earlier run unless
    // --overwrite) before anything is written into it
    let claim = ClaimOptions {
        resume,
        resume_from: a.resume_from.clone(),
        overwrite: a.overwrite,
        identity: identity.clone(),
        pending: vec!["vocab".into()],
    };
    let run = RunDir::claim(&w, leader, &claim)?;

    // the model's configuration and where its tokenizer is
    let (cfg, tok_dir) = match (&a.preset, &a.model) {
        (Some(p), _) => {
            // every process writes the same tokenizer (atomically) and reads it back
            if a.data.is_some() {
                presets::write_byte_tokenizer(&w)?;
            } else {
                SyntheticText::new(64, a.seq(), a.seed ^ corpus::SEED_MIX).write_tokenizer(&w)?;
            }
            let vocab = Tokenizer::from_dir(&w)?.vocab_size();
            let raw = presets::config(p, vocab)?;
            (HfConfig::from_json(&raw.to_string())?, w.clone())
        }
        (None, Some(m)) => (HfConfig::from_dir(m)?, m.clone()),
        (None, None) => return Err("give a model: --preset llama-tiny, or --model DIR".into()),
    };
    let t5 = cfg.model_type == "t5";
    if a.zero == Some(3) && t5 {
        return Err("--zero 3 gathers parameters per decoder layer, implemented for the decoder-only models (llama, \
                    gptj, opt); this model is t5 (--zero 2 shards its masters, optimizer state and gradients; \
                    --recompute block or selective cuts its activations)"
            .into());
    }
    let setup = RunSetup { kind, mesh, compute, identity, run, resumed, leader, lora, cfg, tok_dir, seq_from };
    if t5 {
        return seq2seq::run(&a, setup);
    }
    lm::run(&a, setup)
}
