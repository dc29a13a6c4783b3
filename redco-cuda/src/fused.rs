//! Fused ops: softmax, norms, rotary, cross-entropy (`kernels/<family>.cu`).

use crate::context::{tn, Cuda};
use crate::elementwise::{fits, same};
use crate::launch::{elementwise, per_row};
use crate::storage::CudaStorage;
use cudarc::driver::PushKernelArg;
use redco_core::backend::RotaryMode;
use redco_core::{Error, Result, Shape};

/// `(rows, row length)` of a tensor normalised over its last dimension.
fn rows_of(shape: &Shape, op: &'static str) -> Result<(usize, usize)> {
    let n = *shape.dims().last().ok_or_else(|| Error::invalid(op, "a scalar has no last dimension"))?;
    Ok((shape.elem_count().checked_div(n).unwrap_or(0), n))
}

impl Cuda {
    pub(crate) fn softmax_op(&self, x: &CudaStorage, shape: &Shape, log: bool) -> Result<CudaStorage> {
        fits(x, shape, "softmax")?;
        if !x.dtype().is_float() {
            return Err(Error::UnsupportedDType { op: "softmax", dtype: x.dtype() });
        }
        let (rows, n) = rows_of(shape, "softmax")?;
        let y = self.alloc(x.len(), x.dtype())?;
        if rows > 0 {
            let f = self.function("softmax", &format!("softmax_{}", tn(x.dtype())))?;
            let (xp, yp, r, c, lg) = (x.ptr(), y.ptr(), rows as i64, n as i64, log as i32);
            self.launch(&f, per_row(rows, n), |l| {
                l.arg(&xp).arg(&yp).arg(&r).arg(&c).arg(&lg);
            })?;
        }
        Ok(y)
    }

    pub(crate) fn norm_op(
        &self,
        x: &CudaStorage,
        shape: &Shape,
        weight: Option<&CudaStorage>,
        bias: Option<&CudaStorage>,
        eps: f64,
        rms: bool,
    ) -> Result<CudaStorage> {
        let op = if rms { "rms_norm" } else { "layer_norm" };
        fits(x, shape, op)?;
        if !x.dtype().is_float() {
            return Err(Error::UnsupportedDType { op, dtype: x.dtype() });
        }
        let (rows, n) = rows_of(shape, op)?;
        for p in [weight, bias].into_iter().flatten() {
            same(x, p, op)?;
            fits(p, &Shape::new([n]), op)?;
        }
        let y = self.alloc(x.len(), x.dtype())?;
        if rows > 0 {
            let f = self.function("norm", &format!("{op}_{}", tn(x.dtype())))?;
            let (xp, yp, r, c) = (x.ptr(), y.ptr(), rows as i64, n as i64);
            let (wp, bp) = (weight.map_or(0, |w| w.ptr()), bias.map_or(0, |b| b.ptr()));
            self.launch(&f, per_row(rows, n), |l| {
                l.arg(&xp).arg(&wp);
                if !rms {
                    l.arg(&bp);
                }
                l.arg(&yp).arg(&r).arg(&c).arg(&eps);
            })?;
        }
        Ok(y)
    }

