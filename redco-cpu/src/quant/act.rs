//! Activation rows quantized for the integer dot products, as llama.cpp quantizes them for
//! each weight format (so that a GGUF file gives llama.cpp's sums): signed byte codes in
//! blocks of 32, a scale a block, and the scale times the block's code sum (what a weight
//! block's offset or minimum multiplies).
//!
//! - `Q8_0` and `Q4_0` weights meet llama.cpp's `Q8_0` activations: a block of 32 is coded
//!   `round(x * 127 / max|x|)` (ties to even), its scale `max|x| / 127` rounded to f16.
//! - `Q4_1` weights meet `Q8_1`: the same, and the scaled sum (f32 scale times the codes'
//!   sum) rounded to f16.
//! - `Q4_K` and `Q6_K` weights meet `Q8_K`: one scale for 256 values, `x * (-127 / m)` to
//!   the nearest integer (ties to even) and at most 127, where `m` is the value of largest
//!   magnitude, the scale `-m / 127` in f32.

use rayon::prelude::*;
use redco_core::quant::QuantFormat;

/// One row's values, codes, block scales and scaled sums.
type Row<'a> = (((&'a [f32], &'a mut [i8]), &'a mut [f32]), &'a mut [f32]);

/// `m` rows of `k` values (`k` a multiple of 32) as byte codes and block scales.
pub(crate) struct QRows {
    /// Values per row.
    pub k: usize,
    /// Rows.
    pub m: usize,
    /// Codes, row after row.
    pub q: Vec<i8>,
    /// Scale of each block of 32 (`k / 32` a row).
    pub d: Vec<f32>,
    /// Scale times the sum of the block's codes.
    pub s: Vec<f32>,
}

fn f16_round(v: f32) -> f32 {
    half::f16::from_f32(v).to_f32()
}

/// `x` to the nearest integer, ties to even: for the codes' magnitudes (below 2^22) by
/// adding and taking away 1.5 * 2^23, which the FPU rounds to even in its default mode (a
/// baseline x86-64 build has no `roundss` and would call `rintf` for every value).
#[inline]
fn round_even(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    if x.abs() < 4_194_304.0 {
        (x + MAGIC) - MAGIC
    } else {
        x.round_ties_even()
    }
}

/// One block of 32 (`Q8_0`, or `Q8_1` with `sum16`): codes into `q`, `(scale, scaled sum)`.
fn block32(x: &[f32], q: &mut [i8], sum16: bool) -> (f32, f32) {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let id = if amax > 0.0 { 127.0 / amax } else { 0.0 };
    let mut sum = 0i32;
    for (o, &v) in q.iter_mut().zip(x) {
        let c = round_even(v * id) as i32;
        *o = c as i8;
        sum += c;
    }
    let d = amax / 127.0;
    let s = d * sum as f32;
    (f16_round(d), if sum16 { f16_round(s) } else { f16_round(d) * sum as f32 })
}

/// One block of 256 (`Q8_K`): codes into `q`, the scale.
fn block256(x: &[f32], q: &mut [i8]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax == 0.0 {
        q.fill(0);
        return 0.0;
    }
    let iscale = -127.0 / max;
    for (o, &v) in q.iter_mut().zip(x) {
        *o = (round_even(iscale * v) as i32).min(127) as i8;
    }
    1.0 / iscale
}

impl QRows {
    /// `x` (`m x k`, row-major) quantized as llama.cpp does for weights of `format` (see
    /// the module docs); rows split over the pool when there are many. A NaN or an
    /// infinity makes its block's scale NaN: it reaches the product, as it would through a
    /// float one.
    pub(crate) fn quantize(x: &[f32], m: usize, k: usize, format: QuantFormat) -> QRows {
        let nb = k / 32;
        let (mut q, mut d, mut s) = (vec![0i8; m * k], vec![0f32; m * nb], vec![0f32; m * nb]);
        let per_256 = matches!(format, QuantFormat::Q4K | QuantFormat::Q6K) && k.is_multiple_of(256);
        let one = |(((xr, qr), dr), sr): Row<'_>| {
            let group = if per_256 { 256 } else { 32 };
            for (g, (xg, qg)) in xr.chunks_exact(group).zip(qr.chunks_exact_mut(group)).enumerate() {
                let finite = xg.iter().all(|v| v.is_finite());
                let blocks = group / 32;
                let at = g * blocks;
                if per_256 {
                    let dg = if finite { block256(xg, qg) } else { f32::NAN };
                    for (b, qb) in qg.chunks_exact(32).enumerate() {
                        let sum: i32 = qb.iter().map(|&c| c as i32).sum();
                        dr[at + b] = dg;
                        sr[at + b] = dg * sum as f32;
                    }
                } else if finite {
                    (dr[at], sr[at]) = block32(xg, qg, format == QuantFormat::Q4_1);
                } else {
                    (dr[at], sr[at]) = (f32::NAN, f32::NAN);
                }
            }
        };
        let rows = x.chunks_exact(k).zip(q.chunks_exact_mut(k)).zip(d.chunks_exact_mut(nb)).zip(s.chunks_exact_mut(nb));
        if m >= 8 {
            rows.collect::<Vec<_>>().into_par_iter().for_each(one);
        } else {
            rows.for_each(one);
        }
        QRows { k, m, q, d, s }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_even_is_rounding_to_nearest_ties_to_even() {
        for i in -300_000..300_000 {
            let x = i as f32 / 1000.0;
            assert_eq!(round_even(x), x.round_ties_even(), "{x}");
        }
        for x in [0.5f32, 1.5, 2.5, -0.5, -2.5, 127.5, -127.5, 1e9, -1e9, f32::INFINITY] {
            assert_eq!(round_even(x), x.round_ties_even(), "{x}");
        }
        assert!(round_even(f32::NAN).is_nan());
    }

    #[test]
    fn activations_are_coded_as_llama_cpp_codes_them() {
        // Q8_0: ties to even, the scale rounded to f16
        let mut x = vec![0f32; 32];
        x[0] = 127.0;
        x[1] = 2.5;
        x[2] = -3.5;
        let r = QRows::quantize(&x, 1, 32, QuantFormat::Q8_0);
        assert_eq!(&r.q[..3], &[127, 2, -4]);
        assert_eq!(r.d[0], 1.0);
        let x: Vec<f32> = (0..32).map(|i| i as f32 * 0.013).collect();
        let r = QRows::quantize(&x, 1, 32, QuantFormat::Q4_1);
        assert_eq!(r.d[0], half::f16::from_f32(31.0 * 0.013 / 127.0).to_f32());
        // Q8_K: the value of largest magnitude codes to -127 and the scale carries its sign
        let mut x = vec![0.01f32; 256];
        x[7] = 2.0;
        x[100] = -1.0;
        let r = QRows::quantize(&x, 1, 256, QuantFormat::Q4K);
        assert_eq!((r.q[7], r.q[100]), (-127, 64));
        assert!(r.d.iter().all(|&d| d == 1.0 / (-127.0 / 2.0)));
        let sum0: i32 = r.q[..32].iter().map(|&c| c as i32).sum();
        assert_eq!(r.s[0], r.d[0] * sum0 as f32);
        // a NaN poisons its block (its super-block for Q8_K), and nothing else
        let mut x = vec![0.5f32; 512];
        x[300] = f32::NAN;
        let r = QRows::quantize(&x, 1, 512, QuantFormat::Q6K);
        assert!(r.d[..8].iter().all(|d| d.is_finite()) && r.d[8..].iter().all(|d| d.is_nan()));
    }
}
