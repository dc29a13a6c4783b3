//! Attention family: scaled-dot-product attention with causal and padding masks,
//! grouped-query heads and KV-cache offsets.

use crate::check::{assert_close, check_dtype, grad_check, tensor, tol, values};
use crate::reference as r;
use redco_core::ops::attention::{causal_mask, mask_fill};
use redco_core::{no_grad, Backend, DType, Error, HostData, Shape, Tensor};

/// One attention case: sizes `(batch, q_heads, kv_heads, q_len, kv_len, head_dim)`,
/// causal, and the padding keep-mask `[batch * kv_len]` if any.
struct Case {
    dims: (usize, usize, usize, usize, usize, usize),
    causal: bool,
    pad: Option<Vec<u8>>,
}

impl Case {
    fn new(dims: (usize, usize, usize, usize, usize, usize), causal: bool, padded: bool) -> Self {
        let (b, _, _, _, tk, _) = dims;
        // batch entry i has i left-padding positions (entry 0 is unpadded)
        let pad = padded.then(|| (0..b * tk).map(|p| ((p % tk) >= (p / tk).min(tk)) as u8).collect());
        Case { dims, causal, pad }
    }
    fn shapes(&self) -> (Shape, Shape) {
        let (b, hq, hk, tq, tk, d) = self.dims;
        (Shape::new([b, hq, tq, d]), Shape::new([b, hk, tk, d]))
    }
    fn mask<B: Backend>(&self, be: &B) -> Option<Tensor<B>> {
        let (b, _, _, _, tk, _) = self.dims;
        self.pad.as_ref().map(|p| Tensor::from_host(be, &HostData::U8(p.clone()), [b, 1, 1, tk]).unwrap())
    }
    fn name(&self) -> String {
        format!("{:?} causal {} padded {}", self.dims, self.causal, self.pad.is_some())
    }
}

fn cases() -> Vec<Case> {
    vec![
        Case::new((2, 2, 2, 5, 5, 4), true, false),
        Case::new((3, 2, 2, 4, 6, 4), false, true),
        Case::new((3, 2, 2, 5, 5, 3), true, true),
        Case::new((1, 4, 2, 3, 3, 4), true, false),
        Case::new((2, 8, 2, 4, 4, 2), false, true),
        Case::new((2, 4, 1, 3, 7, 5), true, true),
        Case::new((2, 2, 1, 1, 6, 4), true, true),
        Case::new((1, 3, 3, 2, 9, 8), true, false),
        Case::new((2, 1, 1, 7, 7, 16), false, false),
    ]
}

/// Values against the f64 reference (masked scores take `mask_fill(dtype)`), for causal,
/// padding, both, grouped-query heads (2x and 4x) and q_len < kv_len; through the
/// recorded path (variables) and the fused no-grad path.
pub fn attention_values<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    for (ci, c) in cases().iter().enumerate() {
        let (qs, ks) = c.shapes();
        let (q, k, v) = (
            values(qs.elem_count(), 1 + ci as u64, -1.0, 1.0),
            values(ks.elem_count(), 2, -1.0, 1.0),
            values(ks.elem_count(), 3, -1.0, 1.0),
        );
        for scale in [1.0 / (c.dims.5 as f64).sqrt(), 0.7] {
            let e = r::attention(&q, &k, &v, c.dims, c.pad.as_deref(), c.causal, scale, mask_fill(dt));
            let (qt, kt, vt) =
                (tensor(b, &q, qs.clone(), dt), tensor(b, &k, ks.clone(), dt), tensor(b, &v, ks.clone(), dt));
            let mask = c.mask(b);
            let fused = qt.attention(&kt, &vt, mask.as_ref(), c.causal, scale).unwrap();
            assert_eq!(fused.dims(), qs.dims());
            assert!(!fused.requires_grad());
            assert_close(&fused.to_vec_f64().unwrap(), &e, tol(dt), &format!("{} scale {scale} (fused)", c.name()));
            let qv = qt.clone().into_var();
            let recorded = qv.attention(&kt, &vt, mask.as_ref(), c.causal, scale).unwrap();
            assert!(recorded.requires_grad());
            assert_close(
                &recorded.to_vec_f64().unwrap(),
                &fused.to_vec_f64().unwrap(),
                tol(dt),
                &format!("{} recorded == fused", c.name()),
            );
            let under_no_grad = no_grad(|| qv.attention(&kt, &vt, mask.as_ref(), c.causal, scale).unwrap());
            assert!(!under_no_grad.requires_grad());
            assert_close(&under_no_grad.to_vec_f64().unwrap(), &e, tol(dt), &format!("{} under no_grad", c.name()));
        }
    }
}

