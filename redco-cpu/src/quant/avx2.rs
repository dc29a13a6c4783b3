//! The integer dot products with AVX2 (and F16C for the blocks' scales): 32 byte products a block summed by `vpmaddubsw` and
//! `vpmaddwd` into eight i32 lanes, scaled in f32 with one fused multiply-add. Signed
//! codes go through `vpsignb` (the first operand of `vpmaddubsw` is unsigned); `Q4_1`'s and
//! `Q4_K`'s nibbles are unsigned already, and their offsets meet the activations' code sums.

use super::QRows;
use redco_core::quant::QuantFormat;
use std::arch::x86_64::*;

/// The f16 at `b[at..at + 2]` as f32, by F16C.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn half(b: &[u8], at: usize) -> f32 {
    let bits = u16::from_le_bytes([b[at], b[at + 1]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// Sum of products of signed bytes `a` and `b`, as eight f32 lanes (lane `i` sums bytes
/// `4i..4i + 4`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_i8(a: __m256i, b: __m256i) -> __m256 {
    let p = _mm256_maddubs_epi16(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a));
    _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1)))
}

/// [`dot_i8`] with `u` unsigned (at most 127).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn dot_u8(u: __m256i, b: __m256i) -> __m256 {
    _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(u, b), _mm256_set1_epi16(1)))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load(b: &[u8]) -> __m256i {
    assert!(b.len() >= 32);
    // SAFETY: 32 bytes are in bounds (checked above); unaligned loads are allowed
    unsafe { _mm256_loadu_si256(b.as_ptr() as *const __m256i) }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load_i8(b: &[i8]) -> __m256i {
    assert!(b.len() >= 32);
    // SAFETY: as `load`
    unsafe { _mm256_loadu_si256(b.as_ptr() as *const __m256i) }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load16(b: &[u8]) -> __m128i {
    assert!(b.len() >= 16);
    // SAFETY: as `load`, 16 bytes
    unsafe { _mm_loadu_si128(b.as_ptr() as *const __m128i) }
}

/// Eight bytes, widened by the caller.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load8(b: &[u8; 8]) -> __m128i {
    _mm_cvtsi64_si128(i64::from_le_bytes(*b))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load_f32x8(v: &[f32]) -> __m256 {
    assert!(v.len() >= 8);
    // SAFETY: 8 values are in bounds (checked above)
    unsafe { _mm256_loadu_ps(v.as_ptr()) }
}

/// `Q4_K`'s eight 6-bit scales and eight 6-bit minimums from their 12 packed bytes, four at
/// a time in 32-bit words (the layout of `portable::scale_min_k4`: scales and minimums 0-3 are the
/// low six bits of bytes 0-3 and 4-7; 4-7 take their low four bits from bytes 8-11 and their
/// high two from the top bits of bytes 0-3 and 4-7).
#[inline]
fn scales_mins_k4(q: &[u8]) -> ([u8; 8], [u8; 8]) {
    let w = |i: usize| u32::from_le_bytes([q[4 * i], q[4 * i + 1], q[4 * i + 2], q[4 * i + 3]]);
    let (a, b, c) = (w(0), w(1), w(2));
    let (six, four, two) = (0x3f3f_3f3f_u32, 0x0f0f_0f0f_u32, 0x0303_0303_u32);
    let sc = [(a & six).to_le_bytes(), ((c & four) | (((a >> 6) & two) << 4)).to_le_bytes()];
    let mn = [(b & six).to_le_bytes(), (((c >> 4) & four) | (((b >> 6) & two) << 4)).to_le_bytes()];
    let join = |h: [[u8; 4]; 2]| [h[0][0], h[0][1], h[0][2], h[0][3], h[1][0], h[1][1], h[1][2], h[1][3]];
    (join(sc), join(mn))
}

/// One activation row as the kernels read it: codes, block scales, scaled code sums.
type XRow<'a> = (&'a [i8], &'a [f32], &'a [f32]);

/// One weight row against `R` activation rows at once: each weight block is loaded and
/// unpacked once for all of them.
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // `r` indexes the rows, their accumulators and outputs in step
fn dots<const R: usize>(format: QuantFormat, w: &[u8], x: [XRow<'_>; R]) -> [f32; R] {
    // two accumulators a row (even and odd blocks, or a sub-block pair's two halves), so
    // that consecutive fused multiply-adds do not wait on each other
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    let low4 = _mm256_set1_epi8(0xF);
    let xb = |r: usize, b: usize| load_i8(&x[r].0[32 * b..32 * b + 32]);
    let d = |r: usize, b: usize| x[r].1[b];
    let mut out = [0f32; R];
    match format {
        QuantFormat::Q8_0 => {
            let q8 = |blk: &[u8], b: usize, acc: &mut [[__m256; 2]; R], h: usize| {
                let (wv, dw) = (load(&blk[2..34]), half(blk, 0));
                for r in 0..R {
                    acc[r][h] = _mm256_fmadd_ps(dot_i8(wv, xb(r, b)), _mm256_set1_ps(dw * d(r, b)), acc[r][h]);
                }
            };
            let pairs = w.chunks_exact(68);
            let tail = pairs.remainder();
            let mut b = 0;
            for pair in pairs {
                q8(&pair[..34], b, &mut acc, 0);
                q8(&pair[34..], b + 1, &mut acc, 1);
                b += 2;
            }
            if !tail.is_empty() {
                q8(tail, b, &mut acc, 0);
            }
        }
        QuantFormat::Q4_0 => {
            let q4 = |blk: &[u8], b: usize, acc: &mut [[__m256; 2]; R], h: usize| {
                let v = load16(&blk[2..18]);
                let v = _mm256_set_m128i(_mm_srli_epi16(v, 4), v);
                let codes = _mm256_sub_epi8(_mm256_and_si256(v, low4), _mm256_set1_epi8(8));
                let dw = half(blk, 0);
                for r in 0..R {
                    acc[r][h] = _mm256_fmadd_ps(dot_i8(codes, xb(r, b)), _mm256_set1_ps(dw * d(r, b)), acc[r][h]);
                }
            };
            let pairs = w.chunks_exact(36);
            let tail = pairs.remainder();
            let mut b = 0;
            for pair in pairs {
                q4(&pair[..18], b, &mut acc, 0);
                q4(&pair[18..], b + 1, &mut acc, 1);
                b += 2;
            }
            if !tail.is_empty() {
                q4(tail, b, &mut acc, 0);
            }
        }
        QuantFormat::Q4_1 => {
            // unsigned nibbles; the offset meets the activations' scaled code sums
            let q41 = |blk: &[u8], b: usize, acc: &mut [[__m256; 2]; R], out: &mut [f32; R], h: usize| {
                let v = load16(&blk[4..20]);
                let codes = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), low4);
                let (dw, mw) = (half(blk, 0), half(blk, 2));
                for r in 0..R {
                    acc[r][h] = _mm256_fmadd_ps(dot_u8(codes, xb(r, b)), _mm256_set1_ps(dw * d(r, b)), acc[r][h]);
                    out[r] += mw * x[r].2[b];
                }
            };
            let pairs = w.chunks_exact(40);
            let tail = pairs.remainder();
            let mut b = 0;
            for pair in pairs {
                q41(&pair[..20], b, &mut acc, &mut out, 0);
                q41(&pair[20..], b + 1, &mut acc, &mut out, 1);
                b += 2;
            }
            if !tail.is_empty() {
                q41(tail, b, &mut acc, &mut out, 0);
            }
        }
        QuantFormat::Q4K => {
            // the activations' scale is one per 256 values (`Q8_K`): a super-block's eight
            // sub-block sums, each times its 6-bit scale, add up as integers, then meet
            // `d * d_x` once; the minimums meet the activations' scaled code sums, eight lanes
            // at once
            let mut mins_acc = [_mm256_setzero_ps(); R];
            for (sb, blk) in w.chunks_exact(144).enumerate() {
                let (dd, dmin) = (half(blk, 0), half(blk, 2));
                let (sc, mn) = scales_mins_k4(&blk[4..16]);
                // the eight scales as 16-bit lanes, in both halves; sub-block j's broadcast
                // by a byte shuffle
                let sc16 = _mm_cvtepu8_epi16(load8(&sc));
                let scales = _mm256_set_m128i(sc16, sc16);
                let pick =
                    |j: usize| _mm256_shuffle_epi8(scales, _mm256_set1_epi16((((2 * j + 1) << 8) | (2 * j)) as i16));
                let mut sumi = [_mm256_setzero_si256(); R];
                for c in 0..4 {
                    let v = load(&blk[16 + 32 * c..16 + 32 * c + 32]);
                    let (lo, hi) = (_mm256_and_si256(v, low4), _mm256_and_si256(_mm256_srli_epi16(v, 4), low4));
                    let (s0, s1) = (pick(2 * c), pick(2 * c + 1));
                    let b = 8 * sb + 2 * c;
                    for r in 0..R {
                        let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, xb(r, b)), s0);
                        let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xb(r, b + 1)), s1);
                        sumi[r] = _mm256_add_epi32(sumi[r], _mm256_add_epi32(p0, p1));
                    }
                }
                let mins = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(load8(&mn))), _mm256_set1_ps(dmin));
                for r in 0..R {
                    let scale = _mm256_set1_ps(dd * d(r, 8 * sb));
                    acc[r][sb & 1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[r]), scale, acc[r][sb & 1]);
                    mins_acc[r] = _mm256_fmadd_ps(mins, load_f32x8(&x[r].2[8 * sb..8 * sb + 8]), mins_acc[r]);
                }
            }
            for r in 0..R {
                acc[r][0] = _mm256_sub_ps(acc[r][0], mins_acc[r]);
            }
        }
        QuantFormat::Q6K => {
            // as `Q4_K`: the 16-value groups' signed scales multiply the pair sums as
            // integers, one conversion a super-block
            let three = _mm256_set1_epi8(3);
            let off = _mm256_set1_epi8(32);
            for (sb, blk) in w.chunks_exact(210).enumerate() {
                let dd = half(blk, 208);
                let mut sumi = [_mm256_setzero_si256(); R];
                for h in 0..2 {
                    let (ql0, ql1) = (load(&blk[64 * h..64 * h + 32]), load(&blk[64 * h + 32..64 * h + 64]));
                    let qh = load(&blk[128 + 32 * h..128 + 32 * h + 32]);
                    let high = |v: __m256i| _mm256_slli_epi16(_mm256_and_si256(v, three), 4);
                    let codes = [
                        _mm256_or_si256(_mm256_and_si256(ql0, low4), high(qh)),
                        _mm256_or_si256(_mm256_and_si256(ql1, low4), high(_mm256_srli_epi16(qh, 2))),
                        _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4),
                            high(_mm256_srli_epi16(qh, 4)),
                        ),
                        _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
                            high(_mm256_srli_epi16(qh, 6)),
                        ),
                    ];
                    for (j, c) in codes.into_iter().enumerate() {
                        let b = 8 * sb + 4 * h + j;
                        let sc = &blk[192 + 8 * h + 2 * j..];
                        // bytes 0..16 meet the first scale, 16..32 the second
                        let scales =
                            _mm256_set_m128i(_mm_set1_epi16(sc[1] as i8 as i16), _mm_set1_epi16(sc[0] as i8 as i16));
                        let c = _mm256_sub_epi8(c, off);
                        for r in 0..R {
                            let p = _mm256_maddubs_epi16(_mm256_sign_epi8(c, c), _mm256_sign_epi8(xb(r, b), c));
                            sumi[r] = _mm256_add_epi32(sumi[r], _mm256_madd_epi16(p, scales));
                        }
                    }
                }
                for r in 0..R {
                    let scale = _mm256_set1_ps(dd * d(r, 8 * sb));
                    acc[r][sb & 1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi[r]), scale, acc[r][sb & 1]);
                }
            }
        }
    }
    for r in 0..R {
        out[r] += hsum(_mm256_add_ps(acc[r][0], acc[r][1]));
    }
    out
}

