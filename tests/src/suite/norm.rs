//! Norm family: LayerNorm (optional weight and bias) and RMSNorm (optional weight) over the
//! last dimension.

use crate::check::{assert_close, check_dtype, grad_check, tensor, tol, values};
use crate::{reference as r, strategies as st};
use redco_core::{Backend, DType, Error, Shape, Tensor};

const EPS: f64 = 1e-5;

/// LayerNorm with every combination of weight and bias, on random shapes.
pub fn layer_norm_values<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    st::run(16, st::shape(3, 9), |dims| {
        let d = *dims.last().unwrap();
        let x = values(dims.iter().product(), 1, -3.0, 3.0);
        let w = values(d, 2, 0.5, 1.5);
        let bias = values(d, 3, -1.0, 1.0);
        let t = tensor(b, &x, dims.clone(), dt);
        let (wt, bt) = (tensor(b, &w, [d], dt), tensor(b, &bias, [d], dt));
        for (hw, hb) in [(false, false), (true, false), (false, true), (true, true)] {
            let y = t.layer_norm(hw.then_some(&wt), hb.then_some(&bt), EPS).unwrap();
            let e = r::rows(&x, d, |row| r::layer_norm(row, hw.then_some(&w[..]), hb.then_some(&bias[..]), EPS));
            assert_eq!(y.dims(), &dims[..]);
            assert_close(
                &y.to_vec_f64().unwrap(),
                &e,
                tol(dt) * 10.0,
                &format!("layer_norm {dims:?} weight {hw} bias {hb}"),
            );
        }
    });
}

/// RMSNorm with and without weight, on random shapes.
pub fn rms_norm_values<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    st::run(16, st::shape(3, 9), |dims| {
        let d = *dims.last().unwrap();
        let x = values(dims.iter().product(), 4, -3.0, 3.0);
        let w = values(d, 5, 0.5, 1.5);
        let t = tensor(b, &x, dims.clone(), dt);
        let wt = tensor(b, &w, [d], dt);
        for hw in [false, true] {
            let y = t.rms_norm(hw.then_some(&wt), EPS).unwrap();
            let e = r::rows(&x, d, |row| r::rms_norm(row, hw.then_some(&w[..]), EPS));
            assert_close(&y.to_vec_f64().unwrap(), &e, tol(dt) * 10.0, &format!("rms_norm {dims:?} weight {hw}"));
        }
    });
}

/// Constant rows (zero variance) and all-zero rows give finite outputs; a large offset
/// does not destroy LayerNorm's precision; f16/bf16 keep their dtype.
pub fn norm_edge_cases<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let x = [2.0, 2.0, 2.0, 2.0, 0.0, 0.0, 0.0, 0.0];
    let bias = [0.1, 0.2, 0.3, 0.4];
    let t = tensor(b, &x, [2, 4], dt);
    let y = t.layer_norm(None, Some(&tensor(b, &bias, [4], dt)), EPS).unwrap().to_vec_f64().unwrap();
    assert_close(&y, &r::rows(&x, 4, |row| r::layer_norm(row, None, Some(&bias), EPS)), tol(dt), "constant rows");
    let y = t.rms_norm(None, EPS).unwrap().to_vec_f64().unwrap();
    assert!(y.iter().all(|v| v.is_finite()));
    assert_close(&y, &r::rows(&x, 4, |row| r::rms_norm(row, None, EPS)), tol(dt), "rms constant rows");
    let off: Vec<f64> = values(16, 6, -1.0, 1.0).iter().map(|v| v + 1000.0).collect();
    let y = tensor(b, &off, [2, 8], dt).layer_norm(None, None, EPS).unwrap();
    assert_close(
        &y.to_vec_f64().unwrap(),
        &r::rows(&off, 8, |row| r::layer_norm(row, None, None, EPS)),
        tol(dt) * 10.0,
        "offset 1000",
    );
    for h in [DType::F16, DType::BF16] {
        if !b.supports(h) {
            continue;
        }
        let t = tensor(b, &values(3 * 40, 7, -2.0, 2.0), [3, 40], h);
        let w = tensor(b, &values(40, 8, 0.5, 1.5), [40], h);
        let (xv, wv) = (t.to_vec_f64().unwrap(), w.to_vec_f64().unwrap());
        let y = t.layer_norm(Some(&w), Some(&w), EPS).unwrap();
        assert_eq!(y.dtype(), h);
        let e = r::rows(&xv, 40, |row| r::layer_norm(row, Some(&wv), Some(&wv), EPS));
        assert_close(&y.to_vec_f64().unwrap(), &e, tol(h), &format!("layer_norm {h:?}"));
        let y = t.rms_norm(Some(&w), EPS).unwrap();
        assert_close(
            &y.to_vec_f64().unwrap(),
            &r::rows(&xv, 40, |row| r::rms_norm(row, Some(&wv), EPS)),
            tol(h),
            &format!("rms_norm {h:?}"),
        );
    }
}

