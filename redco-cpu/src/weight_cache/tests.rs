//! The packed-weight path: [`sgemm::gemm_prepacked`] against the per-call packing GEMM (bit
//! for bit) and an f64 reference, and the CPU backend with the constant-weights hint against
//! the same backend without it: equal products, a weight packed once, at its first product,
//! and a new storage at a freed one's place never read through the old packing.

use crate::sgemm::{self, tests::Rng, MatRef, PackedB};
use crate::Cpu;
use redco_core::backend::MatmulSpec;
use redco_core::{Backend, DType, HostData, Shape, Tensor};

/// `C = A B^T` with B stored `[n, k]`, through the packing GEMM and through `packed`.
fn both(m: usize, n: usize, k: usize, threads: usize, rng: &mut Rng) -> (Vec<f32>, Vec<f32>, Vec<f64>) {
    let (a, w) = (rng.vec(m * k), rng.vec(n * k));
    let b = MatRef { data: &w, rs: 1, cs: k };
    let mut plain = vec![std::mem::MaybeUninit::new(0f32); m * n];
    assert!(sgemm::gemm_uninit(m, n, k, MatRef { data: &a, rs: k, cs: 1 }, b, &mut plain, n, threads));
    let packed = PackedB::new(k, n, b).expect("a generated GEMM runs on every x86-64 CPU these tests run on");
    let mut pre = vec![std::mem::MaybeUninit::new(f32::NAN); m * n];
    assert!(sgemm::gemm_prepacked(m, MatRef { data: &a, rs: k, cs: 1 }, &packed, &mut pre, n, threads));
    // SAFETY: both GEMMs wrote every element (and the buffers started initialised anyway)
    let read = |v: Vec<std::mem::MaybeUninit<f32>>| v.into_iter().map(|x| unsafe { x.assume_init() }).collect();
    let reference =
        (0..m * n).map(|ij| (0..k).map(|p| a[(ij / n) * k + p] as f64 * w[(ij % n) * k + p] as f64).sum()).collect();
    (read(plain), read(pre), reference)
}

#[test]
fn prepacked_products_equal_the_packing_gemm_bit_for_bit() {
    let mut rng = Rng(0x5eed_1234);
    // rows past the unpacked small-m path, widths from one panel to several blocks of
    // panels with a ragged edge, depths of one, two and three K blocks
    for &(m, n, k) in &[(17, 32, 64), (32, 768, 768), (45, 100, 300), (300, 2048, 512), (33, 96, 1100), (64, 513, 1537)]
    {
        for threads in [1, 2, 3] {
            let (plain, pre, want) = both(m, n, k, threads, &mut rng);
            assert_eq!(plain, pre, "{m}x{n}x{k}, {threads} threads: the packed weight changed the product");
            for (i, (&g, &w)) in pre.iter().zip(&want).enumerate() {
                assert!((g as f64 - w).abs() <= 1e-4 * (k as f64).sqrt(), "{m}x{n}x{k} [{i}]: {g} vs {w}");
            }
        }
    }
}

#[test]
fn prepacked_products_of_any_shape_match_the_reference() {
    let mut rng = Rng(77);
    // a single row, narrow widths the per-call GEMM would transpose, a depth of one
    for &(m, n, k) in &[(1, 40, 50), (100, 5, 64), (70, 1, 3), (20, 33, 1)] {
        let (_, pre, want) = both(m, n, k, 2, &mut rng);
        for (i, (&g, &w)) in pre.iter().zip(&want).enumerate() {
            assert!((g as f64 - w).abs() <= 1e-4 * (k as f64).sqrt(), "{m}x{n}x{k} [{i}]: {g} vs {w}");
        }
    }
}

/// `x W^T`: `x` is `[rows, k]`, `w` is `[n, k]`.
fn linear(x: &Tensor<Cpu>, w: &Tensor<Cpu>) -> Vec<f32> {
    x.matmul_t(w).unwrap().to_vec_f32().unwrap()
}

