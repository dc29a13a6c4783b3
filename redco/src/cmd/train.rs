//! `redco train`: a LLaMA (a Hugging Face directory or a built-in preset) trained on text
//! (JSONL, Parquet, Arrow, `datasets` directories: [`super::data`]) or the bundled synthetic
//! corpus (a T5 on pairs: [`super::seq2seq`]), split over a DP x MP mesh of ranks (CPU threads
//! sharing the cores, or one wgpu device each with `--backend wgpu`), through the three
//! functions. The workdir ends up a Hugging Face model directory (config.json,
//! model.safetensors, tokenizer) beside metrics.jsonl, tensorboard/, loss.png, redco.log and checkpoints/.

use super::check;
use super::common;
use clap::Args;
use redco_core::nn::lora::{add_lora, LoraConfig};
use redco_core::optim::{AdamWConfig, Decay, Schedule};
use redco_core::pipeline::checkpoint::Checkpointer;
use redco_core::pipeline::data::Dataset;
use redco_core::pipeline::workdir;
use redco_core::pipeline::{Batch, ClaimOptions, Deployer, OptimizerConfig, RunDir, StepCtx, TrainConfig, Trainer};
use redco_core::{Backend, DType, Error, Result, Tensor};
use redco_models::auto::AutoModel;
use redco_models::generate::{generate_with, GenerationConfig, Sampling};
use redco_models::hf::config::HfConfig;
use redco_models::hf::tokenizer::Tokenizer;
use redco_models::hf::vocab;
use redco_models::presets::{self, SyntheticText};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Arguments of `redco train`.
#[derive(Args)]
#[command(allow_negative_numbers = true)]
pub struct TrainArgs {
    /// Built-in model: llama-tiny (4 layers, hidden 128; minutes on two cores) or llama-small
    /// (6 layers, hidden 512). Starts from random weights.
    #[arg(long, conflicts_with = "model")]
    pub preset: Option<String>,
    /// A Hugging Face model directory to fine-tune (LLaMA, GPT-J or OPT on text; T5 on
    /// pairs, see --source-field: config.json, safetensors, tokenizer.json).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// Training data: a JSONL file (one JSON object per line), a Parquet file, an Arrow IPC
    /// file (.arrow, .ipc, .feather) or a directory written by Hugging Face datasets'
    /// save_to_disk (a DatasetDict's train split, see --data-split); each record's
    /// --text-field is read (a T5's --source-field and --target-field). Default: the bundled
    /// synthetic corpus (made-up words from a Markov chain of known entropy), as words for a
    /// preset and as text encoded by the model's own tokenizer for --model (a smoke test: a
    /// T5 needs --data).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// The split of a DatasetDict directory given as --data (default: train).
    #[arg(long, requires = "data")]
    pub data_split: Option<String>,
    /// The field holding the text (a JSONL key or a table column).
    #[arg(long, default_value = "text")]
    pub text_field: String,
    /// Encoder-decoder models (T5): the field holding each pair's source text (the
    /// encoder input; at most --seq-len tokens).
    #[arg(long)]
    pub source_field: Option<String>,
    /// Encoder-decoder models (T5): the field holding each pair's target text (the
    /// labels; at most --target-len tokens).
    #[arg(long)]
    pub target_field: Option<String>,
    /// Encoder-decoder models (T5): tokens per target at most (default: --seq-len).
    #[arg(long, value_parser = check::count)]
    pub target_len: Option<usize>,
    /// LoRA adapters instead of full fine-tuning.
    #[command(flatten)]
    pub lora: super::lora::LoraArgs,
    /// Mesh as DPxMP: data-parallel x tensor-parallel ranks (1x2 splits every layer in two).
    #[arg(long, default_value = "1x1")]
    pub mesh: String,
    /// Compute backend: cpu, wgpu (the `wgpu` feature), pjrt (the `tpu` feature) or cuda (the `cuda` feature); one device per rank.
    #[arg(long, default_value = "cpu")]
    pub backend: String,
    /// pjrt: run every op as its own program instead of compiling the whole training step
    /// into one (for debugging; bf16/f16, SGD and ZeRO-1 always run op by op).
    #[arg(long)]
    pub eager: bool,
    /// Compute dtype: f32, or bf16 / f16 (with f32 master weights).
    #[arg(long, default_value = "f32")]
    pub dtype: String,
    /// Optimizer steps (default 300, unless --epochs is given).
    #[arg(long, value_parser = check::count_u64, conflicts_with = "epochs")]
    pub steps: Option<u64>,
    /// Passes over the data (instead of --steps).
    #[arg(long, value_parser = check::positive)]
    pub epochs: Option<f64>,
    /// Sequences per optimizer step (split over DP).
    #[arg(long, value_parser = check::count, default_value_t = 16)]
    pub batch_size: usize,
    /// Tokens per training sequence (default: 64 for a preset; for --model, the model's
    /// context less one (the labels are the inputs shifted by one) up to 512, or 64 for a
    /// model without a fixed context (T5); printed with the run).
    #[arg(long, value_parser = check::count)]
    pub seq_len: Option<usize>,
    /// Optimizer: adamw or sgd (with momentum 0.9).
    #[arg(long, default_value = "adamw")]
    pub optimizer: String,
    /// Peak learning rate.
    #[arg(long, value_parser = check::positive, default_value_t = 3e-3)]
    pub lr: f64,
    /// Learning-rate schedule after warmup: cosine, linear or constant.
    #[arg(long, default_value = "cosine")]
    pub schedule: String,
    /// Warmup steps.
    #[arg(long, default_value_t = 20)]
    pub warmup: u64,
    /// Decoupled weight decay.
    #[arg(long, value_parser = check::non_negative, default_value_t = 0.01)]
    pub weight_decay: f64,
    /// Clip the global gradient norm to this.
    #[arg(long, value_parser = check::positive_or_inf, default_value_t = 1.0)]
    pub clip_norm: f64,
    /// Save a checkpoint every N steps (and at the end).
    #[arg(long, value_parser = check::count_u64, default_value_t = 100)]
    pub checkpoint_every: u64,
    /// Where metrics, TensorBoard scalars, the loss plot, the log (redco.log),
    /// checkpoints and the trained model go.
    #[arg(long, default_value = "workdir")]
    pub workdir: PathBuf,
    /// Continue from the newest checkpoint in the workdir (refused when it is corrupt, or
    /// when the seed, data, model, dtype, sequence length or vocabulary differ from the run
    /// that wrote it).
    #[arg(long)]
    pub resume: bool,
    /// Continue from this checkpoint of the workdir (a `checkpoints/step-*` directory)
    /// instead of the newest, e.g. an older one when the newest is corrupt.
    #[arg(long, value_name = "DIR")]
    pub resume_from: Option<PathBuf>,
    /// Replace an earlier run in the workdir (its checkpoints and metrics); without it, a
    /// run that does not resume refuses a workdir that holds one.
    #[arg(long, conflicts_with_all = ["resume", "resume_from"])]
    pub overwrite: bool,
    /// Random seed (weights, data order, dropout).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// CPU threads in all (shared by the ranks; default: every core).
    #[arg(long, value_parser = check::threads)]
    pub threads: Option<usize>,
    /// Allow more ranks than cores (slow; for trying meshes on a small machine).
    #[arg(long)]
    pub oversubscribe: bool,
    /// The prompt of the sample printed at the end (default: the start of a held-out text).
    #[arg(long)]
    pub prompt: Option<String>,
    /// New tokens of that sample.
    #[arg(long, default_value_t = 24)]
    pub sample_tokens: usize,
    /// Start each data-parallel gradient bucket's all-reduce during backward (helps where a
    /// core is free for communication; see `TrainConfig::overlap_grad_sync`).
    #[arg(long)]
    pub overlap_grad_sync: bool,
    /// Seconds a collective waits for the other ranks before the run fails (or, over
    /// processes, the watchdog names the missing rank and aborts the job). Default 120.
    #[arg(long, value_parser = check::positive)]
    pub timeout: Option<f64>,
    /// Also write each rank's collective calls during the training steps, as JSON, to this
    /// path with `{rank}` replaced by the rank (e.g. `comm-{rank}.json`).
    #[arg(long)]
    pub comm_stats: Option<PathBuf>,
}

