//! Layout copies (`kernels/layout.cu`): permute, expand, narrow and cat, each one strided
//! copy of raw elements.

use crate::context::Cuda;
use crate::device::err;
use crate::elementwise::fits;
use crate::launch::{elementwise as cfg, Dims};
use crate::storage::CudaStorage;
use cudarc::driver::PushKernelArg;
use redco_core::{DType, Error, Result, Shape};

fn strides(dims: &[usize]) -> Vec<i64> {
    Shape::new(dims.to_vec()).strides().into_iter().map(|s| s as i64).collect()
}

impl Cuda {
    /// `dst[dst_base + i . dst_strides] = src[src_base + i . src_strides]` over `space`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn strided_copy(
        &self,
        src: &CudaStorage,
        dst: &CudaStorage,
        space: &[usize],
        src_strides: &[i64],
        dst_strides: &[i64],
        src_base: usize,
        dst_base: usize,
    ) -> Result<()> {
        let n: usize = space.iter().product();
        if n == 0 {
            return Ok(());
        }
        let d = Dims::new(space, &[dst_strides, src_strides])?;
        let width = src.dtype().size_in_bytes();
        let f = self.function("layout", &format!("copy_b{width}"))?;
        let (sp, dp, n64, sb, db) = (src.ptr(), dst.ptr(), n as i64, src_base as i64, dst_base as i64);
        self.launch(&f, cfg(n), |l| {
            l.arg(&sp).arg(&dp).arg(&n64).arg(&d).arg(&sb).arg(&db);
        })
    }

    /// A copy of `x` in a new buffer (device to device).
    /// The device's copy rate: bytes read plus written per second copying a buffer of
    /// `bytes` on the device, the best of `reps` copies after a warm-up.
    pub fn copy_rate(&self, bytes: usize, reps: usize) -> Result<f64> {
        let x = self.alloc(bytes / 4, DType::F32)?;
        self.duplicate(&x)?;
        self.inner.stream.synchronize().map_err(|e| err(format!("a kernel failed: {e}")))?;
        let mut best = f64::MAX;
        for _ in 0..reps.max(1) {
            let t = std::time::Instant::now();
            let y = self.duplicate(&x)?;
            self.inner.stream.synchronize().map_err(|e| err(format!("a kernel failed: {e}")))?;
            best = best.min(t.elapsed().as_secs_f64());
            drop(y);
        }
        Ok(2.0 * (bytes / 4 * 4) as f64 / best)
    }

    pub(crate) fn duplicate(&self, x: &CudaStorage) -> Result<CudaStorage> {
        let y = self.alloc(x.len(), x.dtype())?;
        let bytes = x.len() * x.dtype().size_in_bytes();
        if bytes > 0 {
            self.inner.ctx.bind_to_thread().map_err(err)?;
            // SAFETY: both buffers hold `bytes` bytes; the copy is ordered on the stream
            unsafe {
                cudarc::driver::result::memcpy_dtod_async(y.ptr(), x.ptr(), bytes, self.inner.stream.cu_stream())
            }
            .map_err(|e| err(format!("device copy failed: {e}")))?;
        }
        y.know(x.bounds());
        Ok(y)
    }

    pub(crate) fn permute_op(&self, x: &CudaStorage, shape: &Shape, perm: &[usize]) -> Result<CudaStorage> {
        fits(x, shape, "permute")?;
        let d = shape.dims();
        if perm.len() != d.len() || (0..d.len()).any(|i| !perm.contains(&i)) {
            return Err(Error::invalid("permute", format!("{perm:?} is not a permutation of {} dimensions", d.len())));
        }
        let out: Vec<usize> = perm.iter().map(|&p| d[p]).collect();
        let st = strides(d);
        let src: Vec<i64> = perm.iter().map(|&p| st[p]).collect();
        let y = self.alloc(x.len(), x.dtype())?;
        self.strided_copy(x, &y, &out, &src, &strides(&out), 0, 0)?;
        y.know(x.bounds());
        Ok(y)
    }

    pub(crate) fn expand_op(&self, x: &CudaStorage, shape: &Shape, out: &Shape) -> Result<CudaStorage> {
        fits(x, shape, "expand")?;
        if shape.broadcast(out, "expand")? != *out {
            return Err(Error::ShapeMismatch { op: "expand", lhs: shape.clone(), rhs: out.clone() });
        }
        let src: Vec<i64> = shape.broadcast_strides(out).into_iter().map(|s| s as i64).collect();
        let y = self.alloc(out.elem_count(), x.dtype())?;
        self.strided_copy(x, &y, out.dims(), &src, &strides(out.dims()), 0, 0)?;
        y.know(x.bounds());
        Ok(y)
    }

    pub(crate) fn narrow_op(
        &self,
        x: &CudaStorage,
        shape: &Shape,
        dim: usize,
        start: usize,
        len: usize,
    ) -> Result<CudaStorage> {
        fits(x, shape, "narrow")?;
        let d = shape.dims();
        if dim >= d.len() || start.checked_add(len).is_none_or(|e| e > d[dim]) {
            return Err(Error::invalid("narrow", format!("{start}..{start}+{len} of dimension {dim} of {shape:?}")));
        }
        let mut out = d.to_vec();
        out[dim] = len;
        let st = strides(d);
        let y = self.alloc(out.iter().product(), x.dtype())?;
        self.strided_copy(x, &y, &out, &st, &strides(&out), start * st[dim] as usize, 0)?;
        // a part of the values: within the whole's bounds
        y.know(x.bounds());
        Ok(y)
    }

    pub(crate) fn cat_op(&self, xs: &[(&CudaStorage, &Shape)], dim: usize) -> Result<CudaStorage> {
        let (first, fs) = xs.first().ok_or_else(|| Error::invalid("cat", "no tensors to concatenate"))?;
        if dim >= fs.rank() {
            return Err(Error::invalid("cat", format!("dimension {dim} of a rank-{} tensor", fs.rank())));
        }
        let mut out = fs.dims().to_vec();
        out[dim] = 0;
        for (s, sh) in xs {
            fits(s, sh, "cat")?;
            crate::elementwise::same(first, s, "cat")?;
            let ok = sh.rank() == fs.rank() && (0..fs.rank()).all(|k| k == dim || sh.dims()[k] == fs.dims()[k]);
            if !ok {
                return Err(Error::ShapeMismatch { op: "cat", lhs: (*fs).clone(), rhs: (*sh).clone() });
            }
            out[dim] += sh.dims()[dim];
        }
        let ost = strides(&out);
        let y = self.alloc(out.iter().product(), first.dtype())?;
        let mut off = 0;
        for (s, sh) in xs {
            self.strided_copy(s, &y, sh.dims(), &strides(sh.dims()), &ost, 0, off * ost[dim] as usize)?;
            off += sh.dims()[dim];
        }
        y.know(xs.iter().try_fold(crate::bounds::Bounds::of([]), |acc, (s, _)| s.bounds().map(|b| acc.union(b))));
        Ok(y)
    }
}
