//! Comparisons against f64 references and finite-difference gradient checks.

use redco_core::{Backend, DType, HostData, Result, Shape, Tensor};

/// The float type a backend is checked in: f64 where supported (exact references), else f32.
pub fn check_dtype<B: Backend>(b: &B) -> DType {
    if b.supports(DType::F64) {
        DType::F64
    } else {
        DType::F32
    }
}

/// Tolerance for value checks in `dtype`.
pub fn tol(dtype: DType) -> f64 {
    match dtype {
        DType::F64 => 1e-9,
        DType::F32 => 1e-4,
        _ => 2e-2,
    }
}

/// Asserts `|a - e| <= tol * (1 + |e|)` elementwise, naming `what` and the first bad index.
pub fn assert_close(actual: &[f64], expected: &[f64], tol: f64, what: &str) {
    assert_eq!(actual.len(), expected.len(), "{what}: length {} vs expected {}", actual.len(), expected.len());
    for (i, (a, e)) in actual.iter().zip(expected).enumerate() {
        assert!((a - e).abs() <= tol * (1.0 + e.abs()), "{what}: element {i}: got {a}, expected {e} (tol {tol})");
    }
}

/// A tensor of `dtype` from f64 values.
pub fn tensor<B: Backend>(b: &B, v: &[f64], shape: impl Into<Shape>, dtype: DType) -> Tensor<B> {
    Tensor::from_host(b, &HostData::from_f64(v, dtype), shape).expect("tensor")
}

/// An integer tensor.
pub fn ids<B: Backend>(b: &B, v: &[i64], shape: impl Into<Shape>) -> Tensor<B> {
    Tensor::from_vec(b, v.to_vec(), shape).expect("ids")
}

/// Deterministic pseudo-random values in `[lo, hi)`, each exactly representable in f32, so
/// that tests comparing copies exactly hold in every check dtype (f64 or f32).
pub fn values(n: usize, seed: u64, lo: f64, hi: f64) -> Vec<f64> {
    (0..n as u64).map(|i| (lo + (hi - lo) * redco_core::ops::random::uniform_at(seed, i)) as f32 as f64).collect()
}

/// Checks the gradients of `f` at `inputs` against central finite differences.
///
/// The scalar checked is `sum(f(x) * w)` for fixed pseudo-random weights `w`, so every
/// output element contributes with a different weight. Runs in f64 when the backend has it
/// (step 1e-6, tolerance `tol`), else in f32 (step 1e-2, tolerance 1e-2).
pub fn grad_check<B: Backend>(
    b: &B,
    inputs: &[(Vec<f64>, Shape)],
    f: impl Fn(&[Tensor<B>]) -> Result<Tensor<B>>,
    tol: f64,
    what: &str,
) {
    let dt = check_dtype(b);
    let (h, tol) = if dt == DType::F64 { (1e-6, tol) } else { (1e-2, tol.max(1e-2)) };
    let vars: Vec<Tensor<B>> = inputs.iter().map(|(v, s)| tensor(b, v, s.clone(), dt).into_var()).collect();
    let out = f(&vars).unwrap_or_else(|e| panic!("{what}: forward failed: {e}"));
    let w = tensor(b, &values(out.elem_count(), 77, -1.0, 1.0), out.shape().clone(), out.dtype());
    let scalar = |o: &Tensor<B>| -> f64 { o.mul(&w).unwrap().sum_all().unwrap().to_scalar().unwrap() };
    let loss = out.mul(&w).unwrap().sum_all().unwrap();
    let grads = loss.backward().unwrap_or_else(|e| panic!("{what}: backward failed: {e}"));
    for (k, (v, s)) in inputs.iter().enumerate() {
        let analytic = match grads.get(&vars[k]) {
            Some(g) => g.to_vec_f64().unwrap(),
            None => vec![0.0; v.len()],
        };
        let mut numeric = Vec::with_capacity(v.len());
        for i in 0..v.len() {
            let eval = |delta: f64| {
                let xs: Vec<Tensor<B>> = inputs
                    .iter()
                    .enumerate()
                    .map(|(j, (vj, sj))| {
                        let mut vj = vj.clone();
                        if j == k {
                            vj[i] += delta;
                        }
                        tensor(b, &vj, sj.clone(), dt)
                    })
                    .collect();
                redco_core::no_grad(|| scalar(&f(&xs).unwrap()))
            };
            numeric.push((eval(h) - eval(-h)) / (2.0 * h));
        }
        let _ = s;
        assert_close(&analytic, &numeric, tol, &format!("{what}: gradient of input {k}"));
    }
}