/// A row whose keys are all masked (a fully padded batch entry, with and without causal)
/// gives finite numbers: the uniform average of the values, never NaN.
pub fn attention_fully_masked<B: Backend>(b: &B) {
    let mut dts = vec![check_dtype(b), DType::F32];
    dts.dedup();
    for dt in dts {
        for causal in [false, true] {
            let dims = (2, 2, 1, 3, 4, 4);
            let pad: Vec<u8> = [[0u8; 4], [1, 1, 0, 1]].concat();
            let (qs, ks) = (Shape::new([2, 2, 3, 4]), Shape::new([2, 1, 4, 4]));
            let (q, k, v) = (values(48, 4, -1.0, 1.0), values(32, 5, -1.0, 1.0), values(32, 6, -1.0, 1.0));
            let mask = Tensor::from_host(b, &HostData::U8(pad.clone()), [2, 1, 1, 4]).unwrap();
            let y = tensor(b, &q, qs, dt)
                .attention(&tensor(b, &k, ks.clone(), dt), &tensor(b, &v, ks, dt), Some(&mask), causal, 0.5)
                .unwrap();
            let y = y.to_vec_f64().unwrap();
            assert!(y.iter().all(|x| x.is_finite()), "{dt:?} causal {causal}: {y:?}");
            let e = r::attention(&q, &k, &v, dims, Some(&pad), causal, 0.5, mask_fill(dt));
            assert_close(&y, &e, tol(dt), &format!("fully masked {dt:?} causal {causal}"));
            // batch 0 attends uniformly to its 4 (padded) keys
            let mean: Vec<f64> = (0..4).map(|e| (0..4).map(|j| v[j * 4 + e]).sum::<f64>() / 4.0).collect();
            assert_close(&y[..4], &mean, tol(dt), "uniform average");
        }
    }
    // gradients through a fully masked row stay finite
    let q = tensor(b, &values(48, 4, -1.0, 1.0), [2, 2, 3, 4], DType::F32).into_var();
    let kv = tensor(b, &values(32, 5, -1.0, 1.0), [2, 1, 4, 4], DType::F32).into_var();
    let mask = Tensor::from_host(b, &HostData::U8([[0u8; 4], [1; 4]].concat()), [2, 1, 1, 4]).unwrap();
    let g = q.attention(&kv, &kv, Some(&mask), true, 0.5).unwrap().sum_all().unwrap().backward().unwrap();
    for t in [&q, &kv] {
        assert!(g.get(t).unwrap().to_vec_f64().unwrap().iter().all(|x| x.is_finite()));
    }
}

/// A general keep-mask broadcast from `[q_len, kv_len]` equals the causal flag; f16/bf16
/// attention agrees with the reference on the stored values.
pub fn attention_masks_and_half<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let (qs, ks) = (Shape::new([2, 2, 3, 4]), Shape::new([2, 2, 5, 4]));
    let (q, k, v) = (
        tensor(b, &values(48, 7, -1.0, 1.0), qs.clone(), dt),
        tensor(b, &values(80, 8, -1.0, 1.0), ks.clone(), dt),
        tensor(b, &values(80, 9, -1.0, 1.0), ks, dt),
    );
    let cm = causal_mask(b, 3, 5).unwrap();
    let a = q.attention(&k, &v, Some(&cm), false, 0.5).unwrap();
    let c = q.attention(&k, &v, None, true, 0.5).unwrap();
    assert_close(&a.to_vec_f64().unwrap(), &c.to_vec_f64().unwrap(), tol(dt), "[q_len, kv_len] mask == causal");
    for h in [DType::F16, DType::BF16] {
        if !b.supports(h) {
            continue;
        }
        let c = Case::new((2, 4, 2, 3, 6, 8), true, true);
        let (qs, ks) = c.shapes();
        let (qh, kh, vh) = (
            tensor(b, &values(qs.elem_count(), 10, -1.0, 1.0), qs, h),
            tensor(b, &values(ks.elem_count(), 11, -1.0, 1.0), ks.clone(), h),
            tensor(b, &values(ks.elem_count(), 12, -1.0, 1.0), ks, h),
        );
        let y = qh.attention(&kh, &vh, c.mask(b).as_ref(), true, 0.35).unwrap();
        assert_eq!(y.dtype(), h);
        let f = |t: &Tensor<B>| t.to_vec_f64().unwrap();
        let e = r::attention(&f(&qh), &f(&kh), &f(&vh), c.dims, c.pad.as_deref(), true, 0.35, mask_fill(h));
        assert_close(&f(&y), &e, tol(h), &format!("{h:?} attention"));
    }
}

