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
//! The packers also read bf16 and f16 operands ([`source::Source`]), widening them to f32 in
//! registers as they pack: [`gemm_uninit`] runs a 16-bit product on the f32 kernels (f32
//! accumulation, f32 out) with no widened copy of its operands, where the CPU has no
//! 16-bit dot-product instruction.
//!
//! The entry points are [`sgemm`], [`sgemm_uninit`] and [`gemm_uninit`]; they return `false`
//! (without touching `C`) when the CPU has neither instruction set, so the caller can fall
//! back to another implementation.

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
pub mod prepacked;
#[cfg(target_arch = "x86_64")]
pub use prepacked::PackedB;
#[cfg(target_arch = "x86_64")]
pub mod sink;
#[cfg(target_arch = "x86_64")]
pub mod skinny;
#[cfg(target_arch = "x86_64")]
pub use sink::Sink;
#[cfg(target_arch = "x86_64")]
pub mod source;
#[cfg(target_arch = "x86_64")]
pub use source::Source;
/// Where the kernels do not exist, every element type is a source (no GEMM runs there).
#[cfg(not(target_arch = "x86_64"))]
pub trait Source: Copy + Send + Sync + 'static {}
#[cfg(not(target_arch = "x86_64"))]
impl<T: Copy + Send + Sync + 'static> Source for T {}
/// The 16-bit result types (where the kernels do not exist no GEMM runs, see `sink`).
#[cfg(not(target_arch = "x86_64"))]
pub trait Sink: Copy + Send + Sync + 'static {}
#[cfg(not(target_arch = "x86_64"))]
impl Sink for half::bf16 {}
#[cfg(not(target_arch = "x86_64"))]
impl Sink for half::f16 {}

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
        if Isa::Avx512.runs_here() {
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
            // (every AVX-512F CPU has AVX2 and FMA; the packers use AVX2 loads too)
            Isa::Avx512 => super::avx512f() && super::avx2_fma(),
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

/// Strided view of a matrix: element (i, j) is at `data[i * rs + j * cs]`; f32 unless said
/// (the packed path also reads bf16 and f16, see [`gemm_uninit`]).
#[derive(Debug)]
pub struct MatRef<'a, E = f32> {
    /// Backing storage; must contain every addressed element.
    pub data: &'a [E],
    /// Row stride (in elements).
    pub rs: usize,
    /// Column stride (in elements).
    pub cs: usize,
}

impl<E> Clone for MatRef<'_, E> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<E> Copy for MatRef<'_, E> {}

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
    gemm_with(isa, m, n, k, a, b, c, ldc, accumulate, threads)
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
    gemm_uninit(m, n, k, a, b, c, ldc, threads)
}

/// [`sgemm_uninit`] for operands of any [`Source`] type (f32, bf16, f16): 16-bit operands
/// are widened to f32 in registers while they are packed, the product accumulates in f32
/// and C is f32. Returns false, without touching C, where this CPU has no kernel family
/// (or, for f16 on AVX2, no F16C).
///
/// # Panics
/// As [`sgemm`].
#[allow(clippy::too_many_arguments)]
pub fn gemm_uninit<E: Source>(
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<E>,
    b: MatRef<E>,
    c: &mut [std::mem::MaybeUninit<f32>],
    ldc: usize,
    threads: usize,
) -> bool {
    match Isa::detect() {
        Some(isa) => run(isa, m, n, k, a, b, c, ldc, false, threads, None).is_some(),
        None => false,
    }
}

