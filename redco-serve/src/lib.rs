//! The serving engine of redco-rs, behind `redco serve`:
//!
//! - [`kv`]: the paged KV cache: fixed-size blocks from a pool sized by a memory budget, a
//!   block table per sequence, blocks shared between sequences whose prompts share a prefix
//!   (prefix caching) as vLLM's PagedAttention lays them out, and the key and value tables
//!   the blocks index, read through a sequence's block table for attention;
//! - [`engine`]: continuous batching (iteration-level scheduling, chunked prefill,
//!   preemption with recompute) over a model's ragged batches
//!   ([`CausalLm::ragged_logits`](redco_models::generate::CausalLm::ragged_logits));
//! - [`guide`]: constrained decoding (structured output): llguidance's token masks over the
//!   model's vocabulary for a JSON schema, a regular expression or a choice;
//! - [`worker`]: the engine on a thread of its own, each request's tokens on a channel;
//! - [`lockstep`]: tensor-parallel serving: every rank runs the engine on its shard, rank 0
//!   broadcasting each step's new requests and cancellations;
//! - [`http`]: the OpenAI-compatible front end (axum): completions, chat completions with
//!   the model's chat template, server-sent-event streaming, models, health, metrics.
//!
//! Paged attention is one fused kernel on the CPU (`redco-cpu/src/paged_attention.rs`),
//! wgpu (`redco-wgpu/src/paged_attention.rs`) and CUDA (`paged_attn_*` in
//! `redco-cuda/kernels/attention.cu`) backends; PJRT takes the composite (each sequence's
//! rows gathered, then the backend's attention). LLaMA, GPT-J and OPT serve; T5 is refused.

#![warn(missing_docs)]

pub mod engine;
pub mod guide;
pub mod http;
pub mod kv;
pub mod lockstep;
pub mod worker;