/// Sizes beyond one block of a fused kernel: many queries per kv head (blocks spanning two
/// query heads), keys over several tiles with a ragged last one, single-query decoding,
/// head dims up to 128, a general `[batch, 1, q_len, kv_len]` keep-mask, and causal rows
/// whose visible keys are all padding (uniform over every key, the causally hidden too).
pub fn attention_long<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let fill = mask_fill(dt);
    // (dims, causal, left padding of batch entry 1)
    let cases = [
        ((2, 4, 2, 70, 100, 16), true, 7),
        ((2, 4, 2, 70, 100, 16), false, 30),
        ((2, 8, 2, 1, 77, 64), true, 5),
        ((1, 2, 2, 33, 33, 128), true, 0),
        ((2, 2, 1, 40, 40, 8), true, 10),
    ];
    for (ci, (dims, causal, lead)) in cases.into_iter().enumerate() {
        let (bs, hq, hk, tq, tk, d) = dims;
        let pad: Vec<u8> = (0..bs * tk).map(|p| (p / tk == 0 || p % tk >= lead) as u8).collect();
        let (qs, ks) = (Shape::new([bs, hq, tq, d]), Shape::new([bs, hk, tk, d]));
        let seed = 100 + 3 * ci as u64;
        let (q, k, v) = (
            values(qs.elem_count(), seed, -1.0, 1.0),
            values(ks.elem_count(), seed + 1, -1.0, 1.0),
            values(ks.elem_count(), seed + 2, -1.0, 1.0),
        );
        let scale = 1.0 / (d as f64).sqrt();
        let e = r::attention(&q, &k, &v, dims, Some(&pad), causal, scale, fill);
        let mask = Tensor::from_host(b, &HostData::U8(pad), [bs, 1, 1, tk]).unwrap();
        let y = tensor(b, &q, qs.clone(), dt)
            .attention(&tensor(b, &k, ks.clone(), dt), &tensor(b, &v, ks.clone(), dt), Some(&mask), causal, scale)
            .unwrap();
        assert_close(&y.to_vec_f64().unwrap(), &e, tol(dt), &format!("{dims:?} causal {causal} padding {lead}"));
    }
    // a general keep-mask per (batch, query, key), one query of batch 0 seeing nothing
    let dims = (2, 4, 2, 9, 45, 32);
    let (bs, hq, hk, tq, tk, d) = dims;
    let keep: Vec<u8> = (0..bs * tq * tk)
        .map(|p| {
            let (bi, i, j) = (p / (tq * tk), p / tk % tq, p % tk);
            ((bi != 0 || i != 3) && (j * 7 + i * 3 + bi) % 5 != 0) as u8
        })
        .collect();
    let (qs, ks) = (Shape::new([bs, hq, tq, d]), Shape::new([bs, hk, tk, d]));
    let (q, k, v) = (
        values(qs.elem_count(), 120, -1.0, 1.0),
        values(ks.elem_count(), 121, -1.0, 1.0),
        values(ks.elem_count(), 122, -1.0, 1.0),
    );
    let e = r::attention_with(&q, &k, &v, dims, |bi, _, i, j| keep[(bi * tq + i) * tk + j] != 0, 0.3, fill);
    let mask = Tensor::from_host(b, &HostData::U8(keep), [bs, 1, tq, tk]).unwrap();
    let y = tensor(b, &q, qs, dt)
        .attention(&tensor(b, &k, ks.clone(), dt), &tensor(b, &v, ks, dt), Some(&mask), false, 0.3)
        .unwrap();
    assert_close(&y.to_vec_f64().unwrap(), &e, tol(dt), "general [batch, 1, q_len, kv_len] keep-mask");
}

