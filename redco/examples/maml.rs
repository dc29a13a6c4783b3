//! MAML (Finn et al., 2017) on few-shot sinusoid regression, written as the three
//! functions: `collate_fn` stacks tasks, `loss_fn` adapts per-task copies of the weights on
//! each task's support points (one gradient step, through `Tensor::grad_graph` so that the
//! outer gradient flows through it: second-order MAML; `--first-order` detaches it) and
//! returns the adapted weights' loss on the query points. The Trainer and AdamW do the
//! rest; over a `dp` mesh the tasks of a meta-batch split over the ranks.
//!
//! Tasks as in the MAML paper: `y = A sin(x - phi)`, amplitude `A` in [0.1, 5], phase `phi`
//! in [0, pi], `x` in [-5, 5], K = 10 support and 10 query points per task; an MLP
//! 1-40-40-1 with ReLU; inner step size 0.01. After training, on 100 held-out tasks: the
//! query MSE before adaptation, after 1 and after 10 inner steps on the support points,
//! next to the same MLP pretrained on all tasks jointly (plain regression) and then
//! fine-tuned the same way (the paper's comparison).
//!
//! `cargo run --release -p redco --example maml -- [MESH] [STEPS] [--first-order]`
//! (defaults 1x1, 4000); prints one `result maml <post-adaptation MSE>` line at the end.

#[path = "common/rng.rs"]
mod rng;

use redco::cpu::Cpu;
use redco::models::hf::safetensors::read_all;
use redco::nn::{Linear, Module, ModuleExt};
use redco::optim::{AdamWConfig, Decay, Schedule};
use redco::pipeline::{Batch, Deployer, OptimizerConfig, StepCtx, TrainConfig, Trainer};
use redco::{module, no_grad, DType, Result, Tensor};
use rng::Rng;

/// Support (and query) points per task.
const K: usize = 10;
/// Tasks per meta-batch.
const META_BATCH: usize = 10;
/// The inner step size.
const ALPHA: f64 = 0.01;

/// One regression task: its support and query points.
#[derive(Clone)]
struct Task {
    xs: Vec<f64>,
    ys: Vec<f64>,
    xq: Vec<f64>,
    yq: Vec<f64>,
}

fn tasks(n: usize, seed: u64) -> Vec<Task> {
    let mut r = Rng(seed);
    (0..n)
        .map(|_| {
            let (a, phi) = (r.uniform(0.1, 5.0), r.uniform(0.0, std::f64::consts::PI));
            let pts = |r: &mut Rng| -> (Vec<f64>, Vec<f64>) {
                let x: Vec<f64> = (0..K).map(|_| r.uniform(-5.0, 5.0)).collect();
                let y = x.iter().map(|x| a * (x - phi).sin()).collect();
                (x, y)
            };
            let (xs, ys) = pts(&mut r);
            let (xq, yq) = pts(&mut r);
            Task { xs, ys, xq, yq }
        })
        .collect()
}

/// The MLP 1-40-40-1.
struct Mlp<B: redco::Backend> {
    l1: Linear<B>,
    l2: Linear<B>,
    l3: Linear<B>,
}
module!(Mlp { l1: "l1", l2: "l2", l3: "l3" });

fn mlp(b: &Cpu) -> Result<Mlp<Cpu>> {
    Ok(Mlp {
        l1: Linear::new(b, 1, 40, true, DType::F32, 1)?,
        l2: Linear::new(b, 40, 40, true, DType::F32, 2)?,
        l3: Linear::new(b, 40, 1, true, DType::F32, 3)?,
    })
}

/// The MLP with per-task weights `w` (`[tasks, ..]` copies of each parameter, in visiting
/// order: weight, bias of each layer) on `x` `[tasks, points, 1]`.
fn forward(w: &[Tensor<Cpu>], x: &Tensor<Cpu>) -> Result<Tensor<Cpu>> {
    let mut h = x.clone();
    for (i, pair) in w.chunks(2).enumerate() {
        h = h.matmul(&pair[0].transpose(-1, -2)?)?.add(&pair[1].unsqueeze(1)?)?;
        if i < 2 {
            h = h.relu()?;
        }
    }
    Ok(h)
}