    /// The input gradient of LayerNorm (`rms` false) or RMSNorm (`rms` true) for the output
    /// gradient `g` (`Backend::norm_backward`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn norm_backward_op(
        &self,
        x: &CudaStorage,
        shape: &Shape,
        weight: Option<&CudaStorage>,
        g: &CudaStorage,
        eps: f64,
        rms: bool,
    ) -> Result<CudaStorage> {
        let op = "norm_backward";
        fits(x, shape, op)?;
        same(x, g, op)?;
        fits(g, shape, op)?;
        if !x.dtype().is_float() {
            return Err(Error::UnsupportedDType { op, dtype: x.dtype() });
        }
        let (rows, n) = rows_of(shape, op)?;
        if let Some(w) = weight {
            same(x, w, op)?;
            fits(w, &Shape::new([n]), op)?;
        }
        let dx = self.alloc(x.len(), x.dtype())?;
        if rows > 0 {
            let f = self.function("norm", &format!("norm_bwd_{}", tn(x.dtype())))?;
            let (xp, wp, gp, dp) = (x.ptr(), weight.map_or(0, |w| w.ptr()), g.ptr(), dx.ptr());
            let (r, c, center) = (rows as i64, n as i64, (!rms) as i32);
            self.launch(&f, per_row(rows, n), |l| {
                l.arg(&xp).arg(&wp).arg(&gp).arg(&dp).arg(&r).arg(&c).arg(&eps).arg(&center);
            })?;
        }
        Ok(dx)
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rotary_op(
        &self,
        x: &CudaStorage,
        shape: &Shape,
        cos: &CudaStorage,
        sin: &CudaStorage,
        cs_shape: &Shape,
        mode: RotaryMode,
    ) -> Result<CudaStorage> {
        fits(x, shape, "rotary")?;
        fits(cos, cs_shape, "rotary")?;
        fits(sin, cs_shape, "rotary")?;
        same(x, cos, "rotary")?;
        same(x, sin, "rotary")?;
        let bad = || Error::ShapeMismatch { op: "rotary", lhs: shape.clone(), rhs: cs_shape.clone() };
        let (xd, cd) = (shape.dims(), cs_shape.dims());
        if xd.len() < 2 || !(cd.len() == 2 || (cd.len() == 3 && xd.len() == 4)) {
            return Err(bad());
        }
        let (d, seq) = (xd[xd.len() - 1], xd[xd.len() - 2]);
        let half = cd[cd.len() - 1];
        if 2 * half > d || cd[cd.len() - 2] != seq || (cd.len() == 3 && cd[0] != xd[0]) {
            return Err(bad());
        }
        let per_batch = if cd.len() == 3 { xd[1] * seq } else { 0 };
        let rows = x.len().checked_div(d).unwrap_or(0);
        let y = self.alloc(x.len(), x.dtype())?;
        if !x.is_empty() {
            let f = self.function("rotary", &format!("rotary_{}", tn(x.dtype())))?;
            let (xp, cp, sp, yp) = (x.ptr(), cos.ptr(), sin.ptr(), y.ptr());
            let a = [rows as i64, d as i64, half as i64, seq as i64, per_batch as i64];
            let m: i32 = if mode == RotaryMode::Interleaved { 0 } else { 1 };
            self.launch(&f, elementwise(x.len()), |l| {
                l.arg(&xp).arg(&cp).arg(&sp).arg(&yp).arg(&a[0]).arg(&a[1]).arg(&a[2]).arg(&a[3]).arg(&a[4]).arg(&m);
            })?;
        }
        Ok(y)
    }

    /// Cross-entropy rows (`grad` None) or their gradient (`grad` the per-row gradient).
    pub(crate) fn xent_op(
        &self,
        logits: &CudaStorage,
        shape: &Shape,
        targets: &CudaStorage,
        ignore: i64,
        grad: Option<&CudaStorage>,
    ) -> Result<CudaStorage> {
        fits(logits, shape, "cross_entropy")?;
        if shape.rank() != 2 {
            return Err(Error::invalid("cross_entropy", format!("logits must be [rows, vocab], not {shape:?}")));
        }
        let (rows, vocab) = (shape.dims()[0], shape.dims()[1]);
        fits(targets, &Shape::new([rows]), "cross_entropy (targets)")?;
        let idn = match targets.dtype() {
            redco_core::DType::I64 => "i64",
            redco_core::DType::I32 => "i32",
            d => return Err(Error::UnsupportedDType { op: "cross_entropy (targets)", dtype: d }),
        };
        if let Some(g) = grad {
            same(logits, g, "cross_entropy_backward")?;
            fits(g, &Shape::new([rows]), "cross_entropy_backward (grad)")?;
        }
        let y = self.alloc(if grad.is_some() { logits.len() } else { rows }, logits.dtype())?;
        let flag = self.flag()?;
        if rows > 0 {
            let name = if grad.is_some() { "xent_grad" } else { "xent" };
            let f = self.function("cross_entropy", &format!("{name}_{}_{idn}", tn(logits.dtype())))?;
            let (xp, tp, yp, fp, r, v) = (logits.ptr(), targets.ptr(), y.ptr(), flag.ptr(), rows as i64, vocab as i64);
            let gp = grad.map_or(0, |g| g.ptr());
            self.launch(&f, per_row(rows, vocab), |l| {
                l.arg(&xp).arg(&tp);
                if grad.is_some() {
                    l.arg(&gp);
                }
                l.arg(&yp).arg(&r).arg(&v).arg(&ignore).arg(&fp);
            })?;
        }
        // targets known on the host to be in range (uploaded labels) need no read-back
        if !targets.known_within(vocab, Some(ignore)) && self.flag_set(&flag)? {
            let t = self.download_data(targets)?.to_i64_vec()?;
            let index = t.into_iter().find(|&i| i != ignore && (i < 0 || i as u64 >= vocab as u64)).unwrap_or(-1);
            return Err(Error::IndexOutOfRange { op: "cross_entropy", index, size: vocab });
        }
        Ok(y)
    }
}
