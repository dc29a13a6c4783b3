//! Rotary family: both conventions (GPT-J interleaved pairs, LLaMA half split), full and
//! partial rotary dims, shared and per-row positions.

use crate::check::{assert_close, check_dtype, grad_check, ids, tensor, tol, values};
use crate::reference as r;
use redco_core::nn::RotaryEmbedding;
use redco_core::{Backend, DType, Error, RotaryMode, Shape, Tensor};

const MODES: [RotaryMode; 2] = [RotaryMode::Interleaved, RotaryMode::HalfSplit];

/// The reference for `x` `[batch, heads, seq, d]` at per-row positions `pos` `[batch, seq]`.
fn per_row_ref(
    x: &[f64],
    (batch, heads, seq, d): (usize, usize, usize, usize),
    pos: &[i64],
    rot: usize,
    theta: f64,
    mode: RotaryMode,
) -> Vec<f64> {
    let n = heads * seq * d;
    (0..batch)
        .flat_map(|bi| {
            r::rotary(
                &x[bi * n..(bi + 1) * n],
                seq,
                d,
                &pos[bi * seq..(bi + 1) * seq],
                rot,
                theta,
                mode == RotaryMode::Interleaved,
            )
        })
        .collect()
}

/// Positions of one row: not consecutive, including 0 and a large one.
fn positions(seq: usize, salt: i64) -> Vec<i64> {
    (0..seq as i64).map(|i| if i == seq as i64 - 1 { 4093 + salt } else { (i * 7 + salt) % 13 }).collect()
}

/// Both modes, full and partial rotary dims, two bases, with one position table shared
/// by every row (`[seq]`, on x of rank 3 and rank 4).
pub fn rotary_values<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let (batch, heads, seq) = (2, 3, 5);
    for mode in MODES {
        for (d, rot) in [(8, 8), (8, 4), (10, 6), (6, 2)] {
            for theta in [10000.0, 500000.0] {
                let pos = positions(seq, 0);
                let rope = RotaryEmbedding::new(rot, theta, mode).unwrap();
                let (cos, sin) = rope.tables(&ids(b, &pos, [seq]), dt).unwrap();
                assert_eq!(cos.dims(), &[seq, rot / 2]);
                let x = values(batch * heads * seq * d, 1, -1.0, 1.0);
                let e = r::rotary(&x, seq, d, &pos, rot, theta, mode == RotaryMode::Interleaved);
                let what = format!("{mode:?} d={d} rot={rot} theta={theta}");
                for shape in [vec![batch, heads, seq, d], vec![batch * heads, seq, d]] {
                    let y = tensor(b, &x, shape.clone(), dt).rotary(&cos, &sin, mode).unwrap();
                    assert_eq!(y.dims(), &shape[..]);
                    assert_close(&y.to_vec_f64().unwrap(), &e, tol(dt) * 10.0, &format!("{what} x {shape:?}"));
                }
                let y = rope.forward(&tensor(b, &x, [batch, heads, seq, d], dt), &ids(b, &pos, [seq])).unwrap();
                assert_close(&y.to_vec_f64().unwrap(), &e, tol(dt) * 10.0, &format!("{what} via forward"));
            }
        }
    }
}

/// Per-row positions: tables `[batch, seq, rot/2]` for x `[batch, heads, seq, d]` (left
/// padding, packed sequences).
pub fn rotary_per_row_positions<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let (batch, heads, seq) = (3, 2, 4);
    for mode in MODES {
        for (d, rot) in [(8, 8), (12, 4)] {
            for theta in [10000.0, 500000.0] {
                let pos: Vec<i64> = (0..batch).flat_map(|bi| positions(seq, bi as i64 * 3)).collect();
                let rope = RotaryEmbedding::new(rot, theta, mode).unwrap();
                let (cos, sin) = rope.tables(&ids(b, &pos, [batch, seq]), dt).unwrap();
                assert_eq!(cos.dims(), &[batch, seq, rot / 2]);
                let x = values(batch * heads * seq * d, 2, -1.0, 1.0);
                let y = tensor(b, &x, [batch, heads, seq, d], dt).rotary(&cos, &sin, mode).unwrap();
                let e = per_row_ref(&x, (batch, heads, seq, d), &pos, rot, theta, mode);
                assert_close(
                    &y.to_vec_f64().unwrap(),
                    &e,
                    tol(dt) * 10.0,
                    &format!("per-row {mode:?} d={d} rot={rot} theta={theta}"),
                );
            }
        }
    }
}

