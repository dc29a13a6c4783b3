//! Products with few rows (decoding, short prompts) against a 16-bit weight: the weight is
//! streamed once and widened to f32 in registers (bf16 by a shift, f16 by F16C), with f32
//! accumulation, instead of converting the whole weight to a fresh f32 buffer per call.
//! At batch 1 a decode step is a stream over the weights, so half the bytes take about
//! half the time of f32.
//!
//! Two layouts of `B` (`k x n`): column-major (a `[n, k]` weight used as `W^T`, as linear
//! layers are), computed as dot products along `k`; and row-major, computed as rows of
//! `C` accumulated from rows of `B`. AVX-512F and AVX2+FMA+F16C kernels are picked at run
//! time; anything else runs the portable loop. Columns are split over the threads.

use rayon::prelude::*;

/// The 16-bit float formats a weight may be stored in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Half {
    /// bfloat16: the upper half of an f32.
    Bf16,
    /// IEEE binary16.
    F16,
}

/// Largest number of rows of `A` this path takes (beyond it packing the weight once for the
/// blocked GEMM pays).
pub(crate) const MAX_ROWS: usize = 16;

/// One value of `h` as f32.
#[inline]
fn widen(h: Half, bits: u16) -> f32 {
    match h {
        Half::Bf16 => f32::from_bits((bits as u32) << 16),
        Half::F16 => half::f16::from_bits(bits).to_f32(),
    }
}

/// The SIMD kernels this machine runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Isa {
    Avx512,
    Avx2,
    Portable,
}

fn isa(h: Half) -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        if super::avx512f() {
            return Isa::Avx512;
        }
        let f16c = h == Half::Bf16 || std::arch::is_x86_feature_detected!("f16c");
        if super::avx2_fma() && f16c {
            return Isa::Avx2;
        }
    }
    let _ = h;
    Isa::Portable
}

/// True when the CPU has AVX512-BF16 (and the AVX-512 paths are not turned off).
fn bf16_dot() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        super::avx512f() && std::arch::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The kernel family this machine runs for bf16 weights (`avx512`, `avx2`, `portable`).
pub(crate) fn family() -> &'static str {
    match isa(Half::Bf16) {
        Isa::Avx512 => "avx512",
        Isa::Avx2 => "avx2",
        Isa::Portable => "portable",
    }
}