/// The sequence length of a run that gives no `--seq-len` with a preset.
const PRESET_SEQ_LEN: usize = 64;
/// The longest default sequence length taken from a model's context.
const MAX_DEFAULT_SEQ_LEN: usize = 512;

impl TrainArgs {
    /// Tokens per training sequence (`run` resolves a missing `--seq-len` with
    /// [`default_seq_len`] before anything reads it).
    pub(super) fn seq(&self) -> usize {
        self.seq_len.unwrap_or(PRESET_SEQ_LEN)
    }
}

/// The sequence length when `--seq-len` is not given, and where it comes from (printed with
/// the run): a preset's 64, or the model's context less one (the labels are the inputs
/// shifted by one) up to [`MAX_DEFAULT_SEQ_LEN`], or 64 for a model without a fixed context.
fn default_seq_len(a: &TrainArgs) -> std::result::Result<(usize, String), String> {
    let Some(dir) = &a.model else { return Ok((PRESET_SEQ_LEN, "the preset's default".into())) };
    let cfg = HfConfig::from_dir(dir).map_err(err)?;
    Ok(match cfg.max_positions {
        Some(ctx) if ctx.saturating_sub(1) <= MAX_DEFAULT_SEQ_LEN => {
            (ctx.saturating_sub(1), format!("the model's context of {ctx} less one for the shifted labels"))
        }
        Some(ctx) => (MAX_DEFAULT_SEQ_LEN, format!("the model's context of {ctx}, capped at {MAX_DEFAULT_SEQ_LEN}")),
        None => (PRESET_SEQ_LEN, format!("{} has no fixed context", cfg.model_type)),
    })
}

