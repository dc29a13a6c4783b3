//! Reduce family: sum, mean, max, min and argmax along a dimension (keepdim, negative
//! dims), the whole-tensor reductions, and `sum_to` (the adjoint of broadcasting).

use crate::check::{assert_close, check_dtype, grad_check, tensor, tol, values};
use crate::{reference as r, strategies as st};
use proptest::prelude::*;
use redco_core::{Backend, DType, Error, Result, Shape, Tensor};

type ReduceCase<B> = (&'static str, fn(&Tensor<B>, isize, bool) -> Result<Tensor<B>>, fn(&[f64]) -> f64);

fn reduce_cases<B: Backend>() -> Vec<ReduceCase<B>> {
    vec![
        ("sum", |t, d, k| t.sum(d, k), |f| f.iter().sum()),
        ("mean", |t, d, k| t.mean(d, k), |f| f.iter().sum::<f64>() / f.len() as f64),
        ("max", |t, d, k| t.max(d, k), |f| f.iter().cloned().fold(f64::NEG_INFINITY, f64::max)),
        ("min", |t, d, k| t.min(d, k), |f| f.iter().cloned().fold(f64::INFINITY, f64::min)),
    ]
}

/// A shape, a dim of it (as a non-negative and as a negative index) and keepdim.
fn dim_case() -> impl Strategy<Value = (Vec<usize>, usize, bool, bool)> {
    st::shape(4, 6).prop_flat_map(|dims| {
        let r = dims.len();
        (Just(dims), 0..r, any::<bool>(), any::<bool>())
    })
}

/// The output dims of a reduction along `d`.
fn reduced_dims(dims: &[usize], d: usize, keepdim: bool) -> Vec<usize> {
    let mut o = dims.to_vec();
    if keepdim {
        o[d] = 1;
    } else {
        o.remove(d);
    }
    o
}

/// sum/mean/max/min along any dim (negative too), with and without keepdim, against f64.
pub fn reduce_values<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    for (name, op, f) in reduce_cases::<B>() {
        st::run(16, dim_case(), |(dims, d, keepdim, negative)| {
            let x = values(dims.iter().product(), 5, -3.0, 3.0);
            let dim = if negative { d as isize - dims.len() as isize } else { d as isize };
            let y = op(&tensor(b, &x, dims.clone(), dt), dim, keepdim).unwrap();
            let what = format!("{name} of {dims:?} along {dim} (keepdim {keepdim})");
            assert_eq!(y.dims(), &reduced_dims(&dims, d, keepdim)[..], "{what}: shape");
            assert_close(&y.to_vec_f64().unwrap(), &r::reduce(&x, &dims, d, f), tol(dt), &what);
        });
    }
}

/// Reductions of f16/bf16 tensors keep their dtype and agree with f64 on the stored values.
pub fn reduce_half<B: Backend>(b: &B) {
    for dt in [DType::F16, DType::BF16] {
        if !b.supports(dt) {
            continue;
        }
        let x = tensor(b, &values(5 * 40, 6, -2.0, 2.0), [5, 40], dt);
        let xv = x.to_vec_f64().unwrap();
        for (name, op, f) in reduce_cases::<B>() {
            let y = op(&x, -1, false).unwrap();
            assert_eq!(y.dtype(), dt);
            assert_close(&y.to_vec_f64().unwrap(), &r::reduce(&xv, &[5, 40], 1, f), tol(dt), name);
        }
    }
}

/// The index of the first maximum, as I64, along any dim; ties resolve to the first.
pub fn argmax_values<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let first_max = |f: &[f64]| {
        let m = f.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        f.iter().position(|&v| v == m).unwrap() as f64
    };
    st::run(16, dim_case(), |(dims, d, keepdim, negative)| {
        // few distinct values, so ties are common
        let x: Vec<f64> = values(dims.iter().product(), 7, 0.0, 4.0).into_iter().map(f64::floor).collect();
        let dim = if negative { d as isize - dims.len() as isize } else { d as isize };
        let y = tensor(b, &x, dims.clone(), dt).argmax(dim, keepdim).unwrap();
        assert_eq!(y.dtype(), DType::I64);
        assert_eq!(y.dims(), &reduced_dims(&dims, d, keepdim)[..]);
        let e: Vec<i64> = r::reduce(&x, &dims, d, first_max).into_iter().map(|v| v as i64).collect();
        assert_eq!(y.to_vec_i64().unwrap(), e, "argmax of {dims:?} along {dim}");
    });
    // negative values only (the running maximum must not start at 0)
    let y = tensor(b, &[-5.0, -2.0, -3.0, -9.0, -8.0, -7.0], [2, 3], dt).argmax(-1, false).unwrap();
    assert_eq!(y.to_vec_i64().unwrap(), vec![1, 2]);
}

