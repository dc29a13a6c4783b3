//! Softmax and log-softmax (fused ops with composite defaults).

use crate::autograd::{is_grad_enabled, GradModeGuard};
use crate::sharding::rules;
use crate::{Backend, Result, Shape, Tensor};

/// Composite softmax over the last dim, written with primitive ops.
pub fn composite_softmax<B: Backend>(b: &B, x: &B::Storage, shape: &Shape) -> Result<B::Storage> {
    let _g = GradModeGuard::no_grad();
    let t = Tensor::from_storage(b, x.clone(), shape.clone(), b.storage_dtype(x));
    let e = t.sub(&t.max(-1, true)?)?.exp()?;
    Ok(e.div(&e.sum(-1, true)?)?.storage().clone())
}

/// Composite log-softmax over the last dim, written with primitive ops.
pub fn composite_log_softmax<B: Backend>(b: &B, x: &B::Storage, shape: &Shape) -> Result<B::Storage> {
    let _g = GradModeGuard::no_grad();
    let t = Tensor::from_storage(b, x.clone(), shape.clone(), b.storage_dtype(x));
    let z = t.sub(&t.max(-1, true)?)?;
    Ok(z.sub(&z.exp()?.sum(-1, true)?.log()?)?.storage().clone())
}

impl<B: Backend> Tensor<B> {
    /// Softmax along `dim`.
    pub fn softmax(&self, dim: isize) -> Result<Tensor<B>> {
        self.along_last(dim, "softmax", |x| {
            let x = &rules::whole_along(x, &[x.rank() - 1], false)?;
            let s = x.backend().softmax(x.storage(), x.local_shape())?;
            let (y, xc) = (x.same_layout(s.clone(), x.dtype()), x.clone());
            Ok(Tensor::record_like(x, s, x.dtype(), "softmax", &[x], move |g| {
                // building a graph of the gradients: the output again, recorded
                let y = if crate::is_grad_enabled() && xc.requires_grad() { xc.softmax(-1)? } else { y.clone() };
                let dot = g.mul(&y)?.sum(-1, true)?;
                Ok(vec![Some(y.mul(&g.sub(&dot)?)?)])
            }))
        })
    }

    /// Log-softmax along `dim`.
    pub fn log_softmax(&self, dim: isize) -> Result<Tensor<B>> {
        self.along_last(dim, "log_softmax", |x| {
            let x = &rules::whole_along(x, &[x.rank() - 1], false)?;
            let s = x.backend().log_softmax(x.storage(), x.local_shape())?;
            let (y, xc) = (x.same_layout(s.clone(), x.dtype()), x.clone());
            Ok(Tensor::record_like(x, s, x.dtype(), "log_softmax", &[x], move |g| {
                let y = if crate::is_grad_enabled() && xc.requires_grad() { xc.log_softmax(-1)? } else { y.clone() };
                Ok(vec![Some(g.sub(&y.exp()?.mul(&g.sum(-1, true)?)?)?)])
            }))
        })
    }

    /// Applies a last-dim op along `dim` by moving `dim` last and back.
    pub(crate) fn along_last(
        &self,
        dim: isize,
        op: &'static str,
        f: impl FnOnce(&Tensor<B>) -> Result<Tensor<B>>,
    ) -> Result<Tensor<B>> {
        self.expect_float(op)?;
        let d = self.shape().resolve(dim, op)?;
        let last = self.rank() - 1;
        if d == last {
            f(self)
        } else {
            f(&self.transpose(d as isize, -1)?)?.transpose(d as isize, -1)
        }
    }
}

/// True when an op on these tensors must record gradients.
pub(crate) fn needs_grad<B: Backend>(ts: &[Option<&Tensor<B>>]) -> bool {
    is_grad_enabled() && ts.iter().flatten().any(|t| t.requires_grad())
}
