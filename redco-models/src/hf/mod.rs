//! Hugging Face formats: `config.json` (more to come: safetensors, tokenizers).

pub mod config;
pub mod safetensors;
