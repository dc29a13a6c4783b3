//! `redco train`'s flags ([`TrainArgs`]) and what is read off them: the sequence length
//! default, the Trainer's options, the run's identity, and whether a resumed run is
//! already past its steps.

use super::super::check::{self, Recompute, StrategyMode};
use crate::cmd::error::CliResult;
use clap::Args;
use redco_core::optim::{AdamWConfig, Decay, Schedule};
use redco_core::DType;
use redco_models::hf::config::HfConfig;
use redco_pipeline::checkpoint::Checkpointer;
use redco_pipeline::workdir;
use redco_pipeline::{OptimizerConfig, TrainConfig, ZeroStage};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Arguments of `redco train`.
#[derive(Args)]
#[command(allow_negative_numbers = true)]
pub struct TrainArgs {
    /// Built-in model: llama-tiny (4 layers, hidden 128; minutes on two cores), llama-small
    /// (6 layers, hidden 512), llama-134m (12 layers, hidden 768), llama-0.7b (25 layers,
    /// hidden 1536: 0.71B parameters, 11.3 GB of f32 training state), or a Qwen3 mixture of
    /// experts: qwen3-moe-tiny (8 experts, 2 per token), qwen3-moe-small (llama-small with
    /// 32 experts of 352, 4 per token, for its MLP: the same active parameters) or
    /// qwen3-moe-1b (64 experts of 352,
    /// 4 per token, 12 layers of hidden 1024: 0.86B parameters; see --ep). Starts from
    /// random weights.
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
    /// Activation recompute: none; block (each transformer layer recomputed in the
    /// backward pass from its input: one hidden state kept per layer instead of every
    /// activation, for one more forward per layer); or selective (each layer keeps the
    /// outputs of its matmuls, attention and all-reduces and recomputes its norms, rotary
    /// embeddings, SiLU and product: no matmul or communication runs twice). Every model
    /// (T5: each encoder and decoder block); runs op by op on pjrt. Default: the planner's pick (`--strategy auto`), recompute
    /// only when the run does not fit the memory per rank otherwise (printed with the run).
    #[arg(long, value_enum)]
    pub recompute: Option<Recompute>,
    /// ZeRO stage over the data-parallel ranks: 0 (every rank holds the whole training
    /// state), 1 (AdamW's moments sharded over dp), 2 (also the f32 master weights and
    /// the gradients, reduce-scattered during backward; any optimizer) or 3 (FSDP: also
    /// the decoder layers' parameters, each layer gathered just before it runs;
    /// decoder-only models). Every stage gives the same results; a run resumes at any stage and mesh
    /// (its checkpoint is resharded). Default: the planner's pick (`--strategy auto`), 0
    /// unless the run does not fit the memory per rank otherwise.
    #[arg(long, value_parser = clap::value_parser!(u8).range(0..=3))]
    pub zero: Option<u8>,
    /// ZeRO-3's unit: how many consecutive decoder layers one gather moves (one collective,
    /// prefetched together, and with recompute one recompute block). Default: the
    /// planner's pick with `--strategy auto` (the fewest layers whose parameters reach a
    /// 25 MB collective, fewer where that would not fit), else 1 (each layer on its own).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub unit_layers: Option<u64>,
    /// Expert parallelism for a mixture of experts (Mixtral, Qwen3-MoE): its experts split
    /// over this many ranks of dp, each rank holding its share; every token's slots go to
    /// the ranks holding their experts and back (all-to-all). 1 (the default) keeps every
    /// expert on every rank; otherwise it must equal dp (`--mesh DPxMP`).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub ep: u64,
    /// A mixture of experts' capacity factor: each expert takes at most
    /// ceil(F x tokens x top_k / experts) of a rank's token slots per forward, first choices
    /// first, and drops the rest (their tokens keep the residual); the share dropped is
    /// logged each step (`moe_dropped` in metrics.jsonl). Without it routing is dropless.
    #[arg(long, value_name = "F")]
    pub capacity_factor: Option<f64>,
    /// Offload the optimizer to host memory (device backends: wgpu, cuda): AdamW's state
    /// and the f32 masters on the host, the update on its CPU cores, the updated
    /// parameters uploaded in the compute dtype; with ZeRO-0, 2 or 3 (at 2 and 3 each
    /// rank's host holds its slice). Default: the planner's pick on a device
    /// backend (`--strategy auto`), on only when the run does not fit otherwise; refused on
    /// the cpu backend, whose memory is the host's.
    #[arg(long)]
    pub offload: bool,
    /// Time the device's work by op family over every step after the first and print the
    /// table at the end: each family's share of a step, the host's gaps between them,
    /// tokens/s and the model-FLOPs utilisation against the device's dense peak (cuda; a
    /// backend without device timers prints tokens/s alone). Costs the host a few
    /// microseconds a kernel launch.
    #[arg(long)]
    pub profile: bool,
    /// Save nothing: no checkpoint, no final model, no sample (a benchmark or profiling
    /// run; it cannot be resumed). A 7B model's checkpoint is 80 GB of f32 masters and
    /// AdamW moments.
    #[arg(long, conflicts_with_all = ["resume", "resume_from"])]
    pub no_save: bool,
    /// Who picks the memory tools `--zero` and `--recompute` leave open: auto (the planner:
    /// among those that fit the memory per rank, the fewest bytes moved and recomputed; as
    /// `redco plan` lists them) or none (ZeRO-0, every activation kept). A run that fits
    /// nothing is refused before anything is allocated, with the numbers.
    #[arg(long, value_enum, default_value_t = StrategyMode::Auto)]
    pub strategy: StrategyMode,
    /// Memory per rank to fit the run to (e.g. 16GB, 24GiB; default: this host's available
    /// memory shared by the ranks on it).
    #[arg(long, value_parser = check::bytes)]
    pub device_memory: Option<u64>,
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
pub(super) fn default_seq_len(a: &TrainArgs) -> CliResult<(usize, String)> {
    let Some(dir) = &a.model else { return Ok((PRESET_SEQ_LEN, "the preset's default".into())) };
    let cfg = HfConfig::from_dir(dir)?;
    Ok(match cfg.max_positions {
        Some(ctx) if ctx.saturating_sub(1) <= MAX_DEFAULT_SEQ_LEN => {
            (ctx.saturating_sub(1), format!("the model's context of {ctx} less one for the shifted labels"))
        }
        Some(ctx) => (MAX_DEFAULT_SEQ_LEN, format!("the model's context of {ctx}, capped at {MAX_DEFAULT_SEQ_LEN}")),
        None => (PRESET_SEQ_LEN, format!("{} has no fixed context", cfg.model_type)),
    })
}

/// The Trainer's options from the command line, for `examples` training examples.
pub(super) fn train_config(
    a: &TrainArgs,
    examples: usize,
    identity: BTreeMap<String, String>,
    compute: DType,
    vocab: usize,
) -> CliResult<TrainConfig> {
    let steps = match (a.steps, a.epochs) {
        (Some(s), _) => s,
        (None, Some(e)) => ((e * examples as f64) / a.batch_size as f64).ceil().max(1.0) as u64,
        (None, None) => 300,
    };
    let decay = match a.schedule.as_str() {
        "cosine" => Decay::Cosine,
        "linear" => Decay::Linear,
        "constant" => Decay::Constant,
        s => return Err(format!("--schedule {s}: unknown schedule (use cosine, linear or constant)").into()),
    };
    let optimizer = match a.optimizer.as_str() {
        "adamw" => OptimizerConfig::AdamW(AdamWConfig { weight_decay: a.weight_decay, ..Default::default() }),
        "sgd" => OptimizerConfig::Sgd { momentum: 0.9, weight_decay: a.weight_decay },
        o => return Err(format!("--optimizer {o}: unknown optimizer (use adamw or sgd)").into()),
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
        zero: ZeroStage::from_number(a.zero.unwrap_or(0)).unwrap_or_default(),
        ep: a.ep as usize,
        offload: a.offload,
        profile: a.profile,
        save: !a.no_save,
        ..Default::default()
    })
}

