//! Hugging Face formats: `config.json`, safetensors checkpoints (reading whole or by slice,
//! saving), `tokenizer.json`.

pub mod checkpoint;
pub mod config;
mod fields;
pub mod safetensors;
pub mod save;
pub mod tokenizer;
pub mod vocab;
