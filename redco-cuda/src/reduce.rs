//! Reductions along one dimension (`kernels/reduce.cu`).

use crate::adamw::many_config;
use crate::context::{tn, Cuda};
use crate::elementwise::fits;
use crate::launch::{around, elementwise, per_row, split_parts};
use crate::storage::CudaStorage;
use cudarc::driver::PushKernelArg;
use redco_core::backend::ReduceOp;
use redco_core::{DType, Error, Result, Shape};

impl Cuda {
    pub(crate) fn reduce_op(&self, op: ReduceOp, x: &CudaStorage, shape: &Shape, dim: usize) -> Result<CudaStorage> {
        fits(x, shape, "reduce")?;
        if dim >= shape.rank() {
            return Err(Error::DimOutOfRange { op: "reduce", dim: dim as isize, shape: shape.clone() });
        }
        let (outer, size, inner) = around(shape, dim);
        let n = outer * inner;
        let (o64, s64, i64_) = (outer as i64, size as i64, inner as i64);
        let t = tn(x.dtype());
        if op == ReduceOp::ArgMax {
            let y = self.alloc(n, DType::I64)?;
            if n > 0 {
                let f = self.function("reduce", &format!("argmax_{t}"))?;
                let (xp, yp) = (x.ptr(), y.ptr());
                self.launch(&f, elementwise(n), |l| {
                    l.arg(&xp).arg(&yp).arg(&o64).arg(&s64).arg(&i64_);
                })?;
            }
            return Ok(y);
        }
        let code: i32 = match op {
            ReduceOp::Sum => 0,
            ReduceOp::Max => 1,
            _ => 2,
        };
        let y = self.alloc(n, x.dtype())?;
        if n == 0 {
            return Ok(y);
        }
        let (xp, yp) = (x.ptr(), y.ptr());
        let parts = split_parts(outer, size);
        if inner == 1 && x.dtype().is_float() && parts > 1 {
            // few long rows (a whole tensor's sum): spans of each row on their own blocks,
            // then the spans folded in order
            let acc = if x.dtype() == DType::F64 { DType::F64 } else { DType::F32 };
            let partial = self.alloc(outer * parts, acc)?;
            let (pp, p64) = (partial.ptr(), parts as i64);
            let f = self.function("reduce", &format!("reduce_split_{t}"))?;
            self.launch(&f, per_row(outer * parts, size.div_ceil(parts)), |l| {
                l.arg(&xp).arg(&pp).arg(&o64).arg(&s64).arg(&p64).arg(&code);
            })?;
            let f = self.function("reduce", &format!("reduce_parts_{t}"))?;
            self.launch(&f, per_row(outer, parts), |l| {
                l.arg(&pp).arg(&yp).arg(&o64).arg(&p64).arg(&code);
            })?;
        } else if inner == 1 && x.dtype().is_float() {
            let f = self.function("reduce", &format!("reduce_rows_{t}"))?;
            self.launch(&f, per_row(outer, size), |l| {
                l.arg(&xp).arg(&yp).arg(&o64).arg(&s64).arg(&code);
            })?;
        } else {
            let f = self.function("reduce", &format!("reduce_strided_{t}"))?;
            self.launch(&f, elementwise(n), |l| {
                l.arg(&xp).arg(&yp).arg(&o64).arg(&s64).arg(&i64_).arg(&code);
            })?;
        }
        Ok(y)
    }
}

/// Elements per chunk of the multi-tensor sum of squares.
const SQ_CHUNK: usize = 16 * 1024;

impl Cuda {
    /// [`redco_core::Backend::sum_squares_many`]: one launch per dtype over chunks of every
    /// tensor (each block's partial in f64), then one block adds the partials in order: an
    /// f64 scalar.
    pub(crate) fn sum_squares_many_op(&self, xs: &[(&CudaStorage, &Shape)]) -> Result<CudaStorage> {
        for (x, shape) in xs {
            fits(x, shape, "sum_squares_many")?;
            if !x.dtype().is_float() {
                return Err(Error::UnsupportedDType { op: "sum_squares_many", dtype: x.dtype() });
            }
        }
        // the launches, one per dtype present, and the blocks of each
        let mut launches = Vec::new();
        for dt in [DType::F32, DType::BF16, DType::F16, DType::F64] {
            let of: Vec<&(&CudaStorage, &Shape)> = xs.iter().filter(|(x, _)| x.dtype() == dt).collect();
            let rows: Vec<Vec<u64>> = of.iter().map(|(x, _)| vec![x.ptr()]).collect();
            let sizes: Vec<usize> = of.iter().map(|(_, s)| s.elem_count()).collect();
            if let Some(t) = self.multi_tensor(&rows, &sizes, SQ_CHUNK)? {
                let blocks = many_config(t.chunks).grid_dim.0 as usize;
                launches.push((dt, t, blocks));
            }
        }
        let total: usize = launches.iter().map(|l| l.2).sum();
        if total == 0 {
            return self.fill(1, 0.0, DType::F64);
        }
        let y = self.alloc(1, DType::F64)?;
        let partial = self.alloc(total, DType::F64)?;
        let mut at = 0usize;
        for (dt, t, blocks) in launches {
            let f = self.function("reduce", &format!("sum_squares_many_{}", tn(dt)))?;
            let (tp, cp, nc, ch) = (t.table.ptr(), t.list.ptr(), t.chunks as i64, SQ_CHUNK as i64);
            let pp = partial.ptr() + (at * 8) as u64;
            self.launch(&f, many_config(t.chunks), |l| {
                l.arg(&tp).arg(&cp).arg(&nc).arg(&ch).arg(&pp);
            })?;
            at += blocks;
        }
        let f = self.function("reduce", "sum_partials")?;
        let (pp, n, yp) = (partial.ptr(), total as i64, y.ptr());
        self.launch(&f, per_row(1, total), |l| {
            l.arg(&pp).arg(&n).arg(&yp);
        })?;
        Ok(y)
    }
}
