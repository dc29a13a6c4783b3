//! Cross-entropy family: per-token and mean cross-entropy with an ignore index.

use crate::check::{assert_close, check_dtype, grad_check, ids, tensor, tol, values};
use crate::{reference as r, strategies as st};
use redco_core::{Backend, DType, Error, Shape, Tensor};

const IGNORE: i64 = -100;

/// Targets in `0..v`, every third one (from `skew`) ignored.
fn targets(n: usize, v: usize, seed: u64, skew: usize) -> Vec<i64> {
    values(n, seed, 0.0, v as f64)
        .iter()
        .enumerate()
        .map(|(i, &x)| if (i + skew).is_multiple_of(3) { IGNORE } else { (x as i64).min(v as i64 - 1) })
        .collect()
}

/// Per-token values and the mean over non-ignored tokens, for logits `[b, t, v]` and
/// targets `[b, t]` of random sizes.
pub fn cross_entropy_values<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let case = (1..=3usize, 1..=5usize, 1..=9usize, 0..3usize);
    st::run(16, case, |(bs, t, v, skew)| {
        let n = bs * t;
        let x = values(n * v, 1, -4.0, 4.0);
        let tg = targets(n, v, 2, skew);
        let logits = tensor(b, &x, [bs, t, v], dt);
        let tt = ids(b, &tg, [bs, t]);
        let per = logits.cross_entropy_per_token(&tt, IGNORE).unwrap();
        assert_eq!(per.dims(), &[bs, t]);
        let e = r::cross_entropy(&x, v, &tg, IGNORE);
        let what = format!("[{bs}, {t}, {v}] targets {tg:?}");
        assert_close(&per.to_vec_f64().unwrap(), &e, tol(dt), &format!("per-token {what}"));
        let count = tg.iter().filter(|&&t| t != IGNORE).count();
        let mean = logits.cross_entropy(&tt, IGNORE).unwrap();
        assert_eq!(mean.rank(), 0);
        let want = if count == 0 { 0.0 } else { e.iter().sum::<f64>() / count as f64 };
        assert_close(&[mean.to_scalar().unwrap()], &[want], tol(dt), &format!("mean {what}"));
    });
    // another ignore index, and I32 targets
    let x = values(4 * 5, 3, -2.0, 2.0);
    let tg = [0i64, 3, 0, 4];
    let per = tensor(b, &x, [4, 5], dt)
        .cross_entropy_per_token(&Tensor::from_vec(b, tg.map(|v| v as i32).to_vec(), [4]).unwrap(), 0)
        .unwrap();
    assert_close(&per.to_vec_f64().unwrap(), &r::cross_entropy(&x, 5, &tg, 0), tol(dt), "ignore index 0, I32 targets");
}

/// Logits of magnitude 1000 stay finite, in the check dtype and in f32; f16/bf16 work.
pub fn cross_entropy_large_and_half<B: Backend>(b: &B) {
    let x = [1000.0, -1000.0, 999.0, -1000.0, -999.0, 1000.0, 0.0, 1000.0, -1000.0];
    let tg = [1i64, 2, 0];
    let mut dts = vec![check_dtype(b), DType::F32];
    dts.dedup();
    for dt in dts {
        let per = tensor(b, &x, [3, 3], dt).cross_entropy_per_token(&ids(b, &tg, [3]), IGNORE).unwrap();
        let y = per.to_vec_f64().unwrap();
        assert!(y.iter().all(|v| v.is_finite()), "{dt:?}: {y:?}");
        assert_close(&y, &r::cross_entropy(&x, 3, &tg, IGNORE), tol(dt), &format!("large logits {dt:?}"));
    }
    for dt in [DType::F16, DType::BF16] {
        if !b.supports(dt) {
            continue;
        }
        let l = tensor(b, &values(4 * 50, 4, -3.0, 3.0), [4, 50], dt);
        let tg = [3i64, IGNORE, 49, 0];
        let per = l.cross_entropy_per_token(&ids(b, &tg, [4]), IGNORE).unwrap();
        assert_eq!(per.dtype(), dt);
        assert_close(
            &per.to_vec_f64().unwrap(),
            &r::cross_entropy(&l.to_vec_f64().unwrap(), 50, &tg, IGNORE),
            tol(dt),
            &format!("{dt:?}"),
        );
    }
}

