//! Softmax and log-softmax over the last dimension (`kernels/softmax.wgsl`, one row per
//! segment of a workgroup, see `rows.rs`).

use crate::{rows, u32p, Wgpu, WgpuStorage};
use redco_core::{Result, Shape};

/// Softmax (or, with `log`, log-softmax) of `x` over the last dim of `shape`.
pub(crate) fn softmax(w: &Wgpu, x: &WgpuStorage, shape: &Shape, log: bool) -> Result<WgpuStorage> {
    let d = shape.dims().last().copied().unwrap_or(1);
    let out = w.alloc(x.len, x.dtype)?;
    if x.len == 0 || d == 0 {
        return Ok(out);
    }
    let n_rows = x.len / d;
    let tpr = rows::threads_per_row(d);
    let (store, xt) = (w.store(x.dtype), w.elem(x.dtype));
    let expr = if log { "v - mx - ls" } else { "exp(v - mx) * inv" };
    let key = format!("softmax/{log}/{tpr}/{xt}/{store}");
    let src = || {
        rows::source_lse(include_str!("kernels/softmax.wgsl"), tpr, &[("$STORE", store), ("$OUT", expr), ("$XT", xt)])
    };
    let params = [u32p(n_rows, "rows")?, u32p(d, "row length")?];
    w.launch(&key, src, &[x], &out, &params, rows::groups(n_rows, tpr)?)?;
    Ok(out)
}
