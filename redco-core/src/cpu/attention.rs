//! CPU fused attention: one task per (batch, head), each computing its `q_len x kv_len`
//! scores with a GEMM, masking (causal and broadcast keep-mask) and softmax in place, and a
//! second GEMM with the values. Grouped-query heads read their shared key/value head
//! directly (no repeat), and no `[batch, heads, q, kv]` tensor is materialised.

use super::matmul::{gemm_strided, GemmElem, Strides};
use super::real::Real;
use super::{floats, Cpu, CpuStorage, Floats, Store};
use crate::ops::attention::{mask_fill, AttentionSpec};
use crate::{Error, HostData, Result, Shape};
use rayon::prelude::*;

/// Fused attention on the CPU.
pub(crate) fn attention(
    b: &Cpu,
    q: &CpuStorage,
    k: &CpuStorage,
    v: &CpuStorage,
    mask: Option<&CpuStorage>,
    spec: &AttentionSpec,
) -> Result<CpuStorage> {
    let dt = q.0.dtype();
    let keep = match (mask, &spec.mask_shape) {
        (Some(m), Some(s)) => {
            let HostData::U8(m) = &*m.0 else {
                return Err(Error::UnsupportedDType { op: "attention (mask)", dtype: m.0.dtype() });
            };
            Some((m.as_slice(), s.clone()))
        }
        _ => None,
    };
    let fill = mask_fill(dt);
    let out = b.run(|| match (floats(&q.0), floats(&k.0), floats(&v.0)) {
        (Floats::F32(q), Floats::F32(k), Floats::F32(v)) => {
            Ok(f32::store(attend(&q, &k, &v, keep.as_ref(), spec, fill as f32), dt))
        }
        (Floats::F64(q), Floats::F64(k), Floats::F64(v)) => {
            Ok(f64::store(attend(&q, &k, &v, keep.as_ref(), spec, fill), dt))
        }
        _ => Err(Error::invalid("attention", "q, k and v have different dtypes")),
    })?;
    Ok(CpuStorage::new(out))
}

fn attend<T: Real + GemmElem>(
    q: &[T],
    k: &[T],
    v: &[T],
    keep: Option<&(&[u8], Shape)>,
    s: &AttentionSpec,
    fill: T,
) -> Vec<T> {
    let (tq, tk, d) = (s.q_len, s.kv_len, s.head_dim);
    let rep = s.q_heads / s.kv_heads;
    let full = Shape::new([s.batch, s.q_heads, tq, tk]);
    let mstr = keep.map(|(_, ms)| ms.broadcast_strides(&full));
    let mut out = vec![T::zero(); s.batch * s.q_heads * tq * d];
    if out.is_empty() || tk == 0 {
        return out;
    }
    let scale = T::of(s.scale);
    let offset = tk as i64 - tq as i64;
    out.par_chunks_mut(tq * d).enumerate().for_each(|(bh, o)| {
        let (bi, h) = (bh / s.q_heads, bh % s.q_heads);
        let kvh = bi * s.kv_heads + h / rep;
        let qs = &q[bh * tq * d..(bh + 1) * tq * d];
        let ks = &k[kvh * tk * d..(kvh + 1) * tk * d];
        let vs = &v[kvh * tk * d..(kvh + 1) * tk * d];
        let mut sc = vec![T::zero(); tq * tk];
        // scores = q k^T: k stored [tk, d] read as [d, tk] (row stride 1, column stride d)
        gemm_strided(tq, tk, d, qs, ks, &mut sc, Strides { a_rs: d, a_cs: 1, b_rs: 1, b_cs: d }, 1);
        for (i, row) in sc.chunks_mut(tk).enumerate() {
            for (j, x) in row.iter_mut().enumerate() {
                let mut ok = !s.causal || (j as i64) <= i as i64 + offset;
                if let (Some((m, _)), Some(ms)) = (keep, &mstr) {
                    ok &= m[bi * ms[0] + h * ms[1] + i * ms[2] + j * ms[3]] != 0;
                }
                *x = if ok { *x * scale } else { fill };
            }
            let mx = row.iter().copied().fold(T::neg_infinity(), T::max);
            let mut sum = T::zero();
            for x in row.iter_mut() {
                *x = (*x - mx).exp();
                sum = sum + *x;
            }
            let inv = T::one() / sum;
            row.iter_mut().for_each(|x| *x = *x * inv);
        }
        gemm_strided(tq, d, tk, &sc, vs, o, Strides { a_rs: tk, a_cs: 1, b_rs: d, b_cs: 1 }, 1);
    });
    out
}
