//! LayerNorm and RMSNorm over the last dimension (`kernels/norm.wgsl`, one row per segment
//! of a workgroup, see `rows.rs`), statistics in f32 with a two-pass variance.

use crate::{check_same, rows, u32p, Wgpu, WgpuStorage};
use redco_core::{Error, Result, Shape};

/// LayerNorm (`center`) or RMSNorm of `x` over the last dim of `shape`, with the optional
/// scale `weight` and shift `bias` (`[d]`, the dtype of `x`).
pub(crate) fn norm(
    w: &Wgpu,
    x: &WgpuStorage,
    shape: &Shape,
    weight: Option<&WgpuStorage>,
    bias: Option<&WgpuStorage>,
    eps: f64,
    center: bool,
) -> Result<WgpuStorage> {
    let op = if center { "layer_norm" } else { "rms_norm" };
    let d = shape.dims().last().copied().unwrap_or(1);
    for p in [weight, bias].into_iter().flatten() {
        check_same(x, p, op)?;
        if p.len != d {
            return Err(Error::ShapeMismatch { op, lhs: shape.clone(), rhs: Shape::new([p.len]) });
        }
    }
    let out = w.alloc(x.len, x.dtype)?;
    if x.len == 0 || d == 0 {
        return Ok(out);
    }
    let n_rows = x.len / d;
    let tpr = rows::threads_per_row(d);
    let (store, xt) = (w.store(x.dtype), w.elem(x.dtype));
    let affine = match (weight.is_some(), bias.is_some()) {
        (false, false) => "v",
        (true, false) => "v * f32(w[j])",
        (false, true) => "v + f32(b[j])",
        (true, true) => "v * f32(w[j]) + f32(b[j])",
    };
    let key = format!("norm/{center}/{}/{}/{tpr}/{xt}/{store}", weight.is_some(), bias.is_some());
    let src = || {
        rows::source(
            include_str!("kernels/norm.wgsl"),
            tpr,
            &[("$CENTER", if center { "true" } else { "false" }), ("$STORE", store), ("$AFFINE", affine), ("$XT", xt)],
        )
    };
    // absent parameters are bound to `x` (never read)
    let (wt, bt) = (weight.unwrap_or(x), bias.unwrap_or(x));
    let params = [u32p(n_rows, "rows")?, u32p(d, "row length")?, (eps as f32).to_bits()];
    w.launch(&key, src, &[x, wt, bt], &out, &params, rows::groups(n_rows, tpr)?)?;
    Ok(out)
}
