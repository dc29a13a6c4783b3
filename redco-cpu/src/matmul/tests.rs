//! The CPU backend's f32 matmul against a naive f64 reference, through its dispatch: the
//! GEMM the CPU selects ([`F32Gemm::Auto`]: the generated GEMM where it runs, the `gemm` crate
//! elsewhere) and, where those differ, the portable fallback too ([`F32Gemm::Portable`]), so
//! both paths are tested on an AVX-512 machine and these pass on every CPU. The sweeps
//! follow the AVX-512 kernel's own tests (`cpu::sgemm::tests::avx512`): small sizes, every
//! size 1..70, all transpose layouts, several blocks, k = 0, C rows at every offset from a
//! cache line. Each case runs twice: through [`gemm_strided_with`] (what attention uses:
//! any strides, padded leading dimensions, C inside a larger buffer that must stay
//! untouched) and through [`matmul_with`] (what `Backend::matmul` runs: transpose flags,
//! batches).

use super::{gemm_strided_with, matmul_with, F32Gemm, Strides};
use crate::sgemm::tests::Rng;
use redco_core::backend::MatmulSpec;
use redco_core::{DType, HostData};

/// The f32 paths to test here: both where a generated GEMM runs, else the fallback alone.
fn paths() -> &'static [F32Gemm] {
    if F32Gemm::Auto.fast() {
        &[F32Gemm::Auto, F32Gemm::Portable]
    } else {
        &[F32Gemm::Portable]
    }
}

/// One operand: data with (row, column) strides, stored transposed when `t`, each stored
/// row `pad` elements longer than needed.
fn operand(rows: usize, cols: usize, t: bool, pad: usize, rng: &mut Rng) -> (Vec<f32>, usize, usize) {
    if t {
        let ld = rows + pad;
        (rng.vec(ld * cols.max(1)), 1, ld)
    } else {
        let ld = cols + pad;
        (rng.vec(ld * rows.max(1)), ld, 1)
    }
}

/// `a * b` (row-major `m x n`) in f64, each element with the sum of the absolute products.
fn reference(a: &[f32], st: Strides, b: &[f32], m: usize, n: usize, k: usize) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(m * n);
    for i in 0..m {
        for j in 0..n {
            let (mut s, mut sa) = (0f64, 0f64);
            for p in 0..k {
                let x = a[i * st.a_rs + p * st.a_cs] as f64 * b[p * st.b_rs + j * st.b_cs] as f64;
                s += x;
                sa += x.abs();
            }
            out.push((s, sa));
        }
    }
    out
}

/// Asserts `got` (row-major `m x n`) equals the [`reference`] within f32 rounding.
fn assert_close(got: &[f32], want: &[(f64, f64)], m: usize, n: usize, k: usize, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    for (idx, (&g, &(s, sa))) in got.iter().zip(want).enumerate() {
        let g = g as f64;
        let (i, j) = (idx / n.max(1), idx % n.max(1));
        assert!((g - s).abs() <= 1e-5 * sa.max(1.0), "{what} m={m} n={n} k={k} at ({i},{j}): got {g} want {s}");
    }
}

/// `c = a * b` through [`gemm_strided_with`] with padded operands (transposed when `ta` /
/// `tb`) into a C that starts `off` elements into a guarded buffer, on every path; checks the
/// values and that nothing around C changed.
#[allow(clippy::too_many_arguments)]
fn check_strided(m: usize, n: usize, k: usize, ta: bool, tb: bool, off: usize, threads: usize, rng: &mut Rng) {
    let (a, a_rs, a_cs) = operand(m, k, ta, 3, rng);
    let (b, b_rs, b_cs) = operand(k, n, tb, 2, rng);
    let st = Strides { a_rs, a_cs, b_rs, b_cs };
    let guard = 40;
    let orig = rng.vec(guard + off + m * n + guard);
    let want = reference(&a, st, &b, m, n, k);
    for &path in paths() {
        let mut buf = orig.clone();
        // Start C `off` elements past a 64-byte boundary.
        let base = (16 - (buf.as_ptr() as usize / 4) % 16) % 16 + off;
        let c = &mut buf[base..base + m * n];
        gemm_strided_with(m, n, k, &a, &b, c, st, threads, path);
        let what = format!("gemm_strided {path:?} ta={ta} tb={tb} off={off} t={threads}");
        assert_close(&buf[base..base + m * n], &want, m, n, k, &what);
        for (idx, (&g, &w)) in buf.iter().zip(&orig).enumerate() {
            if idx < base || idx >= base + m * n {
                assert_eq!(g.to_bits(), w.to_bits(), "{what} m={m} n={n} k={k}: element {idx} outside C changed");
            }
        }
    }
}

