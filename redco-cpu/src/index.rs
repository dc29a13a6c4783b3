//! CPU indexing kernels: index_select, index_add, gather, scatter_add.

use super::{any_kernel, float_kernel};
use redco_core::{Error, HostData, Result, Shape};

fn check(ids: &[i64], size: usize, op: &'static str) -> Result<()> {
    match ids.iter().find(|&&i| i < 0 || i as usize >= size) {
        Some(&bad) => Err(Error::IndexOutOfRange { op, index: bad, size }),
        None => Ok(()),
    }
}

fn select_t<T: Copy>(x: &[T], outer: usize, size: usize, inner: usize, ids: &[i64]) -> Vec<T> {
    let mut o = Vec::with_capacity(outer * ids.len() * inner);
    for i in 0..outer {
        for &id in ids {
            let base = (i * size + id as usize) * inner;
            o.extend_from_slice(&x[base..base + inner]);
        }
    }
    o
}

/// Rows `ids` along `dim`.
pub(crate) fn index_select(x: &HostData, shape: &Shape, dim: usize, ids: &[i64]) -> Result<HostData> {
    let (outer, size, inner) = shape.split_at_dim(dim);
    check(ids, size, "index_select")?;
    Ok(any_kernel!(x, v => select_t(v, outer, size, inner, ids)))
}

fn index_add_t<T: num_traits::Float>(
    x: &[T],
    src: &[T],
    outer: usize,
    size: usize,
    inner: usize,
    ids: &[i64],
) -> Vec<T> {
    let mut o = x.to_vec();
    let n = ids.len();
    for i in 0..outer {
        for (j, &id) in ids.iter().enumerate() {
            let d = (i * size + id as usize) * inner;
            let s = (i * n + j) * inner;
            o[d..d + inner].iter_mut().zip(&src[s..s + inner]).for_each(|(a, &b)| *a = *a + b);
        }
    }
    o
}

/// `x` plus `src` rows at `ids` along `dim`.
pub(crate) fn index_add(x: &HostData, shape: &Shape, dim: usize, ids: &[i64], src: &HostData) -> Result<HostData> {
    let (outer, size, inner) = shape.split_at_dim(dim);
    check(ids, size, "index_add")?;
    if src.len() != outer * ids.len() * inner {
        return Err(Error::invalid("index_add", "source size does not match the ids"));
    }
    Ok(float_kernel!(x.dtype(), [x => a, src => s], index_add_t(a, s, outer, size, inner, ids)))
}

fn gather_t<T: Copy>(x: &[T], size: usize, inner: usize, idx: &[i64], isz: usize) -> Vec<T> {
    idx.iter()
        .enumerate()
        .map(|(p, &id)| {
            let (o, rem) = (p / (isz * inner), p % inner);
            x[(o * size + id as usize) * inner + rem]
        })
        .collect()
}

/// `out[o, i, r] = x[o, idx[o, i, r], r]`.
pub(crate) fn gather(x: &HostData, shape: &Shape, dim: usize, idx: &[i64], idx_shape: &Shape) -> Result<HostData> {
    let (_, size, inner) = shape.split_at_dim(dim);
    check(idx, size, "gather")?;
    let isz = idx_shape.dims()[dim];
    Ok(any_kernel!(x, v => gather_t(v, size, inner, idx, isz)))
}

fn scatter_add_t<T: num_traits::Float>(
    x: &[T],
    src: &[T],
    size: usize,
    inner: usize,
    idx: &[i64],
    isz: usize,
) -> Vec<T> {
    let mut o = x.to_vec();
    for (p, &id) in idx.iter().enumerate() {
        let (oi, rem) = (p / (isz * inner), p % inner);
        let d = (oi * size + id as usize) * inner + rem;
        o[d] = o[d] + src[p];
    }
    o
}

/// `x` plus `src` at the positions `gather` reads.
pub(crate) fn scatter_add(
    x: &HostData,
    shape: &Shape,
    dim: usize,
    idx: &[i64],
    idx_shape: &Shape,
    src: &HostData,
) -> Result<HostData> {
    let (_, size, inner) = shape.split_at_dim(dim);
    check(idx, size, "scatter_add")?;
    let isz = idx_shape.dims()[dim];
    Ok(float_kernel!(x.dtype(), [x => a, src => s], scatter_add_t(a, s, size, inner, idx, isz)))
}

fn write_t<T: Copy>(dst: &mut [T], row_len: usize, rows: &[i64], src: &[T]) {
    for (j, &r) in rows.iter().enumerate() {
        let at = r as usize * row_len;
        dst[at..at + row_len].copy_from_slice(&src[j * row_len..(j + 1) * row_len]);
    }
}

/// Writes the rows of `src` over rows `rows` of `dst` (`[n, row_len]`), in place.
pub(crate) fn write_rows(dst: &mut HostData, row_len: usize, rows: &[i64], src: &HostData) -> Result<()> {
    let n = dst.len().checked_div(row_len).unwrap_or(0);
    check(rows, n, "write_rows")?;
    if src.len() != rows.len() * row_len {
        return Err(Error::invalid(
            "write_rows",
            format!("{} rows of {row_len} need {} values, got {}", rows.len(), rows.len() * row_len, src.len()),
        ));
    }
    match (dst, src) {
        (HostData::F32(d), HostData::F32(s)) => write_t(d, row_len, rows, s),
        (HostData::F64(d), HostData::F64(s)) => write_t(d, row_len, rows, s),
        (HostData::F16(d), HostData::F16(s)) => write_t(d, row_len, rows, s),
        (HostData::BF16(d), HostData::BF16(s)) => write_t(d, row_len, rows, s),
        (HostData::I64(d), HostData::I64(s)) => write_t(d, row_len, rows, s),
        (HostData::I32(d), HostData::I32(s)) => write_t(d, row_len, rows, s),
        (HostData::U8(d), HostData::U8(s)) => write_t(d, row_len, rows, s),
        (d, s) => {
            return Err(Error::invalid("write_rows", format!("rows of {:?} written into {:?}", s.dtype(), d.dtype())))
        }
    }
    Ok(())
}
