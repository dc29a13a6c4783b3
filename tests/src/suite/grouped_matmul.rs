//! Grouped matmul (a mixture of experts' expert layers): each group's rows times its own
//! matrix, against an f64 loop over the groups, with empty groups, every row in one group,
//! both weight layouts, half precision, gradients and errors.

use crate::check::{assert_close, check_dtype, grad_check, tensor, tol, values};
use redco_core::{Backend, DType, Error, Shape};

/// `x [T, k]` grouped by `counts` times `w` (`[E, n, k]` when `trans_w`, else `[E, k, n]`),
/// in f64: row by row, each with its group's matrix.
fn reference(x: &[f64], w: &[f64], counts: &[usize], k: usize, n: usize, trans_w: bool) -> Vec<f64> {
    let mut out = Vec::new();
    let mut row = 0;
    for (e, &c) in counts.iter().enumerate() {
        let we = &w[e * k * n..(e + 1) * k * n];
        for _ in 0..c {
            let xr = &x[row * k..(row + 1) * k];
            for j in 0..n {
                let wj = |i: usize| if trans_w { we[j * k + i] } else { we[i * n + j] };
                out.push((0..k).map(|i| xr[i] * wj(i)).sum());
            }
            row += 1;
        }
    }
    out
}

/// The group layouts every backend must get right: mixed with empty groups, every row on
/// one expert (first, middle, last), one row each, a single group.
const LAYOUTS: [&[usize]; 6] = [&[3, 0, 2, 1], &[0, 0, 6, 0], &[6, 0, 0, 0], &[0, 0, 0, 5], &[1, 1, 1, 1], &[7]];

fn check_case<B: Backend>(b: &B, dt: DType, counts: &[usize], k: usize, n: usize, trans_w: bool, seed: u64) {
    let (t, e) = (counts.iter().sum::<usize>(), counts.len());
    let wd = if trans_w { [e, n, k] } else { [e, k, n] };
    let xt = tensor(b, &values(t * k, seed, -1.0, 1.0), [t, k], dt);
    let wt = tensor(b, &values(e * k * n, seed + 1, -1.0, 1.0), wd, dt);
    let what = format!("grouped_matmul counts {counts:?} k={k} n={n} trans_w={trans_w} {dt:?}");
    let out = xt.grouped_matmul(&wt, counts, trans_w).unwrap();
    assert_eq!(out.dims(), &[t, n], "{what}: shape");
    assert_eq!(out.dtype(), dt, "{what}: dtype");
    // the reference sees the values as stored (rounded to `dt`)
    let (x, w) = (xt.to_vec_f64().unwrap(), wt.to_vec_f64().unwrap());
    assert_close(&out.to_vec_f64().unwrap(), &reference(&x, &w, counts, k, n, trans_w), tol(dt), &what);
}

/// Values in the check dtype for every layout and both weight layouts, small odd sizes
/// and sizes that end in partial GEMM blocks.
pub fn grouped_matmul_values<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    for (i, counts) in LAYOUTS.iter().enumerate() {
        for trans_w in [true, false] {
            check_case(b, dt, counts, 5, 3, trans_w, 10 + i as u64);
        }
    }
    for trans_w in [true, false] {
        check_case(b, dt, &[33, 0, 70, 1], 67, 29, trans_w, 40);
        check_case(b, DType::F32, &[33, 0, 70, 1], 67, 29, trans_w, 41);
    }
}

/// f16 and bf16 against f64 on the same (rounded) inputs.
pub fn grouped_matmul_half<B: Backend>(b: &B) {
    for dt in [DType::F16, DType::BF16] {
        if !b.supports(dt) {
            continue;
        }
        for trans_w in [true, false] {
            check_case(b, dt, &[3, 0, 9, 1], 33, 17, trans_w, 50);
        }
    }
}

/// Gradients of both operands against finite differences, with an empty group (its
/// matrix's gradient is zero) and both weight layouts.
pub fn grouped_matmul_grads<B: Backend>(b: &B) {
    let (k, n) = (4, 3);
    for trans_w in [true, false] {
        for counts in [&[2usize, 0, 3][..], &[0, 5, 0][..]] {
            let (t, e) = (counts.iter().sum::<usize>(), counts.len());
            let wd = if trans_w { [e, n, k] } else { [e, k, n] };
            grad_check(
                b,
                &[
                    (values(t * k, 60, -1.0, 1.0), Shape::new([t, k])),
                    (values(e * k * n, 61, -1.0, 1.0), Shape::new(wd)),
                ],
                |v| v[0].grouped_matmul(&v[1], counts, trans_w),
                1e-6,
                &format!("grouped_matmul grad counts {counts:?} trans_w={trans_w}"),
            );
        }
    }
}

/// Counts that do not add up to the rows, a count per expert missing, a wrong inner
/// dimension, wrong ranks and integer operands are errors naming what is wrong.
pub fn grouped_matmul_errors<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let x = tensor(b, &values(12, 1, 0.0, 1.0), [4, 3], dt);
    let w = tensor(b, &values(2 * 5 * 3, 2, 0.0, 1.0), [2, 5, 3], dt);
    assert_eq!(x.grouped_matmul(&w, &[1, 3], true).unwrap().dims(), &[4, 5]);
    let e = x.grouped_matmul(&w, &[1, 2], true).unwrap_err();
    assert!(e.to_string().contains("add up to 3") && e.to_string().contains("4 rows"), "{e}");
    let e = x.grouped_matmul(&w, &[4], true).unwrap_err();
    assert!(e.to_string().contains("1 group counts for 2 experts"), "{e}");
    match x.grouped_matmul(&w, &[1, 3], false) {
        Err(Error::MatmulInnerDim { lhs_k, rhs_k, .. }) => assert_eq!((lhs_k, rhs_k), (3, 5)),
        other => panic!("expected an inner-dim error, got {other:?}"),
    }
    let flat = tensor(b, &values(15, 3, 0.0, 1.0), [5, 3], dt);
    assert!(matches!(x.grouped_matmul(&flat, &[4], true), Err(Error::Invalid { op: "grouped_matmul", .. })));
    let v = tensor(b, &values(3, 3, 0.0, 1.0), [3], dt);
    assert!(matches!(v.grouped_matmul(&w, &[3, 0], true), Err(Error::Invalid { op: "grouped_matmul", .. })));
    let i = x.cast(DType::I64).unwrap();
    assert!(i.grouped_matmul(&w.cast(DType::I64).unwrap(), &[1, 3], true).is_err(), "integer operands");
}
