//! CPU AdamW: one pass over the parameter, its gradient and both moments, in parallel chunks.

use super::CpuStorage;
use rayon::prelude::*;
use redco_core::ops::adamw::AdamStep;
use redco_core::{Error, HostData, Result};

const CHUNK: usize = 1 << 14;

/// The update's constants in f32.
#[derive(Clone, Copy)]
struct Consts {
    b1: f32,
    b2: f32,
    c1: f32,
    c2: f32,
    ib1: f32,
    ib2: f32,
    lr: f32,
    eps: f32,
    decay: f32,
}

impl Consts {
    fn of(h: &AdamStep) -> Consts {
        let (b1, b2) = (h.beta1 as f32, h.beta2 as f32);
        Consts {
            b1,
            b2,
            c1: 1.0 - b1,
            c2: 1.0 - b2,
            ib1: (1.0 / h.bias1) as f32,
            ib2: (1.0 / h.bias2) as f32,
            lr: h.lr as f32,
            eps: h.eps as f32,
            decay: (1.0 - h.lr * h.weight_decay) as f32,
        }
    }

    /// One element: the new `(x, m, v)`.
    #[inline(always)]
    fn update(&self, x: f32, g: f32, m: f32, v: f32) -> (f32, f32, f32) {
        let mn = self.b1 * m + self.c1 * g;
        let vn = self.b2 * v + self.c2 * (g * g);
        let denom = (vn * self.ib2).sqrt() + self.eps;
        (x * self.decay - self.lr * ((mn * self.ib1) / denom), mn, vn)
    }
}

fn step_f32(x: &[f32], g: &[f32], m: &[f32], v: &[f32], h: &AdamStep) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let n = x.len();
    let (mut xo, mut mo, mut vo) = (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
    let k = Consts::of(h);
    let (xs, ms, vs) =
        (&mut xo.spare_capacity_mut()[..n], &mut mo.spare_capacity_mut()[..n], &mut vo.spare_capacity_mut()[..n]);
    xs.par_chunks_mut(CHUNK).zip(ms.par_chunks_mut(CHUNK)).zip(vs.par_chunks_mut(CHUNK)).enumerate().for_each(
        |(c, ((xo, mo), vo))| {
            let (o, len) = (c * CHUNK, xo.len());
            let (xi, gi, mi, vi) = (&x[o..o + len], &g[o..o + len], &m[o..o + len], &v[o..o + len]);
            // the widest vectors of the CPU (8 or 16 lanes of sqrt and divide); zipped slices,
            // so that no bounds check stops the loop from vectorising
            super::simd::vectorized(
                #[inline(always)]
                || {
                    let outs = xo.iter_mut().zip(mo.iter_mut()).zip(vo.iter_mut());
                    let ins = xi.iter().zip(gi).zip(mi).zip(vi);
                    for (((xo, mo), vo), (((&x, &g), &m), &v)) in outs.zip(ins) {
                        let (xn, mn, vn) = k.update(x, g, m, v);
                        mo.write(mn);
                        vo.write(vn);
                        xo.write(xn);
                    }
                },
            )
        },
    );
    // SAFETY: the chunks cover all n elements of each output, and each was written above.
    unsafe {
        xo.set_len(n);
        mo.set_len(n);
        vo.set_len(n);
    }
    (xo, mo, vo)
}

/// [`step_f32`] with the moments updated in place; returns the new `x`.
fn step_f32_in_place(x: &[f32], g: &[f32], m: &mut [f32], v: &mut [f32], h: &AdamStep) -> Vec<f32> {
    let n = x.len();
    let mut xo = Vec::with_capacity(n);
    let k = Consts::of(h);
    let xs = &mut xo.spare_capacity_mut()[..n];
    xs.par_chunks_mut(CHUNK).zip(m.par_chunks_mut(CHUNK)).zip(v.par_chunks_mut(CHUNK)).enumerate().for_each(
        |(c, ((xo, mo), vo))| {
            let (o, len) = (c * CHUNK, xo.len());
            let (xi, gi) = (&x[o..o + len], &g[o..o + len]);
            super::simd::vectorized(
                #[inline(always)]
                || {
                    let outs = xo.iter_mut().zip(mo.iter_mut()).zip(vo.iter_mut());
                    for (((xo, m), v), (&x, &g)) in outs.zip(xi.iter().zip(gi)) {
                        let (xn, mn, vn) = k.update(x, g, *m, *v);
                        *m = mn;
                        *v = vn;
                        xo.write(xn);
                    }
                },
            )
        },
    );
    // SAFETY: the chunks cover all n elements, each written above.
    unsafe { xo.set_len(n) };
    xo
}

/// The fused step with the moments written in place, where all four are f32 of `n`
/// elements and `m`'s and `v`'s buffers are not shared; `None` otherwise (nothing
/// touched).
pub(crate) fn adamw_in_place(
    x: &CpuStorage,
    g: &CpuStorage,
    m: &mut CpuStorage,
    v: &mut CpuStorage,
    n: usize,
    h: &AdamStep,
) -> Option<HostData> {
    let (HostData::F32(x), HostData::F32(g)) = (x.data(), g.data()) else { return None };
    let (Some(HostData::F32(m)), Some(HostData::F32(v))) =
        (std::sync::Arc::get_mut(&mut m.0), std::sync::Arc::get_mut(&mut v.0))
    else {
        return None;
    };
    if [x.len(), g.len(), m.len(), v.len()].iter().any(|&l| l != n) {
        return None;
    }
    Some(HostData::F32(step_f32_in_place(x, g, m, v, h)))
}

/// The fused step for f32 storage; `None` for other dtypes (the composite handles them).
pub(crate) fn adamw(
    x: &CpuStorage,
    g: &CpuStorage,
    m: &CpuStorage,
    v: &CpuStorage,
    n: usize,
    h: &AdamStep,
) -> Result<Option<(HostData, HostData, HostData)>> {
    match (x.data(), g.data(), m.data(), v.data()) {
        (HostData::F32(x), HostData::F32(g), HostData::F32(m), HostData::F32(v)) => {
            if [x.len(), g.len(), m.len(), v.len()].iter().any(|&l| l != n) {
                return Err(Error::invalid("adamw", format!("operands of {n} elements expected")));
            }
            let (a, b, c) = step_f32(x, g, m, v, h);
            Ok(Some((HostData::F32(a), HostData::F32(b), HostData::F32(c))))
        }
        _ => Ok(None),
    }
}