/// `batch` products through [`matmul_with`] (the backend's matmul) on every path, with
/// the transpose flags and batched operands given; checks every product's values.
#[allow(clippy::too_many_arguments)]
fn check_matmul(
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
    ta: bool,
    tb: bool,
    batched: (bool, bool),
    threads: usize,
    rng: &mut Rng,
) {
    let spec = MatmulSpec { batch, m, n, k, trans_a: ta, trans_b: tb, a_batched: batched.0, b_batched: batched.1 };
    let a = rng.vec(if batched.0 { batch } else { 1 } * m * k);
    let b = rng.vec(if batched.1 { batch } else { 1 } * k * n);
    let (a_rs, a_cs) = if ta { (1, m) } else { (k, 1) };
    let (b_rs, b_cs) = if tb { (1, k) } else { (n, 1) };
    let st = Strides { a_rs, a_cs, b_rs, b_cs };
    let want: Vec<Vec<(f64, f64)>> = (0..batch)
        .map(|i| {
            let ai = if batched.0 { &a[i * m * k..(i + 1) * m * k] } else { &a[..] };
            let bi = if batched.1 { &b[i * k * n..(i + 1) * k * n] } else { &b[..] };
            reference(ai, st, bi, m, n, k)
        })
        .collect();
    for &path in paths() {
        let out = matmul_with(&HostData::F32(a.clone()), &HostData::F32(b.clone()), &spec, DType::F32, threads, path)
            .expect("matmul");
        let HostData::F32(c) = out else { panic!("matmul of f32 gave {:?}", out.dtype()) };
        assert_eq!(c.len(), batch * m * n, "{spec:?}");
        for (i, want) in want.iter().enumerate() {
            let what = format!("matmul {path:?} t={threads} {spec:?} product {i}");
            assert_close(&c[i * m * n..(i + 1) * m * n], want, m, n, k, &what);
        }
    }
}

/// Both entry points for one shape.
#[allow(clippy::too_many_arguments)]
fn check(m: usize, n: usize, k: usize, ta: bool, tb: bool, threads: usize, rng: &mut Rng) {
    check_strided(m, n, k, ta, tb, 0, threads, rng);
    check_matmul(1, m, n, k, ta, tb, (false, false), threads, rng);
}

#[test]
fn small_all_sizes() {
    let mut rng = Rng(0x1234_5678_9abc_def1);
    for m in [1, 2, 3, 5, 8, 13, 14, 15, 29, 33, 70] {
        for n in [1, 2, 7, 16, 17, 31, 32, 33, 65, 70] {
            for k in [1, 2, 3, 16, 17, 70] {
                let ta = (m + n + k) % 2 == 0;
                let tb = (m * n + k) % 3 == 0;
                check(m, n, k, ta, tb, 2, &mut rng);
            }
        }
    }
}

#[test]
fn all_layouts() {
    let mut rng = Rng(42);
    for &(m, n, k) in &[(37, 45, 53), (1, 70, 33), (4, 100, 64), (70, 1, 20), (100, 3, 40), (8, 8, 1)] {
        for ta in [false, true] {
            for tb in [false, true] {
                for threads in [1, 2, 3] {
                    check(m, n, k, ta, tb, threads, &mut rng);
                }
            }
        }
    }
}

#[test]
fn batched_layouts() {
    // Batches of small products go one per task; big ones one after another on all threads.
    let mut rng = Rng(11);
    for &(batch, m, n, k) in &[(3, 17, 9, 33), (4, 1, 70, 16), (2, 130, 140, 129)] {
        for batched in [(true, true), (true, false), (false, true)] {
            for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                check_matmul(batch, m, n, k, ta, tb, batched, 3, &mut rng);
            }
        }
    }
}

#[test]
fn odd_sizes_1_to_70() {
    let mut rng = Rng(7);
    for s in 1..=70 {
        check(s, s, s, false, false, 2, &mut rng);
        check(s, 71 - s, (s * 7) % 70 + 1, s % 3 == 0, s % 5 == 0, 2, &mut rng);
    }
}

#[test]
fn multi_block() {
    // Crosses the generated GEMMs' KC, NC and M blocks and task splits, and the `gemm`
    // crate's parallel path.
    let mut rng = Rng(99);
    check(300, 600, 1100, false, false, 2, &mut rng);
    check(301, 257, 530, true, true, 2, &mut rng);
    check(5, 1000, 700, false, true, 2, &mut rng);
    check(3000, 40, 100, false, false, 2, &mut rng);
    check(2900, 70, 3000, false, false, 2, &mut rng);
    check_strided(2900, 70, 3000, true, false, 0, 3, &mut rng);
}