/// Writes each local rank's collective counts as JSON, `{rank, stats: [{kind, axis, calls,
/// bytes}]}`, one file per rank (`{rank}` in `path` replaced by it).
fn write_comm_stats(path: &Path, report: &redco_core::pipeline::FitReport) -> Result<()> {
    for (rank, stats) in &report.comm {
        let file = PathBuf::from(path.to_string_lossy().replace("{rank}", &rank.to_string()));
        let rows: Vec<serde_json::Value> = stats
            .entries()
            .into_iter()
            .map(|(k, axis, c)| {
                serde_json::json!({"kind": format!("{k:?}"), "axis": format!("{axis:?}"), "calls": c.calls, "bytes": c.bytes})
            })
            .collect();
        let text = serde_json::to_string_pretty(&serde_json::json!({"rank": rank, "stats": rows}))
            .map_err(|e| Error::invalid("comm-stats", e.to_string()))?;
        redco_core::pipeline::checkpoint::write_atomic(&file, text.as_bytes())?;
    }
    Ok(())
}

/// Sequences of `seq_len + 1` tokens from the bundled corpus, generated on demand.
struct Synthetic(SyntheticText, u64, usize);

impl Dataset<Vec<i64>> for Synthetic {
    fn len(&self) -> usize {
        self.2
    }
    fn get(&self, i: usize) -> Result<Vec<i64>> {
        Ok(self.0.ids(self.1 + i as u64))
    }
}

/// The bundled corpus for a model with a tokenizer of its own: each sequence's text encoded
/// by that tokenizer (`<s>` first, `</s>` after each text), texts appended until there are
/// `len` tokens, each sequence's ids checked against the model's vocabulary.
struct EncodedSynthetic {
    text: SyntheticText,
    tok: Tokenizer,
    /// Tokens per sequence.
    len: usize,
    /// The first text's index.
    offset: u64,
    /// Sequences.
    count: usize,
    /// The model's vocabulary size.
    vocab: usize,
}

impl EncodedSynthetic {
    fn sequence(&self, i: u64) -> Result<Vec<i64>> {
        let mut ids = Vec::with_capacity(self.len + 16);
        let mut k = 0u64;
        while ids.len() < self.len {
            // the texts after the first are far from every other sequence's
            let text = self.text.text(i.wrapping_add(k.wrapping_mul(1 << 44)));
            let before = ids.len();
            ids.extend(self.tok.encode(&text, true)?);
            ids.extend(self.tok.eos_id());
            if ids.len() == before {
                return Err(Error::invalid(
                    "data",
                    format!("{} encodes the bundled corpus to no tokens; give --data", self.tok.source().display()),
                ));
            }
            k += 1;
        }
        ids.truncate(self.len);
        let source = format!("the bundled corpus (sequence {i}) encoded by {}", self.tok.source().display());
        vocab::check_ids(&ids, self.vocab, false, &source, Some(&self.tok))?;
        Ok(ids)
    }
}

impl Dataset<Vec<i64>> for EncodedSynthetic {
    fn len(&self) -> usize {
        self.count
    }
    fn get(&self, i: usize) -> Result<Vec<i64>> {
        self.sequence(self.offset + i as u64)
    }
}

fn collate_fn<B: Backend>(b: &B, examples: &[Vec<i64>]) -> Result<Batch<B>> {
    let t = examples[0].len();
    let ids: Vec<i64> = examples.iter().flatten().copied().collect();
    Ok(Batch::from([("input_ids".into(), Tensor::from_vec(b, ids, [examples.len(), t])?)]))
}

