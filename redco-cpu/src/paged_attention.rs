//! CPU paged attention: one task per query head, each reading its key/value head's rows of
//! the pools in place through each segment's row list (no gathered copy), a score per
//! visible key (a dot product of independent partial sums, so it vectorizes), a softmax,
//! and the weighted sum of the value rows. f32 and f64 pools, and 16-bit (bf16, f16) pools
//! read as they are: each key and value element widened to f32 in registers where it is
//! used, so a step reads half the bytes of an f32 pool (the math in f32, the output
//! narrowed once: bit for bit the f32 kernel on the widened values). f32 queries over
//! 16-bit pools (a bf16 or f16 cache under f32 weights) take the same widening path and
//! give f32.

use super::real::Real;
use super::{Cpu, CpuStorage};
use half::f16;
use rayon::prelude::*;
use redco_core::dtype::{bf16_to_f32, f32_to_bf16};
use redco_core::ops::paged_attention::PagedSpec;
use redco_core::{HostData, Result};

/// The fused kernel, or `None` for dtypes it does not take.
pub(crate) fn paged_attention(
    b: &Cpu,
    q: &CpuStorage,
    k: &CpuStorage,
    v: &CpuStorage,
    spec: &PagedSpec<'_>,
) -> Result<Option<CpuStorage>> {
    let out = match (&*q.0, &*k.0, &*v.0) {
        (HostData::F32(q), HostData::F32(k), HostData::F32(v)) => HostData::F32(b.run(|| paged(q, k, v, spec, &id))),
        (HostData::F64(q), HostData::F64(k), HostData::F64(v)) => HostData::F64(b.run(|| paged(q, k, v, spec, &id))),
        (HostData::BF16(q), HostData::BF16(k), HostData::BF16(v)) => {
            let q: Vec<f32> = q.iter().map(|&x| bf16_to_f32(x)).collect();
            let o = b.run(|| paged(&q, k, v, spec, &bf16_to_f32));
            HostData::BF16(o.into_iter().map(f32_to_bf16).collect())
        }
        (HostData::F16(q), HostData::F16(k), HostData::F16(v)) => {
            let q: Vec<f32> = q.iter().map(|x| x.to_f32()).collect();
            let o = b.run(|| paged(&q, k, v, spec, &f16::to_f32));
            HostData::F16(o.into_iter().map(f16::from_f32).collect())
        }
        // a 16-bit cache under f32 queries: the pools widened where read, the output f32
        (HostData::F32(q), HostData::BF16(k), HostData::BF16(v)) => {
            HostData::F32(b.run(|| paged(q, k, v, spec, &bf16_to_f32)))
        }
        (HostData::F32(q), HostData::F16(k), HostData::F16(v)) => {
            HostData::F32(b.run(|| paged(q, k, v, spec, &f16::to_f32)))
        }
        _ => return Ok(None),
    };
    Ok(Some(CpuStorage::new(out)))
}

/// The identity, as the widening of a pool already in the math's type.
#[inline(always)]
fn id<T>(x: T) -> T {
    x
}

/// The kernel over pools of `E`, each element widened by `w` to the math's `T` where it is
/// read.
fn paged<T: Real, E: Copy + Sync>(
    q: &[T],
    k: &[E],
    v: &[E],
    s: &PagedSpec<'_>,
    w: &(impl Fn(E) -> T + Sync),
) -> Vec<T> {
    let (t, d) = (s.tokens, s.head_dim);
    let rep = s.q_heads / s.kv_heads;
    let scale = T::of(s.scale);
    let mut out = vec![T::zero(); s.q_heads * t * d];
    if out.is_empty() {
        return out;
    }
    out.par_chunks_mut(t * d).enumerate().for_each(|(h, o)| {
        super::simd::vectorized(
            #[inline(always)]
            || {
                let kvh = h / rep;
                let at = |r: usize| (r * s.kv_heads + kvh) * d;
                let mut p: Vec<T> = Vec::new();
                for sg in s.segments {
                    let kv_len = sg.slots.len();
                    for i in 0..sg.q_len {
                        let qa = (h * t + sg.q_start + i) * d;
                        let qi = &q[qa..qa + d];
                        // causal: the query at position kv_len - q_len + i sees keys up to it
                        let lim = kv_len - sg.q_len + i + 1;
                        p.clear();
                        // a plain loop, not `extend(map)`: an iterator adapter's `fold` is
                        // compiled apart from this vectorized closure (baseline SSE, measured
                        // at 18% of a serving run), a loop body is inlined into it
                        let slots = &sg.slots[..lim];
                        for (n, &r) in slots.iter().enumerate() {
                            // the pool rows are scattered (blocks anywhere, a head's rows a
                            // token apart): fetch the key a few rows ahead while this one is
                            // scored
                            if let Some(&ahead) = slots.get(n + AHEAD) {
                                prefetch_row(&k[at(ahead)..at(ahead) + d]);
                            }
                            p.push(dot(qi, &k[at(r)..at(r) + d], w) * scale);
                        }
                        let mx = T::row_max(&p);
                        let inv = T::one() / T::exp_shift_sum(&mut p, mx);
                        let oi = &mut o[(sg.q_start + i) * d..(sg.q_start + i + 1) * d];
                        for (n, (&pr, &r)) in p.iter().zip(slots).enumerate() {
                            if let Some(&ahead) = slots.get(n + AHEAD) {
                                prefetch_row(&v[at(ahead)..at(ahead) + d]);
                            }
                            let pr = pr * inv;
                            oi.iter_mut().zip(&v[at(r)..at(r) + d]).for_each(|(x, &y)| *x = *x + pr * w(y));
                        }
                    }
                }
            },
        )
    });
    out
}

