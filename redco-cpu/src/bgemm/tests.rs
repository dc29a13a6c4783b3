//! The bf16 GEMM's engines against an f64 reference over sizes, layouts, strides and
//! threads: the same cases for each engine, in modules `amx` and `dot`.
//!
//! These call an engine itself, so they need its instructions (AMX-BF16, or AVX512-BF16):
//! `cargo xtask test` leaves the tests under the `amx` and `dot` modules out where they
//! cannot run (named as skipped); run there anyway, each fails saying why.
//! `cpu::matmul::tests` covers the bf16 product the backend uses on every machine.

/// The cases, for one engine.
macro_rules! engine_cases {
    ($engine:expr) => {
        use super::super::{bgemm_on, HalfRef};
        use crate::sgemm::tests::Rng;
        use half::bf16;
        use std::mem::MaybeUninit;

        fn require() {
            assert!(
                $engine.runs(),
                "this test checks the bf16 GEMM engine {:?}, which this CPU or process cannot run \
             (no AMX-BF16 or AVX512-BF16, the OS refused the tile state, or \
             REDCO_ASSUME_NO_AVX512 is set); `cargo xtask test` skips these tests there",
                $engine
            );
        }

        /// bf16 bits of `n` random values in [-1, 1).
        fn bits(rng: &mut Rng, n: usize) -> Vec<u16> {
            (0..n).map(|_| bf16::from_f32(rng.next()).to_bits()).collect()
        }

        fn val(b: u16) -> f64 {
            f64::from(bf16::from_bits(b).to_f32())
        }

        /// One case: `ta`/`tb` store the operand transposed, `pad` pads its leading dimension,
        /// C has 3 extra columns per row that must stay untouched.
        #[allow(clippy::too_many_arguments)]
        fn case(m: usize, n: usize, k: usize, ta: bool, tb: bool, pad: usize, threads: usize, rng: &mut Rng) {
            let (a_rs, a_cs, a_len) = if ta { (1, m + pad, (m + pad) * k) } else { (k + pad, 1, (k + pad) * m) };
            let (b_rs, b_cs, b_len) = if tb { (1, k + pad, (k + pad) * n) } else { (n + pad, 1, (n + pad) * k) };
            let a = bits(rng, a_len);
            let b = bits(rng, b_len);
            let ldc = n + 3;
            let mut c = vec![MaybeUninit::new(f32::NAN); ldc * m];
            let ar = HalfRef { data: &a, rs: a_rs, cs: a_cs };
            let br = HalfRef { data: &b, rs: b_rs, cs: b_cs };
            assert!(bgemm_on($engine, m, n, k, ar, br, &mut c, ldc, threads));
            for i in 0..m {
                for j in 0..ldc {
                    // SAFETY: every element was initialised (NaN) above.
                    let got = unsafe { c[i * ldc + j].assume_init() };
                    if j >= n {
                        assert!(got.is_nan(), "({i}, {j}) outside C was written");
                        continue;
                    }
                    let (mut want, mut mag) = (0.0f64, 0.0f64);
                    for p in 0..k {
                        let t = val(a[i * a_rs + p * a_cs]) * val(b[p * b_rs + j * b_cs]);
                        want += t;
                        mag += t.abs();
                    }
                    let err = (f64::from(got) - want).abs();
                    assert!(
                        err <= 1e-5 * mag + 1e-30,
                        "{m}x{n}x{k} ta={ta} tb={tb} pad={pad} threads={threads}: C({i},{j}) = {got}, want {want}"
                    );
                }
            }
        }

        #[test]
        fn every_edge_size_and_layout() {
            require();
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
            for &(m, n, k) in &[
                (1, 1, 1),
                (5, 7, 3),
                (16, 16, 32),
                (31, 33, 31),
                (32, 32, 32),
                (33, 31, 33),
                (47, 65, 64),
                (64, 64, 100),
            ] {
                for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
                    for pad in [0, 5] {
                        case(m, n, k, ta, tb, pad, 1, &mut rng);
                    }
                }
            }
        }

        #[test]
        fn every_small_size_row_major_and_weight_layout() {
            require();
            let mut rng = Rng(7);
            for m in (1..70).step_by(3) {
                for n in (1..70).step_by(5) {
                    for k in [1, 2, 17, 32, 63, 64, 65] {
                        case(m, n, k, false, true, 0, 1, &mut rng);
                    }
                }
            }
        }

        #[test]
        fn large_blocked_and_threaded() {
            require();
            let mut rng = Rng(11);
            // many row blocks and column blocks, k over several steps; with 1, 2 and 3 threads
            for threads in [1, 2, 3] {
                case(300, 200, 96, false, true, 0, threads, &mut rng);
                case(70, 520, 130, true, false, 1, threads, &mut rng);
            }
            // more B than B_BYTES: several column blocks
            case(40, 1100, 2100, false, true, 0, 2, &mut rng);
        }

        #[test]
        fn k_zero_writes_zeros() {
            require();
            let mut c = vec![MaybeUninit::new(f32::NAN); 6];
            let e: [u16; 0] = [];
            let z = HalfRef { data: &e, rs: 0, cs: 1 };
            assert!(bgemm_on($engine, 2, 3, 0, z, z, &mut c, 3, 2));
            // SAFETY: initialised above.
            assert!(c.iter().all(|v| unsafe { v.assume_init() } == 0.0));
        }
    };
}

mod amx {
    engine_cases!(super::super::Engine::Amx);
}

mod dot {
    engine_cases!(super::super::Engine::Dot);

    /// The calibration that decides whether the engine is used measures a finite rate
    /// within what any core does (a `VDPBF16PS` is 2 FMAs' work: between an eighth of an
    /// FMA's rate and 4x it), so a broken timer or an optimised-away loop cannot decide.
    #[test]
    fn the_calibration_measures_a_plausible_rate() {
        require();
        let r = super::super::dot::rate_against_fma();
        println!("VDPBF16PS multiply-adds per second over f32 FMA: {r:.2}");
        assert!(r.is_finite() && (0.125..=4.0).contains(&r), "measured {r}");
    }
}
