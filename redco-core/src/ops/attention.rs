//! Scaled-dot-product attention (fused op with a composite default): causal and padding
//! masks, grouped-query heads, and a large negative *finite* fill so that a fully masked
//! row gives finite numbers.

use crate::autograd::GradModeGuard;
use crate::ops::softmax::needs_grad;
use crate::{Backend, DType, Error, HostData, Result, Shape, Tensor};

/// The shapes and options of one attention call.
///
/// `q` is `[batch, q_heads, q_len, head_dim]`, `k` and `v` are
/// `[batch, kv_heads, kv_len, head_dim]` (`q_heads` a multiple of `kv_heads`: grouped-query
/// attention). The optional `mask` is a `U8` tensor (1 = attend) of shape `mask_shape`,
/// broadcastable to `[batch, q_heads, q_len, kv_len]` (a padding mask is
/// `[batch, 1, 1, kv_len]`). With `causal`, query `i` sees keys `j <= i + kv_len - q_len`
/// (queries are the last `q_len` positions, as with a KV cache).
#[derive(Debug, Clone, PartialEq)]
pub struct AttentionSpec {
    /// Batch size.
    pub batch: usize,
    /// Query heads.
    pub q_heads: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Query length.
    pub q_len: usize,
    /// Key/value length.
    pub kv_len: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// Apply a causal mask.
    pub causal: bool,
    /// Score scale (usually `1 / sqrt(head_dim)`).
    pub scale: f64,
    /// Shape of the mask, when there is one.
    pub mask_shape: Option<Shape>,
}

/// The fill value for masked scores: the most negative finite value of `dtype`.
pub fn mask_fill(dtype: DType) -> f64 {
    match dtype {
        DType::F16 => half::f16::MIN.to_f64(),
        DType::BF16 => half::bf16::MIN.to_f64(),
        _ => f32::MIN as f64,
    }
}

/// Composite attention, written with primitive ops.
pub fn composite_attention<B: Backend>(
    b: &B,
    q: &B::Storage,
    k: &B::Storage,
    v: &B::Storage,
    mask: Option<&B::Storage>,
    spec: &AttentionSpec,
) -> Result<B::Storage> {
    let _g = GradModeGuard::no_grad();
    let (q, k, v, mask) = tensors_of(b, q, k, v, mask, spec);
    Ok(attention_ops(&q, &k, &v, mask.as_ref(), spec)?.storage().clone())
}

/// The storages of one attention call as tensors of the shapes `spec` gives.
pub(crate) fn tensors_of<B: Backend>(
    b: &B,
    q: &B::Storage,
    k: &B::Storage,
    v: &B::Storage,
    mask: Option<&B::Storage>,
    spec: &AttentionSpec,
) -> AttentionInputs<B> {
    let dt = b.storage_dtype(q);
    let qs = [spec.batch, spec.q_heads, spec.q_len, spec.head_dim];
    let ks = [spec.batch, spec.kv_heads, spec.kv_len, spec.head_dim];
    let mask = match (mask, &spec.mask_shape) {
        (Some(m), Some(s)) => Some(Tensor::from_storage(b, m.clone(), s.clone(), DType::U8)),
        _ => None,
    };
    (
        Tensor::from_storage(b, q.clone(), qs, dt),
        Tensor::from_storage(b, k.clone(), ks, dt),
        Tensor::from_storage(b, v.clone(), ks, dt),
        mask,
    )
}

/// Repeats each key/value head `rep` times: `[b, h, t, d]` -> `[b, h * rep, t, d]`.
pub fn repeat_kv<B: Backend>(x: &Tensor<B>, rep: usize) -> Result<Tensor<B>> {
    if rep == 1 {
        return Ok(x.clone());
    }
    let d = x.dims();
    let (b, h, t, hd) = (d[0], d[1], d[2], d[3]);
    x.unsqueeze(2)?.expand([b, h, rep, t, hd])?.reshape([b, h * rep, t, hd])
}

