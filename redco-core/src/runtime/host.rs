//! Host-memory collective arithmetic shared by every transport that stages buffers through
//! the host (threads, MPI): reductions *in axis order* (so every member, and every
//! transport, gets bit-identical sums), flat concatenation and equal chunks.

use crate::backend::collective::ReduceKind;
use crate::dtype::{floats, Floats};
use crate::HostData;
use std::sync::Arc;

/// Elementwise reduction of the deposits in order.
pub fn reduce_all(parts: &[Arc<HostData>], op: ReduceKind) -> HostData {
    let dt = parts[0].dtype();
    macro_rules! fold {
        ($t:ty, $first:expr, $rest:expr) => {{
            let mut acc: Vec<$t> = $first.to_vec();
            for p in $rest {
                match op {
                    ReduceKind::Sum => acc.iter_mut().zip(p.iter()).for_each(|(a, b)| *a += *b),
                    ReduceKind::Max => acc.iter_mut().zip(p.iter()).for_each(|(a, b)| *a = a.max(*b)),
                }
            }
            acc
        }};
    }
    let fl: Vec<Floats<'_>> = parts.iter().map(|p| floats(p)).collect();
    match &fl[0] {
        Floats::F32(first) => {
            let rest = fl[1..].iter().map(|f| match f {
                Floats::F32(v) => v.as_ref(),
                Floats::F64(_) => unreachable!("deposits share a dtype"),
            });
            HostData::from_f32(fold!(f32, first, rest), dt)
        }
        Floats::F64(first) => {
            let rest = fl[1..].iter().map(|f| match f {
                Floats::F64(v) => v.as_ref(),
                Floats::F32(_) => unreachable!("deposits share a dtype"),
            });
            HostData::from_f64(&fold!(f64, first, rest), dt)
        }
    }
}

/// Elementwise reduction of elements `a..b` of the deposits, in order.
pub fn reduce_range(parts: &[Arc<HostData>], op: ReduceKind, a: usize, b: usize) -> HostData {
    macro_rules! fold {
        ($var:ident) => {{
            let mut acc: Vec<_> = match &*parts[0] {
                HostData::$var(v) => v[a..b].to_vec(),
                _ => unreachable!("deposits share a dtype"),
            };
            for p in &parts[1..] {
                let HostData::$var(v) = &**p else { unreachable!("deposits share a dtype") };
                let v = &v[a..b];
                match op {
                    ReduceKind::Sum => acc.iter_mut().zip(v).for_each(|(x, y)| *x += *y),
                    ReduceKind::Max => acc.iter_mut().zip(v).for_each(|(x, y)| *x = x.max(*y)),
                }
            }
            HostData::$var(acc)
        }};
    }
    match &*parts[0] {
        HostData::F32(_) => fold!(F32),
        HostData::F64(_) => fold!(F64),
        _ => {
            let slices: Vec<Arc<HostData>> = parts.iter().map(|p| Arc::new(p.range(a, b - a))).collect();
            reduce_all(&slices, op)
        }
    }
}

/// Elementwise reduction, in axis order, of elements `a..b` of the members' buckets: each
/// member's bucket is a list of buffers that together are one flat buffer, with the same
/// sizes on every member. The result has one piece per buffer that meets `a..b`, in order
/// (see [`assemble_bucket`]); the values are the bits of [`reduce_range`] over the
/// concatenations. `None` unless every buffer is f32, or every one f64.
pub fn reduce_bucket_range(
    members: &[Vec<Arc<HostData>>],
    op: ReduceKind,
    a: usize,
    b: usize,
) -> Option<Vec<HostData>> {
    fn views<T>(members: &[Vec<Arc<HostData>>], get: fn(&HostData) -> Option<&[T]>) -> Option<Vec<Vec<&[T]>>> {
        members.iter().map(|m| m.iter().map(|h| get(h)).collect()).collect()
    }
    // the operation is picked once, outside the loops
    if let Some(v) = views(members, |h| if let HostData::F32(v) = h { Some(v) } else { None }) {
        let pieces = match op {
            ReduceKind::Sum => fold_bucket(&v, a, b, |x, y| x + y),
            ReduceKind::Max => fold_bucket(&v, a, b, f32::max),
        };
        return Some(pieces.into_iter().map(HostData::F32).collect());
    }
    let v = views(members, |h| if let HostData::F64(v) = h { Some(v) } else { None })?;
    let pieces = match op {
        ReduceKind::Sum => fold_bucket(&v, a, b, |x, y| x + y),
        ReduceKind::Max => fold_bucket(&v, a, b, f64::max),
    };
    Some(pieces.into_iter().map(HostData::F64).collect())
}

