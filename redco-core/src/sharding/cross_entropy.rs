//! Vocab-parallel cross-entropy (Megatron-LM's): with the logits split over the
//! vocabulary, each rank reduces its slice and three all-reduces of one scalar per token
//! (max, sum of exponentials, target logit) give the loss; the logits are never gathered,
//! and the backward pass is local. A batch split passes through.

use super::axis_index::{axis_offset, index_dtype};
use super::redistribute::comm;
use crate::autograd::GradModeGuard;
use crate::backend::CmpOp;
use crate::runtime::ReduceKind;
use crate::{Backend, DType, MeshAxis, Placement, Placements, Result, Shape, Tensor};

fn view<B: Backend>(t: &Tensor<B>) -> Tensor<B> {
    Tensor::from_storage(t.backend(), t.storage().clone(), t.local_shape().clone(), t.dtype())
}

/// Per-row cross-entropy of `logits` `[n, vocab]` against `targets` `[n]` when either is
/// sharded; returns `[n]`.
pub(crate) fn cross_entropy_sharded<B: Backend>(
    logits: &Tensor<B>,
    targets: &Tensor<B>,
    ignore: i64,
) -> Result<Tensor<B>> {
    let mut lp = crate::placement::without_partial(logits.placements());
    let mut tp = Placements::REPLICATED;
    for axis in [MeshAxis::Dp, MeshAxis::Mp] {
        match lp.get(axis) {
            Placement::Shard(0) => tp = tp.with(axis, Placement::Shard(0)),
            Placement::Shard(1) => {}
            _ => lp = lp.with(axis, Placement::Replicate),
        }
    }
    let x = logits.redistribute(lp)?;
    let t = targets.redistribute(tp)?;
    let vocab_axis = [MeshAxis::Dp, MeshAxis::Mp].into_iter().find(|a| lp.get(*a) == Placement::Shard(1));
    let c = vocab_axis.map(|_| comm::<B>("cross_entropy")).transpose()?;
    let b = x.backend().clone();
    let (n, vl) = (x.local_shape().dims()[0], x.local_shape().dims()[1]);
    let bytes = n * x.dtype().size_in_bytes();
    let reduce = |s: &Tensor<B>, kind: ReduceKind| -> Result<Tensor<B>> {
        match (vocab_axis, &c) {
            (Some(a), Some(c)) => {
                let r = c.all_reduce(a, s.storage(), kind, bytes)?;
                Ok(Tensor::from_storage(&b, r, s.shape().clone(), s.dtype()))
            }
            _ => Ok(s.clone()),
        }
    };
    let _ng = GradModeGuard::no_grad();
    let (xv, tv) = (view(&x), view(&t));
    let m = reduce(&xv.max(-1, true)?, ReduceKind::Max)?;
    let sum = reduce(&xv.sub(&m)?.exp()?.sum(-1, true)?, ReduceKind::Sum)?;
    let lse = sum.log()?.add(&m)?; // [n, 1]
                                   // the target's logit, from the rank whose slice holds it
    let valid = tv.compare_scalar(ignore as f64, CmpOp::Ne)?;
    // index arithmetic in f64 where the backend has it, else f32 (exact for ids below
    // 2^24); the start of this rank's vocabulary slice is computed on the device
    let fd = index_dtype(&b);
    let tf = match (vocab_axis, &c) {
        (Some(a), Some(c)) => tv.cast(fd)?.sub(&axis_offset(c, &b, a, vl)?)?,
        _ => tv.cast(fd)?,
    };
    let mine = tf.compare_scalar(0.0, CmpOp::Ge)?.cast(fd)?.mul(&tf.compare_scalar(vl as f64, CmpOp::Lt)?.cast(fd)?)?;
    let mine = mine.mul(&valid.cast(fd)?)?; // [n] 0/1
    let local_idx = tf.mul(&mine)?.cast(DType::I64)?.unsqueeze(-1)?;
    let picked = xv.gather(&local_idx, -1)?.mul(&mine.cast(x.dtype())?.unsqueeze(-1)?)?;
    let picked = reduce(&picked, ReduceKind::Sum)?;
    let zero = Tensor::zeros(&b, [], x.dtype())?;
    let loss = valid.where_cond(&lse.sub(&picked)?.squeeze(-1)?, &zero)?;
    drop(_ng);
    let out_p =
        Placements::REPLICATED.with(MeshAxis::Dp, tp.get(MeshAxis::Dp)).with(MeshAxis::Mp, tp.get(MeshAxis::Mp));
    let (gshape, xl, dt) = (Shape::new([logits.dims()[0]]), x.local_shape().clone(), x.dtype());
    let (xs, bc, xg, xp) = (xv.clone(), b.clone(), x.shape().clone(), lp);
    Ok(Tensor::from_op_placed(
        &b,
        loss.storage().clone(),
        gshape,
        Shape::new([n]),
        out_p,
        dt,
        "cross_entropy",
        &[&x],
        move |g| {
            if crate::is_grad_enabled() {
                return Err(crate::Error::unsupported(
                    "backward_graph",
                    "second-order gradients through the vocabulary-parallel cross-entropy are not supported (keep the head unsplit along mp)",
                ));
            }
            let _ng = GradModeGuard::no_grad();
            let g = g.redistribute(out_p)?;
            let gv = view(&g);
            let p = xs.sub(&lse)?.exp()?;
            let ones = mine.cast(dt)?.unsqueeze(-1)?;
            let onehot = p.zeros_like()?.scatter_add(&local_idx, &ones, -1)?;
            let w = valid.cast(dt)?.mul(&gv)?.unsqueeze(-1)?;
            let gl = p.sub(&onehot)?.mul(&w)?;
            Ok(vec![Some(Tensor::from_local(&bc, gl.storage().clone(), xg.clone(), xl.clone(), xp, dt))])
        },
    ))
}