/// Gradients with respect to q, k and v with causal and padding masks, grouped-query
/// heads and q_len < kv_len.
pub fn attention_grads<B: Backend>(b: &B) {
    for c in [
        Case::new((2, 4, 2, 3, 4, 2), true, true),
        Case::new((1, 2, 1, 2, 5, 3), true, false),
        Case::new((2, 2, 2, 3, 3, 2), false, true),
    ] {
        let (qs, ks) = c.shapes();
        let mask = c.mask(b);
        grad_check(
            b,
            &[
                (values(qs.elem_count(), 13, -1.0, 1.0), qs),
                (values(ks.elem_count(), 14, -1.0, 1.0), ks.clone()),
                (values(ks.elem_count(), 15, -1.0, 1.0), ks),
            ],
            |t| t[0].attention(&t[1], &t[2], mask.as_ref(), c.causal, 0.6),
            1e-6,
            &format!("attention grad {}", c.name()),
        );
    }
}

/// Shapes that do not fit together, a causal q_len > kv_len, and non-U8 or
/// non-broadcastable masks are errors.
pub fn attention_errors<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let t = |dims: &[usize]| tensor(b, &values(dims.iter().product(), 1, 0.0, 1.0), dims.to_vec(), dt);
    let (q, k) = (t(&[2, 4, 3, 8]), t(&[2, 2, 5, 8]));
    let ok = |q: &Tensor<B>, k: &Tensor<B>, v: &Tensor<B>| q.attention(k, v, None, false, 1.0).is_ok();
    assert!(ok(&q, &k, &k));
    assert!(!ok(&t(&[4, 3, 8]), &k, &k), "q of rank 3");
    assert!(!ok(&q, &k, &t(&[2, 2, 6, 8])), "k and v differ");
    assert!(
        matches!(q.attention(&t(&[2, 3, 5, 8]), &t(&[2, 3, 5, 8]), None, false, 1.0), Err(Error::ShapeMismatch { .. })),
        "4 heads over 3"
    );
    assert!(
        matches!(q.attention(&t(&[2, 2, 5, 4]), &t(&[2, 2, 5, 4]), None, false, 1.0), Err(Error::ShapeMismatch { .. })),
        "head_dim"
    );
    assert!(
        matches!(q.attention(&t(&[1, 2, 5, 8]), &t(&[1, 2, 5, 8]), None, false, 1.0), Err(Error::ShapeMismatch { .. })),
        "batch"
    );
    assert!(t(&[2, 4, 6, 8]).attention(&k, &k, None, true, 1.0).is_err(), "causal with q_len 6 > kv_len 5");
    let fmask = t(&[2, 1, 1, 5]);
    assert!(matches!(q.attention(&k, &k, Some(&fmask), false, 1.0), Err(Error::UnsupportedDType { .. })), "float mask");
    let m =
        |dims: &[usize]| Tensor::from_host(b, &HostData::U8(vec![1; dims.iter().product()]), dims.to_vec()).unwrap();
    assert!(q.attention(&k, &k, Some(&m(&[2, 1, 1, 5])), false, 1.0).is_ok());
    assert!(q.attention(&k, &k, Some(&m(&[2, 1, 1, 6])), false, 1.0).is_err(), "mask kv_len 6");
    assert!(q.attention(&k, &k, Some(&m(&[3, 1, 1, 5])), false, 1.0).is_err(), "mask batch 3");
    assert!(q.attention(&k, &k, Some(&m(&[2, 2, 4, 3, 5])), false, 1.0).is_err(), "mask of rank 5");
    assert!(matches!(
        q.attention(&k.cast(DType::F16).unwrap(), &k, None, false, 1.0),
        Err(Error::DTypeMismatch { .. })
    ));
}