/// Sum over tasks of each task's mean squared error.
fn task_mse(w: &[Tensor<Cpu>], x: &Tensor<Cpu>, y: &Tensor<Cpu>) -> Result<Tensor<Cpu>> {
    forward(w, x)?.sub(y)?.square()?.mean(1, false)?.sum_all()
}

/// `steps` inner gradient steps from the per-task weights `w` on `(x, y)`; the gradients
/// stay in the graph unless `first_order`.
fn adapt(
    w: Vec<Tensor<Cpu>>,
    x: &Tensor<Cpu>,
    y: &Tensor<Cpu>,
    steps: usize,
    first_order: bool,
) -> Result<Vec<Tensor<Cpu>>> {
    let mut w = w;
    for _ in 0..steps {
        let inner = task_mse(&w, x, y)?;
        let refs: Vec<&Tensor<Cpu>> = w.iter().collect();
        let grads = inner.grad_graph(&refs)?;
        w = w
            .iter()
            .zip(grads)
            .map(|(p, g)| {
                let g = g.ok_or_else(|| redco::Error::invalid("maml", "a weight received no gradient"))?;
                let g = if first_order { g.detach() } else { g };
                p.sub(&g.scale(ALPHA)?)
            })
            .collect::<Result<_>>()?;
    }
    Ok(w)
}

/// Each parameter copied once per task: `[tasks, ..]`.
fn per_task(params: &[Tensor<Cpu>], tasks: usize) -> Result<Vec<Tensor<Cpu>>> {
    params
        .iter()
        .map(|p| {
            let mut d = vec![tasks];
            d.extend_from_slice(p.dims());
            p.unsqueeze(0)?.expand(d)
        })
        .collect()
}

fn collate_fn(b: &Cpu, ex: &[Task]) -> Result<Batch<Cpu>> {
    let t = ex.len();
    let stack = |f: fn(&Task) -> &Vec<f64>| -> Result<Tensor<Cpu>> {
        let v: Vec<f32> = ex.iter().flat_map(|e| f(e).iter().map(|&x| x as f32)).collect();
        Tensor::from_vec(b, v, [t, K, 1])
    };
    Ok(Batch::from([
        ("xs".into(), stack(|e| &e.xs)?),
        ("ys".into(), stack(|e| &e.ys)?),
        ("xq".into(), stack(|e| &e.xq)?),
        ("yq".into(), stack(|e| &e.yq)?),
    ]))
}

/// The three functions' loss: MAML's outer loss (mean query MSE after one inner step).
fn maml_loss(m: &Mlp<Cpu>, batch: &Batch<Cpu>, first_order: bool) -> Result<Tensor<Cpu>> {
    let params: Vec<Tensor<Cpu>> = m.named_parameters().into_iter().map(|(_, p)| p).collect();
    let t = batch["xs"].dims()[0];
    let adapted = adapt(per_task(&params, t)?, &batch["xs"], &batch["ys"], 1, first_order)?;
    task_mse(&adapted, &batch["xq"], &batch["yq"])?.scale(1.0 / t as f64)
}

/// The baseline's loss: plain regression on every point of every task, no adaptation.
fn joint_loss(m: &Mlp<Cpu>, batch: &Batch<Cpu>) -> Result<Tensor<Cpu>> {
    let params: Vec<Tensor<Cpu>> = m.named_parameters().into_iter().map(|(_, p)| p).collect();
    let t = batch["xs"].dims()[0];
    let w = per_task(&params, t)?;
    let both = task_mse(&w, &batch["xs"], &batch["ys"])?.add(&task_mse(&w, &batch["xq"], &batch["yq"])?)?;
    both.scale(0.5 / t as f64)
}