/// What makes this run this run, checked when it is resumed: the seed (it also generates
/// the bundled corpus), the data and its digest, the model, the dtype and the sequence
/// length (the vocabulary is added once the tokenizer is read).
pub(super) fn run_identity(a: &TrainArgs) -> CliResult<BTreeMap<String, String>> {
    let model = match (&a.preset, &a.model) {
        (Some(p), _) => format!("preset {p}"),
        (None, Some(m)) => m.canonicalize().unwrap_or_else(|_| m.clone()).display().to_string(),
        (None, None) => String::new(),
    };
    let data = match &a.data {
        Some(p) => {
            let sum = super::data::data_sum(p)?;
            let split = a.data_split.as_ref().map(|s| format!(", split {s}")).unwrap_or_default();
            format!("{} ({} bytes, xxh3 {}{split})", p.display(), sum.bytes, sum.xxh3)
        }
        None => "the bundled synthetic corpus".into(),
    };
    // the mesh, the ZeRO stage and --ep are not part of it: a checkpoint is resharded for
    // the mesh, stage and expert split a resumed run uses
    let id = BTreeMap::from([
        ("seed".to_string(), a.seed.to_string()),
        ("model".to_string(), model),
        ("data".to_string(), data),
        ("dtype".to_string(), a.dtype.clone()),
        ("seq_len".to_string(), a.seq().to_string()),
    ]);
    Ok(id)
}

/// The step of the checkpoint a `--resume` run would continue from, when the workdir holds
/// one (read-only: every process asks, so that all of them stop together when the run is
/// already past `--steps`).
pub(super) fn resume_step(a: &TrainArgs) -> CliResult<Option<u64>> {
    let ckpt = Checkpointer::new(&a.workdir, 0);
    Ok(workdir::resume_target(&ckpt, a.resume_from.as_deref())?.map(|(step, _)| step))
}

/// When the checkpoint a resumed run starts from is at or past its last step and the run's
/// export is written: says so (the run is already done; nothing is trained or rewritten)
/// and returns true. A run stopped between its last checkpoint and its export goes on, to
/// write the export.
pub(super) fn already_past(a: &TrainArgs, resumed: Option<u64>, steps: u64, leader: bool) -> bool {
    let Some(at) = resumed.filter(|at| *at >= steps) else { return false };
    if !a.workdir.join("model.safetensors").exists() {
        // stopped after its last checkpoint, before its export: the run finishes that
        return false;
    }
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
