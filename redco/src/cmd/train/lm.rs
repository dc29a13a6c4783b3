//! The decoder-only part of `redco train`: the three functions of a causal LM, its data
//! (text from `--data`, or the bundled corpus), the trainer on whichever backend was chosen
//! ([`backends::dispatch`]), and a greedy sample from the trained model.

use super::args::{already_past, train_config, TrainArgs};
use super::corpus::{EncodedSynthetic, Synthetic, SEED_MIX};
use super::finish::{finish, own_threads, Ending};
use super::RunSetup;
use crate::cmd::backends::{self, CliBackend, Devices, LmStep, OnBackend};
use crate::cmd::check::StrategyMode;
use crate::cmd::error::CliResult;
use crate::cmd::fits;
use redco_core::nn::lora::{add_lora, LoraConfig};
use redco_core::nn::{KeepWhole, ParamPlacer};
use redco_core::{Backend, DType, Result, Tensor};
use redco_models::auto::AutoModel;
use redco_models::generate::{generate_with, GenerationConfig, Sampling};
use redco_models::hf::config::HfConfig;
use redco_models::hf::tokenizer::Tokenizer;
use redco_models::hf::vocab;
use redco_models::presets::SyntheticText;
use redco_pipeline::data::Dataset;
use redco_pipeline::{Batch, FitReport, StepCtx, TrainConfig, Trainer, ZeroStage};
use std::path::{Path, PathBuf};

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

/// The model, its data and how its training is evaluated, whatever the backend.
struct Job<'a> {
    a: &'a TrainArgs,
    /// The model's configuration.
    cfg: HfConfig,
    /// The checkpoint to fine-tune, or none for random weights from the seed.
    from: Option<PathBuf>,
    /// Held-out sequences, evaluated every `--checkpoint-every` steps.
    held_out: Vec<Vec<i64>>,
    /// LoRA adapters (the base frozen), or full fine-tuning.
    lora: Option<LoraConfig>,
    /// The training sequences.
    train: Box<dyn Dataset<Vec<i64>> + Send>,
    /// The Trainer's options.
    config: TrainConfig,
    /// The compiled step as asked for (backends that compile whole steps use it).
    step: LmStep,
    /// The claimed workdir.
    run: &'a redco_pipeline::RunDir,
    /// The mesh.
    mesh: redco_core::runtime::Mesh,
    /// What each layer recomputes in the backward pass.
    recompute: redco_core::Recompute,
}

impl Job<'_> {
    /// The trainer on backend `B` (its model constructor runs on every rank; the plan then
    /// keeps each rank's slice), with the backend's compiled step where it has one.
    fn trainer<B: CliBackend>(&self) -> Trainer<AutoModel<B>, Vec<i64>, B> {
        let (cfg, seed, from, lora) = (self.cfg.clone(), self.a.seed, self.from.clone(), self.lora.clone());
        let (recompute, capacity) = (self.recompute, self.a.capacity_factor);
        // each parameter is cut to this rank's part as it is made, so no rank holds the
        // whole model; LoRA freezes its base after the build, so that model is built whole
        let model_fn = move |b: &B, placer: &dyn ParamPlacer<B>| {
            let placer = if lora.is_some() { &KeepWhole } else { placer };
            let mut m = match &from {
                Some(dir) => AutoModel::from_pretrained_placed(b, dir, DType::F32, placer)?,
                None => AutoModel::new_placed(b, &cfg, DType::F32, seed, placer)?,
            };
            if let Some(l) = &lora {
                add_lora(&mut m, l, seed)?;
            }
            m.set_recompute(recompute);
            m.set_capacity_factor(capacity)?;
            Ok(m)
        };
        let mut trainer = Trainer::for_backend_placed(model_fn, collate_fn::<B>, loss_fn::<B>, self.config.clone())
            .with_eval(self.held_out.clone(), eval_fn::<B>, self.a.checkpoint_every.max(1), true)
            .observe_all(redco::observe::standard());
        if capacity.is_some() {
            trainer = trainer.count_dropped(|m: &AutoModel<B>| m.take_dropped());
        }
        B::with_lm_step(trainer, &self.step)
    }
}

/// Trains the job on the chosen backend's ranks.
impl OnBackend for &Job<'_> {
    type Out = FitReport;
    fn run<B: CliBackend>(self, d: Devices<B>) -> Result<FitReport> {
        let a = self.a;
        let dep = d.deployer(self.mesh, a.seed, &a.workdir, (a.threads, a.timeout))?;
        self.trainer::<B>().fit_in(&dep, self.train.as_ref(), self.run)
    }
}

