//! Sharded lookups: the vocab-parallel embedding (each rank holds a slice of the
//! vocabulary; tokens outside it read zeros, and the partial rows are summed by the first
//! op that needs them whole) and lookups whose ids are split (data parallel).

use super::axis_index::axis_offset;
use super::redistribute::comm;
use crate::backend::CmpOp;
use crate::placement::without_partial;
use crate::{Backend, DType, MeshAxis, PartialOp, Placement, Placements, Result, Shape, Tensor};

/// `x.index_select(ids, d)` when `x` or `ids` is sharded.
pub(crate) fn index_select_sharded<B: Backend>(x: &Tensor<B>, ids: &Tensor<B>, d: usize) -> Result<Tensor<B>> {
    // Supported layouts: a 2-D table split on its rows (vocab-parallel) looked up along
    // dim 0, and ids split along one of their dims while the table is replicated there.
    // Everything else is replicated first.
    let mut x = x.clone();
    let mut ids = ids.clone();
    let mut vocab_axis = None;
    for axis in [MeshAxis::Dp, MeshAxis::Mp] {
        let (px, pi) = (x.placements().get(axis), ids.placements().get(axis));
        let vocab = d == 0 && x.rank() == 2 && px == Placement::Shard(0) && pi == Placement::Replicate;
        let split_ids = px == Placement::Replicate && matches!(pi, Placement::Shard(_));
        if vocab {
            vocab_axis = Some(axis);
        } else if !split_ids && (px != Placement::Replicate || pi != Placement::Replicate) {
            x = x.redistribute(x.placements().with(axis, Placement::Replicate))?;
            ids = ids.redistribute(ids.placements().with(axis, Placement::Replicate))?;
        }
    }
    // Output layout: ids' splits move to the output dims they index; the vocab axis holds
    // partial rows.
    let mut placed = Placements::REPLICATED;
    for axis in [MeshAxis::Dp, MeshAxis::Mp] {
        if let Placement::Shard(j) = ids.placements().get(axis) {
            placed = placed.with(axis, Placement::Shard(d + j));
        }
    }
    if let Some(a) = vocab_axis {
        placed = placed.with(a, Placement::Partial(PartialOp::Sum));
    }
    let mut out: Vec<usize> = x.dims()[..d].to_vec();
    out.extend_from_slice(ids.dims());
    out.extend_from_slice(&x.dims()[d + 1..]);
    let mut local: Vec<usize> = x.local_shape().dims()[..d].to_vec();
    local.extend_from_slice(ids.local_shape().dims());
    local.extend_from_slice(&x.local_shape().dims()[d + 1..]);
    let b = x.backend().clone();
    let n = ids.local_shape().elem_count();
    let vocab = x.dims()[d];
    // The ids are checked against the whole vocabulary; on the vocabulary axis each rank
    // then looks up the ids inside its own rows, the others read row 0 and are masked out.
    // The mask and the shifted ids are computed on the device from the rank's index.
    b.check_ids(ids.storage(), vocab, "index_select")?;
    let (safe_s, mask_s) = match vocab_axis {
        Some(a) => {
            let c = comm::<B>("index_select")?;
            let rows = x.local_shape().dims()[0];
            let _ng = crate::GradModeGuard::no_grad();
            let lo = axis_offset(&c, &b, a, rows)?;
            let raw = Tensor::from_storage(&b, ids.storage().clone(), [n], ids.dtype());
            let tf = raw.cast(lo.dtype())?.sub(&lo)?;
            let ge = tf.compare_scalar(0.0, CmpOp::Ge)?.cast(lo.dtype())?;
            let hit = ge.mul(&tf.compare_scalar(rows as f64, CmpOp::Lt)?.cast(lo.dtype())?)?;
            let safe = tf.mul(&hit)?.cast(DType::I64)?;
            (safe.storage().clone(), Some(hit.cast(x.dtype())?.storage().clone()))
        }
        None => (ids.storage().clone(), None),
    };
    let looked = b.index_select(x.storage(), x.local_shape(), d, &safe_s, n)?;
    let inner: usize = x.local_shape().dims()[d + 1..].iter().product();
    let outer: usize = x.local_shape().dims()[..d].iter().product();
    let flat = Shape::new([outer, n, inner]);
    let masked = match &mask_s {
        Some(m) => b.binary(crate::BinaryOp::Mul, (&looked, &flat), (m, &Shape::new([n, 1])), &flat)?,
        None => looked,
    };
    let (xl, xp, dt) = (x.local_shape().clone(), x.placements(), x.dtype());
    let ids_split: Vec<MeshAxis> = [MeshAxis::Dp, MeshAxis::Mp]
        .into_iter()
        .filter(|a| matches!(ids.placements().get(*a), Placement::Shard(_)))
        .collect();
    let (out_s, gshape, placed_c) = (Shape::new(out), x.shape().clone(), placed);
    let bc = b.clone();
    Ok(Tensor::from_op_placed(&b, masked, out_s, Shape::new(local), placed, dt, "index_select", &[&x], move |g| {
        if crate::is_grad_enabled() {
            return Err(crate::Error::unsupported(
                "backward_graph",
                "second-order gradients through the vocabulary-parallel embedding are not supported (keep the embedding unsplit along mp)",
            ));
        }
        let g = g.redistribute(without_partial(placed_c))?;
        let gl = match &mask_s {
            Some(m) => bc.binary(crate::BinaryOp::Mul, (g.storage(), &flat), (m, &Shape::new([n, 1])), &flat)?,
            None => g.storage().clone(),
        };
        let zeros = bc.full(xl.elem_count(), 0.0, dt)?;
        let s = bc.index_add(&zeros, &xl, d, &safe_s, &gl)?;
        // Rows looked up by split ids add up across those ranks.
        let mut gp = xp;
        for a in &ids_split {
            gp = gp.with(*a, Placement::Partial(PartialOp::Sum));
        }
        Ok(vec![Some(Tensor::from_local(&bc, s, gshape.clone(), xl.clone(), gp, dt))])
    })
    .with_meta(crate::OpMeta::Dim(d)))
}