fn loss_fn<B: Backend>(ctx: &StepCtx<B>, model: &AutoModel<B>, batch: &Batch<B>) -> Result<Tensor<B>> {
    // LoRA dropout masks from the step (a no-op without adapters)
    redco_core::nn::lora::set_dropout_seed(model, ctx.rng(redco_core::nn::lora::DROPOUT_SITE));
    lm_loss(model, batch)
}

/// The next-token loss: the model shifts the labels internally, as transformers does.
fn lm_loss<B: Backend>(model: &AutoModel<B>, batch: &Batch<B>) -> Result<Tensor<B>> {
    model.loss(&batch["input_ids"], None, &batch["input_ids"])
}

/// The held-out loss of a batch.
fn eval_fn<B: Backend>(_: &StepCtx<B>, model: &AutoModel<B>, batch: &Batch<B>) -> Result<f64> {
    model.loss(&batch["input_ids"], None, &batch["input_ids"])?.replicate()?.to_scalar()
}

/// The model and how its training is evaluated, whatever the backend.
struct Job {
    /// The model's configuration.
    cfg: HfConfig,
    /// The checkpoint to fine-tune, or none for random weights from `seed`.
    from: Option<PathBuf>,
    /// The seed of the random weights.
    seed: u64,
    /// Held-out sequences, evaluated every `every` steps.
    held_out: Vec<Vec<i64>>,
    /// Evaluation (and checkpoint) interval.
    every: u64,
    /// LoRA adapters (the base frozen), or full fine-tuning.
    lora: Option<LoraConfig>,
}

impl Job {
    /// The trainer on backend `B` (its model constructor runs on every rank; the plan then
    /// keeps each rank's slice).
    fn trainer<B: Backend>(&self, config: TrainConfig) -> Trainer<AutoModel<B>, Vec<i64>, B> {
        let (cfg, seed, from, lora) = (self.cfg.clone(), self.seed, self.from.clone(), self.lora.clone());
        let model_fn = move |b: &B| {
            let mut m = match &from {
                Some(dir) => AutoModel::from_pretrained(b, dir, DType::F32, None)?,
                None => AutoModel::new(b, &cfg, DType::F32, seed)?,
            };
            if let Some(l) = &lora {
                add_lora(&mut m, l, seed)?;
            }
            Ok(m)
        };
        Trainer::for_backend(model_fn, collate_fn::<B>, loss_fn::<B>, config)
            .with_eval(self.held_out.clone(), eval_fn::<B>, self.every, true)
            .observe_all(redco::observe::standard())
    }

    /// The PJRT trainer: the whole step compiled into one program, unless `eager` or the
    /// configuration needs op-by-op (said on the leader's output).
    #[cfg(feature = "tpu")]
    fn pjrt_trainer(
        &self,
        config: TrainConfig,
        eager: bool,
        timeout: std::time::Duration,
        leader: bool,
    ) -> Trainer<AutoModel<redco_tpu::Pjrt>, Vec<i64>, redco_tpu::Pjrt> {
        use redco_tpu::Tracer;
        let why = if eager {
            Some("--eager".to_string())
        } else if self.lora.is_some() {
            Some("LoRA freezes the base model; a compiled step trains every parameter".into())
        } else if super::launch::is_multi_process() {
            Some("ranks in several processes: a compiled step needs one client over every device".into())
        } else {
            redco_core::pipeline::compiled::ineligible(&config)
        };
        let trainer = self.trainer(config);
        if let Some(why) = why {
            if leader {
                crate::outln!("pjrt: every op runs as its own program ({why})");
            }
            return trainer;
        }
        if leader {
            crate::outln!("pjrt: the training step is compiled into one program");
        }
        let (cfg, seed) = (self.cfg.clone(), self.seed);
        let compiler = redco_tpu::PjrtStepCompiler::new(
            move |t: &Tracer| AutoModel::new(t, &cfg, DType::F32, seed),
            |m: &AutoModel<Tracer>, b: &Batch<Tracer>| lm_loss(m, b),
            timeout,
        );
        trainer.with_compiled_step(std::sync::Arc::new(compiler))
    }
}

