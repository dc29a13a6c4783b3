//! AdamW in one pass (`kernels/adamw.wgsl`): one kernel reads the parameter, its gradient
//! and both moments once and writes all three results, with the f32 scalars of the CPU's
//! fused step.

use crate::device::groups_1d;
use crate::{check_same, u32p, Wgpu, WgpuStorage};
use redco_core::ops::adamw::AdamStep;
use redco_core::{Error, Result};

/// One AdamW step of `n` elements; returns the new `(x, m, v)`.
pub(crate) fn adamw(
    w: &Wgpu,
    x: &WgpuStorage,
    g: &WgpuStorage,
    m: &WgpuStorage,
    v: &WgpuStorage,
    n: usize,
    h: &AdamStep,
) -> Result<(WgpuStorage, WgpuStorage, WgpuStorage)> {
    for s in [g, m, v] {
        check_same(x, s, "adamw")?;
    }
    if [x, g, m, v].iter().any(|s| s.len < n) {
        return Err(Error::invalid("adamw", format!("operands of {n} elements expected")));
    }
    let (xo, mo, vo) = (w.alloc(n, x.dtype)?, w.alloc(n, x.dtype)?, w.alloc(n, x.dtype)?);
    let (b1, b2) = (h.beta1 as f32, h.beta2 as f32);
    let params = [
        u32p(n, "elements")?,
        b1.to_bits(),
        b2.to_bits(),
        (1.0 - b1).to_bits(),
        (1.0 - b2).to_bits(),
        ((1.0 / h.bias1) as f32).to_bits(),
        ((1.0 / h.bias2) as f32).to_bits(),
        (h.lr as f32).to_bits(),
        (h.eps as f32).to_bits(),
        ((1.0 - h.lr * h.weight_decay) as f32).to_bits(),
    ];
    let (store, xt) = (w.store(x.dtype), w.elem(x.dtype));
    let key = format!("adamw/{xt}/{store}");
    let src = || crate::tpl(include_str!("kernels/adamw.wgsl"), &[("$STORE", store), ("$XT", xt)]);
    w.launch_outs(&key, src, &[x, g, m, v], &[&xo, &mo, &vo], &params, groups_1d(n))?;
    Ok((xo, mo, vo))
}
