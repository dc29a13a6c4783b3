//! Matmul family: batched matmul with transpose flags, shared rank-2 operands, broadcast
//! batch dims, GEMM edge blocks, half precision, gradients and errors.

use crate::check::{assert_close, check_dtype, grad_check, tensor, tol, values};
use crate::{reference as r, strategies as st};
use proptest::prelude::*;
use redco_core::{Backend, DType, Error, Shape, Tensor};

const COMBOS: [(bool, bool); 4] = [(false, false), (false, true), (true, false), (true, true)];

/// The stored dims of an operand whose logical matrix is `rows x cols`, transposed or not.
fn stored(batch: &[usize], rows: usize, cols: usize, trans: bool) -> Vec<usize> {
    let mut d = batch.to_vec();
    d.extend(if trans { [cols, rows] } else { [rows, cols] });
    d
}

/// Checks `matmul_ext` on stored shapes `ad`, `bd` against the f64 reference.
fn check_case<B: Backend>(b: &B, dt: DType, ad: &[usize], bd: &[usize], ta: bool, tb: bool, t: f64) {
    let x = values(ad.iter().product(), 11, -1.0, 1.0);
    let y = values(bd.iter().product(), 12, -1.0, 1.0);
    let (xa, yb) = (tensor(b, &x, ad.to_vec(), dt), tensor(b, &y, bd.to_vec(), dt));
    let out = xa.matmul_ext(&yb, ta, tb).unwrap();
    // the reference sees the values as stored (rounded to `dt`)
    let (x, y) = (xa.to_vec_f64().unwrap(), yb.to_vec_f64().unwrap());
    let (e, od) = r::matmul(&x, ad, &y, bd, ta, tb);
    let what = format!("matmul {ad:?} x {bd:?} (ta={ta}, tb={tb}, {dt:?})");
    assert_eq!(out.dims(), &od[..], "{what}: shape");
    assert_eq!(out.dtype(), dt, "{what}: dtype");
    assert_close(&out.to_vec_f64().unwrap(), &e, t, &what);
}

/// Batched matmul with all four transpose combinations, broadcast batch dims and rank-2
/// operands shared on either side, on random small shapes (odd sizes, size 1).
pub fn matmul_values<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let strategy =
        (st::broadcast_pair(2, 3), 1..=7usize, 1..=7usize, 1..=7usize, any::<bool>(), any::<bool>(), 0..3usize);
    st::run(16, strategy, |((ba, bb), m, k, n, ta, tb, shared)| {
        let ba: &[usize] = if shared == 1 { &[] } else { &ba };
        let bb: &[usize] = if shared == 2 { &[] } else { &bb };
        check_case(b, dt, &stored(ba, m, k, ta), &stored(bb, k, n, tb), ta, tb, tol(dt));
    });
    // the same shapes through every combination, so each combo meets each sharing pattern
    for (ta, tb) in COMBOS {
        for (ba, bb) in [
            (&[2, 3][..], &[2, 3][..]),
            (&[3][..], &[][..]),
            (&[][..], &[3][..]),
            (&[2, 1][..], &[4][..]),
            (&[][..], &[][..]),
        ] {
            check_case(b, dt, &stored(ba, 5, 3, ta), &stored(bb, 3, 4, tb), ta, tb, tol(dt));
        }
    }
}

/// Larger odd sizes that end in partial GEMM blocks (and a size-1 dim), in the check
/// dtype and in f32 (the fast GEMM path), with every transpose combination.
pub fn matmul_large_odd<B: Backend>(b: &B) {
    let mut dts = vec![check_dtype(b)];
    if !dts.contains(&DType::F32) {
        dts.push(DType::F32);
    }
    for dt in dts {
        for (m, k, n) in [(67, 129, 33), (1, 300, 257), (130, 1, 70)] {
            for (ta, tb) in COMBOS {
                check_case(b, dt, &stored(&[], m, k, ta), &stored(&[], k, n, tb), ta, tb, tol(dt));
            }
        }
        // batched with a shared weight (folded into one GEMM), and batched on both sides
        // large enough to take the multi-threaded per-matrix path
        for (ta, tb) in COMBOS {
            check_case(b, dt, &stored(&[3], 17, 65, ta), &stored(&[], 65, 31, tb), ta, tb, tol(dt));
        }
        check_case(b, dt, &stored(&[2], 67, 129, false), &stored(&[2], 129, 257, true), false, true, tol(dt));
    }
}

