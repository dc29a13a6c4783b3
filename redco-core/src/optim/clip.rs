//! Clipping by the global gradient norm over every shard of every parameter.

use crate::dist::{Comm, ReduceKind};
use crate::{no_grad, Backend, DType, GradStore, HostData, MeshAxis, Placement, Result, Tensor};

/// The global L2 norm of the gradients of `params`, counting each element once across the
/// mesh: model-parallel shards add up (one scalar all-reduce), replicated gradients count
/// once. Gradients must already be summed over the data-parallel axis. The squares are
/// summed in f64 where the backend has it (else in f32). `comm` is the rank's communicator
/// (none outside a mesh).
pub fn global_grad_norm<B: Backend>(comm: Option<&Comm<B>>, params: &[Tensor<B>], grads: &GradStore<B>) -> Result<f64> {
    no_grad(|| {
        let (mut split, mut whole) = (0.0f64, 0.0f64);
        for p in params {
            let Some(g) = grads.get(p) else { continue };
            let local = Tensor::from_storage(g.backend(), g.storage().clone(), g.local_shape().clone(), g.dtype());
            let acc = if g.backend().supports(DType::F64) { DType::F64 } else { DType::F32 };
            let sq = local.cast(acc)?.square()?.sum_all()?.to_scalar()?;
            if matches!(g.placements().get(MeshAxis::Mp), Placement::Shard(_)) {
                split += sq;
            } else {
                whole += sq;
            }
        }
        if let Some(c) = comm {
            if c.mesh().mp > 1 {
                let b = params.first().map(|p| p.backend().clone());
                if let Some(b) = b {
                    let (host, bytes) = if b.supports(DType::F64) {
                        (HostData::F64(vec![split]), 8)
                    } else {
                        (HostData::F32(vec![split as f32]), 4)
                    };
                    let s = b.upload(&host)?;
                    let r = c.all_reduce(MeshAxis::Mp, &s, ReduceKind::Sum, bytes)?;
                    split = b.download(&r)?.to_f64_vec()[0];
                }
            }
        }
        Ok((split + whole).sqrt())
    })
}

/// Scales every gradient so that the global norm is at most `max_norm`; returns the norm
/// before clipping. A non-finite norm is returned unchanged (the caller decides).
pub fn clip_grad_norm<B: Backend>(
    comm: Option<&Comm<B>>,
    params: &[Tensor<B>],
    grads: &mut GradStore<B>,
    max_norm: f64,
) -> Result<f64> {
    let norm = global_grad_norm(comm, params, grads)?;
    if norm.is_finite() && norm > max_norm && norm > 0.0 {
        let s = max_norm / norm;
        no_grad(|| -> Result<()> {
            for p in params {
                if let Some(g) = grads.get(p).cloned() {
                    grads.insert(p, g.scale(s)?);
                }
            }
            Ok(())
        })?;
    }
    Ok(norm)
}
