//! Kernels for a short last panel: when M is not a multiple of `MR` (32 rows, a decode
//! step of 32 sequences, are panels of 14, 14 and 4), the last panel's `R <= SHORT_MAX`
//! valid rows are multiplied with `R` rows of accumulators instead of `MR`, skipping the
//! zero rows the full kernel would multiply (at 32 rows, 10 of the 42 it computes). Each
//! accumulator takes one FMA per k step in k order, as in the full kernel: the rows come
//! out bit for bit equal.

use super::{store_tile, MR, NR, NV};
use crate::sgemm::microkernel::TileDst;
use std::arch::x86_64::*;

/// The most valid rows a short kernel takes (more: the full kernel).
pub const SHORT_MAX: usize = 7;

/// `R` rows of the tile: `kc` steps of a packed A panel (`MR` floats each, rows `R..`
/// ignored) and a packed B panel (`NR` floats each) into `dst`.
///
/// # Safety
/// As [`super::kernel`]: AVX-512F, `a` readable for `kc * MR` floats, `b` for `kc * NR`
/// and 64-byte aligned, `dst` a writable `dst.mr x dst.nr` region (`dst.mr <= R`).
#[target_feature(enable = "avx512f")]
unsafe fn rows<const R: usize>(kc: usize, a: *const f32, b: *const f32, dst: TileDst) {
    let mut acc = [[_mm512_setzero_ps(); NV]; R];
    for k in 0..kc {
        // SAFETY: step k of both panels is inside them; B's rows are 64-byte aligned.
        unsafe {
            let bk = b.add(k * NR);
            let mut bv = [_mm512_setzero_ps(); NV];
            for (v, x) in bv.iter_mut().enumerate() {
                *x = _mm512_load_ps(bk.add(16 * v));
            }
            let ak = a.add(k * MR);
            for (i, row) in acc.iter_mut().enumerate() {
                let x = _mm512_set1_ps(*ak.add(i));
                for (c, &y) in row.iter_mut().zip(&bv) {
                    *c = _mm512_fmadd_ps(y, x, *c);
                }
            }
        }
    }
    let mut tile = [[_mm512_setzero_ps(); NV]; MR];
    tile[..R].copy_from_slice(&acc);
    // SAFETY: forwarded caller contract on `dst`.
    unsafe { store_tile(&tile, dst) }
}

/// The tile `dst` (its `dst.mr` rows) with the short kernel of that many rows; false, with
/// nothing done, when `dst.mr > SHORT_MAX` (the full kernel's work).
///
/// # Safety
/// As [`super::kernel`]: AVX-512F, `a` readable for `kc * MR` floats, `b` for `kc * NR`
/// and 64-byte aligned, `dst` a writable `dst.mr x dst.nr` region.
#[target_feature(enable = "avx512f")]
pub unsafe fn kernel_short(kc: usize, a: *const f32, b: *const f32, dst: TileDst) -> bool {
    // SAFETY: forwarded caller contract; each arm takes at least `dst.mr` rows.
    unsafe {
        match dst.mr {
            1 => rows::<1>(kc, a, b, dst),
            2 => rows::<2>(kc, a, b, dst),
            3 => rows::<3>(kc, a, b, dst),
            4 => rows::<4>(kc, a, b, dst),
            5 => rows::<5>(kc, a, b, dst),
            6 => rows::<6>(kc, a, b, dst),
            7 => rows::<7>(kc, a, b, dst),
            _ => return false,
        }
    }
    true
}
