//! The paged KV cache's bookkeeping: which fixed-size block of the cache holds which tokens
//! of which sequence.
//!
//! - [`KvGeometry`]: the bytes one block takes on a rank (keys and values of every layer for
//!   `block_size` tokens, the kv heads split over `mp`), and so how many blocks a memory
//!   budget holds.
//! - [`BlockPool`]: the blocks, each free, used by one or more sequences (a reference
//!   count), or cached (its tokens known, no sequence using it, reusable by a prompt that
//!   starts the same way until its block is needed for something else, oldest first).
//! - [`BlockTable`]: one sequence's blocks in order, and how many tokens it holds.
//! - [`PagedKv`]: the key and value tables themselves, written a few rows at a time in
//!   place ([`Tensor::write_rows`](redco_core::Tensor::write_rows)) and read through a
//!   block table for attention (gathered rows, then the backend's attention).
//!
//! Prefix caching: a full block is known by its tokens and by the block before it (a
//! chain, so equal tokens after different prefixes are different blocks). A new prompt
//! takes every full block of its prefix that the pool already holds and computes only the
//! rest; at least its last token is always computed (its logits start the generation).
//! Only full blocks are shared; a sequence writes only into its own last block.

mod cache;
mod pool;
mod table;

pub use cache::PagedKv;
pub use pool::{BlockPool, OutOfBlocks, PoolStats, Prompt};
pub use table::BlockTable;

/// Index of a block in the pool.
pub type BlockId = u32;

/// What one block of the KV cache holds on one rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvGeometry {
    /// Decoder layers.
    pub layers: usize,
    /// Key/value heads on this rank (the model's, divided by `mp`).
    pub kv_heads: usize,
    /// Size of one head.
    pub head_dim: usize,
    /// Bytes per element (2 for f16/bf16, 4 for f32).
    pub dtype_bytes: usize,
    /// Tokens per block.
    pub block_size: usize,
}

impl KvGeometry {
    /// Bytes one block takes: a key and a value vector per head, layer and token.
    pub fn block_bytes(&self) -> u64 {
        [2, self.layers, self.kv_heads, self.head_dim, self.dtype_bytes, self.block_size]
            .iter()
            .fold(1u64, |acc, &x| acc.saturating_mul(x as u64))
    }

    /// This geometry on one of `mp` tensor-parallel ranks: the key/value heads split
    /// evenly when `mp` divides them (as the sharding rules split attention), whole
    /// otherwise (a split the rules would not make replicates the heads).
    pub fn split(self, mp: usize) -> Self {
        let mp = mp.max(1);
        if self.kv_heads.is_multiple_of(mp) {
            KvGeometry { kv_heads: self.kv_heads / mp, ..self }
        } else {
            self
        }
    }

    /// Blocks that fit in `budget` bytes (`--kv-memory`); an error naming the numbers when
    /// not one does.
    pub fn blocks_in(&self, budget: u64) -> Result<usize, String> {
        let per = self.block_bytes();
        if per == 0 {
            return Err("a KV block of zero bytes: the model has no layers, heads or block size".into());
        }
        let n = budget / per;
        if n == 0 {
            return Err(format!(
                "a KV memory budget of {budget} bytes holds no block of {} tokens ({per} bytes each on this rank)",
                self.block_size
            ));
        }
        Ok(usize::try_from(n).unwrap_or(usize::MAX).min(BlockId::MAX as usize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_holds_whole_blocks_of_the_rank_s_heads() {
        // a LLaMA-7B layout at mp=4, f16, 16-token blocks: 2*32*8*128*2*16 bytes
        let g = KvGeometry { layers: 32, kv_heads: 8, head_dim: 128, dtype_bytes: 2, block_size: 16 };
        assert_eq!(g.block_bytes(), 2 * 32 * 8 * 128 * 2 * 16);
        assert_eq!(g.blocks_in(g.block_bytes() * 10 + 1), Ok(10));
        let e = g.blocks_in(g.block_bytes() - 1).unwrap_err();
        assert!(e.contains("holds no block") && e.contains("16 tokens"), "{e}");
        let empty = KvGeometry { layers: 0, ..g };
        assert!(empty.blocks_in(u64::MAX).is_err());
    }
}
