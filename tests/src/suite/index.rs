//! Index family: index_select (embedding lookup), index_add, gather, scatter_add.

use crate::check::{assert_close, check_dtype, grad_check, ids, tensor, tol, values};
use crate::{reference as r, strategies as st};
use proptest::prelude::*;
use redco_core::{Backend, DType, Error, Shape, Tensor};

/// `n` pseudo-random ids in `0..size` (repeats likely).
fn rand_ids(n: usize, size: usize, seed: u64) -> Vec<i64> {
    values(n, seed, 0.0, size as f64).into_iter().map(|v| (v as i64).min(size as i64 - 1)).collect()
}

/// A shape and a dim of it.
fn dim_case() -> impl Strategy<Value = (Vec<usize>, usize)> {
    st::shape(3, 5).prop_flat_map(|dims| {
        let r = dims.len();
        (Just(dims), 0..r)
    })
}

/// Reference gather: `out[p] = x[p with dim d replaced by idx[p]]`.
fn gather_ref(x: &[f64], dims: &[usize], d: usize, idx: &[i64], idims: &[usize]) -> Vec<f64> {
    (0..idx.len())
        .map(|p| {
            let mut i = r::unravel(p, idims);
            i[d] = idx[p] as usize;
            x[r::ravel(&i, dims)]
        })
        .collect()
}

/// Reference scatter_add: `out = x; out[p with dim d replaced by idx[p]] += src[p]`.
fn scatter_add_ref(x: &[f64], dims: &[usize], d: usize, idx: &[i64], idims: &[usize], src: &[f64]) -> Vec<f64> {
    let mut out = x.to_vec();
    for p in 0..idx.len() {
        let mut i = r::unravel(p, idims);
        i[d] = idx[p] as usize;
        out[r::ravel(&i, dims)] += src[p];
    }
    out
}

/// index_select along any dim with repeated ids of rank 1 or 2 (I64 and I32).
pub fn index_select_values<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let case = (dim_case(), prop::collection::vec(1..=4usize, 1..=2));
    st::run(16, case, |((dims, d), id_dims)| {
        let x = values(dims.iter().product(), 1, -1.0, 1.0);
        let id = rand_ids(id_dims.iter().product(), dims[d], 2);
        let t = tensor(b, &x, dims.clone(), dt);
        let (outer, size, inner) = r::split(&dims, d);
        let mut e = Vec::new();
        for o in 0..outer {
            for &i in &id {
                e.extend_from_slice(&x[(o * size + i as usize) * inner..(o * size + i as usize + 1) * inner]);
            }
        }
        let mut od = dims[..d].to_vec();
        od.extend(&id_dims);
        od.extend(&dims[d + 1..]);
        let what = format!("index_select {dims:?} dim {d} ids {id_dims:?}");
        let y = t.index_select(&ids(b, &id, id_dims.clone()), d as isize).unwrap();
        assert_eq!(y.dims(), &od[..], "{what}");
        assert_eq!(y.to_vec_f64().unwrap(), e, "{what}");
        let id32: Vec<i32> = id.iter().map(|&v| v as i32).collect();
        let y = t
            .index_select(&Tensor::from_vec(b, id32, id_dims.clone()).unwrap(), d as isize - dims.len() as isize)
            .unwrap();
        assert_eq!(y.to_vec_f64().unwrap(), e, "{what} (I32 ids, negative dim)");
    });
}

/// index_add along any dim: repeated ids accumulate.
pub fn index_add_values<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    st::run(16, (dim_case(), 1..=6usize), |((dims, d), n)| {
        let x = values(dims.iter().product(), 3, -1.0, 1.0);
        let id = rand_ids(n, dims[d], 4);
        let mut sd = dims.clone();
        sd[d] = n;
        let src = values(sd.iter().product(), 5, -1.0, 1.0);
        let y = tensor(b, &x, dims.clone(), dt)
            .index_add(&ids(b, &id, [n]), &tensor(b, &src, sd.clone(), dt), d as isize)
            .unwrap();
        let mut e = x.clone();
        for (p, v) in src.iter().enumerate() {
            let mut i = r::unravel(p, &sd);
            i[d] = id[i[d]] as usize;
            e[r::ravel(&i, &dims)] += v;
        }
        assert_eq!(y.dims(), &dims[..]);
        assert_close(&y.to_vec_f64().unwrap(), &e, tol(dt), &format!("index_add {dims:?} dim {d} ids {id:?}"));
    });
    // the same id three times adds three rows
    let y = tensor(b, &[0.0; 4], [2, 2], dt)
        .index_add(&ids(b, &[1, 1, 1], [3]), &tensor(b, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], [3, 2], dt), 0)
        .unwrap();
    assert_eq!(y.to_vec_f64().unwrap(), vec![0.0, 0.0, 9.0, 12.0]);
}

