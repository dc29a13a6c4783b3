//! Elementwise family: unary maps, broadcasting binary ops, comparisons, where, casts.

use crate::check::{assert_close, check_dtype, grad_check, tensor, tol, values};
use crate::{reference as r, strategies as st};
use redco_core::{Backend, CmpOp, DType, Error, Result, Shape, Tensor};

type UnaryCase<B> = (&'static str, fn(&Tensor<B>) -> Result<Tensor<B>>, fn(f64) -> f64, (f64, f64));

fn unary_cases<B: Backend>() -> Vec<UnaryCase<B>> {
    vec![
        ("neg", |t| t.neg(), |x| -x, (-3.0, 3.0)),
        ("exp", |t| t.exp(), f64::exp, (-3.0, 3.0)),
        ("log", |t| t.log(), f64::ln, (0.1, 5.0)),
        ("sqrt", |t| t.sqrt(), f64::sqrt, (0.1, 5.0)),
        ("rsqrt", |t| t.rsqrt(), |x| 1.0 / x.sqrt(), (0.1, 5.0)),
        ("recip", |t| t.recip(), |x| 1.0 / x, (0.5, 5.0)),
        ("abs", |t| t.abs(), f64::abs, (-3.0, 3.0)),
        ("tanh", |t| t.tanh(), f64::tanh, (-3.0, 3.0)),
        ("sigmoid", |t| t.sigmoid(), |x| 1.0 / (1.0 + (-x).exp()), (-5.0, 5.0)),
        ("relu", |t| t.relu(), |x| x.max(0.0), (-3.0, 3.0)),
        ("silu", |t| t.silu(), r::silu, (-5.0, 5.0)),
        ("gelu", |t| t.gelu(), r::gelu, (-4.0, 4.0)),
        ("gelu_tanh", |t| t.gelu_tanh(), r::gelu_tanh, (-4.0, 4.0)),
        ("erf", |t| t.erf(), r::erf, (-2.5, 2.5)),
        ("sin", |t| t.sin(), f64::sin, (-3.0, 3.0)),
        ("cos", |t| t.cos(), f64::cos, (-3.0, 3.0)),
        ("square", |t| t.square(), |x| x * x, (-3.0, 3.0)),
        ("affine", |t| t.affine(-1.5, 0.25), |x| -1.5 * x + 0.25, (-3.0, 3.0)),
        ("powf", |t| t.powf(2.5), |x| x.powf(2.5), (0.1, 3.0)),
        ("clamp_min", |t| t.clamp_min(0.3), |x| x.max(0.3), (-3.0, 3.0)),
    ]
}

/// Every unary op against its f64 definition, on random shapes.
pub fn unary_values<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    for (name, op, f, (lo, hi)) in unary_cases::<B>() {
        st::run(8, st::shape(3, 9), |dims| {
            let n = dims.iter().product();
            let x = values(n, 3, lo, hi);
            let y = op(&tensor(b, &x, dims.clone(), dt)).unwrap();
            assert_eq!(y.dims(), &dims[..]);
            let e: Vec<f64> = x.iter().map(|&v| f(v)).collect();
            assert_close(&y.to_vec_f64().unwrap(), &e, tol(dt) * 10.0, name);
        });
    }
}

/// Every unary op's gradient against finite differences.
pub fn unary_grads<B: Backend>(b: &B) {
    for (name, op, _, (lo, hi)) in unary_cases::<B>() {
        // keep away from the kinks of abs / relu / clamp
        let x: Vec<f64> = values(7, 5, lo, hi)
            .into_iter()
            .map(|v| if (v.abs() - 0.3).abs() < 0.05 || v.abs() < 0.05 { v + 0.2 } else { v })
            .collect();
        grad_check(b, &[(x, Shape::new([7]))], |t| op(&t[0]), 1e-6, name);
    }
}

type BinaryCase<B> = (&'static str, fn(&Tensor<B>, &Tensor<B>) -> Result<Tensor<B>>, fn(f64, f64) -> f64);

fn binary_cases<B: Backend>() -> Vec<BinaryCase<B>> {
    vec![
        ("add", |a, b| a.add(b), |x, y| x + y),
        ("sub", |a, b| a.sub(b), |x, y| x - y),
        ("mul", |a, b| a.mul(b), |x, y| x * y),
        ("div", |a, b| a.div(b), |x, y| x / y),
        ("maximum", |a, b| a.maximum(b), f64::max),
        ("minimum", |a, b| a.minimum(b), f64::min),
    ]
}

/// Binary ops with NumPy broadcasting (dropped leading dims, size-1 dims) against f64.
pub fn binary_broadcast_values<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    for (name, op, f) in binary_cases::<B>() {
        st::run(16, st::broadcast_pair(4, 6), |(ad, bd)| {
            let x = values(ad.iter().product(), 1, -2.0, 2.0);
            let y = values(bd.iter().product(), 2, 0.5, 2.0);
            let out = op(&tensor(b, &x, ad.clone(), dt), &tensor(b, &y, bd.clone(), dt)).unwrap();
            let (e, od) = r::binary(&x, &ad, &y, &bd, f);
            assert_eq!(out.dims(), &od[..], "{name} shape");
            assert_close(&out.to_vec_f64().unwrap(), &e, tol(dt), name);
        });
    }
}

