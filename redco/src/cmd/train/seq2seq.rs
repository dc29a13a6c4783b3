//! `redco train --model T5DIR --data pairs.jsonl --source-field SRC --target-field TGT` (or
//! any other `--data` format: Parquet, Arrow, a `datasets` directory): a
//! T5 fine-tuned on (source, target) pairs through the three functions of
//! [`redco_models::seq2seq`] (sources under an attention mask, padded targets ignored by
//! the loss, decoder inputs shifted as transformers does), with the held-out pairs' loss
//! evaluated during training and their greedy outputs compared with the targets at the end.
//! The workdir ends up a Hugging Face T5 directory.

use super::args::{already_past, train_config, TrainArgs};
use super::data::{open_data, string_field};
use super::finish::{finish, own_threads, Ending};
use super::RunSetup;
use crate::cmd::backends::{self, CliBackend, Devices, OnBackend};
use crate::cmd::error::CliResult;
use redco_core::nn::lora::{add_lora, set_dropout_seed, LoraConfig};
use redco_core::{Backend, DType, Error, Result};
use redco_models::hf::tokenizer::Tokenizer;
use redco_models::seq2seq::{collate_pairs, generate_targets, seq2seq_loss, Pair};
use redco_models::t5::T5;
use redco_pipeline::{Batch, FitReport, StepCtx, TrainConfig, Trainer};
use std::path::Path;

/// The pairs of the `--data` records (any format `data::open` reads), tokenised (the
/// tokenizer's special tokens added: T5's `</s>`) and cut to `max_source` and `max_target` tokens (the last kept token is then the end of
/// sequence again). Records with an empty source or target are skipped with a warning.
fn read_pairs(
    path: &Path,
    split: Option<&str>,
    fields: (&str, &str),
    tok: &Tokenizer,
    max_source: usize,
    max_target: usize,
) -> Result<Vec<Pair>> {
    let data = open_data(path, split, &[(fields.0, "--source-field"), (fields.1, "--target-field")])?;
    let eos = tok.eos_id();
    let cut = |mut ids: Vec<i64>, max: usize| {
        if ids.len() > max {
            ids.truncate(max);
            if let (Some(e), Some(last)) = (eos, ids.last_mut()) {
                *last = e;
            }
        }
        ids
    };
    let (mut pairs, mut empty) = (Vec::with_capacity(data.len()), 0usize);
    for i in 0..data.len() {
        let v = data.get(i)?;
        let src = string_field(&v, fields.0, path, i, "--source-field")?;
        let tgt = string_field(&v, fields.1, path, i, "--target-field")?;
        if src.trim().is_empty() || tgt.trim().is_empty() {
            empty += 1;
            continue;
        }
        pairs.push(Pair {
            source: cut(tok.encode(src, true)?, max_source),
            target: cut(tok.encode(tgt, true)?, max_target),
        });
    }
    if empty > 0 {
        crate::cmd::out::warn(format_args!(
            "redco: warning: {empty} of {} records of {} have an empty source or target and are skipped",
            data.len(),
            path.display()
        ));
    }
    if pairs.len() < 2 {
        return Err(Error::invalid(
            "data",
            format!("{} holds {} usable pairs: too few to train on and hold one out", path.display(), pairs.len()),
        ));
    }
    Ok(pairs)
}

/// The T5 trainer on backend `B`: the model from `job.dir` on every rank (with LoRA
/// adapters when asked), the held-out loss every `job.every` steps.
fn trainer<B: Backend>(job: &Job<'_>, config: TrainConfig) -> Trainer<T5<B>, Pair, B> {
    let (dir, lora, seed, pad) = (job.dir.to_path_buf(), job.lora.cloned(), job.seed, job.pad);
    let recompute = job.a.recompute.map_or(redco_core::Recompute::None, |r| r.mode());
    Trainer::for_backend(
        move |b: &B| {
            let mut m = T5::from_pretrained(b, &dir, DType::F32, None)?;
            if let Some(l) = &lora {
                add_lora(&mut m, l, seed)?;
            }
            m.set_recompute(recompute);
            Ok(m)
        },
        move |b: &B, ex: &[Pair]| collate_pairs(b, ex, pad),
        |ctx: &StepCtx<B>, m: &T5<B>, batch: &Batch<B>| {
            set_dropout_seed(m, ctx.rng(redco_core::nn::lora::DROPOUT_SITE));
            seq2seq_loss(m, batch)
        },
        config,
    )
    .with_eval(
        job.held_out.to_vec(),
        |_: &StepCtx<B>, m: &T5<B>, batch: &Batch<B>| seq2seq_loss(m, batch)?.replicate()?.to_scalar(),
        job.every,
        true,
    )
    .observe_all(redco::observe::standard())
}

/// What every rank's trainer is made from, and what it trains on.
struct Job<'a> {
    a: &'a TrainArgs,
    dir: &'a Path,
    pad: i64,
    held_out: &'a [Pair],
    every: u64,
    lora: Option<&'a LoraConfig>,
    seed: u64,
    pairs: &'a Vec<Pair>,
    config: TrainConfig,
    setup: &'a RunSetup,
}

/// Trains the T5 on the chosen backend's ranks.
impl OnBackend for &Job<'_> {
    type Out = FitReport;
    fn run<B: CliBackend>(self, d: Devices<B>) -> Result<FitReport> {
        let (a, s) = (self.a, self.setup);
        let dep = d.deployer(s.mesh, a.seed, &a.workdir, (a.threads, a.timeout))?;
        trainer(self, self.config.clone()).fit_in(&dep, self.pairs, &s.run)
    }
}

