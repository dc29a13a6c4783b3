//! Each sgemm kernel family against a naive f64 reference: every size 1..70, every
//! transpose layout, padded leading dims, accumulate on/off, 1..3 threads, k = 0, several M
//! blocks, C rows that start mid cache line.
//!
//! The sweeps are written once, for an [`Isa`]; the `avx512` and `avx2` modules below run
//! them with one family each. They call the kernels themselves, so they need the family's
//! instruction set: `cargo xtask test` leaves every test under an `::avx512::` module out
//! where the CPU lacks AVX-512F (or `REDCO_ASSUME_NO_AVX512` is set), and the `::avx2::`
//! ones where it lacks AVX2 or FMA, and names them as skipped; run there anyway, each fails
//! saying why.

use super::super::{gemm_narrow_with, gemm_with, sgemm_with, Isa, MatRef, Sink, Source};
use super::Rng;

/// Fails the calling test, saying why, when the family cannot run here.
fn require(isa: Isa) {
    assert!(
        isa.runs_here(),
        "this test checks the {} sgemm kernel, which this CPU cannot run (or \
         REDCO_ASSUME_NO_AVX512 is set); `cargo xtask test` skips these tests there, and \
         cpu::matmul::tests covers the GEMM the backend uses instead",
        isa.name()
    );
}

/// `sgemm_with(isa, ..)`, failing the test when the family does not run.
#[allow(clippy::too_many_arguments)]
fn gemm(isa: Isa, m: usize, n: usize, k: usize, a: MatRef, b: MatRef, c: &mut [f32], ldc: usize, acc: bool, t: usize) {
    assert!(sgemm_with(isa, m, n, k, a, b, c, ldc, acc, t), "the {} sgemm refused to run", isa.name());
}

/// Checks one case; `ta`/`tb` select transposed storage, `pad` adds leading-dimension padding.
#[allow(clippy::too_many_arguments)]
fn check(isa: Isa, m: usize, n: usize, k: usize, ta: bool, tb: bool, acc: bool, threads: usize, rng: &mut Rng) {
    let pad = 3;
    let (lda, a_rs, a_cs, a_len) = if ta {
        let lda = m + pad;
        (lda, 1, lda, lda * k.max(1))
    } else {
        let lda = k + pad;
        (lda, lda, 1, lda * m.max(1))
    };
    let _ = lda;
    let (b_rs, b_cs, b_len) = if tb {
        let ldb = k + pad;
        (1, ldb, ldb * n.max(1))
    } else {
        let ldb = n + pad;
        (ldb, 1, ldb * k.max(1))
    };
    let a = rng.vec(a_len);
    let b = rng.vec(b_len);
    let ldc = n + 5;
    let c0 = rng.vec(ldc * m.max(1));
    let mut c = c0.clone();
    gemm(
        isa,
        m,
        n,
        k,
        MatRef { data: &a, rs: a_rs, cs: a_cs },
        MatRef { data: &b, rs: b_rs, cs: b_cs },
        &mut c,
        ldc,
        acc,
        threads,
    );
    for i in 0..m {
        for j in 0..n {
            let mut s = 0f64;
            let mut sa = 0f64;
            for p in 0..k {
                let x = a[i * a_rs + p * a_cs] as f64 * b[p * b_rs + j * b_cs] as f64;
                s += x;
                sa += x.abs();
            }
            let base = if acc { c0[i * ldc + j] as f64 } else { 0.0 };
            let want = base + s;
            let got = c[i * ldc + j] as f64;
            let tol = 1e-5 * (sa + base.abs()).max(1.0);
            assert!(
                (got - want).abs() <= tol,
                "m={m} n={n} k={k} ta={ta} tb={tb} acc={acc} t={threads} at ({i},{j}): got {got} want {want}"
            );
        }
        // Padding columns untouched.
        for j in n..ldc {
            if i * ldc + j < c.len() {
                assert_eq!(c[i * ldc + j], c0[i * ldc + j], "padding clobbered");
            }
        }
    }
}