/// Gradients of every reduction along first, middle and last dims, and of the
/// whole-tensor reductions; max/min send the gradient to the first extremum only.
pub fn reduce_grads<B: Backend>(b: &B) {
    // distinct values: max/min are differentiable there
    let x = values(24, 9, -2.0, 2.0);
    for (name, op, _) in reduce_cases::<B>() {
        for (dim, keepdim) in [(0, false), (1, true), (-1, false), (-2, true)] {
            grad_check(
                b,
                &[(x.clone(), Shape::new([2, 3, 4]))],
                |t| op(&t[0], dim, keepdim),
                1e-6,
                &format!("{name} grad along {dim}"),
            );
        }
    }
    grad_check(b, &[(x.clone(), Shape::new([2, 3, 4]))], |t| t[0].sum_all(), 1e-6, "sum_all");
    grad_check(b, &[(x, Shape::new([2, 3, 4]))], |t| t[0].mean_all(), 1e-6, "mean_all");
    // ties: only the first position of the extremum receives the gradient
    let dt = check_dtype(b);
    let t = tensor(b, &[1.0, 3.0, 3.0, 2.0, 0.0, 3.0, 5.0, 0.0], [2, 4], dt).into_var();
    let g = t.max(-1, false).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(g.get(&t).unwrap().to_vec_f64().unwrap(), vec![0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0]);
    let g = t.min(1, true).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(g.get(&t).unwrap().to_vec_f64().unwrap(), vec![1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]);
    let g = t.max(0, false).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(g.get(&t).unwrap().to_vec_f64().unwrap(), vec![1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0]);
}

/// `sum_to` sums broadcast dims away (dropped leading dims and size-1 dims), and its
/// gradient broadcasts back.
pub fn sum_to_values_and_grads<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    st::run(16, st::broadcast_pair(4, 5), |(ad, td)| {
        // `ad` broadcast with `td` is the source shape; sum back to `td`
        let src = r::broadcast_shape(&ad, &td);
        let x = values(src.iter().product(), 13, -2.0, 2.0);
        let y = tensor(b, &x, src.clone(), dt).sum_to(&Shape::new(td.clone())).unwrap();
        assert_eq!(y.dims(), &td[..]);
        let mut e = vec![0.0; td.iter().product()];
        for (i, v) in x.iter().enumerate() {
            let idx = r::unravel(i, &src);
            let off = src.len() - td.len();
            let t: Vec<usize> = td.iter().enumerate().map(|(j, &s)| if s == 1 { 0 } else { idx[j + off] }).collect();
            e[r::ravel(&t, &td)] += v;
        }
        assert_close(&y.to_vec_f64().unwrap(), &e, tol(dt), &format!("sum_to {src:?} -> {td:?}"));
    });
    let to_scalar = tensor(b, &[1.0, 2.0, 3.0, 4.0], [2, 2], dt).sum_to(&Shape::new(vec![])).unwrap();
    assert_eq!((to_scalar.rank(), to_scalar.to_scalar().unwrap()), (0, 10.0));
    grad_check(
        b,
        &[(values(24, 14, -1.0, 1.0), Shape::new([2, 3, 4]))],
        |t| t[0].sum_to(&Shape::new([3, 1])),
        1e-6,
        "sum_to grad",
    );
    let x = tensor(b, &values(6, 1, 0.0, 1.0), [2, 3], dt);
    assert!(matches!(x.sum_to(&Shape::new([2])), Err(Error::ShapeMismatch { .. })), "3 does not reduce to 2");
    assert!(matches!(x.sum_to(&Shape::new([1, 2, 3])), Err(Error::ShapeMismatch { .. })), "higher rank target");
}

/// Out-of-range dims name the op; integer tensors sum but have no max gradient.
pub fn reduce_errors<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let x = tensor(b, &values(6, 1, 0.0, 1.0), [2, 3], dt);
    for (name, op, _) in reduce_cases::<B>() {
        match op(&x, 2, false) {
            Err(Error::DimOutOfRange { dim, .. }) => assert_eq!(dim, 2, "{name}"),
            other => panic!("{name}: expected a dim error, got {other:?}"),
        }
        assert!(matches!(op(&x, -3, true), Err(Error::DimOutOfRange { .. })), "{name}");
    }
    assert!(matches!(x.argmax(5, false), Err(Error::DimOutOfRange { .. })));
    let ids = Tensor::from_vec(b, vec![1i64, 2, 3, 4], [2, 2]).unwrap();
    assert!(matches!(ids.max(0, false), Err(Error::UnsupportedDType { .. })));
}
