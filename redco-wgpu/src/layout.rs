//! Layout kernels: permute, expand, narrow and cat, all one strided copy of elements (32-bit
//! words, or packed f16) (`kernels/copy.wgsl`), or a plain buffer copy when the region is
//! contiguous (and, for packed f16, 4-byte aligned).

use crate::device::groups_1d;
use crate::{tpl, u32p, Wgpu, WgpuStorage};
use redco_core::{Error, Result, Shape};

/// Drops size-1 dims and merges neighbours that are contiguous in every stride set
/// (`strides` is updated in place); returns the collapsed dims.
pub(crate) fn collapse(dims: &[usize], strides: &mut [Vec<usize>]) -> Vec<usize> {
    let mut out: Vec<usize> = Vec::new();
    let mut outs: Vec<Vec<usize>> = vec![Vec::new(); strides.len()];
    for d in 0..dims.len() {
        if dims[d] == 1 {
            continue;
        }
        let merge =
            !out.is_empty() && strides.iter().zip(&outs).all(|(s, o)| o.last().copied() == Some(s[d] * dims[d]));
        if merge {
            let last = out.len() - 1;
            out[last] *= dims[d];
            for (o, s) in outs.iter_mut().zip(strides.iter()) {
                o[last] = s[d];
            }
        } else {
            out.push(dims[d]);
            for (o, s) in outs.iter_mut().zip(strides.iter()) {
                o.push(s[d]);
            }
        }
    }
    for (s, o) in strides.iter_mut().zip(outs) {
        *s = o;
    }
    out
}

fn contiguous(dims: &[usize]) -> Vec<usize> {
    Shape::new(dims.to_vec()).strides()
}

/// `out[dst_off + c . dst] = x[src_off + c . src]` for every multi-index `c` over `dims`.
#[allow(clippy::too_many_arguments)]
fn strided_copy(
    w: &Wgpu,
    x: &WgpuStorage,
    out: &WgpuStorage,
    dims: &[usize],
    src: Vec<usize>,
    dst: Vec<usize>,
    src_off: usize,
    dst_off: usize,
) -> Result<()> {
    let n: usize = dims.iter().product();
    if n == 0 {
        return Ok(());
    }
    let mut st = [src, dst];
    let dims = collapse(dims, &mut st);
    let [src, dst] = st;
    let eb = w.elem_bytes(x.dtype) as usize;
    // buffer copies need offsets and sizes in multiples of 4 bytes
    let aligned = [src_off, dst_off, n].iter().all(|&v| (v * eb).is_multiple_of(4));
    if aligned && dims.len() <= 1 && src.iter().all(|&s| s == 1) && dst.iter().all(|&s| s == 1) {
        let eb = eb as u64;
        return w.ctx.copy(x.buf.raw(), src_off as u64 * eb, out.buf.raw(), dst_off as u64 * eb, n as u64 * eb);
    }
    let mut p = vec![u32p(n, "elements")?, dims.len() as u32, u32p(src_off, "offset")?, u32p(dst_off, "offset")?];
    for v in [&dims, &src, &dst] {
        for &d in v.iter() {
            p.push(u32p(d, "stride")?);
        }
    }
    let e = w.bits(x.dtype);
    w.launch(&format!("copy/{e}"), || tpl(include_str!("kernels/copy.wgsl"), &[("$E", e)]), &[x], out, &p, groups_1d(n))
}

/// Copies `x` with its dimensions permuted.
pub(crate) fn permute(w: &Wgpu, x: &WgpuStorage, shape: &Shape, perm: &[usize]) -> Result<WgpuStorage> {
    let r = shape.rank();
    let mut seen = vec![false; r];
    if perm.len() != r || perm.iter().any(|&p| p >= r || std::mem::replace(&mut seen[p], true)) {
        return Err(Error::invalid("permute", format!("{perm:?} is not a permutation of the dims of {shape}")));
    }
    let st = shape.strides();
    let dims: Vec<usize> = perm.iter().map(|&p| shape.dims()[p]).collect();
    let src: Vec<usize> = perm.iter().map(|&p| st[p]).collect();
    let out = w.alloc(x.len, x.dtype)?;
    strided_copy(w, x, &out, &dims, src, contiguous(&dims), 0, 0)?;
    Ok(out)
}

/// Copies `x` broadcast to `out`.
pub(crate) fn expand(w: &Wgpu, x: &WgpuStorage, shape: &Shape, out: &Shape) -> Result<WgpuStorage> {
    if shape.broadcast(out, "expand")? != *out {
        return Err(Error::ShapeMismatch { op: "expand", lhs: shape.clone(), rhs: out.clone() });
    }
    let o = w.alloc(out.elem_count(), x.dtype)?;
    strided_copy(w, x, &o, out.dims(), shape.broadcast_strides(out), out.strides(), 0, 0)?;
    Ok(o)
}

/// Copies the slice `start..start + len` of dimension `dim`.
pub(crate) fn narrow(
    w: &Wgpu,
    x: &WgpuStorage,
    shape: &Shape,
    dim: usize,
    start: usize,
    len: usize,
) -> Result<WgpuStorage> {
    if dim >= shape.rank() || start + len > shape.dims()[dim] {
        return Err(Error::invalid("narrow", format!("{start}..{} out of dim {dim} of {shape}", start + len)));
    }
    let dims = shape.with_dim(dim, len);
    let st = shape.strides();
    let out = w.alloc(dims.elem_count(), x.dtype)?;
    strided_copy(w, x, &out, dims.dims(), st.clone(), dims.strides(), start * st[dim], 0)?;
    Ok(out)
}

/// Concatenates along `dim`.
pub(crate) fn cat(w: &Wgpu, xs: &[(&WgpuStorage, &Shape)], dim: usize) -> Result<WgpuStorage> {
    let Some((first, s0)) = xs.first() else {
        return Err(Error::invalid("cat", "no tensors to concatenate"));
    };
    let mut total = 0;
    for (s, sh) in xs {
        let same = sh.rank() == s0.rank()
            && dim < sh.rank()
            && sh.dims().iter().zip(s0.dims()).enumerate().all(|(i, (a, b))| i == dim || a == b);
        if !same {
            return Err(Error::ShapeMismatch { op: "cat", lhs: (*s0).clone(), rhs: (*sh).clone() });
        }
        if s.dtype != first.dtype {
            return Err(Error::DTypeMismatch { op: "cat", lhs: first.dtype, rhs: s.dtype });
        }
        total += sh.dims()[dim];
    }
    let out_shape = s0.with_dim(dim, total);
    let ost = out_shape.strides();
    let out = w.alloc(out_shape.elem_count(), first.dtype)?;
    let mut off = 0;
    for (s, sh) in xs {
        strided_copy(w, s, &out, sh.dims(), sh.strides(), ost.clone(), 0, off * ost[dim])?;
        off += sh.dims()[dim];
    }
    Ok(out)
}
