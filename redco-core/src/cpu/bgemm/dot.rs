//! The bf16 micro-kernel for CPUs with AVX512-BF16 but no AMX (AMD Zen 4 and later,
//! Intel Cooper Lake; Sapphire Rapids with AMX turned off): `VDPBF16PS`, which adds to each
//! of 16 f32 lanes the dot product of one bf16 pair of each operand, so one instruction is
//! 16 x 2 multiply-adds, twice an f32 FMA's.
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
    crate::cpu::avx512f()
        && std::arch::is_x86_feature_detected!("avx512bw")
        && std::arch::is_x86_feature_detected!("avx512bf16")
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