pub(super) fn small_all_sizes(isa: Isa) {
    require(isa);
    let mut rng = Rng(0x1234_5678_9abc_def1);
    for m in [1, 2, 3, 5, 8, 13, 14, 15, 29, 33, 70] {
        for n in [1, 2, 7, 16, 17, 31, 32, 33, 65, 70] {
            for k in [1, 2, 3, 16, 17, 70] {
                let ta = (m + n + k) % 2 == 0;
                let tb = (m * n + k) % 3 == 0;
                let acc = (m + k) % 2 == 1;
                check(isa, m, n, k, ta, tb, acc, 2, &mut rng);
            }
        }
    }
}

pub(super) fn all_layouts(isa: Isa) {
    require(isa);
    let mut rng = Rng(42);
    for &(m, n, k) in &[(37, 45, 53), (1, 70, 33), (4, 100, 64), (70, 1, 20), (100, 3, 40), (8, 8, 1)] {
        for ta in [false, true] {
            for tb in [false, true] {
                for acc in [false, true] {
                    for threads in [1, 2, 3] {
                        check(isa, m, n, k, ta, tb, acc, threads, &mut rng);
                    }
                }
            }
        }
    }
}

pub(super) fn odd_sizes_1_to_70(isa: Isa) {
    require(isa);
    let mut rng = Rng(7);
    for s in 1..=70 {
        check(isa, s, s, s, false, false, s % 2 == 0, 2, &mut rng);
        check(isa, s, 71 - s, (s * 7) % 70 + 1, s % 3 == 0, s % 5 == 0, s % 2 == 1, 2, &mut rng);
    }
}

pub(super) fn multi_block(isa: Isa) {
    require(isa);
    // Crosses KC, NC and (for m) several micro-panels and task splits.
    let mut rng = Rng(99);
    check(isa, 300, 600, 1100, false, false, false, 2, &mut rng);
    check(isa, 301, 257, 530, true, true, true, 2, &mut rng);
    check(isa, 5, 1000, 700, false, true, false, 2, &mut rng);
    check(isa, 3000, 40, 100, false, false, true, 2, &mut rng);
    // Packed A of all K blocks exceeds the A buffer bound: several M blocks.
    check(isa, 2900, 70, 3000, false, false, true, 2, &mut rng);
    check(isa, 2900, 70, 3000, true, false, false, 3, &mut rng);
}

pub(super) fn k_zero(isa: Isa) {
    require(isa);
    let a: Vec<f32> = vec![];
    let b: Vec<f32> = vec![];
    let mut c = vec![1.0f32; 12];
    gemm(isa, 3, 4, 0, MatRef { data: &a, rs: 0, cs: 1 }, MatRef { data: &b, rs: 4, cs: 1 }, &mut c, 4, true, 2);
    assert!(c.iter().all(|&x| x == 1.0));
    gemm(isa, 3, 4, 0, MatRef { data: &a, rs: 0, cs: 1 }, MatRef { data: &b, rs: 4, cs: 1 }, &mut c, 4, false, 2);
    assert!(c.iter().all(|&x| x == 0.0));
    // m = 0 / n = 0: nothing happens.
    gemm(isa, 0, 4, 3, MatRef { data: &a, rs: 3, cs: 1 }, MatRef { data: &b, rs: 4, cs: 1 }, &mut c, 4, false, 2);
}

