//! The AVX-512F tasks of the skinny path: 4 zmm accumulators per row over 64 columns
//! (row-major B), 4 columns x up to 4 rows of zmm dot products (column-major B).

use super::{DOT_ROWS, PREFETCH_AHEAD, ROWS};
use crate::sgemm::common::mask16;
use crate::sgemm::MatRef;
use std::arch::x86_64::*;

/// Row-major B: columns `j0..j1`, all `m` rows.
///
/// # Safety
/// AVX-512F; all addressed A/B elements in bounds; C columns `j0..j1` of rows `0..m` writable.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn rows_task(
    m: usize,
    k: usize,
    j0: usize,
    j1: usize,
    a: MatRef,
    b: MatRef,
    c: *mut f32,
    ldc: usize,
    acc: bool,
) {
    let ap = a.data.as_ptr();
    let bp = b.data.as_ptr();
    let mut j = j0;
    while j < j1 {
        let w = (j1 - j).min(64);
        let masks =
            [mask16(w), mask16(w.saturating_sub(16)), mask16(w.saturating_sub(32)), mask16(w.saturating_sub(48))];
        let mut i0 = 0;
        while i0 < m {
            let rows = (m - i0).min(ROWS);
            let mut s = [[_mm512_setzero_ps(); 4]; ROWS];
            for p in 0..k {
                // SAFETY: B(p, j..j+w) in bounds; masked lanes are not accessed.
                let bv: [__m512; 4] =
                    std::array::from_fn(|v| unsafe { _mm512_maskz_loadu_ps(masks[v], bp.add(p * b.rs + j + 16 * v)) });
                for (r, sr) in s.iter_mut().enumerate().take(rows) {
                    // SAFETY: A(i0 + r, p) in bounds.
                    let x = _mm512_set1_ps(unsafe { *ap.add((i0 + r) * a.rs + p * a.cs) });
                    for v in 0..4 {
                        sr[v] = _mm512_fmadd_ps(x, bv[v], sr[v]);
                    }
                }
            }
            for (r, sr) in s.iter().enumerate().take(rows) {
                for v in 0..4 {
                    if masks[v] == 0 {
                        break;
                    }
                    // SAFETY: C(i0 + r, j + 16v ..) masked to the valid columns of this task.
                    unsafe {
                        let q = c.add((i0 + r) * ldc + j + 16 * v);
                        let y = if acc { _mm512_add_ps(_mm512_maskz_loadu_ps(masks[v], q), sr[v]) } else { sr[v] };
                        _mm512_mask_storeu_ps(q, masks[v], y);
                    }
                }
            }
            i0 += rows;
        }
        j += w;
    }
}

/// Column-major B with row-major A: dot products along `k` for columns `j0..j1`.
///
/// # Safety
/// AVX-512F; `a.cs == 1`, `b.rs == 1`; all addressed elements in bounds; C columns `j0..j1`
/// of rows `0..m` writable.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn dots_task(
    m: usize,
    k: usize,
    j0: usize,
    j1: usize,
    a: MatRef,
    b: MatRef,
    c: *mut f32,
    ldc: usize,
    acc: bool,
) {
    let ap = a.data.as_ptr();
    let bp = b.data.as_ptr();
    let kfull = k / 16 * 16;
    let tail = mask16(k - kfull);
    let mut j = j0;
    while j < j1 {
        let cols = (j1 - j).min(4);
        let mut i0 = 0;
        while i0 < m {
            let rows = (m - i0).min(DOT_ROWS);
            let mut s = [[_mm512_setzero_ps(); 4]; DOT_ROWS];
            let mut p = 0;
            while p < k {
                let mk = if p < kfull { 0xffff } else { tail };
                if i0 == 0 {
                    // Fetch the same line of the rows two groups ahead: each new group of
                    // rows starts four fresh streams the hardware prefetcher has not seen.
                    for q in 0..4 {
                        if j + PREFETCH_AHEAD + q < j1 {
                            let ahead = bp.wrapping_add((j + PREFETCH_AHEAD + q) * b.cs + p);
                            _mm_prefetch::<_MM_HINT_T0>(ahead as *const i8);
                        }
                    }
                }
                // SAFETY: Bt(j + q, p..p+16) and A(i0 + r, p..p+16) in bounds under the mask.
                let bv: [__m512; 4] = std::array::from_fn(|q| {
                    if q < cols {
                        unsafe { _mm512_maskz_loadu_ps(mk, bp.add((j + q) * b.cs + p)) }
                    } else {
                        _mm512_setzero_ps()
                    }
                });
                for (r, sr) in s.iter_mut().enumerate().take(rows) {
                    // SAFETY: see above.
                    let x = unsafe { _mm512_maskz_loadu_ps(mk, ap.add((i0 + r) * a.rs + p)) };
                    for q in 0..4 {
                        sr[q] = _mm512_fmadd_ps(x, bv[q], sr[q]);
                    }
                }
                p += 16;
            }
            for (r, sr) in s.iter().enumerate().take(rows) {
                for (q, &v) in sr.iter().enumerate().take(cols) {
                    // SAFETY: C(i0 + r, j + q) is inside this task's columns.
                    unsafe {
                        let o = c.add((i0 + r) * ldc + j + q);
                        let y = _mm512_reduce_add_ps(v);
                        *o = if acc { *o + y } else { y };
                    }
                }
            }
            i0 += rows;
        }
        j += cols;
    }
}
