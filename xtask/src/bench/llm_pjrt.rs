//! The `redco-pjrt-<mesh>` rows of `bench llm`: the bench LLaMA's training step compiled
//! into one PJRT program ([`redco_tpu::CompiledTrainStep`]), timed with the host read of
//! the loss at the end of each step, as the eager rows are.

use super::llm::{ADAMW, BATCH, SEQ};
use super::llm_child::RankTimes;
use redco_core::{DType, Error, Tensor};
use redco_models::hf::config::HfConfig;
use redco_models::llama::Llama;
use redco_tpu::{CompiledTrainStep, Pjrt};
use std::time::Instant;

/// A warm-up (which compiles) then `steps` timed compiled steps; forward and decode are
/// not compiled yet, so this row measures training only.
pub fn measure_compiled(
    b: &Pjrt,
    cfg: &HfConfig,
    ids: &[i64],
    steps: usize,
    only: Option<&str>,
) -> Result<RankTimes, String> {
    let e = |e: Error| e.to_string();
    let mut out = RankTimes { train: vec![], phases: vec![], fwd: vec![], decode: vec![], loss: f64::NAN };
    if only.is_some_and(|o| o != "train") {
        return Ok(out);
    }
    let model = Llama::new(b, cfg, DType::F32, 0).map_err(e)?;
    let x = Tensor::from_vec(b, ids.to_vec(), [BATCH, SEQ]).map_err(e)?;
    let t0 = Instant::now();
    let mut step = CompiledTrainStep::new(
        b,
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
        out.loss = step.step(&[&x]).and_then(|l| l.to_scalar()).map_err(e)?;
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
