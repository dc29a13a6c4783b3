//! AVX-512F packing of strided A / B blocks into the micro-panel layouts of the AVX-512
//! micro-kernel.
//!
//! * A micro-panel: `kc` steps of `MR` contiguous rows (`dst[p * MR + r] = A[r, p]`),
//!   rows beyond the valid count are zero.
//! * B micro-panel: `kc` steps of `NR` contiguous columns (`dst[p * NR + j] = B[p, j]`),
//!   columns beyond the valid count are zero. Panels of a block are stored back to back.
//!
//! The source may be f32, bf16 or f16 ([`Source`]): 16-bit elements are widened as they
//! are loaded.

use super::common::{mask16, pack_a_strided, pack_b_strided};
use super::kernel_avx512::{MR, NR};
use super::source::Source;
use std::arch::x86_64::*;

/// Packs one `MR x kc` micro-panel of A (only `rows <= MR` valid rows) into `dst`.
///
/// # Safety
/// * `src` points at A(i0, p0); every `src[r * rs + p * cs]` for `r < rows`, `p < kc` is readable.
/// * `dst` is writable for `kc * MR` floats.
/// * CPU supports AVX-512F and AVX2.
#[target_feature(enable = "avx512f,avx2")]
pub(crate) unsafe fn pack_a_panel<E: Source>(
    kc: usize,
    rows: usize,
    src: *const E,
    rs: usize,
    cs: usize,
    dst: *mut f32,
) {
    // SAFETY (whole body): all reads are A(r, p) with r < rows, p < kc (masked-off lanes are
    // never accessed), all writes are inside dst[0 .. kc * MR], per the caller contract.
    unsafe {
        if rs == 1 && MR <= 16 {
            // Column-major A: each k step is `rows` contiguous floats.
            let mw = mask16(MR);
            for p in 0..kc {
                let v = E::load16(src.add(p * cs), rows);
                _mm512_mask_storeu_ps(dst.add(p * MR), mw, v);
            }
        } else if cs == 1 {
            // Row-major A: transpose 16 k-steps at a time in registers.
            let wm = mask16(MR);
            let mut p = 0;
            while p < kc {
                let w = (kc - p).min(16);
                let mut r = [_mm512_setzero_ps(); 16];
                for (i, v) in r.iter_mut().enumerate().take(rows.min(MR)) {
                    *v = E::load16(src.add(i * rs + p), w);
                }
                let t = transpose16(&r);
                for (q, &v) in t.iter().enumerate().take(w) {
                    _mm512_mask_storeu_ps(dst.add((p + q) * MR), wm, v);
                }
                p += w;
            }
        } else {
            pack_a_strided(kc, MR, rows, src, rs, cs, dst);
        }
    }
}

/// Transposes 16 row vectors (lane q of `r[i]` is element (i, q)) into 16 column vectors
/// (lane i of `out[q]` is element (i, q)).
#[target_feature(enable = "avx512f")]
#[inline]
pub(crate) fn transpose16(r: &[__m512; 16]) -> [__m512; 16] {
    let mut a = [_mm512_setzero_ps(); 16];
    for i in 0..8 {
        a[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        a[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    let mut b = [_mm512_setzero_ps(); 16];
    for i in 0..4 {
        let (x0, x1) = (_mm512_castps_pd(a[4 * i]), _mm512_castps_pd(a[4 * i + 2]));
        let (y0, y1) = (_mm512_castps_pd(a[4 * i + 1]), _mm512_castps_pd(a[4 * i + 3]));
        b[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(x0, x1));
        b[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(x0, x1));
        b[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(y0, y1));
        b[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(y0, y1));
    }
    // b[4i + c], 128-bit block j, holds rows 4i..4i+4 of column 4j + c.
    let mut out = [_mm512_setzero_ps(); 16];
    for c in 0..4 {
        let s0 = _mm512_shuffle_f32x4::<0x44>(b[c], b[4 + c]);
        let s1 = _mm512_shuffle_f32x4::<0xEE>(b[c], b[4 + c]);
        let s2 = _mm512_shuffle_f32x4::<0x44>(b[8 + c], b[12 + c]);
        let s3 = _mm512_shuffle_f32x4::<0xEE>(b[8 + c], b[12 + c]);
        out[c] = _mm512_shuffle_f32x4::<0x88>(s0, s2);
        out[4 + c] = _mm512_shuffle_f32x4::<0xDD>(s0, s2);
        out[8 + c] = _mm512_shuffle_f32x4::<0x88>(s1, s3);
        out[12 + c] = _mm512_shuffle_f32x4::<0xDD>(s1, s3);
    }
    out
}

/// Packs a `kc x cols` block of B into `cols.div_ceil(NR)` consecutive `kc x NR` micro-panels
/// (the last one zero-padded).
///
/// # Safety
/// * `src` points at B(p0, j0); every `src[p * rs + j * cs]` for `p < kc`, `j < cols` is readable.
/// * `dst` is writable for `cols.div_ceil(NR) * kc * NR` floats and 64-byte aligned.
/// * CPU supports AVX-512F and AVX2.
#[target_feature(enable = "avx512f,avx2")]
pub(crate) unsafe fn pack_b_block<E: Source>(
    kc: usize,
    cols: usize,
    src: *const E,
    rs: usize,
    cs: usize,
    dst: *mut f32,
) {
    let np = cols.div_ceil(NR);
    // SAFETY (whole body): reads are B(p, j) with p < kc, j < cols (masked lanes excluded);
    // writes stay inside dst[0 .. np * kc * NR]; aligned stores use offsets that are multiples
    // of 16 floats from the 64-byte aligned dst.
    unsafe {
        if cs == 1 {
            // Row-major B: walk B row by row (sequential, TLB friendly), fan out to panels.
            for p in 0..kc {
                let s = src.add(p * rs);
                for jp in 0..np {
                    let d = dst.add(jp * kc * NR + p * NR);
                    let j0 = jp * NR;
                    for v in 0..NR / 16 {
                        let valid = (cols - j0).saturating_sub(16 * v);
                        _mm512_store_ps(d.add(16 * v), E::load16(s.add(j0 + 16 * v), valid));
                    }
                }
            }
        } else if rs == 1 {
            // Column-major B (e.g. a transposed weight): each column is contiguous in k;
            // transpose 16 columns x 16 k-steps at a time in registers.
            for jp in 0..np {
                let base = dst.add(jp * kc * NR);
                let j0 = jp * NR;
                for g in 0..NR / 16 {
                    let jg = j0 + 16 * g;
                    let valid = cols.saturating_sub(jg).min(16);
                    let mut p = 0;
                    while p < kc {
                        let w = (kc - p).min(16);
                        let mut r = [_mm512_setzero_ps(); 16];
                        for (i, v) in r.iter_mut().enumerate().take(valid) {
                            *v = E::load16(src.add((jg + i) * cs + p), w);
                        }
                        let t = transpose16(&r);
                        for (q, &v) in t.iter().enumerate().take(w) {
                            _mm512_store_ps(base.add((p + q) * NR + 16 * g), v);
                        }
                        p += w;
                    }
                }
            }
        } else {
            pack_b_strided(kc, NR, cols, src, rs, cs, dst);
        }
    }
}
