//! PPO (Schulman et al., 2017) on CartPole-v1, written as the three functions: `pred_fn`
//! gives the policy's action probabilities and the value of a batch of observations (the
//! rollouts' actor), `collate_fn` stacks transitions, `loss_fn` is PPO's clipped surrogate
//! plus the value loss. Each iteration collects a rollout with `pred_fn` on the weights of
//! the last update, then the Trainer continues the run from its last checkpoint for the
//! next epochs of updates on that rollout (AdamW's moments and the step count carry over).
//!
//! The environment is Gym's CartPole (`classic_control/cartpole.py`: its dynamics, Euler
//! integration at 0.02 s, the 12 degree and 2.4 m limits) with CartPole-v1's limit of 500
//! steps, written below. Hyper-parameters are those of the RL Baselines3 Zoo for
//! CartPole-v1: 8 environments, 32 steps each per rollout, 20 epochs on it as one batch of
//! 256, gamma 0.98, GAE lambda 0.8, learning rate and clip range 1e-3 and 0.2 annealed to 0
//! over the budget, no entropy bonus, value coefficient 0.5, gradient norm clipped at 0.5;
//! separate 64-64 tanh networks for the policy and the value.
//!
//! Every 4 iterations the policy plays 100 evaluation episodes (its actions sampled, as in
//! training, not its most likely ones); the run stops when
//! their mean return reaches 475 (CartPole-v1's threshold).
//!
//! `cargo run --release -p redco --example ppo -- [SEED] [MAX_ENV_STEPS] [MESH]` (defaults 0,
//! 200000, 1x1); prints `result ppo <environment steps to reach 475>` (or, when the budget
//! ends first, a line saying so and the best evaluation, and exits with an error).

#[path = "common/rng.rs"]
mod rng;

use redco::cpu::Cpu;
use redco::models::hf::safetensors::read_all;
use redco::nn::{Linear, Module};
use redco::optim::{AdamWConfig, Decay, Schedule};
use redco::pipeline::{Batch, Deployer, OptimizerConfig, StepCtx, TrainConfig, Trainer};
use redco::runtime::on_backend;
use redco::{module, no_grad, DType, Result, Tensor};
use rng::Rng;
use std::path::Path;

/// Environments stepped together.
const ENVS: usize = 8;
/// Steps per environment per rollout.
const STEPS: usize = 32;
/// Epochs of updates per rollout (each one batch of `ENVS * STEPS`).
const EPOCHS: u64 = 20;
const GAMMA: f64 = 0.98;
const LAMBDA: f64 = 0.8;
const LR: f64 = 1e-3;
const CLIP: f64 = 0.2;
const VALUE_COEF: f64 = 0.5;
/// Iterations between evaluations.
const EVAL_EVERY: usize = 4;
/// Episodes per evaluation, and the mean return that solves CartPole-v1.
const EVAL_EPISODES: usize = 100;
const SOLVED: f64 = 475.0;

/// CartPole-v1: Gym's cart-pole dynamics with its 500-step limit.
#[derive(Clone)]
struct CartPole {
    s: [f64; 4],
    t: usize,
}

impl CartPole {
    const GRAVITY: f64 = 9.8;
    const MASS_CART: f64 = 1.0;
    const MASS_POLE: f64 = 0.1;
    /// Half the pole's length.
    const LENGTH: f64 = 0.5;
    const FORCE: f64 = 10.0;
    const TAU: f64 = 0.02;
    const THETA_LIMIT: f64 = 12.0 * 2.0 * std::f64::consts::PI / 360.0;
    const X_LIMIT: f64 = 2.4;
    const MAX_STEPS: usize = 500;

    /// A new episode: every state variable uniform in [-0.05, 0.05].
    fn reset(r: &mut Rng) -> Self {
        CartPole { s: [0; 4].map(|_| r.uniform(-0.05, 0.05)), t: 0 }
    }

    /// One step with action 0 (push left) or 1 (push right): reward 1, and whether the
    /// episode terminated (pole or cart out of bounds) or was truncated (500 steps).
    fn step(&mut self, action: usize) -> (bool, bool) {
        let [x, x_dot, theta, theta_dot] = self.s;
        let force = if action == 1 { Self::FORCE } else { -Self::FORCE };
        let (sin, cos) = theta.sin_cos();
        let total = Self::MASS_CART + Self::MASS_POLE;
        let pml = Self::MASS_POLE * Self::LENGTH;
        let temp = (force + pml * theta_dot * theta_dot * sin) / total;
        let theta_acc =
            (Self::GRAVITY * sin - cos * temp) / (Self::LENGTH * (4.0 / 3.0 - Self::MASS_POLE * cos * cos / total));
        let x_acc = temp - pml * theta_acc * cos / total;
        self.s = [
            x + Self::TAU * x_dot,
            x_dot + Self::TAU * x_acc,
            theta + Self::TAU * theta_dot,
            theta_dot + Self::TAU * theta_acc,
        ];
        self.t += 1;
        let [x, _, theta, _] = self.s;
        let terminated = x.abs() > Self::X_LIMIT || theta.abs() > Self::THETA_LIMIT;
        (terminated, !terminated && self.t >= Self::MAX_STEPS)
    }

