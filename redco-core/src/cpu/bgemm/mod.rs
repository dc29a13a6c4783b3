//! bf16 GEMM with f32 accumulation on Intel AMX tiles (`TDPBF16PS`), for CPUs that have
//! AMX-BF16 (Sapphire Rapids and later Xeons).
//!
//! `C (f32, m x n) = A (bf16, m x k) * B (bf16, k x n)`, both operands given by element
//! strides. Blocking, BLIS-style with AMX's shapes:
//! * B is packed `NC` columns at a time (a block of at most [`B_BYTES`], shared by all
//!   threads) into 32-column VNNI panels ([`pack`]);
//! * each task packs a block of `MC` rows of A (at most [`A_BYTES`], thread-local) and
//!   runs the 32 x 32 micro-kernel ([`amx`]) over its panels, the B panel reused by every
//!   32-row block of A while it sits in L1/L2;
//! * tasks split the rows, and the columns too when there are fewer row blocks than
//!   threads.
//!
//! Entry point: [`bgemm_uninit`]; it returns false (touching nothing) where AMX cannot run,
//! so the caller falls back to widening to f32.

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod driver;
#[cfg(target_arch = "x86_64")]
mod pack;
#[cfg(all(test, target_arch = "x86_64"))]
mod tests;

use std::mem::MaybeUninit;

/// Strided view of a bf16 matrix (raw bits): element `(i, j)` is `data[i * rs + j * cs]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct HalfRef<'a> {
    /// The elements.
    pub(crate) data: &'a [u16],
    /// Row stride, in elements.
    pub(crate) rs: usize,
    /// Column stride, in elements.
    pub(crate) cs: usize,
}

/// The most bytes of packed B shared per column block.
pub(crate) const B_BYTES: usize = 4 << 20;
/// The most bytes of packed A per task.
pub(crate) const A_BYTES: usize = 512 << 10;

/// The environment variable that turns the AMX GEMM off (bf16 products then widen to f32
/// and run the f32 GEMM): set to anything but empty or `0`.
pub(crate) const NO_AMX: &str = "REDCO_NO_AMX";

/// True when the AMX bf16 GEMM runs in this process: the CPU has AMX-BF16, the operating
/// system grants the tile state, and neither [`NO_AMX`] nor `REDCO_ASSUME_NO_AVX512` is
/// set (no CPU without AVX-512 has AMX). Read once per process.
pub(crate) fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *ON.get_or_init(|| {
            let off = std::env::var_os(NO_AMX).is_some_and(|v| !v.is_empty() && v != "0");
            !off && crate::cpu::avx512f() && amx::ready()
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// `C = A * B` with `C` row-major `m x n` at row stride `ldc`, every element of its
/// `m x n` part written, on `threads` threads of the current rayon pool. Returns false
/// (nothing written) when [`available`] is false.
///
/// # Panics
/// If the operand slices are too short for their strides, or `c` for `m` rows of `ldc`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn bgemm_uninit(
    m: usize,
    n: usize,
    k: usize,
    a: HalfRef,
    b: HalfRef,
    c: &mut [MaybeUninit<f32>],
    ldc: usize,
    threads: usize,
) -> bool {
    if !available() {
        return false;
    }
    check(m, n, k, &a, &b, c.len(), ldc);
    if m == 0 || n == 0 {
        return true;
    }
    if k == 0 {
        for row in c.chunks_mut(ldc).take(m) {
            row[..n].fill(MaybeUninit::new(0.0));
        }
        return true;
    }
    #[cfg(target_arch = "x86_64")]
    driver::run(m, n, k, &a, &b, c, ldc, threads);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = threads;
    true
}

/// Panics unless every element the strides address is inside its slice.
fn check(m: usize, n: usize, k: usize, a: &HalfRef, b: &HalfRef, c_len: usize, ldc: usize) {
    let last = |rows: usize, cols: usize, r: &HalfRef| {
        if rows == 0 || cols == 0 {
            0
        } else {
            (rows - 1) * r.rs + (cols - 1) * r.cs + 1
        }
    };
    assert!(a.data.len() >= last(m, k, a), "bgemm: A is too short for {m} x {k}");
    assert!(b.data.len() >= last(k, n, b), "bgemm: B is too short for {k} x {n}");
    assert!(ldc >= n, "bgemm: ldc {ldc} < n {n}");
    assert!(m == 0 || c_len >= (m - 1) * ldc + n, "bgemm: C is too short for {m} x {n}");
}
