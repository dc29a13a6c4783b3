//! Differentially private SGD (per-example clipping + Gaussian noise) through the same
//! three functions: `loss_fn` computes per-example gradients, clips each to norm C, adds
//! noise, and returns a surrogate whose value is the mean loss and whose gradient is the
//! private one. Works split over a mesh like any other loss (norms count every shard).
//!
//! `cargo run --release -p redco --example dp_sgd -- [MESH] [STEPS] [WORKDIR]`

use redco::cpu::Cpu;
use redco::models::tiny::{Config, Lm};
use redco::nn::ModuleExt;
use redco::optim::{global_grad_norm, AdamWConfig, Decay, Schedule};
use redco::pipeline::synthetic::MarkovCorpus;
use redco::pipeline::{Batch, Deployer, OptimizerConfig, StepCtx, TrainConfig, Trainer};
use redco::{no_grad, DType, Result, Tensor};

const MODEL: Config = Config { vocab: 16, hidden: 32, layers: 1, heads: 4, kv_heads: 4, inter: 64, llama: true };
/// Per-example clipping norm.
const CLIP: f64 = 1.0;
/// Noise multiplier (noise std = SIGMA * CLIP).
const SIGMA: f64 = 0.5;

fn collate_fn(b: &Cpu, ex: &[Vec<i64>]) -> Result<Batch<Cpu>> {
    let t = ex[0].len();
    let ids: Vec<i64> = ex.iter().flatten().copied().collect();
    let labels: Vec<i64> = ex.iter().flat_map(|s| s[1..].iter().copied().chain([-100])).collect();
    Ok(Batch::from([
        ("input_ids".into(), Tensor::from_vec(b, ids, [ex.len(), t])?),
        ("labels".into(), Tensor::from_vec(b, labels, [ex.len(), t])?),
    ]))
}

fn loss_fn(ctx: &StepCtx<Cpu>, m: &Lm<Cpu>, batch: &Batch<Cpu>) -> Result<Tensor<Cpu>> {
    let (ids, labels) = (&batch["input_ids"], &batch["labels"]);
    let n = ids.dims()[0];
    let params = m.named_parameters();
    let tensors: Vec<Tensor<Cpu>> = params.iter().map(|(_, p)| p.clone()).collect();
    let mut private: Vec<Option<Tensor<Cpu>>> = vec![None; params.len()];
    let mut mean_loss = 0.0;
    for i in 0..n {
        let loss = m.loss(&ids.narrow(0, i, 1)?, None, &labels.narrow(0, i, 1)?)?;
        mean_loss += loss.replicate()?.to_scalar()? / n as f64;
        let g = loss.backward()?;
        let scale = (CLIP / global_grad_norm(None, &tensors, &g)?.max(1e-12)).min(1.0);
        for (k, p) in tensors.iter().enumerate() {
            let gi = no_grad(|| g.get(p).expect("every parameter has a gradient").scale(scale))?;
            private[k] = Some(match private[k].take() {
                Some(s) => no_grad(|| s.add(&gi))?,
                None => gi,
            });
        }
    }
    let mut surrogate: Option<Tensor<Cpu>> = None;
    for (k, p) in tensors.iter().enumerate() {
        // the same noise on every rank and mesh: drawn whole, then laid out like the gradient
        let g = private[k].take().expect("summed");
        let noise =
            redco::nn::Init::Normal(SIGMA * CLIP).var(p.backend(), p.shape().clone(), DType::F32, ctx.rng(k as u64))?;
        let g = no_grad(|| g.add(&noise.detach().redistribute(g.placements())?)?.scale(1.0 / n as f64))?;
        let term = p.mul(&g.detach())?.sum_all()?;
        surrogate = Some(match surrogate {
            Some(s) => s.add(&term)?,
            None => term,
        });
    }
    // value: the mean loss; gradient: the private gradient
    let s = surrogate.expect("the model has parameters");
    s.sub(&s.detach())?.add_scalar(mean_loss)
}

fn main() -> Result<()> {
    redco::cpu::malloc::tune();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mesh = args.first().map_or("1x2", String::as_str).parse()?;
    let steps: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(60);
    let workdir = std::path::PathBuf::from(args.get(2).map_or("workdir-dpsgd", String::as_str));
    let corpus = MarkovCorpus::new(MODEL.vocab, 12, 7);
    let config = TrainConfig {
        batch_size: 16,
        steps,
        schedule: Schedule { peak: 3e-3, warmup: 5, total: steps, decay: Decay::Constant },
        optimizer: OptimizerConfig::AdamW(AdamWConfig::default()),
        clip_norm: None,
        ..Default::default()
    };
    let trainer = Trainer::new(|b| Lm::new(b, MODEL, DType::F32, 0), collate_fn, loss_fn, config);
    let r = trainer.fit(&Deployer::new(mesh, 1, &workdir)?, &corpus.sequences(0, 4096), false)?;
    println!(
        "DP-SGD (clip {CLIP}, noise multiplier {SIGMA}): loss {:.3} -> {:.3}",
        r.losses[0],
        r.losses[r.losses.len() - 1]
    );
    Ok(())
}