/// Rows shorter and longer than a backend's workgroup (1 to 256 lanes per row, several rows
/// per workgroup, rows beyond 1024 elements), with and without the affine parameters.
pub fn norm_long_rows<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    for (i, (n, d)) in [(300, 3), (7, 100), (9, 300), (3, 1000), (2, 1500), (2, 5000)].into_iter().enumerate() {
        let seed = 30 + 3 * i as u64;
        let x: Vec<f64> = values(n * d, seed, -3.0, 3.0).iter().map(|v| v + 2.0).collect();
        let (w, bias) = (values(d, seed + 1, 0.5, 1.5), values(d, seed + 2, -1.0, 1.0));
        let t = tensor(b, &x, [n, d], dt);
        let (wt, bt) = (tensor(b, &w, [d], dt), tensor(b, &bias, [d], dt));
        for affine in [false, true] {
            let (wo, bo) = (affine.then_some(&w[..]), affine.then_some(&bias[..]));
            let y = t.layer_norm(affine.then_some(&wt), affine.then_some(&bt), EPS).unwrap();
            let e = r::rows(&x, d, |row| r::layer_norm(row, wo, bo, EPS));
            let what = format!("[{n}, {d}] affine {affine}");
            assert_close(&y.to_vec_f64().unwrap(), &e, tol(dt) * 10.0, &format!("layer_norm {what}"));
            let y = t.rms_norm(affine.then_some(&wt), EPS).unwrap();
            let e = r::rows(&x, d, |row| r::rms_norm(row, wo, EPS));
            assert_close(&y.to_vec_f64().unwrap(), &e, tol(dt) * 10.0, &format!("rms_norm {what}"));
        }
    }
}

/// Gradients with respect to x, weight and bias, for every combination.
pub fn norm_grads<B: Backend>(b: &B) {
    let x = (values(15, 9, -2.0, 2.0), Shape::new([3, 5]));
    let w = (values(5, 10, 0.5, 1.5), Shape::new([5]));
    let bias = (values(5, 11, -1.0, 1.0), Shape::new([5]));
    let t = 1e-5;
    grad_check(b, std::slice::from_ref(&x), |t| t[0].layer_norm(None, None, EPS), t, "layer_norm d/dx");
    grad_check(b, &[x.clone(), w.clone()], |t| t[0].layer_norm(Some(&t[1]), None, EPS), t, "layer_norm weight");
    grad_check(b, &[x.clone(), bias.clone()], |t| t[0].layer_norm(None, Some(&t[1]), EPS), t, "layer_norm bias");
    grad_check(
        b,
        &[x.clone(), w.clone(), bias],
        |t| t[0].layer_norm(Some(&t[1]), Some(&t[2]), EPS),
        t,
        "layer_norm weight+bias",
    );
    grad_check(b, std::slice::from_ref(&x), |t| t[0].rms_norm(None, EPS), t, "rms_norm d/dx");
    grad_check(b, &[x.clone(), w.clone()], |t| t[0].rms_norm(Some(&t[1]), EPS), t, "rms_norm weight");
    // rank 3 input: the parameter gradients sum over every leading dim
    let x3 = (values(24, 12, -2.0, 2.0), Shape::new([2, 3, 4]));
    let w4 = (values(4, 13, 0.5, 1.5), Shape::new([4]));
    grad_check(
        b,
        &[x3.clone(), w4.clone(), w4.clone()],
        |t| t[0].layer_norm(Some(&t[1]), Some(&t[2]), EPS),
        t,
        "layer_norm rank 3",
    );
    grad_check(b, &[x3, w4], |t| t[0].rms_norm(Some(&t[1]), EPS), t, "rms_norm rank 3");
}

