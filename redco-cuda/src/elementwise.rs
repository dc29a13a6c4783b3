//! Elementwise ops (`kernels/elementwise.cu`): fill, unary, broadcast binary, compare,
//! where, cast.

use crate::context::{tn, Cuda};
use crate::launch::{elementwise as cfg, Dims};
use crate::storage::CudaStorage;
use cudarc::driver::PushKernelArg;
use redco_core::backend::{BinaryOp, CmpOp, UnaryOp};
use redco_core::{DType, Error, Result, Shape};

/// The kernel's code and parameters of a unary op.
pub(crate) fn unary_code(op: UnaryOp) -> (i32, f64, f64) {
    use UnaryOp::*;
    match op {
        Neg => (0, 0.0, 0.0),
        Exp => (1, 0.0, 0.0),
        Log => (2, 0.0, 0.0),
        Sqrt => (3, 0.0, 0.0),
        Rsqrt => (4, 0.0, 0.0),
        Recip => (5, 0.0, 0.0),
        Abs => (6, 0.0, 0.0),
        Tanh => (7, 0.0, 0.0),
        Sigmoid => (8, 0.0, 0.0),
        Relu => (9, 0.0, 0.0),
        Silu => (10, 0.0, 0.0),
        GeluErf => (11, 0.0, 0.0),
        GeluTanh => (12, 0.0, 0.0),
        Erf => (13, 0.0, 0.0),
        Sin => (14, 0.0, 0.0),
        Cos => (15, 0.0, 0.0),
        Square => (16, 0.0, 0.0),
        Step => (17, 0.0, 0.0),
        SiluDeriv => (18, 0.0, 0.0),
        GeluErfDeriv => (19, 0.0, 0.0),
        GeluTanhDeriv => (20, 0.0, 0.0),
        Affine { mul, add } => (21, mul, add),
        Powf(e) => (22, e, 0.0),
        ClampMin(c) => (23, c, 0.0),
    }
}

pub(crate) fn binary_code(op: BinaryOp) -> i32 {
    match op {
        BinaryOp::Add => 0,
        BinaryOp::Sub => 1,
        BinaryOp::Mul => 2,
        BinaryOp::Div => 3,
        BinaryOp::Max => 4,
        BinaryOp::Min => 5,
    }
}

pub(crate) fn cmp_code(op: CmpOp) -> i32 {
    match op {
        CmpOp::Eq => 0,
        CmpOp::Ne => 1,
        CmpOp::Lt => 2,
        CmpOp::Le => 3,
        CmpOp::Gt => 4,
        CmpOp::Ge => 5,
    }
}

/// Fails unless both operands have the same dtype.
pub(crate) fn same(a: &CudaStorage, b: &CudaStorage, op: &'static str) -> Result<()> {
    if a.dtype() != b.dtype() {
        return Err(Error::DTypeMismatch { op, lhs: a.dtype(), rhs: b.dtype() });
    }
    Ok(())
}

/// Fails unless `s` holds exactly the elements of `shape`.
pub(crate) fn fits(s: &CudaStorage, shape: &Shape, op: &'static str) -> Result<()> {
    if s.len() != shape.elem_count() {
        return Err(Error::ElementCount { op, shape: shape.clone(), expected: shape.elem_count(), got: s.len() });
    }
    Ok(())
}

impl Cuda {
    pub(crate) fn fill(&self, n: usize, value: f64, dtype: DType) -> Result<CudaStorage> {
        let y = self.alloc(n, dtype)?;
        if n > 0 {
            let f = self.function("elementwise", &format!("fill_{}", tn(dtype)))?;
            let (p, n64) = (y.ptr(), n as i64);
            self.launch(&f, cfg(n), |b| {
                b.arg(&p).arg(&n64).arg(&value);
            })?;
        }
        Ok(y)
    }

    pub(crate) fn unary_op(&self, op: UnaryOp, x: &CudaStorage, n: usize) -> Result<CudaStorage> {
        if !x.dtype().is_float() {
            return Err(Error::UnsupportedDType { op: "unary", dtype: x.dtype() });
        }
        if x.len() < n {
            return Err(Error::ElementCount { op: "unary", shape: Shape::new([n]), expected: n, got: x.len() });
        }
        let y = self.alloc(n, x.dtype())?;
        if n > 0 {
            let (code, p0, p1) = unary_code(op);
            let f = self.function("elementwise", &format!("unary_{}", tn(x.dtype())))?;
            let (xp, yp, n64) = (x.ptr(), y.ptr(), n as i64);
            self.launch(&f, cfg(n), |b| {
                b.arg(&xp).arg(&yp).arg(&n64).arg(&code).arg(&p0).arg(&p1);
            })?;
        }
        Ok(y)
    }

