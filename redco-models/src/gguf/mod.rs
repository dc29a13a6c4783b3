//! GGUF, llama.cpp's file format: the container ([`mod@format`]: read and write), SentencePiece
//! vocabularies between GGUF and `tokenizer.json` ([`vocab`]) (llama.cpp's quantized blocks
//! are `redco_core::quant`'s), and LLaMA models written for llama.cpp and read back
//! ([`llama::export`] and [`llama::import`], behind `redco convert --to gguf` and `--to hf`).

pub mod format;
pub mod llama;
pub mod vocab;
