//! Cross-entropy with an ignore index (fused op with a composite default).

use crate::autograd::GradModeGuard;
use crate::backend::CmpOp;
use crate::{Backend, DType, Error, Result, Shape, Tensor};

/// Composite per-row cross-entropy, written with primitive ops.
pub fn composite_cross_entropy<B: Backend>(
    b: &B,
    logits: &B::Storage,
    shape: &Shape,
    targets: &B::Storage,
    ignore_index: i64,
) -> Result<B::Storage> {
    let _g = GradModeGuard::no_grad();
    let x = Tensor::from_storage(b, logits.clone(), shape.clone(), b.storage_dtype(logits));
    let n = shape.dims()[0];
    let t = Tensor::from_storage(b, targets.clone(), [n], b.storage_dtype(targets));
    let (valid, safe) = valid_and_safe(&t, ignore_index)?;
    let m = x.max(-1, true)?;
    let lse = x.sub(&m)?.exp()?.sum(-1, true)?.log()?.add(&m)?;
    let picked = x.gather(&safe.unsqueeze(-1)?, -1)?;
    let zero = Tensor::zeros(b, [], x.dtype())?;
    Ok(valid.where_cond(&lse.sub(&picked)?.squeeze(-1)?, &zero)?.storage().clone())
}

/// Composite gradient of per-row cross-entropy, written with primitive ops.
pub fn composite_cross_entropy_backward<B: Backend>(
    b: &B,
    logits: &B::Storage,
    shape: &Shape,
    targets: &B::Storage,
    ignore_index: i64,
    grad: &B::Storage,
) -> Result<B::Storage> {
    let _g = GradModeGuard::no_grad();
    let dt = b.storage_dtype(logits);
    let x = Tensor::from_storage(b, logits.clone(), shape.clone(), dt);
    let n = shape.dims()[0];
    let t = Tensor::from_storage(b, targets.clone(), [n], b.storage_dtype(targets));
    let g = Tensor::from_storage(b, grad.clone(), [n], b.storage_dtype(grad));
    let (valid, safe) = valid_and_safe(&t, ignore_index)?;
    let p = x.softmax(-1)?;
    let ones = Tensor::ones(b, [n, 1], dt)?;
    let onehot = p.zeros_like()?.scatter_add(&safe.unsqueeze(-1)?, &ones, -1)?;
    let w = valid.cast(dt)?.mul(&g)?.unsqueeze(-1)?;
    Ok(p.sub(&onehot)?.mul(&w)?.storage().clone())
}

/// (valid mask as U8, targets with ignored entries replaced by 0).
fn valid_and_safe<B: Backend>(t: &Tensor<B>, ignore_index: i64) -> Result<(Tensor<B>, Tensor<B>)> {
    let valid = t.compare_scalar(ignore_index as f64, CmpOp::Ne)?;
    let zero = Tensor::zeros(t.backend(), [], t.dtype())?;
    Ok((valid.clone(), valid.where_cond(t, &zero)?))
}

impl<B: Backend> Tensor<B> {
    /// Per-token cross-entropy of logits `[.., vocab]` against integer targets `[..]`;
    /// tokens whose target is `ignore_index` give 0. Targets outside the vocabulary are an
    /// [`Error::IndexOutOfRange`].
    pub fn cross_entropy_per_token(&self, targets: &Tensor<B>, ignore_index: i64) -> Result<Tensor<B>> {
        self.expect_float("cross_entropy")?;
        targets.expect_int("cross_entropy (targets)")?;
        let v = *self.dims().last().ok_or_else(|| Error::invalid("cross_entropy", "logits need rank >= 1"))?;
        if self.dims()[..self.rank() - 1] != *targets.dims() {
            return Err(Error::ShapeMismatch {
                op: "cross_entropy",
                lhs: self.shape().clone(),
                rhs: targets.shape().clone(),
            });
        }
        let n = targets.elem_count();
        let x = self.reshape([n, v])?;
        let t = targets.reshape([n])?;
        if x.is_sharded() || t.is_sharded() {
            return crate::sharding::cross_entropy::cross_entropy_sharded(&x, &t, ignore_index)?
                .reshape(targets.shape().clone());
        }
        let s = self.backend().cross_entropy(x.storage(), x.shape(), t.storage(), ignore_index)?;
        let t_c = t.clone();
        let (xd, xc) = (x.detach(), x.clone());
        let out = Tensor::from_op(self.backend(), s, Shape::new([n]), self.dtype(), "cross_entropy", &[&x], move |g| {
            if crate::is_grad_enabled() && xc.requires_grad() {
                // building a graph of the gradients: (softmax(x) - onehot(t)) * g as
                // recorded ops, zero on ignored rows
                let keep = t_c.compare_scalar(ignore_index as f64, CmpOp::Ne)?;
                let vocab = xc.dims()[1];
                let cols =
                    Tensor::from_vec(xc.backend(), (0..vocab as i64).collect(), [1, vocab])?.cast(t_c.dtype())?;
                let onehot = cols.compare(&t_c.unsqueeze(1)?, CmpOp::Eq)?.cast(xc.dtype())?;
                let rows = g.mul(&keep.cast(g.dtype())?)?.unsqueeze(1)?;
                return Ok(vec![Some(xc.softmax(-1)?.sub(&onehot)?.mul(&rows)?)]);
            }
            let b = xd.backend();
            let d = b.cross_entropy_backward(xd.storage(), xd.shape(), t_c.storage(), ignore_index, g.storage())?;
            Ok(vec![Some(Tensor::from_storage(b, d, xd.shape().clone(), xd.dtype()))])
        });
        out.reshape(targets.shape().clone())
    }

    /// Mean cross-entropy over the tokens whose target is not `ignore_index` (transformers'
    /// convention with -100); 0 when every token is ignored.
    pub fn cross_entropy(&self, targets: &Tensor<B>, ignore_index: i64) -> Result<Tensor<B>> {
        let per = self.cross_entropy_per_token(targets, ignore_index)?;
        let count = targets
            .compare_scalar(ignore_index as f64, CmpOp::Ne)?
            .cast(if self.dtype() == DType::F64 { DType::F64 } else { DType::F32 })?
            .sum_all()?
            .clamp_min(1.0)?
            .cast(self.dtype())?;
        per.sum_all()?.div(&count)
    }
}
