//! Optimizer family: one fused AdamW step against an f64 reference, in f32 (the dtype of
//! master weights) and in the backend's check dtype; the multi-tensor steps (replicated and
//! mixed-precision over f32 masters); the multi-tensor sum of squares of a gradient norm.

use crate::check::{assert_close, check_dtype, tensor, values};
use redco_core::ops::adamw::{AdamItem, AdamMasterItem, AdamStep};
use redco_core::{Backend, DType, Shape};

const H: AdamStep =
    AdamStep { lr: 3e-3, beta1: 0.9, beta2: 0.95, eps: 1e-8, weight_decay: 0.1, bias1: 0.19, bias2: 0.0975 };

/// The inputs `(x, g, m, v)` of `n` elements from `seed` and the f64 reference step's
/// `(x, m, v)`.
#[allow(clippy::type_complexity)]
fn case(n: usize, seed: u64) -> ([Vec<f64>; 4], (Vec<f64>, Vec<f64>, Vec<f64>)) {
    let (x, g) = (values(n, seed, -1.0, 1.0), values(n, seed + 1, -0.5, 0.5));
    let (m, v) = (values(n, seed + 2, -0.1, 0.1), values(n, seed + 3, 0.0, 0.01));
    let h = H;
    let mut want = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        let mi = h.beta1 * m[i] + (1.0 - h.beta1) * g[i];
        let vi = h.beta2 * v[i] + (1.0 - h.beta2) * g[i] * g[i];
        let xi = x[i] * (1.0 - h.lr * h.weight_decay) - h.lr * (mi / h.bias1) / ((vi / h.bias2).sqrt() + h.eps);
        want.0.push(xi);
        want.1.push(mi);
        want.2.push(vi);
    }
    ([x, g, m, v], want)
}

