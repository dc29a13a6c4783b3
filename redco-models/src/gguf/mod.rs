//! GGUF, llama.cpp's file format: the container ([`format`]: read and write), SentencePiece
//! vocabularies between GGUF and `tokenizer.json` ([`vocab`]), and LLaMA models written for
//! llama.cpp ([`llama::export`], behind `redco convert --to gguf`).

pub mod format;
pub mod llama;
pub mod vocab;