/// The fused input gradient ([`Backend::norm_backward`]) of LayerNorm and RMSNorm, with
/// and without a weight, on random shapes, against the f64 formula.
pub fn norm_backward_values<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    st::run(12, st::shape(3, 9), |dims| {
        let d = *dims.last().unwrap();
        let n: usize = dims.iter().product();
        let (x, g, w) = (values(n, 4, -3.0, 3.0), values(n, 5, -1.0, 1.0), values(d, 6, 0.5, 1.5));
        let shape = Shape::new(dims.clone());
        let (xt, gt, wt) = (tensor(b, &x, dims.clone(), dt), tensor(b, &g, dims.clone(), dt), tensor(b, &w, [d], dt));
        for rms in [false, true] {
            for hw in [false, true] {
                let got =
                    b.norm_backward(xt.storage(), &shape, hw.then_some(wt.storage()), gt.storage(), EPS, rms).unwrap();
                let mut want = Vec::with_capacity(n);
                for (row, gr) in x.chunks(d).zip(g.chunks(d)) {
                    let mean = if rms { 0.0 } else { row.iter().sum::<f64>() / d as f64 };
                    let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / d as f64;
                    let rstd = 1.0 / (var + EPS).sqrt();
                    let gx: Vec<f64> = (0..d).map(|j| if hw { gr[j] * w[j] } else { gr[j] }).collect();
                    let xhat: Vec<f64> = row.iter().map(|v| (v - mean) * rstd).collect();
                    let m1 = if rms { 0.0 } else { gx.iter().sum::<f64>() / d as f64 };
                    let m2 = gx.iter().zip(&xhat).map(|(a, b)| a * b).sum::<f64>() / d as f64;
                    want.extend((0..d).map(|j| rstd * (gx[j] - m1 - xhat[j] * m2)));
                }
                let what = format!("norm_backward {dims:?} rms {rms} weight {hw} ({dt:?})");
                assert_close(&b.download(&got).unwrap().to_f64_vec(), &want, tol(dt) * 10.0, &what);
            }
        }
    });
}

/// A weight or bias of the wrong size or dtype, rank-0 and integer inputs are errors.
pub fn norm_errors<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let x = tensor(b, &values(12, 1, 0.0, 1.0), [3, 4], dt);
    let w3 = tensor(b, &[1.0; 3], [3], dt);
    let w4 = tensor(b, &[1.0; 4], [4], dt);
    let w14 = tensor(b, &[1.0; 4], [1, 4], dt);
    assert!(matches!(x.layer_norm(Some(&w3), None, EPS), Err(Error::ShapeMismatch { .. })), "layer_norm weight [3]");
    assert!(matches!(x.layer_norm(None, Some(&w3), EPS), Err(Error::ShapeMismatch { .. })), "layer_norm bias [3]");
    assert!(
        matches!(x.layer_norm(Some(&w14), None, EPS), Err(Error::ShapeMismatch { .. })),
        "layer_norm weight [1, 4]"
    );
    assert!(matches!(x.rms_norm(Some(&w3), EPS), Err(Error::ShapeMismatch { .. })), "rms_norm weight [3]");
    let wh = w4.cast(DType::F16).unwrap();
    assert!(matches!(x.rms_norm(Some(&wh), EPS), Err(Error::DTypeMismatch { .. })));
    assert!(matches!(x.layer_norm(Some(&w4), Some(&wh), EPS), Err(Error::DTypeMismatch { .. })));
    let s = Tensor::scalar(b, 1.0, dt).unwrap();
    assert!(s.layer_norm(None, None, EPS).is_err() && s.rms_norm(None, EPS).is_err(), "rank 0");
    let i = x.cast(DType::I64).unwrap();
    assert!(matches!(i.rms_norm(None, EPS), Err(Error::UnsupportedDType { .. })));
}
