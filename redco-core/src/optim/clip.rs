//! Clipping by the global gradient norm over every shard of every parameter.

use crate::runtime::{Comm, ReduceKind};
use crate::{no_grad, Backend, DType, GradStore, HostData, MeshAxis, Placement, Result, Tensor};

/// The global L2 norm of the gradients of `params`, counting each element once across the
/// mesh: model-parallel shards add up (one scalar all-reduce), replicated gradients count
/// once. Gradients must already be summed over the data-parallel axis. The squares are
/// summed in f64 on the device where the backend has f64, with one host read at the end
/// (else each parameter's f32 sum is read and added in f64). `comm` is the rank's communicator
/// (none outside a mesh).
pub fn global_grad_norm<B: Backend>(comm: Option<&Comm<B>>, params: &[Tensor<B>], grads: &GradStore<B>) -> Result<f64> {
    let Some(b) = params.first().map(|p| p.backend().clone()) else { return Ok(0.0) };
    if b.supports(DType::F64) {
        return device_grad_norm(&b, comm, params, grads);
    }
    no_grad(|| {
        let (mut split, mut whole) = (0.0f64, 0.0f64);
        for p in params {
            let Some(g) = grads.get(p) else { continue };
            let local = Tensor::from_storage(g.backend(), g.storage().clone(), g.local_shape().clone(), g.dtype());
            let sq = local.cast(DType::F32)?.square()?.sum_all()?.to_scalar()?;
            if matches!(g.placements().get(MeshAxis::Mp), Placement::Shard(_)) {
                split += sq;
            } else {
                whole += sq;
            }
        }
        if let Some(c) = comm.filter(|c| c.mesh().mp > 1) {
            let s = b.upload(&HostData::F32(vec![split as f32]))?;
            let r = c.all_reduce(MeshAxis::Mp, &s, ReduceKind::Sum, 4)?;
            split = b.download(&r)?.to_f64_vec()[0];
        }
        Ok((split + whole).sqrt())
    })
}

/// [`global_grad_norm`] on a backend with f64: the squares are summed on the device (in
/// the order the host would, so the bits are the same) and read once, at the end.
fn device_grad_norm<B: Backend>(
    b: &B,
    comm: Option<&Comm<B>>,
    params: &[Tensor<B>],
    grads: &GradStore<B>,
) -> Result<f64> {
    no_grad(|| {
        // the gradients split over mp and the whole ones, each summed in one backend call
        let (mut split_xs, mut whole_xs) = (Vec::new(), Vec::new());
        for p in params {
            let Some(g) = grads.get(p) else { continue };
            let item = (g.storage(), g.local_shape());
            if matches!(g.placements().get(MeshAxis::Mp), Placement::Shard(_)) {
                split_xs.push(item);
            } else {
                whole_xs.push(item);
            }
        }
        let sum = |xs: &[(&B::Storage, &crate::Shape)]| -> Result<Tensor<B>> {
            let s = b.sum_squares_many(xs)?;
            let dt = b.storage_dtype(&s);
            let t = Tensor::from_storage(b, s, [], dt);
            if dt == DType::F64 {
                Ok(t)
            } else {
                t.cast(DType::F64)
            }
        };
        let (mut split, whole) = (sum(&split_xs)?, sum(&whole_xs)?);
        if let Some(c) = comm.filter(|c| c.mesh().mp > 1) {
            let r = c.all_reduce(MeshAxis::Mp, split.storage(), ReduceKind::Sum, 8)?;
            split = Tensor::from_storage(b, r, split.shape().clone(), DType::F64);
        }
        split.add(&whole)?.sqrt()?.to_scalar()
    })
}

/// The factor that brings gradients of global norm `norm` to at most `max_norm`: 1 when
/// they are within it, or when `norm` is not finite (the caller decides about those).
pub fn clip_factor(norm: f64, max_norm: f64) -> f64 {
    if norm.is_finite() && norm > max_norm && norm > 0.0 {
        max_norm / norm
    } else {
        1.0
    }
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
    scale_to_norm(params, grads, norm, max_norm)?;
    Ok(norm)
}

/// Scales the gradients of `params`, whose global norm is `norm`, to `max_norm` when `norm`
/// exceeds it (a non-finite norm leaves them alone): clipping once the norm is known.
pub fn scale_to_norm<B: Backend>(
    params: &[Tensor<B>],
    grads: &mut GradStore<B>,
    norm: f64,
    max_norm: f64,
) -> Result<()> {
    let s = clip_factor(norm, max_norm);
    if s != 1.0 {
        no_grad(|| -> Result<()> {
            for p in params {
                if let Some(g) = grads.get(p).cloned() {
                    grads.insert(p, g.scale(s)?);
                }
            }
            Ok(())
        })?;
    }
    Ok(())
}
