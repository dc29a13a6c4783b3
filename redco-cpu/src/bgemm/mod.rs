//! bf16 GEMM with f32 accumulation: on Intel AMX tiles (`TDPBF16PS`, Sapphire Rapids and
//! later Xeons, [`amx`]) or, without AMX, with AVX512-BF16's `VDPBF16PS` (AMD Zen 4 and
//! later, Intel Cooper Lake, [`dot`]). Both engines share the packing and the blocking.
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
//! Entry point: [`bgemm_on`], with the process's [`engine`]; it returns false (touching nothing) where neither engine
//! runs, so the caller falls back to widening to f32.

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod dot;
#[cfg(target_arch = "x86_64")]
mod driver;
#[cfg(target_arch = "x86_64")]
mod pack;
#[cfg(target_arch = "x86_64")]
mod prepacked;
#[cfg(target_arch = "x86_64")]
pub(crate) use prepacked::{bgemm_prepacked, PackedHalfB};
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

/// The environment variable that turns the AMX GEMM off (bf16 products then use the
/// AVX512-BF16 engine where the CPU has it, else widen to f32 and run the f32 GEMM): set
/// to anything but empty or `0`.
pub(crate) const NO_AMX: &str = "REDCO_NO_AMX";

/// The environment variable that turns the AVX512-BF16 engine off (set to anything but
/// empty or `0`).
pub(crate) const NO_BF16_DOT: &str = "REDCO_NO_BF16_DOT";

/// The kernels of the bf16 GEMM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Engine {
    /// AMX tiles, 32 x 32 of C per 4 `TDPBF16PS`.
    Amx,
    /// AVX512-BF16 `VDPBF16PS` on zmm registers.
    Dot,
}

impl Engine {
    /// The name benchmarks and `redco info` report.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Engine::Amx => "amx",
            Engine::Dot => "avx512-bf16",
        }
    }

    /// True when this CPU and process can run the engine (whether or not it is chosen).
    pub(crate) fn runs(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            match self {
                Engine::Amx => crate::avx512f() && amx::ready(),
                Engine::Dot => dot::ready(),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    }
}

/// A micro-kernel over the packed operands.
pub(crate) trait Micro {
    /// `C[32 x 32] (+)= A[32 x 32 kc] * B[32 kc x 32]` (f32 accumulation) for one block:
    /// `C =` when `accumulate` is false, `C +=` (C read first) when true.
    ///
    /// `a` holds `kc` steps of two packed A tiles (rows 0..16 then 16..32, each 16 rows of
    /// 32 bf16), `b` `kc` steps of two packed B tiles (columns 0..16 then 16..32, VNNI
    /// layout), step after step; C's row `i` is at `c + i * ldc_bytes`.
    ///
    /// # Safety
    /// `a` and `b` are readable for `kc * 2 * TILE` u16 each; `c` is readable (when
    /// `accumulate`) and writable for 32 rows of 128 bytes at `ldc_bytes` apart; `kc >= 1`.
    unsafe fn kernel(&self, kc: usize, a: *const u16, b: *const u16, c: *mut f32, ldc_bytes: usize, accumulate: bool);
}

fn turned_off(var: &str) -> bool {
    std::env::var_os(var).is_some_and(|v| !v.is_empty() && v != "0")
}

/// True when the AVX512-BF16 engine is faster than the f32 GEMM on widened operands would
/// be here (`VDPBF16PS` against f32 FMA, measured once; see `dot::pays`).
fn dot_pays() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        dot::pays()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The engine bf16 products use in this process: AMX where it runs and [`NO_AMX`] is not
/// set, else AVX512-BF16 where it runs, [`NO_BF16_DOT`] is not set and its instruction
/// outruns f32 FMAs on this core (AMD Zen 4 and later; not Intel's cores), else none. Neither
/// runs under `REDCO_ASSUME_NO_AVX512`. Read once per process.
pub(crate) fn engine() -> Option<Engine> {
    static ON: std::sync::OnceLock<Option<Engine>> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        if !turned_off(NO_AMX) && Engine::Amx.runs() {
            Some(Engine::Amx)
        } else if !turned_off(NO_BF16_DOT) && Engine::Dot.runs() && dot_pays() {
            Some(Engine::Dot)
        } else {
            None
        }
    })
}

/// `C = A * B` with `C` row-major `m x n` at row stride `ldc`, every element of its
/// `m x n` part written, on `threads` threads of the current rayon pool, by `engine`
/// (the process's is [`engine`]). Returns false (nothing written) where it cannot run.
///
/// # Panics
/// If the operand slices are too short for their strides, or `c` for `m` rows of `ldc`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn bgemm_on(
    engine: Engine,
    m: usize,
    n: usize,
    k: usize,
    a: HalfRef,
    b: HalfRef,
    c: &mut [MaybeUninit<f32>],
    ldc: usize,
    threads: usize,
) -> bool {
    if !engine.runs() {
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
    driver::run(engine, m, n, k, &a, driver::BSource::Operand(&b), c, ldc, threads);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (engine, threads);
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