    fn obs(&self) -> [f32; 4] {
        self.s.map(|v| v as f32)
    }
}

/// The policy (`p*`: observation to two action logits) and value (`v*`) networks.
struct ActorCritic<B: redco::Backend> {
    p1: Linear<B>,
    p2: Linear<B>,
    p3: Linear<B>,
    v1: Linear<B>,
    v2: Linear<B>,
    v3: Linear<B>,
}
module!(ActorCritic { p1: "p1", p2: "p2", p3: "p3", v1: "v1", v2: "v2", v3: "v3" });

fn actor_critic(b: &Cpu, seed: u64) -> Result<ActorCritic<Cpu>> {
    let layer = |i, o, k: u64| Linear::new(b, i, o, true, DType::F32, seed.wrapping_mul(31).wrapping_add(k));
    let mut p3 = layer(64, 2, 3)?;
    // the policy starts close to uniform
    p3.weight = p3.weight.scale(0.01)?.detach().into_var();
    Ok(ActorCritic {
        p1: layer(4, 64, 1)?,
        p2: layer(64, 64, 2)?,
        p3,
        v1: layer(4, 64, 4)?,
        v2: layer(64, 64, 5)?,
        v3: layer(64, 1, 6)?,
    })
}

impl ActorCritic<Cpu> {
    /// Action logits `[n, 2]` and values `[n]` of observations `[n, 4]`.
    fn forward(&self, obs: &Tensor<Cpu>) -> Result<(Tensor<Cpu>, Tensor<Cpu>)> {
        let logits = self.p3.forward(&self.p2.forward(&self.p1.forward(obs)?.tanh()?)?.tanh()?)?;
        let value = self.v3.forward(&self.v2.forward(&self.v1.forward(obs)?.tanh()?)?.tanh()?)?;
        Ok((logits, value.squeeze(-1)?))
    }
}

/// One transition of a rollout, with its advantage (normalised over the rollout) and
/// return.
#[derive(Clone)]
struct Transition {
    obs: [f32; 4],
    action: i64,
    logp: f32,
    adv: f32,
    ret: f32,
}

/// The three functions' `collate_fn`: transitions stacked into tensors.
fn collate_fn(b: &Cpu, ex: &[Transition]) -> Result<Batch<Cpu>> {
    let n = ex.len();
    let col = |f: fn(&Transition) -> f32| Tensor::from_vec(b, ex.iter().map(f).collect::<Vec<f32>>(), [n]);
    Ok(Batch::from([
        ("obs".into(), Tensor::from_vec(b, ex.iter().flat_map(|e| e.obs).collect::<Vec<f32>>(), [n, 4])?),
        ("action".into(), Tensor::from_vec(b, ex.iter().map(|e| e.action).collect::<Vec<i64>>(), [n, 1])?),
        ("logp".into(), col(|e| e.logp)?),
        ("adv".into(), col(|e| e.adv)?),
        ("ret".into(), col(|e| e.ret)?),
    ]))
}

/// The three functions' `loss_fn`: PPO's clipped surrogate objective (negated) plus the
/// value loss; the clip range anneals with the learning rate.
fn loss_fn(ctx: &StepCtx<Cpu>, m: &ActorCritic<Cpu>, batch: &Batch<Cpu>, total_steps: u64) -> Result<Tensor<Cpu>> {
    let clip = CLIP * (1.0 - ctx.step as f64 / total_steps as f64);
    let (logits, value) = m.forward(&batch["obs"])?;
    let logp = logits.log_softmax(-1)?.gather(&batch["action"], -1)?.squeeze(-1)?;
    let ratio = logp.sub(&batch["logp"])?.exp()?;
    let adv = &batch["adv"];
    // clamp(ratio, 1 - clip, 1 + clip)
    let clipped = ratio.clamp_min(1.0 - clip)?.neg()?.clamp_min(-(1.0 + clip))?.neg()?;
    let surrogate = ratio.mul(adv)?.minimum(&clipped.mul(adv)?)?.mean_all()?;
    let value_loss = value.sub(&batch["ret"])?.square()?.mean_all()?;
    value_loss.scale(VALUE_COEF)?.sub(&surrogate)
}

