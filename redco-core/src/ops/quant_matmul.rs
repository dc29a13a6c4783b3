//! Products with a block-quantized matrix ([`crate::quant`]): `x [.., k] @ W^T` with `W
//! [n, k]` stored as `U8 [n, row_bytes]`, the blocks read where they lie.
//!
//! Under tensor parallelism the two rules still choose the dimension: a column-parallel
//! weight is split over `mp` by output rows (any block format), a row-parallel one by its
//! input columns, which for blocks means whole blocks of every row (the split is checked
//! when the weight is read: `k / mp` must be whole blocks).

use crate::backend::MatmulSpec;
use crate::quant::{blocks, QuantFormat};
use crate::{Backend, DType, Error, HostData, MeshAxis, PartialOp, Placement, Result, Shape, Tensor};

/// A product `x [m, k] @ W^T`, `W [n, k]` in blocks of `format` (`U8 [n, k / block_values
/// * block_bytes]`), into `[m, n]` of `x`'s dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantMatmulSpec {
    /// Rows of `x`.
    pub m: usize,
    /// Rows of `W` (columns of the result).
    pub n: usize,
    /// The contracted dimension (values per row of `W`).
    pub k: usize,
    /// The blocks' format.
    pub format: QuantFormat,
}

/// The whole float matrix `[n, k]` (f32) of the blocks `w`, on `b`: the default's first
/// step, and the reference the kernels are checked against.
pub fn dequantize_storage<B: Backend>(
    b: &B,
    w: &B::Storage,
    n: usize,
    k: usize,
    format: QuantFormat,
) -> Result<B::Storage> {
    let bytes = match b.download(w)? {
        HostData::U8(v) => v,
        other => {
            return Err(Error::invalid("dequantize", format!("blocks must be U8 storage, got {:?}", other.dtype())))
        }
    };
    if bytes.len() != n * format.row_bytes(k)? {
        return Err(Error::invalid(
            "dequantize",
            format!("{} bytes for {n} rows of {k} {} values", bytes.len(), format.name()),
        ));
    }
    b.upload_owned(HostData::F32(blocks::dequantize(format, &bytes, n * k)?))
}

/// [`Backend::quant_matmul`] written with the primitives: the blocks dequantized to f32 on
/// the host and uploaded, then one GEMM in f32. Correct on every backend, and as slow as
/// making the matrix whole each call; a backend overrides it with a kernel that reads the
/// blocks in place.
pub fn composite_quant_matmul<B: Backend>(
    b: &B,
    x: &B::Storage,
    w: &B::Storage,
    spec: &QuantMatmulSpec,
) -> Result<B::Storage> {
    let QuantMatmulSpec { m, n, k, format } = *spec;
    let wf = dequantize_storage(b, w, n, k, format)?;
    let dt = b.storage_dtype(x);
    let xf = if dt == DType::F32 { x.clone() } else { b.cast(x, m * k, DType::F32)? };
    let mm = MatmulSpec { batch: 1, m, n, k, trans_a: false, trans_b: true, a_batched: false, b_batched: false };
    let y = b.matmul(&xf, &wf, &mm)?;
    if dt == DType::F32 {
        Ok(y)
    } else {
        b.cast(&y, m * n, dt)
    }
}

