//! Indexing ops: `index_select` (embedding lookup), `index_add`, `gather`, `scatter_add`.

use crate::sharding::redistribute::replicate_all;
use crate::{Backend, Error, Result, Shape, Tensor};

impl<B: Backend> Tensor<B> {
    /// Entries `ids` (an integer tensor of any shape) along `dim`; the result replaces
    /// `dim` by the ids' dims. Out-of-range ids are an [`Error::IndexOutOfRange`].
    pub fn index_select(&self, ids: &Tensor<B>, dim: isize) -> Result<Tensor<B>> {
        ids.expect_int("index_select (ids)")?;
        let d = self.shape().resolve(dim, "index_select")?;
        if self.is_sharded() || ids.is_sharded() {
            return crate::sharding::embed::index_select_sharded(self, ids, d);
        }
        let n = ids.elem_count();
        let s = self.backend().index_select(self.storage(), self.shape(), d, ids.storage(), n)?;
        let flat_shape = self.shape().with_dim(d, n);
        let mut out: Vec<usize> = self.dims()[..d].to_vec();
        out.extend_from_slice(ids.dims());
        out.extend_from_slice(&self.dims()[d + 1..]);
        let (ids_c, in_shape, fs) = (ids.clone(), self.shape().clone(), flat_shape.clone());
        Ok(Tensor::from_op(self.backend(), s, Shape::new(out), self.dtype(), "index_select", &[self], move |g| {
            let zeros = Tensor::zeros(g.backend(), in_shape.clone(), g.dtype())?;
            Ok(vec![Some(zeros.index_add(&ids_c, &g.reshape(fs.clone())?, d as isize)?)])
        })
        .with_meta(crate::OpMeta::Dim(d)))
    }

    /// Returns `self` with the slices of `src` added at `ids` along `dim` (repeated ids
    /// accumulate). `src` has `self`'s shape with `dim` replaced by the number of ids.
    pub fn index_add(&self, ids: &Tensor<B>, src: &Tensor<B>, dim: isize) -> Result<Tensor<B>> {
        ids.expect_int("index_add (ids)")?;
        self.same_dtype(src, "index_add")?;
        let d = self.shape().resolve(dim, "index_add")?;
        if self.is_sharded() || ids.is_sharded() || src.is_sharded() {
            let [x, i, s] = replicate_all([self, ids, src])?;
            return x.index_add(&i, &s, dim);
        }
        let expect = self.shape().with_dim(d, ids.elem_count());
        if src.shape() != &expect {
            return Err(Error::ShapeMismatch { op: "index_add", lhs: expect, rhs: src.shape().clone() });
        }
        let s = self.backend().index_add(self.storage(), self.shape(), d, ids.storage(), src.storage())?;
        let ids_c = ids.clone();
        Ok(Tensor::from_op(
            self.backend(),
            s,
            self.shape().clone(),
            self.dtype(),
            "index_add",
            &[self, src],
            move |g| Ok(vec![Some(g.clone()), Some(g.index_select(&ids_c, d as isize)?)]),
        ))
    }

    /// `out[.., i, ..] = self[.., idx[.., i, ..], ..]` along `dim`; `idx` has the rank of
    /// `self` and the same sizes except along `dim`.
    pub fn gather(&self, idx: &Tensor<B>, dim: isize) -> Result<Tensor<B>> {
        idx.expect_int("gather (index)")?;
        let d = self.shape().resolve(dim, "gather")?;
        if self.is_sharded() || idx.is_sharded() {
            let [x, i] = replicate_all([self, idx])?;
            return x.gather(&i, dim);
        }
        check_index_shape(self.shape(), idx.shape(), d, "gather")?;
        let s = self.backend().gather(self.storage(), self.shape(), d, idx.storage(), idx.shape())?;
        let (idx_c, in_shape) = (idx.clone(), self.shape().clone());
        Ok(Tensor::from_op(self.backend(), s, idx.shape().clone(), self.dtype(), "gather", &[self], move |g| {
            let zeros = Tensor::zeros(g.backend(), in_shape.clone(), g.dtype())?;
            Ok(vec![Some(zeros.scatter_add(&idx_c, g, d as isize)?)])
        }))
    }

