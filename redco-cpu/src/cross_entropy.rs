//! CPU fused cross-entropy, forward and backward: one pass per row for the log-sum-exp and
//! the picked logit, and one pass per row writing `(softmax - onehot) * grad`, rows in
//! parallel. Targets equal to the ignore index give 0 (and a zero gradient row).

use super::half_rows::{by_blocks, HalfIn};
use super::real::Real;
use super::strided::{filled, init_from, run_rows};
use super::{floats, ids_of, Cpu, CpuStorage, Floats, Store};
use redco_core::{Error, Result, Shape};

/// Checks the ids and returns them with the row length.
fn rows(shape: &Shape, targets: &CpuStorage, ignore: i64, op: &'static str) -> Result<(Vec<i64>, usize)> {
    let d = shape.dims();
    if d.len() != 2 {
        return Err(Error::invalid(op, format!("logits must be [rows, vocab], got {shape}")));
    }
    let t = ids_of(targets, op)?;
    if t.len() != d[0] {
        return Err(Error::invalid(op, format!("{} targets for {} rows", t.len(), d[0])));
    }
    if let Some(&bad) = t.iter().find(|&&i| i != ignore && (i < 0 || i as usize >= d[1])) {
        return Err(Error::IndexOutOfRange { op, index: bad, size: d[1] });
    }
    Ok((t, d[1]))
}

/// Per-row cross-entropy of `logits` `[n, vocab]` against `targets` `[n]`.
pub(crate) fn forward(
    b: &Cpu,
    logits: &CpuStorage,
    shape: &Shape,
    targets: &CpuStorage,
    ignore: i64,
) -> Result<CpuStorage> {
    let (t, v) = rows(shape, targets, ignore, "cross_entropy")?;
    let dt = logits.0.dtype();
    if let Some(xh) = HalfIn::of(&logits.0, v).filter(|_| v > 0) {
        let out = b.run(|| {
            by_blocks("cross_entropy", [xh], t.len(), 1, |r0, [xs]| forward_t(xs, &t[r0..r0 + xs.len() / v], v, ignore))
        })?;
        return Ok(CpuStorage::new(out));
    }
    let out = b.run(|| match floats(&logits.0) {
        Floats::F32(x) => f32::store(forward_t(&x, &t, v, ignore), dt),
        Floats::F64(x) => f64::store(forward_t(&x, &t, v, ignore), dt),
    });
    Ok(CpuStorage::new(out))
}

fn forward_t<T: Real>(x: &[T], t: &[i64], v: usize, ignore: i64) -> Vec<T> {
    let mut out = vec![T::zero(); t.len()];
    if v == 0 {
        return out;
    }
    // one output per row: chunk the (short) output so that each task covers many rows
    let per = (1usize << 14).div_ceil(v).max(1);
    use rayon::prelude::*;
    // each task in the CPU's widest vector copy
    out.par_chunks_mut(per).enumerate().for_each(|(c, o)| {
        super::simd::vectorized(
            #[inline(always)]
            || {
                let mut buf = vec![T::zero(); v];
                for (k, o) in o.iter_mut().enumerate() {
                    let r = c * per + k;
                    if t[r] == ignore {
                        continue;
                    }
                    let row = &x[r * v..(r + 1) * v];
                    let m = T::row_max(row);
                    buf.copy_from_slice(row);
                    let lse = T::exp_shift_sum(&mut buf, m).ln() + m;
                    *o = lse - row[t[r] as usize];
                }
            },
        )
    });
    out
}

/// The gradient of [`forward`] given the per-row output gradient `g` `[n]`.
pub(crate) fn backward(
    b: &Cpu,
    logits: &CpuStorage,
    shape: &Shape,
    targets: &CpuStorage,
    ignore: i64,
    g: &CpuStorage,
) -> Result<CpuStorage> {
    let (t, v) = rows(shape, targets, ignore, "cross_entropy backward")?;
    let dt = logits.0.dtype();
    if let (Some(xh), Some(gh), true) = (HalfIn::of(&logits.0, v), HalfIn::of(&g.0, 1), v > 0) {
        let out = b.run(|| {
            by_blocks("cross_entropy backward", [xh, gh], t.len(), v, |r0, [xs, gs]| {
                backward_t(xs, &t[r0..r0 + gs.len()], v, ignore, gs)
            })
        })?;
        return Ok(CpuStorage::new(out));
    }
    let out = b.run(|| match (floats(&logits.0), floats(&g.0)) {
        (Floats::F32(x), Floats::F32(g)) => Ok(f32::store(backward_t(&x, &t, v, ignore, &g), dt)),
        (Floats::F64(x), Floats::F64(g)) => Ok(f64::store(backward_t(&x, &t, v, ignore, &g), dt)),
        _ => Err(Error::invalid("cross_entropy backward", "logits and gradient have different dtypes")),
    })?;
    Ok(CpuStorage::new(out))
}

fn backward_t<T: Real>(x: &[T], t: &[i64], v: usize, ignore: i64, g: &[T]) -> Vec<T> {
    let n = x.len();
    if n == 0 || v == 0 {
        return vec![T::zero(); n];
    }
    filled(n, |out| {
        run_rows(
            out,
            v,
            n,
            #[inline(always)]
            |r, o| {
                if t[r] == ignore {
                    o.iter_mut().for_each(|p| {
                        p.write(T::zero());
                    });
                    return;
                }
                let row = &x[r * v..(r + 1) * v];
                let m = T::row_max(row);
                let o = init_from(o, row);
                let w = g[r] / T::exp_shift_sum(o, m);
                o.iter_mut().for_each(|p| *p = *p * w);
                let ti = t[r] as usize;
                o[ti] = o[ti] - g[r];
            },
        )
    })
}