/// The three functions' `pred_fn`: the probability of action 1 and the value of each
/// observation.
fn pred_fn(b: &Cpu, m: &ActorCritic<Cpu>, obs: &[[f32; 4]]) -> Result<(Vec<f32>, Vec<f32>)> {
    let x = Tensor::from_vec(b, obs.iter().flatten().copied().collect::<Vec<f32>>(), [obs.len(), 4])?;
    no_grad(|| {
        let (logits, value) = m.forward(&x)?;
        Ok((logits.softmax(-1)?.narrow(-1, 1, 1)?.to_vec_f32()?, value.to_vec_f32()?))
    })
}

/// The weights the Trainer exported to `path`, in a model made like the Trainer's.
fn load(b: &Cpu, path: &Path, seed: u64) -> Result<ActorCritic<Cpu>> {
    let saved = read_all(path)?;
    let mut m = actor_critic(b, seed)?;
    let mut err = None;
    m.visit_mut("", &mut |name, p| match saved.get(name) {
        Some(t) => match Tensor::from_host(b, &t.data, t.shape.clone()) {
            Ok(x) => *p = x.into_var(),
            Err(e) => err = Some(e),
        },
        None => err = Some(redco::Error::invalid("ppo", format!("{name} is not in the exported model"))),
    });
    err.map_or(Ok(m), Err)
}

/// The environments between rollouts, and the returns of the episodes they finished.
struct Envs {
    envs: Vec<CartPole>,
    rng: Rng,
    returns: Vec<f64>,
}

/// One rollout of `STEPS` steps of every environment with the policy `m`, as transitions
/// with GAE advantages (normalised over the rollout) and returns. A truncated episode's
/// last step bootstraps from the value of its final state.
fn rollout(b: &Cpu, m: &ActorCritic<Cpu>, envs: &mut Envs) -> Result<Vec<Transition>> {
    let n = ENVS;
    let (mut obs, mut act, mut logp, mut val) = (vec![], vec![], vec![], vec![]);
    // per step and env: whether the episode ended there, and the value to bootstrap from
    let (mut ended, mut boot) = (vec![], vec![]);
    for _ in 0..STEPS {
        let o: Vec<[f32; 4]> = envs.envs.iter().map(CartPole::obs).collect();
        let (p1, v) = pred_fn(b, m, &o)?;
        for (i, env) in envs.envs.iter_mut().enumerate() {
            let a = usize::from(envs.rng.uniform(0.0, 1.0) < f64::from(p1[i]));
            let p = if a == 1 { p1[i] } else { 1.0 - p1[i] };
            let (terminated, truncated) = env.step(a);
            let mut bootstrap = 0.0;
            if truncated {
                bootstrap = pred_fn(b, m, &[env.obs()])?.1[0];
            }
            if terminated || truncated {
                envs.returns.push(env.t as f64);
                *env = CartPole::reset(&mut envs.rng);
            }
            obs.push(o[i]);
            act.push(a as i64);
            logp.push(p.max(1e-12).ln());
            val.push(v[i]);
            ended.push(terminated || truncated);
            boot.push(bootstrap);
        }
    }
    let last: Vec<[f32; 4]> = envs.envs.iter().map(CartPole::obs).collect();
    let (_, v_last) = pred_fn(b, m, &last)?;
    let mut adv = vec![0.0f64; n * STEPS];
    for (e, &v_end) in v_last.iter().enumerate() {
        let mut gae = 0.0;
        for t in (0..STEPS).rev() {
            let k = t * n + e;
            let next = if ended[k] {
                f64::from(boot[k])
            } else if t + 1 == STEPS {
                f64::from(v_end)
            } else {
                f64::from(val[k + n])
            };
            let carry = if ended[k] { 0.0 } else { 1.0 };
            let delta = 1.0 + GAMMA * next - f64::from(val[k]);
            gae = delta + GAMMA * LAMBDA * carry * gae;
            adv[k] = gae;
        }
    }
    let mean = adv.iter().sum::<f64>() / adv.len() as f64;
    let std = (adv.iter().map(|a| (a - mean).powi(2)).sum::<f64>() / adv.len() as f64).sqrt();
    Ok((0..n * STEPS)
        .map(|k| Transition {
            obs: obs[k],
            action: act[k],
            logp: logp[k],
            adv: ((adv[k] - mean) / (std + 1e-8)) as f32,
            ret: (adv[k] + f64::from(val[k])) as f32,
        })
        .collect())
}

