//! `--quantize q8_0|q4_0|q4_k|q6_k` on `generate`, `serve` and `eval-dump`: the model's
//! linear layers are quantized to llama.cpp's blocks as they are loaded (each rank its part
//! under `--mesh 1xN`) and multiplied from the blocks in place.

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
    let Some(f) = format else { return AutoModel::from_pretrained(b, dir, dtype, plan) };
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
