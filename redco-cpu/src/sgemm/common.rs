//! What the kernel families share: lane masks for partial vectors and the packing of
//! operands with no unit stride (element by element, the same for every family).

use super::source::Source;
use std::arch::x86_64::*;

/// Mask with the low `n` (clamped to 0..=16) bits set, for AVX-512 masked loads and stores.
#[inline(always)]
pub(crate) fn mask16(n: usize) -> __mmask16 {
    if n >= 16 {
        0xffff
    } else {
        ((1u32 << n) - 1) as __mmask16
    }
}

/// Lane mask with the low `n` (clamped to 0..=8) lanes set, for AVX2 `maskload` / `maskstore`.
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) fn mask8(n: usize) -> __m256i {
    let n = n.min(8) as i32;
    _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7))
}

/// Packs an `mr x kc` panel of A with any strides (`dst[p * mr + r] = A[r, p]`, rows from
/// `rows` on zero).
///
/// # Safety
/// Every `src[r * rs + p * cs]` for `r < rows`, `p < kc` readable; `dst` writable for `kc * mr`.
#[inline]
pub(crate) unsafe fn pack_a_strided<E: Source>(
    kc: usize,
    mr: usize,
    rows: usize,
    src: *const E,
    rs: usize,
    cs: usize,
    dst: *mut f32,
) {
    for p in 0..kc {
        for r in 0..mr {
            // SAFETY: in bounds per the caller contract.
            unsafe { *dst.add(p * mr + r) = if r < rows { (*src.add(r * rs + p * cs)).to_f32() } else { 0.0 } };
        }
    }
}

/// Packs a `kc x cols` block of B with any strides into `cols.div_ceil(nr)` panels
/// (`panel[p * nr + j] = B[p, j0 + j]`, columns from `cols` on zero).
///
/// # Safety
/// Every `src[p * rs + j * cs]` for `p < kc`, `j < cols` readable; `dst` writable for the panels.
#[inline]
pub(crate) unsafe fn pack_b_strided<E: Source>(
    kc: usize,
    nr: usize,
    cols: usize,
    src: *const E,
    rs: usize,
    cs: usize,
    dst: *mut f32,
) {
    for jp in 0..cols.div_ceil(nr) {
        let j0 = jp * nr;
        for p in 0..kc {
            for j in 0..nr {
                let v = if j0 + j < cols {
                    // SAFETY: in bounds per the caller contract.
                    unsafe { (*src.add(p * rs + (j0 + j) * cs)).to_f32() }
                } else {
                    0.0
                };
                // SAFETY: inside the np panels.
                unsafe { *dst.add(jp * kc * nr + p * nr + j) = v };
            }
        }
    }
}