/// C rows that start mid cache line (as in any `Vec` output; the kernel's C prefetch covers a
/// third line then): every offset from a 64-byte boundary, row-major and transposed B,
/// accumulate on and off, m = 1. Values against an f64 reference; everything around the C
/// region stays untouched.
pub(super) fn misaligned_c_rows(isa: Isa) {
    require(isa);
    let mut rng = Rng(5);
    let shapes: [(usize, usize, usize); 4] = [(30, 77, 40), (1, 100, 33), (45, 32, 600), (29, 1100, 20)];
    for &(m, n, k) in &shapes {
        for off in 0..16 {
            let tb = off % 2 == 1;
            let acc = off % 3 == 0;
            let ldc = if m == 1 { n } else { n.next_multiple_of(16) };
            let a = rng.vec(m * k);
            let (b_rs, b_cs) = if tb { (1, k) } else { (n, 1) };
            let b = rng.vec(k * n);
            let mut buf = rng.vec(m * ldc + 64);
            let orig = buf.clone();
            let base = (16 - (buf.as_ptr() as usize / 4) % 16) % 16 + off;
            let len = (m - 1) * ldc + n;
            gemm(
                isa,
                m,
                n,
                k,
                MatRef { data: &a, rs: k, cs: 1 },
                MatRef { data: &b, rs: b_rs, cs: b_cs },
                &mut buf[base..base + len],
                ldc,
                acc,
                2,
            );
            for (idx, (&got, &was)) in buf.iter().zip(&orig).enumerate() {
                let rel = idx.wrapping_sub(base);
                let (i, j) = (rel / ldc, rel % ldc);
                if idx < base || i >= m || j >= n {
                    assert_eq!(got, was, "m={m} n={n} k={k} off={off}: element {idx} outside C changed");
                    continue;
                }
                let (mut s, mut sa) = (if acc { was as f64 } else { 0.0 }, 0f64);
                for p in 0..k {
                    let x = a[i * k + p] as f64 * b[p * b_rs + j * b_cs] as f64;
                    s += x;
                    sa += x.abs();
                }
                let tol = 1e-5 * (sa + (was as f64).abs()).max(1.0);
                assert!((got as f64 - s).abs() <= tol, "m={m} n={n} k={k} off={off} tb={tb} acc={acc} ({i},{j})");
            }
        }
    }
}

/// 16-bit operands (bf16, f16), widened by the packers, against the f32 product of the
/// widened operands on the same family: bit-identical (the packed panels are the same), for
/// row-major, transposed and fully strided operands (no unit stride: the element-by-element
/// packers), partial tiles, several K and N blocks, accumulate on and off, 1-3 threads.
fn half_sources_as<E: Source>(isa: Isa, from: fn(f32) -> E) {
    require(isa);
    let mut rng = Rng(11);
    let shapes = [(1, 1, 1), (7, 9, 5), (13, 33, 70), (29, 17, 300), (64, 200, 520), (3, 70, 40), (200, 5, 64)];
    for (si, &(m, n, k)) in shapes.iter().enumerate() {
        // (A strides, B strides, lengths): row-major, transposed, every other element.
        let layouts = [
            ((k, 1), (n, 1), m * k, k * n),
            ((1, m), (1, k), m * k, k * n),
            ((2 * k, 2), (2, 2 * k), 2 * m * k, 2 * k * n),
        ];
        for (li, &((ars, acs), (brs, bcs), alen, blen)) in layouts.iter().enumerate() {
            let a16: Vec<E> = rng.vec(alen).into_iter().map(from).collect();
            let b16: Vec<E> = rng.vec(blen).into_iter().map(from).collect();
            let a32: Vec<f32> = a16.iter().map(|x| x.to_f32()).collect();
            let b32: Vec<f32> = b16.iter().map(|x| x.to_f32()).collect();
            let acc = (si + li) % 2 == 1;
            let threads = 1 + (si + li) % 3;
            let c0 = rng.vec(m * n);
            let (mut want, mut got) = (c0.clone(), c0.clone());
            let a = MatRef { data: &a32, rs: ars, cs: acs };
            let b = MatRef { data: &b32, rs: brs, cs: bcs };
            gemm(isa, m, n, k, a, b, &mut want, n, acc, threads);
            let a = MatRef { data: &a16, rs: ars, cs: acs };
            let b = MatRef { data: &b16, rs: brs, cs: bcs };
            assert!(gemm_with(isa, m, n, k, a, b, &mut got, n, acc, threads), "the 16-bit GEMM refused to run");
            let same = want.iter().zip(&got).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "m={m} n={n} k={k} layout {li} acc={acc} t={threads}: differs from the widened f32 product");
            // The same product with a 16-bit result, narrowed by the GEMM's tasks: the f32
            // product rounded as `HostData::from_f32` rounds.
            if !acc {
                narrowed_matches(isa, (m, n, k), a, b, &want, threads, half::bf16::from_f32);
                narrowed_matches(isa, (m, n, k), a, b, &want, threads, half::f16::from_f32);
            }
        }
    }
}

