//! The serving engine of redco-rs (issue 38, in progress): what `redco serve` runs its
//! requests on. This first part is the paged KV cache's bookkeeping ([`kv`]): fixed-size
//! blocks from a pool sized by a memory budget, a block table per sequence, and blocks
//! shared between sequences whose prompts share a prefix (prefix caching), as vLLM's
//! PagedAttention lays them out, and the key and value tables the blocks index, read
//! through a sequence's block table for attention. The scheduler, the models' ragged
//! batches and the HTTP front end come next.

pub mod engine;
pub mod kv;