/// `C = A*B` (row-major `m x n`, leading dimension `ldc`, every element written) with B
/// packed beforehand ([`PackedB`]: `n = b.n()`, `k = b.k()`), equal bit for bit to
/// [`gemm_uninit`]'s packed path on the same operands. Returns false, without touching C,
/// when the family `b` was packed for does not run here (or is not the one detected).
///
/// # Panics
/// If `a` (`m x k`) or `c` is too short.
#[cfg(target_arch = "x86_64")]
pub fn gemm_prepacked(
    m: usize,
    a: MatRef<f32>,
    b: &PackedB,
    c: &mut [std::mem::MaybeUninit<f32>],
    ldc: usize,
    threads: usize,
) -> bool {
    let (k, n) = (b.k(), b.n());
    if Isa::detect() != Some(b.isa()) {
        return false;
    }
    if m == 0 {
        return true;
    }
    assert!(m == 1 || ldc >= n, "gemm_prepacked: ldc ({ldc}) < n ({n})");
    assert!(c.len() >= (m - 1) * ldc + n, "gemm_prepacked: C slice too short");
    assert!(a.data.len() > (m - 1) * a.rs + (k - 1) * a.cs, "gemm_prepacked: A slice too short");
    let cp = c.as_mut_ptr() as *mut f32;
    // SAFETY: `b` was packed by the family detected here for this k and n (its constructor
    // needs k, n >= 1); A and C cover the problem (asserted).
    unsafe {
        match b.isa() {
            Isa::Avx512 => driver::gemm_packed_b::<kernel_avx512::Avx512>(m, n, k, a, b.as_ptr(), cp, ldc, threads),
            Isa::Avx2 => driver::gemm_packed_b::<kernel_avx2::Avx2>(m, n, k, a, b.as_ptr(), cp, ldc, threads),
        }
    }
    true
}

/// `out = A*B` (row-major `m x n`, every element written) for operands of any [`Source`]
/// type with a 16-bit result: the kernels accumulate in f32 into a reused per-thread
/// buffer, and each task narrows its rows into `out` (rounding to nearest even) as it
/// finishes them, while they are in cache. Returns false, without touching `out`, where
/// [`gemm_uninit`] would.
///
/// # Panics
/// As [`sgemm`], and if `out` is shorter than `m * n`.
#[allow(clippy::too_many_arguments)]
pub fn gemm_narrow<E: Source, O: Sink>(
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<E>,
    b: MatRef<E>,
    out: &mut [std::mem::MaybeUninit<O>],
    threads: usize,
) -> bool {
    match Isa::detect() {
        Some(isa) => gemm_narrow_with(isa, m, n, k, a, b, out, threads),
        None => false,
    }
}

/// [`gemm_narrow`] with the kernel family `isa` (for tests of both families on one
/// machine). Returns false, without touching `out`, when this CPU cannot run it.
#[allow(clippy::too_many_arguments)]
pub fn gemm_narrow_with<E: Source, O: Sink>(
    isa: Isa,
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<E>,
    b: MatRef<E>,
    out: &mut [std::mem::MaybeUninit<O>],
    threads: usize,
) -> bool {
    if !isa.runs_here() || !reads::<E>(isa) {
        return false;
    }
    assert!(out.len() >= m * n, "gemm_narrow: output slice too short");
    #[cfg(target_arch = "x86_64")]
    buffer::with_buf(buffer::Slot::C, |stage| {
        let len = m * n;
        // SAFETY: the reserved buffer holds `len` f32s; viewed as uninitialised ones, which
        // the GEMM writes in full before anything reads them.
        let c = unsafe { std::slice::from_raw_parts_mut(stage.reserve(len) as *mut std::mem::MaybeUninit<f32>, len) };
        let epi = driver::Epilogue {
            out: SendPtr(out.as_mut_ptr() as *mut u8),
            ld: n,
            elem: size_of::<O>(),
            narrow: sink::narrow_raw::<O>,
        };
        if run(isa, m, n, k, a, b, c, n, false, threads, Some(epi)) == Some(false) {
            // the product ran without the epilogue (computed as C^T, or k = 0): narrow the
            // whole result now
            // SAFETY: the GEMM wrote every element of C.
            let c = unsafe { &*(c as *const [std::mem::MaybeUninit<f32>] as *const [f32]) };
            O::narrow(c, &mut out[..len]);
        }
    });
    true
}

