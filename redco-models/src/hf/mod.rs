//! Hugging Face formats: `config.json`, safetensors checkpoints (reading whole or by slice,
//! saving), `tokenizer.json`, AWQ and GPTQ int4 layouts.

pub mod checkpoint;
pub mod config;
mod fields;
pub mod int4;
pub mod safetensors;
pub mod save;
pub mod tokenizer;
pub mod vocab;
