//! LayerNorm and RMSNorm over the last dimension (fused ops with composite defaults).

use crate::autograd::GradModeGuard;
use crate::sharding::rules;
use crate::{Backend, Error, Result, Shape, Tensor};

fn wrap<B: Backend>(b: &B, s: &B::Storage, shape: &Shape) -> Tensor<B> {
    Tensor::from_storage(b, s.clone(), shape.clone(), b.storage_dtype(s))
}

/// Composite LayerNorm, written with primitive ops.
pub fn composite_layer_norm<B: Backend>(
    b: &B,
    x: &B::Storage,
    shape: &Shape,
    w: Option<&B::Storage>,
    bias: Option<&B::Storage>,
    eps: f64,
) -> Result<B::Storage> {
    let _g = GradModeGuard::no_grad();
    let d = Shape::new([*shape.dims().last().unwrap_or(&1)]);
    let (_, _, xhat) = layer_norm_parts(&wrap(b, x, shape), eps)?;
    let mut y = xhat;
    if let Some(w) = w {
        y = y.mul(&wrap(b, w, &d))?;
    }
    if let Some(bias) = bias {
        y = y.add(&wrap(b, bias, &d))?;
    }
    Ok(y.storage().clone())
}

/// Composite RMSNorm, written with primitive ops.
pub fn composite_rms_norm<B: Backend>(
    b: &B,
    x: &B::Storage,
    shape: &Shape,
    w: Option<&B::Storage>,
    eps: f64,
) -> Result<B::Storage> {
    let _g = GradModeGuard::no_grad();
    let d = Shape::new([*shape.dims().last().unwrap_or(&1)]);
    let x = wrap(b, x, shape);
    let mut y = x.mul(&rms_rstd(&x, eps)?)?;
    if let Some(w) = w {
        y = y.mul(&wrap(b, w, &d))?;
    }
    Ok(y.storage().clone())
}

/// [`Backend::norm_backward`] written with tensor ops (no gradient recorded).
pub fn composite_norm_backward<B: Backend>(
    b: &B,
    x: &B::Storage,
    shape: &Shape,
    w: Option<&B::Storage>,
    g: &B::Storage,
    eps: f64,
    rms: bool,
) -> Result<B::Storage> {
    let _g = GradModeGuard::no_grad();
    let d = Shape::new([*shape.dims().last().unwrap_or(&1)]);
    let (x, g) = (wrap(b, x, shape), wrap(b, g, shape));
    let w = w.map(|w| wrap(b, w, &d));
    Ok(norm_input_grad(&x, w.as_ref(), &g, eps, rms)?.storage().clone())
}

/// The input gradient of a norm as tensor ops (recorded when gradients are: a graph of
/// the gradients for second-order autograd).
fn norm_input_grad<B: Backend>(
    x: &Tensor<B>,
    w: Option<&Tensor<B>>,
    g: &Tensor<B>,
    eps: f64,
    rms: bool,
) -> Result<Tensor<B>> {
    let (rstd, xhat) = if rms {
        let rstd = rms_rstd(x, eps)?;
        let xhat = x.mul(&rstd)?;
        (rstd, xhat)
    } else {
        let (_, rstd, xhat) = layer_norm_parts(x, eps)?;
        (rstd, xhat)
    };
    let gx = match w {
        Some(w) => g.mul(w)?,
        None => g.clone(),
    };
    let t2 = xhat.mul(&gx.mul(&xhat)?.mean(-1, true)?)?;
    let inner = if rms { gx.sub(&t2)? } else { gx.sub(&gx.mean(-1, true)?)?.sub(&t2)? };
    inner.mul(&rstd)
}

/// The input gradient of a norm of `x` for the output gradient `g`: the backend's fused
/// [`Backend::norm_backward`] on the local rows, or tensor ops while a graph of the
/// gradients is being built (or `g` is laid out otherwise than `x`).
fn input_grad<B: Backend>(
    x: &Tensor<B>,
    w: Option<&Tensor<B>>,
    g: &Tensor<B>,
    eps: f64,
    rms: bool,
) -> Result<Tensor<B>> {
    let fused = !crate::is_grad_enabled()
        && g.dtype() == x.dtype()
        && g.placements() == x.placements()
        && g.local_shape() == x.local_shape();
    if !fused {
        return norm_input_grad(x, w, g, eps, rms);
    }
    let s = x.backend().norm_backward(x.storage(), x.local_shape(), w.map(|w| w.storage()), g.storage(), eps, rms)?;
    Ok(x.same_layout(s, x.dtype()))
}

