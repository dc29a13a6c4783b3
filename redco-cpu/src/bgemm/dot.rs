//! The bf16 micro-kernel for CPUs with AVX512-BF16 but no AMX (AMD Zen 4 and later,
//! Intel Cooper Lake; Sapphire Rapids with AMX turned off): `VDPBF16PS`, which adds to each
//! of 16 f32 lanes the dot product of one bf16 pair of each operand, so one instruction is
//! 16 x 2 multiply-adds, twice an f32 FMA's. It pays only where the instruction issues
//! about as often as an FMA (AMD's cores); on an Intel Xeon without AMX it measured 0.46x
//! the FMA's multiply-add rate, so [`pays`] measures it once per process and the engine is
//! chosen only where it wins.
//!
//! It reads the packed operands of the AMX kernel unchanged: a tile row of A (32 k of one
//! row) is 16 pairs, broadcast one at a time; a VNNI tile row of B (one k pair of 16
//! columns) is one 512-bit operand. The 32 x 32 block of C is computed in four passes of
//! 8 rows x 32 columns: 16 accumulators, two B registers and the broadcast pair, so every
//! pair of B loads feeds 16 products.

use super::amx::{BLOCK, TILE};
use super::Micro;
use std::arch::x86_64::*;

/// Rows of C per pass (16 accumulators of 16 lanes for 32 columns).
const ROWS: usize = 8;

/// The AVX512-BF16 micro-kernel; exists only where [`ready`] is true.
pub(super) struct Dot(());

impl Dot {
    /// The kernel.
    ///
    /// # Safety
    /// [`ready`] returned true.
    pub(super) unsafe fn assume_ready() -> Dot {
        Dot(())
    }
}

/// True when the CPU has AVX512-BF16 with AVX-512F and -BW (the packing) and the AVX-512
/// paths are not turned off (`REDCO_ASSUME_NO_AVX512`).
pub(super) fn ready() -> bool {
    crate::avx512f()
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512bf16")
}

/// How many times the f32 FMA's multiply-add rate `VDPBF16PS` must reach before the bf16
/// GEMM uses it: on AMD Zen 4 and 5 it reaches about 2x (a `VDPBF16PS` issues as often as an
/// FMA and does twice its work); on Intel cores without AMX it issues at half the FMA's rate
/// or less, and the f32 GEMM on operands widened while packing is faster.
const PAYS_AT: f64 = 1.3;

/// True when `VDPBF16PS` does more multiply-adds per second on this core than f32 FMAs, by
/// [`PAYS_AT`]: measured once per process with independent chains of each instruction
/// (about 2 ms), the best of several interleaved rounds, so that a preempted round does
/// not decide.
pub(super) fn pays() -> bool {
    ready() && rate_against_fma() >= PAYS_AT
}

/// `VDPBF16PS`'s multiply-adds per second over f32 FMAs' on this core, measured now.
///
/// # Panics
/// Where [`ready`] is false (the instruction would fault).
pub(super) fn rate_against_fma() -> f64 {
    assert!(ready(), "VDPBF16PS does not run on this CPU or process");
    let (mut dot, mut fma) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..5 {
        // SAFETY: `ready` checked the CPU's AVX512-BF16 and AVX-512F.
        let t = std::time::Instant::now();
        std::hint::black_box(unsafe { dot_chains(CALIBRATION_ROUNDS) });
        dot = dot.min(t.elapsed().as_secs_f64());
        let t = std::time::Instant::now();
        // SAFETY: as above.
        std::hint::black_box(unsafe { fma_chains(CALIBRATION_ROUNDS) });
        fma = fma.min(t.elapsed().as_secs_f64());
    }
    // a VDPBF16PS is 32 multiply-adds per 512 bits, an FMA 16: the same count of each ran
    let ratio = 2.0 * fma / dot;
    tracing::debug!(ratio, "VDPBF16PS multiply-add rate against f32 FMA");
    ratio
}

/// Rounds of 16 instructions per calibration run.
const CALIBRATION_ROUNDS: usize = 1 << 15;

/// `rounds` rounds of 16 independent `VDPBF16PS` chains (as many as the micro-kernel keeps).
///
/// # Safety
/// The CPU has AVX512-BF16 and AVX-512F.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn dot_chains(rounds: usize) -> __m512 {
    // SAFETY (all transmutes): 512-bit integer vectors reinterpreted as 32 bf16 lanes.
    let x: __m512bh = unsafe { std::mem::transmute(_mm512_set1_epi32(0x3f80_3f80)) };
    let y: __m512bh = unsafe { std::mem::transmute(_mm512_set1_epi32(0x3400_3400)) };
    let mut acc = [_mm512_setzero_ps(); 16];
    for _ in 0..rounds {
        for a in acc.iter_mut() {
            *a = _mm512_dpbf16_ps(*a, x, y);
        }
    }
    acc.iter().fold(_mm512_setzero_ps(), |s, &a| _mm512_add_ps(s, a))
}

