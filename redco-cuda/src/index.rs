//! Index ops (`kernels/index.cu`): index_select, index_add, gather, scatter_add. Ids
//! whose range the host knows (uploaded ids and their copies: [`crate::bounds`]) are
//! checked on the host, with no wait for the GPU; for other ids the kernels flag an id out
//! of range on the device and the host reads the flag back (one small read per call).

use crate::context::{tn, Cuda};
use crate::elementwise::fits;
use crate::launch::{around, elementwise as cfg};
use crate::storage::CudaStorage;
use cudarc::driver::PushKernelArg;
use redco_core::{DType, Error, Result, Shape};

fn id_name(ids: &CudaStorage, op: &'static str) -> Result<&'static str> {
    match ids.dtype() {
        DType::I64 => Ok("i64"),
        DType::I32 => Ok("i32"),
        d => Err(Error::UnsupportedDType { op, dtype: d }),
    }
}

impl Cuda {
    /// The error for ids out of range when the kernel set `flag` (the ids are read back to
    /// name the first bad one: the rare path only).
    fn bad_ids(&self, flag: &CudaStorage, ids: &CudaStorage, op: &'static str, size: usize) -> Result<()> {
        if ids.known_within(size, None) || !self.flag_set(flag)? {
            return Ok(());
        }
        let all = self.download_data(ids)?.to_i64_vec()?;
        let index = all.into_iter().find(|&i| i < 0 || i as u64 >= size as u64).unwrap_or(-1);
        Err(Error::IndexOutOfRange { op, index, size })
    }

    /// Runs `kernel(y, ids, src, outer, size, inner, n, bad)` of an additive op on f32 or
    /// f64 (other dtypes widened and narrowed around it).
    #[allow(clippy::too_many_arguments)]
    fn add_at(
        &self,
        kernel: &str,
        x: &CudaStorage,
        ids: &CudaStorage,
        src: &CudaStorage,
        (outer, size, inner, n): (usize, usize, usize, usize),
        work: usize,
        op: &'static str,
    ) -> Result<CudaStorage> {
        crate::elementwise::same(x, src, op)?;
        let dt = x.dtype();
        // 16-bit floats add in f32, integers in f64 (stored back saturating), as the CPU
        let wide = match dt {
            DType::F32 | DType::F64 => dt,
            DType::F16 | DType::BF16 => DType::F32,
            DType::I64 | DType::I32 | DType::U8 => DType::F64,
        };
        let y = if wide == dt { self.duplicate(x)? } else { self.cast_op(x, x.len(), wide)? };
        let src = self.cast_op(src, src.len(), wide)?;
        let flag = self.flag()?;
        if work > 0 {
            let f = self.function("index", &format!("{kernel}_{}_{}", tn(wide), id_name(ids, op)?))?;
            let (yp, ip, sp, fp) = (y.ptr(), ids.ptr(), src.ptr(), flag.ptr());
            let (o, s, i, k) = (outer as i64, size as i64, inner as i64, n as i64);
            self.launch(&f, cfg(work), |l| {
                l.arg(&yp).arg(&ip).arg(&sp).arg(&o).arg(&s).arg(&i).arg(&k).arg(&fp);
            })?;
        }
        self.bad_ids(&flag, ids, op, size)?;
        if wide == dt {
            Ok(y)
        } else {
            self.cast_op(&y, y.len(), dt)
        }
    }

    pub(crate) fn index_select_op(
        &self,
        x: &CudaStorage,
        shape: &Shape,
        dim: usize,
        ids: &CudaStorage,
        n_ids: usize,
    ) -> Result<CudaStorage> {
        fits(x, shape, "index_select")?;
        if dim >= shape.rank() || ids.len() < n_ids {
            return Err(Error::invalid("index_select", format!("dimension {dim} of {shape:?} with {n_ids} ids")));
        }
        let (outer, size, inner) = around(shape, dim);
        self.look_up("index_select", x, ids, (outer, size, inner, n_ids), outer * n_ids * inner)
    }

    /// Runs the lookup `kernel(x, ids, y, outer, size, inner, n, bad)` into a new buffer of
    /// `work` elements, then reports ids out of range.
    fn look_up(
        &self,
        kernel: &'static str,
        x: &CudaStorage,
        ids: &CudaStorage,
        (outer, size, inner, n): (usize, usize, usize, usize),
        work: usize,
    ) -> Result<CudaStorage> {
        let y = self.alloc(work, x.dtype())?;
        let flag = self.flag()?;
        if work > 0 {
            let f = self.function("index", &format!("{kernel}_{}_{}", tn(x.dtype()), id_name(ids, kernel)?))?;
            let (xp, ip, yp, fp) = (x.ptr(), ids.ptr(), y.ptr(), flag.ptr());
            let (o, s, i, k) = (outer as i64, size as i64, inner as i64, n as i64);
            self.launch(&f, cfg(work), |l| {
                l.arg(&xp).arg(&ip).arg(&yp).arg(&o).arg(&s).arg(&i).arg(&k).arg(&fp);
            })?;
        }
        self.bad_ids(&flag, ids, kernel, size)?;
        Ok(y)
    }

    pub(crate) fn index_add_op(
        &self,
        x: &CudaStorage,
        shape: &Shape,
        dim: usize,
        ids: &CudaStorage,
        src: &CudaStorage,
    ) -> Result<CudaStorage> {
        fits(x, shape, "index_add")?;
        if dim >= shape.rank() {
            return Err(Error::DimOutOfRange { op: "index_add", dim: dim as isize, shape: shape.clone() });
        }
        let (outer, size, inner) = around(shape, dim);
        let n = ids.len();
        if src.len() != outer * n * inner {
            return Err(Error::invalid("index_add", format!("{} source elements for {n} ids of {shape:?}", src.len())));
        }
        self.add_at("index_add", x, ids, src, (outer, size, inner, n), outer * n * inner, "index_add")
    }

    /// Checks that `idx_shape` equals `shape` except along `dim`.
    fn check_idx(shape: &Shape, dim: usize, idx_shape: &Shape, op: &'static str) -> Result<()> {
        let ok = dim < shape.rank()
            && idx_shape.rank() == shape.rank()
            && (0..shape.rank()).all(|k| k == dim || idx_shape.dims()[k] == shape.dims()[k]);
        if ok {
            Ok(())
        } else {
            Err(Error::ShapeMismatch { op, lhs: shape.clone(), rhs: idx_shape.clone() })
        }
    }

    pub(crate) fn gather_op(
        &self,
        x: &CudaStorage,
        shape: &Shape,
        dim: usize,
        idx: &CudaStorage,
        idx_shape: &Shape,
    ) -> Result<CudaStorage> {
        fits(x, shape, "gather")?;
        fits(idx, idx_shape, "gather")?;
        Self::check_idx(shape, dim, idx_shape, "gather")?;
        let (outer, size, inner) = around(shape, dim);
        let n = idx_shape.dims()[dim];
        self.look_up("gather", x, idx, (outer, size, inner, n), idx_shape.elem_count())
    }

    pub(crate) fn scatter_add_op(
        &self,
        x: &CudaStorage,
        shape: &Shape,
        dim: usize,
        idx: &CudaStorage,
        idx_shape: &Shape,
        src: &CudaStorage,
    ) -> Result<CudaStorage> {
        fits(x, shape, "scatter_add")?;
        fits(idx, idx_shape, "scatter_add")?;
        fits(src, idx_shape, "scatter_add")?;
        Self::check_idx(shape, dim, idx_shape, "scatter_add")?;
        let (outer, size, inner) = around(shape, dim);
        let n = idx_shape.dims()[dim];
        self.add_at("scatter_add", x, idx, src, (outer, size, inner, n), idx_shape.elem_count(), "scatter_add")
    }
}