pub fn adamw_step<B: Backend>(b: &B) {
    let n = 40_003; // several parallel chunks and a ragged end
    let ([x, g, m, v], want) = case(n, 1);
    let h = H;
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

/// [`Backend::adamw_many`] over parameters of several sizes (empty, one element, either
/// side of a GPU chunk, a large one) and two dtypes in one call, one of them with moments
/// shared with another holder: each against the f64 reference, the inputs untouched.
pub fn adamw_many_step<B: Backend>(b: &B) {
    let sizes = [0, 1, 4095, 4097, 40_003, 3];
    let dts = [DType::F32, check_dtype(b), DType::F32, check_dtype(b), DType::F32, check_dtype(b)];
    let cases: Vec<_> = sizes.iter().enumerate().map(|(i, &n)| case(n, 10 * i as u64 + 5)).collect();
    let ts: Vec<_> = cases
        .iter()
        .zip(dts)
        .map(|(([x, g, m, v], _), dt)| {
            let n = x.len();
            [tensor(b, x, [n], dt), tensor(b, g, [n], dt), tensor(b, m, [n], dt), tensor(b, v, [n], dt)]
        })
        .collect();
    let back = |s: &B::Storage| b.download(s).unwrap().to_f64_vec();
    let x0: Vec<Vec<f64>> = ts.iter().map(|t| back(t[0].storage())).collect();
    // every moment unshared but the fifth parameter's, whose other holder is `held`
    let mut moments: Vec<(B::Storage, B::Storage)> =
        ts.iter().map(|t| (t[2].storage().clone(), t[3].storage().clone())).collect();
    let held = (back(ts[4][2].storage()), back(ts[4][3].storage()));
    let ts: Vec<_> = ts.into_iter().enumerate().map(|(i, [x, g, m, v])| (x, g, (i == 4).then_some((m, v)))).collect();
    let mut items: Vec<AdamItem<'_, B::Storage>> = ts
        .iter()
        .zip(moments.iter_mut())
        .zip(sizes)
        .map(|(((x, g, _), (m, v)), n)| AdamItem { x: x.storage(), g: g.storage(), m, v, n })
        .collect();
    let out = b.adamw_many(&mut items, &H).unwrap();
    drop(items);
    assert_eq!(out.len(), sizes.len());
    for (i, ((nx, (m, v)), (_, want))) in out.iter().zip(&moments).zip(&cases).enumerate() {
        let dt = dts[i];
        let tol = if dt == DType::F64 { 1e-12 } else { 1e-5 };
        let what = format!("adamw_many parameter {i} of {} ({dt:?})", sizes[i]);
        assert_close(&back(nx), &want.0, tol, &what);
        assert_close(&back(m), &want.1, tol, &format!("{what}: first moment"));
        assert_close(&back(v), &want.2, tol, &format!("{what}: second moment"));
        assert_close(&back(ts[i].0.storage()), &x0[i], 0.0, &format!("{what}: the input parameter"));
    }
    let (m4, v4) = ts[4].2.as_ref().expect("kept");
    assert_close(&back(m4.storage()), &held.0, 0.0, "a shared first moment's other holder");
    assert_close(&back(v4.storage()), &held.1, 0.0, "a shared second moment's other holder");
}

/// `v` (an f32 value) rounded to `dt` (f32 or bf16: to nearest, ties to even).
fn rounded_to(v: f64, dt: DType) -> f64 {
    let b = (v as f32).to_bits();
    match dt {
        DType::BF16 => f32::from_bits((b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) << 16) as f64,
        _ => v as f32 as f64,
    }
}

/// [`Backend::adamw_master_many`]: f32 masters of several sizes (empty, one element, either
/// side of a GPU chunk, a large one) with f32 and 16-bit gradients in one call and the
/// gradient multiplier folded in, against the f64 update of the same stored values; every
/// compute copy is its new master rounded to the copy's dtype, the input masters are
/// untouched, and moments shared with another holder are left to it.
pub fn adamw_master_many_step<B: Backend>(b: &B) {
    let half = if b.supports(DType::BF16) { DType::BF16 } else { DType::F32 };
    let sizes = [0, 1, 4095, 4097, 40_003, 3];
    let gscale = 0.37;
    let mut h = H;
    h.lr = 1e-2;
    for copy in [DType::F32, half] {
        let gdt = |i: usize| if i % 2 == 1 { copy } else { DType::F32 };
        let mut want = Vec::new();
        let mut ts = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            let seed = 10 * i as u64 + 7;
            let (x, m, v) =
                (values(n, seed, -1.0, 1.0), values(n, seed + 2, -0.1, 0.1), values(n, seed + 3, 0.0, 0.01));
            let g = tensor(b, &values(n, seed + 1, -0.5, 0.5), [n], gdt(i));
            // the gradient as stored, then scaled: what the update reads
            let gs: Vec<f64> = b.download(g.storage()).unwrap().to_f64_vec().iter().map(|e| e * gscale).collect();
            let mut w = (Vec::new(), Vec::new(), Vec::new());
            for j in 0..n {
                let mj = h.beta1 * m[j] + (1.0 - h.beta1) * gs[j];
                let vj = h.beta2 * v[j] + (1.0 - h.beta2) * gs[j] * gs[j];
                w.0.push(
                    x[j] * (1.0 - h.lr * h.weight_decay) - h.lr * (mj / h.bias1) / ((vj / h.bias2).sqrt() + h.eps),
                );
                w.1.push(mj);
                w.2.push(vj);
            }
            want.push(w);
            let t = |d: &[f64]| tensor(b, d, [n], DType::F32);
            ts.push((t(&x), g, t(&m), t(&v), x));
        }
        let back = |s: &B::Storage| b.download(s).unwrap().to_f64_vec();
        let mut moments: Vec<(B::Storage, B::Storage)> =
            ts.iter().map(|t| (t.2.storage().clone(), t.3.storage().clone())).collect();
        // the fifth parameter's moments stay held by their tensors too
        let held = (back(ts[4].2.storage()), back(ts[4].3.storage()));
        let kept: Vec<_> =
            ts.into_iter().enumerate().map(|(i, (x, g, m, v, x0))| (x, g, (i == 4).then_some((m, v)), x0)).collect();
        let mut items: Vec<AdamMasterItem<'_, B::Storage>> = kept
            .iter()
            .zip(moments.iter_mut())
            .zip(sizes)
            .map(|(((x, g, _, _), (m, v)), n)| AdamMasterItem { x: x.storage(), g: g.storage(), m, v, n })
            .collect();
        let out = b.adamw_master_many(&mut items, &h, gscale, copy).unwrap();
        drop(items);
        assert_eq!(out.len(), sizes.len());
        for (i, ((nx, c), (m, v))) in out.iter().zip(&moments).enumerate() {
            let what =
                format!("adamw_master_many parameter {i} of {} ({:?} gradient, {copy:?} copy)", sizes[i], gdt(i));
            assert_eq!(b.storage_dtype(nx), DType::F32, "{what}: the master's dtype");
            assert_eq!(b.storage_dtype(c), copy, "{what}: the copy's dtype");
            let got = back(nx);
            assert_close(&got, &want[i].0, 1e-5, &format!("{what}: master"));
            assert_close(&back(m), &want[i].1, 1e-5, &format!("{what}: first moment"));
            assert_close(&back(v), &want[i].2, 1e-5, &format!("{what}: second moment"));
            let rounded: Vec<f64> = got.iter().map(|&e| rounded_to(e, copy)).collect();
            assert_close(&back(c), &rounded, 0.0, &format!("{what}: the copy is the rounded master"));
            assert_close(&back(kept[i].0.storage()), &kept[i].3, 0.0, &format!("{what}: the input master"));
        }
        let (m4, v4) = kept[4].2.as_ref().expect("kept");
        assert_close(&back(m4.storage()), &held.0, 0.0, "a shared first moment's other holder");
        assert_close(&back(v4.storage()), &held.1, 0.0, "a shared second moment's other holder");
    }
}

/// [`Backend::sum_squares_many`] over tensors of several sizes, shapes and dtypes (an empty
/// one among them) against the f64 sum of the stored values; no tensor at all sums to 0.
pub fn sum_squares_many_value<B: Backend>(b: &B) {
    let half = if b.supports(DType::BF16) { DType::BF16 } else { DType::F32 };
    let shapes: [&[usize]; 6] = [&[0], &[1], &[3, 5], &[64, 1000], &[40_003], &[7, 11, 13]];
    let dts = [DType::F32, half, DType::F32, half, check_dtype(b), DType::F32];
    let ts: Vec<_> = shapes
        .iter()
        .zip(dts)
        .enumerate()
        .map(|(i, (s, dt))| {
            let n: usize = s.iter().product();
            tensor(b, &values(n, 31 + i as u64, -3.0, 3.0), Shape::from(s.to_vec()), dt)
        })
        .collect();
    let want: f64 = ts.iter().flat_map(|t| b.download(t.storage()).unwrap().to_f64_vec()).map(|v| v * v).sum();
    let xs: Vec<(&B::Storage, &Shape)> = ts.iter().map(|t| (t.storage(), t.shape())).collect();
    let got = b.download(&b.sum_squares_many(&xs).unwrap()).unwrap().to_f64_vec();
    let tol = if b.supports(DType::F64) { 1e-12 } else { 1e-5 };
    assert_close(&got, &[want], tol, "sum_squares_many");
    let none = b.download(&b.sum_squares_many(&[]).unwrap()).unwrap().to_f64_vec();
    assert_eq!(none, vec![0.0], "the sum of squares of no tensor");
}