/// Vocabularies shorter and longer than a backend's workgroup (1 to 256 lanes per row,
/// several rows per workgroup, rows beyond 1024 logits), and an ignore index beyond i32.
pub fn cross_entropy_long_rows<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    for (i, (n, v)) in [(300, 3), (7, 100), (9, 300), (3, 1000), (4, 5000)].into_iter().enumerate() {
        let x = values(n * v, 40 + i as u64, -8.0, 8.0);
        let tg = targets(n, v, 50 + i as u64, i);
        let per = tensor(b, &x, [n, v], dt).cross_entropy_per_token(&ids(b, &tg, [n]), IGNORE).unwrap();
        let e = r::cross_entropy(&x, v, &tg, IGNORE);
        assert_close(&per.to_vec_f64().unwrap(), &e, tol(dt), &format!("[{n}, {v}]"));
    }
    let far = 1i64 << 40;
    let x = values(4 * 700, 60, -3.0, 3.0);
    let tg = [699i64, far, 0, far];
    let per = tensor(b, &x, [4, 700], dt).cross_entropy_per_token(&ids(b, &tg, [4]), far).unwrap();
    assert_close(&per.to_vec_f64().unwrap(), &r::cross_entropy(&x, 700, &tg, far), tol(dt), "ignore index 2^40");
}

/// When every target is ignored the mean is exactly 0 and its gradient is finite (zero).
pub fn cross_entropy_all_ignored<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let l = tensor(b, &values(2 * 3 * 4, 5, -2.0, 2.0), [2, 3, 4], dt).into_var();
    let tt = ids(b, &[IGNORE; 6], [2, 3]);
    let mean = l.cross_entropy(&tt, IGNORE).unwrap();
    assert_eq!(mean.to_scalar().unwrap(), 0.0);
    assert_eq!(l.cross_entropy_per_token(&tt, IGNORE).unwrap().to_vec_f64().unwrap(), vec![0.0; 6]);
    let g = mean.backward().unwrap().get(&l).unwrap().to_vec_f64().unwrap();
    assert_eq!(g, vec![0.0; 24]);
}

/// Gradients of the per-token values and of the mean, with ignored tokens.
pub fn cross_entropy_grads<B: Backend>(b: &B) {
    let tt = ids(b, &[2, IGNORE, 0, 4, 4, IGNORE], [2, 3]);
    let x = (values(2 * 3 * 5, 6, -2.0, 2.0), Shape::new([2, 3, 5]));
    grad_check(b, std::slice::from_ref(&x), |t| t[0].cross_entropy_per_token(&tt, IGNORE), 1e-6, "per-token");
    grad_check(b, std::slice::from_ref(&x), |t| t[0].cross_entropy(&tt, IGNORE), 1e-6, "mean");
    grad_check(b, &[x], |t| redco_core::nn::cross_entropy(&t[0], &tt), 1e-6, "nn::cross_entropy");
    let t1 = ids(b, &[1, 0, 1], [3]);
    grad_check(
        b,
        &[(values(6, 7, -1.0, 1.0), Shape::new([3, 2]))],
        |t| t[0].cross_entropy(&t1, IGNORE),
        1e-6,
        "rank 2 logits",
    );
}

/// Targets outside the vocabulary (including negative ones other than the ignore index)
/// are `Error::IndexOutOfRange`; shapes and dtypes are checked.
pub fn cross_entropy_errors<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let l = tensor(b, &values(2 * 2 * 5, 1, 0.0, 1.0), [2, 2, 5], dt);
    for bad in [5i64, 1000, -1, -101] {
        let tt = ids(b, &[0, bad, 1, 2], [2, 2]);
        match l.cross_entropy(&tt, IGNORE) {
            Err(Error::IndexOutOfRange { index, size, .. }) => assert_eq!((index, size), (bad, 5), "target {bad}"),
            other => panic!("target {bad}: expected IndexOutOfRange, got {other:?}"),
        }
        assert!(matches!(l.cross_entropy_per_token(&tt, IGNORE), Err(Error::IndexOutOfRange { .. })));
    }
    assert!(
        matches!(l.cross_entropy(&ids(b, &[0; 4], [4]), IGNORE), Err(Error::ShapeMismatch { .. })),
        "targets [4] for [2,2,5]"
    );
    assert!(
        matches!(l.cross_entropy(&ids(b, &[0; 2], [2]), IGNORE), Err(Error::ShapeMismatch { .. })),
        "targets [2] for [2,2,5]"
    );
    let ft = tensor(b, &[0.0; 4], [2, 2], dt);
    assert!(matches!(l.cross_entropy(&ft, IGNORE), Err(Error::UnsupportedDType { .. })), "float targets");
    let il = l.cast(DType::I64).unwrap();
    assert!(
        matches!(il.cross_entropy(&ids(b, &[0; 4], [2, 2]), IGNORE), Err(Error::UnsupportedDType { .. })),
        "integer logits"
    );
}
