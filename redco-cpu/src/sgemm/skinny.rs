//! Small-`m` (LLM decode and short prompts) path: no packing, B is streamed directly.
//!
//! * Row-major B (`cs == 1`): `C[i, j..j+w] += A[i, p] * B[p, j..j+w]` with up to
//!   `ROWS` rows of accumulators over a group of columns.
//! * Column-major B (`rs == 1`, e.g. a `[n, k]` weight used as `B = W^T`) with row-major A:
//!   dot products along `k`, 4 columns x a few rows of vector accumulators, reduced at the end.
//!
//! Work is split over `N` between threads; the tasks are per instruction set (`avx512`,
//! `avx2`).

use super::{Isa, MatRef};

/// Largest `m` handled by this path with a row-major B.
pub const MAX_M: usize = 8;
/// Largest `m` handled with a column-major B (a weight `[n, k]` used as `W^T`): B is read
/// `m / DOT_ROWS` times, which beats packing it for a short prompt.
pub const MAX_M_DOTS: usize = 16;
/// Rows per register block in the AVX-512 dot-product kernel.
const DOT_ROWS: usize = 4;
/// How many rows of `Bt` ahead the dot-product path prefetches (the AVX2 one: at least).
const PREFETCH_AHEAD: usize = 8;
/// How far ahead the AVX2 dot-product path prefetches `Bt`, in bytes, where that is more
/// than [`PREFETCH_AHEAD`] rows (as the 16-bit GEMV, which measured 128 KiB best). On a
/// 1.1B LLaMA's f32 decode run as AVX2-only it took a token from 220-250 ms to 196-236
/// (interleaved runs); the AVX-512 kernel, which reads a whole line per step, measured no
/// gain from it and keeps [`PREFETCH_AHEAD`].
const PREFETCH_BYTES: usize = 128 << 10;

/// Rows of `Bt` (`k` f32 each) the AVX2 dot-product path prefetches ahead.
fn prefetch_rows(k: usize) -> usize {
    PREFETCH_AHEAD.max(PREFETCH_BYTES / (4 * k.max(1)))
}
/// Rows per register block in the AVX-512 row-major-B kernel.
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

/// Runs the skinny path with the tasks of `isa`. Requires the CPU features of `isa`,
/// `m >= 1`, `k >= 1`, validated bounds and [`applicable`] to be true.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run(
    isa: Isa,
    m: usize,
    n: usize,
    k: usize,
    a: MatRef,
    b: MatRef,
    c: *mut f32,
    ldc: usize,
    acc: bool,
    threads: usize,
) {
    let row_major_b = b.cs == 1;
    // Column granularity per task: a group of the row-major-B kernel or 4 (dot products).
    let g = match (row_major_b, isa) {
        (true, Isa::Avx512) => 64,
        (true, Isa::Avx2) => avx2::COLS,
        (false, _) => 4,
    };
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
        // SAFETY: the features of `isa` verified by the caller; bounds validated by `sgemm`;
        // this task only writes columns j0..j1 of C.
        unsafe {
            match (isa, row_major_b) {
                (Isa::Avx512, true) => avx512::rows_task(m, k, j0, j1, a, b, cp.get(), ldc, acc),
                (Isa::Avx512, false) => avx512::dots_task(m, k, j0, j1, a, b, cp.get(), ldc, acc),
                (Isa::Avx2, true) => avx2::rows_task(m, k, j0, j1, a, b, cp.get(), ldc, acc),
                (Isa::Avx2, false) => avx2::dots_task(m, k, j0, j1, a, b, cp.get(), ldc, acc),
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

mod avx2;
mod avx512;
