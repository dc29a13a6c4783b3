//! Reductions along a dimension: sum, mean, max, min, argmax; and `sum_to`, the adjoint of
//! broadcasting.

use crate::backend::{CmpOp, ReduceOp};
use crate::sharding::rules;
use crate::{Backend, DType, Error, Result, Shape, Tensor};

impl<B: Backend> Tensor<B> {
    /// Reduces the local storage along `dim`; a sum over a split dim leaves a partial sum,
    /// other reductions need `dim` whole (the caller arranges it).
    fn reduce_raw(&self, op: ReduceOp, dim: usize) -> Result<Tensor<B>> {
        let s = self.backend().reduce(op, self.storage(), self.local_shape(), dim)?;
        let dtype = if op == ReduceOp::ArgMax { DType::I64 } else { self.dtype() };
        let placed = if op == ReduceOp::Sum { rules::sum(self.placements(), dim) } else { self.placements() };
        let local = self.local_shape().with_dim(dim, 1);
        Ok(Tensor::from_local(self.backend(), s, self.shape().with_dim(dim, 1), local, placed, dtype))
    }

    fn squeeze_if(t: Tensor<B>, dim: usize, keepdim: bool) -> Result<Tensor<B>> {
        if keepdim {
            Ok(t)
        } else {
            t.squeeze(dim as isize)
        }
    }

    /// Sum along `dim` (negative counts from the end).
    pub fn sum(&self, dim: isize, keepdim: bool) -> Result<Tensor<B>> {
        let d = self.shape().resolve(dim, "sum")?;
        let r = self.reduce_raw(ReduceOp::Sum, d)?;
        let in_shape = self.shape().clone();
        let kept = r.shape().clone();
        let t = Tensor::record_like(&r, r.storage().clone(), r.dtype(), "sum", &[self], move |g| {
            Ok(vec![Some(g.reshape(kept.clone())?.expand(in_shape.clone())?)])
        })
        .with_meta(crate::OpMeta::Dim(d));
        Self::squeeze_if(t, d, keepdim)
    }

    /// Mean along `dim`.
    pub fn mean(&self, dim: isize, keepdim: bool) -> Result<Tensor<B>> {
        let d = self.shape().resolve(dim, "mean")?;
        let n = self.dims()[d];
        self.sum(dim, keepdim)?.scale(1.0 / n.max(1) as f64)
    }

    fn extremum(&self, dim: isize, keepdim: bool, op: ReduceOp, name: &'static str) -> Result<Tensor<B>> {
        self.expect_float(name)?;
        let d = self.shape().resolve(dim, name)?;
        if self.dims()[d] == 0 {
            return Err(Error::invalid(name, format!("cannot reduce an empty dimension of {}", self.shape())));
        }
        let x = rules::whole_along(self, &[d], false)?;
        let r = x.reduce_raw(op, d)?;
        let (xc, y) = (x.clone(), r.clone());
        let kept = r.shape().clone();
        let t = Tensor::record_like(&r, r.storage().clone(), r.dtype(), name, &[&x], move |g| {
            let x = &xc;
            // The gradient goes to the first position holding the extremum.
            let hit = x.compare(&y, CmpOp::Eq)?.cast(x.dtype())?;
            let first = hit.first_along(d)?;
            Ok(vec![Some(first.mul(&g.reshape(kept.clone())?)?)])
        });
        Self::squeeze_if(t, d, keepdim)
    }

    /// A 0/1 mask keeping only the first 1 along `dim` of a 0/1 float mask.
    fn first_along(&self, dim: usize) -> Result<Tensor<B>> {
        // cumulative count via a matmul with an upper-triangular ones matrix
        let n = self.dims()[dim];
        let moved = self.transpose(dim as isize, -1)?;
        let tri: Vec<f64> = (0..n * n).map(|i| if i / n <= i % n { 1.0 } else { 0.0 }).collect();
        let tri = Tensor::from_host(self.backend(), &crate::HostData::from_f64(&tri, self.dtype()), [n, n])?;
        let cum = moved.matmul(&tri)?;
        let first = cum.compare_scalar(1.0, CmpOp::Eq)?.cast(self.dtype())?.mul(&moved)?;
        first.transpose(dim as isize, -1)
    }

    /// Maximum along `dim`.
    pub fn max(&self, dim: isize, keepdim: bool) -> Result<Tensor<B>> {
        self.extremum(dim, keepdim, ReduceOp::Max, "max")
    }

    /// Minimum along `dim`.
    pub fn min(&self, dim: isize, keepdim: bool) -> Result<Tensor<B>> {
        self.extremum(dim, keepdim, ReduceOp::Min, "min")
    }

    /// Index of the first maximum along `dim`, as `I64` (no gradient).
    pub fn argmax(&self, dim: isize, keepdim: bool) -> Result<Tensor<B>> {
        let d = self.shape().resolve(dim, "argmax")?;
        if self.dims()[d] == 0 {
            return Err(Error::invalid("argmax", format!("empty dimension in {}", self.shape())));
        }
        let r = rules::whole_along(self, &[d], false)?.reduce_raw(ReduceOp::ArgMax, d)?;
        Self::squeeze_if(r, d, keepdim)
    }

    /// Sum of all elements, as a rank-0 tensor.
    pub fn sum_all(&self) -> Result<Tensor<B>> {
        if self.is_sharded() {
            // Sum dim by dim so that splits become partial sums instead of gathers.
            let mut t = self.clone();
            while t.rank() > 0 {
                t = t.sum(-1, false)?;
            }
            return Ok(t);
        }
        self.reshape([self.elem_count()])?.sum(0, false)
    }

    /// Mean of all elements, as a rank-0 tensor.
    pub fn mean_all(&self) -> Result<Tensor<B>> {
        let n = self.elem_count().max(1);
        self.sum_all()?.scale(1.0 / n as f64)
    }

    /// Sums broadcast dimensions away so that the result has shape `target` (the adjoint of
    /// broadcasting `target` to this tensor's shape).
    pub fn sum_to(&self, target: &Shape) -> Result<Tensor<B>> {
        if self.shape() == target {
            return Ok(self.clone());
        }
        if target.rank() > self.rank() || self.shape().broadcast(target, "sum_to")? != *self.shape() {
            return Err(Error::ShapeMismatch { op: "sum_to", lhs: self.shape().clone(), rhs: target.clone() });
        }
        let lead = self.rank() - target.rank();
        let mut t = self.clone();
        for _ in 0..lead {
            t = t.sum(0, false)?;
        }
        for (d, &size) in target.dims().iter().enumerate() {
            if size == 1 && t.dims()[d] != 1 {
                t = t.sum(d as isize, true)?;
            }
        }
        Ok(t)
    }
}

/// [`Backend::sum_squares_many`] written with tensor ops:
/// each tensor cast to the accumulation dtype (f64 where the backend has it, else f32),
/// squared and summed, the sums added in order to a zero scalar.
pub fn composite_sum_squares<B: Backend>(b: &B, xs: &[(&B::Storage, &Shape)]) -> Result<B::Storage> {
    crate::no_grad(|| {
        let acc_dt = if b.supports(DType::F64) { DType::F64 } else { DType::F32 };
        let mut acc = Tensor::zeros(b, [], acc_dt)?;
        for (x, shape) in xs {
            let t = Tensor::from_storage(b, (*x).clone(), (*shape).clone(), b.storage_dtype(x));
            acc = acc.add(&t.cast(acc_dt)?.square()?.sum_all()?)?;
        }
        Ok(acc.storage().clone())
    })
}
