//! Fused attention forward and backward (`kernels/attention.cu`, tiled through shared
//! memory: [`crate::launch::attention`] picks the tile); shapes the kernels do not take
//! (head_dim above 256) fall back to the composite.

use crate::context::{tn, Cuda};
use crate::elementwise::{fits, same};
use crate::launch::{attention as tiles, AttnPass, MAX_HEAD_DIM};
use crate::storage::CudaStorage;
use cudarc::driver::{DeviceRepr, PushKernelArg};
use redco_core::ops::attention::AttentionSpec;
use redco_core::{DType, Error, Result, Shape};

/// The kernels' `AttnArgs`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct AttnArgs {
    batch: i64,
    q_heads: i64,
    kv_heads: i64,
    q_len: i64,
    kv_len: i64,
    head_dim: i64,
    ms: [i64; 4],
    causal: i32,
    has_mask: i32,
    scale: f64,
}
// SAFETY: #[repr(C)] integers and a float, laid out as the kernels' `AttnArgs`
unsafe impl DeviceRepr for AttnArgs {}

/// Validates the operands and builds the kernels' arguments; `None` when the fused kernels
/// do not take this shape (the caller uses the composite).
pub(crate) fn args(
    q: &CudaStorage,
    k: &CudaStorage,
    v: &CudaStorage,
    mask: Option<&CudaStorage>,
    s: &AttentionSpec,
) -> Result<Option<AttnArgs>> {
    same(q, k, "attention (k)")?;
    same(q, v, "attention (v)")?;
    let qs = Shape::new([s.batch, s.q_heads, s.q_len, s.head_dim]);
    let ks = Shape::new([s.batch, s.kv_heads, s.kv_len, s.head_dim]);
    if s.kv_heads == 0 || !s.q_heads.is_multiple_of(s.kv_heads) {
        return Err(Error::ShapeMismatch { op: "attention (heads)", lhs: qs, rhs: ks });
    }
    fits(q, &qs, "attention (q)")?;
    fits(k, &ks, "attention (k)")?;
    fits(v, &ks, "attention (v)")?;
    let full = Shape::new([s.batch, s.q_heads, s.q_len, s.kv_len]);
    let mut ms = [0i64; 4];
    if let (Some(m), Some(mshape)) = (mask, &s.mask_shape) {
        if m.dtype() != DType::U8 {
            return Err(Error::UnsupportedDType { op: "attention (mask must be U8)", dtype: m.dtype() });
        }
        fits(m, mshape, "attention (mask)")?;
        if mshape.rank() > 4 || mshape.broadcast(&full, "attention (mask)")? != full {
            return Err(Error::ShapeMismatch { op: "attention (mask)", lhs: mshape.clone(), rhs: full });
        }
        for (k, st) in mshape.broadcast_strides(&full).into_iter().enumerate() {
            ms[k] = st as i64;
        }
    }
    if s.head_dim > MAX_HEAD_DIM || s.kv_len == 0 || !q.dtype().is_float() {
        return Ok(None);
    }
    Ok(Some(AttnArgs {
        batch: s.batch as i64,
        q_heads: s.q_heads as i64,
        kv_heads: s.kv_heads as i64,
        q_len: s.q_len as i64,
        kv_len: s.kv_len as i64,
        head_dim: s.head_dim as i64,
        ms,
        causal: s.causal as i32,
        has_mask: (mask.is_some() && s.mask_shape.is_some()) as i32,
        scale: s.scale,
    }))
}

/// Bytes of the kernels' accumulation type for `q`'s dtype (f64 for f64, else f32).
fn acc_bytes(q: &CudaStorage) -> usize {
    if q.dtype() == DType::F64 {
        8
    } else {
        4
    }
}

impl Cuda {
    pub(crate) fn attention_op(
        &self,
        q: &CudaStorage,
        k: &CudaStorage,
        v: &CudaStorage,
        mask: Option<&CudaStorage>,
        s: &AttentionSpec,
    ) -> Result<Option<CudaStorage>> {
        let Some(a) = args(q, k, v, mask, s)? else { return Ok(None) };
        let rows = s.batch * s.q_heads * s.q_len;
        let out = self.alloc(q.len(), q.dtype())?;
        if rows > 0 {
            let f = self.function("attention", &format!("attn_fwd_{}", tn(q.dtype())))?;
            let (cfg, tile) = tiles(AttnPass::Forward, s.q_len, s.batch * s.q_heads, s.head_dim, acc_bytes(q))?;
            let (qp, kp, vp, mp, op) = (q.ptr(), k.ptr(), v.ptr(), mask.map_or(0, |m| m.ptr()), out.ptr());
            self.launch(&f, cfg, |l| {
                l.arg(&qp).arg(&kp).arg(&vp).arg(&mp).arg(&op).arg(&a).arg(&tile);
            })?;
        }
        Ok(Some(out))
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn attention_backward_op(
        &self,
        q: &CudaStorage,
        k: &CudaStorage,
        v: &CudaStorage,
        mask: Option<&CudaStorage>,
        dout: &CudaStorage,
        s: &AttentionSpec,
    ) -> Result<Option<(CudaStorage, CudaStorage, CudaStorage)>> {
        let Some(a) = args(q, k, v, mask, s)? else { return Ok(None) };
        same(q, dout, "attention_backward (dout)")?;
        fits(dout, &Shape::new([s.batch, s.q_heads, s.q_len, s.head_dim]), "attention_backward (dout)")?;
        let rows = s.batch * s.q_heads * s.q_len;
        let kv_rows = s.batch * s.kv_heads * s.kv_len;
        let acc = if q.dtype() == DType::F64 { DType::F64 } else { DType::F32 };
        let (dq, dk, dv) =
            (self.alloc(q.len(), q.dtype())?, self.alloc(k.len(), k.dtype())?, self.alloc(v.len(), v.dtype())?);
        let (lse, dd) = (self.alloc(rows, acc)?, self.alloc(rows, acc)?);
        let t = tn(q.dtype());
        let (qp, kp, vp, mp, gp) = (q.ptr(), k.ptr(), v.ptr(), mask.map_or(0, |m| m.ptr()), dout.ptr());
        let (dqp, dkp, dvp, lp, dp) = (dq.ptr(), dk.ptr(), dv.ptr(), lse.ptr(), dd.ptr());
        if rows > 0 {
            let f = self.function("attention", &format!("attn_bwd_q_{t}"))?;
            let (cfg, tile) = tiles(AttnPass::Queries, s.q_len, s.batch * s.q_heads, s.head_dim, acc_bytes(q))?;
            self.launch(&f, cfg, |l| {
                l.arg(&qp).arg(&kp).arg(&vp).arg(&mp).arg(&gp).arg(&dqp).arg(&lp).arg(&dp).arg(&a).arg(&tile);
            })?;
        }
        if kv_rows > 0 {
            if rows == 0 {
                // no query: the key and value gradients are zero
                return Ok(Some((dq, self.fill(k.len(), 0.0, k.dtype())?, self.fill(v.len(), 0.0, v.dtype())?)));
            }
            let f = self.function("attention", &format!("attn_bwd_kv_{t}"))?;
            let (cfg, tile) = tiles(AttnPass::Keys, s.kv_len, s.batch * s.kv_heads, s.head_dim, acc_bytes(q))?;
            self.launch(&f, cfg, |l| {
                l.arg(&qp).arg(&kp).arg(&vp).arg(&mp).arg(&gp).arg(&lp).arg(&dp).arg(&dkp).arg(&dvp).arg(&a).arg(&tile);
            })?;
        }
        Ok(Some((dq, dk, dv)))
    }
}