#[test]
fn k_zero() {
    // An empty sum is zero, whatever C held before; m = 0 or n = 0 gives an empty result.
    let mut rng = Rng(3);
    for &(m, n) in &[(3, 4), (1, 9), (40, 33)] {
        check_strided(m, n, 0, false, false, 1, 2, &mut rng);
        check_strided(m, n, 0, true, true, 0, 2, &mut rng);
        check_matmul(2, m, n, 0, false, false, (true, true), 2, &mut rng);
    }
    for &(m, n, k) in &[(0, 4, 3), (3, 0, 3), (0, 0, 0)] {
        check_strided(m, n, k, false, false, 0, 2, &mut rng);
        check_matmul(2, m, n, k, false, true, (true, false), 2, &mut rng);
    }
}

/// C rows that start mid cache line (as in any `Vec` output): every offset from a 64-byte
/// boundary, row-major and transposed B, m = 1; everything around C stays untouched.
#[test]
fn misaligned_c_rows() {
    let mut rng = Rng(5);
    let shapes: [(usize, usize, usize); 4] = [(30, 77, 40), (1, 100, 33), (45, 32, 600), (29, 1100, 20)];
    for &(m, n, k) in &shapes {
        for off in 0..16 {
            check_strided(m, n, k, false, off % 2 == 1, off, 2, &mut rng);
        }
    }
}

/// [`F32Gemm::Auto`] runs the AVX-512 GEMM exactly where the CPU has AVX-512F and
/// `REDCO_ASSUME_NO_AVX512` does not turn it off, else the AVX2 one where the CPU has AVX2
/// and FMA, unless `REDCO_NO_SGEMM` is set; `Portable` never runs either.
#[test]
fn auto_picks_the_best_generated_gemm_exactly_where_it_runs() {
    use crate::sgemm::Isa;
    let set = |v: &str| std::env::var_os(v).is_some_and(|x| !x.is_empty() && x != "0");
    #[cfg(target_arch = "x86_64")]
    let (avx512, avx2) = (
        std::arch::is_x86_feature_detected!("avx512f"),
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma"),
    );
    #[cfg(not(target_arch = "x86_64"))]
    let (avx512, avx2) = (false, false);
    let want = if avx512 && !set(redco_core::host_simd::ASSUME_NO_AVX512) {
        Some(Isa::Avx512)
    } else if avx2 {
        Some(Isa::Avx2)
    } else {
        None
    };
    assert_eq!(Isa::detect(), want);
    assert_eq!(crate::sgemm::is_supported(), want.is_some());
    assert_eq!(F32Gemm::Auto.fast(), want.is_some() && std::env::var_os("REDCO_NO_SGEMM").is_none());
    assert!(!F32Gemm::Portable.fast());
}

/// Few rows against a bf16 or f16 weight (the decode path that widens the weight in
/// registers) give the product of the widened operands, for both weight layouts and for
/// batched rows against one weight; larger products (the packed bf16 GEMM where the CPU has
/// one, else the generated f32 GEMM widening 16-bit operands as it packs them) too, with
/// either operand transposed and both batched.
#[test]
fn half_weight_products_match_the_widened_f32_product() {
    for dt in [DType::BF16, DType::F16] {
        for &(batch, m, n, k, trans_a, trans_b, a_batched, b_batched) in &[
            (1, 1, 70, 64, false, true, false, false),
            (1, 3, 33, 130, false, false, false, false),
            (2, 2, 40, 48, false, true, true, false),
            (1, 20, 24, 16, false, true, false, false),
            (1, 45, 70, 300, false, false, false, false),
            (1, 31, 17, 90, true, false, false, false),
            (3, 19, 33, 40, false, true, true, true),
            (2, 64, 9, 129, true, true, true, true),
        ] {
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
            let rows = if a_batched { batch * m } else { m };
            let wn = if b_batched { batch } else { 1 };
            let a: Vec<f32> = (0..rows * k).map(|_| rng.next()).collect();
            let w: Vec<f32> = (0..wn * k * n).map(|_| rng.next()).collect();
            let (ha, hw) = (HostData::from_f32(a, dt), HostData::from_f32(w, dt));
            let spec = MatmulSpec { batch, m, n, k, trans_a, trans_b, a_batched, b_batched };
            let got = matmul_with(&ha, &hw, &spec, dt, 2, F32Gemm::Auto).unwrap().to_f32_vec();
            let (wa, ww) = (HostData::F32(ha.to_f32_vec()), HostData::F32(hw.to_f32_vec()));
            let want = matmul_with(&wa, &ww, &spec, DType::F32, 2, F32Gemm::Portable).unwrap().to_f32_vec();
            assert_eq!(got.len(), want.len());
            for (g, r) in got.iter().zip(&want) {
                // both rounded to the 16-bit type at the end
                let r = HostData::from_f32(vec![*r], dt).to_f32_vec()[0];
                assert!((g - r).abs() <= 1e-2 * (1.0 + r.abs()), "{dt:?} {batch}x{m}x{n}x{k} t{trans_b}: {g} vs {r}");
            }
        }
    }
}