/// Elements `a..b` of the members' flat buckets combined in member order by `f`, one
/// vector per buffer that meets `a..b`.
fn fold_bucket<T: Copy>(members: &[Vec<&[T]>], a: usize, b: usize, f: impl Fn(T, T) -> T + Copy) -> Vec<Vec<T>> {
    let mut out = Vec::new();
    let mut off = 0;
    for (k, first) in members[0].iter().enumerate() {
        let (lo, hi) = (a.max(off), b.min(off + first.len()));
        if lo < hi {
            let mut acc = first[lo - off..hi - off].to_vec();
            for m in &members[1..] {
                acc.iter_mut().zip(&m[k][lo - off..hi - off]).for_each(|(x, &y)| *x = f(*x, y));
            }
            out.push(acc);
        }
        off += first.len();
    }
    out
}

/// The bucket's buffers (of `sizes` elements) put together from the members' pieces, member
/// `j` having reduced elements [`split_range`]`(total, n, j)` with [`reduce_bucket_range`]. A
/// buffer that one member reduced whole is that member's piece itself, shared rather than
/// copied; one cut by a range boundary is its pieces concatenated. `None` when the pieces
/// do not match `sizes`.
pub fn assemble_bucket(pieces: &[Vec<Arc<HostData>>], sizes: &[usize]) -> Option<Vec<Arc<HostData>>> {
    let (n, total) = (pieces.len(), sizes.iter().sum::<usize>());
    let dt = pieces.iter().flatten().next()?.dtype();
    let mut next = vec![0usize; n];
    let mut off = 0;
    let mut out = Vec::with_capacity(sizes.len());
    for &len in sizes {
        let mut parts = Vec::new();
        for (j, p) in pieces.iter().enumerate() {
            let (a, b) = split_range(total, n, j);
            if a.max(off) < b.min(off + len) {
                parts.push(p.get(next[j])?.clone());
                next[j] += 1;
            }
        }
        off += len;
        let whole = match parts.len() {
            0 => Arc::new(HostData::from_f64(&[], dt)),
            1 => parts.pop()?,
            _ => Arc::new(concat_all(&parts)),
        };
        if whole.len() != len {
            return None;
        }
        out.push(whole);
    }
    Some(out)
}

/// Flat concatenation of the deposits in order.
pub fn concat_all(parts: &[Arc<HostData>]) -> HostData {
    macro_rules! cat {
        ($var:ident) => {{
            let mut o = Vec::new();
            for p in parts {
                if let HostData::$var(v) = &**p {
                    o.extend_from_slice(v);
                }
            }
            HostData::$var(o)
        }};
    }
    match &*parts[0] {
        HostData::F32(_) => cat!(F32),
        HostData::F64(_) => cat!(F64),
        HostData::F16(_) => cat!(F16),
        HostData::BF16(_) => cat!(BF16),
        HostData::I64(_) => cat!(I64),
        HostData::I32(_) => cat!(I32),
        HostData::U8(_) => cat!(U8),
    }
}

/// Below this many elements an all-reduce sums on every member in one rendezvous.
pub const SPLIT_REDUCE_MIN: usize = 1 << 16;

/// The `i`-th of `n` near-equal contiguous ranges of `len` items.
pub fn split_range(len: usize, n: usize, i: usize) -> (usize, usize) {
    let (base, rem) = (len / n, len % n);
    let start = i * base + i.min(rem);
    (start, start + base + usize::from(i < rem))
}

/// The `i`-th of `n` equal contiguous chunks.
pub fn chunk(h: &HostData, i: usize, n: usize) -> HostData {
    let len = h.len() / n;
    h.range(i * len, len)
}