/// Whether [`gemm_uninit`] runs here for operands of type `E`: a kernel family runs, and
/// (f16 on AVX2) the CPU has F16C.
pub fn supports<E: Source>() -> bool {
    Isa::detect().is_some_and(reads::<E>)
}

/// Whether family `isa` (which runs here) reads `E`: f16 on AVX2 needs F16C.
fn reads<E: Source>(isa: Isa) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        !(E::NEEDS_F16C && isa == Isa::Avx2 && !std::arch::is_x86_feature_detected!("f16c"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = isa;
        false
    }
}

/// [`gemm_uninit`] with the kernel family `isa` into an initialised C, `C = A*B` or
/// `C += A*B` (for tests comparing the 16-bit packing with the f32 one on one family).
/// Returns false, without touching C, when this CPU cannot run it.
#[allow(clippy::too_many_arguments)]
pub fn gemm_with<E: Source>(
    isa: Isa,
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<E>,
    b: MatRef<E>,
    c: &mut [f32],
    ldc: usize,
    accumulate: bool,
    threads: usize,
) -> bool {
    // SAFETY (of the cast): `[f32]` and `[MaybeUninit<f32>]` have the same layout, and the
    // GEMM only stores initialised values into it.
    let cu = unsafe { &mut *(c as *mut [f32] as *mut [std::mem::MaybeUninit<f32>]) };
    isa.runs_here() && run(isa, m, n, k, a, b, cu, ldc, accumulate, threads, None).is_some()
}

/// The checks and the dispatch shared by the entry points; `isa` runs here. `None`: it
/// cannot read `E` (nothing written); else whether `epi` narrowed the result.
#[allow(clippy::too_many_arguments)]
fn run<E: Source>(
    isa: Isa,
    m: usize,
    n: usize,
    k: usize,
    a: MatRef<E>,
    b: MatRef<E>,
    c: &mut [std::mem::MaybeUninit<f32>],
    ldc: usize,
    accumulate: bool,
    threads: usize,
    epi: Option<Epi>,
) -> Option<bool> {
    if !reads::<E>(isa) {
        return None;
    }
    if m == 0 || n == 0 {
        return Some(false);
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
        return Some(false);
    }
    let last = |x: MatRef<E>, rows: usize, cols: usize| (rows - 1) * x.rs + (cols - 1) * x.cs;
    assert!(a.data.len() > last(a, m, k), "sgemm: A slice too short");
    assert!(b.data.len() > last(b, k, n), "sgemm: B slice too short");
    let threads = threads.max(1);
    // The kernels write C through raw pointers; with `accumulate = false` they store every
    // element of the first K block before any later block reads it back.
    let cp = c.as_mut_ptr() as *mut f32;
    #[cfg(target_arch = "x86_64")]
    {
        // The unpacked small-`m` path reads f32 only; 16-bit operands are always packed.
        let skinny = match (E::as_f32(a), E::as_f32(b)) {
            (Some(a), Some(b)) if skinny::applicable(m, n, k, &a, &b) => Some((a, b)),
            _ => None,
        };
        if let Some((a, b)) = skinny {
            skinny::run(isa, m, n, k, a, b, cp, ldc, accumulate, threads);
            Some(false)
        } else {
            Some(match isa {
                Isa::Avx512 => {
                    driver::gemm::<kernel_avx512::Avx512, E>(m, n, k, a, b, cp, ldc, accumulate, threads, epi)
                }
                Isa::Avx2 => driver::gemm::<kernel_avx2::Avx2, E>(m, n, k, a, b, cp, ldc, accumulate, threads, epi),
            })
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, cp, accumulate, epi);
        Some(false)
    }
}

/// How a GEMM narrows its result into a 16-bit output as it goes (the driver's epilogue).
#[cfg(target_arch = "x86_64")]
type Epi = driver::Epilogue;
/// No GEMM runs where the kernels do not exist.
#[cfg(not(target_arch = "x86_64"))]
type Epi = ();

#[cfg(test)]
pub(crate) mod tests;
