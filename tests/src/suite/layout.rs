//! Layout family: reshape, permute, transpose, narrow, cat, expand, unsqueeze, squeeze.

use crate::check::{check_dtype, grad_check, tensor, values};
use crate::{reference as r, strategies as st};
use proptest::prelude::*;
use redco_core::{Backend, DType, Error, Shape, Tensor};

/// A shape and a permutation of its dims.
fn perm_case() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    st::shape(5, 5).prop_flat_map(|dims| {
        let perm: Vec<usize> = (0..dims.len()).collect();
        (Just(dims), Just(perm).prop_shuffle())
    })
}

/// The slice `start..start + len` of dim `d`, by index arithmetic.
fn narrow_ref(x: &[f64], dims: &[usize], d: usize, start: usize, len: usize) -> Vec<f64> {
    let mut od = dims.to_vec();
    od[d] = len;
    (0..od.iter().product())
        .map(|i| {
            let mut idx = r::unravel(i, &od);
            idx[d] += start;
            x[r::ravel(&idx, dims)]
        })
        .collect()
}

/// Reshape keeps the elements in order; its gradient reshapes back.
pub fn reshape_values_and_grads<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let x = values(24, 1, -1.0, 1.0);
    let t = tensor(b, &x, [2, 3, 4], dt);
    for dims in [vec![24], vec![4, 6], vec![1, 2, 1, 12, 1], vec![2, 3, 4]] {
        let y = t.reshape(dims.clone()).unwrap();
        assert_eq!(y.dims(), &dims[..]);
        assert_eq!(y.to_vec_f64().unwrap(), x);
    }
    let s = tensor(b, &[7.0], [1, 1], dt).reshape(Shape::new(vec![])).unwrap();
    assert_eq!((s.rank(), s.to_scalar().unwrap()), (0, 7.0));
    grad_check(b, &[(x, Shape::new([2, 3, 4]))], |t| t[0].reshape([4, 6])?.narrow(1, 1, 3), 1e-6, "reshape");
}

/// Random permutations (any element type) against the reference; transpose with
/// negative dims equals the swap permutation.
pub fn permute_values<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    st::run(16, perm_case(), |(dims, perm)| {
        let x = values(dims.iter().product(), 2, -1.0, 1.0);
        let y = tensor(b, &x, dims.clone(), dt).permute(&perm).unwrap();
        let od: Vec<usize> = perm.iter().map(|&p| dims[p]).collect();
        assert_eq!(y.dims(), &od[..]);
        assert_eq!(y.to_vec_f64().unwrap(), r::permute(&x, &dims, &perm), "permute {dims:?} by {perm:?}");
        // integer tensors permute the same way
        let ids: Vec<i64> = (0..x.len() as i64).collect();
        let yi = Tensor::from_vec(b, ids.clone(), dims.clone()).unwrap().permute(&perm).unwrap();
        let e: Vec<i64> = r::permute(&ids.iter().map(|&v| v as f64).collect::<Vec<_>>(), &dims, &perm)
            .iter()
            .map(|&v| v as i64)
            .collect();
        assert_eq!(yi.to_vec_i64().unwrap(), e);
    });
    let x = values(60, 3, -1.0, 1.0);
    let t = tensor(b, &x, [3, 4, 5], dt);
    for (d1, d2, perm) in [(0, 2, [2, 1, 0]), (-1, -2, [0, 2, 1]), (1, 1, [0, 1, 2]), (0, -2, [1, 0, 2])] {
        let y = t.transpose(d1, d2).unwrap();
        assert_eq!(y.to_vec_f64().unwrap(), r::permute(&x, &[3, 4, 5], &perm), "transpose({d1}, {d2})");
    }
}

/// Gradients of permute and transpose are the inverse permutation.
pub fn permute_grads<B: Backend>(b: &B) {
    let x = values(24, 4, -1.0, 1.0);
    for perm in [[1, 2, 0], [2, 0, 1], [0, 2, 1]] {
        grad_check(
            b,
            &[(x.clone(), Shape::new([2, 3, 4]))],
            |t| t[0].permute(&perm),
            1e-6,
            &format!("permute {perm:?}"),
        );
    }
    grad_check(b, &[(x, Shape::new([2, 3, 4]))], |t| t[0].transpose(-1, 0), 1e-6, "transpose");
}