/// The held-out pairs' greedy outputs on device `b` from the trained model in `w`: the
/// exact matches, and a few examples printed.
fn report_outputs<B: Backend>(b: &B, w: &Path, tok: &Tokenizer, held_out: &[Pair], max_new: usize) -> Result<()> {
    let model = T5::from_pretrained(b, w, DType::F32, None)?;
    let shown = &held_out[..held_out.len().min(64)];
    let sources: Vec<Vec<i64>> = shown.iter().map(|p| p.source.clone()).collect();
    let outputs = generate_targets(b, &model, &sources, max_new)?;
    let eos = tok.eos_id();
    let text = |ids: &[i64]| -> Result<String> {
        let ids: Vec<i64> = ids.iter().copied().filter(|&t| Some(t) != eos).collect();
        tok.decode(&ids, true)
    };
    let exact = shown.iter().zip(&outputs).filter(|(p, o)| text(&p.target).ok() == text(o).ok()).count();
    crate::outln!("held-out pairs, greedy: {exact} of {} outputs equal their target", shown.len());
    for (p, o) in shown.iter().zip(&outputs).take(3) {
        crate::outln!("  {:?} -> {:?} (target {:?})", text(&p.source)?, text(o)?, text(&p.target)?);
    }
    Ok(())
}

/// Runs the T5 part of `redco train`.
pub(super) fn run(a: &TrainArgs, r: RunSetup) -> CliResult<()> {
    let cfg = &r.cfg;
    let (Some(src_field), Some(tgt_field)) = (&a.source_field, &a.target_field) else {
        return Err(
            "a T5 trains on pairs: give --source-field and --target-field (fields of the --data records)".into()
        );
    };
    let Some(data) = &a.data else {
        return Err("a T5 trains on pairs: give --data (pairs.jsonl, a Parquet file, a datasets directory) with \
                    --source-field and --target-field"
            .into());
    };
    let tok = Tokenizer::from_dir(&r.tok_dir)?;
    if let Some(w) = redco_models::hf::vocab::check_tokenizer(&tok, cfg.vocab)? {
        crate::cmd::out::warn(format_args!("redco: warning: {w}"));
    }
    let max_target = a.target_len.unwrap_or(a.seq());
    let mut pairs = read_pairs(data, a.data_split.as_deref(), (src_field, tgt_field), &tok, a.seq(), max_target)?;
    for (i, p) in pairs.iter().enumerate() {
        for (ids, field) in [(&p.source, src_field), (&p.target, tgt_field)] {
            let source =
                format!("{} pair {} (`{field}`, encoded by {})", data.display(), i + 1, tok.source().display());
            redco_models::hf::vocab::check_ids(ids, cfg.vocab, false, &source, Some(&tok))?;
        }
    }
    let n_eval = (pairs.len() / 20).clamp(1, 64);
    let held_out = pairs.split_off(pairs.len() - n_eval);
    let mut identity = r.identity.clone();
    identity.insert("pairs".into(), format!("{src_field} -> {tgt_field}, target {max_target}"));
    identity.insert("vocab".into(), tok.vocab_size().to_string());
    let mut config = train_config(a, pairs.len(), identity, r.compute, cfg.vocab)?;
    config.tokens_key = Some("labels".into());
    if already_past(a, r.resumed, config.steps, r.leader) {
        return Ok(());
    }
    if r.leader {
        crate::cmd::logging::log_to(&a.workdir.join("redco.log"))?;
    }
    let pad = cfg.pad_token_id.unwrap_or(0);
    let every = a.checkpoint_every.max(1);
    if r.leader {
        crate::outln!(
            "training t5 ({} + {} layers, d_model {}, vocab {}) on mesh {} of {} ranks for {} steps of {} pairs \
             ({} training, {} held out; sources <= {} tokens, targets <= {max_target})",
            cfg.layers,
            cfg.num("num_decoder_layers").unwrap_or(cfg.layers),
            cfg.hidden,
            cfg.vocab,
            r.mesh,
            a.backend,
            config.steps,
            a.batch_size,
            pairs.len(),
            held_out.len(),
            a.seq()
        );
        if let Some(r) = a.recompute.filter(|r| r.on()) {
            crate::outln!(
                "memory: each encoder and decoder block recomputed in the backward pass ({})",
                r.mode().name()
            );
        }
    }
    let steps = config.steps;
    let job = Job {
        a,
        dir: &r.tok_dir,
        pad,
        held_out: &held_out,
        every,
        lora: r.lora.as_ref(),
        seed: a.seed,
        pairs: &pairs,
        config,
        setup: &r,
    };
    let report = backends::dispatch(r.kind, r.mesh, &job)?;
    let files = ["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"];
    if !finish(
        a,
        &r,
        &report,
        steps,
        Ending { files: &files, task: "SEQ_2_SEQ_LM", note: None, flops_per_token: None },
    )? {
        return Ok(());
    }
    // the held-out outputs on this process alone
    let b = redco_cpu::Cpu::try_new(own_threads(a))?;
    report_outputs(&b, &a.workdir, &tok, &held_out, max_target)?;
    super::lora::print_outputs(&a.workdir, r.lora.is_some() && a.lora.peft())
}