/// `gemm_narrow_with` into `O` equals `want` (the f32 product) narrowed element by element.
fn narrowed_matches<E: Source, O: Sink + PartialEq + std::fmt::Debug>(
    isa: Isa,
    (m, n, k): (usize, usize, usize),
    a: MatRef<E>,
    b: MatRef<E>,
    want: &[f32],
    threads: usize,
    narrow: fn(f32) -> O,
) {
    let mut out = vec![std::mem::MaybeUninit::<O>::uninit(); m * n];
    assert!(gemm_narrow_with(isa, m, n, k, a, b, &mut out, threads), "the narrowing GEMM refused to run");
    for (i, (o, &w)) in out.iter().zip(want).enumerate() {
        // SAFETY: gemm_narrow_with wrote every element.
        let got = unsafe { o.assume_init() };
        assert_eq!(got, narrow(w), "m={m} n={n} k={k} t={threads}: element {i} narrowed wrongly");
    }
}

pub(super) fn half_sources(isa: Isa) {
    half_sources_as(isa, half::bf16::from_f32);
    if isa == Isa::Avx512 || std::arch::is_x86_feature_detected!("f16c") {
        half_sources_as(isa, half::f16::from_f32);
    }
}

/// A last panel shorter than `MR` (a short kernel, where the family has one) gives its rows
/// bit for bit as a full panel does: `m` rows against the same rows with more below them
/// (42, a multiple of both families' `MR`), last panels of 1 to 7 rows, 1-3 threads, a K of
/// two blocks, every B layout the blocked driver takes for these M.
pub(super) fn short_panels_match_full_panels(isa: Isa) {
    require(isa);
    let mut rng = Rng(5);
    let (full, n, k) = (42, 70, 700);
    for m in (17..=21).chain(29..=35) {
        let a = rng.vec(full * k);
        let b = rng.vec(k * n);
        for (t, tb) in [(1, false), (2, true), (3, false)] {
            let bm = if tb { MatRef { data: &b, rs: 1, cs: k } } else { MatRef { data: &b, rs: n, cs: 1 } };
            let (mut short, mut whole) = (vec![0f32; m * n], vec![0f32; full * n]);
            gemm(isa, m, n, k, MatRef { data: &a[..m * k], rs: k, cs: 1 }, bm, &mut short, n, false, t);
            gemm(isa, full, n, k, MatRef { data: &a, rs: k, cs: 1 }, bm, &mut whole, n, false, t);
            let same = short.iter().zip(&whole).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "m = {m}, {t} threads, B transposed {tb}: rows differ from the full panels'");
        }
    }
}

/// One module of tests per family, each running every sweep above.
macro_rules! family_tests {
    ($module:ident, $isa:expr) => {
        mod $module {
            use super::Isa;

            #[test]
            fn small_all_sizes() {
                super::small_all_sizes($isa)
            }
            #[test]
            fn all_layouts() {
                super::all_layouts($isa)
            }
            #[test]
            fn odd_sizes_1_to_70() {
                super::odd_sizes_1_to_70($isa)
            }
            #[test]
            fn multi_block() {
                super::multi_block($isa)
            }
            #[test]
            fn k_zero() {
                super::k_zero($isa)
            }
            #[test]
            fn misaligned_c_rows() {
                super::misaligned_c_rows($isa)
            }
            #[test]
            fn short_panels_match_full_panels() {
                super::short_panels_match_full_panels($isa)
            }
            #[test]
            fn half_sources() {
                super::half_sources($isa)
            }
        }
    };
}

family_tests!(avx512, Isa::Avx512);
family_tests!(avx2, Isa::Avx2);
