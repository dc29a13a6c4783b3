//! CPU AdamW: one pass over the parameter, its gradient and both moments, in parallel chunks.

use super::CpuStorage;
use crate::ops::adamw::AdamStep;
use crate::{Error, HostData, Result};
use rayon::prelude::*;

const CHUNK: usize = 1 << 14;

fn step_f32(x: &[f32], g: &[f32], m: &[f32], v: &[f32], h: &AdamStep) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let n = x.len();
    let (mut xo, mut mo, mut vo) = (Vec::with_capacity(n), Vec::with_capacity(n), Vec::with_capacity(n));
    let (b1, b2) = (h.beta1 as f32, h.beta2 as f32);
    let (c1, c2) = (1.0 - b1, 1.0 - b2);
    let (ib1, ib2) = ((1.0 / h.bias1) as f32, (1.0 / h.bias2) as f32);
    let (lr, eps) = (h.lr as f32, h.eps as f32);
    let decay = (1.0 - h.lr * h.weight_decay) as f32;
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
                        let mn = b1 * m + c1 * g;
                        let vn = b2 * v + c2 * (g * g);
                        let denom = (vn * ib2).sqrt() + eps;
                        mo.write(mn);
                        vo.write(vn);
                        xo.write(x * decay - lr * ((mn * ib1) / denom));
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
