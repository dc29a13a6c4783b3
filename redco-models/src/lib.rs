//! `redco-models`: GPT-J, LLaMA, T5 and OPT written with `redco-core` ops.
//!
//! Today: reading Hugging Face `config.json` ([`hf::config`]), with the parameter names and
//! shapes transformers uses, which the planner works from. The model implementations
//! (generic over `redco_core::Backend`, safetensors loading and saving, tokenizers,
//! generation with a KV cache) arrive with their issues. Models never mention sharding or
//! collectives: the parallel split is derived by `redco-core`.

pub mod auto;
pub mod build;
pub mod generate;
pub mod gptj;
pub mod hf;
pub mod llama;
pub mod opt;
pub mod params;
pub mod presets;
pub mod seq2seq;
pub mod t5;
pub mod tiny;
