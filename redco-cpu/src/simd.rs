//! Vectorisable CPU loops: a branch-free f32 `exp`, and element loops compiled three times
//! (for the baseline target, for AVX2 + FMA and for AVX-512) and picked at run time, so that
//! a closure inlined into them runs 8 or 16 lanes wide, with fused multiply-adds, on CPUs that
//! have those without building the whole crate for that target.

use std::mem::MaybeUninit;

/// `e^x` in f32 without branches (so loops over it vectorise): Cody-Waite reduction by
/// `ln 2` and Cephes' degree-6 polynomial, within 2 ulp of the exact value on normal
/// results. Gives `0` below about -104 (after gradual underflow), `inf` above
/// `ln(f32::MAX)`, and NaN for NaN.
#[inline(always)]
pub(crate) fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const MAX_ARG: f32 = 88.722_84;
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
    let xc = x.clamp(-104.0, MAX_ARG);
    let t = xc * LOG2E + ROUND;
    let nf = t - ROUND;
    let n = (t.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    let r = (xc - nf * LN2_HI) - nf * LN2_LO;
    let mut p = 1.987_569_2e-4_f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 0.166_666_65;
    p = p * r + 0.5;
    let e = p * (r * r) + r + 1.0;
    // 2^n as two normal factors, so that n from -150 to 128 needs no special case
    let n1 = n >> 1;
    let s1 = f32::from_bits(((n1 + 127) as u32) << 23);
    let s2 = f32::from_bits(((n - n1 + 127) as u32) << 23);
    let y = e * s1 * s2;
    let y = if x > MAX_ARG { f32::INFINITY } else { y };
    if x.is_nan() {
        x
    } else {
        y
    }
}

/// True when the AVX-512 copies of the loops may run (see [`super::avx512f`]).
#[inline]
fn avx512() -> bool {
    super::avx512f()
}

/// The copy of the element loops this CPU runs: `avx512`, `avx2` or `baseline`.
pub(crate) fn family() -> &'static str {
    if avx512() {
        "avx512"
    } else if super::avx2_fma() {
        "avx2"
    } else {
        "baseline"
    }
}

pub(crate) use redco_core::host_simd::vectorized;

