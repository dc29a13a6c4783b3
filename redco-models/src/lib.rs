//! `redco-models`: GPT-J, LLaMA, T5 and OPT written with `redco-core` ops, with Hugging Face
//! checkpoints, tokenizers and generation.
//!
//! What is here:
//!
//! * **Models**, generic over `redco_core::Backend`: [`llama::Llama`], [`gptj::GptJ`],
//!   [`opt::Opt`] (decoder-only), [`t5::T5`] (encoder-decoder), [`auto::AutoModel`] (any
//!   decoder-only one, picked by `config.json`'s `model_type`) and the small [`tiny::Lm`] of
//!   the examples. Parameter names, shapes and numerics follow transformers. Every
//!   decoder-only `loss` takes `(ids, mask, labels)`, in transformers' order; T5's takes
//!   `(ids, mask, labels, decoder_ids)`. Models never mention sharding or collectives: the
//!   parallel split is derived by `redco-core`.
//! * **Hugging Face files** ([`hf`]): `config.json` ([`hf::config::HfConfig`]), safetensors
//!   checkpoints (sharded or not, sliced per rank under tensor parallelism) loaded by each
//!   model's `from_pretrained` and written back by [`hf::save`], and `tokenizer.json`
//!   ([`hf::tokenizer::Tokenizer`], `i64` ids like everything else here).
//! * **Generation** ([`generate`]): a KV cache, left-padded batches, greedy, sampled
//!   (temperature, top-k, top-p) or beam search, stop tokens;
//!   [`generate::generate`] returns the tokens, [`generate::generate_with`] also streams them;
//!   [`generate::GenerationConfig::for_model`] takes the stop and padding tokens from the
//!   model's config.
//! * **Sequence to sequence** ([`seq2seq`]): collate, loss and generation for T5.
//! * **GGUF** ([`gguf`]): llama.cpp's format, read and written; LLaMA models exported to it.
//! * **Presets** ([`presets`]): LLaMA configurations that need no download, the bundled
//!   synthetic corpus and its tokenizers.
//!
//! # Quick start
//!
//! A small LLaMA from a preset's configuration with random weights, on the CPU backend: a
//! loss, one backward pass, then a few greedy tokens.
//!
//! ```
//! use redco_core::{nn::ModuleExt, DType, Tensor};
//! use redco_cpu::Cpu;
//! use redco_models::generate::{generate, CausalLm, GenerationConfig};
//! use redco_models::{hf::config::HfConfig, llama::Llama, presets};
//!
//! let b = Cpu::new(1);
//! // `llama-tiny`: hidden 128, 4 layers; a vocabulary of 64 tokens (eos = 2)
//! let cfg = HfConfig::from_json(&presets::config("llama-tiny", 64)?.to_string())?;
//! let model = Llama::new(&b, &cfg, DType::F32, 0)?;
//!
//! // loss and gradients: (ids, mask, labels), as in transformers (shifted inside)
//! let ids = Tensor::from_vec(&b, vec![1i64, 7, 8, 9, 10, 11], [2, 3])?;
//! let mask = Tensor::from_vec(&b, vec![1i64; 6], [2, 3])?;
//! let loss = model.loss(&ids, Some(&mask), &ids)?;
//! let grads = loss.backward()?;
//! assert!(loss.to_scalar()? > 0.0);
//! assert!(model.named_parameters().iter().all(|(_, p)| grads.get(p).is_some()));
//!
//! // greedy generation with the model's own stop and padding tokens
//! let prompt = Tensor::from_vec(&b, vec![1i64, 7, 8], [1, 3])?;
//! let cfg = GenerationConfig { max_new_tokens: 4, ..model.generation_config() };
//! let out = generate(&model, &prompt, None, &cfg)?;
//! assert_eq!(out.rows[0][..3], [1, 7, 8]);
//! assert!((1..=4).contains(&out.new_tokens[0]));
//! # Ok::<(), redco_core::Error>(())
//! ```
//!
//! A trained model loads from its directory instead (`Llama::from_pretrained(&b, dir,
//! DType::F32)`, or `auto::AutoModel::from_pretrained` for any architecture), with its
//! tokenizer from `hf::tokenizer::Tokenizer::from_dir(dir)`.

pub mod auto;
pub mod build;
pub mod generate;
pub mod gguf;
pub mod gptj;
pub mod hf;
pub mod llama;
pub mod opt;
pub mod params;
pub mod presets;
pub mod seq2seq;
pub mod stack;
pub mod t5;
pub mod tiny;