/// (x, rstd, xhat) for LayerNorm.
fn layer_norm_parts<B: Backend>(x: &Tensor<B>, eps: f64) -> Result<(Tensor<B>, Tensor<B>, Tensor<B>)> {
    let xc = x.sub(&x.mean(-1, true)?)?;
    let rstd = xc.square()?.mean(-1, true)?.add_scalar(eps)?.rsqrt()?;
    let xhat = xc.mul(&rstd)?;
    Ok((x.clone(), rstd, xhat))
}

fn rms_rstd<B: Backend>(x: &Tensor<B>, eps: f64) -> Result<Tensor<B>> {
    x.square()?.mean(-1, true)?.add_scalar(eps)?.rsqrt()
}

fn check_param<B: Backend>(x: &Tensor<B>, p: Option<&Tensor<B>>, op: &'static str) -> Result<()> {
    if let Some(p) = p {
        x.same_dtype(p, op)?;
        let d = *x.dims().last().unwrap_or(&0);
        if p.dims() != [d] {
            return Err(Error::ShapeMismatch { op, lhs: x.shape().clone(), rhs: p.shape().clone() });
        }
    }
    Ok(())
}

type NormInputs<B> = (Tensor<B>, Option<Tensor<B>>, Option<Tensor<B>>);

/// Layouts for a norm: the normalised dim whole, scale and bias replicated.
fn norm_inputs<B: Backend>(x: &Tensor<B>, w: Option<&Tensor<B>>, b: Option<&Tensor<B>>) -> Result<NormInputs<B>> {
    Ok((
        rules::whole_along(x, &[x.rank() - 1], false)?,
        w.map(|w| w.replicate()).transpose()?,
        b.map(|b| b.replicate()).transpose()?,
    ))
}

impl<B: Backend> Tensor<B> {
    /// LayerNorm over the last dim: `(x - mean) / sqrt(var + eps) * weight + bias`.
    pub fn layer_norm(&self, weight: Option<&Tensor<B>>, bias: Option<&Tensor<B>>, eps: f64) -> Result<Tensor<B>> {
        self.expect_float("layer_norm")?;
        if self.rank() == 0 {
            return Err(Error::invalid("layer_norm", "needs rank >= 1"));
        }
        check_param(self, weight, "layer_norm (weight)")?;
        check_param(self, bias, "layer_norm (bias)")?;
        let (x0, w0, b0) = norm_inputs(self, weight, bias)?;
        let (this, weight, bias) = (&x0, w0.as_ref(), b0.as_ref());
        let s = this.backend().layer_norm(
            this.storage(),
            this.local_shape(),
            weight.map(|w| w.storage()),
            bias.map(|b| b.storage()),
            eps,
        )?;
        let mut inputs = vec![this];
        inputs.extend(weight);
        inputs.extend(bias);
        let (x, w, has_b) = (this.clone(), weight.cloned(), bias.is_some());
        Ok(Tensor::record_like(this, s, this.dtype(), "layer_norm", &inputs, move |g| {
            let mut out = vec![Some(input_grad(&x, w.as_ref(), g, eps, false)?)];
            if let Some(w) = &w {
                let (_, _, xhat) = layer_norm_parts(&x, eps)?;
                out.push(Some(g.mul(&xhat)?.sum_to(w.shape())?));
            }
            if has_b {
                out.push(Some(g.sum_to(&Shape::new([*x.dims().last().unwrap()]))?));
            }
            Ok(out)
        }))
    }

    /// RMSNorm over the last dim: `x / sqrt(mean(x^2) + eps) * weight`.
    pub fn rms_norm(&self, weight: Option<&Tensor<B>>, eps: f64) -> Result<Tensor<B>> {
        self.expect_float("rms_norm")?;
        if self.rank() == 0 {
            return Err(Error::invalid("rms_norm", "needs rank >= 1"));
        }
        check_param(self, weight, "rms_norm (weight)")?;
        let (x0, w0, _) = norm_inputs(self, weight, None)?;
        let (this, weight) = (&x0, w0.as_ref());
        let s = this.backend().rms_norm(this.storage(), this.local_shape(), weight.map(|w| w.storage()), eps)?;
        let mut inputs = vec![this];
        inputs.extend(weight);
        let (x, w) = (this.clone(), weight.cloned());
        Ok(Tensor::record_like(this, s, this.dtype(), "rms_norm", &inputs, move |g| {
            let mut out = vec![Some(input_grad(&x, w.as_ref(), g, eps, true)?)];
            if let Some(w) = &w {
                let xhat = x.mul(&rms_rstd(&x, eps)?)?;
                out.push(Some(g.mul(&xhat)?.sum_to(w.shape())?));
            }
            Ok(out)
        }))
    }
}
