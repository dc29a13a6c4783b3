//! One sequence's blocks ([`BlockTable`]).

use super::BlockId;

/// A sequence's blocks in order and the tokens it holds: token `i` sits in slot
/// `i % block_size` of block `blocks[i / block_size]`. Made and changed only by the
/// [`BlockPool`](super::BlockPool) that owns the blocks.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BlockTable {
    pub(super) blocks: Vec<BlockId>,
    pub(super) tokens: Vec<i64>,
    /// The chain key of the last full block that is registered for sharing (0: none yet).
    pub(super) chain: u64,
    /// Full blocks registered for sharing (a prefix of `blocks`).
    pub(super) registered: usize,
}

impl BlockTable {
    /// The block ids, in token order (what the attention reads through).
    pub fn blocks(&self) -> &[BlockId] {
        &self.blocks
    }

    /// Tokens held.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// True when no token is held.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The tokens held, in order.
    pub fn tokens(&self) -> &[i64] {
        &self.tokens
    }

    /// The cache slot of token `i` (`block * block_size + offset`), where its key and value
    /// are written; `None` past the end.
    pub fn slot(&self, i: usize, block_size: usize) -> Option<usize> {
        (i < self.tokens.len()).then(|| self.blocks[i / block_size] as usize * block_size + i % block_size)
    }
}