    /// A broadcast op of two operands writing `out_dtype` (binary and compare).
    #[allow(clippy::too_many_arguments)]
    fn broadcast2(
        &self,
        kernel: String,
        a: (&CudaStorage, &Shape),
        b: (&CudaStorage, &Shape),
        out: &Shape,
        out_dtype: DType,
        code: i32,
        op: &'static str,
    ) -> Result<CudaStorage> {
        same(a.0, b.0, op)?;
        fits(a.0, a.1, op)?;
        fits(b.0, b.1, op)?;
        let n = out.elem_count();
        let y = self.alloc(n, out_dtype)?;
        if n > 0 {
            let d = Dims::broadcast(out, &[a.1, b.1])?;
            let f = self.function("elementwise", &kernel)?;
            let (ap, bp, yp, n64) = (a.0.ptr(), b.0.ptr(), y.ptr(), n as i64);
            self.launch(&f, cfg(n), |l| {
                l.arg(&ap).arg(&bp).arg(&yp).arg(&n64).arg(&d).arg(&code);
            })?;
        }
        Ok(y)
    }

    pub(crate) fn binary_op(
        &self,
        op: BinaryOp,
        a: (&CudaStorage, &Shape),
        b: (&CudaStorage, &Shape),
        out: &Shape,
    ) -> Result<CudaStorage> {
        let k = format!("binary_{}", tn(a.0.dtype()));
        self.broadcast2(k, a, b, out, a.0.dtype(), binary_code(op), "binary")
    }

    pub(crate) fn compare_op(
        &self,
        op: CmpOp,
        a: (&CudaStorage, &Shape),
        b: (&CudaStorage, &Shape),
        out: &Shape,
    ) -> Result<CudaStorage> {
        let k = format!("compare_{}", tn(a.0.dtype()));
        self.broadcast2(k, a, b, out, DType::U8, cmp_code(op), "compare")
    }

    pub(crate) fn where_op(
        &self,
        c: (&CudaStorage, &Shape),
        a: (&CudaStorage, &Shape),
        b: (&CudaStorage, &Shape),
        out: &Shape,
    ) -> Result<CudaStorage> {
        if c.0.dtype() != DType::U8 {
            return Err(Error::UnsupportedDType { op: "where (condition must be U8)", dtype: c.0.dtype() });
        }
        same(a.0, b.0, "where")?;
        for (s, sh) in [c, a, b] {
            fits(s, sh, "where")?;
        }
        let n = out.elem_count();
        let y = self.alloc(n, a.0.dtype())?;
        if n > 0 {
            let d = Dims::broadcast(out, &[c.1, a.1, b.1])?;
            let f = self.function("elementwise", &format!("where_{}", tn(a.0.dtype())))?;
            let (cp, ap, bp, yp, n64) = (c.0.ptr(), a.0.ptr(), b.0.ptr(), y.ptr(), n as i64);
            self.launch(&f, cfg(n), |l| {
                l.arg(&cp).arg(&ap).arg(&bp).arg(&yp).arg(&n64).arg(&d);
            })?;
        }
        Ok(y)
    }

    pub(crate) fn cast_op(&self, x: &CudaStorage, n: usize, dtype: DType) -> Result<CudaStorage> {
        if x.len() < n {
            return Err(Error::ElementCount { op: "cast", shape: Shape::new([n]), expected: n, got: x.len() });
        }
        if x.dtype() == dtype && x.len() == n {
            return Ok(x.clone());
        }
        let y = self.alloc(n, dtype)?;
        if n > 0 {
            let f = self.function("elementwise", &format!("cast_{}_{}", tn(x.dtype()), tn(dtype)))?;
            let (xp, yp, n64) = (x.ptr(), y.ptr(), n as i64);
            self.launch(&f, cfg(n), |l| {
                l.arg(&xp).arg(&yp).arg(&n64);
            })?;
        }
        // ids cast between integer types keep their values where the target holds them
        let fits_in = |lo: i64, hi: i64| match dtype {
            DType::I64 => true,
            DType::I32 => lo >= i32::MIN as i64 && hi <= i32::MAX as i64,
            DType::U8 => lo >= 0 && hi <= u8::MAX as i64,
            _ => false,
        };
        y.know(x.bounds().filter(|b| b.range().is_none_or(|(lo, hi)| fits_in(lo, hi))));
        Ok(y)
    }
}
