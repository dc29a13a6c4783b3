//! Reductions along one dimension (`kernels/reduce.cu`).

use crate::context::{tn, Cuda};
use crate::elementwise::fits;
use crate::launch::{around, elementwise, per_row};
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
        if inner == 1 && x.dtype().is_float() {
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
