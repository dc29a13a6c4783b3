//! Optimizer family: one fused AdamW step against an f64 reference, in f32 (the dtype of
//! master weights) and in the backend's check dtype.

use crate::check::{assert_close, check_dtype, tensor, values};
use redco_core::ops::adamw::AdamStep;
use redco_core::{Backend, DType};

pub fn adamw_step<B: Backend>(b: &B) {
    let n = 40_003; // several parallel chunks and a ragged end
    let (x, g, m) = (values(n, 1, -1.0, 1.0), values(n, 2, -0.5, 0.5), values(n, 3, -0.1, 0.1));
    let v = values(n, 4, 0.0, 0.01);
    let h = AdamStep { lr: 3e-3, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1, bias1: 0.19, bias2: 0.0975 };
    let mut want = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        let mi = h.beta1 * m[i] + (1.0 - h.beta1) * g[i];
        let vi = h.beta2 * v[i] + (1.0 - h.beta2) * g[i] * g[i];
        let xi = x[i] * (1.0 - h.lr * h.weight_decay) - h.lr * (mi / h.bias1) / ((vi / h.bias2).sqrt() + h.eps);
        want.0.push(xi);
        want.1.push(mi);
        want.2.push(vi);
    }
    for dt in [DType::F32, check_dtype(b)] {
        let t = |d: &[f64]| tensor(b, d, [n], dt);
        let (tx, tg, tm, tv) = (t(&x), t(&g), t(&m), t(&v));
        let (nx, nm, nv) = b.adamw(tx.storage(), tg.storage(), tm.storage(), tv.storage(), n, &h).unwrap();
        let back = |s| b.download(&s).unwrap().to_f64_vec();
        let tol = if dt == DType::F64 { 1e-12 } else { 1e-5 };
        assert_close(&back(nx), &want.0, tol, &format!("adamw parameter ({dt:?})"));
        assert_close(&back(nm), &want.1, tol, &format!("adamw first moment ({dt:?})"));
        assert_close(&back(nv), &want.2, tol, &format!("adamw second moment ({dt:?})"));
        // the same step writing the moments over their own buffers (unshared: in place
        // where the backend can), and over shared ones (whose other holder keeps the old
        // values)
        let (mut sm, mut sv) = (tm.storage().clone(), tv.storage().clone());
        drop((tm, tv));
        let nx = b.adamw_into(tx.storage(), tg.storage(), &mut sm, &mut sv, n, &h).unwrap();
        assert_close(&back(nx), &want.0, tol, &format!("adamw_into parameter ({dt:?})"));
        assert_close(&back(sm), &want.1, tol, &format!("adamw_into first moment ({dt:?})"));
        assert_close(&back(sv), &want.2, tol, &format!("adamw_into second moment ({dt:?})"));
        let (om, ov) = (t(&m), t(&v));
        let (m0, v0) = (back(om.storage().clone()), back(ov.storage().clone()));
        let (mut sm, mut sv) = (om.storage().clone(), ov.storage().clone());
        let nx = b.adamw_into(tx.storage(), tg.storage(), &mut sm, &mut sv, n, &h).unwrap();
        assert_close(&back(nx), &want.0, tol, &format!("adamw_into parameter, shared moments ({dt:?})"));
        assert_close(&back(sm), &want.1, tol, &format!("adamw_into first moment, shared ({dt:?})"));
        assert_close(&back(sv), &want.2, tol, &format!("adamw_into second moment, shared ({dt:?})"));
        assert_close(&back(om.storage().clone()), &m0, 0.0, &format!("a shared first moment's other holder ({dt:?})"));
        assert_close(&back(ov.storage().clone()), &v0, 0.0, &format!("a shared second moment's other holder ({dt:?})"));
    }
}