/// `C (m x n, row-major) = A (m x k, row-major f32) * B`, `B` the 16-bit weight `w` with
/// element `(p, j)` at `w[p * rs + j * cs]` (`rs == 1` or `cs == 1`), on `threads` threads.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemv(
    h: Half,
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    w: &[u16],
    (rs, cs): (usize, usize),
    threads: usize,
) -> Vec<f32> {
    let mut c = vec![0.0f32; m * n];
    if m == 0 || n == 0 {
        return c;
    }
    let isa = isa(h);
    let nt = if m * n * k < 1 << 16 { 1 } else { threads.max(1) };
    if rs == 1 {
        // columns of B are rows of the weight: C^T[j, i] = dot(W[j, :], A[i, :])
        let mut ct = vec![0.0f32; n * m];
        let per = n.div_ceil(nt * 4).max(1);
        // one bf16 row of A (its values bf16 widened, so narrowing them back is exact):
        // VDPBF16PS multiplies the bf16 pairs as they are, with no widening instructions
        let a16: Option<Vec<u16>> = (m == 1
            && h == Half::Bf16
            && isa == Isa::Avx512
            && bf16_dot()
            && a.iter().all(|x| x.to_bits() & 0xffff == 0))
        .then(|| a.iter().map(|x| (x.to_bits() >> 16) as u16).collect());
        ct.par_chunks_mut(per * m).enumerate().with_max_len(1).for_each(|(t, out)| {
            let j0 = t * per;
            let cols = out.len() / m;
            if m == 1 && isa == Isa::Avx512 {
                // one row of A: the weight rows one after another, a single sequential
                // stream the hardware prefetcher follows (see `dot1`)
                for (jj, o) in out.iter_mut().enumerate() {
                    let j = j0 + jj;
                    let row = &w[j * cs..j * cs + k];
                    *o = match &a16 {
                        // SAFETY: AVX512-BF16 was detected at run time; `row` has k values.
                        Some(x) => unsafe { x86::dot1_bf16(x, row) },
                        None => dot1(isa, h, a, row),
                    };
                }
                return;
            }
            // four weight rows at a time (four streams in flight), the rows PREFETCH_BYTES
            // ahead fetched while these are used
            let ahead_rows = (PREFETCH_BYTES / (2 * k)).clamp(1, 256);
            let mut jj = 0;
            while jj < cols {
                let q = (cols - jj).min(4);
                let rows: [&[u16]; 4] = std::array::from_fn(|u| {
                    let j = j0 + jj + u.min(q - 1);
                    &w[j * cs..j * cs + k]
                });
                let ahead: [&[u16]; 4] = std::array::from_fn(|u| {
                    let j = (j0 + jj + u + ahead_rows).min(n - 1);
                    &w[j * cs..j * cs + k]
                });
                let mut i = 0;
                // four rows at a time where the registers allow it: each widened weight
                // value then serves four rows
                while isa == Isa::Avx512 && i + 4 <= m {
                    let x: [&[f32]; 4] = std::array::from_fn(|r| &a[(i + r) * k..(i + r + 1) * k]);
                    let d = dot4x4(isa, h, x, rows, if i == 0 { Some(ahead) } else { None });
                    for (r, dr) in d.iter().enumerate() {
                        for (u, v) in dr.iter().take(q).enumerate() {
                            out[(jj + u) * m + i + r] = *v;
                        }
                    }
                    i += 4;
                }
                while i < m {
                    let d = dot4(isa, h, &a[i * k..(i + 1) * k], rows, if i == 0 { Some(ahead) } else { None });
                    for (u, v) in d.iter().take(q).enumerate() {
                        out[(jj + u) * m + i] = *v;
                    }
                    i += 1;
                }
                jj += q;
            }
        });
        for j in 0..n {
            for i in 0..m {
                c[i * n + j] = ct[j * m + i];
            }
        }
    } else {
        // rows of B: C[i, j0..j1] += A[i, p] * B[p, j0..j1], column blocks over the threads
        let block = n.div_ceil(nt).div_ceil(64).max(1) * 64;
        let blocks: Vec<(usize, usize)> = (0..n).step_by(block).map(|j0| (j0, (j0 + block).min(n))).collect();
        let parts: Vec<Vec<f32>> = blocks
            .par_iter()
            .with_max_len(1)
            .map(|&(j0, j1)| {
                let width = j1 - j0;
                let mut part = vec![0.0f32; m * width];
                for p in 0..k {
                    let brow = &w[p * rs + j0..p * rs + j1];
                    for i in 0..m {
                        axpy(isa, h, a[i * k + p], brow, &mut part[i * width..(i + 1) * width]);
                    }
                }
                part
            })
            .collect();
        for ((j0, j1), part) in blocks.iter().zip(parts) {
            let width = j1 - j0;
            for i in 0..m {
                c[i * n + j0..i * n + j1].copy_from_slice(&part[i * width..(i + 1) * width]);
            }
        }
    }
    c
}

/// How far ahead of the rows in use the dot-product path prefetches the weight, in bytes
/// (DRAM streaming needs it: on a 400 MB bf16 weight, 2 threads of an AVX-512 Xeon, no
/// prefetch measured 10 GB/s, 16 KiB ahead 14, 128 KiB ahead 22.6, 512 KiB ahead 14.6).
const PREFETCH_BYTES: usize = 128 << 10;

/// `sum a[p] * w[u][p]` for four rows `w[u]`, prefetching the rows `ahead` as it goes.
fn dot4(isa: Isa, h: Half, a: &[f32], w: [&[u16]; 4], ahead: Option<[&[u16]; 4]>) -> [f32; 4] {
    #[cfg(target_arch = "x86_64")]
    match isa {
        // SAFETY: the features were detected at run time; every row has `a.len()` values.
        Isa::Avx512 => return unsafe { x86::dot4_512(h, a, w, ahead) },
        // SAFETY: as above.
        Isa::Avx2 => return unsafe { x86::dot4_256(h, a, w, ahead) },
        Isa::Portable => {}
    }
    let _ = (isa, ahead);
    w.map(|r| a.iter().zip(r).map(|(x, &b)| x * widen(h, b)).sum())
}

