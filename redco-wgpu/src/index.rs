//! Indexing kernels: index_select, gather (`kernels/index.wgsl`), index_add
//! (`kernels/index_add.wgsl`) and scatter_add (`kernels/scatter_add.wgsl`).
//!
//! Ids are checked on the host before the launch (an out-of-range id is an error, not a
//! wild read); storages uploaded from the host keep their ids there, others are read back.
//! The two adds need no atomics: each output element sums its own sources, so results are
//! deterministic.

use crate::{tpl, u32p, Dev, Wgpu, WgpuStorage};
use redco_core::{Error, Result, Shape};
use std::sync::Arc;

fn check(ids: &[i64], size: usize, op: &'static str) -> Result<()> {
    match ids.iter().find(|&&i| i < 0 || i as usize >= size) {
        Some(&bad) => Err(Error::IndexOutOfRange { op, index: bad, size }),
        None => Ok(()),
    }
}

fn float_or_int(s: &WgpuStorage) -> &'static str {
    match Dev::of(s.dtype) {
        Dev::F32 => "f32",
        _ => "i32",
    }
}

/// Rows `ids` along `dim`.
pub(crate) fn index_select(
    w: &Wgpu,
    x: &WgpuStorage,
    shape: &Shape,
    dim: usize,
    ids: &WgpuStorage,
    n_ids: usize,
) -> Result<WgpuStorage> {
    let host = w.host_ids(ids, "index_select (ids)")?;
    let n_ids = n_ids.min(host.len());
    let (outer, size, inner) = shape.split_at_dim(dim);
    check(&host[..n_ids], size, "index_select")?;
    let n = outer * n_ids * inner;
    let e = w.bits(x.dtype);
    let src = || {
        tpl(
            include_str!("kernels/index.wgsl"),
            &[("$MODE", "y[o] = x[(oo * size + u32(ids[j])) * inner + ii];"), ("$E", e)],
        )
    };
    let p = [u32p(n, "elements")?, u32p(inner, "inner")?, u32p(size, "size")?, u32p(n_ids, "ids")?];
    w.map_kernel(&format!("index_select/{e}"), src, &[x, ids], n, x.dtype, &p)
}

/// `out[.., i, ..] = x[.., idx[.., i, ..], ..]` along `dim`.
pub(crate) fn gather(
    w: &Wgpu,
    x: &WgpuStorage,
    shape: &Shape,
    dim: usize,
    idx: &WgpuStorage,
    idx_shape: &Shape,
) -> Result<WgpuStorage> {
    let host = w.host_ids(idx, "gather (index)")?;
    let (_, size, inner) = shape.split_at_dim(dim);
    check(&host, size, "gather")?;
    let k = idx_shape.dims()[dim];
    let n = idx_shape.elem_count();
    let e = w.bits(x.dtype);
    let src = || {
        tpl(
            include_str!("kernels/index.wgsl"),
            &[("$MODE", "y[o] = x[(oo * size + u32(ids[o])) * inner + ii];"), ("$E", e)],
        )
    };
    let p = [u32p(n, "elements")?, u32p(inner, "inner")?, u32p(size, "size")?, u32p(k, "index size")?];
    w.map_kernel(&format!("gather/{e}"), src, &[x, idx], n, x.dtype, &p)
}

/// `x` with the rows of `src` added at `ids` along `dim`.
pub(crate) fn index_add(
    w: &Wgpu,
    x: &WgpuStorage,
    shape: &Shape,
    dim: usize,
    ids: &WgpuStorage,
    src: &WgpuStorage,
) -> Result<WgpuStorage> {
    let host = w.host_ids(ids, "index_add (ids)")?;
    let (outer, size, inner) = shape.split_at_dim(dim);
    let k = host.len();
    if src.len != outer * k * inner {
        return Err(Error::ShapeMismatch {
            op: "index_add",
            lhs: shape.with_dim(dim, k),
            rhs: Shape::new(vec![src.len]),
        });
    }
    check(&host, size, "index_add")?;
    // CSR inverse of the ids: offs[j]..offs[j + 1] index `order`, the source rows of row j
    let mut offs = vec![0u32; size + 1];
    for &i in host.iter() {
        offs[i as usize + 1] += 1;
    }
    for j in 0..size {
        offs[j + 1] += offs[j];
    }
    let mut fill = offs.clone();
    let mut order = vec![0u32; k.max(1)];
    for (q, &i) in host.iter().enumerate() {
        order[fill[i as usize] as usize] = q as u32;
        fill[i as usize] += 1;
    }
    let offs = w.upload_words(&offs)?;
    let order = w.upload_words(&order)?;
    let (ty, store, xt) = (float_or_int(x), w.store(x.dtype), w.elem_as(x.dtype, float_or_int(x)));
    let key = format!("index_add/{ty}/{xt}/{store}");
    let srcf = || tpl(include_str!("kernels/index_add.wgsl"), &[("$T", ty), ("$XT", xt), ("$STORE", store)]);
    let n = x.len;
    let p = [u32p(n, "elements")?, u32p(inner, "inner")?, u32p(size, "size")?, u32p(k, "ids")?];
    w.map_kernel(&key, srcf, &[x, src, &offs, &order], n, x.dtype, &p)
}

/// `x` with `src` added at the positions `gather` reads.
pub(crate) fn scatter_add(
    w: &Wgpu,
    x: &WgpuStorage,
    shape: &Shape,
    dim: usize,
    idx: &WgpuStorage,
    idx_shape: &Shape,
    src: &WgpuStorage,
) -> Result<WgpuStorage> {
    let host = w.host_ids(idx, "scatter_add (index)")?;
    let (_, size, inner) = shape.split_at_dim(dim);
    check(&host, size, "scatter_add")?;
    let k = idx_shape.dims()[dim];
    let (ty, store, xt) = (float_or_int(x), w.store(x.dtype), w.elem_as(x.dtype, float_or_int(x)));
    let key = format!("scatter_add/{ty}/{xt}/{store}");
    let srcf = || tpl(include_str!("kernels/scatter_add.wgsl"), &[("$T", ty), ("$XT", xt), ("$STORE", store)]);
    let n = x.len;
    let p = [u32p(n, "elements")?, u32p(inner, "inner")?, u32p(size, "size")?, u32p(k, "index size")?];
    w.map_kernel(&key, srcf, &[x, idx, src], n, x.dtype, &p)
}

impl Wgpu {
    /// Uploads u32 words (kernel tables) as storage.
    pub(crate) fn upload_words(&self, v: &[u32]) -> Result<WgpuStorage> {
        let buf = self.ctx.upload_bytes(bytemuck::cast_slice(v))?;
        Ok(WgpuStorage { buf: Arc::new(buf), len: v.len(), dtype: redco_core::DType::U8, host_ids: None })
    }
}
