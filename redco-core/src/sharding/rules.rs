//! Sharding propagation rules: for each op family, the layout its inputs must take and
//! the layout of its output, per mesh axis. An op without a specific case replicates its
//! inputs (always correct; the gathers are counted). Each function returns the
//! (possibly redistributed) inputs and the output placements.

use crate::{Backend, PartialOp, Placement, Placements, Result, Shape, Tensor};

const AXES: [usize; 2] = [0, 1];

fn set(p: Placements, axis: usize, v: Placement) -> Placements {
    let mut q = p;
    q.0[axis] = v;
    q
}

/// `t` with axis `axis` moved to `v`.
fn move_axis<B: Backend>(t: &Tensor<B>, axis: usize, v: Placement) -> Result<Tensor<B>> {
    if t.placements().0[axis] == v {
        return Ok(t.clone());
    }
    t.redistribute(set(t.placements(), axis, v))
}

fn is_partial(p: Placement) -> bool {
    matches!(p, Placement::Partial(_))
}

/// Replicates every partial axis of `t` (for ops that are not linear).
pub(crate) fn no_partial<B: Backend>(t: &Tensor<B>) -> Result<Tensor<B>> {
    let p = t.placements();
    if p.0.iter().any(|x| is_partial(*x)) {
        t.redistribute(crate::placement::without_partial(p))
    } else {
        Ok(t.clone())
    }
}

/// Elementwise unary op: shards pass through; partial values are summed first unless the
/// op is linear.
pub(crate) fn unary<B: Backend>(x: &Tensor<B>, linear: bool) -> Result<Tensor<B>> {
    if linear {
        Ok(x.clone())
    } else {
        no_partial(x)
    }
}

/// How a binary op treats partial sums.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Linearity {
    /// a + b, a - b: partial + partial stays partial.
    Additive,
    /// a * b, a / b: partial times replicated stays partial (a partial divisor is summed).
    Multiplicative,
    /// max, min, comparisons, where: partials are summed first.
    None,
}

/// The output dim that input dim `d` of a rank-`r` operand maps to under broadcasting to
/// rank `ro`.
fn out_dim(d: usize, r: usize, ro: usize) -> usize {
    d + ro - r
}

/// Broadcasting binary ops (and the value operands of `where`).
pub(crate) fn binary<B: Backend>(
    a: &Tensor<B>,
    b: &Tensor<B>,
    lin: Linearity,
) -> Result<(Tensor<B>, Tensor<B>, Placements)> {
    let (mut a, mut b) = (a.clone(), b.clone());
    let ro = a.rank().max(b.rank());
    let mut out = Placements::REPLICATED;
    for axis in AXES {
        let (pa, pb) = (a.placements().0[axis], b.placements().0[axis]);
        // partial sums
        if is_partial(pa) || is_partial(pb) {
            let sum = Placement::Partial(PartialOp::Sum);
            if lin == Linearity::Additive
                && (pa == sum || pb == sum)
                && (pa == Placement::Replicate || pb == Placement::Replicate)
            {
                // partial + replicated: the replicated term joins the sum on one rank (no
                // communication), e.g. a bias added after a row-parallel matmul.
                if pa == Placement::Replicate {
                    a = move_axis(&a, axis, sum)?;
                } else {
                    b = move_axis(&b, axis, sum)?;
                }
                out = set(out, axis, sum);
                continue;
            }
            let keep = match lin {
                Linearity::Additive => pa == pb && pa == Placement::Partial(PartialOp::Sum),
                Linearity::Multiplicative => {
                    (pa == Placement::Partial(PartialOp::Sum) && pb == Placement::Replicate)
                        || (pb == Placement::Partial(PartialOp::Sum) && pa == Placement::Replicate)
                }
                Linearity::None => false,
            };
            if keep {
                out = set(out, axis, Placement::Partial(PartialOp::Sum));
                continue;
            }
            if is_partial(pa) {
                a = move_axis(&a, axis, Placement::Replicate)?;
            }
            if is_partial(pb) {
                b = move_axis(&b, axis, Placement::Replicate)?;
            }
        }
        let (pa, pb) = (a.placements().0[axis], b.placements().0[axis]);
        // the output dim each operand shards, if any
        let da = match pa {
            Placement::Shard(d) => Some(out_dim(d, a.rank(), ro)),
            _ => None,
        };
        let db = match pb {
            Placement::Shard(d) => Some(out_dim(d, b.rank(), ro)),
            _ => None,
        };
        let target = da.or(db);
        let Some(od) = target else { continue };
        // make the other operand agree: sliced along `od` if it has that dim whole,
        // replicated if it broadcasts along it
        for t in [&mut a, &mut b] {
            let r = t.rank();
            let full = od + r >= ro && t.dims()[od + r - ro] > 1;
            let want = if full { Placement::Shard(od + r - ro) } else { Placement::Replicate };
            if t.placements().0[axis] != want {
                *t = move_axis(t, axis, Placement::Replicate)?;
                *t = move_axis(t, axis, want)?;
            }
        }
        out = set(out, axis, Placement::Shard(od));
    }
    Ok((a, b, out))
}

