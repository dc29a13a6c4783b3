//! Broadcast iteration for the CPU kernels: operands addressed through broadcast strides,
//! walked row by row (the last, coalesced dimension) in parallel chunks.

use super::simd;
use crate::Shape;
use rayon::prelude::*;

/// Below this many elements kernels stay on the calling thread.
pub(crate) const PAR_MIN: usize = 1 << 15;

/// Merges adjacent dims that every operand walks contiguously (or broadcasts together).
pub(crate) fn coalesce(dims: &[usize], strides: &[Vec<usize>]) -> (Vec<usize>, Vec<Vec<usize>>) {
    let mut d: Vec<usize> = Vec::new();
    let mut s: Vec<Vec<usize>> = vec![Vec::new(); strides.len()];
    for i in 0..dims.len() {
        if dims[i] == 1 && !d.is_empty() {
            continue;
        }
        let merge = !d.is_empty()
            && strides.iter().enumerate().all(|(k, st)| {
                let prev = *s[k].last().unwrap();
                prev == st[i] * dims[i]
            });
        if merge {
            *d.last_mut().unwrap() *= dims[i];
            for (k, st) in strides.iter().enumerate() {
                *s[k].last_mut().unwrap() = st[i];
            }
        } else {
            d.push(dims[i]);
            for (k, st) in strides.iter().enumerate() {
                s[k].push(st[i]);
            }
        }
    }
    if d.is_empty() {
        d.push(1);
        for sk in s.iter_mut() {
            sk.push(0);
        }
    }
    (d, s)
}

/// The offset of row `r` (an index over all dims but the last) for each operand.
#[inline]
pub(crate) fn row_offsets<const N: usize>(mut r: usize, dims: &[usize], strides: &[Vec<usize>; N]) -> [usize; N] {
    let mut off = [0usize; N];
    for i in (0..dims.len() - 1).rev() {
        let idx = r % dims[i];
        r /= dims[i];
        for k in 0..N {
            off[k] += idx * strides[k][i];
        }
    }
    off
}

/// Rows per parallel chunk so that each chunk holds at least `PAR_MIN / 4` elements.
fn rows_per_chunk(row_len: usize) -> usize {
    (PAR_MIN / 4 / row_len.max(1)).max(1)
}

/// `out[i] = f(a[ia], b[ib])` over the broadcast shape `out`.
pub(crate) fn broadcast2<T, U, O, F>(a: &[T], ash: &Shape, b: &[U], bsh: &Shape, out: &Shape, f: F) -> Vec<O>
where
    T: Copy + Sync,
    U: Copy + Sync,
    O: Copy + Send + Sync + Default,
    F: Fn(T, U) -> O + Sync,
{
    let n = out.elem_count();
    let mut o = vec![O::default(); n];
    if n == 0 {
        return o;
    }
    if ash == out && bsh == out {
        if n >= PAR_MIN {
            o.par_chunks_mut(PAR_MIN / 4)
                .zip(a.par_chunks(PAR_MIN / 4).zip(b.par_chunks(PAR_MIN / 4)))
                .for_each(|(o, (a, b))| simd::zip_into(a, b, o, &f));
        } else {
            simd::zip_into(a, b, &mut o, &f);
        }
        return o;
    }
    let (dims, st) = coalesce(out.dims(), &[ash.broadcast_strides(out), bsh.broadcast_strides(out)]);
    let st: [Vec<usize>; 2] = [st[0].clone(), st[1].clone()];
    let l = *dims.last().unwrap();
    let (ia, ib) = (st[0][dims.len() - 1], st[1][dims.len() - 1]);
    let row = |r: usize, o: &mut [O]| {
        let [oa, ob] = row_offsets(r, &dims, &st);
        match (ia, ib) {
            (1, 1) => o.iter_mut().zip(&a[oa..oa + l]).zip(&b[ob..ob + l]).for_each(|((o, &x), &y)| *o = f(x, y)),
            (1, 0) => {
                let y = b[ob];
                o.iter_mut().zip(&a[oa..oa + l]).for_each(|(o, &x)| *o = f(x, y))
            }
            (0, 1) => {
                let x = a[oa];
                o.iter_mut().zip(&b[ob..ob + l]).for_each(|(o, &y)| *o = f(x, y))
            }
            _ => o.iter_mut().enumerate().for_each(|(j, o)| *o = f(a[oa + j * ia], b[ob + j * ib])),
        }
    };
    run_rows(&mut o, l, n, row);
    o
}

/// `out[i] = f(c[ic], a[ia], b[ib])` over the broadcast shape `out`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn broadcast3<C, T, O, F>(
    c: &[C],
    csh: &Shape,
    a: &[T],
    ash: &Shape,
    b: &[T],
    bsh: &Shape,
    out: &Shape,
    f: F,
) -> Vec<O>
where
    C: Copy + Sync,
    T: Copy + Sync,
    O: Copy + Send + Sync + Default,
    F: Fn(C, T, T) -> O + Sync,
{
    let n = out.elem_count();
    let mut o = vec![O::default(); n];
    if n == 0 {
        return o;
    }
    let (dims, st) =
        coalesce(out.dims(), &[csh.broadcast_strides(out), ash.broadcast_strides(out), bsh.broadcast_strides(out)]);
    let st: [Vec<usize>; 3] = [st[0].clone(), st[1].clone(), st[2].clone()];
    let l = *dims.last().unwrap();
    let last = dims.len() - 1;
    let (ic, ia, ib) = (st[0][last], st[1][last], st[2][last]);
    let row = |r: usize, o: &mut [O]| {
        let [oc, oa, ob] = row_offsets(r, &dims, &st);
        o.iter_mut().enumerate().for_each(|(j, o)| *o = f(c[oc + j * ic], a[oa + j * ia], b[ob + j * ib]));
    };
    run_rows(&mut o, l, n, row);
    o
}

/// Calls `row(r, out_row)` for every row of length `l`, in parallel for large outputs.
pub(crate) fn run_rows<O: Send, F: Fn(usize, &mut [O]) + Sync>(o: &mut [O], l: usize, n: usize, row: F) {
    if n >= PAR_MIN {
        let rpc = rows_per_chunk(l);
        o.par_chunks_mut(l * rpc).enumerate().for_each(|(ci, chunk)| {
            for (k, orow) in chunk.chunks_mut(l).enumerate() {
                row(ci * rpc + k, orow);
            }
        });
    } else {
        for (r, orow) in o.chunks_mut(l).enumerate() {
            row(r, orow);
        }
    }
}

/// `out[i] = f(x[i])`, in parallel for large inputs.
/// The loop body is compiled for AVX-512 too (see [`simd`]), so `f` runs vectorised.
pub(crate) fn map1<T: Copy + Sync, O: Copy + Send + Default, F: Fn(T) -> O + Sync>(x: &[T], f: F) -> Vec<O> {
    let n = x.len();
    let mut o: Vec<O> = Vec::with_capacity(n);
    let out = &mut o.spare_capacity_mut()[..n];
    if n >= PAR_MIN {
        out.par_chunks_mut(PAR_MIN / 4).zip(x.par_chunks(PAR_MIN / 4)).for_each(|(o, x)| simd::map_into(x, o, &f));
    } else {
        simd::map_into(x, out, &f);
    }
    // SAFETY: `map_into` wrote all `n` elements.
    unsafe { o.set_len(n) };
    o
}