/// Query MSE on `held` before adaptation and after 1 and 10 inner steps, from the
/// weights saved in `workdir`.
fn evaluate(b: &Cpu, workdir: &std::path::Path, held: &[Task]) -> Result<[f64; 3]> {
    let saved = read_all(&workdir.join("model.safetensors"))?;
    let mut m = mlp(b)?;
    let mut err = None;
    m.visit_mut("", &mut |name, p| match saved.get(name) {
        Some(t) => match Tensor::from_host(b, &t.data, t.shape.clone()) {
            Ok(x) => *p = x.into_var(),
            Err(e) => err = Some(e),
        },
        None => err = Some(redco::Error::invalid("maml", format!("{name} is not in the saved model"))),
    });
    if let Some(e) = err {
        return Err(e);
    }
    let batch = collate_fn(b, held)?;
    let params: Vec<Tensor<Cpu>> = m.named_parameters().into_iter().map(|(_, p)| p).collect();
    let mut out = [0.0; 3];
    for (slot, steps) in [(0, 0), (1, 1), (2, 10)] {
        let w: Vec<Tensor<Cpu>> = per_task(&params, held.len())?.into_iter().map(|p| p.detach().into_var()).collect();
        let w = adapt(w, &batch["xs"], &batch["ys"], steps, true)?;
        out[slot] = no_grad(|| task_mse(&w, &batch["xq"], &batch["yq"]))?.to_scalar()? / held.len() as f64;
    }
    Ok(out)
}

/// A meta-training loss: the model, a batch of tasks, whether first-order.
type LossFn = fn(&Mlp<Cpu>, &Batch<Cpu>, bool) -> Result<Tensor<Cpu>>;

fn train(
    mesh: redco::runtime::Mesh,
    steps: u64,
    workdir: &std::path::Path,
    loss: LossFn,
    first_order: bool,
) -> Result<Vec<f64>> {
    let config = TrainConfig {
        batch_size: META_BATCH,
        steps,
        schedule: Schedule { peak: 1e-3, warmup: 0, total: steps, decay: Decay::Constant },
        optimizer: OptimizerConfig::AdamW(AdamWConfig { weight_decay: 0.0, ..AdamWConfig::default() }),
        clip_norm: None,
        checkpoint_every: None,
        log_every: 100,
        ..Default::default()
    };
    let loss_fn = move |_: &StepCtx<Cpu>, m: &Mlp<Cpu>, b: &Batch<Cpu>| loss(m, b, first_order);
    let trainer = Trainer::new(mlp, collate_fn, loss_fn, config);
    let dep = Deployer::new(mesh, 7, workdir)?;
    Ok(trainer.fit(&dep, &tasks(20_000, 1), false)?.losses)
}

fn main() -> Result<()> {
    redco::cpu::malloc::tune();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let first_order = args.iter().any(|a| a == "--first-order");
    let pos: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    let mesh = pos.first().map_or("1x1", |s| s.as_str()).parse()?;
    let steps: u64 = pos.get(1).and_then(|s| s.parse().ok()).unwrap_or(4000);
    let root = std::env::temp_dir().join(format!("redco-maml-{}", std::process::id()));
    let (dir_maml, dir_joint) = (root.join("maml"), root.join("joint"));
    for d in [&dir_maml, &dir_joint] {
        let _ = std::fs::remove_dir_all(d);
    }
    let which = if first_order { "first-order" } else { "second-order" };
    let losses = train(mesh, steps, &dir_maml, maml_loss, first_order)?;
    let _ = train(mesh, steps, &dir_joint, |m, b, _| joint_loss(m, b), false)?;
    let b = Cpu::new(2);
    let held = tasks(100, 99);
    let maml = evaluate(&b, &dir_maml, &held)?;
    let joint = evaluate(&b, &dir_joint, &held)?;
    println!("MAML ({which}) on mesh {mesh}, {steps} meta-steps of {META_BATCH} tasks, K = {K}, inner step {ALPHA}");
    println!("  outer loss: first step {:.3}, last step {:.3}", losses[0], losses[losses.len() - 1]);
    println!("  held-out query MSE (100 tasks)       before   1 step  10 steps");
    println!("  MAML ({which:12})                {:8.3} {:8.3} {:9.3}", maml[0], maml[1], maml[2]);
    println!("  pretrained jointly, then fine-tuned  {:8.3} {:8.3} {:9.3}", joint[0], joint[1], joint[2]);
    let _ = std::fs::remove_dir_all(&root);
    println!("result maml {:.4}", maml[1]);
    Ok(())
}