/// The causal keep-mask `[q_len, kv_len]` (1 = attend).
pub fn causal_mask<B: Backend>(b: &B, q_len: usize, kv_len: usize) -> Result<Tensor<B>> {
    let off = kv_len as i64 - q_len as i64;
    let v: Vec<u8> = (0..q_len * kv_len).map(|i| ((i % kv_len) as i64 <= (i / kv_len) as i64 + off) as u8).collect();
    Tensor::from_host(b, &HostData::U8(v), [q_len, kv_len])
}

/// Attention from tensor ops (records gradients when enabled).
fn attention_ops<B: Backend>(
    q: &Tensor<B>,
    k: &Tensor<B>,
    v: &Tensor<B>,
    mask: Option<&Tensor<B>>,
    spec: &AttentionSpec,
) -> Result<Tensor<B>> {
    let rep = spec.q_heads / spec.kv_heads;
    attention_probs(q, &repeat_kv(k, rep)?, mask, spec)?.matmul(&repeat_kv(v, rep)?)
}

/// The attention probabilities `softmax(scale * q k^T + mask)` of `q` against keys `k`
/// already repeated to the query heads, as tensor ops.
pub(crate) fn attention_probs<B: Backend>(
    q: &Tensor<B>,
    k: &Tensor<B>,
    mask: Option<&Tensor<B>>,
    spec: &AttentionSpec,
) -> Result<Tensor<B>> {
    let mut scores = q.matmul_t(k)?.scale(spec.scale)?;
    // One keep-mask (causal and padding together), added as 0 / most-negative-finite, as
    // transformers does: values are the same as replacing masked scores, and gradients
    // match transformers' too (a fully masked row still passes gradient to its scores).
    let keep = match (spec.causal, mask) {
        (true, Some(m)) => {
            let zero = Tensor::zeros(q.backend(), [], DType::U8)?;
            Some(causal_mask(q.backend(), spec.q_len, spec.kv_len)?.where_cond(m, &zero)?)
        }
        (true, None) => Some(causal_mask(q.backend(), spec.q_len, spec.kv_len)?),
        (false, m) => m.cloned(),
    };
    if let Some(keep) = keep {
        let fill = Tensor::scalar(q.backend(), mask_fill(q.dtype()), q.dtype())?;
        let zero = Tensor::zeros(q.backend(), [], q.dtype())?;
        scores = scores.add(&keep.where_cond(&zero, &fill)?)?;
    }
    scores.softmax(-1)
}

impl<B: Backend> Tensor<B> {
    /// Scaled-dot-product attention of `self` (queries); see [`AttentionSpec`] for shapes.
    /// `mask` is a `U8` keep-mask broadcastable to `[batch, q_heads, q_len, kv_len]`.
    /// Runs the backend's fused kernel, and when gradients are recorded its fused
    /// backward ([`Backend::attention_backward`]), which recomputes the probabilities
    /// instead of keeping a `[batch, heads, q_len, kv_len]` tensor alive.
    pub fn attention(
        &self,
        k: &Tensor<B>,
        v: &Tensor<B>,
        mask: Option<&Tensor<B>>,
        causal: bool,
        scale: f64,
    ) -> Result<Tensor<B>> {
        let spec = attention_spec(self, k, v, mask, causal, scale)?;
        let (q, k, v, mask) = attention_layout(self, k, v, mask)?;
        let ls = attention_spec_local(&q, &k, mask.as_ref(), &spec);
        // selective recompute keeps the attention's output rather than running it again
        let s = crate::recompute::kept("attention", q.local_shape().elem_count(), || {
            q.backend().attention(q.storage(), k.storage(), v.storage(), mask.as_ref().map(|m| m.storage()), &ls)
        })?;
        if !needs_grad(&[Some(&q), Some(&k), Some(&v)]) {
            return Ok(q.same_layout(s, q.dtype()));
        }
        Ok(crate::ops::attention_grad::record(q, k, v, mask, s, ls))
    }
}

pub(crate) type AttentionInputs<B> = (Tensor<B>, Tensor<B>, Tensor<B>, Option<Tensor<B>>);