/// Prints a greedy continuation by the trained model, on one device of the chosen backend.
struct Sample<'a> {
    a: &'a TrainArgs,
    tok: &'a Tokenizer,
    held_out: &'a [Vec<i64>],
}

impl OnBackend for Sample<'_> {
    type Out = ();
    fn run<B: CliBackend>(self, d: Devices<B>) -> Result<()> {
        sample(&d.one(own_threads(self.a))?, &self.a.workdir, self.tok, self.a, self.held_out)
    }
}

/// A run's training sequences and its held-out ones.
type LmData = (Box<dyn Dataset<Vec<i64>> + Send>, Vec<Vec<i64>>);

/// The training and held-out sequences of `seq_len + 1` tokens: `--data` encoded by the
/// model's tokenizer, the bundled corpus (a preset: its own words are the tokens), or the
/// bundled corpus's text encoded by the model's tokenizer; every id checked against `cfg`'s
/// vocabulary before anything is allocated.
fn lm_data(a: &TrainArgs, cfg: &HfConfig, tok: &Tokenizer, seq_len: usize) -> CliResult<LmData> {
    Ok(match &a.data {
        Some(path) => {
            let data = super::data::open_data(path, a.data_split.as_deref(), &[(&a.text_field, "--text-field")])?;
            let mut seqs = super::data::pack_text(&*data, path, &a.text_field, tok, seq_len + 1)?;
            let source = format!("{} encoded by {}", path.display(), tok.source().display());
            vocab::check_ids(&seqs.concat(), cfg.vocab, false, &source, Some(tok))?;
            let n_eval = (seqs.len() / 20).clamp(1, 64);
            let eval = seqs.split_off(seqs.len() - n_eval);
            (Box::new(seqs), eval)
        }
        // a preset: the corpus's own words are its tokenizer
        None if a.preset.is_some() => {
            let corpus = SyntheticText::new(64, seq_len, a.seed ^ SEED_MIX);
            let eval = (0..64).map(|i| corpus.ids((1 << 40) + i)).collect();
            (Box::new(Synthetic(SyntheticText::new(64, seq_len, a.seed ^ SEED_MIX), 0, 1 << 20)), eval)
        }
        // a model directory: the corpus's text, encoded by the model's tokenizer
        None => {
            let encoded = |offset, count| EncodedSynthetic {
                text: SyntheticText::new(64, seq_len, a.seed ^ SEED_MIX),
                tok: tok.clone(),
                tokens: seq_len + 1,
                offset,
                count,
                vocab: cfg.vocab,
            };
            let eval = encoded(1 << 40, 64);
            let held_out = (0..eval.count).map(|i| eval.get(i)).collect::<Result<_>>()?;
            // the first training sequence is checked now, before anything is allocated
            let train = encoded(0, 1 << 20);
            train.get(0)?;
            (Box::new(train), held_out)
        }
    })
}