/// The Trainer's options from the command line, for `examples` training examples.
pub(super) fn train_config(
    a: &TrainArgs,
    examples: usize,
    identity: BTreeMap<String, String>,
    compute: DType,
    vocab: usize,
) -> std::result::Result<TrainConfig, String> {
    let steps = match (a.steps, a.epochs) {
        (Some(s), _) => s,
        (None, Some(e)) => ((e * examples as f64) / a.batch_size as f64).ceil().max(1.0) as u64,
        (None, None) => 300,
    };
    let decay = match a.schedule.as_str() {
        "cosine" => Decay::Cosine,
        "linear" => Decay::Linear,
        "constant" => Decay::Constant,
        s => return Err(format!("--schedule {s}: unknown schedule (use cosine, linear or constant)")),
    };
    let optimizer = match a.optimizer.as_str() {
        "adamw" => OptimizerConfig::AdamW(AdamWConfig { weight_decay: a.weight_decay, ..Default::default() }),
        "sgd" => OptimizerConfig::Sgd { momentum: 0.9, weight_decay: a.weight_decay },
        o => return Err(format!("--optimizer {o}: unknown optimizer (use adamw or sgd)")),
    };
    Ok(TrainConfig {
        batch_size: a.batch_size,
        steps,
        schedule: Schedule { peak: a.lr, warmup: a.warmup.min(steps / 2), total: steps, decay },
        optimizer,
        clip_norm: Some(a.clip_norm),
        checkpoint_every: Some(a.checkpoint_every),
        compute_dtype: compute,
        tokens_key: Some("input_ids".into()),
        vocab_size: Some(vocab),
        overlap_grad_sync: a.overlap_grad_sync,
        resume_from: a.resume_from.clone(),
        identity,
        overwrite: a.overwrite,
        ..Default::default()
    })
}

/// What makes this run this run, checked when it is resumed: the seed (it also generates
/// the bundled corpus), the data and its digest, the model, the dtype and the sequence
/// length (the vocabulary is added once the tokenizer is read).
fn run_identity(a: &TrainArgs) -> std::result::Result<BTreeMap<String, String>, String> {
    let model = match (&a.preset, &a.model) {
        (Some(p), _) => format!("preset {p}"),
        (None, Some(m)) => m.canonicalize().unwrap_or_else(|_| m.clone()).display().to_string(),
        (None, None) => String::new(),
    };
    let data = match &a.data {
        Some(p) => {
            let sum = super::data::data_sum(p).map_err(err)?;
            let split = a.data_split.as_ref().map(|s| format!(", split {s}")).unwrap_or_default();
            format!("{} ({} bytes, xxh3 {}{split})", p.display(), sum.bytes, sum.xxh3)
        }
        None => "the bundled synthetic corpus".into(),
    };
    Ok(BTreeMap::from([
        ("seed".to_string(), a.seed.to_string()),
        ("model".to_string(), model),
        ("data".to_string(), data),
        ("dtype".to_string(), a.dtype.clone()),
        ("seq_len".to_string(), a.seq().to_string()),
    ]))
}

fn err(e: Error) -> String {
    e.to_string()
}

/// The step of the checkpoint a `--resume` run would continue from, when the workdir holds
/// one (read-only: every process asks, so that all of them stop together when the run is
/// already past `--steps`).
fn resume_step(a: &TrainArgs) -> std::result::Result<Option<u64>, String> {
    let ckpt = Checkpointer::new(&a.workdir, 0);
    Ok(workdir::resume_target(&ckpt, a.resume_from.as_deref()).map_err(err)?.map(|(step, _)| step))
}

/// When the checkpoint a resumed run starts from is at or past its last step: says so (the
/// run is already done; nothing is trained or rewritten) and returns true.
pub(super) fn already_past(a: &TrainArgs, resumed: Option<u64>, steps: u64, leader: bool) -> bool {
    let Some(at) = resumed.filter(|at| *at >= steps) else { return false };
    if leader {
        let how = match a.epochs {
            Some(e) => format!("--epochs {e} ({steps} steps)"),
            None => format!("--steps {steps}"),
        };
        crate::outln!(
            "the run in {} is already at step {at}, past {how}: nothing to train and nothing \
             rewritten (give a larger --steps to train on)",
            a.workdir.display()
        );
    }
    true
}

