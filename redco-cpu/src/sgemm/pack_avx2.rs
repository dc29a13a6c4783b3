//! AVX2 packing of strided A / B blocks into the micro-panel layouts of the AVX2 micro-kernel
//! (the same layouts as the AVX-512 ones, with its `MR` and `NR`):
//!
//! * A micro-panel: `kc` steps of `MR` contiguous rows (`dst[p * MR + r] = A[r, p]`),
//!   rows beyond the valid count are zero.
//! * B micro-panel: `kc` steps of `NR` contiguous columns (`dst[p * NR + j] = B[p, j]`),
//!   columns beyond the valid count are zero. Panels of a block are stored back to back.
//!
//! The transposing cases (row-major A, column-major B) go through 8 x 8 register transposes.
//! The source may be f32, bf16 or f16 ([`Source`]): 16-bit elements are widened as they
//! are loaded.

use super::common::{mask8, pack_a_strided, pack_b_strided};
use super::kernel_avx2::{MR, NR};
use super::source::Source;
use std::arch::x86_64::*;

/// Transposes 8 row vectors (lane q of `r[i]` is element (i, q)) into 8 column vectors
/// (lane i of `out[q]` is element (i, q)).
#[target_feature(enable = "avx2")]
#[inline]
fn transpose8(r: &[__m256; 8]) -> [__m256; 8] {
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let s0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let s1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let s2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let s3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let s4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let s5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let s6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let s7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    [
        _mm256_permute2f128_ps::<0x20>(s0, s4),
        _mm256_permute2f128_ps::<0x20>(s1, s5),
        _mm256_permute2f128_ps::<0x20>(s2, s6),
        _mm256_permute2f128_ps::<0x20>(s3, s7),
        _mm256_permute2f128_ps::<0x31>(s0, s4),
        _mm256_permute2f128_ps::<0x31>(s1, s5),
        _mm256_permute2f128_ps::<0x31>(s2, s6),
        _mm256_permute2f128_ps::<0x31>(s3, s7),
    ]
}

/// Packs one `MR x kc` micro-panel of A (only `rows <= MR` valid rows) into `dst`.
///
/// # Safety
/// * `src` points at A(i0, p0); every `src[r * rs + p * cs]` for `r < rows`, `p < kc` is readable.
/// * `dst` is writable for `kc * MR` floats.
/// * CPU supports AVX2.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn pack_a_panel<E: Source>(
    kc: usize,
    rows: usize,
    src: *const E,
    rs: usize,
    cs: usize,
    dst: *mut f32,
) {
    const { assert!(MR <= 8) };
    let rows = rows.min(MR);
    // SAFETY (whole body): all reads are A(r, p) with r < rows, p < kc (masked-off lanes are
    // never accessed), all writes are inside dst[0 .. kc * MR], per the caller contract.
    unsafe {
        if rs == 1 {
            // Column-major A: each k step is `rows` contiguous floats.
            for p in 0..kc {
                let v = E::load8(src.add(p * cs), rows);
                store_mr(dst.add(p * MR), v);
            }
        } else if cs == 1 {
            // Row-major A: transpose 8 k-steps at a time in registers.
            let mut p = 0;
            while p < kc {
                let w = (kc - p).min(8);
                let mut r = [_mm256_setzero_ps(); 8];
                for (i, v) in r.iter_mut().enumerate().take(rows) {
                    *v = E::load8(src.add(i * rs + p), w);
                }
                let t = transpose8(&r);
                for (q, &v) in t.iter().enumerate().take(w) {
                    store_mr(dst.add((p + q) * MR), v);
                }
                p += w;
            }
        } else {
            pack_a_strided(kc, MR, rows, src, rs, cs, dst);
        }
    }
}

/// Stores the low `MR` lanes of `v` at `d` (never more: the next step starts right after).
///
/// # Safety
/// `d` is writable for `MR` floats; CPU supports AVX2.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn store_mr(d: *mut f32, v: __m256) {
    // SAFETY: only the low MR lanes are written.
    unsafe { _mm256_maskstore_ps(d, mask8(MR), v) }
}

/// Packs a `kc x cols` block of B into `cols.div_ceil(NR)` consecutive `kc x NR` micro-panels
/// (the last one zero-padded).
///
/// # Safety
/// * `src` points at B(p0, j0); every `src[p * rs + j * cs]` for `p < kc`, `j < cols` is readable.
/// * `dst` is writable for `cols.div_ceil(NR) * kc * NR` floats and 32-byte aligned.
/// * CPU supports AVX2.
#[target_feature(enable = "avx2,fma")]
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
    // of 8 floats from the 32-byte aligned dst.
    unsafe {
        if cs == 1 {
            // Row-major B: walk B row by row (sequential, TLB friendly), fan out to panels.
            for p in 0..kc {
                let s = src.add(p * rs);
                for jp in 0..np {
                    let d = dst.add(jp * kc * NR + p * NR);
                    let j0 = jp * NR;
                    for v in 0..NR / 8 {
                        let valid = (cols - j0).saturating_sub(8 * v);
                        _mm256_store_ps(d.add(8 * v), E::load8(s.add(j0 + 8 * v), valid));
                    }
                }
            }
        } else if rs == 1 {
            // Column-major B (e.g. a transposed weight): each column is contiguous in k;
            // transpose 8 columns x 8 k-steps at a time in registers.
            for jp in 0..np {
                let base = dst.add(jp * kc * NR);
                let j0 = jp * NR;
                for g in 0..NR / 8 {
                    let jg = j0 + 8 * g;
                    let valid = cols.saturating_sub(jg).min(8);
                    let mut p = 0;
                    while p < kc {
                        let w = (kc - p).min(8);
                        let mut r = [_mm256_setzero_ps(); 8];
                        for (i, v) in r.iter_mut().enumerate().take(valid) {
                            *v = E::load8(src.add((jg + i) * cs + p), w);
                        }
                        let t = transpose8(&r);
                        for (q, &v) in t.iter().enumerate().take(w) {
                            _mm256_store_ps(base.add((p + q) * NR + 8 * g), v);
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