/// `sum a[p] * w[p]` for one weight row. At one row of `A` (a decode step at batch 1) the
/// weight rows are read one after another: on a 2-core AMD EPYC (AVX-512) a 768-wide bf16
/// weight streamed at 21-24 GB/s this way against 12-15 GB/s four rows at a time with
/// software prefetch ([`dot4`]; short rows make four short streams that the hardware
/// prefetcher does not follow), and prefetching ahead of the one stream did not help.
fn dot1(isa: Isa, h: Half, a: &[f32], w: &[u16]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 {
        // SAFETY: the feature was detected at run time; `w` has `a.len()` values.
        return unsafe { x86::dot1_512(h, a, w) };
    }
    let _ = isa;
    a.iter().zip(w).map(|(x, &b)| x * widen(h, b)).sum()
}

/// [`dot4`] for four rows `a[r]` at once: `[row][column]`. Only [`Isa::Avx512`] has the
/// registers for it; other kernels run [`dot4`] per row.
fn dot4x4(isa: Isa, h: Half, a: [&[f32]; 4], w: [&[u16]; 4], ahead: Option<[&[u16]; 4]>) -> [[f32; 4]; 4] {
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 {
        // SAFETY: the feature was detected at run time; every row has `a[0].len()` values.
        return unsafe { x86::dot4x4_512(h, a, w, ahead) };
    }
    [0, 1, 2, 3].map(|r| dot4(isa, h, a[r], w, if r == 0 { ahead } else { None }))
}