/// Trains a decoder-only model.
pub(super) fn run(a: &TrainArgs, s: RunSetup) -> CliResult<()> {
    let cfg = &s.cfg;
    if a.source_field.is_some() || a.target_field.is_some() || a.target_len.is_some() {
        return Err(format!(
            "--source-field, --target-field and --target-len are for encoder-decoder models (T5); this model is {} \
             (decoder-only: it trains on --text-field)",
            cfg.model_type
        )
        .into());
    }
    let seq_len = a.seq();
    if let Some(ctx) = cfg.max_positions {
        if seq_len + 1 > ctx {
            return Err(format!(
                "--seq-len {seq_len} needs {} positions (the labels are the inputs shifted by one), beyond the \
                 model's context of {ctx}",
                seq_len + 1
            )
            .into());
        }
    }
    let (strategy, why) = fits::choose_strategy(
        cfg,
        s.mesh,
        (a.batch_size, seq_len),
        s.compute,
        fits::StrategyAsk {
            zero: a.zero,
            unit_layers: a.unit_layers.map(|k| k.min(cfg.layers.max(1) as u64) as usize),
            recompute: a.recompute.map(|r| r.mode()),
            auto: a.strategy == StrategyMode::Auto,
            budget: a.device_memory,
            lora: s.lora.is_some(),
            adamw: a.optimizer == "adamw",
            offload: a.offload,
            device: a.backend != "cpu",
            ep: a.ep as usize,
        },
    )?;
    let tok = Tokenizer::from_dir(&s.tok_dir)?;
    if let Some(w) = vocab::check_tokenizer(&tok, cfg.vocab)? {
        super::super::out::warn(format_args!("redco: warning: {w}"));
    }
    let mut identity = s.identity.clone();
    identity.insert("vocab".into(), tok.vocab_size().to_string());
    let (train, held_out) = lm_data(a, cfg, &tok, seq_len)?;
    let mut config = train_config(a, train.len(), identity, s.compute, cfg.vocab)?;
    config.zero = ZeroStage::from_number(strategy.zero).unwrap_or_default();
    config.offload = strategy.offload;
    config.unit_layers = strategy.unit_layers.max(1);
    let steps = config.steps;
    if already_past(a, s.resumed, steps, s.leader) {
        return Ok(());
    }
    if s.leader {
        super::super::logging::log_to(&a.workdir.join("redco.log"))?;
    }

    let world = super::super::launch::world();
    let ranks = if world.size > 1 {
        format!("{} ranks in {} processes", a.backend, world.size)
    } else {
        format!("{} ranks", a.backend)
    };
    if s.leader {
        crate::outln!(
            "training {} ({} layers, hidden {}, {} heads, vocab {}) on mesh {} of {ranks} for {steps} steps of \
             {} x {seq_len} tokens",
            a.preset.as_deref().unwrap_or("model"),
            cfg.layers,
            cfg.hidden,
            cfg.heads,
            cfg.vocab,
            s.mesh,
            a.batch_size,
        );
        crate::outln!(
            "memory: {}{}{} ({why})",
            if strategy.offload { "AdamW state and f32 masters offloaded to host memory, " } else { "" },
            match strategy.zero {
                1 => "AdamW state sharded over dp (ZeRO-1), ".to_string(),
                2 => "f32 masters, AdamW state and gradients sharded over dp (ZeRO-2), ".into(),
                3 if strategy.unit_layers > 1 => format!(
                    "parameters, f32 masters, AdamW state and gradients sharded over dp, {} layers at a time \
                     gathered where they run (ZeRO-3), ",
                    strategy.unit_layers
                ),
                3 =>
                    "parameters, f32 masters, AdamW state and gradients sharded over dp, each layer gathered where \
                      it runs (ZeRO-3), "
                        .into(),
                _ => String::new(),
            },
            match strategy.recompute {
                redco_core::Recompute::None => "activations kept",
                redco_core::Recompute::Block => "each layer recomputed in the backward pass",
                redco_core::Recompute::Selective =>
                    "each layer's norms and elementwise ops recomputed in the backward pass, its matmuls kept (selective)",
            }
        );
        if let Some(why) = &s.seq_from {
            crate::outln!("sequence length {seq_len} (--seq-len default: {why})");
        }
        if a.data.is_none() && a.model.is_some() {
            crate::outln!(
                "data: the bundled corpus, encoded by {} (give --data for your own text)",
                tok.source().display()
            );
        }
    }
    let blocked = if a.eager {
        Some("--eager".to_string())
    } else if strategy.recompute.on() {
        Some("recomputed layers run op by op".into())
    } else if s.lora.is_some() {
        Some("LoRA freezes the base model; a compiled step trains every parameter".into())
    } else if a.capacity_factor.is_some() {
        Some("--capacity-factor: the experts' drops are the host's routing decision, op by op".into())
    } else if super::super::launch::is_multi_process() {
        Some("ranks in several processes: a compiled step needs one client over every device".into())
    } else {
        redco_pipeline::compiled::ineligible(&config)
    };
    let timeout = std::time::Duration::from_secs_f64(a.timeout.unwrap_or(120.0));
    let step = LmStep { cfg: cfg.clone(), seed: a.seed, timeout, blocked, leader: s.leader };
    let job = Job {
        a,
        cfg: cfg.clone(),
        from: a.model.clone(),
        held_out: held_out.clone(),
        lora: s.lora.clone(),
        train,
        config,
        step,
        run: &s.run,
        mesh: s.mesh,
        recompute: strategy.recompute,
    };
    let report = backends::dispatch(s.kind, s.mesh, &job)?;
    let note = (a.data.is_none() && a.preset.is_some()).then(|| {
        format!(
            "(the bundled corpus has an entropy of {:.4} nats per token: the best a model can do)",
            SyntheticText::new(64, seq_len, a.seed ^ SEED_MIX).corpus.entropy()
        )
    });
    let files = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"];
    // MFU's FLOPs are counted for LLaMA's shape (a SwiGLU MLP); other decoders show tokens/s
    let flops_per_token =
        (cfg.model_type == "llama").then(|| redco_core::planning::flops::train_flops_per_token(&cfg.dims(), seq_len));
    if !finish(a, &s, &report, steps, Ending { files: &files, task: "CAUSAL_LM", note, flops_per_token })? {
        return Ok(());
    }
    // the sample runs on this process alone
    backends::dispatch(s.kind, s.mesh, Sample { a, tok: &tok, held_out: &held_out })?;
    super::lora::print_outputs(&a.workdir, s.lora.is_some() && a.lora.peft())
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