#[inline(always)]
fn map_body<T: Copy, O, F: Fn(T) -> O>(x: &[T], o: &mut [MaybeUninit<O>], f: &F) {
    for (o, &v) in o.iter_mut().zip(x) {
        o.write(f(v));
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl,avx2,fma")]
fn map_avx512<T: Copy, O, F: Fn(T) -> O>(x: &[T], o: &mut [MaybeUninit<O>], f: &F) {
    map_body(x, o, f)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn map_avx2<T: Copy, O, F: Fn(T) -> O>(x: &[T], o: &mut [MaybeUninit<O>], f: &F) {
    map_body(x, o, f)
}

/// Writes `o[i] = f(x[i])` for every `i < o.len()` (callers rely on all of `o` being
/// written, so a shorter `x` panics).
pub(crate) fn map_into<T: Copy, O, F: Fn(T) -> O>(x: &[T], o: &mut [MaybeUninit<O>], f: &F) {
    assert!(x.len() >= o.len(), "map_into: {} inputs for {} outputs", x.len(), o.len());
    #[cfg(target_arch = "x86_64")]
    if avx512() {
        // SAFETY: the CPU has the features the copy was compiled for.
        return unsafe { map_avx512(x, o, f) };
    }
    #[cfg(target_arch = "x86_64")]
    if super::avx2_fma() {
        // SAFETY: the CPU has the features the copy was compiled for.
        return unsafe { map_avx2(x, o, f) };
    }
    map_body(x, o, f)
}

#[inline(always)]
fn zip_body<T: Copy, U: Copy, O, F: Fn(T, U) -> O>(a: &[T], b: &[U], o: &mut [O], f: &F) {
    for ((o, &x), &y) in o.iter_mut().zip(a).zip(b) {
        *o = f(x, y);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl,avx2,fma")]
fn zip_avx512<T: Copy, U: Copy, O, F: Fn(T, U) -> O>(a: &[T], b: &[U], o: &mut [O], f: &F) {
    zip_body(a, b, o, f)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn zip_avx2<T: Copy, U: Copy, O, F: Fn(T, U) -> O>(a: &[T], b: &[U], o: &mut [O], f: &F) {
    zip_body(a, b, o, f)
}

/// Writes `o[i] = f(a[i], b[i])` for every `i < o.len()` (callers rely on all of `o` being
/// written, so shorter inputs panic).
pub(crate) fn zip_into<T: Copy, U: Copy, O, F: Fn(T, U) -> O>(a: &[T], b: &[U], o: &mut [O], f: &F) {
    assert!(a.len() >= o.len() && b.len() >= o.len(), "zip_into: inputs shorter than the output");
    #[cfg(target_arch = "x86_64")]
    if avx512() {
        // SAFETY: the CPU has the features the copy was compiled for.
        return unsafe { zip_avx512(a, b, o, f) };
    }
    #[cfg(target_arch = "x86_64")]
    if super::avx2_fma() {
        // SAFETY: the CPU has the features the copy was compiled for.
        return unsafe { zip_avx2(a, b, o, f) };
    }
    zip_body(a, b, o, f)
}

#[inline(always)]
fn exp_sum_body(row: &mut [f32], m: f32) -> f32 {
    let mut acc = [0f32; 16];
    let mut chunks = row.chunks_exact_mut(16);
    for c in &mut chunks {
        for (v, a) in c.iter_mut().zip(acc.iter_mut()) {
            let e = exp_f32(*v - m);
            *v = e;
            *a += e;
        }
    }
    for (v, a) in chunks.into_remainder().iter_mut().zip(acc.iter_mut()) {
        let e = exp_f32(*v - m);
        *v = e;
        *a += e;
    }
    acc.iter().sum()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl,avx2,fma")]
fn exp_sum_avx512(row: &mut [f32], m: f32) -> f32 {
    exp_sum_body(row, m)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn exp_sum_avx2(row: &mut [f32], m: f32) -> f32 {
    exp_sum_body(row, m)
}

/// Replaces each `x` of `row` with `e^(x - m)` and returns their sum.
pub(crate) fn exp_shift_sum(row: &mut [f32], m: f32) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if avx512() {
        // SAFETY: the CPU has the features the copy was compiled for.
        return unsafe { exp_sum_avx512(row, m) };
    }
    #[cfg(target_arch = "x86_64")]
    if super::avx2_fma() {
        // SAFETY: the CPU has the features the copy was compiled for.
        return unsafe { exp_sum_avx2(row, m) };
    }
    exp_sum_body(row, m)
}

#[inline(always)]
fn max_body(row: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; 16];
    let mut chunks = row.chunks_exact(16);
    for c in &mut chunks {
        for (&v, a) in c.iter().zip(acc.iter_mut()) {
            *a = if v > *a { v } else { *a };
        }
    }
    for (&v, a) in chunks.remainder().iter().zip(acc.iter_mut()) {
        *a = if v > *a { v } else { *a };
    }
    acc.iter().copied().fold(f32::NEG_INFINITY, f32::max)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl,avx2,fma")]
fn max_avx512(row: &[f32]) -> f32 {
    max_body(row)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn max_avx2(row: &[f32]) -> f32 {
    max_body(row)
}

/// The largest value of `row` (`-inf` when empty; NaNs are skipped).
pub(crate) fn max(row: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if avx512() {
        // SAFETY: the CPU has the features the copy was compiled for.
        return unsafe { max_avx512(row) };
    }
    #[cfg(target_arch = "x86_64")]
    if super::avx2_fma() {
        // SAFETY: the CPU has the features the copy was compiled for.
        return unsafe { max_avx2(row) };
    }
    max_body(row)
}

#[inline(always)]
fn moments_body(row: &[f32], mean: f64) -> (f64, f64) {
    let (mut s, mut q) = ([0f64; 8], [0f64; 8]);
    let mut chunks = row.chunks_exact(8);
    for c in &mut chunks {
        for i in 0..8 {
            let v = c[i] as f64 - mean;
            s[i] += v;
            q[i] += v * v;
        }
    }
    for (i, &v) in chunks.remainder().iter().enumerate() {
        let v = v as f64 - mean;
        s[i] += v;
        q[i] += v * v;
    }
    (s.iter().sum(), q.iter().sum())
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl,avx2,fma")]
fn moments_avx512(row: &[f32], mean: f64) -> (f64, f64) {
    moments_body(row, mean)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn moments_avx2(row: &[f32], mean: f64) -> (f64, f64) {
    moments_body(row, mean)
}

/// `(sum(x - mean), sum((x - mean)^2))` over `row`, accumulated in f64.
pub(crate) fn moments(row: &[f32], mean: f64) -> (f64, f64) {
    #[cfg(target_arch = "x86_64")]
    if avx512() {
        // SAFETY: the CPU has the features the copy was compiled for.
        return unsafe { moments_avx512(row, mean) };
    }
    #[cfg(target_arch = "x86_64")]
    if super::avx2_fma() {
        // SAFETY: the CPU has the features the copy was compiled for.
        return unsafe { moments_avx2(row, mean) };
    }
    moments_body(row, mean)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_2_ulp_of_f64_and_handles_the_edges() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x < 88.7 {
            let e = (x as f64).exp();
            let got = exp_f32(x) as f64;
            worst = worst.max(((got - e) / e).abs());
            x += 0.001_3;
        }
        assert!(worst < 2.5 * f32::EPSILON as f64, "worst relative error {worst:e}");
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(-200.0), 0.0);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(89.0), f32::INFINITY);
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
        assert!(exp_f32(f32::NAN).is_nan());
        assert!(exp_f32(f32::MIN).abs() == 0.0);
        // gradual underflow: subnormal results are kept
        let sub = exp_f32(-100.0) as f64;
        assert!((sub - (-100f64).exp()).abs() < 1e-44, "{sub:e}");
    }

    #[test]
    fn exp_sum_and_max_match_scalar_loops() {
        for n in [0usize, 1, 15, 16, 17, 100] {
            let row: Vec<f32> = (0..n).map(|i| ((i * 37) % 23) as f32 * 0.3 - 3.0).collect();
            let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            assert_eq!(max(&row), m);
            let mut r = row.clone();
            let s = exp_shift_sum(&mut r, m);
            let want: Vec<f64> = row.iter().map(|&v| ((v - m) as f64).exp()).collect();
            for (g, w) in r.iter().zip(&want) {
                assert!((*g as f64 - w).abs() <= 3e-7 * w.abs().max(1e-30), "{g} vs {w}");
            }
            let ws: f64 = want.iter().sum();
            assert!((s as f64 - ws).abs() <= 1e-6 * ws.max(1.0), "{s} vs {ws}");
        }
    }
}
