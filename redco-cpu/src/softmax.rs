//! CPU softmax and log-softmax over the last dim, one row at a time, rows in parallel.

use super::float_kernel;
use super::half_rows::{by_blocks, HalfIn};
use super::real::Real;
use super::strided::{filled, init_from, run_rows};
use redco_core::{HostData, Result, Shape};

fn softmax_t<T: Real>(x: &[T], d: usize, log: bool) -> Vec<T> {
    let n = x.len();
    if n == 0 || d == 0 {
        return vec![T::zero(); n];
    }
    filled(n, |o| {
        run_rows(
            o,
            d,
            n,
            #[inline(always)]
            |r, out| {
                let row = &x[r * d..(r + 1) * d];
                let m = T::row_max(row);
                let out = init_from(out, row);
                let s = T::exp_shift_sum(out, m);
                if log {
                    let ls = s.ln();
                    out.iter_mut().zip(row).for_each(|(o, &v)| *o = v - m - ls);
                } else {
                    let inv = T::one() / s;
                    out.iter_mut().for_each(|o| *o = *o * inv);
                }
            },
        )
    })
}

/// Softmax (or log-softmax) over the last dim of `x`.
pub(crate) fn softmax(x: &HostData, shape: &Shape, log: bool) -> Result<HostData> {
    let d = *shape.dims().last().unwrap_or(&1);
    if let Some(xh) = HalfIn::of(x, d) {
        let rows = x.len().checked_div(d).unwrap_or(0);
        return by_blocks("softmax", [xh], rows, d, |_, [xs]| softmax_t(xs, d, log));
    }
    Ok(float_kernel!(x.dtype(), [x => v], softmax_t(v, d, log)))
}
