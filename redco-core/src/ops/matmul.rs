//! Matrix multiplication with batch dimensions and transpose flags.

use crate::backend::MatmulSpec;
use crate::sharding::rules;
use crate::{Backend, Error, Result, Shape, Tensor};

impl<B: Backend> Tensor<B> {
    /// `self @ rhs` over the last two dims, broadcasting batch dims.
    pub fn matmul(&self, rhs: &Tensor<B>) -> Result<Tensor<B>> {
        self.matmul_ext(rhs, false, false)
    }

    /// `self @ rhs^T` for `rhs` stored `[.., n, k]` (a Linear weight), without a copy.
    pub fn matmul_t(&self, rhs: &Tensor<B>) -> Result<Tensor<B>> {
        self.matmul_ext(rhs, false, true)
    }

    /// `op(self) @ op(rhs)` where `op` transposes the last two dims of an operand whose
    /// flag is set. Operands of rank 2 are shared by every batch entry of the other.
    pub fn matmul_ext(&self, rhs: &Tensor<B>, trans_a: bool, trans_b: bool) -> Result<Tensor<B>> {
        self.same_dtype(rhs, "matmul")?;
        self.expect_float("matmul")?;
        if self.rank() < 2 || rhs.rank() < 2 {
            return Err(Error::invalid(
                "matmul",
                format!("operands need rank >= 2, got {} and {}", self.shape(), rhs.shape()),
            ));
        }
        let (ra, rb) = (self.rank(), rhs.rank());
        let mk = |t: &Shape, r: usize, tr: bool| {
            if tr {
                (t.dims()[r - 1], t.dims()[r - 2])
            } else {
                (t.dims()[r - 2], t.dims()[r - 1])
            }
        };
        let (am, ak) = mk(self.shape(), ra, trans_a);
        let (bk, bn) = {
            let (x, y) = mk(rhs.shape(), rb, trans_b);
            (x, y)
        };
        if ak != bk {
            return Err(Error::MatmulInnerDim {
                lhs: self.shape().clone(),
                rhs: rhs.shape().clone(),
                lhs_k: ak,
                rhs_k: bk,
            });
        }
        let a_batch = Shape::new(self.dims()[..ra - 2].to_vec());
        let b_batch = Shape::new(rhs.dims()[..rb - 2].to_vec());
        let same_batch = rb == 2 || ra == 2 || a_batch == b_batch;
        let (a, b, batch_shape) = if same_batch {
            let bs = if rb == 2 {
                a_batch
            } else if ra == 2 {
                b_batch
            } else {
                a_batch
            };
            (self.clone(), rhs.clone(), bs)
        } else {
            let bs = a_batch.broadcast(&b_batch, "matmul (batch dims)")?;
            let (sa, sb) = if self.is_sharded() || rhs.is_sharded() {
                (self.replicate()?, rhs.replicate()?)
            } else {
                (self.clone(), rhs.clone())
            };
            let ea = sa.expand(bs.dims().iter().chain(&self.dims()[ra - 2..]).copied().collect::<Vec<_>>())?;
            let eb = sb.expand(bs.dims().iter().chain(&rhs.dims()[rb - 2..]).copied().collect::<Vec<_>>())?;
            (ea, eb, bs)
        };
        let out: Vec<usize> = batch_shape.dims().iter().copied().chain([am, bn]).collect();
        let (a, b, placed) = if a.is_sharded() || b.is_sharded() {
            rules::matmul(&a, &b, trans_a, trans_b, out.len())?
        } else {
            (a, b, crate::Placements::REPLICATED)
        };
        // local sizes
        let (la, lb) = (a.local_shape().clone(), b.local_shape().clone());
        let (lm, lk) = mk(&la, la.rank(), trans_a);
        let (_, ln) = mk(&lb, lb.rank(), trans_b);
        let (a_batched, b_batched) = (a.rank() > 2, b.rank() > 2);
        let lbatch: usize = if a_batched {
            la.dims()[..la.rank() - 2].iter().product()
        } else {
            lb.dims()[..lb.rank() - 2].iter().product()
        };
        // Fold the batch into M when B is shared and A is not transposed: one big GEMM.
        let spec = if a_batched && !b_batched && !trans_a {
            MatmulSpec { batch: 1, m: lbatch * lm, n: ln, k: lk, trans_a, trans_b, a_batched: false, b_batched: false }
        } else {
            MatmulSpec { batch: lbatch, m: lm, n: ln, k: lk, trans_a, trans_b, a_batched, b_batched }
        };
        // selective recompute keeps a matmul's output rather than running it again
        let n = spec.batch * spec.m * spec.n;
        let s = crate::recompute::kept("matmul", n, || a.backend().matmul(a.storage(), b.storage(), &spec))?;
        let lbs: Vec<usize> =
            if a_batched { la.dims()[..la.rank() - 2].to_vec() } else { lb.dims()[..lb.rank() - 2].to_vec() };
        let local: Vec<usize> = lbs.into_iter().chain([lm, ln]).collect();
        let (ca, cb) = (a.clone(), b.clone());
        let (be, dt) = (a.backend().clone(), a.dtype());
        Ok(Tensor::from_op_placed(
            &be,
            s,
            Shape::new(out),
            Shape::new(local),
            placed,
            dt,
            "matmul",
            &[&a, &b],
            move |g| {
                let ga = if trans_a { cb.matmul_ext(g, trans_b, true)? } else { g.matmul_ext(&cb, false, !trans_b)? };
                let gb = if cb.rank() == 2 && ca.rank() > 2 && !trans_a {
                    // Shared weight: fold the batch into the contraction, one GEMM.
                    let k = ca.dims()[ca.rank() - 1];
                    let n = g.dims()[g.rank() - 1];
                    let a2 = ca.reshape([ca.elem_count() / k, k])?;
                    let g2 = g.reshape([g.elem_count() / n, n])?;
                    if trans_b {
                        g2.matmul_ext(&a2, true, false)?
                    } else {
                        a2.matmul_ext(&g2, true, false)?
                    }
                } else if trans_b {
                    g.matmul_ext(&ca, true, trans_a)?
                } else {
                    ca.matmul_ext(g, !trans_a, false)?
                };
                Ok(vec![Some(ga.sum_to(ca.shape())?), Some(gb.sum_to(cb.shape())?)])
            },
        )
        .with_meta(crate::OpMeta::Matmul { trans_a, trans_b }))
    }
}