/// `out[j] += s * w[j]`.
fn axpy(isa: Isa, h: Half, s: f32, w: &[u16], out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    match isa {
        // SAFETY: the features were detected at run time; the slices have equal lengths.
        Isa::Avx512 => return unsafe { x86::axpy512(h, s, w, out) },
        // SAFETY: as above.
        Isa::Avx2 => return unsafe { x86::axpy256(h, s, w, out) },
        Isa::Portable => {}
    }
    let _ = isa;
    for (o, &b) in out.iter_mut().zip(w) {
        *o += s * widen(h, b);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{widen, Half};
    use std::arch::x86_64::*;

    /// 16 values of `h` at `p` as f32.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load16(h: Half, p: *const u16) -> __m512 {
        let raw = _mm256_loadu_si256(p as *const __m256i);
        match h {
            Half::Bf16 => _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16)),
            Half::F16 => _mm512_cvtph_ps(raw),
        }
    }

    /// 8 values of `h` at `p` as f32.
    #[inline]
    #[target_feature(enable = "avx2,f16c")]
    unsafe fn load8(h: Half, p: *const u16) -> __m256 {
        let raw = _mm_loadu_si128(p as *const __m128i);
        match h {
            Half::Bf16 => _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16)),
            Half::F16 => _mm256_cvtph_ps(raw),
        }
    }

    /// [`super::dot4`] with AVX-512F: two accumulators per row over 32 values per round.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn dot4_512(h: Half, a: &[f32], w: [&[u16]; 4], ahead: Option<[&[u16]; 4]>) -> [f32; 4] {
        let n = a.len();
        let pa = a.as_ptr();
        let pw = w.map(|r| r.as_ptr());
        let mut acc = [[_mm512_setzero_ps(); 2]; 4];
        let mut p = 0;
        while p + 32 <= n {
            if let Some(f) = ahead {
                if p % 64 == 0 {
                    for r in f {
                        _mm_prefetch::<_MM_HINT_T0>(r.as_ptr().add(p) as *const i8);
                    }
                }
            }
            let (x0, x1) = (_mm512_loadu_ps(pa.add(p)), _mm512_loadu_ps(pa.add(p + 16)));
            for u in 0..4 {
                acc[u][0] = _mm512_fmadd_ps(x0, load16(h, pw[u].add(p)), acc[u][0]);
                acc[u][1] = _mm512_fmadd_ps(x1, load16(h, pw[u].add(p + 16)), acc[u][1]);
            }
            p += 32;
        }
        let mut out = [0.0f32; 4];
        for u in 0..4 {
            let mut t = _mm512_reduce_add_ps(_mm512_add_ps(acc[u][0], acc[u][1]));
            for q in p..n {
                t += *pa.add(q) * widen(h, *pw[u].add(q));
            }
            out[u] = t;
        }
        out
    }

    /// [`super::dot1`] with AVX-512F: four accumulators over 64 values per round.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn dot1_512(h: Half, a: &[f32], w: &[u16]) -> f32 {
        let n = a.len().min(w.len());
        let (pa, pw) = (a.as_ptr(), w.as_ptr());
        let mut acc = [_mm512_setzero_ps(); 4];
        let mut p = 0;
        while p + 64 <= n {
            for (q, acc) in acc.iter_mut().enumerate() {
                *acc = _mm512_fmadd_ps(_mm512_loadu_ps(pa.add(p + 16 * q)), load16(h, pw.add(p + 16 * q)), *acc);
            }
            p += 64;
        }
        while p + 16 <= n {
            acc[0] = _mm512_fmadd_ps(_mm512_loadu_ps(pa.add(p)), load16(h, pw.add(p)), acc[0]);
            p += 16;
        }
        let mut t = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
        while p < n {
            t += *pa.add(p) * widen(h, *pw.add(p));
            p += 1;
        }
        t
    }

    /// One bf16 row `a` dotted with one bf16 weight row `w` by `VDPBF16PS` (each pair of
    /// products summed into f32 lanes; the products of two bf16 values are exact in f32):
    /// on a 2-core AMD EPYC a 768-wide weight streamed at 30 GB/s (the machine's read rate)
    /// this way, against 22-28 GB/s widening each value first ([`dot1_512`]).
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn dot1_bf16(a: &[u16], w: &[u16]) -> f32 {
        let n = a.len().min(w.len());
        let (pa, pw) = (a.as_ptr(), w.as_ptr());
        let pair = |p: *const u16| -> __m512bh { std::mem::transmute(_mm512_loadu_si512(p as *const _)) };
        let mut acc = [_mm512_setzero_ps(); 4];
        let mut p = 0;
        while p + 128 <= n {
            for (q, acc) in acc.iter_mut().enumerate() {
                *acc = _mm512_dpbf16_ps(*acc, pair(pa.add(p + 32 * q)), pair(pw.add(p + 32 * q)));
            }
            p += 128;
        }
        while p + 32 <= n {
            acc[0] = _mm512_dpbf16_ps(acc[0], pair(pa.add(p)), pair(pw.add(p)));
            p += 32;
        }
        let mut t = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc[0], acc[1]), _mm512_add_ps(acc[2], acc[3])));
        while p < n {
            t += widen(Half::Bf16, *pa.add(p)) * widen(Half::Bf16, *pw.add(p));
            p += 1;
        }
        t
    }

    /// [`super::dot4x4`] with AVX-512F: sixteen accumulators (four rows x four columns),
    /// each widened weight vector used by four rows.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn dot4x4_512(
        h: Half,
        a: [&[f32]; 4],
        w: [&[u16]; 4],
        ahead: Option<[&[u16]; 4]>,
    ) -> [[f32; 4]; 4] {
        let n = a[0].len();
        let pa = a.map(|r| r.as_ptr());
        let pw = w.map(|r| r.as_ptr());
        let mut acc = [[_mm512_setzero_ps(); 4]; 4];
        let mut p = 0;
        while p + 16 <= n {
            if let Some(f) = ahead {
                if p % 64 == 0 {
                    for r in f {
                        _mm_prefetch::<_MM_HINT_T0>(r.as_ptr().add(p) as *const i8);
                    }
                }
            }
            let wv = [0, 1, 2, 3].map(|u| load16(h, pw[u].add(p)));
            for r in 0..4 {
                let x = _mm512_loadu_ps(pa[r].add(p));
                for u in 0..4 {
                    acc[r][u] = _mm512_fmadd_ps(x, wv[u], acc[r][u]);
                }
            }
            p += 16;
        }
        let mut out = [[0.0f32; 4]; 4];
        for r in 0..4 {
            for u in 0..4 {
                let mut t = _mm512_reduce_add_ps(acc[r][u]);
                for q in p..n {
                    t += *pa[r].add(q) * widen(h, *pw[u].add(q));
                }
                out[r][u] = t;
            }
        }
        out
    }

    /// [`super::dot4`] with AVX2, FMA and F16C: one accumulator per row and half.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot4_256(h: Half, a: &[f32], w: [&[u16]; 4], ahead: Option<[&[u16]; 4]>) -> [f32; 4] {
        let n = a.len();
        let pa = a.as_ptr();
        let pw = w.map(|r| r.as_ptr());
        let mut acc = [[_mm256_setzero_ps(); 2]; 4];
        let mut p = 0;
        while p + 16 <= n {
            if let Some(f) = ahead {
                if p % 32 == 0 {
                    for r in f {
                        _mm_prefetch::<_MM_HINT_T0>(r.as_ptr().add(p) as *const i8);
                    }
                }
            }
            let (x0, x1) = (_mm256_loadu_ps(pa.add(p)), _mm256_loadu_ps(pa.add(p + 8)));
            for u in 0..4 {
                acc[u][0] = _mm256_fmadd_ps(x0, load8(h, pw[u].add(p)), acc[u][0]);
                acc[u][1] = _mm256_fmadd_ps(x1, load8(h, pw[u].add(p + 8)), acc[u][1]);
            }
            p += 16;
        }
        let mut out = [0.0f32; 4];
        for u in 0..4 {
            let s = _mm256_add_ps(acc[u][0], acc[u][1]);
            let q = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
            let q = _mm_add_ps(q, _mm_movehl_ps(q, q));
            let q = _mm_add_ss(q, _mm_shuffle_ps(q, q, 1));
            let mut t = _mm_cvtss_f32(q);
            for r in p..n {
                t += *pa.add(r) * widen(h, *pw[u].add(r));
            }
            out[u] = t;
        }
        out
    }

    /// [`super::axpy`] with AVX-512F.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn axpy512(h: Half, s: f32, w: &[u16], out: &mut [f32]) {
        let n = w.len().min(out.len());
        let (pw, po) = (w.as_ptr(), out.as_mut_ptr());
        let sv = _mm512_set1_ps(s);
        let mut p = 0;
        while p + 16 <= n {
            _mm512_storeu_ps(po.add(p), _mm512_fmadd_ps(sv, load16(h, pw.add(p)), _mm512_loadu_ps(po.add(p))));
            p += 16;
        }
        while p < n {
            *po.add(p) += s * widen(h, *pw.add(p));
            p += 1;
        }
    }

    /// [`super::axpy`] with AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn axpy256(h: Half, s: f32, w: &[u16], out: &mut [f32]) {
        let n = w.len().min(out.len());
        let (pw, po) = (w.as_ptr(), out.as_mut_ptr());
        let sv = _mm256_set1_ps(s);
        let mut p = 0;
        while p + 8 <= n {
            _mm256_storeu_ps(po.add(p), _mm256_fmadd_ps(sv, load8(h, pw.add(p)), _mm256_loadu_ps(po.add(p))));
            p += 8;
        }
        while p < n {
            *po.add(p) += s * widen(h, *pw.add(p));
            p += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The f64 reference of `A * B` with `B` widened.
    fn reference(h: Half, m: usize, n: usize, k: usize, a: &[f32], w: &[u16], (rs, cs): (usize, usize)) -> Vec<f64> {
        let mut c = vec![0.0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|p| a[i * k + p] as f64 * widen(h, w[p * rs + j * cs]) as f64).sum();
            }
        }
        c
    }

    fn bits(h: Half, v: f32) -> u16 {
        match h {
            Half::Bf16 => half::bf16::from_f32(v).to_bits(),
            Half::F16 => half::f16::from_f32(v).to_bits(),
        }
    }

    /// The kernels this machine can run.
    fn available() -> Vec<Isa> {
        let mut v = vec![Isa::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx2") && has!("fma") && has!("f16c") {
                v.push(Isa::Avx2);
            }
            if has!("avx512f") {
                v.push(Isa::Avx512);
            }
        }
        v
    }

    #[test]
    fn bf16_rows_of_a_take_the_pair_dot_product_and_match_the_f64_reference() {
        // A exact in bf16 (as a bf16 model's activations are): VDPBF16PS where the CPU has it
        for &(n, k) in &[(37, 131), (9, 768), (5, 32), (3, 7)] {
            let a: Vec<f32> =
                (0..k).map(|i| half::bf16::from_f32(((i * 37 % 101) as f32 - 50.0) / 25.0).to_f32()).collect();
            let w: Vec<u16> = (0..k * n).map(|i| bits(Half::Bf16, ((i * 53 % 97) as f32 - 48.0) / 31.0)).collect();
            let want = reference(Half::Bf16, 1, n, k, &a, &w, (1, k));
            for threads in [1, 2] {
                let got = gemv(Half::Bf16, 1, n, k, &a, &w, (1, k), threads);
                for (g, r) in got.iter().zip(&want) {
                    assert!((*g as f64 - r).abs() <= 1e-4 * (1.0 + r.abs()), "{n}x{k}: {g} vs {r}");
                }
            }
            #[cfg(target_arch = "x86_64")]
            if bf16_dot() {
                let a16: Vec<u16> = a.iter().map(|x| (x.to_bits() >> 16) as u16).collect();
                for j in 0..n {
                    // SAFETY: detected above
                    let d = unsafe { x86::dot1_bf16(&a16, &w[j * k..(j + 1) * k]) } as f64;
                    assert!((d - want[j]).abs() <= 1e-4 * (1.0 + want[j].abs()), "VDPBF16PS {n}x{k}");
                }
            }
        }
    }

    #[test]
    fn every_kernel_and_layout_matches_the_f64_reference() {
        let isas = available();
        for h in [Half::Bf16, Half::F16] {
            for &(m, n, k) in &[(1, 1, 1), (1, 37, 131), (3, 70, 64), (16, 9, 200), (5, 12, 48), (2, 130, 17)] {
                let a: Vec<f32> = (0..m * k).map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0).collect();
                let w: Vec<u16> = (0..k * n).map(|i| bits(h, ((i * 53 % 97) as f32 - 48.0) / 31.0)).collect();
                for layout in [(1, k), (n, 1)] {
                    let want = reference(h, m, n, k, &a, &w, layout);
                    for threads in [1, 2] {
                        let got = gemv(h, m, n, k, &a, &w, layout, threads);
                        for (g, r) in got.iter().zip(&want) {
                            assert!((*g as f64 - r).abs() <= 1e-4 * (1.0 + r.abs()), "{h:?} {m}x{n}x{k} {layout:?}");
                        }
                    }
                    // each kernel on its own, four columns at a time
                    for &i in &isas {
                        let cols: Vec<Vec<u16>> =
                            (0..n).map(|j| (0..k).map(|p| w[p * layout.0 + j * layout.1]).collect()).collect();
                        for j in 0..n {
                            let four: [&[u16]; 4] = std::array::from_fn(|u| cols[(j + u) % n].as_slice());
                            if m >= 4 {
                                let x: [&[f32]; 4] = std::array::from_fn(|r| &a[r * k..(r + 1) * k]);
                                let d = dot4x4(i, h, x, four, Some(four));
                                for (r, dr) in d.iter().enumerate() {
                                    for (u, v) in dr.iter().enumerate() {
                                        let e = want[r * n + (j + u) % n];
                                        assert!((*v as f64 - e).abs() <= 1e-4 * (1.0 + e.abs()), "{h:?} 4x4");
                                    }
                                }
                            }
                            let one = dot1(i, h, &a[..k], four[0]);
                            let r = want[j % n];
                            assert!((one as f64 - r).abs() <= 1e-4 * (1.0 + r.abs()), "{h:?} dot1");
                            let d = dot4(i, h, &a[..k], four, Some(four));
                            for (u, v) in d.iter().enumerate() {
                                let r = want[(j + u) % n];
                                assert!((*v as f64 - r).abs() <= 1e-4 * (1.0 + r.abs()), "{h:?} kernel");
                            }
                        }
                    }
                }
            }
        }
    }
}
