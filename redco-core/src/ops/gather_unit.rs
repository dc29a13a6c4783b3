//! ZeRO-3's gather of a whole unit (a transformer block) in one collective: the unit's
//! parameters, each held as this rank's f32 flat dp-slice ([`FlatShard::piece`]), are cast
//! to the compute dtype, packed into one buffer and all-gathered together; each whole
//! parameter is then cut out of the gathered buffer. The backward packs the whole
//! parameters' gradients the same way and reduce-scatters them (in f32) in one collective,
//! so a unit costs one all-gather and one reduce-scatter however many parameters it has
//! (FSDP's flat parameter).
//!
//! The autograd records one node per whole parameter and one for the gather, linked by a
//! scalar token: each parameter's node hands its gradient to the gather's shared slots
//! (and the token a zero), and the gather's node, which runs after all of them, reduces
//! the slots in one call. A parameter whose gradient never arrives counts as zero.

use crate::autograd::{is_grad_enabled, no_grad};
use crate::runtime::{Comm, Pending};
use crate::sharding::{FlatShard, ShardLayout};
use crate::{Backend, DType, Error, MeshAxis, PartialOp, Placement, Result, Shape, Tensor};
use std::sync::{Arc, Mutex};

/// The name the whole parameters' nodes record (the autograd keeps the data-parallel
/// partial sum of a gradient arriving at their output: the unit's reduce-scatter sums it).
pub(crate) const UNIT_PARAM: &str = "gather_unit_param";

/// The name the unit's gather node records.
const GATHER_UNIT: &str = "gather_unit";

/// One parameter of a unit held in pieces: the piece (`[dp * per]` split over `dp`), its
/// slicing and the layout of the whole local shard it stands for.
pub struct UnitPiece<'a, B: Backend> {
    /// The piece the module holds.
    pub piece: &'a Tensor<B>,
    /// Its slicing over `dp`.
    pub shard: FlatShard,
    /// The whole parameter's layout.
    pub layout: &'a ShardLayout,
}

/// The gradients the whole parameters' nodes hand over, one slot each.
type Slots<B> = Arc<Mutex<Vec<Option<Tensor<B>>>>>;

