//! `redco-models`: GPT-J, LLaMA, T5 and OPT written with `redco-core` ops (not yet
//! implemented).
//!
//! Each model will be generic over `redco_core::Backend`, read Hugging Face `config.json`
//! and safetensors checkpoints (sharded and memory-mapped), save back in the transformers
//! layout, tokenize through `tokenizers`, and generate with a KV cache. Models never
//! mention sharding or collectives: the parallel split is derived by `redco-core`.
