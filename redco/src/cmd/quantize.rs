//! `--quantize q8_0|q4_0|q4_k|q6_k` on `generate`, `serve` and `eval-dump`: the model's
//! linear layers are quantized to llama.cpp's blocks as they are loaded (each rank its part
//! under `--mesh 1xN`) and multiplied from the blocks in place.

use redco_core::quant::QuantFormat;
use redco_core::{Backend, Result};
use redco_models::auto::AutoModel;

/// The format `--quantize` names (None without the flag).
pub fn format(arg: Option<&str>) -> Result<Option<QuantFormat>> {
    arg.map(QuantFormat::parse).transpose()
}

/// `model` with its linear layers quantized to `format` (as it is without one); the
/// layers left in floats (rows not whole blocks) are named on stderr, by rank 0.
pub fn apply<B: Backend>(mut model: AutoModel<B>, format: Option<QuantFormat>, speak: bool) -> Result<AutoModel<B>> {
    let Some(f) = format else { return Ok(model) };
    let (done, left) = model.quantize(f)?;
    if done.is_empty() {
        return Err(redco_core::Error::invalid(
            "quantize",
            format!("no linear layer of this model has rows of whole {f} blocks ({} values)", f.block_values()),
        ));
    }
    if speak && !left.is_empty() {
        crate::cmd::out::warn(format_args!(
            "redco: --quantize {f}: {} of {} linear layers left in floats (rows not whole blocks of {}): {}",
            left.len(),
            done.len() + left.len(),
            f.block_values(),
            left.join(", ")
        ));
    }
    Ok(model)
}
