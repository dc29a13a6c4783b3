//! The block pool ([`BlockPool`]): free, used and cached blocks, and the prefix index.

use super::{BlockId, BlockTable};
use std::collections::{BTreeMap, HashMap};
use std::fmt;

/// Not enough blocks: what was needed and what the pool could give (free and cached).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfBlocks {
    /// Blocks the request needed.
    pub need: usize,
    /// Blocks the pool could give.
    pub available: usize,
}

impl fmt::Display for OutOfBlocks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the KV cache needs {} more blocks and has {} to give", self.need, self.available)
    }
}

impl std::error::Error for OutOfBlocks {}

/// A prompt's blocks: its table, and how many of its tokens already have their keys and
/// values in shared blocks (a multiple of the block size, at most the prompt's length less
/// one: those need no prefill).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    /// The sequence's blocks (the prompt's tokens in them).
    pub table: BlockTable,
    /// Leading tokens whose keys and values the pool already holds.
    pub cached_tokens: usize,
}

/// Counts for `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolStats {
    /// Blocks in the pool.
    pub total: usize,
    /// Blocks used by at least one sequence.
    pub used: usize,
    /// Blocks no sequence uses that hold a known prefix (reusable until evicted).
    pub cached: usize,
    /// Blocks holding nothing.
    pub free: usize,
    /// Prompt tokens asked for.
    pub prompt_tokens: u64,
    /// Prompt tokens found in the cache (their prefill skipped).
    pub prefix_hit_tokens: u64,
    /// Cached blocks given to other tokens.
    pub evictions: u64,
}

/// The key of a registered block's content: the key of the block before it (0 at the
/// start of a sequence) and its tokens.
type ContentKey = (u64, Vec<i64>);

/// A pool of `total` blocks of `block_size` tokens.
///
/// Each block is free, used (a reference count of the sequences holding it) or cached (a
/// full block whose content is registered, used by none). Registered blocks are found by
/// their content: the chain key of the block before them and their tokens, so a block
/// after a different prefix is never taken for another. A registered block gets a key no
/// other content ever gets again; when it is evicted, the blocks registered after it can no
/// longer be reached (nothing produces its key again) and age out.
#[derive(Debug)]
pub struct BlockPool {
    block_size: usize,
    refs: Vec<u32>,
    /// A registered block's content and chain key.
    content: Vec<Option<(ContentKey, u64)>>,
    free: Vec<BlockId>,
    /// Cached blocks by the tick they were released at: the oldest is evicted first.
    cached: BTreeMap<u64, BlockId>,
    /// The tick of each cached block.
    released_at: Vec<u64>,
    index: HashMap<ContentKey, (BlockId, u64)>,
    next_key: u64,
    tick: u64,
    stats: PoolStats,
}

