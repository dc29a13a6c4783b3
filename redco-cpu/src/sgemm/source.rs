//! The element types the packers read: f32 as it is, and the 16-bit floats (bf16, f16)
//! widened to f32 in registers as they are packed. A 16-bit product thereby runs the f32
//! micro-kernels (f32 accumulation) straight from its 16-bit operands, with no widened copy
//! of either operand in memory.

use half::{bf16, f16};
use std::arch::x86_64::*;

mod sealed {
    /// Only the element types of this module implement [`super::Source`].
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
}

/// An element type the GEMM's packers read (f32, bf16 or f16; sealed).
///
/// The loads return `n` elements widened to f32 (lanes from `n` on zero) and never touch
/// memory past element `n - 1`.
pub trait Source: sealed::Sealed + Copy + Send + Sync + 'static {
    /// Whether the AVX2 loads need the F16C extension (f16 only).
    const NEEDS_F16C: bool;

    /// The value as f32 (exact for every source type).
    fn to_f32(self) -> f32;

    /// The operand as f32, when it is f32 (the unpacked small-`m` path reads only f32).
    fn as_f32(m: super::MatRef<'_, Self>) -> Option<super::MatRef<'_, f32>>;

    /// Up to 8 elements (`n <= 8`) widened to f32.
    ///
    /// # Safety
    /// `p[0..n]` readable; the CPU has AVX2 (and F16C when [`Self::NEEDS_F16C`]).
    unsafe fn load8(p: *const Self, n: usize) -> __m256;

    /// Up to 16 elements (`n <= 16`) widened to f32.
    ///
    /// # Safety
    /// `p[0..n]` readable; the CPU has AVX-512F (and so AVX2).
    unsafe fn load16(p: *const Self, n: usize) -> __m512;
}

impl Source for f32 {
    const NEEDS_F16C: bool = false;

    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }

    fn as_f32(m: super::MatRef<'_, f32>) -> Option<super::MatRef<'_, f32>> {
        Some(m)
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load8(p: *const f32, n: usize) -> __m256 {
        // SAFETY: full loads read p[0..8] only when n == 8; masked lanes are not accessed.
        unsafe {
            if n >= 8 {
                _mm256_loadu_ps(p)
            } else {
                _mm256_maskload_ps(p, super::common::mask8(n))
            }
        }
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16(p: *const f32, n: usize) -> __m512 {
        // SAFETY: masked-off lanes are not accessed.
        unsafe { _mm512_maskz_loadu_ps(super::common::mask16(n), p) }
    }
}

/// Up to 8 16-bit elements (`n` of them; the lanes from `n` on zero) without touching
/// memory past element `n - 1` (AVX2 has no masked 16-bit load): the pairs by a masked
/// 32-bit load, an odd last element blended in.
///
/// # Safety
/// `p[0..n.min(8)]` readable; the CPU has AVX2.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load_u16x8(p: *const u16, n: usize) -> __m128i {
    // SAFETY: a full load when 8 elements are readable; else the masked load reads the
    // `n / 2` whole pairs and the scalar read element `n - 1`, all inside p[0..n].
    unsafe {
        if n >= 8 {
            return _mm_loadu_si128(p as *const __m128i);
        }
        let pairs = _mm_cmpgt_epi32(_mm_set1_epi32((n / 2) as i32), _mm_setr_epi32(0, 1, 2, 3));
        let raw = _mm_maskload_epi32(p as *const i32, pairs);
        if n.is_multiple_of(2) {
            return raw;
        }
        let at = _mm_cmpeq_epi16(_mm_set1_epi16((n - 1) as i16), _mm_setr_epi16(0, 1, 2, 3, 4, 5, 6, 7));
        _mm_blendv_epi8(raw, _mm_set1_epi16(*p.add(n - 1) as i16), at)
    }
}

/// Up to 16 16-bit elements, as [`load_u16x8`] does 8.
///
/// # Safety
/// `p[0..n.min(16)]` readable; the CPU has AVX2 (every AVX-512F CPU has).
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load_u16x16(p: *const u16, n: usize) -> __m256i {
    // SAFETY: each half reads only its own elements below `n`.
    unsafe {
        if n >= 16 {
            return _mm256_loadu_si256(p as *const __m256i);
        }
        let lo = load_u16x8(p, n.min(8));
        let hi = load_u16x8(p.wrapping_add(8), n.saturating_sub(8));
        _mm256_set_m128i(hi, lo)
    }
}

/// bf16 bits in the low halves of 8 lanes to f32 (a bf16 is the top half of an f32).
#[inline]
#[target_feature(enable = "avx2")]
fn bf16x8(raw: __m128i) -> __m256 {
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(raw)))
}