/// Roles of a matmul operand's sharded dim.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Role {
    Batch(usize),
    M,
    N,
    K,
}

fn role(t_rank: usize, d: usize, trans: bool, is_lhs: bool) -> Role {
    if d + 2 < t_rank {
        return Role::Batch(d);
    }
    let last = d == t_rank - 1;
    // lhs: [.., m, k] (or [.., k, m] transposed); rhs: [.., k, n] (or [.., n, k])
    match (is_lhs, last ^ trans) {
        (true, true) => Role::K,
        (true, false) => Role::M,
        (false, true) => Role::N,
        (false, false) => Role::K,
    }
}

/// The dim of `t` that plays `r` (for slicing an operand to match the other).
fn dim_of(t_rank: usize, r: Role, trans: bool, is_lhs: bool) -> Option<usize> {
    (0..t_rank).find(|&d| role(t_rank, d, trans, is_lhs) == r)
}

/// Matmul `op(a) @ op(b)`: column split (N), row split (K with K: partial), data split (M or
/// batch), partial times replicated.
pub(crate) fn matmul<B: Backend>(
    a: &Tensor<B>,
    b: &Tensor<B>,
    ta: bool,
    tb: bool,
    out_rank: usize,
) -> Result<(Tensor<B>, Tensor<B>, Placements)> {
    let (mut a, mut b) = (a.clone(), b.clone());
    let mut out = Placements::REPLICATED;
    for axis in AXES {
        let (pa, pb) = (a.placements().0[axis], b.placements().0[axis]);
        if is_partial(pa) || is_partial(pb) {
            let sum = Placement::Partial(PartialOp::Sum);
            if (pa == sum && pb == Placement::Replicate) || (pb == sum && pa == Placement::Replicate) {
                out = set(out, axis, sum);
                continue;
            }
            a = move_axis(&a, axis, crate::placement::without_partial(a.placements()).0[axis])?;
            b = move_axis(&b, axis, crate::placement::without_partial(b.placements()).0[axis])?;
        }
        let (pa, pb) = (a.placements().0[axis], b.placements().0[axis]);
        let ra = match pa {
            Placement::Shard(d) => Some(role(a.rank(), d, ta, true)),
            _ => None,
        };
        let rb = match pb {
            Placement::Shard(d) => Some(role(b.rank(), d, tb, false)),
            _ => None,
        };
        let batch_out = |i: usize, r: usize| Placement::Shard(i + out_rank - r);
        let placed = match (ra, rb) {
            (None, None) => Placement::Replicate,
            (None, Some(Role::N)) => Placement::Shard(out_rank - 1),
            (Some(Role::M), None) => Placement::Shard(out_rank - 2),
            (Some(Role::K), Some(Role::K)) => Placement::Partial(PartialOp::Sum),
            (Some(Role::K), None) => {
                let d = dim_of(b.rank(), Role::K, tb, false).expect("rhs has a k dim");
                b = move_axis(&b, axis, Placement::Shard(d))?;
                Placement::Partial(PartialOp::Sum)
            }
            (None, Some(Role::K)) => {
                let d = dim_of(a.rank(), Role::K, ta, true).expect("lhs has a k dim");
                a = move_axis(&a, axis, Placement::Shard(d))?;
                Placement::Partial(PartialOp::Sum)
            }
            (Some(Role::Batch(i)), None) if b.rank() == 2 => batch_out(i, a.rank()),
            (None, Some(Role::Batch(i))) if a.rank() == 2 => batch_out(i, b.rank()),
            (Some(Role::Batch(i)), Some(Role::Batch(j))) if a.rank() == b.rank() && i == j => batch_out(i, a.rank()),
            (Some(Role::Batch(i)), None) if a.rank() == b.rank() => {
                b = move_axis(&b, axis, Placement::Shard(i))?;
                batch_out(i, a.rank())
            }
            (None, Some(Role::Batch(i))) if a.rank() == b.rank() => {
                a = move_axis(&a, axis, Placement::Shard(i))?;
                batch_out(i, b.rank())
            }
            (Some(Role::M), Some(_)) => {
                b = move_axis(&b, axis, Placement::Replicate)?;
                Placement::Shard(out_rank - 2)
            }
            _ => {
                a = move_axis(&a, axis, Placement::Replicate)?;
                b = move_axis(&b, axis, Placement::Replicate)?;
                Placement::Replicate
            }
        };
        out = set(out, axis, placed);
    }
    Ok((a, b, out))
}

