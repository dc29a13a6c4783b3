//! Host-memory collective arithmetic shared by every transport that stages buffers through
//! the host (threads, MPI): reductions *in axis order* (so every member, and every
//! transport, gets bit-identical sums), flat concatenation and equal chunks.

use super::ReduceKind;
use crate::cpu::{floats, Floats};
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
            let slices: Vec<Arc<HostData>> =
                parts.iter().map(|p| Arc::new(crate::cpu::narrow_flat(p, a, b - a))).collect();
            reduce_all(&slices, op)
        }
    }
}

/// Elementwise reduction, in axis order, of elements `a..b` of the members' buckets: each
/// member's bucket is a list of buffers that together are one flat buffer, with the same
/// sizes on every member. The same bits as [`reduce_range`] over the concatenations, without
/// concatenating. `None` unless every buffer is f32, or every one f64.
pub fn reduce_bucket_range(members: &[Vec<Arc<HostData>>], op: ReduceKind, a: usize, b: usize) -> Option<HostData> {
    fn views<T>(members: &[Vec<Arc<HostData>>], get: fn(&HostData) -> Option<&[T]>) -> Option<Vec<Vec<&[T]>>> {
        members.iter().map(|m| m.iter().map(|h| get(h)).collect()).collect()
    }
    if let Some(v) = views(members, |h| if let HostData::F32(v) = h { Some(v) } else { None }) {
        return Some(HostData::F32(fold_bucket(&v, a, b, |x, y| match op {
            ReduceKind::Sum => x + y,
            ReduceKind::Max => x.max(y),
        })));
    }
    let v = views(members, |h| if let HostData::F64(v) = h { Some(v) } else { None })?;
    Some(HostData::F64(fold_bucket(&v, a, b, |x, y| match op {
        ReduceKind::Sum => x + y,
        ReduceKind::Max => x.max(y),
    })))
}

/// Elements `a..b` of the members' flat buckets combined in member order by `f`.
fn fold_bucket<T: Copy>(members: &[Vec<&[T]>], a: usize, b: usize, f: impl Fn(T, T) -> T + Copy) -> Vec<T> {
    let mut acc = Vec::with_capacity(b - a);
    let mut off = 0;
    for (k, first) in members[0].iter().enumerate() {
        let (lo, hi) = (a.max(off), b.min(off + first.len()));
        if lo < hi {
            let start = acc.len();
            acc.extend_from_slice(&first[lo - off..hi - off]);
            for m in &members[1..] {
                let src = &m[k][lo - off..hi - off];
                acc[start..].iter_mut().zip(src).for_each(|(x, &y)| *x = f(*x, y));
            }
        }
        off += first.len();
    }
    acc
}

/// The members' reduced ranges (in axis order; together one flat buffer) cut into buffers
/// of `sizes` elements.
pub fn split_bucket(sums: &[Arc<HostData>], sizes: &[usize]) -> Vec<HostData> {
    macro_rules! cut {
        ($var:ident) => {{
            let parts: Vec<&[_]> =
                sums.iter().map(|p| if let HostData::$var(v) = &**p { &v[..] } else { &[][..] }).collect();
            let (mut p, mut q) = (0, 0);
            sizes
                .iter()
                .map(|&n| {
                    let mut o = Vec::with_capacity(n);
                    while o.len() < n && p < parts.len() {
                        let take = (n - o.len()).min(parts[p].len() - q);
                        o.extend_from_slice(&parts[p][q..q + take]);
                        q += take;
                        if q == parts[p].len() {
                            (p, q) = (p + 1, 0);
                        }
                    }
                    HostData::$var(o)
                })
                .collect()
        }};
    }
    match sums.first().map(|s| &**s) {
        Some(HostData::F32(_)) => cut!(F32),
        Some(HostData::F64(_)) => cut!(F64),
        Some(HostData::F16(_)) => cut!(F16),
        Some(HostData::BF16(_)) => cut!(BF16),
        Some(HostData::I64(_)) => cut!(I64),
        Some(HostData::I32(_)) => cut!(I32),
        Some(HostData::U8(_)) | None => cut!(U8),
    }
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
    crate::cpu::narrow_flat(h, i * len, len)
}