/// bf16 bits of 16 lanes to f32.
#[inline]
#[target_feature(enable = "avx512f")]
fn bf16x16(raw: __m256i) -> __m512 {
    _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(raw)))
}

impl Source for bf16 {
    const NEEDS_F16C: bool = false;

    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }

    fn as_f32(_: super::MatRef<'_, bf16>) -> Option<super::MatRef<'_, f32>> {
        None
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load8(p: *const bf16, n: usize) -> __m256 {
        // SAFETY: forwarded caller contract.
        unsafe { bf16x8(load_u16x8(p as *const u16, n)) }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx2")]
    unsafe fn load16(p: *const bf16, n: usize) -> __m512 {
        // SAFETY: forwarded caller contract.
        unsafe { bf16x16(load_u16x16(p as *const u16, n)) }
    }
}

impl Source for f16 {
    const NEEDS_F16C: bool = true;

    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }

    fn as_f32(_: super::MatRef<'_, f16>) -> Option<super::MatRef<'_, f32>> {
        None
    }

    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn load8(p: *const f16, n: usize) -> __m256 {
        // SAFETY: forwarded caller contract.
        unsafe { _mm256_cvtph_ps(load_u16x8(p as *const u16, n)) }
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx2")]
    unsafe fn load16(p: *const f16, n: usize) -> __m512 {
        // SAFETY: forwarded caller contract.
        unsafe { _mm512_cvtph_ps(load_u16x16(p as *const u16, n)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every count 0..=16 of each 16-bit type: the first `n` lanes widened exactly, the rest
    /// zero (packed padding must be zero), through both vector widths.
    #[test]
    fn partial_loads_widen_the_first_n_and_zero_the_rest() {
        if !crate::avx2_fma() || !std::arch::is_x86_feature_detected!("f16c") {
            return;
        }
        fn check<E: Source>(from: fn(f32) -> E) {
            for n in 0..=16usize {
                let src: Vec<E> = (0..n).map(|i| from(i as f32 * 0.75 - 3.0)).collect();
                let mut out = [f32::NAN; 16];
                // SAFETY: `src` holds n elements; AVX2 and F16C checked above.
                unsafe { _mm256_storeu_ps(out.as_mut_ptr(), E::load8(src.as_ptr(), n.min(8))) };
                for (i, &v) in out[..8].iter().enumerate() {
                    let want = if i < n.min(8) { src[i].to_f32() } else { 0.0 };
                    assert_eq!(v.to_bits(), want.to_bits(), "load8 n={n} lane {i}");
                }
                if crate::avx512f() {
                    // SAFETY: as above; AVX-512F checked.
                    unsafe { _mm512_storeu_ps(out.as_mut_ptr(), E::load16(src.as_ptr(), n)) };
                    for (i, &v) in out.iter().enumerate() {
                        let want = if i < n { src[i].to_f32() } else { 0.0 };
                        assert_eq!(v.to_bits(), want.to_bits(), "load16 n={n} lane {i}");
                    }
                }
            }
        }
        check(bf16::from_f32);
        check(f16::from_f32);
        check(|x| x);
    }
}