/// Runs `redco train`.
pub fn run(mut a: TrainArgs) -> std::result::Result<(), String> {
    let kind = common::backend(&a.backend)?;
    let mesh = common::mesh(&a.mesh)?;
    if !a.batch_size.is_multiple_of(mesh.dp) {
        return Err(format!(
            "--batch-size {} must be divisible by the mesh's data-parallel size {} (--mesh {mesh})",
            a.batch_size, mesh.dp
        ));
    }
    if kind == common::BackendKind::Cpu {
        common::check_devices(mesh, a.threads, a.oversubscribe)?;
    }
    let compute = common::dtype(&a.dtype)?;
    let lora = a.lora.config()?;
    if lora.is_some() && a.lora.peft() && a.model.is_none() {
        return Err("--lora-export peft writes adapters for a base model on disk: give it with --model".into());
    }
    let seq_from = match a.seq_len {
        Some(_) => None,
        None => {
            let (n, why) = default_seq_len(&a)?;
            a.seq_len = Some(n);
            Some(why)
        }
    };
    if a.seq() < 2 {
        return Err(match seq_from {
            Some(why) => format!("the default --seq-len is {} ({why}): too short to train on; give --seq-len", a.seq()),
            None => "--seq-len must be at least 2".into(),
        });
    }
    std::fs::create_dir_all(&a.workdir).map_err(|e| format!("cannot create workdir {}: {e}", a.workdir.display()))?;
    let w = a.workdir.clone();
    // under a launcher, rank 0's process prints and writes the run's files
    let leader = super::launch::is_leader();
    let resume = a.resume || a.resume_from.is_some();
    let resumed = if resume { resume_step(&a)? } else { None };
    if a.epochs.is_none() && already_past(&a, resumed, a.steps.unwrap_or(300), leader) {
        return Ok(());
    }
    // the workdir is this run's from here on (the trainer shares this lock), and nothing in
    // it is written before the run is known to be allowed there
    let mut identity = run_identity(&a)?;
    if let Some(l) = &lora {
        identity.insert("lora".into(), super::lora::identity(l));
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
    let run = RunDir::claim(&w, leader, &claim).map_err(err)?;

    // model configuration, tokenizer and data
    let synthetic = SyntheticText::new(64, a.seq(), a.seed ^ 0x5157);
    let (cfg, tok_dir) = match (&a.preset, &a.model) {
        (Some(p), _) => {
            // every process writes the same tokenizer (atomically) and reads it back
            if a.data.is_some() {
                presets::write_byte_tokenizer(&w).map_err(err)?;
            } else {
                synthetic.write_tokenizer(&w).map_err(err)?;
            }
            let vocab = Tokenizer::from_dir(&w).map_err(err)?.vocab_size();
            let raw = presets::config(p, vocab).map_err(err)?;
            (HfConfig::from_json(&raw.to_string()).map_err(err)?, w.clone())
        }
        (None, Some(m)) => (HfConfig::from_dir(m).map_err(err)?, m.clone()),
        (None, None) => return Err("give a model: --preset llama-tiny, or --model DIR".into()),
    };
    if cfg.model_type == "t5" {
        let dir = a.model.clone().ok_or("T5 trains from a model directory (--model)")?;
        let t5 = super::seq2seq::Seq2SeqRun { dir, kind, mesh, compute, identity, run, resumed, leader, lora };
        return super::seq2seq::run(&a, &cfg, t5);
    }
    if a.source_field.is_some() || a.target_field.is_some() || a.target_len.is_some() {
        return Err(format!(
            "--source-field, --target-field and --target-len are for encoder-decoder models (T5); this model is {} \
             (decoder-only: it trains on --text-field)",
            cfg.model_type
        ));
    }
    let seq_len = a.seq();
    if let Some(ctx) = cfg.max_positions {
        if seq_len + 1 > ctx {
            return Err(format!(
                "--seq-len {seq_len} needs {} positions (the labels are the inputs shifted by one), beyond the \
                 model's context of {ctx}",
                seq_len + 1
            ));
        }
    }
    common::check_training_fits(&cfg, mesh, a.batch_size, seq_len, compute)?;
    let tok = Tokenizer::from_dir(&tok_dir).map_err(err)?;
    if let Some(w) = vocab::check_tokenizer(&tok, cfg.vocab).map_err(err)? {
        super::out::warn(format_args!("redco: warning: {w}"));
    }
    identity.insert("vocab".into(), tok.vocab_size().to_string());
    let (train, held_out): (Box<dyn Dataset<Vec<i64>> + Send>, Vec<Vec<i64>>) = match &a.data {
        Some(path) => {
            let data = super::data::open_data(path, a.data_split.as_deref(), &[(&a.text_field, "--text-field")])
                .map_err(err)?;
            let mut seqs = super::data::pack_text(&*data, path, &a.text_field, &tok, seq_len + 1).map_err(err)?;
            let source = format!("{} encoded by {}", path.display(), tok.source().display());
            vocab::check_ids(&seqs.concat(), cfg.vocab, false, &source, Some(&tok)).map_err(err)?;
            let n_eval = (seqs.len() / 20).clamp(1, 64);
            let eval = seqs.split_off(seqs.len() - n_eval);
            (Box::new(seqs), eval)
        }
        // a preset: the corpus's own words are its tokenizer
        None if a.preset.is_some() => {
            let eval = (0..64).map(|i| synthetic.ids((1 << 40) + i)).collect();
            (Box::new(Synthetic(SyntheticText::new(64, seq_len, a.seed ^ 0x5157), 0, 1 << 20)), eval)
        }
        // a model directory: the corpus's text, encoded by the model's tokenizer
        None => {
            let encoded = |offset, count| EncodedSynthetic {
                text: SyntheticText::new(64, seq_len, a.seed ^ 0x5157),
                tok: tok.clone(),
                len: seq_len + 1,
                offset,
                count,
                vocab: cfg.vocab,
            };
            let eval = encoded(1 << 40, 64);
            let held_out = (0..eval.count).map(|i| eval.get(i)).collect::<Result<_>>().map_err(err)?;
            // the first training sequence is checked now, before anything is allocated
            let train = encoded(0, 1 << 20);
            train.get(0).map_err(err)?;
            (Box::new(train), held_out)
        }
    };
    let config = train_config(&a, train.len(), identity, compute, cfg.vocab)?;
    let steps = config.steps;
    if already_past(&a, resumed, steps, leader) {
        return Ok(());
    }
    if leader {
        super::logging::log_to(&w.join("redco.log"))?;
    }

    let job = Job {
        cfg: cfg.clone(),
        from: a.model.clone(),
        seed: a.seed,
        held_out: held_out.clone(),
        every: a.checkpoint_every.max(1),
        lora: lora.clone(),
    };
    let world = super::launch::world();
    let ranks = if world.size > 1 {
        format!("{} ranks in {} processes", a.backend, world.size)
    } else {
        format!("{} ranks", a.backend)
    };
    if leader {
        crate::outln!(
            "training {} ({} layers, hidden {}, {} heads, vocab {}) on mesh {mesh} of {ranks} for {steps} steps of \
             {} x {seq_len} tokens",
            a.preset.as_deref().unwrap_or("model"),
            cfg.layers,
            cfg.hidden,
            cfg.heads,
            cfg.vocab,
            a.batch_size,
        );
        if let Some(why) = &seq_from {
            crate::outln!("sequence length {seq_len} (--seq-len default: {why})");
        }
        if a.data.is_none() && a.model.is_some() {
            crate::outln!(
                "data: the bundled corpus, encoded by {} (give --data for your own text)",
                tok.source().display()
            );
        }
    }
    let report = match kind {
        common::BackendKind::Cpu => {
            let mut dep =
                Deployer::new(mesh, a.seed, &w).map_err(err)?.with_comm(super::launch::factory()).map_err(err)?;
            dep.opts.threads_per_rank = Some(common::threads_per_rank(a.threads, mesh));
            if let Some(t) = a.timeout {
                dep.opts.timeout = std::time::Duration::from_secs_f64(t);
            }
            job.trainer(config).fit_in(&dep, train.as_ref(), &run)
        }
        // one device per rank
        #[cfg(feature = "wgpu")]
        common::BackendKind::Wgpu => {
            let mut dep = Deployer::with_backend(mesh, a.seed, &w, |_, _| redco_wgpu::Wgpu::new())
                .map_err(err)?
                .with_comm(super::launch::factory())
                .map_err(err)?;
            if let Some(t) = a.timeout {
                dep.opts.timeout = std::time::Duration::from_secs_f64(t);
            }
            job.trainer(config).fit_in(&dep, train.as_ref(), &run)
        }
        // one device of the plugin's client per rank
        #[cfg(feature = "tpu")]
        common::BackendKind::Pjrt => {
            let size = mesh.size();
            let mut dep = Deployer::with_backend(mesh, a.seed, &w, move |rank, _| super::pjrt::backend(rank, size))
                .map_err(err)?
                .with_comm(super::launch::factory())
                .map_err(err)?;
            if let Some(t) = a.timeout {
                dep.opts.timeout = std::time::Duration::from_secs_f64(t);
            }
            job.pjrt_trainer(config, a.eager, dep.opts.timeout, leader).fit_in(&dep, train.as_ref(), &run)
        }
        // one GPU per rank, NCCL between them
        #[cfg(feature = "cuda")]
        common::BackendKind::Cuda => {
            let mut dep = Deployer::with_backend(mesh, a.seed, &w, |rank, _| super::cuda::backend(rank))
                .map_err(err)?
                .with_comm(super::cuda::factory())
                .map_err(err)?;
            if let Some(t) = a.timeout {
                dep.opts.timeout = std::time::Duration::from_secs_f64(t);
            }
            job.trainer(config).fit_in(&dep, train.as_ref(), &run)
        }
    }
    .map_err(err)?;
    if let Some(path) = &a.comm_stats {
        write_comm_stats(path, &report).map_err(err)?;
    }
    if !leader {
        return Ok(());
    }

    if let Some(l) = &lora {
        let base = a.model.clone().unwrap_or_else(|| w.clone());
        super::lora::finish(&w, l, a.lora.peft(), &base, "CAUSAL_LM")?;
    }
    // the workdir is now a Hugging Face model directory
    let cfg_text = serde_json::to_string_pretty(&cfg.raw).map_err(|e| e.to_string())?;
    redco_core::pipeline::checkpoint::write_atomic(&w.join("config.json"), cfg_text.as_bytes()).map_err(err)?;
    if tok_dir != w {
        for f in ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"] {
            if tok_dir.join(f).exists() {
                std::fs::copy(tok_dir.join(f), w.join(f)).map_err(|e| format!("copy {f}: {e}"))?;
            }
        }
    }
    let first = report.losses.first().copied().unwrap_or(f64::NAN);
    let last = report.losses.last().copied().unwrap_or(f64::NAN);
    crate::outln!("\nloss {first:.4} -> {last:.4} over steps {}..{steps}", report.start_step + 1);
    if a.data.is_none() && a.preset.is_some() {
        crate::outln!(
            "(the bundled corpus has an entropy of {:.4} nats per token: the best a model can do)",
            synthetic.corpus.entropy()
        );
    }
    if let Some((_, e)) = report.evals.last() {
        crate::outln!("held-out loss {e:.4}");
    }
    // the sample runs on this process alone
    let threads = a.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let threads = (threads / super::launch::world().local_size).max(1);
    match kind {
        common::BackendKind::Cpu => {
            sample(&redco_core::cpu::Cpu::try_new(threads).map_err(err)?, &w, &tok, &a, &held_out)
        }
        #[cfg(feature = "wgpu")]
        common::BackendKind::Wgpu => sample(&redco_wgpu::Wgpu::new().map_err(err)?, &w, &tok, &a, &held_out),
        #[cfg(feature = "tpu")]
        common::BackendKind::Pjrt => sample(&super::pjrt::backend(0, 1).map_err(err)?, &w, &tok, &a, &held_out),
        #[cfg(feature = "cuda")]
        common::BackendKind::Cuda => sample(&super::cuda::backend(0).map_err(err)?, &w, &tok, &a, &held_out),
    }
    .map_err(err)?;
    super::lora::print_outputs(&w, lora.is_some() && a.lora.peft())
}