/// Sum along `dim` (kept): a split of `dim` becomes a partial sum.
pub(crate) fn sum(x: Placements, dim: usize) -> Placements {
    let mut p = x;
    for axis in AXES {
        if p.0[axis] == Placement::Shard(dim) {
            p.0[axis] = Placement::Partial(PartialOp::Sum);
        }
    }
    p
}

/// An op that works along `dims` (reductions by max, softmax, norms, narrow, cat): those
/// dims must be whole; partials are summed unless `linear`.
pub(crate) fn whole_along<B: Backend>(x: &Tensor<B>, dims: &[usize], linear: bool) -> Result<Tensor<B>> {
    let mut x = if linear { x.clone() } else { no_partial(x)? };
    for axis in AXES {
        if let Placement::Shard(d) = x.placements().0[axis] {
            if dims.contains(&d) {
                x = move_axis(&x, axis, Placement::Replicate)?;
            }
        }
    }
    Ok(x)
}

/// Makes `t` laid out like `like` on every axis where `like` is sharded along a dim that
/// `t` has whole (aligned from the right), replicated elsewhere; used for side inputs
/// such as masks, weights and rotary tables.
pub(crate) fn follow<B: Backend>(t: &Tensor<B>, like: Placements, like_rank: usize) -> Result<Tensor<B>> {
    let mut t = no_partial(t)?;
    for axis in AXES {
        let want = match like.0[axis] {
            Placement::Shard(d) if d + t.rank() >= like_rank && t.dims()[d + t.rank() - like_rank] > 1 => {
                Placement::Shard(d + t.rank() - like_rank)
            }
            _ => Placement::Replicate,
        };
        if t.placements().0[axis] != want {
            t = move_axis(&t, axis, Placement::Replicate)?;
            t = move_axis(&t, axis, want)?;
        }
    }
    Ok(t)
}

/// Where a split of input dim `d` lands after reshaping `from` to `to` with `k` shards,
/// if it can be carried without moving data.
pub(crate) fn reshape_dim(from: &Shape, to: &Shape, d: usize, k: usize) -> Option<usize> {
    let outer: usize = from.dims()[..d].iter().product();
    let mut acc = 1;
    for (i, &s) in to.dims().iter().enumerate() {
        // Within each outer block the k chunks of `from[d]` are contiguous runs of equal
        // length, so any dim that starts at the same outer offset and divides by k holds
        // exactly one run per shard.
        if acc == outer && s % k == 0 && s > 0 {
            return Some(i);
        }
        acc *= s;
        if acc > outer {
            break;
        }
    }
    None
}

/// Reshape: carries splits (and partials) along when the layout allows it.
pub(crate) fn reshape<B: Backend>(x: &Tensor<B>, to: &Shape, sizes: [usize; 2]) -> Result<(Tensor<B>, Placements)> {
    let mut x = x.clone();
    let mut out = x.placements();
    for axis in AXES {
        if let Placement::Shard(d) = x.placements().0[axis] {
            match reshape_dim(x.shape(), to, d, sizes[axis]) {
                Some(nd) => out = set(out, axis, Placement::Shard(nd)),
                None => {
                    x = move_axis(&x, axis, Placement::Replicate)?;
                    out = set(out, axis, Placement::Replicate);
                }
            }
        }
    }
    Ok((x, out))
}