impl<B: Backend> Tensor<B> {
    /// `self [.., k] @ W^T` where `w` holds `W [n, k]` as blocks of `format` (`U8 [n,
    /// row_bytes]`): the result `[.., n]` in `self`'s dtype. Differentiable in `self`
    /// (the blocks are constants). Under `mp`, `w` split by rows gives a result split on
    /// its last dim; split by whole blocks along `k` (with `self` split on its last dim),
    /// partial sums.
    pub fn matmul_quant(&self, w: &Tensor<B>, format: QuantFormat) -> Result<Tensor<B>> {
        const OP: &str = "matmul_quant";
        self.expect_float(OP)?;
        if w.dtype() != DType::U8 || w.rank() != 2 || self.rank() == 0 {
            return Err(Error::invalid(
                OP,
                format!(
                    "needs x [.., k] and blocks U8 [n, bytes], got {} and {:?} {}",
                    self.shape(),
                    w.dtype(),
                    w.shape()
                ),
            ));
        }
        let (n, k) = (w.dims()[0], format.row_values(w.dims()[1])?);
        let last = self.rank() - 1;
        if self.dims()[last] != k {
            return Err(Error::MatmulInnerDim {
                lhs: self.shape().clone(),
                rhs: Shape::new([n, k]),
                lhs_k: self.dims()[last],
                rhs_k: k,
            });
        }
        if !matches!(w.placements().get(MeshAxis::Dp), Placement::Replicate) {
            return Err(Error::unsupported(OP, "blocks split over dp"));
        }
        // the rules' split of the weight over mp decides how x must lie along k
        let x_now = self.placements().get(MeshAxis::Mp);
        let rows_split = matches!(x_now, Placement::Shard(d) if d < last);
        let (x_mp, out_mp) = match w.placements().get(MeshAxis::Mp) {
            // a whole weight: x's rows may stay split over mp, and the result's with them
            Placement::Replicate if rows_split => (x_now, x_now),
            Placement::Replicate => (Placement::Replicate, Placement::Replicate),
            Placement::Shard(0) => (Placement::Replicate, Placement::Shard(last)),
            Placement::Shard(1) => (Placement::Shard(last), Placement::Partial(PartialOp::Sum)),
            other => return Err(Error::unsupported(OP, format!("blocks placed {other:?} over mp"))),
        };
        let x =
            if x_now == x_mp { self.clone() } else { self.redistribute(self.placements().with(MeshAxis::Mp, x_mp))? };
        if matches!(x.placements().get(MeshAxis::Dp), Placement::Shard(d) if d == last)
            || matches!(x.placements().get(MeshAxis::Dp), Placement::Partial(_))
            || matches!(x.placements().get(MeshAxis::Mp), Placement::Partial(_))
        {
            return Err(Error::unsupported(OP, format!("x placed {:?}", x.placements())));
        }
        let (wl, xl) = (w.local_shape().dims(), x.local_shape().dims());
        let (nl, kl) = (wl[0], format.row_values(wl[1])?);
        if xl[last] != kl {
            return Err(Error::invalid(OP, format!("local x {:?} against local blocks of {kl} values", xl)));
        }
        let m: usize = xl[..last].iter().product();
        let spec = QuantMatmulSpec { m, n: nl, k: kl, format };
        let s = self.backend().quant_matmul(x.storage(), w.storage(), &spec)?;
        let mut global = self.dims().to_vec();
        global[last] = n;
        let mut local = xl.to_vec();
        local[last] = nl;
        let placed = x.placements().with(MeshAxis::Mp, out_mp);
        let wc = w.clone();
        Ok(Tensor::from_op_placed(
            self.backend(),
            s,
            Shape::new(global),
            Shape::new(local),
            placed,
            self.dtype(),
            OP,
            &[&x],
            move |g| {
                if g.is_sharded() || wc.is_sharded() {
                    return Err(Error::unsupported(OP, "the gradient through quantized blocks under a mesh"));
                }
                let wf = wc.dequantize_blocks(format)?.cast(g.dtype())?;
                Ok(vec![Some(g.matmul(&wf)?)])
            },
        ))
    }

    /// The float matrix `[n, k]` (f32) of blocks `self` (`U8 [n, row_bytes]` of `format`);
    /// not differentiable.
    pub fn dequantize_blocks(&self, format: QuantFormat) -> Result<Tensor<B>> {
        if self.dtype() != DType::U8 || self.rank() != 2 || self.is_sharded() {
            return Err(Error::invalid(
                "dequantize_blocks",
                format!("needs whole blocks U8 [n, bytes], got {:?} {}", self.dtype(), self.shape()),
            ));
        }
        let (n, k) = (self.dims()[0], format.row_values(self.dims()[1])?);
        let s = dequantize_storage(self.backend(), self.storage(), n, k, format)?;
        Ok(Tensor::from_storage(self.backend(), s, [n, k], DType::F32))
    }
}