/// f16 and bf16 rotate in their own dtype.
pub fn rotary_half<B: Backend>(b: &B) {
    for dt in [DType::F16, DType::BF16] {
        if !b.supports(dt) {
            continue;
        }
        for mode in MODES {
            let pos = positions(6, 1);
            let (cos, sin) = RotaryEmbedding::new(8, 10000.0, mode).unwrap().tables(&ids(b, &pos, [6]), dt).unwrap();
            let t = tensor(b, &values(2 * 6 * 10, 3, -1.0, 1.0), [2, 6, 10], dt);
            let y = t.rotary(&cos, &sin, mode).unwrap();
            assert_eq!(y.dtype(), dt);
            // the reference angles are exact; the tables are rounded to `dt`
            let e = r::rotary(&t.to_vec_f64().unwrap(), 6, 10, &pos, 8, 10000.0, mode == RotaryMode::Interleaved);
            assert_close(&y.to_vec_f64().unwrap(), &e, tol(dt), &format!("{dt:?} {mode:?}"));
        }
    }
}

/// Gradients with respect to x, for both modes, partial dims and per-row positions.
pub fn rotary_grads<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    for mode in MODES {
        for (d, rot, theta) in [(6, 6, 10000.0), (8, 4, 500000.0)] {
            let rope = RotaryEmbedding::new(rot, theta, mode).unwrap();
            let (cos, sin) = rope.tables(&ids(b, &positions(3, 0), [3]), dt).unwrap();
            let x = (values(2 * 2 * 3 * d, 4, -1.0, 1.0), Shape::new([2, 2, 3, d]));
            grad_check(
                b,
                std::slice::from_ref(&x),
                |t| t[0].rotary(&cos, &sin, mode),
                1e-6,
                &format!("{mode:?} d={d} rot={rot}"),
            );
            let pos: Vec<i64> = (0..2).flat_map(|bi| positions(3, bi * 5)).collect();
            let (cos, sin) = rope.tables(&ids(b, &pos, [2, 3]), dt).unwrap();
            grad_check(b, &[x], |t| t[0].rotary(&cos, &sin, mode), 1e-6, &format!("per-row {mode:?} d={d} rot={rot}"));
        }
    }
}

/// Tables that do not fit x, a rotary dim beyond the head, odd rotary dims and
/// non-integer positions are errors.
pub fn rotary_errors<B: Backend>(b: &B) {
    let dt = check_dtype(b);
    let mode = RotaryMode::HalfSplit;
    let x = tensor(b, &values(2 * 3 * 4 * 8, 1, -1.0, 1.0), [2, 3, 4, 8], dt);
    let rope = |rot| RotaryEmbedding::new(rot, 10000.0, mode).unwrap();
    let (c, s) = rope(8).tables(&ids(b, &[0, 1, 2], [3]), dt).unwrap();
    assert!(matches!(x.rotary(&c, &s, mode), Err(Error::ShapeMismatch { op: "rotary", .. })), "seq 3 vs 4");
    let (c, s) = rope(10).tables(&ids(b, &[0, 1, 2, 3], [4]), dt).unwrap();
    assert!(matches!(x.rotary(&c, &s, mode), Err(Error::ShapeMismatch { .. })), "rot 10 > head_dim 8");
    let (c, s) = rope(8).tables(&ids(b, &[0; 12], [3, 4]), dt).unwrap();
    assert!(matches!(x.rotary(&c, &s, mode), Err(Error::ShapeMismatch { .. })), "per-row batch 3 vs 2");
    let (c, s) = rope(8).tables(&ids(b, &[0; 8], [2, 4]), dt).unwrap();
    let x3 = x.reshape([6, 4, 8]).unwrap();
    assert!(matches!(x3.rotary(&c, &s, mode), Err(Error::ShapeMismatch { .. })), "per-row tables need x of rank 4");
    let (c, s) = rope(8).tables(&ids(b, &[0, 1, 2, 3], [4]), dt).unwrap();
    assert!(
        matches!(x.rotary(&c, &s.narrow(1, 0, 2).unwrap(), mode), Err(Error::ShapeMismatch { .. })),
        "cos and sin differ"
    );
    assert!(matches!(x.rotary(&c.cast(DType::F16).unwrap(), &s, mode), Err(Error::DTypeMismatch { .. })));
    for rot in [0, 3, 7] {
        assert!(RotaryEmbedding::new(rot, 10000.0, mode).is_err(), "rot_dim {rot}");
    }
    let fpos = tensor(b, &[0.0, 1.0], [2], dt);
    assert!(matches!(rope(8).tables(&fpos, dt), Err(Error::UnsupportedDType { .. })));
    let v = Tensor::from_vec(b, vec![1i64; 8], [8]).unwrap();
    assert!(v.rotary(&c, &s, mode).is_err(), "integer x");
}