/// Narrow along any dim at any start against index arithmetic; gradients pad with zeros.
pub fn narrow_values_and_grads<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let case = st::shape(4, 6).prop_flat_map(|dims| {
        let r = dims.len();
        (Just(dims), 0..r).prop_flat_map(|(dims, d)| {
            let n = dims[d];
            (Just(dims), Just(d), 0..n)
                .prop_flat_map(move |(dims, d, start)| (Just(dims), Just(d), Just(start), 0..=n - start))
        })
    });
    st::run(16, case, |(dims, d, start, len)| {
        let x = values(dims.iter().product(), 3, -1.0, 1.0);
        let y = tensor(b, &x, dims.clone(), dt).narrow(d as isize - dims.len() as isize, start, len).unwrap();
        assert_eq!(y.dims()[d], len);
        assert_eq!(
            y.to_vec_f64().unwrap(),
            narrow_ref(&x, &dims, d, start, len),
            "narrow {dims:?} dim {d} {start}+{len}"
        );
    });
    let x = values(30, 4, -1.0, 1.0);
    for (d, start, len) in [(0, 0, 1), (1, 1, 3), (2, 2, 1), (2, 0, 2), (1, 0, 5)] {
        grad_check(
            b,
            &[(x.clone(), Shape::new([2, 5, 3]))],
            |t| t[0].narrow(d, start, len),
            1e-6,
            &format!("narrow dim {d} {start}+{len}"),
        );
    }
}

/// Cat of two to four parts of different sizes along any dim; gradients split back.
pub fn cat_values_and_grads<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let case = (st::shape(4, 4), prop::collection::vec(0..4usize, 2..=4), any::<prop::sample::Index>());
    st::run(16, case, |(dims, sizes, di)| {
        let d = di.index(dims.len());
        let parts: Vec<(Vec<f64>, Vec<usize>)> = sizes
            .iter()
            .enumerate()
            .map(|(i, &s)| {
                let mut pd = dims.clone();
                pd[d] = s;
                (values(pd.iter().product(), 10 + i as u64, -1.0, 1.0), pd)
            })
            .collect();
        let ts: Vec<Tensor<B>> = parts.iter().map(|(v, pd)| tensor(b, v, pd.clone(), dt)).collect();
        let y = Tensor::cat(&ts.iter().collect::<Vec<_>>(), d as isize).unwrap();
        let mut od = dims.clone();
        od[d] = sizes.iter().sum();
        assert_eq!(y.dims(), &od[..]);
        // each output element comes from the part whose range covers its index along d
        let e: Vec<f64> = (0..od.iter().product())
            .map(|i| {
                let mut idx = r::unravel(i, &od);
                let mut p = 0;
                while idx[d] >= sizes[p] {
                    idx[d] -= sizes[p];
                    p += 1;
                }
                parts[p].0[r::ravel(&idx, &parts[p].1)]
            })
            .collect();
        assert_eq!(y.to_vec_f64().unwrap(), e, "cat of {sizes:?} along {d} of {dims:?}");
    });
    let u8s = Tensor::cat(
        &[&Tensor::from_vec(b, vec![1u8, 0], [2]).unwrap(), &Tensor::from_vec(b, vec![1u8], [1]).unwrap()],
        0,
    )
    .unwrap();
    assert_eq!((u8s.dtype(), u8s.to_vec_i64().unwrap()), (DType::U8, vec![1, 0, 1]));
    for d in [0isize, 1, -1] {
        let shapes: Vec<Shape> = [1, 3, 2]
            .iter()
            .map(|&s| {
                Shape::new(if d == 0 {
                    [s, 2, 3]
                } else if d == 1 {
                    [2, s, 3]
                } else {
                    [2, 3, s]
                })
            })
            .collect();
        let inputs: Vec<(Vec<f64>, Shape)> = shapes
            .iter()
            .enumerate()
            .map(|(i, s)| (values(s.elem_count(), 20 + i as u64, -1.0, 1.0), s.clone()))
            .collect();
        grad_check(b, &inputs, |t| Tensor::cat(&[&t[0], &t[1], &t[2]], d), 1e-6, &format!("cat along {d}"));
    }
}