/// Prints a greedy continuation by the trained model (loaded back from the workdir onto
/// device `b`).
fn sample<B: Backend>(b: &B, w: &Path, tok: &Tokenizer, a: &TrainArgs, held_out: &[Vec<i64>]) -> Result<()> {
    let model = AutoModel::from_pretrained(b, w, DType::F32, None)?;
    let ids: Vec<i64> = match &a.prompt {
        Some(p) => tok.encode(p, true)?,
        None => held_out.first().map(|s| s[..s.len().min(6)].to_vec()).unwrap_or_else(|| vec![1]),
    };
    let n = ids.len();
    let cfg = GenerationConfig {
        max_new_tokens: a.sample_tokens,
        sampling: Sampling::Greedy,
        stop_tokens: tok.eos_id().into_iter().collect(),
        pad_token: tok.padding_id(),
    };
    crate::out!("\nsample: {} |", tok.decode(&ids, true)?);
    let g = generate_with(&model, &Tensor::from_vec(b, ids, [1, n])?, None, &cfg, |_, t| {
        if let Ok(s) = tok.decode(&t[..1], true) {
            crate::out!(" {s}");
            use std::io::Write;
            let _ = std::io::stdout().flush();
        }
    })?;
    crate::outln!();
    let _ = g;
    Ok(())
}
