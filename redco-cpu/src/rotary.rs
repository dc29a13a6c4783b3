//! CPU rotary embedding: one pass over the rows, rows in parallel, both conventions.

use super::float_kernel;
use super::half_rows::{by_blocks, HalfIn};
use super::real::Real;
use super::strided::run_rows;
use redco_core::backend::RotaryMode;
use redco_core::{Error, HostData, Result, Shape};

/// Rotates the first `2 * half` features of every row of `x` (`[.., seq, d]`); the tables
/// are `[seq, half]`, or `[batch, seq, half]` for `x` of shape `[batch, heads, seq, d]`.
/// `x` holds the rows from `r0` on (of the whole tensor's row order).
fn rotary_t<T: Real>(x: &[T], c: &[T], s: &[T], dims: &[usize], cs: &[usize], mode: RotaryMode, r0: usize) -> Vec<T> {
    let d = dims[dims.len() - 1];
    let seq = dims[dims.len() - 2];
    let half = cs[cs.len() - 1];
    // rows per batch element of the table (heads x seq) when tables are per row
    let per_batch = if cs.len() == 3 { dims[1] * seq } else { 0 };
    let mut o = vec![T::zero(); x.len()];
    if d == 0 {
        return o;
    }
    run_rows(
        &mut o,
        d,
        x.len() / d,
        #[inline(always)]
        |r, out| {
            let row = &x[r * d..(r + 1) * d];
            let r = r0 + r;
            let t = r.checked_div(per_batch).map_or(r % seq, |b| b * seq + r % seq);
            let (c, s) = (&c[t * half..(t + 1) * half], &s[t * half..(t + 1) * half]);
            match mode {
                RotaryMode::HalfSplit => {
                    for i in 0..half {
                        let (a, b) = (row[i], row[i + half]);
                        out[i] = a * c[i] - b * s[i];
                        out[i + half] = b * c[i] + a * s[i];
                    }
                }
                RotaryMode::Interleaved => {
                    for i in 0..half {
                        let (a, b) = (row[2 * i], row[2 * i + 1]);
                        out[2 * i] = a * c[i] - b * s[i];
                        out[2 * i + 1] = b * c[i] + a * s[i];
                    }
                }
            }
            out[2 * half..].copy_from_slice(&row[2 * half..]);
        },
    );
    o
}

/// Rotary embedding of `x` with tables `cos`, `sin` of shape `cs_shape`.
pub(crate) fn rotary(
    x: &HostData,
    shape: &Shape,
    cos: &HostData,
    sin: &HostData,
    cs_shape: &Shape,
    mode: RotaryMode,
) -> Result<HostData> {
    let (dims, cs) = (shape.dims(), cs_shape.dims());
    let ok = dims.len() >= 2
        && (cs.len() == 2 || (cs.len() == 3 && dims.len() == 4 && cs[0] == dims[0]))
        && cs[cs.len() - 2] == dims[dims.len() - 2]
        && 2 * cs[cs.len() - 1] <= dims[dims.len() - 1];
    if !ok {
        return Err(Error::ShapeMismatch { op: "rotary", lhs: shape.clone(), rhs: cs_shape.clone() });
    }
    let d = dims[dims.len() - 1];
    let same = |t: &HostData| t.dtype() == x.dtype();
    if let (Some(xh), true) = (HalfIn::of(x, d).filter(|_| d > 0), same(cos) && same(sin)) {
        let (c, s) = (cos.to_f32_vec(), sin.to_f32_vec());
        return by_blocks("rotary", [xh], x.len() / d, d, |r0, [xs]| rotary_t(xs, &c, &s, dims, cs, mode, r0));
    }
    Ok(float_kernel!(x.dtype(), [x => v, cos => c, sin => s], rotary_t(v, c, s, dims, cs, mode, 0)))
}
