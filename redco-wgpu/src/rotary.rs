//! Rotary position embedding, both conventions (`kernels/rotary.wgsl`: one invocation per
//! output element, partial rotary dims and per-row tables).

use crate::{check_same, tpl, u32p, Wgpu, WgpuStorage};
use redco_core::backend::RotaryMode;
use redco_core::{Error, Result, Shape};

/// Rotates the first `2 * half` features of every row of `x` (`[.., seq, d]`) by the tables
/// `cos`/`sin` of shape `cs_shape`: `[seq, half]`, or `[batch, seq, half]` for `x` of shape
/// `[batch, heads, seq, d]`.
pub(crate) fn rotary(
    w: &Wgpu,
    x: &WgpuStorage,
    shape: &Shape,
    cos: &WgpuStorage,
    sin: &WgpuStorage,
    cs_shape: &Shape,
    mode: RotaryMode,
) -> Result<WgpuStorage> {
    let (dims, cs) = (shape.dims(), cs_shape.dims());
    let fits = dims.len() >= 2
        && (cs.len() == 2 || (cs.len() == 3 && dims.len() == 4 && cs[0] == dims[0]))
        && cs[cs.len() - 2] == dims[dims.len() - 2]
        && 2 * cs[cs.len() - 1] <= dims[dims.len() - 1]
        && cos.len == cs_shape.elem_count()
        && sin.len == cs_shape.elem_count();
    if !fits {
        return Err(Error::ShapeMismatch { op: "rotary", lhs: shape.clone(), rhs: cs_shape.clone() });
    }
    check_same(x, cos, "rotary (cos)")?;
    check_same(x, sin, "rotary (sin)")?;
    let (d, seq, half) = (dims[dims.len() - 1], dims[dims.len() - 2], cs[cs.len() - 1]);
    let per_batch = if cs.len() == 3 { dims[1] * seq } else { 0 };
    let n = x.len;
    if n == 0 || d == 0 {
        return w.alloc(n, x.dtype);
    }
    let pair = match mode {
        RotaryMode::HalfSplit => {
            "let k = j % half; let first = j < half; let a = f32(x[rd + k]); let b = f32(x[rd + k + half]);"
        }
        RotaryMode::Interleaved => {
            "let k = j / 2u; let first = j % 2u == 0u; let a = f32(x[rd + 2u * k]); let b = f32(x[rd + 2u * k + 1u]);"
        }
    };
    let (store, xt) = (w.store(x.dtype), w.elem(x.dtype));
    let key = format!("rotary/{mode:?}/{xt}/{store}");
    let src = || tpl(include_str!("kernels/rotary.wgsl"), &[("$PAIR", pair), ("$STORE", store), ("$XT", xt)]);
    let params = [
        u32p(n, "elements")?,
        u32p(d, "head dim")?,
        u32p(seq, "sequence")?,
        u32p(half, "rotary half")?,
        u32p(per_batch, "rows per batch entry")?,
    ];
    w.map_kernel(&key, src, &[x, cos, sin], n, x.dtype, &params)
}