/// Expand (NumPy broadcasting: new leading dims, size-1 dims) and its summing gradient.
pub fn expand_values_and_grads<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    st::run(16, st::broadcast_pair(4, 5), |(ad, bd)| {
        let out = r::broadcast_shape(&ad, &bd);
        let x = values(ad.iter().product(), 5, -1.0, 1.0);
        let y = tensor(b, &x, ad.clone(), dt).expand(out.clone()).unwrap();
        assert_eq!(y.dims(), &out[..]);
        let e: Vec<f64> = (0..out.iter().product()).map(|i| r::at_broadcast(&x, &ad, &r::unravel(i, &out))).collect();
        assert_eq!(y.to_vec_f64().unwrap(), e, "expand {ad:?} -> {out:?}");
    });
    grad_check(
        b,
        &[(values(3, 6, -1.0, 1.0), Shape::new([3, 1]))],
        |t| t[0].expand([2, 3, 4]),
        1e-6,
        "expand [3,1] -> [2,3,4]",
    );
    grad_check(
        b,
        &[(values(4, 7, -1.0, 1.0), Shape::new([1, 4]))],
        |t| t[0].expand([3, 4]),
        1e-6,
        "expand [1,4] -> [3,4]",
    );
}

/// Unsqueeze and squeeze at positive and negative dims; they only reshape.
pub fn squeeze_unsqueeze<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let x = values(6, 8, -1.0, 1.0);
    let t = tensor(b, &x, [2, 3], dt);
    for (dim, want) in
        [(0, vec![1, 2, 3]), (1, vec![2, 1, 3]), (2, vec![2, 3, 1]), (-1, vec![2, 3, 1]), (-3, vec![1, 2, 3])]
    {
        let u = t.unsqueeze(dim).unwrap();
        assert_eq!(u.dims(), &want[..], "unsqueeze({dim})");
        assert_eq!(u.to_vec_f64().unwrap(), x);
        let back = u.squeeze(dim).unwrap();
        assert_eq!(back.dims(), &[2, 3], "squeeze({dim})");
    }
    grad_check(b, &[(x.clone(), Shape::new([2, 3]))], |t| t[0].unsqueeze(1)?.expand([2, 4, 3]), 1e-6, "unsqueeze");
    grad_check(b, &[(x, Shape::new([2, 1, 3]))], |t| t[0].squeeze(-2)?.transpose(0, 1), 1e-6, "squeeze");
}

/// Bad permutations, out-of-range narrows, mismatched cats and other misuse are errors.
pub fn layout_errors<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let t = tensor(b, &values(24, 1, 0.0, 1.0), [2, 3, 4], dt);
    for perm in [vec![0, 1], vec![0, 1, 1], vec![0, 1, 3], vec![0, 1, 2, 3]] {
        assert!(matches!(t.permute(&perm), Err(Error::Invalid { op: "permute", .. })), "permutation {perm:?}");
    }
    assert!(matches!(t.transpose(0, 3), Err(Error::DimOutOfRange { .. })));
    assert!(matches!(t.narrow(1, 2, 2), Err(Error::Invalid { op: "narrow", .. })), "2+2 > 3");
    assert!(matches!(t.narrow(2, 5, 0), Err(Error::Invalid { op: "narrow", .. })), "start past the end");
    assert!(matches!(t.narrow(3, 0, 1), Err(Error::DimOutOfRange { .. })));
    let u = tensor(b, &values(12, 1, 0.0, 1.0), [2, 2, 3], dt);
    assert!(
        matches!(Tensor::cat(&[&t, &u], 1), Err(Error::ShapeMismatch { op: "cat", .. })),
        "dims differ off the cat dim"
    );
    assert!(Tensor::cat(&[&t, &u], 2).is_err());
    assert!(
        matches!(Tensor::cat(&[&t, &u.reshape([12]).unwrap()], 0), Err(Error::ShapeMismatch { .. })),
        "ranks differ"
    );
    assert!(matches!(Tensor::cat(&[&t, &t.cast(DType::F16).unwrap()], 0), Err(Error::DTypeMismatch { .. })));
    assert!(Tensor::<B>::cat(&[], 0).is_err(), "no parts");
    assert!(matches!(t.reshape([5, 5]), Err(Error::ShapeMismatch { op: "reshape", .. })));
    assert!(matches!(t.expand([2, 4, 4]), Err(Error::ShapeMismatch { .. })));
    assert!(matches!(t.expand([3, 4]), Err(Error::ShapeMismatch { .. })), "expand to a lower rank");
    assert!(matches!(t.squeeze(1), Err(Error::Invalid { op: "squeeze", .. })));
    assert!(matches!(t.unsqueeze(4), Err(Error::DimOutOfRange { .. })));
    assert!(matches!(t.unsqueeze(-5), Err(Error::DimOutOfRange { .. })));
}