    /// Returns `self` with `src` (shaped like `idx`) added at the positions `gather` reads.
    pub fn scatter_add(&self, idx: &Tensor<B>, src: &Tensor<B>, dim: isize) -> Result<Tensor<B>> {
        idx.expect_int("scatter_add (index)")?;
        self.same_dtype(src, "scatter_add")?;
        let d = self.shape().resolve(dim, "scatter_add")?;
        if self.is_sharded() || idx.is_sharded() || src.is_sharded() {
            let [x, i, s] = replicate_all([self, idx, src])?;
            return x.scatter_add(&i, &s, dim);
        }
        check_index_shape(self.shape(), idx.shape(), d, "scatter_add")?;
        if src.shape() != idx.shape() {
            return Err(Error::ShapeMismatch { op: "scatter_add", lhs: idx.shape().clone(), rhs: src.shape().clone() });
        }
        let s =
            self.backend().scatter_add(self.storage(), self.shape(), d, idx.storage(), idx.shape(), src.storage())?;
        let idx_c = idx.clone();
        Ok(Tensor::from_op(
            self.backend(),
            s,
            self.shape().clone(),
            self.dtype(),
            "scatter_add",
            &[self, src],
            move |g| Ok(vec![Some(g.clone()), Some(g.gather(&idx_c, d as isize)?)]),
        ))
    }
}

fn check_index_shape(x: &Shape, idx: &Shape, d: usize, op: &'static str) -> Result<()> {
    let ok = x.rank() == idx.rank() && x.dims().iter().zip(idx.dims()).enumerate().all(|(i, (a, b))| i == d || a == b);
    if ok {
        Ok(())
    } else {
        Err(Error::ShapeMismatch { op, lhs: x.clone(), rhs: idx.clone() })
    }
}

impl<B: Backend> Tensor<B> {
    /// Writes the rows of `src` (`[rows.len(), ...]`, this tensor's row shape and dtype)
    /// over rows `rows` of this tensor (`[n, ...]`), in place where the backend can (the
    /// CPU backend, when nothing else holds this tensor's buffer): a KV cache taking a few
    /// tokens' keys and values at a time. `rows` must be distinct and in `0..n`. Not
    /// differentiable: a tensor in a gradient graph, a source that needs a gradient and a
    /// sharded tensor are refused.
    pub fn write_rows(&mut self, rows: &[usize], src: &Tensor<B>) -> Result<()> {
        let op = "write_rows";
        if self.requires_grad() || src.requires_grad() {
            return Err(Error::unsupported(op, "writing rows in place is not differentiable"));
        }
        if self.is_sharded() || src.is_sharded() {
            return Err(Error::unsupported(op, "write rows of a rank's local tensors, not sharded ones"));
        }
        if self.rank() == 0 || src.dtype() != self.dtype() {
            return Err(Error::invalid(op, format!("rows of {:?} into {:?}", src.dtype(), self.dtype())));
        }
        let n = self.dims()[0];
        let row: Shape = Shape::new(self.dims()[1..].to_vec());
        let want: Vec<usize> = std::iter::once(rows.len()).chain(row.dims().iter().copied()).collect();
        if src.dims() != want.as_slice() {
            return Err(Error::invalid(
                op,
                format!("{} rows of {} need a source of [{want:?}], got {}", rows.len(), self.shape(), src.shape()),
            ));
        }
        let mut seen = std::collections::HashSet::new();
        if let Some(&r) = rows.iter().find(|&&r| r >= n || !seen.insert(r)) {
            return Err(Error::invalid(op, format!("row {r} of {n} is out of range or written twice")));
        }
        if rows.is_empty() {
            return Ok(());
        }
        let b = self.backend().clone();
        let ids = b.upload_owned(crate::HostData::I64(rows.iter().map(|&r| r as i64).collect()))?;
        let shape = (n, row.elem_count());
        match std::sync::Arc::get_mut(&mut self.0) {
            // nobody else holds this tensor: its storage is written as it is
            Some(inner) => b.write_rows(&mut inner.storage, shape, &ids, src.storage(), rows.len()),
            None => {
                let mut s = self.storage().clone();
                b.write_rows(&mut s, shape, &ids, src.storage(), rows.len())?;
                *self = Tensor::from_storage(&b, s, self.shape().clone(), self.dtype());
                Ok(())
            }
        }
    }
}