/// gather and scatter_add along any dim (index sizes differ from the input along `dim`).
pub fn gather_scatter_values<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    st::run(16, (dim_case(), 1..=5usize), |((dims, d), k)| {
        let x = values(dims.iter().product(), 6, -1.0, 1.0);
        let mut idims = dims.clone();
        idims[d] = k;
        let idx = rand_ids(idims.iter().product(), dims[d], 7);
        let it = ids(b, &idx, idims.clone());
        let t = tensor(b, &x, dims.clone(), dt);
        let what = format!("{dims:?} dim {d} index {idims:?}");
        let g = t.gather(&it, d as isize).unwrap();
        assert_eq!(g.dims(), &idims[..]);
        assert_eq!(g.to_vec_f64().unwrap(), gather_ref(&x, &dims, d, &idx, &idims), "gather {what}");
        let src = values(idx.len(), 8, -1.0, 1.0);
        let s = t.scatter_add(&it, &tensor(b, &src, idims.clone(), dt), d as isize).unwrap();
        assert_eq!(s.dims(), &dims[..]);
        assert_close(
            &s.to_vec_f64().unwrap(),
            &scatter_add_ref(&x, &dims, d, &idx, &idims, &src),
            tol(dt),
            &format!("scatter_add {what}"),
        );
    });
}

/// Gradients with repeated ids: index_select and gather accumulate into the input,
/// index_add and scatter_add pass the gradient through and gather it for the source.
pub fn index_grads<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let x = values(12, 9, -1.0, 1.0);
    for (d, id, id_dims) in
        [(0isize, vec![2, 0, 2, 2], vec![4]), (1, vec![3, 3, 0, 1, 3, 2], vec![2, 3]), (-1, vec![1], vec![1])]
    {
        let it = ids(b, &id, id_dims);
        grad_check(
            b,
            &[(x.clone(), Shape::new([3, 4]))],
            |t| t[0].index_select(&it, d),
            1e-6,
            &format!("index_select dim {d}"),
        );
    }
    let it = ids(b, &[1, 0, 1, 1, 2], [5]);
    grad_check(
        b,
        &[(x.clone(), Shape::new([4, 3])), (values(20, 10, -1.0, 1.0), Shape::new([4, 5]))],
        |t| t[0].index_add(&it, &t[1], 1),
        1e-6,
        "index_add",
    );
    let idx = ids(b, &[0, 0, 2, 1, 2, 2, 2, 0], [2, 4]);
    grad_check(b, &[(x.clone(), Shape::new([3, 4]))], |t| t[0].gather(&idx, 0), 1e-6, "gather dim 0");
    let idx1 = ids(b, &[3, 3, 0, 1, 1, 1], [3, 2]);
    grad_check(b, &[(x.clone(), Shape::new([3, 4]))], |t| t[0].gather(&idx1, 1), 1e-6, "gather dim 1");
    grad_check(
        b,
        &[(x, Shape::new([3, 4])), (values(6, 11, -1.0, 1.0), Shape::new([3, 2]))],
        |t| t[0].scatter_add(&idx1, &t[1], -1),
        1e-6,
        "scatter_add",
    );
    // index_select's gradient counts repeats exactly
    let w = tensor(b, &[1.0, 2.0, 3.0], [3], dt).into_var();
    let g = w.index_select(&ids(b, &[2, 2, 0, 2], [4]), 0).unwrap().sum_all().unwrap().backward().unwrap();
    assert_eq!(g.get(&w).unwrap().to_vec_f64().unwrap(), vec![1.0, 0.0, 3.0]);
}

