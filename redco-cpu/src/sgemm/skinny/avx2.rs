//! The AVX2 + FMA tasks of the skinny path, for 16 ymm registers: 4 rows x 3 ymm over 24
//! columns (row-major B), 4 columns x 2 rows of ymm dot products (column-major B).

use crate::sgemm::common::mask8;
use crate::sgemm::MatRef;
use std::arch::x86_64::*;

/// Columns per group of the row-major-B kernel (3 ymm).
pub(super) const COLS: usize = 24;
/// Rows per register block of the row-major-B kernel (12 accumulators, 3 B vectors).
const ROWS: usize = 4;
/// Rows per register block of the dot-product kernel (8 accumulators, 4 B vectors).
const DOT_ROWS: usize = 2;

/// Sum of the 8 lanes.
#[target_feature(enable = "avx2")]
#[inline]
fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Row-major B: columns `j0..j1`, all `m` rows.
///
/// # Safety
/// AVX2 and FMA; all addressed A/B elements in bounds; C columns `j0..j1` of rows `0..m`
/// writable.
#[target_feature(enable = "avx2,fma")]
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
        let w = (j1 - j).min(COLS);
        let masks = [mask8(w), mask8(w.saturating_sub(8)), mask8(w.saturating_sub(16))];
        let full = w == COLS;
        let mut i0 = 0;
        while i0 < m {
            let rows = (m - i0).min(ROWS);
            let mut s = [[_mm256_setzero_ps(); 3]; ROWS];
            for p in 0..k {
                // SAFETY: B(p, j..j+w) in bounds; masked lanes are not accessed.
                let bv: [__m256; 3] = std::array::from_fn(|v| unsafe {
                    let q = bp.add(p * b.rs + j + 8 * v);
                    if full {
                        _mm256_loadu_ps(q)
                    } else {
                        _mm256_maskload_ps(q, masks[v])
                    }
                });
                for (r, sr) in s.iter_mut().enumerate().take(rows) {
                    // SAFETY: A(i0 + r, p) in bounds.
                    let x = _mm256_set1_ps(unsafe { *ap.add((i0 + r) * a.rs + p * a.cs) });
                    for v in 0..3 {
                        sr[v] = _mm256_fmadd_ps(x, bv[v], sr[v]);
                    }
                }
            }
            for (r, sr) in s.iter().enumerate().take(rows) {
                for v in 0..3 {
                    let valid = w.saturating_sub(8 * v);
                    if valid == 0 {
                        break;
                    }
                    // SAFETY: C(i0 + r, j + 8v ..) masked to the valid columns of this task.
                    unsafe {
                        let q = c.add((i0 + r) * ldc + j + 8 * v);
                        let old = if !acc {
                            _mm256_setzero_ps()
                        } else if valid >= 8 {
                            _mm256_loadu_ps(q)
                        } else {
                            _mm256_maskload_ps(q, masks[v])
                        };
                        let y = _mm256_add_ps(old, sr[v]);
                        if valid >= 8 {
                            _mm256_storeu_ps(q, y)
                        } else {
                            _mm256_maskstore_ps(q, masks[v], y)
                        }
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
/// AVX2 and FMA; `a.cs == 1`, `b.rs == 1`; all addressed elements in bounds; C columns
/// `j0..j1` of rows `0..m` writable.
#[target_feature(enable = "avx2,fma")]
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
    let kfull = k / 8 * 8;
    let tail = mask8(k - kfull);
    let ahead_rows = super::prefetch_rows(k);
    let mut j = j0;
    while j < j1 {
        let cols = (j1 - j).min(4);
        let mut i0 = 0;
        while i0 < m {
            let rows = (m - i0).min(DOT_ROWS);
            let mut s = [[_mm256_setzero_ps(); 4]; DOT_ROWS];
            let mut p = 0;
            while p < k {
                let whole = p < kfull;
                if i0 == 0 && p % 16 == 0 {
                    // Fetch the same line of the rows two groups ahead: each new group of
                    // rows starts four fresh streams the hardware prefetcher has not seen.
                    for q in 0..4 {
                        if j + ahead_rows + q < j1 {
                            let ahead = bp.wrapping_add((j + ahead_rows + q) * b.cs + p);
                            _mm_prefetch::<_MM_HINT_T0>(ahead as *const i8);
                        }
                    }
                }
                // SAFETY: Bt(j + q, p..p+8) and A(i0 + r, p..p+8) in bounds under the mask.
                let load = |ptr: *const f32| unsafe {
                    if whole {
                        _mm256_loadu_ps(ptr)
                    } else {
                        _mm256_maskload_ps(ptr, tail)
                    }
                };
                let bv: [__m256; 4] = std::array::from_fn(|q| {
                    if q < cols {
                        load(bp.wrapping_add((j + q) * b.cs + p))
                    } else {
                        _mm256_setzero_ps()
                    }
                });
                for (r, sr) in s.iter_mut().enumerate().take(rows) {
                    let x = load(ap.wrapping_add((i0 + r) * a.rs + p));
                    for q in 0..4 {
                        sr[q] = _mm256_fmadd_ps(x, bv[q], sr[q]);
                    }
                }
                p += 8;
            }
            for (r, sr) in s.iter().enumerate().take(rows) {
                for (q, &v) in sr.iter().enumerate().take(cols) {
                    // SAFETY: C(i0 + r, j + q) is inside this task's columns.
                    unsafe {
                        let o = c.add((i0 + r) * ldc + j + q);
                        let y = hsum(v);
                        *o = if acc { *o + y } else { y };
                    }
                }
            }
            i0 += rows;
        }
        j += cols;
    }
}
