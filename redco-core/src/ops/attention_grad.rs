//! The gradient of fused attention: the recorded op that calls
//! [`Backend::attention_backward`], and that op's composite default.
//!
//! With `P = softmax(scale * q k^T + mask)` and `out = P v`, given `dout`:
//! `dv = P^T dout`, `dP = dout v^T`, `dS = P * (dP - rowsum(P * dP))`,
//! `dq = scale * dS k`, `dk = scale * dS^T q`, the key/value gradients summed over the
//! query heads that share them.

use crate::autograd::GradModeGuard;
use crate::ops::attention::{attention_probs, repeat_kv, tensors_of, AttentionSpec};
use crate::{Backend, Result, Tensor};

/// Records `s` (the fused attention of the local `q`, `k`, `v` under `spec`) as an op whose
/// backward is the backend's fused attention backward.
pub(crate) fn record<B: Backend>(
    q: Tensor<B>,
    k: Tensor<B>,
    v: Tensor<B>,
    mask: Option<Tensor<B>>,
    s: B::Storage,
    spec: AttentionSpec,
) -> Tensor<B> {
    let (qd, kd, vd) = (q.detach(), k.detach(), v.detach());
    let (qc, kc, vc) = (q.clone(), k.clone(), v.clone());
    Tensor::record_like(&q, s, q.dtype(), "attention", &[&q, &k, &v], move |g| {
        let g = g.redistribute(qd.placements())?;
        if crate::is_grad_enabled() {
            // building a graph of the gradients: the composite formulas as recorded ops
            let (dq, dk, dv) = attention_grads(&qc, &kc, &vc, mask.as_ref(), &g, &spec)?;
            return Ok(vec![Some(dq), Some(dk), Some(dv)]);
        }
        let m = mask.as_ref().map(|m| m.storage());
        let (dq, dk, dv) =
            qd.backend().attention_backward(qd.storage(), kd.storage(), vd.storage(), m, g.storage(), &spec)?;
        Ok(vec![
            Some(qd.same_layout(dq, qd.dtype())),
            Some(kd.same_layout(dk, kd.dtype())),
            Some(vd.same_layout(dv, vd.dtype())),
        ])
    })
}

/// Composite attention backward, written with primitive ops.
pub fn composite_attention_backward<B: Backend>(
    b: &B,
    q: &B::Storage,
    k: &B::Storage,
    v: &B::Storage,
    mask: Option<&B::Storage>,
    dout: &B::Storage,
    spec: &AttentionSpec,
) -> Result<(B::Storage, B::Storage, B::Storage)> {
    let _g = GradModeGuard::no_grad();
    let (q, k, v, mask) = tensors_of(b, q, k, v, mask, spec);
    let g = Tensor::from_storage(b, dout.clone(), q.shape().clone(), q.dtype());
    let (dq, dk, dv) = attention_grads(&q, &k, &v, mask.as_ref(), &g, spec)?;
    Ok((dq.storage().clone(), dk.storage().clone(), dv.storage().clone()))
}

/// `(dq, dk, dv)` from tensor ops (recorded when gradients are: the backward of a graph
/// of the gradients).
fn attention_grads<B: Backend>(
    q: &Tensor<B>,
    k: &Tensor<B>,
    v: &Tensor<B>,
    mask: Option<&Tensor<B>>,
    g: &Tensor<B>,
    spec: &AttentionSpec,
) -> Result<(Tensor<B>, Tensor<B>, Tensor<B>)> {
    let rep = spec.q_heads / spec.kv_heads;
    let (kr, vr) = (repeat_kv(k, rep)?, repeat_kv(v, rep)?);
    let p = attention_probs(q, &kr, mask, spec)?;
    let pt = p.transpose(-1, -2)?;
    let dv = pt.matmul(g)?;
    let dp = g.matmul_t(&vr)?;
    let ds = p.mul(&dp.sub(&dp.mul(&p)?.sum(-1, true)?)?)?;
    let dq = ds.matmul(&kr)?.scale(spec.scale)?;
    let dk = ds.transpose(-1, -2)?.matmul(q)?.scale(spec.scale)?;
    // sum the repeated heads back onto their shared key/value head
    let fold = |t: Tensor<B>| -> Result<Tensor<B>> {
        if rep == 1 {
            return Ok(t);
        }
        let d = t.dims().to_vec();
        t.reshape([d[0], d[1] / rep, rep, d[2], d[3]])?.sum(2, false)
    };
    Ok((dq, fold(dk)?, fold(dv)?))
}
