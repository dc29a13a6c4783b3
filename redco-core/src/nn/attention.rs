//! Scaled-dot-product attention with causal and padding masks and grouped-query heads.

use crate::backend::CmpOp;
use crate::{Backend, Error, Result, Tensor};

/// Turns a `[batch, kv_len]` attention mask (1 = token, 0 = padding; any integer or float
/// dtype) into the `U8` keep-mask `[batch, 1, 1, kv_len]` that attention broadcasts.
pub fn padding_mask<B: Backend>(mask: &Tensor<B>) -> Result<Tensor<B>> {
    if mask.rank() != 2 {
        return Err(Error::invalid("padding_mask", format!("expected [batch, kv_len], got {}", mask.shape())));
    }
    let keep = mask.compare_scalar(0.0, CmpOp::Ne)?;
    let (b, s) = (mask.dims()[0], mask.dims()[1]);
    keep.reshape([b, 1, 1, s])
}

/// Attention of `q` `[batch, q_heads, q_len, d]` over `k`, `v` `[batch, kv_heads, kv_len, d]`
/// with an optional `[batch, kv_len]` padding mask, an optional causal mask, and
/// `scale` (default `1/sqrt(d)`). Masked scores take the most negative finite value, so a
/// fully padded row yields finite outputs (a uniform average), never NaN.
pub fn scaled_dot_product_attention<B: Backend>(
    q: &Tensor<B>,
    k: &Tensor<B>,
    v: &Tensor<B>,
    padding: Option<&Tensor<B>>,
    causal: bool,
    scale: Option<f64>,
) -> Result<Tensor<B>> {
    let d = *q.dims().last().unwrap_or(&1);
    let scale = scale.unwrap_or(1.0 / (d as f64).sqrt());
    let mask = padding.map(padding_mask).transpose()?;
    q.attention(k, v, mask.as_ref(), causal, scale)
}
