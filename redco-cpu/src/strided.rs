//! Broadcast iteration for the CPU kernels: operands addressed through broadcast strides,
//! walked row by row (the last, coalesced dimension) in parallel chunks.

use super::simd;
use rayon::prelude::*;
use redco_core::Shape;
use std::mem::MaybeUninit;

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
    filled(n, |o| broadcast2_into(a, ash, b, bsh, out, o, f))
}

fn broadcast2_into<T, U, O, F>(a: &[T], ash: &Shape, b: &[U], bsh: &Shape, out: &Shape, o: &mut [MaybeUninit<O>], f: F)
where
    T: Copy + Sync,
    U: Copy + Sync,
    O: Copy + Send + Sync,
    F: Fn(T, U) -> O + Sync,
{
    let n = o.len();
    if n == 0 {
        return;
    }
    let fw = |x: T, y: U| MaybeUninit::new(f(x, y));
    if ash == out && bsh == out {
        if n >= PAR_MIN {
            o.par_chunks_mut(PAR_MIN / 4)
                .zip(a.par_chunks(PAR_MIN / 4).zip(b.par_chunks(PAR_MIN / 4)))
                .for_each(|(o, (a, b))| simd::zip_into(a, b, o, &fw));
        } else {
            simd::zip_into(a, b, o, &fw);
        }
        return;
    }
    let (dims, st) = coalesce(out.dims(), &[ash.broadcast_strides(out), bsh.broadcast_strides(out)]);
    let st: [Vec<usize>; 2] = [st[0].clone(), st[1].clone()];
    let l = *dims.last().unwrap();
    let (ia, ib) = (st[0][dims.len() - 1], st[1][dims.len() - 1]);
    let row = |r: usize, o: &mut [MaybeUninit<O>]| {
        let [oa, ob] = row_offsets(r, &dims, &st);
        match (ia, ib) {
            (1, 1) => simd::zip_into(&a[oa..oa + l], &b[ob..ob + l], o, &fw),
            (1, 0) => {
                let y = b[ob];
                simd::map_into(&a[oa..oa + l], o, &|x| f(x, y))
            }
            (0, 1) => {
                let x = a[oa];
                simd::map_into(&b[ob..ob + l], o, &|y| f(x, y))
            }
            _ => o.iter_mut().enumerate().for_each(|(j, o)| {
                o.write(f(a[oa + j * ia], b[ob + j * ib]));
            }),
        }
    };
    run_rows(o, l, n, row);
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
    if n == 0 {
        return Vec::new();
    }
    let (dims, st) =
        coalesce(out.dims(), &[csh.broadcast_strides(out), ash.broadcast_strides(out), bsh.broadcast_strides(out)]);
    let st: [Vec<usize>; 3] = [st[0].clone(), st[1].clone(), st[2].clone()];
    let l = *dims.last().unwrap();
    let last = dims.len() - 1;
    let (ic, ia, ib) = (st[0][last], st[1][last], st[2][last]);
    let row = |r: usize, o: &mut [MaybeUninit<O>]| {
        let [oc, oa, ob] = row_offsets(r, &dims, &st);
        o.iter_mut().enumerate().for_each(|(j, o)| {
            o.write(f(c[oc + j * ic], a[oa + j * ia], b[ob + j * ib]));
        });
    };
    filled(n, |o| run_rows(o, l, n, row))
}

/// Initialises `o` with a copy of `src` (same length) and returns it as initialised.
pub(crate) fn init_from<'a, T: Copy>(o: &'a mut [MaybeUninit<T>], src: &[T]) -> &'a mut [T] {
    assert_eq!(o.len(), src.len(), "init_from: lengths differ");
    o.iter_mut().zip(src).for_each(|(o, &v)| {
        o.write(v);
    });
    // SAFETY: every element of `o` was written just above, and `MaybeUninit<T>` has the
    // layout of `T`.
    unsafe { &mut *(o as *mut [MaybeUninit<T>] as *mut [T]) }
}

/// A vector of `n` elements written by `fill`, which must write every one of them (the
/// output is not zeroed first).
pub(crate) fn filled<O>(n: usize, fill: impl FnOnce(&mut [MaybeUninit<O>])) -> Vec<O> {
    let mut v = Vec::with_capacity(n);
    fill(&mut v.spare_capacity_mut()[..n]);
    // SAFETY: `fill` initialised all `n` elements (if it panicked, we never get here and
    // the vector drops empty).
    unsafe { v.set_len(n) };
    v
}

/// Calls `row(r, out_row)` for every row of length `l`, in parallel for large outputs. Each
/// task runs its rows in the widest vector copy of the CPU ([`simd::vectorized`]), so the
/// fused row kernels (norms, softmax, rotary, cross-entropy) run vectorised with it.
pub(crate) fn run_rows<O: Send, F: Fn(usize, &mut [O]) + Sync>(o: &mut [O], l: usize, n: usize, row: F) {
    if n >= PAR_MIN {
        let rpc = rows_per_chunk(l);
        o.par_chunks_mut(l * rpc).enumerate().for_each(|(ci, chunk)| {
            simd::vectorized(
                #[inline(always)]
                || {
                    for (k, orow) in chunk.chunks_mut(l).enumerate() {
                        row(ci * rpc + k, orow);
                    }
                },
            )
        });
    } else {
        simd::vectorized(
            #[inline(always)]
            || {
                for (r, orow) in o.chunks_mut(l).enumerate() {
                    row(r, orow);
                }
            },
        )
    }
}

/// `out[i] = f(x[i])`, in parallel for large inputs.
/// The loop body is compiled for AVX2 and AVX-512 too (see [`simd`]), so `f` runs vectorised.
pub(crate) fn map1<T: Copy + Sync, O: Copy + Send + Default, F: Fn(T) -> O + Sync>(x: &[T], f: F) -> Vec<O> {
    filled(x.len(), |out| {
        if x.len() >= PAR_MIN {
            out.par_chunks_mut(PAR_MIN / 4).zip(x.par_chunks(PAR_MIN / 4)).for_each(|(o, x)| simd::map_into(x, o, &f));
        } else {
            simd::map_into(x, out, &f);
        }
    })
}
