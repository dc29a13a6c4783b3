//! Softmax family: softmax and log-softmax along any dim, stable for large magnitudes.

use crate::check::{assert_close, check_dtype, grad_check, tensor, tol, values};
use crate::{reference as r, strategies as st};
use proptest::prelude::*;
use redco_core::{Backend, DType, Error, Result, Shape, Tensor};

type SoftmaxCase<B> = (&'static str, fn(&Tensor<B>, isize) -> Result<Tensor<B>>, fn(&[f64]) -> Vec<f64>);

fn cases<B: Backend>() -> Vec<SoftmaxCase<B>> {
    vec![("softmax", |t, d| t.softmax(d), r::softmax), ("log_softmax", |t, d| t.log_softmax(d), r::log_softmax)]
}

/// Applies the row function `f` to every fibre of `x` along dim `d`.
fn along(x: &[f64], dims: &[usize], d: usize, f: fn(&[f64]) -> Vec<f64>) -> Vec<f64> {
    let (outer, size, inner) = r::split(dims, d);
    let mut out = vec![0.0; x.len()];
    for o in 0..outer {
        for i in 0..inner {
            let at = |s: usize| (o * size + s) * inner + i;
            let fib: Vec<f64> = (0..size).map(|s| x[at(s)]).collect();
            for (s, v) in f(&fib).into_iter().enumerate() {
                out[at(s)] = v;
            }
        }
    }
    out
}

/// Both ops along the last and non-last dims (negative dims too) against f64.
pub fn softmax_values<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let case = || {
        st::shape(4, 7).prop_flat_map(|dims| {
            let r = dims.len();
            (Just(dims), 0..r, any::<bool>())
        })
    };
    for (name, op, f) in cases::<B>() {
        st::run(16, case(), |(dims, d, negative)| {
            let x = values(dims.iter().product(), 4, -5.0, 5.0);
            let dim = if negative { d as isize - dims.len() as isize } else { d as isize };
            let y = op(&tensor(b, &x, dims.clone(), dt), dim).unwrap();
            assert_eq!(y.dims(), &dims[..]);
            assert_close(
                &y.to_vec_f64().unwrap(),
                &along(&x, &dims, d, f),
                tol(dt),
                &format!("{name} of {dims:?} along {dim}"),
            );
        });
    }
}

/// Inputs of magnitude 1000 (and rows mixing +1000 and -1000) stay finite and exact, in
/// the check dtype and in f32 (where a naive exp overflows).
pub fn softmax_large_magnitude<B: Backend>(b: &B) {
    let x = vec![1000.0, 999.0, -1000.0, 998.0, -1000.0, -1001.0, -999.0, -1000.5, 1000.0, 1000.0, 1000.0, 1000.0];
    let mut dts = vec![check_dtype(b), DType::F32];
    dts.dedup();
    for dt in dts {
        for (name, op, f) in cases::<B>() {
            for d in [0usize, 1] {
                let y = op(&tensor(b, &x, [3, 4], dt), d as isize).unwrap().to_vec_f64().unwrap();
                assert!(y.iter().all(|v| v.is_finite()), "{name} along {d} ({dt:?}): {y:?}");
                assert_close(&y, &along(&x, &[3, 4], d, f), tol(dt), &format!("{name} large along {d} ({dt:?})"));
            }
        }
    }
    // gradients stay finite too
    let t = tensor(b, &x, [3, 4], DType::F32).into_var();
    let g = t.log_softmax(-1).unwrap().narrow(1, 0, 1).unwrap().sum_all().unwrap().backward().unwrap();
    assert!(g.get(&t).unwrap().to_vec_f64().unwrap().iter().all(|v| v.is_finite()));
}

/// f16 and bf16 keep their dtype and agree with f64 on the stored values.
pub fn softmax_half<B: Backend>(b: &B) {
    for dt in [DType::F16, DType::BF16] {
        if !b.supports(dt) {
            continue;
        }
        let t = tensor(b, &values(4 * 33, 5, -8.0, 8.0), [4, 33], dt);
        let x = t.to_vec_f64().unwrap();
        for (name, op, f) in cases::<B>() {
            let y = op(&t, -1).unwrap();
            assert_eq!(y.dtype(), dt);
            assert_close(&y.to_vec_f64().unwrap(), &along(&x, &[4, 33], 1, f), tol(dt), &format!("{name} {dt:?}"));
        }
    }
}

/// Gradients along the last and non-last dims.
pub fn softmax_grads<B: Backend>(b: &B) {
    let x = values(30, 6, -3.0, 3.0);
    for (name, op, _) in cases::<B>() {
        for d in [-1isize, 0, 1] {
            grad_check(
                b,
                &[(x.clone(), Shape::new([2, 5, 3]))],
                |t| op(&t[0], d),
                1e-6,
                &format!("{name} grad along {d}"),
            );
        }
        grad_check(
            b,
            &[(values(7, 7, -2.0, 2.0), Shape::new([7]))],
            |t| op(&t[0], 0),
            1e-6,
            &format!("{name} grad rank 1"),
        );
    }
}

/// Rows shorter and longer than a backend's workgroup (1 to 256 lanes per row, several rows
/// per workgroup, rows beyond 1024 elements), in the check dtype and in bf16.
pub fn softmax_long_rows<B: Backend>(b: &B) {
    let mut dts = vec![check_dtype(b)];
    if b.supports(DType::BF16) {
        dts.push(DType::BF16);
    }
    for dt in dts {
        for (i, (n, d)) in [(300, 3), (7, 100), (9, 300), (3, 1000), (2, 1500), (2, 5000)].into_iter().enumerate() {
            let t = tensor(b, &values(n * d, 20 + i as u64, -6.0, 6.0), [n, d], dt);
            let x = t.to_vec_f64().unwrap();
            for (name, op, f) in cases::<B>() {
                let y = op(&t, -1).unwrap();
                assert_close(
                    &y.to_vec_f64().unwrap(),
                    &r::rows(&x, d, f),
                    tol(dt),
                    &format!("{name} [{n}, {d}] {dt:?}"),
                );
            }
        }
    }
}

/// Out-of-range dims and integer inputs are errors.
pub fn softmax_errors<B: Backend>(b: &B) {
    let x = tensor(b, &values(6, 1, 0.0, 1.0), [2, 3], check_dtype(b));
    let i = Tensor::from_vec(b, vec![1i64, 2], [2]).unwrap();
    for (name, op, _) in cases::<B>() {
        assert!(matches!(op(&x, 2), Err(Error::DimOutOfRange { .. })), "{name}");
        assert!(matches!(op(&x, -3), Err(Error::DimOutOfRange { .. })), "{name}");
        assert!(matches!(op(&i, 0), Err(Error::UnsupportedDType { .. })), "{name}");
    }
}