/// The pieces' whole parameters, in order, gathered over `comm`'s data-parallel axis in
/// `dtype` with one all-gather; recorded so that their gradients reach the pieces with one
/// reduce-scatter.
pub fn gather_unit<B: Backend>(pieces: &[UnitPiece<'_, B>], comm: &Comm<B>, dtype: DType) -> Result<Vec<Tensor<B>>> {
    if pieces.is_empty() {
        return Ok(Vec::new());
    }
    let gathered = start_gather_unit(pieces, comm, dtype)?.wait()?;
    finish_gather_unit(pieces, comm, dtype, gathered)
}

/// Starts [`gather_unit`]'s all-gather ([`Comm::all_gather_async`]: on a transport that
/// moves data while the rank computes, the gather of the next unit overlaps this one's
/// compute); [`finish_gather_unit`] makes the whole parameters from its result.
pub fn start_gather_unit<B: Backend>(
    pieces: &[UnitPiece<'_, B>],
    comm: &Comm<B>,
    dtype: DType,
) -> Result<Pending<B::Storage>> {
    let Some(first) = pieces.first() else {
        return Err(Error::invalid(GATHER_UNIT, "a unit with no parameters in pieces"));
    };
    let b = first.piece.backend().clone();
    let dp = comm.mesh().dp;
    for p in pieces {
        let (t, s) = (p.piece, p.shard);
        if s.dp != dp || t.local_shape().elem_count() != s.per || t.shape().elem_count() != s.padded() {
            return Err(Error::invalid(
                GATHER_UNIT,
                format!(
                    "a piece of {} elements over dp={} has {} ({} local) at dp={dp}",
                    s.n,
                    s.dp,
                    t.shape(),
                    t.local_shape()
                ),
            ));
        }
    }
    let pers: Vec<usize> = pieces.iter().map(|p| p.shard.per).collect();
    let total: usize = pers.iter().sum();
    no_grad(|| {
        let cast: Vec<B::Storage> = pieces
            .iter()
            .map(|p| {
                let local = Tensor::from_storage(&b, p.piece.storage().clone(), [p.shard.per], p.piece.dtype());
                Ok(local.cast(dtype)?.storage().clone())
            })
            .collect::<Result<_>>()?;
        let shapes: Vec<Shape> = pers.iter().map(|&n| Shape::new([n])).collect();
        let parts: Vec<(&B::Storage, &Shape)> = cast.iter().zip(&shapes).collect();
        let packed = if parts.len() == 1 { cast[0].clone() } else { b.cat(&parts, 0)? };
        comm.all_gather_async(MeshAxis::Dp, &packed, dp * total * dtype.size_in_bytes())
    })
}

/// The whole parameters from `gathered`, the result of [`start_gather_unit`] for the same
/// `pieces`: recorded so that their gradients reach the pieces with one reduce-scatter.
pub fn finish_gather_unit<B: Backend>(
    pieces: &[UnitPiece<'_, B>],
    comm: &Comm<B>,
    dtype: DType,
    gathered: B::Storage,
) -> Result<Vec<Tensor<B>>> {
    let Some(first) = pieces.first() else { return Ok(Vec::new()) };
    let b = first.piece.backend().clone();
    let dp = comm.mesh().dp;
    let total: usize = pieces.iter().map(|p| p.shard.per).sum();
    // member-major: row d holds member d's piece of every parameter, side by side
    let rows = Shape::new([dp, total]);
    let mut off = 0;
    let mut wholes = Vec::with_capacity(pieces.len());
    for p in pieces {
        let s = p.shard;
        let cols = if pieces.len() == 1 { gathered.clone() } else { b.narrow(&gathered, &rows, 1, off, s.per)? };
        off += s.per;
        let local = if s.padded() == s.n { cols } else { b.narrow(&cols, &Shape::new([s.padded()]), 0, 0, s.n)? };
        wholes.push(local);
    }
    let grad = is_grad_enabled() && pieces.iter().any(|p| p.piece.requires_grad());
    let placed = |l: &ShardLayout| l.placements.with(MeshAxis::Dp, Placement::Replicate);
    if !grad {
        return Ok(pieces
            .iter()
            .zip(wholes)
            .map(|(p, s)| {
                Tensor::from_local(&b, s, p.layout.shape.clone(), p.layout.local.clone(), placed(p.layout), dtype)
            })
            .collect());
    }
    let slots: Slots<B> = Arc::new(Mutex::new(vec![None; pieces.len()]));
    let inputs: Vec<&Tensor<B>> = pieces.iter().map(|p| p.piece).collect();
    let token = {
        let (slots, comm, b2) = (slots.clone(), comm.clone(), b.clone());
        let meta: Vec<(FlatShard, ShardLayout)> = pieces.iter().map(|p| (p.shard, ShardLayout::of(p.piece))).collect();
        let zero = no_grad(|| Tensor::zeros(&b, [], DType::F32))?;
        let backward = move |_: &Tensor<B>| -> Result<Vec<Option<Tensor<B>>>> {
            let grads = std::mem::take(&mut *slots.lock().unwrap_or_else(|p| p.into_inner()));
            reduce_unit(&b2, &comm, &meta, grads)
        };
        let scalar = Shape::new(Vec::<usize>::new());
        let plain = crate::Placements::default();
        Tensor::from_op_placed(
            &b,
            zero.storage().clone(),
            scalar.clone(),
            scalar,
            plain,
            DType::F32,
            GATHER_UNIT,
            &inputs,
            backward,
        )
    };
    let mut out = Vec::with_capacity(pieces.len());
    for (i, (p, s)) in pieces.iter().zip(wholes).enumerate() {
        let (slots, b2) = (slots.clone(), b.clone());
        let backward = move |g: &Tensor<B>| -> Result<Vec<Option<Tensor<B>>>> {
            let mut slots = slots.lock().unwrap_or_else(|p| p.into_inner());
            slots[i] = Some(match slots[i].take() {
                Some(prev) => prev.add(g)?,
                None => g.clone(),
            });
            Ok(vec![Some(Tensor::zeros(&b2, [], DType::F32)?)])
        };
        let l = p.layout;
        out.push(
            Tensor::from_op_placed(
                &b,
                s,
                l.shape.clone(),
                l.local.clone(),
                placed(l),
                dtype,
                UNIT_PARAM,
                &[&token],
                backward,
            )
            .with_meta(crate::OpMeta::GatheredParam),
        );
    }
    Ok(out)
}

/// The pieces' gradients from the whole parameters' (`grads`, summed over `dp` where they
/// are partial sums): one reduce-scatter of their packed f32 buffer when every one is a
/// partial sum over `dp`, each on its own otherwise.
fn reduce_unit<B: Backend>(
    b: &B,
    comm: &Comm<B>,
    meta: &[(FlatShard, ShardLayout)],
    grads: Vec<Option<Tensor<B>>>,
) -> Result<Vec<Option<Tensor<B>>>> {
    let dp = comm.mesh().dp;
    let partial = |g: &Tensor<B>| g.placements().get(MeshAxis::Dp) == Placement::Partial(PartialOp::Sum);
    let slices: Vec<B::Storage> = no_grad(|| -> Result<Vec<B::Storage>> {
        let f32s: Vec<Option<Tensor<B>>> = grads
            .into_iter()
            .map(|g| g.map(|g| if g.dtype() == DType::F32 { Ok(g) } else { g.cast(DType::F32) }).transpose())
            .collect::<Result<_>>()?;
        if !f32s.iter().flatten().all(partial) {
            // a gradient already summed over dp: each takes its own slice
            return f32s
                .iter()
                .zip(meta)
                .map(|(g, (s, _))| match g {
                    Some(g) => Ok(s.reduce_scatter(comm, g)?.storage().clone()),
                    None => b.full(s.per, 0.0, DType::F32),
                })
                .collect();
        }
        let total: usize = meta.iter().map(|(s, _)| s.per).sum();
        let cols: Vec<(B::Storage, Shape)> = f32s
            .iter()
            .zip(meta)
            .map(|(g, (s, _))| {
                let shape = Shape::new([dp, s.per]);
                let flat = match g {
                    Some(g) => s.flat(g)?.storage().clone(),
                    None => b.full(dp * s.per, 0.0, DType::F32)?,
                };
                Ok((flat, shape))
            })
            .collect::<Result<_>>()?;
        let parts: Vec<(&B::Storage, &Shape)> = cols.iter().map(|(s, sh)| (s, sh)).collect();
        let packed = if parts.len() == 1 { cols[0].0.clone() } else { b.cat(&parts, 1)? };
        // queued behind any gather already started (the prefetch of the unit before)
        let own = comm.reduce_scatter_async(MeshAxis::Dp, &packed, dp * total * 4)?.wait()?;
        let whole = Shape::new([total]);
        let mut off = 0;
        meta.iter()
            .map(|(s, _)| {
                off += s.per;
                if meta.len() == 1 {
                    Ok(own.clone())
                } else {
                    b.narrow(&own, &whole, 0, off - s.per, s.per)
                }
            })
            .collect()
    })?;
    Ok(slices
        .into_iter()
        .zip(meta)
        .map(|(s, (_, piece))| {
            Some(Tensor::from_local(b, s, piece.shape.clone(), piece.local.clone(), piece.placements, DType::F32))
        })
        .collect())
}
