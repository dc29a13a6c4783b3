//! One AdamW step over a flat parameter (fused op with a composite default): the moments
//! and the parameter are updated in one pass by backends that override it.

use crate::autograd::GradModeGuard;
use crate::{Backend, DType, Result, Shape, Tensor};

/// The scalars of one AdamW step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamStep {
    /// Learning rate.
    pub lr: f64,
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Added to the root of the corrected second moment.
    pub eps: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    /// `1 - beta1^t`.
    pub bias1: f64,
    /// `1 - beta2^t`.
    pub bias2: f64,
}

/// One parameter of a multi-tensor AdamW step ([`crate::Backend::adamw_many`]).
pub struct AdamItem<'a, S> {
    /// The parameter, flat (`n` elements); left as it is.
    pub x: &'a S,
    /// Its gradient, in the parameter's dtype.
    pub g: &'a S,
    /// The first moment: updated in its own buffer where the backend can, else replaced.
    pub m: &'a mut S,
    /// The second moment, likewise.
    pub v: &'a mut S,
    /// The number of elements of each.
    pub n: usize,
}

/// One parameter of a mixed-precision multi-tensor AdamW step over f32 masters
/// ([`crate::Backend::adamw_master_many`]).
pub struct AdamMasterItem<'a, S> {
    /// The f32 master (`n` elements); left as it is (the new one is returned).
    pub x: &'a S,
    /// Its gradient, in any float dtype (read as f32 and multiplied by the step's gradient
    /// scale).
    pub g: &'a S,
    /// The first moment (f32), updated like `x`.
    pub m: &'a mut S,
    /// The second moment (f32), likewise.
    pub v: &'a mut S,
    /// The number of elements of each.
    pub n: usize,
}

/// Bytes a one-pass [`crate::Backend::adamw_master_many`] moves per parameter element:
/// the gradient (`grad`'s size) and the f32 master and moments read, the master and the
/// moments written, the compute copy (`copy`'s size) written. For bf16 gradients and
/// copies, 28 bytes: a step's bound is that times the parameters over the device's copy
/// rate.
pub fn master_step_bytes(grad: DType, copy: DType) -> usize {
    grad.size_in_bytes() + 3 * 4 + 3 * 4 + copy.size_in_bytes()
}

/// [`crate::Backend::adamw_master_many`] written with the backend's other ops: per item,
/// the gradient cast to f32 and scaled (when `grad_scale` is not 1), [`Backend::adamw_into`],
/// and the new master cast to `copy`. Returns `(new master, compute copy)` per item.
pub fn composite_adamw_master_many<B: Backend>(
    b: &B,
    items: &mut [AdamMasterItem<'_, B::Storage>],
    h: &AdamStep,
    grad_scale: f64,
    copy: DType,
) -> Result<Vec<(B::Storage, B::Storage)>> {
    let _g = GradModeGuard::no_grad();
    let mut out = Vec::with_capacity(items.len());
    for it in items.iter_mut() {
        let xd = b.storage_dtype(it.x);
        let mut g = Tensor::from_storage(b, it.g.clone(), Shape::new([it.n]), b.storage_dtype(it.g));
        if g.dtype() != xd {
            g = g.cast(xd)?;
        }
        if grad_scale != 1.0 {
            g = g.scale(grad_scale)?;
        }
        let nx = b.adamw_into(it.x, g.storage(), it.m, it.v, it.n, h)?;
        let c = if copy == xd { nx.clone() } else { b.cast(&nx, it.n, copy)? };
        out.push((nx, c));
    }
    Ok(out)
}

/// The update written with tensor ops: `m = b1 m + (1 - b1) g`, `v = b2 v + (1 - b2) g^2`,
/// `x = x (1 - lr wd) - lr (m / bias1) / (sqrt(v / bias2) + eps)`. Returns `(x, m, v)`.
pub fn composite_adamw<B: Backend>(
    b: &B,
    x: &B::Storage,
    g: &B::Storage,
    m: &B::Storage,
    v: &B::Storage,
    n: usize,
    h: &AdamStep,
) -> Result<(B::Storage, B::Storage, B::Storage)> {
    let _g = GradModeGuard::no_grad();
    let t = |s: &B::Storage| Tensor::from_storage(b, s.clone(), Shape::new([n]), b.storage_dtype(s));
    let (x, g, m, v) = (t(x), t(g), t(m), t(v));
    let m = m.scale(h.beta1)?.add(&g.scale(1.0 - h.beta1)?)?;
    let v = v.scale(h.beta2)?.add(&g.square()?.scale(1.0 - h.beta2)?)?;
    let denom = v.scale(1.0 / h.bias2)?.sqrt()?.add_scalar(h.eps)?;
    let step = m.scale(1.0 / h.bias1)?.div(&denom)?;
    let x = x.scale(1.0 - h.lr * h.weight_decay)?.sub(&step.scale(h.lr)?)?;
    Ok((x.storage().clone(), m.storage().clone(), v.storage().clone()))
}

#[cfg(test)]
mod tests {
    use super::master_step_bytes;
    use crate::DType;

    #[test]
    fn a_mixed_precision_step_moves_28_bytes_a_bf16_parameter() {
        assert_eq!(master_step_bytes(DType::BF16, DType::BF16), 28);
        assert_eq!(master_step_bytes(DType::F32, DType::BF16), 30);
        assert_eq!(master_step_bytes(DType::F32, DType::F32), 32);
    }
}
