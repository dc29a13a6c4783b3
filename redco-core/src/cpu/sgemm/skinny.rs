//! Small-`m` (LLM decode and short prompts) path: no packing, B is streamed directly.
//!
//! * Row-major B (`cs == 1`): `C[i, j..j+64] += A[i, p] * B[p, j..j+64]` with up to
//!   `ROWS` rows x 4 zmm accumulators.
//! * Column-major B (`rs == 1`, e.g. a `[n, k]` weight used as `B = W^T`) with row-major A:
//!   dot products along `k`, 4 columns x up to 4 rows of zmm accumulators, reduced at the end.
//!
//! Work is split over `N` between threads.

use super::MatRef;
use std::arch::x86_64::*;

/// Largest `m` handled by this path with a row-major B.
pub const MAX_M: usize = 8;
/// Largest `m` handled with a column-major B (a weight `[n, k]` used as `W^T`): B is read
/// `m / DOT_ROWS` times, which beats packing it for a short prompt.
pub const MAX_M_DOTS: usize = 16;
/// Rows per register block in the dot-product kernel.
const DOT_ROWS: usize = 4;
/// How many rows of `Bt` ahead the dot-product path prefetches.
const PREFETCH_AHEAD: usize = 8;
/// Rows per register block in the row-major-B kernel.
const ROWS: usize = 4;

/// Whether the skinny path handles this problem (small `m` and a unit-stride B direction).
pub fn applicable(m: usize, _n: usize, _k: usize, a: &MatRef, b: &MatRef) -> bool {
    (m <= MAX_M && b.cs == 1) || (m <= MAX_M_DOTS && b.rs == 1 && a.cs == 1)
}

/// Raw C pointer that may be shared between the tasks (they write disjoint columns).
#[derive(Clone, Copy)]
struct CPtr(*mut f32);
// SAFETY: tasks write disjoint column ranges of C.
unsafe impl Send for CPtr {}
// SAFETY: see above.
unsafe impl Sync for CPtr {}

impl CPtr {
    /// The raw pointer (a method, so closures capture the whole wrapper).
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// Runs the skinny path. Requires AVX-512F, `m >= 1`, `k >= 1`, validated bounds and
/// [`applicable`] to be true.
#[allow(clippy::too_many_arguments)]
pub fn run(m: usize, n: usize, k: usize, a: MatRef, b: MatRef, c: *mut f32, ldc: usize, acc: bool, threads: usize) {
    let row_major_b = b.cs == 1;
    // Column granularity per task: 64 (row-major B) or 4 (dot-product kernel).
    let g = if row_major_b { 64 } else { 4 };
    let groups = n.div_ceil(g);
    // Only thread when there is enough work to amortise the fork-join.
    let work = m * n * k;
    let nt = if work < 1 << 18 { 1 } else { threads.min(rayon::current_num_threads()).min(groups).max(1) };
    let cp = CPtr(c);
    let task = |t: usize| {
        let (g0, g1) = (groups * t / nt, groups * (t + 1) / nt);
        let (j0, j1) = (g0 * g, (g1 * g).min(n));
        if j0 >= j1 {
            return;
        }
        // SAFETY: AVX-512F verified by the caller; bounds validated by `sgemm`; this task only
        // writes columns j0..j1 of C.
        unsafe {
            if row_major_b {
                rows_task(m, k, j0, j1, a, b, cp.get(), ldc, acc)
            } else {
                dots_task(m, k, j0, j1, a, b, cp.get(), ldc, acc)
            }
        }
    };
    if nt == 1 {
        task(0);
    } else {
        use rayon::prelude::*;
        (0..nt).into_par_iter().with_max_len(1).for_each(task);
    }
}

/// Mask with the low `n` (clamped to 0..=16) bits set.
#[inline(always)]
fn mask16(n: usize) -> __mmask16 {
    if n >= 16 {
        0xffff
    } else {
        ((1u32 << n) - 1) as __mmask16
    }
}

/// Row-major B: columns `j0..j1`, all `m` rows.
///
/// # Safety
/// AVX-512F; all addressed A/B elements in bounds; C columns `j0..j1` of rows `0..m` writable.
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn rows_task(
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
unsafe fn dots_task(
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
