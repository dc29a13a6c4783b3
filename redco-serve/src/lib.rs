//! The serving engine of redco-rs (issue 38, in progress): what `redco serve` runs its
//! requests on. This first part is the paged KV cache's bookkeeping ([`kv`]): fixed-size
//! blocks from a pool sized by a memory budget, a block table per sequence, and blocks
//! shared between sequences whose prompts share a prefix (prefix caching), as vLLM's
//! PagedAttention lays them out. The tensors the blocks index, the scheduler and the HTTP
//! front end come next; nothing here depends on a backend.

pub mod kv;
