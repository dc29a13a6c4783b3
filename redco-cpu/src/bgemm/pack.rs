//! Packing bf16 operands into AMX tiles (AVX-512BW), zero-padded at the edges.
//!
//! A 32-row block of A is packed as `kc` steps of two tiles (rows 0..16, 16..32), each 16
//! rows of 32 consecutive k; a 32-column panel of B as `kc` steps of two tiles (columns
//! 0..16, 16..32) in the VNNI layout: tile row `r`, pair `j` = `B[2r][j], B[2r + 1][j]`.
//! The fast paths cover whole tiles of the common layouts (A row-major or transposed, B
//! row-major or transposed); partial tiles and other strides are copied element by element.

use super::amx::{KSTEP, TILE};
use super::HalfRef;
use crate::sgemm::pack_avx512::transpose16;
use std::arch::x86_64::*;

/// Element `(i, j)` of a strided matrix, or 0 outside `rows x cols`.
#[inline]
fn at(m: &HalfRef, rows: usize, cols: usize, i: usize, j: usize) -> u16 {
    if i < rows && j < cols {
        m.data[i * m.rs + j * m.cs]
    } else {
        0
    }
}

/// 16 lanes of 32 bits from two rows of 16 u16: lane `j` = `lo[j] | hi[j] << 16`.
#[target_feature(enable = "avx512f,avx512bw")]
#[inline]
unsafe fn pairs(lo: *const u16, hi: *const u16) -> __m512i {
    // SAFETY: the caller guarantees 16 readable u16 at each pointer.
    unsafe {
        let l = _mm512_cvtepu16_epi32(_mm256_loadu_si256(lo.cast()));
        let h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(hi.cast()));
        _mm512_or_si512(l, _mm512_slli_epi32::<16>(h))
    }
}

/// Transposes 16 vectors of 16 x 32-bit lanes.
#[target_feature(enable = "avx512f")]
#[inline]
fn transpose16_epi32(v: &[__m512i; 16]) -> [__m512i; 16] {
    let f: [__m512; 16] = std::array::from_fn(|i| _mm512_castsi512_ps(v[i]));
    let t = transpose16(&f);
    std::array::from_fn(|i| _mm512_castps_si512(t[i]))
}

/// Packs rows `i0 .. i0 + 32` of the `m x k` matrix A (rows past `m` are zeros) into
/// `k.div_ceil(32) * 2` tiles at `dst`.
///
/// # Safety
/// `dst` is writable for `k.div_ceil(32) * 2 * TILE` u16; the CPU has AVX-512F and -BW;
/// `a` holds the `m x k` matrix its strides address.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn pack_a(a: &HalfRef, m: usize, k: usize, i0: usize, dst: *mut u16) {
    for s in 0..k.div_ceil(KSTEP) {
        let k0 = s * KSTEP;
        for h in 0..2 {
            let r0 = i0 + h * 16;
            // SAFETY: tile (s, h) lies inside dst's 2 * kc tiles.
            let tile = unsafe { dst.add((2 * s + h) * TILE) };
            let whole = r0 + 16 <= m && k0 + KSTEP <= k;
            if whole && a.cs == 1 {
                for r in 0..16 {
                    // SAFETY: row r0 + r, columns k0 .. k0 + 32, is inside A (whole tile);
                    // the tile row is 32 u16 inside dst.
                    unsafe {
                        let v = _mm512_loadu_si512(a.data.as_ptr().add((r0 + r) * a.rs + k0).cast());
                        _mm512_storeu_si512(tile.add(r * 32).cast(), v);
                    }
                }
            } else if whole && a.rs == 1 {
                // A stored transposed: k runs down columns of a k x m row-major matrix.
                // Pair q of tile row r is (A[r][2q], A[r][2q + 1]): build the 16 x 16 pair
                // matrix by k-pairs, then transpose it.
                let p = a.data.as_ptr();
                // SAFETY: rows k0 + 2q, k0 + 2q + 1 (< k) of At, columns r0 .. r0 + 16 (<= m).
                let v: [__m512i; 16] = std::array::from_fn(|q| unsafe {
                    pairs(p.add((k0 + 2 * q) * a.cs + r0), p.add((k0 + 2 * q + 1) * a.cs + r0))
                });
                let t = transpose16_epi32(&v);
                for (r, row) in t.iter().enumerate() {
                    // SAFETY: tile row r inside dst.
                    unsafe { _mm512_storeu_si512(tile.add(r * 32).cast(), *row) };
                }
            } else {
                for r in 0..16 {
                    for q in 0..KSTEP {
                        // SAFETY: inside tile (s, h).
                        unsafe { *tile.add(r * 32 + q) = at(a, m, k, r0 + r, k0 + q) };
                    }
                }
            }
        }
    }
}

/// Packs columns `j0 .. j0 + 32` of the `k x n` matrix B (columns past `n` and k past `k`
/// are zeros) into `k.div_ceil(32) * 2` VNNI tiles at `dst`.
///
/// # Safety
/// As [`pack_a`], for B.
#[target_feature(enable = "avx512f,avx512bw")]
pub(super) unsafe fn pack_b(b: &HalfRef, k: usize, n: usize, j0: usize, dst: *mut u16) {
    for s in 0..k.div_ceil(KSTEP) {
        let k0 = s * KSTEP;
        for h in 0..2 {
            let c0 = j0 + h * 16;
            // SAFETY: tile (s, h) lies inside dst.
            let tile = unsafe { dst.add((2 * s + h) * TILE) };
            let whole = c0 + 16 <= n && k0 + KSTEP <= k;
            let p = b.data.as_ptr();
            if whole && b.cs == 1 {
                for r in 0..16 {
                    // SAFETY: rows k0 + 2r, k0 + 2r + 1 (< k), columns c0 .. c0 + 16 (<= n).
                    unsafe {
                        let v = pairs(p.add((k0 + 2 * r) * b.rs + c0), p.add((k0 + 2 * r + 1) * b.rs + c0));
                        _mm512_storeu_si512(tile.add(r * 32).cast(), v);
                    }
                }
            } else if whole && b.rs == 1 {
                // B stored transposed (a weight `[n, k]`): column j's k run contiguously, so
                // its 16 pairs are one 64-byte load; transpose the 16 columns' loads.
                // SAFETY: column c0 + j (< n), k0 .. k0 + 32 (<= k).
                let v: [__m512i; 16] =
                    std::array::from_fn(|j| unsafe { _mm512_loadu_si512(p.add((c0 + j) * b.cs + k0).cast()) });
                let t = transpose16_epi32(&v);
                for (r, row) in t.iter().enumerate() {
                    // SAFETY: tile row r inside dst.
                    unsafe { _mm512_storeu_si512(tile.add(r * 32).cast(), *row) };
                }
            } else {
                for r in 0..16 {
                    for j in 0..16 {
                        for e in 0..2 {
                            // SAFETY: inside tile (s, h).
                            unsafe { *tile.add(r * 32 + 2 * j + e) = at(b, k, n, k0 + 2 * r + e, c0 + j) };
                        }
                    }
                }
            }
        }
    }
}