/// Paged attention of a ragged batch (three sequences: a decode token, a prefill chunk and
/// a short prompt, their keys and values in scattered rows of one pool, grouped-query
/// heads) equals the f64 reference of each sequence's attention over its keys held
/// contiguously; segments that do not tile the batch, or rows outside the pool, are refused.
pub fn paged_attention_values<B: Backend>(b: &B) {
    use redco_core::ops::paged_attention::PagedSegment;
    let dt = check_dtype(b);
    let (heads, kvh, d, rows) = (4usize, 2usize, 8usize, 64usize);
    // the last: a long prefill chunk (its rows span several workgroups of a device kernel,
    // its keys several tiles), over rows scattered across the pool
    let segs = [
        PagedSegment { q_start: 0, q_len: 1, slots: vec![3, 17, 8, 0, 21] },
        PagedSegment { q_start: 1, q_len: 3, slots: vec![5, 6, 7, 12, 1, 2, 9] },
        PagedSegment { q_start: 4, q_len: 2, slots: vec![20, 4] },
        PagedSegment { q_start: 6, q_len: 40, slots: (0..70).map(|i| (i * 37 + 11) % rows).collect() },
    ];
    let t = 46;
    let (q, k, v) = (
        values(heads * t * d, 11, -1.0, 1.0),
        values(rows * kvh * d, 12, -1.0, 1.0),
        values(rows * kvh * d, 13, -1.0, 1.0),
    );
    let qt = tensor(b, &q, [1, heads, t, d], dt);
    let (kt, vt) = (tensor(b, &k, [rows, kvh, d], dt), tensor(b, &v, [rows, kvh, d], dt));
    // the reference sees the values the backend holds (16-bit dtypes round them)
    let (q, k, v) = (qt.to_vec_f64().unwrap(), kt.to_vec_f64().unwrap(), vt.to_vec_f64().unwrap());
    let scale = 1.0 / (d as f64).sqrt();
    let got = qt.paged_attention(&kt, &vt, &segs, scale).unwrap().to_vec_f64().unwrap();
    for s in &segs {
        let len = s.slots.len();
        // the segment's queries [1, heads, q_len, d] and keys, values [1, kvh, len, d]
        let mut qs = Vec::new();
        for h in 0..heads {
            qs.extend_from_slice(&q[(h * t + s.q_start) * d..(h * t + s.q_start + s.q_len) * d]);
        }
        let gather = |pool: &[f64]| {
            let mut out = Vec::new();
            for hh in 0..kvh {
                for &r in &s.slots {
                    out.extend_from_slice(&pool[(r * kvh + hh) * d..(r * kvh + hh + 1) * d]);
                }
            }
            out
        };
        let e = r::attention(
            &qs,
            &gather(&k),
            &gather(&v),
            (1, heads, kvh, s.q_len, len, d),
            None,
            true,
            scale,
            mask_fill(dt),
        );
        for h in 0..heads {
            let at = (h * t + s.q_start) * d;
            let mine = &got[at..at + s.q_len * d];
            let want = &e[h * s.q_len * d..(h + 1) * s.q_len * d];
            assert_close(mine, want, tol(dt), &format!("paged attention, segment at {}, head {h}", s.q_start));
        }
    }
    // a 16-bit cache under wider queries: the pools' values widened where they are read,
    // the output in the queries' dtype, as over the pools widened beforehand
    for half in [DType::BF16, DType::F16] {
        if !b.supports(half) {
            continue;
        }
        let (kh, vh) = (kt.cast(half).unwrap(), vt.cast(half).unwrap());
        let got = qt.paged_attention(&kh, &vh, &segs, scale).unwrap();
        assert_eq!(got.dtype(), dt, "{half:?} pools");
        let want = qt.paged_attention(&kh.cast(dt).unwrap(), &vh.cast(dt).unwrap(), &segs, scale).unwrap();
        let what = format!("paged attention over {half:?} pools");
        assert_close(&got.to_vec_f64().unwrap(), &want.to_vec_f64().unwrap(), tol(dt), &what);
    }
    let gap = [PagedSegment { q_start: 1, ..segs[0].clone() }, segs[1].clone(), segs[2].clone(), segs[3].clone()];
    assert!(qt.paged_attention(&kt, &vt, &gap, scale).is_err(), "segments must tile the batch");
    let outside =
        [PagedSegment { slots: vec![3, rows], ..segs[0].clone() }, segs[1].clone(), segs[2].clone(), segs[3].clone()];
    assert!(qt.paged_attention(&kt, &vt, &outside, scale).is_err(), "a row outside the pool");
    assert!(qt.paged_attention(&kt, &vt, &segs[..3], scale).is_err(), "the batch not covered");
}
