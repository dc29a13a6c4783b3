//! Activation rows quantized for the integer dot products: blocks of 32 values, each a
//! signed byte code `round(x / d)` with `d = max|x| / 127` (f32), and `d` times the sum of
//! the block's codes (what a weight block's minimum multiplies).

use rayon::prelude::*;

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
    /// Scale of each block (`k / 32` a row).
    pub d: Vec<f32>,
    /// Scale times the sum of the block's codes.
    pub s: Vec<f32>,
}

impl QRows {
    /// `x` (`m x k`, row-major) quantized; rows split over the pool when there are many.
    pub(crate) fn quantize(x: &[f32], m: usize, k: usize) -> QRows {
        let nb = k / 32;
        let (mut q, mut d, mut s) = (vec![0i8; m * k], vec![0f32; m * nb], vec![0f32; m * nb]);
        let one = |(((xr, qr), dr), sr): Row<'_>| {
            for (b, (xb, qb)) in xr.chunks_exact(32).zip(qr.chunks_exact_mut(32)).enumerate() {
                let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs()));
                // a NaN or infinity makes the block's scale NaN: it reaches the product,
                // as it would through a float one
                let finite = amax.is_finite() && xb.iter().all(|v| !v.is_nan());
                let db = if finite { amax / 127.0 } else { f32::NAN };
                let id = if finite && db > 0.0 { 1.0 / db } else { 0.0 };
                let mut sum = 0i32;
                for (o, &v) in qb.iter_mut().zip(xb) {
                    let c = (v * id).round() as i32;
                    *o = c as i8;
                    sum += c;
                }
                dr[b] = db;
                sr[b] = if finite { db * sum as f32 } else { f32::NAN };
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
