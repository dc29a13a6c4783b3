//! `--quantize q8_0|q4_0|q4_1|q4_k|q6_k` on `generate`, `serve` and `eval-dump`: the
//! model's linear layers are quantized to llama.cpp's blocks as they are loaded (each rank
//! its part under `--mesh 1xN`) and multiplied from the blocks in place. AWQ and GPTQ int4
//! checkpoints load as `Q4_1` blocks without the flag (how is named on stderr).

use redco_core::nn::Module;
use redco_core::planning::ShardPlan;
use redco_core::quant::QuantFormat;
use redco_core::{Backend, DType, Result};
use redco_models::auto::AutoModel;
use std::path::Path;

/// The format `--quantize` names (None without the flag).
pub fn format(arg: Option<&str>) -> Result<Option<QuantFormat>> {
    arg.map(QuantFormat::parse).transpose()
}

/// The model of `dir` (under `plan`), its linear layers quantized to `format` as they
/// are read when one is given; the layers left in floats (rows not whole blocks) are named
/// on stderr when `speak`.
pub fn load<B: Backend>(
    b: &B,
    dir: &Path,
    dtype: DType,
    plan: Option<&ShardPlan>,
    format: Option<QuantFormat>,
    speak: bool,
) -> Result<AutoModel<B>> {
    let Some(f) = format else {
        let model = AutoModel::from_pretrained(b, dir, dtype, plan)?;
        if speak {
            int4_note(dir, &model)?;
        }
        return Ok(model);
    };
    let model = AutoModel::from_pretrained_quantized(b, dir, dtype, plan, f)?;
    let (left, mut all) = (model.float_linears(), 0);
    model.visit_linears("", &mut |name, _| all += usize::from(!name.ends_with(".gate")));
    if left.len() == all {
        return Err(redco_core::Error::invalid(
            "quantize",
            format!("no linear layer of this model has rows of whole {f} blocks ({} values)", f.block_values()),
        ));
    }
    if speak && !left.is_empty() {
        crate::cmd::out::warn(format_args!(
            "redco: --quantize {f}: {} of {all} linear layers left in floats (rows not whole blocks of {}): {}",
            left.len(),
            f.block_values(),
            left.join(", ")
        ));
    }
    Ok(model)
}

/// For an AWQ or GPTQ checkpoint, names on stderr how its linear layers were read: as
/// `Q4_1` blocks, or as floats (GPTQ's activation order, groups not whole blocks).
fn int4_note<B: Backend>(dir: &Path, model: &AutoModel<B>) -> Result<()> {
    if dir.extension().is_some_and(|e| e == "gguf") || !dir.join("config.json").exists() {
        return Ok(());
    }
    let cfg = redco_models::hf::config::HfConfig::from_dir(dir)?;
    let Some(layout) = cfg.int4()? else { return Ok(()) };
    let (mut blocks, mut floats) = (0usize, Vec::new());
    model.visit_linears("", &mut |name, l| {
        if layout.quantizes(&format!("{name}.weight")) {
            match l.quant {
                Some(_) => blocks += 1,
                None => floats.push(name.to_string()),
            }
        }
    });
    let why = if layout.act_order { "activation order" } else { "groups not whole blocks of 32" };
    let floats = if floats.is_empty() {
        String::new()
    } else {
        format!("; {} dequantized to floats ({why}): {}", floats.len(), floats.join(", "))
    };
    crate::cmd::out::warn(format_args!(
        "redco: {} int4 checkpoint: {blocks} linear layers as Q4_1 blocks{floats}",
        layout.name().to_uppercase()
    ));
    Ok(())
}
