//! Trains a small LLaMA-shaped language model on a synthetic corpus whose entropy is known,
//! with data + tensor parallelism on CPU ranks, through the three functions.
//!
//! `cargo run --release -p redco --example lm_synthetic -- [MESH] [STEPS] [WORKDIR]`
//! (defaults: 2x2, 300, ./workdir-lm). Run it again with the same workdir to resume.

use redco::cpu::Cpu;
use redco::models::tiny::{Config, Lm};
use redco::optim::{AdamWConfig, Decay, Schedule};
use redco::pipeline::synthetic::MarkovCorpus;
use redco::pipeline::{Batch, Deployer, OptimizerConfig, StepCtx, TrainConfig, Trainer};
use redco::{DType, Result, Tensor};

const MODEL: Config = Config { vocab: 32, hidden: 64, layers: 2, heads: 4, kv_heads: 2, inter: 128, llama: true };

/// Examples are token sequences; the batch holds the ids and the next-token labels.
fn collate_fn(b: &Cpu, examples: &[Vec<i64>]) -> Result<Batch<Cpu>> {
    let t = examples[0].len();
    let ids: Vec<i64> = examples.iter().flatten().copied().collect();
    let labels: Vec<i64> = examples.iter().flat_map(|s| s[1..].iter().copied().chain([-100])).collect();
    Ok(Batch::from([
        ("input_ids".into(), Tensor::from_vec(b, ids, [examples.len(), t])?),
        ("labels".into(), Tensor::from_vec(b, labels, [examples.len(), t])?),
    ]))
}

/// Mean next-token cross-entropy.
fn loss_fn(_ctx: &StepCtx<Cpu>, model: &Lm<Cpu>, batch: &Batch<Cpu>) -> Result<Tensor<Cpu>> {
    model.loss(&batch["input_ids"], None, &batch["labels"])
}

fn main() -> Result<()> {
    redco::cpu::malloc::tune();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mesh = args.first().map_or("2x2", String::as_str).parse()?;
    let steps: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(300);
    let workdir = std::path::PathBuf::from(args.get(2).map_or("workdir-lm", String::as_str));

    let corpus = MarkovCorpus::new(MODEL.vocab, 32, 7);
    let train = corpus.sequences(0, 8192);
    let config = TrainConfig {
        batch_size: 16,
        steps,
        schedule: Schedule { peak: 3e-3, warmup: 20, total: steps, decay: Decay::Cosine },
        optimizer: OptimizerConfig::AdamW(AdamWConfig { weight_decay: 0.01, ..Default::default() }),
        checkpoint_every: Some(100),
        ..Default::default()
    };
    let eval_fn = |_: &StepCtx<Cpu>, m: &Lm<Cpu>, b: &Batch<Cpu>| {
        m.loss(&b["input_ids"], None, &b["labels"])?.replicate()?.to_scalar()
    };
    // the facade's observers: TensorBoard scalars, loss.png, and a progress bar on a terminal
    let trainer = Trainer::new(|b| Lm::new(b, MODEL, DType::F32, 0), collate_fn, loss_fn, config)
        .with_eval(corpus.sequences(1 << 20, 64), eval_fn, 100, true)
        .observe_all(redco::observe::standard());
    let deployer = Deployer::new(mesh, 42, &workdir)?;
    println!("{}", trainer.plan(&deployer, &train)?);
    let report = trainer.fit(&deployer, &train, true)?;
    println!(
        "steps {}..{}: loss {:.4} -> {:.4} (the corpus entropy is {:.4} nats/token)",
        report.start_step,
        steps,
        report.losses.first().copied().unwrap_or(f64::NAN),
        report.losses.last().copied().unwrap_or(f64::NAN),
        corpus.entropy()
    );
    let evals = redco::pipeline::metrics::read_metrics(&workdir)?;
    if let Some(e) = evals.iter().rev().find_map(|m| m.eval) {
        println!("held-out loss {e:.4} = {:.1}% above the entropy", 100.0 * (e / corpus.entropy() - 1.0));
    }
    let w = workdir.display();
    println!("wrote {w}/metrics.jsonl, {w}/tensorboard/, {w}/loss.png, {w}/checkpoints/, {w}/model.safetensors");
    Ok(())
}
