//! Clipping by the global gradient norm over every shard of every parameter.

use crate::runtime::{Comm, ReduceKind};
use crate::{no_grad, Backend, DType, GradStore, HostData, MeshAxis, Placement, Result, Tensor};

/// The axes a gradient is split over: its sum of squares is summed over them.
fn split_axes<B: Backend>(g: &Tensor<B>) -> usize {
    let split = |a: MeshAxis| matches!(g.placements().get(a), Placement::Shard(_));
    usize::from(split(MeshAxis::Mp)) | (usize::from(split(MeshAxis::Dp)) << 1)
}

/// The axes of group `k` of [`split_axes`] that have more than one rank.
fn axes_of<B: Backend>(c: &Comm<B>, k: usize) -> Vec<MeshAxis> {
    let mesh = c.mesh();
    [(1, MeshAxis::Mp, mesh.mp), (2, MeshAxis::Dp, mesh.dp)]
        .into_iter()
        .filter(|&(bit, _, n)| k & bit != 0 && n > 1)
        .map(|(_, a, _)| a)
        .collect()
}

/// The global L2 norm of the gradients of `params`, counting each element once across the
/// mesh: model-parallel shards add up (one scalar all-reduce), and so do the shards of
/// gradients split over `dp` (the experts under expert parallelism); replicated gradients
/// count once. Gradients must already be summed over the data-parallel axis. The squares are
/// summed in f64 on the device where the backend has f64, with one host read at the end
/// (else each parameter's f32 sum is read and added in f64). `comm` is the rank's communicator
/// (none outside a mesh).
pub fn global_grad_norm<B: Backend>(comm: Option<&Comm<B>>, params: &[Tensor<B>], grads: &GradStore<B>) -> Result<f64> {
    let Some(b) = params.first().map(|p| p.backend().clone()) else { return Ok(0.0) };
    if b.supports(DType::F64) {
        return device_grad_norm(&b, comm, params, grads);
    }
    no_grad(|| {
        // by the axes they are split over: none, mp, dp, both
        let mut sums = [0.0f64; 4];
        let mut present = [false; 4];
        for p in params {
            let Some(g) = grads.get(p) else { continue };
            let local = Tensor::from_storage(g.backend(), g.storage().clone(), g.local_shape().clone(), g.dtype());
            sums[split_axes(g)] += local.cast(DType::F32)?.square()?.sum_all()?.to_scalar()?;
            present[split_axes(g)] = true;
        }
        if let Some(c) = comm {
            // the mp-split sum is summed always (as it always was); the dp-split ones where
            // there are any
            for (k, sum) in sums.iter_mut().enumerate().skip(1).filter(|(k, _)| *k == 1 || present[*k]) {
                for a in axes_of(c, k) {
                    let s = b.upload(&HostData::F32(vec![*sum as f32]))?;
                    let r = c.all_reduce(a, &s, ReduceKind::Sum, 4)?;
                    *sum = b.download(&r)?.to_f64_vec()[0];
                }
            }
        }
        Ok((sums[1] + sums[0] + sums[2] + sums[3]).sqrt())
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
        // by the axes they are split over (none, mp, dp, both), each summed in one call
        let mut groups: [Vec<(&B::Storage, &crate::Shape)>; 4] = Default::default();
        for p in params {
            let Some(g) = grads.get(p) else { continue };
            groups[split_axes(g)].push((g.storage(), g.local_shape()));
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
        let mut total: Option<Tensor<B>> = None;
        // the mp-split sum first, then the whole one: the order the norm always had
        for k in [1, 0, 2, 3] {
            if k >= 2 && groups[k].is_empty() {
                continue;
            }
            let mut s = sum(&groups[k])?;
            if let Some(c) = comm {
                for a in axes_of(c, k) {
                    let r = c.all_reduce(a, s.storage(), ReduceKind::Sum, 8)?;
                    s = Tensor::from_storage(b, r, s.shape().clone(), DType::F64);
                }
            }
            total = Some(match total {
                None => s,
                Some(t) => t.add(&s)?,
            });
        }
        total.map_or(Ok(0.0), |t| t.sqrt()?.to_scalar())
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