/// Mean return of the policy (actions sampled from it, as in training) over
/// `EVAL_EPISODES` episodes played together.
fn evaluate(b: &Cpu, m: &ActorCritic<Cpu>, seed: u64) -> Result<f64> {
    let mut rng = Rng(seed ^ 0xe7a1);
    let mut envs: Vec<CartPole> = (0..EVAL_EPISODES).map(|_| CartPole::reset(&mut rng)).collect();
    let mut live: Vec<usize> = (0..EVAL_EPISODES).collect();
    let mut total = 0.0;
    while !live.is_empty() {
        let o: Vec<[f32; 4]> = live.iter().map(|&i| envs[i].obs()).collect();
        let (p1, _) = pred_fn(b, m, &o)?;
        let mut still = vec![];
        for (j, &i) in live.iter().enumerate() {
            let (terminated, truncated) = envs[i].step(usize::from(rng.uniform(0.0, 1.0) < f64::from(p1[j])));
            if terminated || truncated {
                total += envs[i].t as f64;
            } else {
                still.push(i);
            }
        }
        live = still;
    }
    Ok(total / EVAL_EPISODES as f64)
}

fn main() -> Result<()> {
    redco::cpu::malloc::tune();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let seed: u64 = args.first().and_then(|s| s.parse().ok()).unwrap_or(0);
    let budget: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(200_000);
    let mesh: redco::runtime::Mesh = args.get(2).map_or("1x1", |s| s.as_str()).parse()?;
    let per_iter = ENVS * STEPS;
    let iters = budget.div_ceil(per_iter);
    let total_steps = iters as u64 * EPOCHS;
    let workdir = std::env::temp_dir().join(format!("redco-ppo-{}-{seed}", std::process::id()));
    let _ = std::fs::remove_dir_all(&workdir);
    let mut config = TrainConfig {
        batch_size: per_iter,
        steps: 0,
        schedule: Schedule { peak: LR, warmup: 0, total: total_steps, decay: Decay::Linear },
        optimizer: OptimizerConfig::AdamW(AdamWConfig { eps: 1e-5, weight_decay: 0.0, ..AdamWConfig::default() }),
        clip_norm: Some(0.5),
        checkpoint_at_epoch_end: false,
        keep_last: 1,
        log_every: u64::MAX,
        tokens_key: None,
        ..Default::default()
    };
    let dep = Deployer::new(mesh, seed, &workdir)?;
    let b = Cpu::new(1);
    let mut policy = actor_critic(&b, seed)?;
    let mut rng = Rng(seed);
    let envs: Vec<CartPole> = (0..ENVS).map(|_| CartPole::reset(&mut rng)).collect();
    let mut envs = Envs { envs, rng, returns: vec![] };
    let (mut best, mut solved_at) = (0.0f64, None);
    println!("PPO on CartPole-v1, seed {seed}, mesh {mesh}, at most {budget} environment steps");
    for it in 0..iters {
        // the rollout's many small ops on the backend's own thread (one hand-off)
        let data = on_backend(&b, || rollout(&b, &policy, &mut envs))?;
        config.steps = (it as u64 + 1) * EPOCHS;
        let trainer = Trainer::new(
            move |b: &Cpu| actor_critic(b, seed),
            collate_fn,
            move |ctx: &StepCtx<Cpu>, m: &ActorCritic<Cpu>, batch: &Batch<Cpu>| loss_fn(ctx, m, batch, total_steps),
            config.clone(),
        );
        trainer.fit(&dep, &data, true)?;
        policy = load(&b, &workdir.join("model.safetensors"), seed)?;
        if (it + 1) % EVAL_EVERY == 0 || it + 1 == iters {
            let steps = (it + 1) * per_iter;
            let score = on_backend(&b, || evaluate(&b, &policy, seed.wrapping_add(it as u64)))?;
            let recent = &envs.returns[envs.returns.len().saturating_sub(20)..];
            let train_mean = recent.iter().sum::<f64>() / recent.len().max(1) as f64;
            println!("  env steps {steps:7}  training episodes' return {train_mean:6.1}  evaluation {score:6.1}");
            best = best.max(score);
            if score >= SOLVED {
                solved_at = Some(steps);
                break;
            }
        }
    }
    let _ = std::fs::remove_dir_all(&workdir);
    match solved_at {
        Some(steps) => {
            println!(
                "solved: mean return of {EVAL_EPISODES} evaluation episodes >= {SOLVED} after {steps} environment steps"
            );
            println!("result ppo {steps}");
            Ok(())
        }
        None => {
            println!("not solved within {budget} environment steps (best evaluation {best:.1})");
            println!("result ppo none");
            Err(redco::Error::invalid("ppo", format!("CartPole-v1 not solved in {budget} environment steps")))
        }
    }
}