impl BlockPool {
    /// `total` free blocks of `block_size` tokens.
    ///
    /// # Panics
    /// Never for a `total` from [`KvGeometry::blocks_in`](super::KvGeometry::blocks_in); a
    /// zero block size is made one.
    pub fn new(total: usize, block_size: usize) -> Self {
        let total = total.min(BlockId::MAX as usize);
        BlockPool {
            block_size: block_size.max(1),
            refs: vec![0; total],
            content: vec![None; total],
            // popped from the end: block 0 first
            free: (0..total as BlockId).rev().collect(),
            cached: BTreeMap::new(),
            released_at: vec![0; total],
            index: HashMap::new(),
            next_key: 1,
            tick: 0,
            stats: PoolStats { total, free: total, ..Default::default() },
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Blocks a new request could get now (free and cached).
    pub fn available(&self) -> usize {
        self.free.len() + self.cached.len()
    }

    /// The counts.
    pub fn stats(&self) -> PoolStats {
        let used = self.refs.iter().filter(|&&r| r > 0).count();
        PoolStats { used, cached: self.cached.len(), free: self.free.len(), ..self.stats }
    }

    /// The blocks for a new sequence holding `tokens` (its prompt): every leading full
    /// block the pool already holds is shared (counted as a prefix hit), the rest are
    /// fresh. Nothing changes when the pool cannot give enough blocks.
    pub fn allocate_prompt(&mut self, tokens: &[i64]) -> Result<Prompt, OutOfBlocks> {
        self.allocate(tokens, true)
    }

    /// [`BlockPool::allocate_prompt`] with no cached prefix taken: every token is computed
    /// (a prompt whose every position's logits are wanted). Its full blocks are still
    /// registered for sharing as they are computed.
    pub fn allocate_prompt_uncached(&mut self, tokens: &[i64]) -> Result<Prompt, OutOfBlocks> {
        self.allocate(tokens, false)
    }

    fn allocate(&mut self, tokens: &[i64], reuse: bool) -> Result<Prompt, OutOfBlocks> {
        let bs = self.block_size;
        let mut hits: Vec<(BlockId, u64)> = Vec::new();
        let mut parent = 0;
        for chunk in tokens.chunks_exact(bs).take_while(|_| reuse) {
            match self.index.get(&(parent, chunk.to_vec())) {
                Some(&(b, key)) => {
                    hits.push((b, key));
                    parent = key;
                }
                None => break,
            }
        }
        // the last token is always computed: a prompt found whole gives back its last block
        if hits.len() * bs == tokens.len() {
            hits.pop();
        }
        let need = tokens.len().div_ceil(bs) - hits.len();
        // cached hits are taken out of the evictable blocks first
        let cached_hits = hits.iter().filter(|(b, _)| self.refs[*b as usize] == 0).count();
        let available = self.available() - cached_hits;
        if need > available {
            return Err(OutOfBlocks { need, available });
        }
        let mut table = BlockTable::default();
        for &(b, key) in &hits {
            self.take(b);
            table.blocks.push(b);
            table.chain = key;
        }
        table.registered = hits.len();
        for _ in 0..need {
            let b = self.fresh().expect("checked above: enough blocks are free or cached");
            table.blocks.push(b);
        }
        table.tokens = tokens.to_vec();
        let cached_tokens = hits.len() * bs;
        self.stats.prompt_tokens += tokens.len() as u64;
        self.stats.prefix_hit_tokens += cached_tokens as u64;
        Ok(Prompt { table, cached_tokens })
    }

    /// Appends `token` to `table` (a new block when its last is full). Nothing changes
    /// when no block can be given.
    pub fn append(&mut self, table: &mut BlockTable, token: i64) -> Result<(), OutOfBlocks> {
        if table.tokens.len() == table.blocks.len() * self.block_size {
            let b = self.fresh().ok_or(OutOfBlocks { need: 1, available: 0 })?;
            table.blocks.push(b);
        }
        table.tokens.push(token);
        Ok(())
    }

    /// Records that the first `computed` tokens of `table` have their keys and values
    /// written: each full block among them is registered for sharing (one whose content
    /// another sequence registered first stays this sequence's own).
    pub fn computed(&mut self, table: &mut BlockTable, computed: usize) {
        let bs = self.block_size;
        let full = computed.min(table.tokens.len()) / bs;
        while table.registered < full {
            let i = table.registered;
            let key = (table.chain, table.tokens[i * bs..(i + 1) * bs].to_vec());
            let b = table.blocks[i];
            let chain = match self.index.get(&key) {
                Some(&(_, k)) => k,
                None if self.content[b as usize].is_none() => {
                    let k = self.next_key;
                    self.next_key += 1;
                    self.index.insert(key.clone(), (b, k));
                    self.content[b as usize] = Some((key, k));
                    k
                }
                // already registered (shared from the start)
                None => self.content[b as usize].as_ref().map_or(0, |(_, k)| *k),
            };
            table.chain = chain;
            table.registered += 1;
        }
    }

    /// Releases `table`'s blocks: registered blocks no other sequence uses become cached
    /// (the sequence's last blocks evicted first), the others free.
    pub fn free(&mut self, table: BlockTable) {
        for &b in table.blocks.iter().rev() {
            let r = &mut self.refs[b as usize];
            *r = r.saturating_sub(1);
            if *r > 0 {
                continue;
            }
            if self.content[b as usize].is_some() {
                self.tick += 1;
                self.cached.insert(self.tick, b);
                self.released_at[b as usize] = self.tick;
            } else {
                self.free.push(b);
            }
        }
    }

    /// One more sequence uses block `b` (out of the cached blocks if none did).
    fn take(&mut self, b: BlockId) {
        if self.refs[b as usize] == 0 {
            self.cached.remove(&self.released_at[b as usize]);
        }
        self.refs[b as usize] += 1;
    }

    /// A block for new tokens: a free one, else the oldest cached one (its content
    /// forgotten).
    fn fresh(&mut self) -> Option<BlockId> {
        let b = match self.free.pop() {
            Some(b) => b,
            None => {
                let (_, b) = self.cached.pop_first()?;
                if let Some((key, _)) = self.content[b as usize].take() {
                    self.index.remove(&key);
                }
                self.stats.evictions += 1;
                b
            }
        };
        self.refs[b as usize] = 1;
        Some(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A prompt allocated, all of it computed.
    fn admit(pool: &mut BlockPool, tokens: &[i64]) -> (BlockTable, usize) {
        let Prompt { mut table, cached_tokens } = pool.allocate_prompt(tokens).unwrap();
        pool.computed(&mut table, tokens.len());
        (table, cached_tokens)
    }

    #[test]
    fn prompts_sharing_a_prefix_share_its_full_blocks_and_compute_the_rest() {
        let mut pool = BlockPool::new(64, 4);
        let prefix: Vec<i64> = (0..10).collect();
        let a: Vec<i64> = prefix.iter().copied().chain([100, 101]).collect();
        let b: Vec<i64> = prefix.iter().copied().chain([200, 201, 202]).collect();
        let (ta, hit_a) = admit(&mut pool, &a);
        assert_eq!((hit_a, ta.blocks().len()), (0, 3));
        let (tb, hit_b) = admit(&mut pool, &b);
        // the two full blocks of the 10-token prefix (8 tokens) are shared
        assert_eq!(hit_b, 8);
        assert_eq!(&tb.blocks()[..2], &ta.blocks()[..2]);
        assert_ne!(tb.blocks()[2], ta.blocks()[2]);
        let s = pool.stats();
        // a: three blocks; b: the two shared and two of its own
        assert_eq!((s.used, s.free, s.prefix_hit_tokens, s.prompt_tokens), (5, 59, 8, 25));
        // equal tokens after a different first block are not a hit
        let c: Vec<i64> = [9, 9, 9, 9].into_iter().chain(4..8).chain([7]).collect();
        assert_eq!(admit(&mut pool, &c).1, 0);
        // freed, the registered blocks stay cached and are found again
        pool.free(ta);
        pool.free(tb);
        // the full blocks stay cached (a's three, b's third); b's partial last block is free
        assert_eq!(pool.stats().cached, 4);
        let (_, hit) = admit(&mut pool, &a);
        assert_eq!(hit, 8);
    }

    #[test]
    fn a_prompt_found_whole_still_computes_its_last_block() {
        let mut pool = BlockPool::new(8, 4);
        let p: Vec<i64> = (0..8).collect();
        let (t, _) = admit(&mut pool, &p);
        pool.free(t);
        let Prompt { table, cached_tokens } = pool.allocate_prompt(&p).unwrap();
        assert_eq!(cached_tokens, 4, "the first block shared, the last recomputed for the logits");
        assert_eq!(table.blocks().len(), 2);
    }

    #[test]
    fn running_out_changes_nothing_and_cached_blocks_are_evicted_oldest_first() {
        let mut pool = BlockPool::new(4, 2);
        let (t1, _) = admit(&mut pool, &[1, 2, 3, 4]);
        let (t2, _) = admit(&mut pool, &[5, 6, 7]);
        let before = pool.stats();
        let e = pool.allocate_prompt(&[8, 9, 10]).unwrap_err();
        assert_eq!(e, OutOfBlocks { need: 2, available: 0 });
        assert!(e.to_string().contains("needs 2 more blocks"));
        assert_eq!(pool.stats(), before, "a refused prompt takes nothing");
        let mut t2 = t2;
        assert_eq!(pool.append(&mut t2, 8), Ok(()), "the last block has room");
        assert!(pool.append(&mut t2, 9).is_err());
        assert_eq!(t2.len(), 4, "a refused token is not added");
        pool.free(t1);
        // t1's two registered blocks are cached: the tail one (released first) goes first
        let s = pool.stats();
        assert_eq!((s.cached, s.free), (2, 0));
        pool.append(&mut t2, 9).unwrap();
        assert_eq!(pool.stats().evictions, 1);
        // the head block [1, 2] survived, [3, 4] after it was evicted
        pool.free(t2);
        let Prompt { cached_tokens, .. } = pool.allocate_prompt(&[1, 2, 3, 4, 5]).unwrap();
        assert_eq!(cached_tokens, 2);
    }

    #[test]
    fn a_slot_is_block_times_size_plus_offset() {
        let mut pool = BlockPool::new(4, 3);
        let (_, _) = admit(&mut pool, &[1]);
        let (t, _) = admit(&mut pool, &[1, 2, 3, 4]);
        assert_eq!(t.blocks(), &[1, 2]);
        assert_eq!((t.slot(0, 3), t.slot(3, 3), t.slot(4, 3)), (Some(3), Some(6), None));
    }

    #[derive(Debug, Clone)]
    enum Op {
        Admit(Vec<i64>),
        Append(usize, i64),
        Free(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            // a small vocabulary and short prompts: prefixes are often shared
            prop::collection::vec(0i64..3, 1..12).prop_map(Op::Admit),
            (0usize..8, 0i64..3).prop_map(|(i, t)| Op::Append(i, t)),
            (0usize..8).prop_map(Op::Free),
        ]
    }

    proptest! {
        /// Whatever the requests, every block is free, cached or used by exactly the
        /// sequences whose tables hold it, a shared block is only ever shared between
        /// sequences whose tokens up to its end are the same, and refused requests change
        /// nothing.
        #[test]
        fn blocks_are_accounted_for_and_shared_only_between_equal_prefixes(
            ops in prop::collection::vec(op(), 1..60),
        ) {
            let bs = 3;
            let mut pool = BlockPool::new(10, bs);
            let mut live: Vec<BlockTable> = Vec::new();
            for op in ops {
                match op {
                    Op::Admit(p) => {
                        let before = pool.stats();
                        match pool.allocate_prompt(&p) {
                            Ok(Prompt { mut table, cached_tokens }) => {
                                prop_assert!(cached_tokens % bs == 0 && cached_tokens < p.len());
                                pool.computed(&mut table, p.len());
                                live.push(table);
                            }
                            Err(_) => {
                                let after = pool.stats();
                                prop_assert_eq!((after.used, after.cached, after.free), (before.used, before.cached, before.free));
                            }
                        }
                    }
                    Op::Append(i, t) if !live.is_empty() => {
                        let n = live.len();
                        let table = &mut live[i % n];
                        let len = table.len();
                        if pool.append(table, t).is_ok() {
                            pool.computed(table, len + 1);
                        } else {
                            prop_assert_eq!(table.len(), len);
                        }
                    }
                    Op::Free(i) if !live.is_empty() => {
                        let n = live.len();
                        pool.free(live.swap_remove(i % n));
                    }
                    _ => {}
                }
                let s = pool.stats();
                prop_assert_eq!(s.used + s.cached + s.free, s.total);
                let mut holders: HashMap<BlockId, Vec<&[i64]>> = HashMap::new();
                for t in &live {
                    prop_assert_eq!(t.blocks().len(), t.len().div_ceil(bs));
                    for (j, b) in t.blocks().iter().enumerate() {
                        let end = ((j + 1) * bs).min(t.len());
                        holders.entry(*b).or_default().push(&t.tokens()[..end]);
                    }
                }
                prop_assert_eq!(holders.len(), s.used);
                for (b, prefixes) in &holders {
                    prop_assert_eq!(pool.refs[*b as usize] as usize, prefixes.len());
                    // shared: full, and the same tokens from the start to its end in every holder
                    if prefixes.len() > 1 {
                        for p in prefixes {
                            prop_assert_eq!(p.len() % bs, 0);
                            prop_assert_eq!(*p, prefixes[0]);
                        }
                    }
                }
            }
        }
    }
}
