//! Single-precision (f32) GEMM for x86-64 CPUs with AVX-512F.
//!
//! BLIS/GotoBLAS-style design:
//! * `A` is packed into `MR x KC` micro-panels (shared by all threads, each panel packed on
//!   demand by the first task that needs it),
//! * `B` is packed into `KC x NR` micro-panels per thread (`KC x NC` block, L2 resident),
//! * an `MR x NR` register-blocked AVX-512 micro-kernel (see [`kernel_avx512`]) does the math,
//! * work is split over the `N` dimension (or `M` when `N` is narrow) with rayon.
//!
//! Small-`m` problems (LLM decode, `m <= 8`) with a contiguous operand use an unpacked
//! streaming path (see [`skinny`]).
//!
//! The only public entry point is [`sgemm`]; it returns `false` (without touching `C`) when the
//! CPU lacks AVX-512F so the caller can fall back to another implementation.

#[cfg(target_arch = "x86_64")]
mod buffer;
#[cfg(target_arch = "x86_64")]
mod driver;
#[cfg(target_arch = "x86_64")]
pub mod kernel_avx512;
#[cfg(target_arch = "x86_64")]
mod pack;
#[cfg(target_arch = "x86_64")]
pub mod skinny;

/// Strided view of a matrix: element (i, j) is at `data[i * rs + j * cs]`.
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a> {
    /// Backing storage; must contain every addressed element.
    pub data: &'a [f32],
    /// Row stride (in elements).
    pub rs: usize,
    /// Column stride (in elements).
    pub cs: usize,
}

/// Returns true when the running CPU supports the AVX-512F kernels used by [`sgemm`].
/// `REDCO_ASSUME_NO_AVX512=1` (read once per process) makes it false on any CPU, so that
/// an AVX-512 machine behaves as an AVX2-only one.
pub fn is_supported() -> bool {
    super::avx512f()
}

/// C (row-major, leading dimension ldc, m x n) = A (m x k) * B (k x n), or C += A*B when `accumulate`.
/// Parallelised with rayon over the *current* rayon pool (the caller wraps the call in its own
/// ThreadPool::install), using at most `threads` threads. Returns false, without touching C,
/// when the CPU lacks AVX-512F, so the caller can fall back to another GEMM.
///
/// # Panics
/// Panics if a slice is too short for the given shape and strides, or if `ldc < n` (with `m > 1`).
#[allow(clippy::too_many_arguments)]
pub fn sgemm(
    m: usize,
    n: usize,
    k: usize,
    a: MatRef,
    b: MatRef,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
    threads: usize,
) -> bool {
    // SAFETY (of the cast): `[f32]` and `[MaybeUninit<f32>]` have the same layout, and the
    // GEMM only stores initialised values into it.
    let cu = unsafe { &mut *(c as *mut [f32] as *mut [std::mem::MaybeUninit<f32>]) };
    run(m, n, k, a, b, cu, ldc, accumulate, threads)
}

/// [`sgemm`] with `accumulate = false` into memory that need not be initialised: every
/// element of the `m x n` result is written (no zero-fill pass over a fresh output).
#[allow(clippy::too_many_arguments)]
pub fn sgemm_uninit(
    m: usize,
    n: usize,
    k: usize,
    a: MatRef,
    b: MatRef,
    c: &mut [std::mem::MaybeUninit<f32>],
    ldc: usize,
    threads: usize,
) -> bool {
    run(m, n, k, a, b, c, ldc, false, threads)
}

#[allow(clippy::too_many_arguments)]
fn run(
    m: usize,
    n: usize,
    k: usize,
    a: MatRef,
    b: MatRef,
    c: &mut [std::mem::MaybeUninit<f32>],
    ldc: usize,
    accumulate: bool,
    threads: usize,
) -> bool {
    if !is_supported() {
        return false;
    }
    if m == 0 || n == 0 {
        return true;
    }
    assert!(m == 1 || ldc >= n, "sgemm: ldc ({ldc}) < n ({n})");
    assert!(c.len() >= (m - 1) * ldc + n, "sgemm: C slice too short");
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                c[i * ldc..i * ldc + n].iter_mut().for_each(|x| {
                    x.write(0.0);
                });
            }
        }
        return true;
    }
    let last = |x: MatRef, rows: usize, cols: usize| (rows - 1) * x.rs + (cols - 1) * x.cs;
    assert!(a.data.len() > last(a, m, k), "sgemm: A slice too short");
    assert!(b.data.len() > last(b, k, n), "sgemm: B slice too short");
    let threads = threads.max(1);
    // The kernels write C through raw pointers; with `accumulate = false` they store every
    // element of the first K block before any later block reads it back.
    let cp = c.as_mut_ptr() as *mut f32;
    #[cfg(target_arch = "x86_64")]
    {
        if skinny::applicable(m, n, k, &a, &b) {
            skinny::run(m, n, k, a, b, cp, ldc, accumulate, threads);
        } else {
            driver::gemm(m, n, k, a, b, cp, ldc, accumulate, threads);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (cp, accumulate);
    true
}

#[cfg(test)]
pub(crate) mod tests;