/// Binary op gradients, including the reduction over broadcast dims.
pub fn binary_grads<B: Backend>(b: &B) {
    for (name, op, _) in binary_cases::<B>() {
        let x = values(12, 8, -2.0, 2.0);
        let y = values(4, 9, 0.5, 2.0);
        grad_check(
            b,
            &[(x.clone(), Shape::new([3, 4])), (y.clone(), Shape::new([4]))],
            |t| op(&t[0], &t[1]),
            1e-6,
            name,
        );
        grad_check(b, &[(y, Shape::new([1, 4])), (x, Shape::new([3, 1, 4]))], |t| op(&t[0], &t[1]), 1e-6, name);
    }
}

/// Comparisons give U8 masks; `where_cond` selects with broadcasting, and its gradient
/// flows to the selected side only.
pub fn compare_and_where<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let x = tensor(b, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3], dt);
    let y = tensor(b, &[2.0, 2.0, 5.0], [3], dt);
    let cases = [
        (CmpOp::Eq, [0, 1, 0, 0, 0, 0]),
        (CmpOp::Ne, [1, 0, 1, 1, 1, 1]),
        (CmpOp::Lt, [1, 0, 1, 0, 0, 0]),
        (CmpOp::Le, [1, 1, 1, 0, 0, 0]),
        (CmpOp::Gt, [0, 0, 0, 1, 1, 1]),
        (CmpOp::Ge, [0, 1, 0, 1, 1, 1]),
    ];
    for (op, want) in cases {
        let m = x.compare(&y, op).unwrap();
        assert_eq!(m.dtype(), DType::U8);
        assert_eq!(m.to_vec_i64().unwrap(), want.map(|v| v as i64).to_vec(), "{op:?}");
    }
    let m = x.compare(&y, CmpOp::Gt).unwrap();
    let z = tensor(b, &[-1.0], [1], dt);
    let w = m.where_cond(&x, &z).unwrap();
    assert_eq!(w.to_vec_f64().unwrap(), vec![-1.0, -1.0, -1.0, 4.0, 5.0, 6.0]);
    let mask = m.clone();
    grad_check(
        b,
        &[(values(6, 3, -1.0, 1.0), Shape::new([2, 3])), (vec![0.5, -0.5, 2.0], Shape::new([3]))],
        move |t| mask.where_cond(&t[0], &t[1]),
        1e-6,
        "where_cond",
    );
}

/// Casts round-trip through f16/bf16/f32 with the types' precision; the gradient of a
/// float cast is cast back.
pub fn casts<B: Backend>(b: &B) {
    let v = values(33, 4, -4.0, 4.0);
    let x = tensor(b, &v, [3, 11], DType::F32);
    for (dt, t) in [(DType::F16, 1e-3), (DType::BF16, 8e-3), (DType::F64, 1e-7)] {
        if !b.supports(dt) {
            continue;
        }
        let y = x.cast(dt).unwrap();
        assert_eq!(y.dtype(), dt);
        assert_close(&y.cast(DType::F32).unwrap().to_vec_f64().unwrap(), &v, t, &format!("cast {dt:?}"));
    }
    let ids = x.cast(DType::I64).unwrap();
    assert_eq!(ids.to_vec_i64().unwrap(), v.iter().map(|&f| f as i64).collect::<Vec<_>>());
    if b.supports(DType::F64) {
        // d/dx sum(cast_f32(x)^2) = 2x, to f32 precision (finite differences in f32 would
        // only measure rounding).
        let x = tensor(b, &v[..5], [5], DType::F64).into_var();
        let loss = x.cast(DType::F32).unwrap().square().unwrap().sum_all().unwrap();
        let g = loss.backward().unwrap().get(&x).unwrap().clone();
        assert_eq!(g.dtype(), DType::F64, "the gradient has the variable's dtype");
        let e: Vec<f64> = v[..5].iter().map(|x| 2.0 * x).collect();
        assert_close(&g.to_vec_f64().unwrap(), &e, 1e-6, "cast gradient");
    }
}

/// f16 and bf16 tensors compute (in f32) and store their own type.
pub fn half_precision_compute<B: Backend>(b: &B) {
    for dt in [DType::F16, DType::BF16] {
        if !b.supports(dt) {
            continue;
        }
        let x = values(64, 6, -2.0, 2.0);
        let y = values(64, 7, -2.0, 2.0);
        let out = tensor(b, &x, [8, 8], dt).mul(&tensor(b, &y, [8, 8], dt)).unwrap().exp().unwrap();
        assert_eq!(out.dtype(), dt);
        let e: Vec<f64> = x.iter().zip(&y).map(|(a, b)| (a * b).exp()).collect();
        assert_close(&out.to_vec_f64().unwrap(), &e, tol(dt), &format!("{dt:?} mul+exp"));
    }
}

/// Mismatched shapes and mixed dtypes are errors that name the op.
pub fn elementwise_errors<B: Backend>(b: &B) {
    let a = tensor(b, &values(6, 1, 0.0, 1.0), [2, 3], DType::F32);
    let c = tensor(b, &values(8, 1, 0.0, 1.0), [2, 4], DType::F32);
    match a.add(&c) {
        Err(Error::ShapeMismatch { op, .. }) => assert_eq!(op, "add"),
        other => panic!("expected a shape mismatch, got {other:?}"),
    }
    let h = a.cast(DType::F16).unwrap();
    match a.mul(&h) {
        Err(Error::DTypeMismatch { op, lhs, rhs }) => assert_eq!((op, lhs, rhs), ("mul", DType::F32, DType::F16)),
        other => panic!("expected a dtype mismatch, got {other:?}"),
    }
    let i = a.cast(DType::I64).unwrap();
    assert!(matches!(i.exp(), Err(Error::UnsupportedDType { .. })));
    assert!(a.add(&c).unwrap_err().to_string().contains("[2, 3]"), "the message names the shapes");
}
