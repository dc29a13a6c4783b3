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