/// Ids outside `0..size` (too large or negative) are `Error::IndexOutOfRange` naming the
/// id and the size; non-integer ids and mismatched shapes are errors.
pub fn index_errors<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let x = tensor(b, &values(12, 1, 0.0, 1.0), [3, 4], dt);
    let expect_oob = |r: redco_core::Result<Tensor<B>>, index: i64, size: usize, what: &str| match r {
        Err(Error::IndexOutOfRange { index: i, size: s, .. }) => assert_eq!((i, s), (index, size), "{what}"),
        other => panic!("{what}: expected IndexOutOfRange, got {other:?}"),
    };
    for (bad, what) in [(3i64, "too large"), (-1, "negative"), (i64::MIN, "most negative")] {
        expect_oob(x.index_select(&ids(b, &[0, bad], [2]), 0), bad, 3, &format!("index_select {what}"));
        let src = tensor(b, &values(8, 2, 0.0, 1.0), [2, 4], dt);
        expect_oob(x.index_add(&ids(b, &[bad, 1], [2]), &src, 0), bad, 3, &format!("index_add {what}"));
        let idx = ids(b, &[0, 1, 2, bad], [1, 4]);
        expect_oob(x.gather(&idx, 0), bad, 3, &format!("gather {what}"));
        expect_oob(x.scatter_add(&idx, &tensor(b, &[1.0; 4], [1, 4], dt), 0), bad, 3, &format!("scatter_add {what}"));
    }
    expect_oob(x.index_select(&ids(b, &[4], [1]), 1), 4, 4, "index_select dim 1");
    let fids = tensor(b, &[0.0, 1.0], [2], dt);
    assert!(matches!(x.index_select(&fids, 0), Err(Error::UnsupportedDType { .. })), "float ids");
    assert!(matches!(x.gather(&fids.reshape([2, 1]).unwrap(), 1), Err(Error::UnsupportedDType { .. })));
    let u8ids = Tensor::from_vec(b, vec![0u8, 1], [2]).unwrap();
    assert!(x.index_select(&u8ids, 0).is_err(), "U8 ids");
    let src = tensor(b, &values(12, 2, 0.0, 1.0), [3, 4], dt);
    assert!(
        matches!(x.index_add(&ids(b, &[0, 1], [2]), &src, 0), Err(Error::ShapeMismatch { .. })),
        "index_add source rows"
    );
    assert!(matches!(x.gather(&ids(b, &[0, 1], [2]), 0), Err(Error::ShapeMismatch { .. })), "gather index rank");
    assert!(
        matches!(x.gather(&ids(b, &[0; 6], [2, 3]), 0), Err(Error::ShapeMismatch { .. })),
        "gather index off-dim size"
    );
    let idx = ids(b, &[0; 4], [1, 4]);
    assert!(matches!(x.scatter_add(&idx, &src, 0), Err(Error::ShapeMismatch { .. })), "scatter_add source shape");
    assert!(matches!(
        x.scatter_add(&idx, &src.cast(DType::F16).unwrap().narrow(0, 0, 1).unwrap(), 0),
        Err(Error::DTypeMismatch { .. })
    ));
    assert!(matches!(x.index_select(&ids(b, &[0], [1]), 2), Err(Error::DimOutOfRange { .. })));
}

/// `write_rows` writes the given rows and leaves the others; a tensor that shared the
/// table before the write keeps its old values; repeated, out-of-range rows, a source of
/// the wrong shape or dtype and a tensor in a gradient graph are refused.
pub fn write_rows_values<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let (n, row) = (7usize, [2usize, 3]);
    let x = values(n * 6, 3, -1.0, 1.0);
    let mut t = tensor(b, &x, [n, row[0], row[1]], dt);
    let before = t.to_vec_f64().unwrap();
    let shared = t.clone();
    let src_v = values(2 * 6, 4, -1.0, 1.0);
    let src = tensor(b, &src_v, [2, row[0], row[1]], dt);
    let src_q = src.to_vec_f64().unwrap();
    t.write_rows(&[5, 1], &src).unwrap();
    let mut e = before.clone();
    e[30..36].copy_from_slice(&src_q[..6]);
    e[6..12].copy_from_slice(&src_q[6..]);
    assert_eq!(t.to_vec_f64().unwrap(), e, "rows 5 and 1 written");
    assert_eq!(shared.to_vec_f64().unwrap(), before, "a tensor sharing the table keeps its values");
    // written again, in place where nothing else holds it now
    drop(shared);
    let one = tensor(b, &src_v[..6], [1, row[0], row[1]], dt);
    t.write_rows(&[0], &one).unwrap();
    e[..6].copy_from_slice(&src_q[..6]);
    assert_eq!(t.to_vec_f64().unwrap(), e, "row 0 written");
    t.write_rows(&[], &tensor(b, &[], [0, row[0], row[1]], dt)).unwrap();
    assert_eq!(t.to_vec_f64().unwrap(), e, "no rows: nothing changes");
    for (rows, what) in [(&[1usize, 1][..], "twice"), (&[0, 7][..], "out of range")] {
        let Err(err) = t.write_rows(rows, &src) else { panic!("rows {rows:?} ({what}) accepted") };
        assert!(matches!(err, Error::Invalid { op: "write_rows", .. }), "{err}");
    }
    assert_eq!(t.to_vec_f64().unwrap(), e, "refused writes change nothing");
    assert!(t.write_rows(&[0, 1, 2], &src).is_err(), "three rows from a source of two");
    let other = if dt == DType::F32 { DType::I64 } else { DType::F32 };
    assert!(t.write_rows(&[0, 1], &src.cast(other).unwrap()).is_err(), "another dtype");
    let var = tensor(b, &src_v, [2, row[0], row[1]], dt).into_var();
    let Err(err) = t.write_rows(&[0, 1], &var) else { panic!("a source needing a gradient was accepted") };
    assert!(matches!(err, Error::Unsupported { op: "write_rows", .. }), "{err}");
}