/// f16 and bf16 matmul against f64 on the same (rounded) inputs.
pub fn matmul_half<B: Backend>(b: &B) {
    for dt in [DType::F16, DType::BF16] {
        if !b.supports(dt) {
            continue;
        }
        for (ta, tb) in COMBOS {
            check_case(b, dt, &stored(&[2], 9, 33, ta), &stored(&[2], 33, 17, tb), ta, tb, tol(dt));
            check_case(b, dt, &stored(&[3], 13, 70, ta), &stored(&[], 70, 5, tb), ta, tb, tol(dt));
        }
    }
}

/// Gradients for every transpose combination, with batched, shared and broadcast
/// operands; and the shared-weight case `x [2,3,4] @ W^T`.
pub fn matmul_grads<B: Backend>(b: &B) {
    let (m, k, n) = (3, 4, 2);
    for (ta, tb) in COMBOS {
        for (ba, bb) in [(&[2][..], &[2][..]), (&[][..], &[2][..]), (&[2][..], &[][..]), (&[2, 1][..], &[3][..])] {
            let ad = stored(ba, m, k, ta);
            let bd = stored(bb, k, n, tb);
            let x = values(ad.iter().product(), 21, -1.0, 1.0);
            let y = values(bd.iter().product(), 22, -1.0, 1.0);
            grad_check(
                b,
                &[(x, Shape::new(ad.clone())), (y, Shape::new(bd.clone()))],
                |t| t[0].matmul_ext(&t[1], ta, tb),
                1e-6,
                &format!("matmul grad {ad:?} x {bd:?} (ta={ta}, tb={tb})"),
            );
        }
    }
    grad_check(
        b,
        &[(values(24, 23, -1.0, 1.0), Shape::new([2, 3, 4])), (values(20, 24, -1.0, 1.0), Shape::new([5, 4]))],
        |t| t[0].matmul_t(&t[1]),
        1e-6,
        "shared weight x [2,3,4] @ W^T",
    );
    grad_check(
        b,
        &[(values(24, 25, -1.0, 1.0), Shape::new([2, 3, 4])), (values(20, 26, -1.0, 1.0), Shape::new([4, 5]))],
        |t| t[0].matmul(&t[1]),
        1e-6,
        "shared weight x [2,3,4] @ W",
    );
}

/// A wrong inner dimension is `Error::MatmulInnerDim` naming both sizes; rank < 2,
/// incompatible batch dims, mixed dtypes and integer operands are errors.
pub fn matmul_errors<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let a = tensor(b, &values(6, 1, 0.0, 1.0), [2, 3], dt);
    let c = tensor(b, &values(8, 1, 0.0, 1.0), [4, 2], dt);
    match a.matmul(&c) {
        Err(Error::MatmulInnerDim { lhs, rhs, lhs_k, rhs_k }) => {
            assert_eq!((lhs, rhs, lhs_k, rhs_k), (Shape::new([2, 3]), Shape::new([4, 2]), 3, 4));
        }
        other => panic!("expected an inner-dim error, got {other:?}"),
    }
    // with transposes the inner dims are the transposed ones: [2,3]^T @ [4,2]^T has k 2 vs 2
    assert_eq!(a.matmul_ext(&c, true, true).unwrap().dims(), &[3, 4]);
    match a.matmul_ext(&c, true, false) {
        Err(Error::MatmulInnerDim { lhs_k, rhs_k, .. }) => assert_eq!((lhs_k, rhs_k), (2, 4)),
        other => panic!("expected an inner-dim error, got {other:?}"),
    }
    let v = tensor(b, &values(3, 1, 0.0, 1.0), [3], dt);
    assert!(matches!(a.matmul(&v), Err(Error::Invalid { op: "matmul", .. })), "rank-1 rhs");
    assert!(matches!(v.matmul(&a), Err(Error::Invalid { op: "matmul", .. })), "rank-1 lhs");
    let s = Tensor::scalar(b, 1.0, dt).unwrap();
    assert!(a.matmul(&s).is_err(), "rank-0 rhs");
    let x = tensor(b, &values(2 * 6, 1, 0.0, 1.0), [2, 2, 3], dt);
    let y = tensor(b, &values(3 * 12, 1, 0.0, 1.0), [3, 3, 4], dt);
    assert!(matches!(x.matmul(&y), Err(Error::ShapeMismatch { .. })), "batch 2 vs 3");
    let h = tensor(b, &values(12, 1, 0.0, 1.0), [3, 4], DType::F32);
    let g = tensor(b, &values(12, 1, 0.0, 1.0), [3, 4], DType::F16);
    assert!(matches!(a.cast(DType::F32).unwrap().matmul(&g), Err(Error::DTypeMismatch { .. })));
    let i = h.cast(DType::I64).unwrap();
    assert!(matches!(i.matmul(&i.transpose(0, 1).unwrap()), Err(Error::UnsupportedDType { .. })));
    assert!(a.matmul(&c).unwrap_err().to_string().contains("k=3"), "the message names the inner dims");
}