#[test]
fn the_constant_weights_hint_packs_a_weight_once_and_changes_no_product() {
    let (hinted, plain) = (Cpu::new(2), Cpu::new(2));
    hinted.hint_constant_weights();
    let mut rng = Rng(9);
    let (rows, n, k) = (40, 96, 200);
    let xs: Vec<Vec<f32>> = (0..3).map(|_| rng.vec(rows * k)).collect();
    let w = rng.vec(n * k);
    let on = |b: &Cpu, v: &[f32], s: &[usize]| Tensor::from_vec(b, v.to_vec(), Shape::from(s)).unwrap();
    let (wh, wp) = (on(&hinted, &w, &[n, k]), on(&plain, &w, &[n, k]));
    for (i, x) in xs.iter().enumerate() {
        let got = linear(&on(&hinted, x, &[rows, k]), &wh);
        assert_eq!(got, linear(&on(&plain, x, &[rows, k]), &wp), "product {i}");
        // the first product packs the weight, the later ones read that packing
        assert_eq!(hinted.packed_weights(), 1, "after product {i}");
    }
    // a few rows take the unpacked path and pack nothing
    let few = on(&hinted, &rng.vec(4 * k), &[4, k]);
    let small = on(&hinted, &rng.vec(n * k), &[n, k]);
    for _ in 0..3 {
        linear(&few, &small);
    }
    assert_eq!(hinted.packed_weights(), 1);
    assert_eq!(plain.packed_weights(), 0, "without the hint nothing is packed");
}

#[test]
fn a_new_weight_is_never_read_through_a_freed_weights_packing() {
    let b = Cpu::new(1);
    b.hint_constant_weights();
    let plain = Cpu::new(1);
    let mut rng = Rng(3);
    let (rows, n, k) = (24, 64, 48);
    let x = rng.vec(rows * k);
    let on = |b: &Cpu, v: &[f32], s: &[usize]| Tensor::from_vec(b, v.to_vec(), Shape::from(s)).unwrap();
    for round in 0..20 {
        // each round's weight is made after the last one is dropped (the allocator may
        // well hand out the same buffer): its products must be its own
        let w = rng.vec(n * k);
        let wt = on(&b, &w, &[n, k]);
        let want = linear(&on(&plain, &x, &[rows, k]), &on(&plain, &w, &[n, k]));
        for _ in 0..3 {
            assert_eq!(linear(&on(&b, &x, &[rows, k]), &wt), want, "round {round}");
        }
    }
    assert_eq!(b.packed_weights(), 20);
    // f64 and batched right operands are not packed, and still right
    let spec =
        MatmulSpec { batch: 1, m: rows, n, k, trans_a: false, trans_b: true, a_batched: false, b_batched: false };
    let (x64, w64) = (HostData::F64(vec![0.5; rows * k]), HostData::F64(vec![2.0; n * k]));
    let c = b.matmul(&b.upload(&x64).unwrap(), &b.upload(&w64).unwrap(), &spec).unwrap();
    assert_eq!(b.download(&c).unwrap(), HostData::F64(vec![k as f64; rows * n]));
    assert_eq!(b.storage_dtype(&c), DType::F64);
    assert_eq!(b.packed_weights(), 20);
}

/// bf16 weights under the hint (where a bf16 GEMM engine runs: AMX or AVX512-BF16): every
/// product bit for bit the unhinted backend's, through rows that take the bf16 GEMM, column
/// counts with a ragged last panel and depths over one k block of the kernel; a weight
/// packed once, at its first product. Where no engine runs, nothing is packed and the
/// products still agree.
#[test]
fn bf16_weights_are_packed_once_and_give_the_unhinted_products() {
    let (hinted, plain) = (Cpu::new(2), Cpu::new(2));
    hinted.hint_constant_weights();
    let engine = crate::bgemm::engine().is_some();
    let mut rng = Rng(31);
    for (i, &(rows, n, k)) in [(9, 32, 64), (32, 768, 768), (45, 100, 300), (70, 2100, 2600)].iter().enumerate() {
        let weights = i as u64 + 1;
        let w = rng.vec(n * k);
        let on = |b: &Cpu, v: &[f32], s: &[usize]| {
            Tensor::from_vec(b, v.to_vec(), Shape::from(s)).unwrap().cast(DType::BF16).unwrap()
        };
        let (wh, wp) = (on(&hinted, &w, &[n, k]), on(&plain, &w, &[n, k]));
        for i in 0..2 {
            let x = rng.vec(rows * k);
            let got = on(&hinted, &x, &[rows, k]).matmul_t(&wh).unwrap();
            let want = on(&plain, &x, &[rows, k]).matmul_t(&wp).unwrap();
            assert_eq!(got.dtype(), DType::BF16);
            assert_eq!(got.to_vec_f32().unwrap(), want.to_vec_f32().unwrap(), "{rows}x{n}x{k}, product {i}");
            assert_eq!(hinted.packed_weights(), if engine { weights } else { 0 }, "{rows}x{n}x{k}, product {i}");
        }
    }
}
