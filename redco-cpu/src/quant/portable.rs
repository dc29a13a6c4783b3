//! The integer dot products as portable loops: the reference the SIMD kernels are checked
//! against, and what runs on CPUs without AVX2.

use super::QRows;
use redco_core::quant::QuantFormat;

fn half(b: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// `Q4_K`'s 6-bit scale and minimum of sub-block `j` from its 12 packed bytes.
pub(super) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        ((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4), (q[j + 4] >> 4) | ((q[j] >> 6) << 4))
    }
}

fn isum(a: impl Iterator<Item = i32>, x: &[i8]) -> i32 {
    a.zip(x).map(|(w, &x)| w * x as i32).sum()
}

/// One weight row against one activation row `i`.
fn dot(format: QuantFormat, w: &[u8], qx: &QRows, i: usize) -> f32 {
    let (k, nb) = (qx.k, qx.k / 32);
    let (q, d, s) = (&qx.q[i * k..(i + 1) * k], &qx.d[i * nb..(i + 1) * nb], &qx.s[i * nb..(i + 1) * nb]);
    let xb = |b: usize| &q[32 * b..32 * b + 32];
    let mut acc = 0f32;
    match format {
        QuantFormat::Q8_0 => {
            for (b, blk) in w.chunks_exact(34).enumerate() {
                let sum = isum(blk[2..34].iter().map(|&c| c as i8 as i32), xb(b));
                acc += half(blk, 0) * d[b] * sum as f32;
            }
        }
        QuantFormat::Q4_0 => {
            for (b, blk) in w.chunks_exact(18).enumerate() {
                let codes = (0..32).map(|l| {
                    let byte = blk[2 + l % 16];
                    (if l < 16 { byte & 0xF } else { byte >> 4 }) as i32 - 8
                });
                acc += half(blk, 0) * d[b] * isum(codes, xb(b)) as f32;
            }
        }
        QuantFormat::Q4_1 => {
            for (b, blk) in w.chunks_exact(20).enumerate() {
                let codes = (0..32).map(|l| {
                    let byte = blk[4 + l % 16];
                    (if l < 16 { byte & 0xF } else { byte >> 4 }) as i32
                });
                acc += half(blk, 0) * d[b] * isum(codes, xb(b)) as f32 + half(blk, 2) * s[b];
            }
        }
        QuantFormat::Q4K => {
            for (sb, blk) in w.chunks_exact(144).enumerate() {
                let (dd, dmin) = (half(blk, 0), half(blk, 2));
                for c in 0..4 {
                    let qs = &blk[16 + 32 * c..16 + 32 * c + 32];
                    for (h, shift) in [(0usize, 0u8), (1, 4)] {
                        let j = 2 * c + h;
                        let b = 8 * sb + j;
                        let (sc, m) = scale_min_k4(j, &blk[4..16]);
                        let sum = isum(qs.iter().map(|&v| ((v >> shift) & 0xF) as i32), xb(b));
                        acc += dd * sc as f32 * d[b] * sum as f32 - dmin * m as f32 * s[b];
                    }
                }
            }
        }
        QuantFormat::Q6K => {
            for (sb, blk) in w.chunks_exact(210).enumerate() {
                let dd = half(blk, 208);
                for h in 0..2 {
                    let (ql, qh) = (&blk[64 * h..64 * h + 64], &blk[128 + 32 * h..128 + 32 * h + 32]);
                    for j in 0..4 {
                        let b = 8 * sb + 4 * h + j;
                        let codes: Vec<i32> = (0..32)
                            .map(|l| {
                                let low = ql[l + 32 * (j % 2)];
                                let low = if j < 2 { low & 0xF } else { low >> 4 };
                                ((low | (((qh[l] >> (2 * j)) & 3) << 4)) as i32) - 32
                            })
                            .collect();
                        for half16 in 0..2 {
                            let sc = blk[192 + 8 * h + 2 * j + half16] as i8 as f32;
                            let r = 16 * half16..16 * half16 + 16;
                            let sum = isum(codes[r.clone()].iter().copied(), &xb(b)[r]);
                            acc += dd * sc * d[b] * sum as f32;
                        }
                    }
                }
            }
        }
    }
    acc
}

/// One weight row `w` against every activation row, into `out`.
pub(super) fn row_dots(format: QuantFormat, w: &[u8], qx: &QRows, out: &mut [f32]) {
    for (i, o) in out.iter_mut().enumerate().take(qx.m) {
        *o = dot(format, w, qx, i);
    }
}
