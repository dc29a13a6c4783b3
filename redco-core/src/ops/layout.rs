//! Layout ops: reshape (free), permute/transpose, narrow, cat, expand, (un)squeeze.
//! Every op but reshape copies: storage stays contiguous.

use crate::sharding::rules;
use crate::{Backend, Error, Placement, Result, Shape, Tensor};

impl<B: Backend> Tensor<B> {
    /// The same elements under a new shape with the same element count (no copy).
    pub fn reshape(&self, shape: impl Into<Shape>) -> Result<Tensor<B>> {
        let shape = shape.into();
        if shape.elem_count() != self.elem_count() {
            return Err(Error::ShapeMismatch { op: "reshape", lhs: self.shape().clone(), rhs: shape });
        }
        if &shape == self.shape() {
            return Ok(self.clone());
        }
        let (x, placed) = rules::reshape(self, &shape, crate::sharding::axis_sizes::<B>())?;
        let local = crate::placement::local_shape(&shape, placed, crate::sharding::axis_sizes::<B>())?;
        let orig = x.shape().clone();
        let (be, s, dt) = (x.backend().clone(), x.storage().clone(), x.dtype());
        Ok(Tensor::from_op_placed(&be, s, shape, local, placed, dt, "reshape", &[&x], move |g| {
            Ok(vec![Some(g.reshape(orig.clone())?)])
        }))
    }

    /// Permutes dimensions: `out.dims[i] = self.dims[perm[i]]` (a copy).
    pub fn permute(&self, perm: &[usize]) -> Result<Tensor<B>> {
        let r = self.rank();
        let mut seen = vec![false; r];
        if perm.len() != r || perm.iter().any(|&p| p >= r || std::mem::replace(&mut seen[p], true)) {
            return Err(Error::invalid(
                "permute",
                format!("{perm:?} is not a permutation of the dims of {}", self.shape()),
            ));
        }
        if perm.iter().enumerate().all(|(i, &p)| i == p) {
            return Ok(self.clone());
        }
        let out = Shape::new(perm.iter().map(|&p| self.dims()[p]).collect::<Vec<_>>());
        let local = Shape::new(perm.iter().map(|&p| self.local_shape().dims()[p]).collect::<Vec<_>>());
        let s = self.backend().permute(self.storage(), self.local_shape(), perm)?;
        let mut inv = vec![0; r];
        for (i, &p) in perm.iter().enumerate() {
            inv[p] = i;
        }
        let mut placed = self.placements();
        for p in placed.0.iter_mut() {
            if let Placement::Shard(d) = *p {
                *p = Placement::Shard(inv[d]);
            }
        }
        Ok(Tensor::from_op_placed(self.backend(), s, out, local, placed, self.dtype(), "permute", &[self], move |g| {
            Ok(vec![Some(g.permute(&inv)?)])
        })
        .with_meta(crate::OpMeta::Permute(perm.to_vec())))
    }

    /// Swaps two dimensions (a copy).
    pub fn transpose(&self, d1: isize, d2: isize) -> Result<Tensor<B>> {
        let a = self.shape().resolve(d1, "transpose")?;
        let b = self.shape().resolve(d2, "transpose")?;
        let mut perm: Vec<usize> = (0..self.rank()).collect();
        perm.swap(a, b);
        self.permute(&perm)
    }

    /// The slice `start..start + len` of dimension `dim` (a copy).
    pub fn narrow(&self, dim: isize, start: usize, len: usize) -> Result<Tensor<B>> {
        let d = self.shape().resolve(dim, "narrow")?;
        let size = self.dims()[d];
        if start + len > size {
            return Err(Error::invalid(
                "narrow",
                format!("range {start}..{} exceeds dim {d} of {}", start + len, self.shape()),
            ));
        }
        if start == 0 && len == size {
            return Ok(self.clone());
        }
        let x = rules::whole_along(self, &[d], true)?;
        let s = x.backend().narrow(x.storage(), x.local_shape(), d, start, len)?;
        let in_shape = x.shape().clone();
        let (out, local) = (x.shape().with_dim(d, len), x.local_shape().with_dim(d, len));
        let (be, dt, placed) = (x.backend().clone(), x.dtype(), x.placements());
        Ok(Tensor::from_op_placed(&be, s, out, local, placed, dt, "narrow", &[&x], move |g| {
            // zeros laid out as the gradient, so a sharded gradient stays sharded (no gather)
            let zeros = |n: usize| -> Result<Tensor<B>> {
                let local = g.local_shape().with_dim(d, n);
                let s = g.backend().full(local.elem_count(), 0.0, g.dtype())?;
                Ok(Tensor::from_local(g.backend(), s, in_shape.with_dim(d, n), local, g.placements(), g.dtype()))
            };
            let mut parts = Vec::new();
            if start > 0 {
                parts.push(zeros(start)?);
            }
            parts.push(g.clone());
            if start + len < size {
                parts.push(zeros(size - start - len)?);
            }
            Ok(vec![Some(Tensor::cat(&parts.iter().collect::<Vec<_>>(), d as isize)?)])
        })
        .with_meta(crate::OpMeta::Dim(d)))
    }

