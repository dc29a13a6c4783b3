//! Random family: counter-based uniform draws and seeded inverted dropout.

use crate::check::{assert_close, check_dtype, tensor, tol, values};
use redco_core::ops::random::uniform_at;
use redco_core::{Backend, DType, Error, Shape, Tensor};

/// Uniform draws are in `[0, 1)` and equal the counter-based reference element by element
/// (so every backend draws the same numbers for a seed).
pub fn rand_uniform_values<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let x = Tensor::zeros(b, [7, 13], dt).unwrap();
    for seed in [0u64, 1, 42, u64::MAX] {
        let u = x.rand_like(seed).unwrap();
        assert_eq!((u.dims(), u.dtype()), (&[7, 13][..], dt));
        let v = u.to_vec_f64().unwrap();
        assert!(v.iter().all(|&x| (0.0..1.0).contains(&x)));
        let e: Vec<f64> = (0..91).map(|i| uniform_at(seed, i)).collect();
        assert_close(&v, &e, tol(dt), &format!("rand_like seed {seed}"));
    }
    let mean = x
        .reshape([91])
        .unwrap()
        .expand([1000, 91])
        .unwrap()
        .rand_like(3)
        .unwrap()
        .mean_all()
        .unwrap()
        .to_scalar()
        .unwrap();
    assert!((mean - 0.5).abs() < 5.0 * (1.0 / 12.0f64 / 91000.0).sqrt(), "mean of 91000 draws {mean}");
}

/// The same seed gives the same mask; different seeds give different masks; the mask is
/// `uniform_at(seed, i) >= p` and kept elements are scaled by `1 / (1 - p)`.
pub fn dropout_values<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let n = 1000;
    let x = values(n, 1, 0.5, 2.0);
    let t = tensor(b, &x, [10, 100], dt);
    for p in [0.1, 0.5, 0.9] {
        let a = t.dropout(p, 7).unwrap().to_vec_f64().unwrap();
        assert_eq!(a, t.dropout(p, 7).unwrap().to_vec_f64().unwrap(), "p {p}: same seed, same mask");
        assert_ne!(a, t.dropout(p, 8).unwrap().to_vec_f64().unwrap(), "p {p}: another seed, another mask");
        let e: Vec<f64> = (0..n).map(|i| if uniform_at(7, i as u64) >= p { x[i] / (1.0 - p) } else { 0.0 }).collect();
        assert_close(&a, &e, tol(dt), &format!("dropout p {p}"));
    }
    // p = 0 is the identity
    let y = t.dropout(0.0, 7).unwrap();
    assert_eq!(y.to_vec_f64().unwrap(), x);
}

/// On 100k elements dropout keeps about `(1 - p)` of them (within 5 sigma of the binomial).
pub fn dropout_keep_rate<B: Backend>(b: &B) {
    let n = 100_000usize;
    let ones = Tensor::ones(b, [n], DType::F32).unwrap();
    for (p, seed) in [(0.1, 1u64), (0.5, 2), (0.75, 3)] {
        let y = ones.dropout(p, seed).unwrap().to_vec_f64().unwrap();
        let kept = y.iter().filter(|&&v| v != 0.0).count() as f64;
        let sigma = (n as f64 * p * (1.0 - p)).sqrt();
        assert!((kept - n as f64 * (1.0 - p)).abs() < 5.0 * sigma, "p {p}: kept {kept} of {n}");
        let scale = (1.0 / (1.0 - p)) as f32 as f64;
        assert!(y.iter().all(|&v| v == 0.0 || v == scale), "p {p}: kept values are 1/(1-p)");
    }
}

/// The gradient of dropout is the mask times the scale.
pub fn dropout_grads<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let n = 200;
    let p = 0.3;
    let x = tensor(b, &values(n, 2, -1.0, 1.0), [4, 50], dt).into_var();
    let w = values(n, 3, -1.0, 1.0);
    let loss = x.dropout(p, 11).unwrap().mul(&tensor(b, &w, [4, 50], dt)).unwrap().sum_all().unwrap();
    let g = loss.backward().unwrap().get(&x).unwrap().to_vec_f64().unwrap();
    let e: Vec<f64> = (0..n).map(|i| if uniform_at(11, i as u64) >= p { w[i] / (1.0 - p) } else { 0.0 }).collect();
    assert_close(&g, &e, tol(dt), "dropout gradient");
    // p = 0: the gradient passes unchanged
    let g = x.dropout(0.0, 11).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(g.get(&x).unwrap().to_vec_f64().unwrap(), vec![1.0; n]);
}

/// Probabilities outside `[0, 1)` (and NaN) are errors; integer tensors do not drop.
pub fn dropout_errors<B: Backend>(b: &B) {
    let t = tensor(b, &values(6, 1, 0.0, 1.0), Shape::new([2, 3]), check_dtype(b));
    for p in [-0.1, 1.0, 1.5, f64::NAN, f64::INFINITY] {
        assert!(matches!(t.dropout(p, 0), Err(Error::Invalid { op: "dropout", .. })), "p {p}");
    }
    let i = Tensor::from_vec(b, vec![1i64, 2], [2]).unwrap();
    assert!(matches!(i.dropout(0.5, 0), Err(Error::UnsupportedDType { .. })));
}