/// Keys (and values) ahead of the one in use whose rows [`prefetch_row`] asks for.
const AHEAD: usize = 4;

/// Asks the CPU to bring `row`'s cache lines into L1 (a hint: nothing is read or checked).
#[inline(always)]
fn prefetch_row<E>(row: &[E]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let bytes = std::mem::size_of_val(row);
        let base = row.as_ptr() as *const i8;
        for off in (0..bytes).step_by(64) {
            // SAFETY: a prefetch never faults; the address is inside `row`
            unsafe { _mm_prefetch::<_MM_HINT_T0>(base.add(off)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = row;
}

/// Lanes of [`dot`]'s independent partial sums (one 512-bit register of f32).
const LANES: usize = 16;

/// `a . b` with [`LANES`] independent partial sums, then those summed pairwise (halves
/// added to halves): the multiply-adds of one key vectorize instead of waiting on each
/// other, and so does the reduction.
#[inline(always)]
fn dot<T: Real, E: Copy>(a: &[T], b: &[E], w: &impl Fn(E) -> T) -> T {
    let mut acc = [T::zero(); LANES];
    let (ca, cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for j in 0..LANES {
            acc[j] = acc[j] + x[j] * w(y[j]);
        }
    }
    let mut tail = T::zero();
    for (&x, &y) in ra.iter().zip(rb) {
        tail = tail + x * w(y);
    }
    let mut w = LANES;
    while w > 1 {
        w /= 2;
        for j in 0..w {
            acc[j] = acc[j] + acc[j + w];
        }
    }
    acc[0] + tail
}

#[cfg(test)]
mod tests {
    use super::*;
    use redco_core::ops::paged_attention::PagedSegment;

    /// 16-bit pools: bit for bit the f32 kernel run on the widened values, its output
    /// narrowed (the widening happens where each element is read, nothing else changes).
    #[test]
    fn sixteen_bit_pools_give_the_f32_kernel_on_their_widened_values() {
        let (heads, kvh, d, rows, t) = (4, 2, 64, 40, 6);
        let segs = [
            PagedSegment { q_start: 0, q_len: 1, slots: vec![3, 17, 8, 0, 21, 39] },
            PagedSegment { q_start: 1, q_len: 3, slots: (10..30).collect() },
            PagedSegment { q_start: 4, q_len: 2, slots: vec![35, 4] },
        ];
        let spec =
            PagedSpec { q_heads: heads, kv_heads: kvh, head_dim: d, tokens: t, rows, scale: 0.125, segments: &segs };
        let mut x = 1u64;
        let mut vals = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    ((x >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
                })
                .collect()
        };
        let (q, k, v) = (vals(heads * t * d), vals(rows * kvh * d), vals(rows * kvh * d));
        let b = Cpu::new(2);
        for dt in [redco_core::DType::BF16, redco_core::DType::F16] {
            let half = |x: &[f32]| CpuStorage::new(HostData::F32(x.to_vec()).cast(dt));
            let (qh, kh, vh) = (half(&q), half(&k), half(&v));
            let got = paged_attention(&b, &qh, &kh, &vh, &spec).unwrap().expect("16-bit pools are fused");
            let wide = |s: &CpuStorage| CpuStorage::new(s.0.cast(redco_core::DType::F32));
            let want = paged_attention(&b, &wide(&qh), &wide(&kh), &wide(&vh), &spec).unwrap().unwrap();
            assert_eq!(got.0.dtype(), dt);
            assert_eq!(*got.0, want.0.cast(dt), "{dt:?}");
            // f32 queries over the same pools: the f32 kernel on the widened pools, in f32
            let q32 = CpuStorage::new(HostData::F32(q.clone()));
            let got = paged_attention(&b, &q32, &kh, &vh, &spec).unwrap().expect("f32 over 16-bit pools is fused");
            let want = paged_attention(&b, &q32, &wide(&kh), &wide(&vh), &spec).unwrap().unwrap();
            assert_eq!(*got.0, *want.0, "f32 queries over {dt:?} pools");
        }
    }
}