    /// Concatenates tensors along `dim`; their shapes agree elsewhere.
    pub fn cat(xs: &[&Tensor<B>], dim: isize) -> Result<Tensor<B>> {
        let first = xs.first().ok_or_else(|| Error::invalid("cat", "no tensors to concatenate"))?;
        let d = first.shape().resolve(dim, "cat")?;
        let mut total = 0;
        for x in xs {
            first.same_dtype(x, "cat")?;
            let ok = x.rank() == first.rank()
                && x.dims().iter().zip(first.dims()).enumerate().all(|(i, (a, b))| i == d || a == b);
            if !ok {
                return Err(Error::ShapeMismatch { op: "cat", lhs: first.shape().clone(), rhs: x.shape().clone() });
            }
            total += x.dims()[d];
        }
        if xs.len() == 1 {
            return Ok((*first).clone());
        }
        // Parts must share one layout that keeps `d` whole (else they are replicated).
        let p0 = first.placements();
        let uniform = xs.iter().all(|x| x.placements() == p0)
            && p0.0.iter().all(|p| !matches!(p, Placement::Shard(sd) if *sd == d));
        let owned: Vec<Tensor<B>> = if uniform {
            xs.iter().map(|x| (*x).clone()).collect()
        } else {
            xs.iter().map(|x| x.replicate()).collect::<Result<_>>()?
        };
        let xs: Vec<&Tensor<B>> = owned.iter().collect();
        let first = xs[0];
        let parts: Vec<_> = xs.iter().map(|x| (x.storage(), x.local_shape())).collect();
        let s = first.backend().cat(&parts, d)?;
        let ltotal: usize = xs.iter().map(|x| x.local_shape().dims()[d]).sum();
        let local = first.local_shape().with_dim(d, ltotal);
        let sizes: Vec<usize> = xs.iter().map(|x| x.dims()[d]).collect();
        let (be, dt, placed) = (first.backend().clone(), first.dtype(), first.placements());
        Ok(Tensor::from_op_placed(&be, s, first.shape().with_dim(d, total), local, placed, dt, "cat", &xs, move |g| {
            let mut off = 0;
            let mut out = Vec::new();
            for &n in &sizes {
                out.push(Some(g.narrow(d as isize, off, n)?));
                off += n;
            }
            Ok(out)
        })
        .with_meta(crate::OpMeta::Dim(d)))
    }

    /// Broadcasts to `shape` (a copy; NumPy rules).
    pub fn expand(&self, shape: impl Into<Shape>) -> Result<Tensor<B>> {
        let shape = shape.into();
        if &shape == self.shape() {
            return Ok(self.clone());
        }
        if self.shape().broadcast(&shape, "expand")? != shape {
            return Err(Error::ShapeMismatch { op: "expand", lhs: self.shape().clone(), rhs: shape });
        }
        let off = shape.rank() - self.rank();
        let mut placed = self.placements();
        for p in placed.0.iter_mut() {
            if let Placement::Shard(d) = *p {
                *p = Placement::Shard(d + off);
            }
        }
        let local = crate::placement::local_shape(&shape, placed, crate::sharding::axis_sizes::<B>())?;
        let s = self.backend().expand(self.storage(), self.local_shape(), &local)?;
        let orig = self.shape().clone();
        Ok(Tensor::from_op_placed(self.backend(), s, shape, local, placed, self.dtype(), "expand", &[self], move |g| {
            Ok(vec![Some(g.sum_to(&orig)?)])
        }))
    }

    /// Inserts a dimension of size 1 at `dim` (which may equal the rank).
    pub fn unsqueeze(&self, dim: isize) -> Result<Tensor<B>> {
        let r = self.rank() as isize;
        let d = if dim < 0 { dim + r + 1 } else { dim };
        if d < 0 || d > r {
            return Err(Error::DimOutOfRange { op: "unsqueeze", dim, shape: self.shape().clone() });
        }
        let mut dims = self.dims().to_vec();
        dims.insert(d as usize, 1);
        self.reshape(dims)
    }

    /// Removes dimension `dim`, which must have size 1.
    pub fn squeeze(&self, dim: isize) -> Result<Tensor<B>> {
        let d = self.shape().resolve(dim, "squeeze")?;
        if self.dims()[d] != 1 {
            return Err(Error::invalid("squeeze", format!("dim {d} of {} is not 1", self.shape())));
        }
        let mut dims = self.dims().to_vec();
        dims.remove(d);
        self.reshape(dims)
    }
}
