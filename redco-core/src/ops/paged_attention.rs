//! Attention of a ragged batch over paged keys and values ([`Tensor::paged_attention`]): a
//! serving engine's step, where the new tokens of several sequences run as one batch and
//! each sequence's keys and values sit in the rows of a shared pool, in the order its block
//! table gives. One op per layer instead of one gather and one attention per sequence: a
//! backend with a fused kernel ([`Backend::paged_attention`]; the CPU backend's reads the
//! pool's rows in place) runs it whole, the others run the composite (each sequence's rows
//! gathered, then [`Tensor::attention`]). Inference only: not differentiable.

use crate::{Backend, Error, Result, Tensor};

/// One sequence's part of a ragged batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PagedSegment {
    /// Its first query among the batch's tokens.
    pub q_start: usize,
    /// Its queries (its newest tokens).
    pub q_len: usize,
    /// The pool rows of its keys and values, positions `0..slots.len()` in order; its
    /// queries are the last `q_len` of those positions (causal).
    pub slots: Vec<usize>,
}

/// The sizes of a paged attention.
#[derive(Debug, Clone, PartialEq)]
pub struct PagedSpec<'a> {
    /// Query heads.
    pub q_heads: usize,
    /// Key/value heads (dividing `q_heads`).
    pub kv_heads: usize,
    /// Head dimension.
    pub head_dim: usize,
    /// Tokens in the batch (queries per head).
    pub tokens: usize,
    /// Rows in the pools.
    pub rows: usize,
    /// Score scale.
    pub scale: f64,
    /// The sequences, in batch order.
    pub segments: &'a [PagedSegment],
}

impl<B: Backend> Tensor<B> {
    /// Causal attention of the queries `self` (`[1, q_heads, tokens, head_dim]`, a ragged
    /// batch) over the key and value pools `k`, `v` (`[rows, kv_heads, head_dim]`), each
    /// segment's queries over its own rows (see [`PagedSpec`]). Returns
    /// `[1, q_heads, tokens, head_dim]` in the queries' dtype. The pools may be held in
    /// another float dtype than the queries (a bf16 cache under f32 weights): their values
    /// are widened where they are read.
    pub fn paged_attention(
        &self,
        k: &Tensor<B>,
        v: &Tensor<B>,
        segments: &[PagedSegment],
        scale: f64,
    ) -> Result<Tensor<B>> {
        let op = "paged_attention";
        if self.requires_grad() || self.is_sharded() || k.is_sharded() || v.is_sharded() {
            return Err(Error::unsupported(op, "paged attention is for inference on a rank's local tensors"));
        }
        if self.rank() != 4 || self.dims()[0] != 1 || k.rank() != 3 || k.shape() != v.shape() {
            return Err(Error::invalid(
                op,
                format!(
                    "queries [1, heads, tokens, head_dim] and pools [rows, kv_heads, head_dim], got {}, {} and {}",
                    self.shape(),
                    k.shape(),
                    v.shape()
                ),
            ));
        }
        let (q_heads, tokens, head_dim) = (self.dims()[1], self.dims()[2], self.dims()[3]);
        let (rows, kv_heads) = (k.dims()[0], k.dims()[1]);
        if k.dims()[2] != head_dim || kv_heads == 0 || q_heads % kv_heads != 0 {
            return Err(Error::invalid(op, format!("{q_heads} query heads of {head_dim} over pools {}", k.shape())));
        }
        if k.dtype() != v.dtype() || !self.dtype().is_float() || !k.dtype().is_float() {
            return Err(Error::invalid(
                op,
                format!(
                    "float queries over key and value pools of one float dtype, got {:?} over {:?} and {:?}",
                    self.dtype(),
                    k.dtype(),
                    v.dtype()
                ),
            ));
        }
        let mut at = 0;
        for s in segments {
            if s.q_start != at || s.q_len == 0 || s.q_len > s.slots.len() || s.slots.iter().any(|&r| r >= rows) {
                return Err(Error::invalid(
                    op,
                    format!("a segment of {} queries at {} over {} rows of {rows}: segments must tile the batch, each over rows of the pool", s.q_len, s.q_start, s.slots.len()),
                ));
            }
            at += s.q_len;
        }
        if at != tokens {
            return Err(Error::invalid(op, format!("the segments cover {at} of the batch's {tokens} tokens")));
        }
        let spec = PagedSpec { q_heads, kv_heads, head_dim, tokens, rows, scale, segments };
        if let Some(s) = self.backend().paged_attention(self.storage(), k.storage(), v.storage(), &spec)? {
            return Ok(Tensor::from_storage(self.backend(), s, self.shape().clone(), self.dtype()));
        }
        // the composite: each segment's rows gathered, then the backend's attention
        let mut outs = Vec::with_capacity(spec.segments.len());
        for s in spec.segments {
            let ids: Vec<i64> = s.slots.iter().map(|&r| r as i64).collect();
            let ids = Tensor::from_vec(self.backend(), ids, [s.slots.len()])?;
            // pools held narrower than the queries (a 16-bit cache under f32 weights) are
            // widened as they are gathered
            let seq = |p: &Tensor<B>| {
                let rows = p.index_select(&ids, 0)?;
                let rows = if rows.dtype() == self.dtype() { rows } else { rows.cast(self.dtype())? };
                rows.reshape([1, s.slots.len(), kv_heads, head_dim])?.transpose(1, 2)
            };
            let q = self.narrow(2, s.q_start, s.q_len)?;
            outs.push(q.attention(&seq(k)?, &seq(v)?, None, true, scale)?);
        }
        Tensor::cat(&outs.iter().collect::<Vec<_>>(), 2)
    }
}
