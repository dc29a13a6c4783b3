//! CPU layout kernels: permute, expand, narrow, cat (copies for any element type).

use super::any_kernel;
use super::strided::{coalesce, filled, row_offsets, run_rows};
use redco_core::{Error, HostData, Result, Shape};

/// Copies `x` read through `strides` (one per output dim) into a contiguous `out_dims` buffer.
fn strided_copy<T: Copy + Send + Sync + Default>(x: &[T], out_dims: &[usize], strides: Vec<usize>) -> Vec<T> {
    let n: usize = out_dims.iter().product();
    if n == 0 {
        return Vec::new();
    }
    let (dims, st) = coalesce(out_dims, &[strides]);
    let st: [Vec<usize>; 1] = [st[0].clone()];
    let l = *dims.last().unwrap();
    let inner = st[0][dims.len() - 1];
    filled(n, |o| {
        run_rows(o, l, n, |r, orow| {
            let [off] = row_offsets(r, &dims, &st);
            if inner == 1 {
                orow.iter_mut().zip(&x[off..off + l]).for_each(|(o, &v)| {
                    o.write(v);
                });
            } else {
                orow.iter_mut().enumerate().for_each(|(j, o)| {
                    o.write(x[off + j * inner]);
                });
            }
        })
    })
}

/// Permutes dims: `out.dims[i] = shape.dims[perm[i]]`.
pub(crate) fn permute(x: &HostData, shape: &Shape, perm: &[usize]) -> HostData {
    let in_st = shape.strides();
    let out_dims: Vec<usize> = perm.iter().map(|&p| shape.dims()[p]).collect();
    let st: Vec<usize> = perm.iter().map(|&p| in_st[p]).collect();
    any_kernel!(x, v => strided_copy(v, &out_dims, st.clone()))
}

/// Materialises a broadcast to `out`.
pub(crate) fn expand(x: &HostData, shape: &Shape, out: &Shape) -> HostData {
    let st = shape.broadcast_strides(out);
    any_kernel!(x, v => strided_copy(v, out.dims(), st.clone()))
}

fn narrow_t<T: Copy>(x: &[T], outer: usize, size: usize, inner: usize, start: usize, len: usize) -> Vec<T> {
    let mut o = Vec::with_capacity(outer * len * inner);
    for i in 0..outer {
        let base = i * size * inner + start * inner;
        o.extend_from_slice(&x[base..base + len * inner]);
    }
    o
}

/// The slice `start..start+len` of `dim`.
pub(crate) fn narrow(x: &HostData, shape: &Shape, dim: usize, start: usize, len: usize) -> HostData {
    let (outer, size, inner) = shape.split_at_dim(dim);
    any_kernel!(x, v => narrow_t(v, outer, size, inner, start, len))
}

/// Concatenation along `dim` (all parts have the same dtype).
pub(crate) fn cat(parts: &[(&HostData, &Shape)], dim: usize) -> Result<HostData> {
    let first = parts.first().ok_or_else(|| Error::invalid("cat", "no parts"))?;
    let (outer, _, inner) = first.1.split_at_dim(dim);
    macro_rules! go {
        ($var:ident) => {{
            let mut o = Vec::new();
            for i in 0..outer {
                for (h, sh) in parts {
                    let HostData::$var(v) = h else {
                        return Err(Error::invalid("cat", "parts have different dtypes"));
                    };
                    let blk = sh.dims()[dim] * inner;
                    o.extend_from_slice(&v[i * blk..(i + 1) * blk]);
                }
            }
            HostData::$var(o)
        }};
    }
    Ok(match first.0 {
        HostData::F32(_) => go!(F32),
        HostData::F64(_) => go!(F64),
        HostData::F16(_) => go!(F16),
        HostData::BF16(_) => go!(BF16),
        HostData::I64(_) => go!(I64),
        HostData::I32(_) => go!(I32),
        HostData::U8(_) => go!(U8),
    })
}
