//! The grouped matmul of a mixture of experts: rows sorted by group (expert), each group's
//! rows multiplied by that group's own matrix, in one call over every group.
//!
//! `x [T, k]` holds the tokens routed to expert 0 first, then expert 1's, and so on
//! (`counts[e]` rows each, `sum(counts) = T`; a group may be empty). `w [E, n, k]` (the
//! Linear layout, `trans_w`) or `w [E, k, n]` holds one matrix per expert. The result
//! `[T, n]` has row `t` of group `e` equal to `x[t] @ op(w[e])`.

use crate::backend::{GroupedSpec, MatmulSpec};
use crate::{Backend, Error, HostData, Result, Shape, Tensor};

/// [`Backend::grouped_matmul`] written with the primitives: per non-empty group, its rows
/// and its matrix cut out (`narrow`), one GEMM, and the pieces concatenated.
pub fn composite_grouped_matmul<B: Backend>(
    b: &B,
    x: &B::Storage,
    w: &B::Storage,
    spec: &GroupedSpec,
) -> Result<B::Storage> {
    let GroupedSpec { ref counts, k, n, trans_w } = *spec;
    let rows: usize = counts.iter().sum();
    let xs = Shape::new([rows, k]);
    let wd = if trans_w { [counts.len(), n, k] } else { [counts.len(), k, n] };
    let ws = Shape::new(wd);
    let mut pieces: Vec<(B::Storage, Shape)> = Vec::new();
    let mut start = 0;
    for (e, &c) in counts.iter().enumerate() {
        if c == 0 {
            continue;
        }
        let xe = b.narrow(x, &xs, 0, start, c)?;
        let we = b.narrow(w, &ws, 0, e, 1)?;
        let spec =
            MatmulSpec { batch: 1, m: c, n, k, trans_a: false, trans_b: trans_w, a_batched: false, b_batched: false };
        pieces.push((b.matmul(&xe, &we, &spec)?, Shape::new([c, n])));
        start += c;
    }
    match pieces.len() {
        0 => b.upload(&HostData::from_f64(&[], b.storage_dtype(x))),
        1 => Ok(pieces.pop().map(|p| p.0).expect("one piece")),
        _ => b.cat(&pieces.iter().map(|(s, sh)| (s, sh)).collect::<Vec<_>>(), 0),
    }
}

impl<B: Backend> Tensor<B> {
    /// The grouped matmul of a mixture of experts (see the module docs): `self [T, k]`,
    /// rows sorted by group with `counts[e]` rows in group `e`, times `w [E, n, k]`
    /// (`trans_w`, the Linear layout) or `w [E, k, n]`; returns `[T, n]`. Differentiable in
    /// both operands. Sharded operands are not supported yet (an error says so).
    pub fn grouped_matmul(&self, w: &Tensor<B>, counts: &[usize], trans_w: bool) -> Result<Tensor<B>> {
        const OP: &str = "grouped_matmul";
        self.same_dtype(w, OP)?;
        self.expect_float(OP)?;
        if self.rank() != 2 || w.rank() != 3 {
            return Err(Error::invalid(
                OP,
                format!("needs x [tokens, k] and w [experts, ., .], got {} and {}", self.shape(), w.shape()),
            ));
        }
        let (t, k) = (self.dims()[0], self.dims()[1]);
        let (e, wk, n) =
            if trans_w { (w.dims()[0], w.dims()[2], w.dims()[1]) } else { (w.dims()[0], w.dims()[1], w.dims()[2]) };
        if counts.len() != e {
            return Err(Error::invalid(OP, format!("{} group counts for {e} experts", counts.len())));
        }
        let total: usize = counts.iter().sum();
        if total != t {
            return Err(Error::invalid(OP, format!("the group counts add up to {total}, but x has {t} rows")));
        }
        if wk != k {
            return Err(Error::MatmulInnerDim {
                lhs: self.shape().clone(),
                rhs: w.shape().clone(),
                lhs_k: k,
                rhs_k: wk,
            });
        }
        if self.is_sharded() || w.is_sharded() {
            return Err(Error::unsupported(
                OP,
                "sharded operands (expert or tensor parallelism) are not supported yet",
            ));
        }
        let spec = GroupedSpec { counts: counts.to_vec(), k, n, trans_w };
        let s = self.backend().grouped_matmul(self.storage(), w.storage(), &spec)?;
        let (cx, cw) = (self.clone(), w.clone());
        let counts = counts.to_vec();
        Ok(Tensor::from_op(self.backend(), s, Shape::new([t, n]), self.dtype(), OP, &[self, w], move |g| {
            // dx: each group's rows times its matrix the other way round
            let gx = g.grouped_matmul(&cw, &counts, !trans_w)?;
            // dw: per group, the outer product of its output gradient and input rows
            let mut parts = Vec::with_capacity(counts.len());
            let mut start = 0;
            for &c in &counts {
                let part = if c == 0 {
                    let d = if trans_w { [n, k] } else { [k, n] };
                    Tensor::zeros(cx.backend(), d, cx.dtype())?
                } else {
                    let (xe, ge) = (cx.narrow(0, start, c)?, g.narrow(0, start, c)?);
                    if trans_w {
                        ge.matmul_ext(&xe, true, false)?
                    } else {
                        xe.matmul_ext(&ge, true, false)?
                    }
                };
                parts.push(part.unsqueeze(0)?);
                start += c;
            }
            let gw = Tensor::cat(&parts.iter().collect::<Vec<_>>(), 0)?;
            Ok(vec![Some(gx), Some(gw)])
        })
        .with_meta(crate::OpMeta::Matmul { trans_a: false, trans_b: trans_w }))
    }
}

/// The rows of each group when `experts[i]` is token-slot `i`'s expert (of `num`): the
/// counts per expert and the slots in grouped order (stable: a group keeps the slots'
/// order). What a router hands [`Tensor::grouped_matmul`].
pub fn group_by_expert(experts: &[usize], num: usize) -> Result<(Vec<usize>, Vec<usize>)> {
    let mut counts = vec![0usize; num];
    for &e in experts {
        *counts.get_mut(e).ok_or_else(|| Error::invalid("group_by_expert", format!("expert {e} of {num}")))? += 1;
    }
    let mut next: Vec<usize> = counts
        .iter()
        .scan(0, |acc, &c| {
            let s = *acc;
            *acc += c;
            Some(s)
        })
        .collect();
    let mut order = vec![0usize; experts.len()];
    for (slot, &e) in experts.iter().enumerate() {
        order[next[e]] = slot;
        next[e] += 1;
    }
    Ok((counts, order))
}

#[cfg(test)]
mod tests {
    use super::group_by_expert;

    #[test]
    fn slots_are_grouped_by_expert_in_order_with_empty_groups_counted() {
        let (counts, order) = group_by_expert(&[2, 0, 2, 3, 0, 2], 4).unwrap();
        assert_eq!(counts, [2, 0, 3, 1]);
        assert_eq!(order, [1, 4, 0, 2, 5, 3]);
        assert_eq!(group_by_expert(&[], 3).unwrap(), (vec![0, 0, 0], vec![]));
        assert!(group_by_expert(&[0, 3], 3).unwrap_err().to_string().contains("expert 3 of 3"));
    }
}
