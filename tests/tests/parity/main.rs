//! Parity with Hugging Face transformers on the committed fixtures (written by
//! `xtask/python/gen_fixtures.py`).

mod checkpoint;
mod failures;
mod llama;
mod models;
mod tokenizer;
mod tokenizers_all;