/// `rounds` rounds of 16 independent f32 FMA chains on zmm registers.
///
/// # Safety
/// The CPU has AVX-512F.
#[target_feature(enable = "avx512f")]
unsafe fn fma_chains(rounds: usize) -> __m512 {
    let (x, y) = (_mm512_set1_ps(0.999_999), _mm512_set1_ps(1e-7));
    let mut acc = [_mm512_setzero_ps(); 16];
    for _ in 0..rounds {
        for a in acc.iter_mut() {
            *a = _mm512_fmadd_ps(*a, x, y);
        }
    }
    acc.iter().fold(_mm512_setzero_ps(), |s, &a| _mm512_add_ps(s, a))
}

impl Micro for Dot {
    #[inline]
    unsafe fn kernel(&self, kc: usize, a: *const u16, b: *const u16, c: *mut f32, ldc_bytes: usize, accumulate: bool) {
        for pass in 0..BLOCK / ROWS {
            // rows 8 * pass .. 8 * pass + 8: tile pass / 2 of each step, from its row 8 * (pass % 2)
            let a_rows = (pass / 2) * TILE + (pass % 2) * ROWS * 32;
            // SAFETY: `Dot` exists, so the CPU has AVX512-BF16; the pointers satisfy the
            // caller's contract (Micro::kernel), which covers every row of every pass.
            unsafe {
                let c_rows = c.cast::<u8>().add(pass * ROWS * ldc_bytes).cast::<f32>();
                pass8(kc, a.add(a_rows), b, c_rows, ldc_bytes, accumulate);
            }
        }
    }
}

/// `C[8 x 32] (+)= A[8 x 32 kc] * B[32 kc x 32]`: `a` points at the first of the 8 rows in
/// the first step's A tile (rows 32 u16 apart, steps `2 * TILE` apart), `b` at the first
/// step's two B tiles.
///
/// # Safety
/// The CPU has AVX512-BF16 and AVX-512F; `a` is readable for 8 rows of 32 u16 in each of
/// `kc` steps, `b` for `kc * 2 * TILE` u16; `c` for 8 rows of 32 f32 at `ldc_bytes` apart
/// (read when `accumulate`, written always).
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn pass8(kc: usize, a: *const u16, b: *const u16, c: *mut f32, ldc_bytes: usize, accumulate: bool) {
    let row = |r: usize| c.cast::<u8>().wrapping_add(r * ldc_bytes).cast::<f32>();
    let mut acc = [[_mm512_setzero_ps(); 2]; ROWS];
    if accumulate {
        for (r, lanes) in acc.iter_mut().enumerate() {
            // SAFETY: row r of C holds 32 readable f32 (caller).
            unsafe {
                lanes[0] = _mm512_loadu_ps(row(r));
                lanes[1] = _mm512_loadu_ps(row(r).add(16));
            }
        }
    }
    for s in 0..kc {
        // SAFETY: step s of A's rows and of B's two tiles is inside the caller's ranges.
        let (a_s, b_s) = unsafe { (a.add(s * 2 * TILE), b.add(s * 2 * TILE)) };
        for p in 0..16 {
            // SAFETY: pair p of B's tile rows (16 rows of 32 u16 per tile) and of A's rows.
            unsafe {
                let b0: __m512bh = std::mem::transmute(_mm512_loadu_si512(b_s.add(p * 32).cast()));
                let b1: __m512bh = std::mem::transmute(_mm512_loadu_si512(b_s.add(TILE + p * 32).cast()));
                for (r, lanes) in acc.iter_mut().enumerate() {
                    let pair = a_s.add(r * 32 + 2 * p).cast::<i32>().read_unaligned();
                    let x: __m512bh = std::mem::transmute(_mm512_set1_epi32(pair));
                    lanes[0] = _mm512_dpbf16_ps(lanes[0], x, b0);
                    lanes[1] = _mm512_dpbf16_ps(lanes[1], x, b1);
                }
            }
        }
    }
    for (r, lanes) in acc.iter().enumerate() {
        // SAFETY: row r of C holds 32 writable f32 (caller).
        unsafe {
            _mm512_storeu_ps(row(r), lanes[0]);
            _mm512_storeu_ps(row(r).add(16), lanes[1]);
        }
    }
}
