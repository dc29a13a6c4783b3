//! Rotary position embedding (fused op with a composite default), both conventions.

use crate::autograd::GradModeGuard;
use crate::backend::RotaryMode;
use crate::sharding::rules;
use crate::{Backend, Error, Result, Shape, Tensor};

/// Composite rotary embedding, written with primitive ops.
pub fn composite_rotary<B: Backend>(
    b: &B,
    x: &B::Storage,
    shape: &Shape,
    cos: &B::Storage,
    sin: &B::Storage,
    cs_shape: &Shape,
    mode: RotaryMode,
) -> Result<B::Storage> {
    let _g = GradModeGuard::no_grad();
    let dt = b.storage_dtype(x);
    let x = Tensor::from_storage(b, x.clone(), shape.clone(), dt);
    let cos = Tensor::from_storage(b, cos.clone(), cs_shape.clone(), dt);
    let sin = Tensor::from_storage(b, sin.clone(), cs_shape.clone(), dt);
    Ok(rotate(&x, &cos, &sin, mode)?.storage().clone())
}

/// Rotates with tensor ops (records gradients when enabled).
fn rotate<B: Backend>(x: &Tensor<B>, cos: &Tensor<B>, sin: &Tensor<B>, mode: RotaryMode) -> Result<Tensor<B>> {
    let (cos, sin) = if cos.rank() == 3 && x.rank() == 4 {
        (cos.unsqueeze(1)?, sin.unsqueeze(1)?)
    } else {
        (cos.clone(), sin.clone())
    };
    let bad = || Error::ShapeMismatch { op: "rotary", lhs: x.shape().clone(), rhs: cos.shape().clone() };
    let half = *cos.dims().last().ok_or_else(bad)?;
    let d = *x.dims().last().ok_or_else(bad)?;
    let xr = x.narrow(-1, 0, 2 * half)?;
    let rotated = match mode {
        RotaryMode::HalfSplit => {
            let x1 = xr.narrow(-1, 0, half)?;
            let x2 = xr.narrow(-1, half, half)?;
            let o1 = x1.mul(&cos)?.sub(&x2.mul(&sin)?)?;
            let o2 = x2.mul(&cos)?.add(&x1.mul(&sin)?)?;
            Tensor::cat(&[&o1, &o2], -1)?
        }
        RotaryMode::Interleaved => {
            let mut pair_shape = xr.dims().to_vec();
            *pair_shape.last_mut().unwrap() = half;
            pair_shape.push(2);
            let p = xr.reshape(pair_shape)?;
            let x1 = p.narrow(-1, 0, 1)?.squeeze(-1)?;
            let x2 = p.narrow(-1, 1, 1)?.squeeze(-1)?;
            let o1 = x1.mul(&cos)?.sub(&x2.mul(&sin)?)?.unsqueeze(-1)?;
            let o2 = x2.mul(&cos)?.add(&x1.mul(&sin)?)?.unsqueeze(-1)?;
            Tensor::cat(&[&o1, &o2], -1)?.reshape(xr.shape().clone())?
        }
    };
    if 2 * half == d {
        Ok(rotated)
    } else {
        Tensor::cat(&[&rotated, &x.narrow(-1, 2 * half, d - 2 * half)?], -1)
    }
}

impl<B: Backend> Tensor<B> {
    /// Rotary embedding of `self` (`[.., seq, head_dim]`) on its first `2 * r` features,
    /// where `cos`/`sin` are `[seq, r]` (or `[batch, seq, r]` for `self` of shape
    /// `[batch, heads, seq, head_dim]` with per-row positions). `cos`/`sin` are constants.
    pub fn rotary(&self, cos: &Tensor<B>, sin: &Tensor<B>, mode: RotaryMode) -> Result<Tensor<B>> {
        self.expect_float("rotary")?;
        self.same_dtype(cos, "rotary (cos)")?;
        self.same_dtype(sin, "rotary (sin)")?;
        let r = self.rank();
        let ok = r >= 2
            && cos.shape() == sin.shape()
            && (cos.rank() == 2 || (cos.rank() == 3 && r == 4 && cos.dims()[0] == self.dims()[0]))
            && cos.dims()[cos.rank() - 2] == self.dims()[r - 2]
            && 2 * cos.dims()[cos.rank() - 1] <= self.dims()[r - 1];
        if !ok {
            return Err(Error::ShapeMismatch { op: "rotary", lhs: self.shape().clone(), rhs: cos.shape().clone() });
        }
        // Heads and batch may be split; the sequence and features stay whole. Per-row tables
        // follow a batch split.
        let x = rules::whole_along(self, &[r - 1, r - 2], false)?;
        let mut tp = crate::Placements::REPLICATED;
        if cos.rank() == 3 {
            for axis in [crate::MeshAxis::Dp, crate::MeshAxis::Mp] {
                if x.placements().get(axis) == crate::Placement::Shard(0) {
                    tp = tp.with(axis, crate::Placement::Shard(0));
                }
            }
        }
        let (c, sn) = (cos.detach().redistribute(tp)?, sin.detach().redistribute(tp)?);
        let s = x.backend().rotary(x.storage(), x.local_shape(), c.storage(), sn.storage(), c.local_shape(), mode)?;
        Ok(Tensor::record_like(&x, s, x.dtype(), "rotary", &[&x], move |g| {
            // The inverse rotation: the same cosines, negated sines.
            Ok(vec![Some(g.rotary(&c, &sn.neg()?, mode)?)])
        }))
    }
}