/// Layouts for fused attention: batch or heads may be split (keys and values follow the
/// queries; grouped heads need the kv heads to split too), the rest is replicated.
fn attention_layout<B: Backend>(
    q: &Tensor<B>,
    k: &Tensor<B>,
    v: &Tensor<B>,
    mask: Option<&Tensor<B>>,
) -> Result<AttentionInputs<B>> {
    if !(q.is_sharded() || k.is_sharded() || v.is_sharded() || mask.is_some_and(|m| m.is_sharded())) {
        return Ok((q.clone(), k.clone(), v.clone(), mask.cloned()));
    }
    let sizes = crate::sharding::axis_sizes::<B>();
    let mut qp = crate::placement::without_partial(q.placements());
    for (i, p) in qp.0.iter_mut().enumerate() {
        let ok = match *p {
            crate::Placement::Shard(0) => true,
            crate::Placement::Shard(1) => k.dims()[1].is_multiple_of(sizes[i]),
            _ => false,
        };
        if !ok {
            *p = crate::Placement::Replicate;
        }
    }
    let q = q.redistribute(qp)?;
    let (k, v) = (k.redistribute(qp)?, v.redistribute(qp)?);
    let mask = mask.map(|m| crate::sharding::rules::follow(m, qp, 4)).transpose()?;
    Ok((q, k, v, mask))
}

fn attention_spec_local<B: Backend>(
    q: &Tensor<B>,
    k: &Tensor<B>,
    mask: Option<&Tensor<B>>,
    spec: &AttentionSpec,
) -> AttentionSpec {
    let (ql, kl) = (q.local_shape().dims(), k.local_shape().dims());
    AttentionSpec {
        batch: ql[0],
        q_heads: ql[1],
        kv_heads: kl[1],
        mask_shape: mask.map(|m| m.local_shape().clone()),
        ..spec.clone()
    }
}

fn attention_spec<B: Backend>(
    q: &Tensor<B>,
    k: &Tensor<B>,
    v: &Tensor<B>,
    mask: Option<&Tensor<B>>,
    causal: bool,
    scale: f64,
) -> Result<AttentionSpec> {
    q.expect_float("attention")?;
    q.same_dtype(k, "attention (k)")?;
    q.same_dtype(v, "attention (v)")?;
    if q.rank() != 4 || k.rank() != 4 || k.shape() != v.shape() {
        return Err(Error::invalid(
            "attention",
            format!(
                "q, k, v must be [batch, heads, seq, head_dim] with k and v alike; got q {}, k {}, v {}",
                q.shape(),
                k.shape(),
                v.shape()
            ),
        ));
    }
    let (qd, kd) = (q.dims(), k.dims());
    if qd[0] != kd[0] || qd[3] != kd[3] || kd[1] == 0 || qd[1] % kd[1] != 0 {
        return Err(Error::ShapeMismatch {
            op: "attention (q vs k: batch, head_dim, heads multiple)",
            lhs: q.shape().clone(),
            rhs: k.shape().clone(),
        });
    }
    if causal && qd[2] > kd[2] {
        return Err(Error::invalid(
            "attention",
            format!("causal attention needs q_len <= kv_len, got {} > {}", qd[2], kd[2]),
        ));
    }
    let full = Shape::new([qd[0], qd[1], qd[2], kd[2]]);
    if let Some(m) = mask {
        if m.dtype() != DType::U8 {
            return Err(Error::UnsupportedDType { op: "attention (mask must be U8)", dtype: m.dtype() });
        }
        if m.shape().broadcast(&full, "attention (mask)")? != full {
            return Err(Error::ShapeMismatch { op: "attention (mask)", lhs: m.shape().clone(), rhs: full });
        }
    }
    Ok(AttentionSpec {
        batch: qd[0],
        q_heads: qd[1],
        kv_heads: kd[1],
        q_len: qd[2],
        kv_len: kd[2],
        head_dim: qd[3],
        causal,
        scale,
        mask_shape: mask.map(|m| m.shape().clone()),
    })
}
