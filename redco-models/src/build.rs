//! Building blocks for the model constructors: layers whose parameters come from a
//! [`ParamSource`] by their transformers names, and the shared checkpoint loader.

use crate::hf::checkpoint::Checkpoint;
use crate::hf::config::HfConfig;
use crate::params::{CheckpointSource, ParamSource};
use redco_core::nn::{Embedding, Init, LayerNorm, Linear, RmsNorm};
use redco_core::planning::ShardPlan;
use redco_core::{Backend, DType, Error, Result, Shape};
use std::path::Path;

/// A linear layer `inp -> out` named `name` (`name.weight`, `name.bias`), initialised as
/// PyTorch does when fresh.
pub fn linear<B: Backend>(
    src: &mut dyn ParamSource<B>,
    name: &str,
    inp: usize,
    out: usize,
    bias: bool,
) -> Result<Linear<B>> {
    let bound = Init::Uniform(1.0 / (inp.max(1) as f64).sqrt());
    let weight = format!("{name}.weight");
    let blocks = src.blocks(&weight, &Shape::new([out, inp]))?;
    let b = if bias { Some(src.param(&format!("{name}.bias"), Shape::new([out]), bound)?) } else { None };
    match blocks {
        Some((w, format)) => Linear::from_blocks(w, format, b),
        None => Linear::from_tensors(src.param(&weight, Shape::new([out, inp]), bound)?, b),
    }
}

/// A LayerNorm over `dim` with weight and bias.
pub fn layer_norm<B: Backend>(src: &mut dyn ParamSource<B>, name: &str, dim: usize, eps: f64) -> Result<LayerNorm<B>> {
    Ok(LayerNorm {
        weight: Some(src.param(&format!("{name}.weight"), Shape::new([dim]), Init::Const(1.0))?),
        bias: Some(src.param(&format!("{name}.bias"), Shape::new([dim]), Init::Const(0.0))?),
        eps,
    })
}

/// An RMSNorm over `dim` (weight only).
pub fn rms_norm<B: Backend>(src: &mut dyn ParamSource<B>, name: &str, dim: usize, eps: f64) -> Result<RmsNorm<B>> {
    Ok(RmsNorm { weight: src.param(&format!("{name}.weight"), Shape::new([dim]), Init::Const(1.0))?, eps })
}

/// A lookup table of `rows x dim` named `name.weight`.
pub fn embedding<B: Backend>(
    src: &mut dyn ParamSource<B>,
    name: &str,
    rows: usize,
    dim: usize,
    std: f64,
) -> Result<Embedding<B>> {
    Ok(Embedding { weight: src.param(&format!("{name}.weight"), Shape::new([rows, dim]), Init::Normal(std))? })
}

/// Reads `dir`'s config, checks its `model_type` is one of `types`, checks the checkpoint
/// against the config's parameter list (every missing, unexpected or mis-shaped tensor is
/// named; `ignore` names stored buffers that are not parameters), then builds the model
/// reading each parameter (under a plan, each rank's slice only).
pub fn load<B: Backend, M>(
    b: &B,
    dir: &Path,
    dtype: DType,
    plan: Option<&ShardPlan>,
    types: &[&str],
    ignore: &dyn Fn(&str) -> bool,
    build: impl FnOnce(&HfConfig, &mut dyn ParamSource<B>) -> Result<M>,
) -> Result<M> {
    let cfg = HfConfig::from_dir(dir)?;
    if !types.contains(&cfg.model_type.as_str()) {
        return Err(Error::invalid(
            "load",
            format!(
                "{} has model_type `{}`, but this loader reads {}",
                dir.join("config.json").display(),
                cfg.model_type,
                types.join(", ")
            ),
        ));
    }
    let ckpt = Checkpoint::open(dir)?;
    let blocks = cfg.block_formats()?;
    let int4 = cfg.int4()?;
    CheckpointSource::<B>::check(
        &ckpt,
        &crate::params::stored_shapes(cfg.param_shapes()?, &blocks, int4.as_ref())?,
        ignore,
    )?;
    build(&cfg, &mut CheckpointSource::new(b, &ckpt, plan, dtype).with_blocks(blocks).with_int4(int4))
}
