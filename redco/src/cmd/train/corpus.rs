//! The bundled corpus as training data: as the presets' words ([`Synthetic`]), or as text
//! encoded by a model's own tokenizer ([`EncodedSynthetic`]).

use redco_core::{Error, Result};
use redco_models::hf::tokenizer::Tokenizer;
use redco_models::hf::vocab;
use redco_models::presets::SyntheticText;
use redco_pipeline::data::Dataset;

/// Mixed into `--seed` to seed the corpus's Markov chain.
pub(super) const SEED_MIX: u64 = 0x5157;

/// Sequences of `seq_len + 1` tokens from the bundled corpus, generated on demand.
pub(super) struct Synthetic(pub SyntheticText, pub u64, pub usize);

impl Dataset<Vec<i64>> for Synthetic {
    fn len(&self) -> usize {
        self.2
    }
    fn get(&self, i: usize) -> Result<Vec<i64>> {
        Ok(self.0.ids(self.1 + i as u64))
    }
}

/// The bundled corpus for a model with a tokenizer of its own: each sequence's text encoded
/// by that tokenizer (`<s>` first, `</s>` after each text), texts appended until there are
/// `len` tokens, each sequence's ids checked against the model's vocabulary.
pub(super) struct EncodedSynthetic {
    /// The corpus.
    pub text: SyntheticText,
    /// The model's tokenizer.
    pub tok: Tokenizer,
    /// Tokens per sequence.
    pub tokens: usize,
    /// The first text's index.
    pub offset: u64,
    /// Sequences.
    pub count: usize,
    /// The model's vocabulary size.
    pub vocab: usize,
}

impl EncodedSynthetic {
    fn sequence(&self, i: u64) -> Result<Vec<i64>> {
        let mut ids = Vec::with_capacity(self.tokens + 16);
        let mut k = 0u64;
        while ids.len() < self.tokens {
            // the texts after the first are far from every other sequence's
            let text = self.text.text(i.wrapping_add(k.wrapping_mul(1 << 44)));
            let before = ids.len();
            ids.extend(self.tok.encode(&text, true)?);
            ids.extend(self.tok.eos_id());
            if ids.len() == before {
                return Err(Error::invalid(
                    "data",
                    format!("{} encodes the bundled corpus to no tokens; give --data", self.tok.source().display()),
                ));
            }
            k += 1;
        }
        ids.truncate(self.tokens);
        let source = format!("the bundled corpus (sequence {i}) encoded by {}", self.tok.source().display());
        vocab::check_ids(&ids, self.vocab, false, &source, Some(&self.tok))?;
        Ok(ids)
    }
}

impl Dataset<Vec<i64>> for EncodedSynthetic {
    fn len(&self) -> usize {
        self.count
    }
    fn get(&self, i: usize) -> Result<Vec<i64>> {
        self.sequence(self.offset + i as u64)
    }
}