/// One weight row `w` against every activation row, into `out`: four rows at a time.
pub(super) fn row_dots(format: QuantFormat, w: &[u8], qx: &QRows, out: &mut [f32]) {
    let (k, nb) = (qx.k, qx.k / 32);
    let row = |i: usize| -> XRow<'_> {
        (&qx.q[i * k..(i + 1) * k], &qx.d[i * nb..(i + 1) * nb], &qx.s[i * nb..(i + 1) * nb])
    };
    let m = qx.m.min(out.len());
    let mut i = 0;
    while i + 4 <= m {
        // SAFETY: this module is chosen only where AVX2, FMA and F16C were detected
        let v = unsafe { dots::<4>(format, w, [row(i), row(i + 1), row(i + 2), row(i + 3)]) };
        out[i..i + 4].copy_from_slice(&v);
        i += 4;
    }
    while i < m {
        // SAFETY: as above
        out[i] = unsafe { dots::<1>(format, w, [row(i)]) }[0];
        i += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::super::portable::scale_min_k4;
    use super::*;

    #[test]
    fn the_word_decode_of_q4_k_scales_is_the_byte_decode() {
        // every bit of the 12 bytes set in turn, and a few mixed patterns
        let mut cases: Vec<[u8; 12]> = (0..96)
            .map(|b| {
                let mut q = [0u8; 12];
                q[b / 8] = 1 << (b % 8);
                q
            })
            .collect();
        cases.extend((0..16u32).map(|s| std::array::from_fn(|i| (s.wrapping_mul(97) as usize + i * 37) as u8)));
        for q in cases {
            let (sc, mn) = scales_mins_k4(&q);
            for j in 0..8 {
                assert_eq!((sc[j], mn[j]), scale_min_k4(j, &q), "{q:?} j {j}");
            }
        }
    }
}
