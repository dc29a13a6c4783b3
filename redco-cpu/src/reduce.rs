//! CPU reductions along one dimension (kept with size 1).

use super::real::Real;
use super::strided::PAR_MIN;
use super::{floats, Floats, Store};
use rayon::prelude::*;
use redco_core::backend::ReduceOp;
use redco_core::{HostData, Result, Shape};

fn reduce_t<T: Real>(op: ReduceOp, x: &[T], outer: usize, size: usize, inner: usize) -> Vec<T> {
    let init = match op {
        ReduceOp::Sum => T::zero(),
        ReduceOp::Max | ReduceOp::ArgMax => T::neg_infinity(),
        ReduceOp::Min => T::infinity(),
    };
    let mut out = vec![init; outer * inner];
    let block = |o: usize, dst: &mut [T]| {
        let src = &x[o * size * inner..(o + 1) * size * inner];
        if op == ReduceOp::ArgMax {
            let mut best = vec![T::neg_infinity(); inner];
            dst.iter_mut().for_each(|d| *d = T::zero());
            for (s, row) in src.chunks(inner).enumerate() {
                for ((d, b), &v) in dst.iter_mut().zip(best.iter_mut()).zip(row) {
                    if v > *b || (s == 0) {
                        *b = v;
                        *d = T::of(s as f64);
                    }
                }
            }
            return;
        }
        if inner == 1 {
            dst[0] = match op {
                ReduceOp::Sum => src.iter().copied().sum(),
                ReduceOp::Max => src.iter().copied().fold(init, T::max),
                _ => src.iter().copied().fold(init, T::min),
            };
            return;
        }
        for row in src.chunks(inner) {
            match op {
                ReduceOp::Sum => dst.iter_mut().zip(row).for_each(|(d, &v)| *d = *d + v),
                ReduceOp::Max => dst.iter_mut().zip(row).for_each(|(d, &v)| *d = d.max(v)),
                _ => dst.iter_mut().zip(row).for_each(|(d, &v)| *d = d.min(v)),
            }
        }
    };
    if inner > 0 {
        if outer * size * inner >= PAR_MIN && outer > 1 {
            out.par_chunks_mut(inner).enumerate().for_each(|(o, d)| block(o, d));
        } else {
            out.chunks_mut(inner).enumerate().for_each(|(o, d)| block(o, d));
        }
    }
    out
}

/// Reduces `x` along `dim`.
pub(crate) fn reduce(op: ReduceOp, x: &HostData, shape: &Shape, dim: usize) -> Result<HostData> {
    let (outer, size, inner) = shape.split_at_dim(dim);
    let dt = x.dtype();
    Ok(match floats(x) {
        Floats::F32(v) => {
            let r = reduce_t(op, &v, outer, size, inner);
            if op == ReduceOp::ArgMax {
                HostData::I64(r.iter().map(|&i| i as i64).collect())
            } else {
                f32::store(r, dt)
            }
        }
        Floats::F64(v) => {
            let r = reduce_t(op, &v, outer, size, inner);
            if op == ReduceOp::ArgMax {
                HostData::I64(r.iter().map(|&i| i as i64).collect())
            } else {
                f64::store(r, dt)
            }
        }
    })
}
