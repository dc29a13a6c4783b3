//! CPU fused attention, forward and backward: one task per (batch, key/value head), each
//! computing the `q_len x kv_len` probabilities of its query heads with a GEMM, masking
//! (causal and broadcast keep-mask) and a softmax in place, then the GEMMs with the values
//! (forward) or with the output gradient (backward, which recomputes the probabilities
//! instead of storing them). Grouped-query heads read their shared key/value head directly
//! (no repeat), and no `[batch, heads, q, kv]` tensor is materialised.
//!
//! Masked keys get probability 0 without an exponential; a row whose keys are all masked
//! is uniform, which equals the softmax of scores filled with the most negative value.

use super::matmul::{gemm_strided, GemmElem, Strides};
use super::real::Real;
use super::{floats, Cpu, CpuStorage, Floats, Store};
use rayon::prelude::*;
use redco_core::ops::attention::AttentionSpec;
use redco_core::{Error, HostData, Result, Shape};

/// The keep-mask bytes and their strides over `[batch, q_heads, q_len, kv_len]`.
type Keep<'a> = Option<(&'a [u8], Vec<usize>)>;

fn keep_of<'a>(mask: Option<&'a CpuStorage>, spec: &AttentionSpec) -> Result<Keep<'a>> {
    match (mask, &spec.mask_shape) {
        (Some(m), Some(s)) => {
            let HostData::U8(m) = &*m.0 else {
                return Err(Error::UnsupportedDType { op: "attention (mask)", dtype: m.0.dtype() });
            };
            let full = Shape::new([spec.batch, spec.q_heads, spec.q_len, spec.kv_len]);
            Ok(Some((m.as_slice(), s.broadcast_strides(&full))))
        }
        _ => Ok(None),
    }
}

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
    let keep = keep_of(mask, spec)?;
    let out = b.run(|| match (floats(&q.0), floats(&k.0), floats(&v.0)) {
        (Floats::F32(q), Floats::F32(k), Floats::F32(v)) => Ok(f32::store(attend(&q, &k, &v, &keep, spec), dt)),
        (Floats::F64(q), Floats::F64(k), Floats::F64(v)) => Ok(f64::store(attend(&q, &k, &v, &keep, spec), dt)),
        _ => Err(Error::invalid("attention", "q, k and v have different dtypes")),
    })?;
    Ok(CpuStorage::new(out))
}

/// The gradients `(dq, dk, dv)` of fused attention on the CPU.
pub(crate) fn attention_backward(
    b: &Cpu,
    q: &CpuStorage,
    k: &CpuStorage,
    v: &CpuStorage,
    mask: Option<&CpuStorage>,
    dout: &CpuStorage,
    spec: &AttentionSpec,
) -> Result<(CpuStorage, CpuStorage, CpuStorage)> {
    let dt = q.0.dtype();
    let keep = keep_of(mask, spec)?;
    let st = |(a, b, c): (HostData, HostData, HostData)| (CpuStorage::new(a), CpuStorage::new(b), CpuStorage::new(c));
    b.run(|| match (floats(&q.0), floats(&k.0), floats(&v.0), floats(&dout.0)) {
        (Floats::F32(q), Floats::F32(k), Floats::F32(v), Floats::F32(g)) => {
            let (dq, dk, dv) = attend_backward(&q, &k, &v, &g, &keep, spec);
            Ok(st((f32::store(dq, dt), f32::store(dk, dt), f32::store(dv, dt))))
        }
        (Floats::F64(q), Floats::F64(k), Floats::F64(v), Floats::F64(g)) => {
            let (dq, dk, dv) = attend_backward(&q, &k, &v, &g, &keep, spec);
            Ok(st((f64::store(dq, dt), f64::store(dk, dt), f64::store(dv, dt))))
        }
        _ => Err(Error::invalid("attention backward", "q, k, v and the gradient have different dtypes")),
    })
}

/// Fills `p` (`q_len x kv_len`) with the attention probabilities of query head `h` of
/// batch entry `bi` (queries `qs`, keys `ks`).
fn probs<T: Real + GemmElem>(qs: &[T], ks: &[T], p: &mut [T], (bi, h): (usize, usize), keep: &Keep, s: &AttentionSpec) {
    let (tq, tk, d) = (s.q_len, s.kv_len, s.head_dim);
    // scores = q k^T: k stored [tk, d] read as [d, tk] (row stride 1, column stride d)
    gemm_strided(tq, tk, d, qs, ks, p, Strides { a_rs: d, a_cs: 1, b_rs: 1, b_cs: d }, 1);
    let scale = T::of(s.scale);
    let offset = tk as i64 - tq as i64;
    for (i, row) in p.chunks_mut(tk).enumerate() {
        // causal: keys past `lim` are masked (lim >= 1 since q_len <= kv_len)
        let lim = if s.causal { (i as i64 + offset + 1).clamp(0, tk as i64) as usize } else { tk };
        let mut any = lim > 0;
        if let Some((m, ms)) = keep {
            let base = bi * ms[0] + h * ms[1] + i * ms[2];
            any = false;
            for (j, x) in row[..lim].iter_mut().enumerate() {
                if m[base + j * ms[3]] != 0 {
                    *x = *x * scale;
                    any = true;
                } else {
                    *x = T::neg_infinity();
                }
            }
        } else {
            row[..lim].iter_mut().for_each(|x| *x = *x * scale);
        }
        if !any {
            let u = T::one() / T::of(tk as f64);
            row.iter_mut().for_each(|x| *x = u);
            continue;
        }
        let (live, dead) = row.split_at_mut(lim);
        dead.iter_mut().for_each(|x| *x = T::zero());
        let mx = T::row_max(live);
        let inv = T::one() / T::exp_shift_sum(live, mx);
        live.iter_mut().for_each(|x| *x = *x * inv);
    }
}

