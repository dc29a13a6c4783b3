//! The `redco-pjrt-<mesh>` rows of `bench llm`: the bench LLaMA's training step compiled
//! into one PJRT program ([`redco_tpu::CompiledTrainStep`]: one SPMD program over the
//! mesh's devices, split by the plan the Trainer derives, its collectives the program's
//! own), timed with the host read of the loss at the end
//! of each step, as the eager rows are; and greedy decoding with a compiled prompt step and
//! token step ([`redco_tpu::CompiledDecode`], on one device). The forward pass alone is not
//! compiled (its column is `-`).

use super::llm::{ADAMW, BATCH, PROMPT, SEQ};
use super::llm_child::RankTimes;
use redco_core::nn::ModuleExt;
use redco_core::planning::trace::plan_from_trace;
use redco_core::{planning::ShardPlan, runtime::Mesh};
use redco_core::{DType, Error, Tensor};
use redco_cpu::Cpu;
use redco_models::generate::FixedKvCache;
use redco_models::hf::config::HfConfig;
use redco_models::llama::Llama;
use redco_tpu::{CacheShape, CompiledDecode, CompiledTrainStep, KvPair, Pjrt, Tracer};
use std::time::Instant;

/// A warm-up (which compiles) then `steps` timed compiled training steps, then as many
/// compiled greedy generates of `new` tokens.
pub fn measure_compiled(
    b: &Pjrt,
    mesh: Mesh,
    cfg: &HfConfig,
    (ids, prompt): (&[i64], &[i64]),
    (steps, new): (usize, usize),
    only: Option<&str>,
) -> Result<RankTimes, String> {
    let e = |e: Error| e.to_string();
    let mut out = RankTimes { train: vec![], phases: vec![], fwd: vec![], decode: vec![], loss: f64::NAN };
    if only.is_none_or(|o| o == "decode") {
        out.decode = decode(b, cfg, prompt, steps, new).map_err(e)?;
    }
    if only.is_some_and(|o| o != "train") {
        return Ok(out);
    }
    let model = Llama::new(b, cfg, DType::F32, 0).map_err(e)?;
    let x = Tensor::from_vec(b, ids.to_vec(), [BATCH, SEQ]).map_err(e)?;
    let t0 = Instant::now();
    let plan = plan(mesh, cfg, ids).map_err(e)?;
    let mut step = CompiledTrainStep::on_mesh(
        b,
        &plan,
        &model,
        ADAMW,
        &[&x],
        |t| Llama::new(t, cfg, DType::F32, 0),
        |m, batch| m.loss(&batch[0], None, &batch[0]),
    )
    .map_err(e)?;
    eprintln!("redco-pjrt: the step traced and compiled in {:.2} s", t0.elapsed().as_secs_f64());
    for i in 0..=steps {
        let t = Instant::now();
        out.loss = step.step(&[&x]).map(|r| r.loss).map_err(e)?;
        if i > 0 {
            let s = t.elapsed().as_secs_f64();
            out.train.push(s);
            out.phases.push([s, 0.0, 0.0, 0.0]);
        }
    }
    if !out.loss.is_finite() {
        return Err(format!("the compiled training loss is {}", out.loss));
    }
    Ok(out)
}

/// The plan the Trainer derives for `mesh`: the two rules on the bench model's traced loss.
fn plan(mesh: Mesh, cfg: &HfConfig, ids: &[i64]) -> redco_core::Result<ShardPlan> {
    let cpu = Cpu::new(1);
    let m = Llama::new(&cpu, cfg, DType::F32, 0)?;
    let x = Tensor::from_vec(&cpu, ids.to_vec(), [BATCH, SEQ])?;
    let loss = m.loss(&x, None, &x)?;
    plan_from_trace(&m.named_parameters(), &[&loss], mesh, false)
}

/// The bench decoder's logits over a fixed cache (the traced step of [`CompiledDecode`]).
fn logits(
    m: &Llama<Tracer>,
    ids: &Tensor<Tracer>,
    kv: Vec<KvPair>,
    len: Tensor<Tracer>,
) -> redco_core::Result<(Tensor<Tracer>, Vec<KvPair>, Tensor<Tracer>)> {
    let mut c = FixedKvCache::from_parts(kv, len)?;
    let h = m.hidden_states_fixed(ids, None, &mut c)?;
    let (kv, len) = c.into_parts();
    Ok((m.head(&h)?, kv, len))
}

/// Seconds of `steps` timed compiled generates of `new` tokens (after a warm-up).
fn decode(b: &Pjrt, cfg: &HfConfig, prompt: &[i64], steps: usize, new: usize) -> redco_core::Result<Vec<f64>> {
    let model = Llama::new(b, cfg, DType::F32, 0)?;
    let shape = CacheShape {
        layers: cfg.layers,
        batch: 1,
        kv_heads: cfg.kv_heads,
        capacity: PROMPT + new,
        head_dim: cfg.head_dim,
    };
    let t0 = Instant::now();
    let dec = CompiledDecode::new(b, &model, shape, PROMPT, |t| Llama::new(t, cfg, DType::F32, 0), logits)?;
    eprintln!("redco-pjrt: the decoder traced and compiled in {:.2} s", t0.elapsed().as_secs_f64());
    let p = Tensor::from_vec(b, prompt.to_vec(), [1, PROMPT])?;
    let mut times = Vec::new();
    for i in 0..=steps {
        let t = Instant::now();
        let rows = dec.generate(&p, new)?;
        if rows.first().map(|r| r.len()) != Some(new) {
            return Err(Error::invalid("bench llm decode", "the compiled decoder returned the wrong number of tokens"));
        }
        if i > 0 {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    Ok(times)
}
