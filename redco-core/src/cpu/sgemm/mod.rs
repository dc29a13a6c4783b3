//! Single-precision (f32) GEMM for x86-64 CPUs with AVX-512F or with AVX2 and FMA.
//!
//! BLIS/GotoBLAS-style design:
//! * `A` is packed into `MR x KC` micro-panels (shared by all threads, each panel packed on
//!   demand by the first task that needs it),
//! * `B` is packed into `KC x NR` micro-panels per thread (`KC x NC` block, L2 resident),
//! * an `MR x NR` register-blocked micro-kernel does the math: one generated kernel per
//!   instruction set ([`kernel_avx512`]: 14 x 32 on 32 zmm registers, [`kernel_avx2`]: 6 x 16
//!   on 16 ymm registers), each with its own packing and blocking (`microkernel::Family`),
//!   picked at run time by the CPU's features ([`Isa::detect`]),
//! * work is split over the `N` dimension (or `M` when `N` is narrow) with rayon.
//!
//! Small-`m` problems (LLM decode, `m <= 8`) with a contiguous operand use an unpacked
//! streaming path (see [`skinny`]).
//!
//! The entry points are [`sgemm`] and [`sgemm_uninit`]; they return `false` (without touching
//! `C`) when the CPU has neither instruction set, so the caller can fall back to another
//! implementation.

#[cfg(target_arch = "x86_64")]
pub(crate) mod buffer;
#[cfg(target_arch = "x86_64")]
mod common;
#[cfg(target_arch = "x86_64")]
mod driver;
#[cfg(target_arch = "x86_64")]
pub(crate) use driver::{par_for, split, SendPtr};
#[cfg(target_arch = "x86_64")]
pub mod kernel_avx2;
#[cfg(target_arch = "x86_64")]
pub mod kernel_avx512;
#[cfg(target_arch = "x86_64")]
pub mod microkernel;
#[cfg(target_arch = "x86_64")]
mod pack_avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod pack_avx512;
#[cfg(target_arch = "x86_64")]
pub mod skinny;

/// The instruction set a GEMM kernel family needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// AVX-512F: the 14 x 32 zmm kernel.
    Avx512,
    /// AVX2 and FMA: the 6 x 16 ymm kernel.
    Avx2,
}

impl Isa {
    /// The best family this CPU runs, if any: AVX-512F unless the CPU lacks it or
    /// `REDCO_ASSUME_NO_AVX512` is set (see `cpu::avx512f`), else AVX2 with FMA.
    /// Read once per process.
    pub fn detect() -> Option<Isa> {
        if super::avx512f() {
            Some(Isa::Avx512)
        } else if super::avx2_fma() {
            Some(Isa::Avx2)
        } else {
            None
        }
    }

    /// Whether this CPU can run the family (an AVX-512 machine also runs the AVX2 one).
    pub fn runs_here(self) -> bool {
        match self {
            Isa::Avx512 => super::avx512f(),
            Isa::Avx2 => super::avx2_fma(),
        }
    }

    /// Its name in benchmark reports: `avx512` or `avx2`.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx512 => "avx512",
            Isa::Avx2 => "avx2",
        }
    }
}

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

/// Returns true when the running CPU supports one of the kernel families of [`sgemm`]
/// (see [`Isa::detect`]).
pub fn is_supported() -> bool {
    Isa::detect().is_some()
}

/// C (row-major, leading dimension ldc, m x n) = A (m x k) * B (k x n), or C += A*B when `accumulate`.
/// Parallelised with rayon over the *current* rayon pool (the caller wraps the call in its own
/// ThreadPool::install), using at most `threads` threads, with the best kernel family of
/// this CPU. Returns false, without touching C, when the CPU has none (no AVX-512F and no
/// AVX2 with FMA), so the caller can fall back to another GEMM.
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
    match Isa::detect() {
        Some(isa) => sgemm_with(isa, m, n, k, a, b, c, ldc, accumulate, threads),
        None => false,
    }
}

/// [`sgemm`] with the kernel family `isa` (for tests and benchmarks that compare the
/// families on one machine). Returns false, without touching C, when this CPU cannot run it.
#[allow(clippy::too_many_arguments)]
pub fn sgemm_with(
    isa: Isa,
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
    isa.runs_here() && run(isa, m, n, k, a, b, cu, ldc, accumulate, threads)
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
    match Isa::detect() {
        Some(isa) => run(isa, m, n, k, a, b, c, ldc, false, threads),
        None => false,
    }
}

/// The checks and the dispatch shared by the entry points; `isa` runs here.
#[allow(clippy::too_many_arguments)]
fn run(
    isa: Isa,
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
            skinny::run(isa, m, n, k, a, b, cp, ldc, accumulate, threads);
        } else {
            match isa {
                Isa::Avx512 => driver::gemm::<kernel_avx512::Avx512>(m, n, k, a, b, cp, ldc, accumulate, threads),
                Isa::Avx2 => driver::gemm::<kernel_avx2::Avx2>(m, n, k, a, b, cp, ldc, accumulate, threads),
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (isa, cp, accumulate);
    true
}

#[cfg(test)]
pub(crate) mod tests;