fn attend<T: Real + GemmElem>(q: &[T], k: &[T], v: &[T], keep: &Keep, s: &AttentionSpec) -> Vec<T> {
    let (tq, tk, d) = (s.q_len, s.kv_len, s.head_dim);
    let rep = s.q_heads / s.kv_heads;
    let mut out = vec![T::zero(); s.batch * s.q_heads * tq * d];
    if out.is_empty() || tk == 0 {
        return out;
    }
    // each task in the CPU's widest vector copy (the GEMMs pick their own kernels)
    out.par_chunks_mut(tq * d).enumerate().for_each(|(bh, o)| {
        super::simd::vectorized(
            #[inline(always)]
            || {
                let (bi, h) = (bh / s.q_heads, bh % s.q_heads);
                let kvh = bi * s.kv_heads + h / rep;
                let qs = &q[bh * tq * d..(bh + 1) * tq * d];
                let ks = &k[kvh * tk * d..(kvh + 1) * tk * d];
                let vs = &v[kvh * tk * d..(kvh + 1) * tk * d];
                let mut p = vec![T::zero(); tq * tk];
                probs(qs, ks, &mut p, (bi, h), keep, s);
                gemm_strided(tq, d, tk, &p, vs, o, Strides { a_rs: tk, a_cs: 1, b_rs: d, b_cs: 1 }, 1);
            },
        )
    });
    out
}

type Grads<T> = (Vec<T>, Vec<T>, Vec<T>);

fn attend_backward<T: Real + GemmElem>(q: &[T], k: &[T], v: &[T], g: &[T], keep: &Keep, s: &AttentionSpec) -> Grads<T> {
    let (tq, tk, d) = (s.q_len, s.kv_len, s.head_dim);
    let rep = s.q_heads / s.kv_heads;
    let mut dq = vec![T::zero(); s.batch * s.q_heads * tq * d];
    let mut dk = vec![T::zero(); s.batch * s.kv_heads * tk * d];
    let mut dv = vec![T::zero(); dk.len()];
    if dq.is_empty() || dk.is_empty() {
        return (dq, dk, dv);
    }
    let scale = T::of(s.scale);
    let n_h = tq * d;
    // one task per (batch, kv head): it owns that head's dk/dv and its query heads' dq
    dq.par_chunks_mut(rep * n_h).zip(dk.par_chunks_mut(tk * d).zip(dv.par_chunks_mut(tk * d))).enumerate().for_each(
        |(kvh, (dqg, (dkh, dvh)))| {
            super::simd::vectorized(
                #[inline(always)]
                || {
                    let bi = kvh / s.kv_heads;
                    let ks = &k[kvh * tk * d..(kvh + 1) * tk * d];
                    let vs = &v[kvh * tk * d..(kvh + 1) * tk * d];
                    let mut p = vec![T::zero(); tq * tk];
                    let mut dp = vec![T::zero(); tq * tk];
                    let mut tmp = vec![T::zero(); tk * d];
                    for (r, dqh) in dqg.chunks_mut(n_h).enumerate() {
                        let h = (kvh % s.kv_heads) * rep + r;
                        let bh = bi * s.q_heads + h;
                        let qs = &q[bh * n_h..(bh + 1) * n_h];
                        let gs = &g[bh * n_h..(bh + 1) * n_h];
                        probs(qs, ks, &mut p, (bi, h), keep, s);
                        // dv += p^T g
                        gemm_strided(tk, d, tq, &p, gs, &mut tmp, Strides { a_rs: 1, a_cs: tk, b_rs: d, b_cs: 1 }, 1);
                        dvh.iter_mut().zip(&tmp).for_each(|(a, &b)| *a = *a + b);
                        // dp = g v^T, then ds = p * (dp - rowsum(p * dp)) * scale in place of dp
                        gemm_strided(tq, tk, d, gs, vs, &mut dp, Strides { a_rs: d, a_cs: 1, b_rs: 1, b_cs: d }, 1);
                        for (pr, dr) in p.chunks(tk).zip(dp.chunks_mut(tk)) {
                            let dot = pr.iter().zip(dr.iter()).fold(T::zero(), |acc, (&a, &b)| acc + a * b);
                            for (x, &pv) in dr.iter_mut().zip(pr) {
                                *x = pv * (*x - dot) * scale;
                            }
                        }
                        // dq = ds k ; dk += ds^T q
                        gemm_strided(tq, d, tk, &dp, ks, dqh, Strides { a_rs: tk, a_cs: 1, b_rs: d, b_cs: 1 }, 1);
                        gemm_strided(tk, d, tq, &dp, qs, &mut tmp, Strides { a_rs: 1, a_cs: tk, b_rs: d, b_cs: 1 }, 1);
                        dkh.iter_mut().zip(&tmp).for_each(|(a, &b)| *a = *a + b);
                    }
                },
            )
        },
    );
    (dq, dk, dv)
}
