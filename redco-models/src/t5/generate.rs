//! T5's generation: greedy or sampled decoding and beam search over the encoder output
//! computed once, the decoder's keys and values cached step by step.

use super::T5;
use redco_core::{Backend, Result, Tensor};

impl<B: Backend> T5<B> {
    fn start_token(&self) -> i64 {
        self.cfg.num("decoder_start_token_id").unwrap_or(0) as i64
    }

    /// The model's generation defaults for [`T5::generate`]: stop at its end-of-sequence
    /// tokens, pad with its padding token (see [`crate::generate::GenerationConfig::for_model`]).
    pub fn generation_config(&self) -> crate::generate::GenerationConfig {
        crate::generate::GenerationConfig::for_model(&self.cfg)
    }

    /// Greedy or sampled generation: the decoder starts from `decoder_start_token_id` and
    /// runs over the encoder output computed once (cross-attention keys and values cached
    /// at the first step). Returns per row the start token and the new tokens, finished rows
    /// filled with the pad token; stops early when every row has produced a stop token.
    pub fn generate(
        &self,
        ids: &Tensor<B>,
        mask: Option<&Tensor<B>>,
        cfg: &crate::generate::GenerationConfig,
    ) -> Result<Vec<Vec<i64>>> {
        cfg.sampling.validate()?;
        let b = ids.backend().clone();
        let bs = ids.dims()[0];
        redco_core::no_grad(|| {
            let enc = self.encode(ids, mask)?;
            let mut cache = self.new_cache();
            let mut rows: Vec<Vec<i64>> = vec![vec![self.start_token()]; bs];
            let mut done = vec![false; bs];
            for step in 0..cfg.max_new_tokens {
                let last: Vec<i64> = rows.iter().map(|r| r[r.len() - 1]).collect();
                let dec = Tensor::from_vec(&b, last, [bs, 1])?;
                let logits = self.decode(&dec, &enc, mask, Some(&mut cache))?.replicate()?;
                let v = logits.dims()[2];
                let host = logits.to_vec_f32()?;
                for (r, row) in host.chunks(v).enumerate() {
                    let tok =
                        if done[r] { cfg.pad_token } else { cfg.sampling.choose(row, (step * bs + r) as u64)? as i64 };
                    if cfg.stop_tokens.contains(&tok) {
                        done[r] = true;
                    }
                    rows[r].push(tok);
                }
                if done.iter().all(|d| *d) {
                    break;
                }
            }
            Ok(rows)
        })
    }

    /// Beam search (transformers' semantics, see [`crate::generate::beam_search`]); returns
    /// the best hypothesis per row, starting with the decoder start token.
    pub fn generate_beam(
        &self,
        ids: &Tensor<B>,
        mask: Option<&Tensor<B>>,
        cfg: &crate::generate::BeamConfig,
    ) -> Result<Vec<Vec<i64>>> {
        let b = ids.backend().clone();
        let (bs, nb) = (ids.dims()[0], cfg.num_beams);
        redco_core::no_grad(|| {
            // every row's beams read the same encoder output
            let expand: Vec<i64> = (0..bs * nb).map(|i| (i / nb.max(1)) as i64).collect();
            let expand = Tensor::from_vec(&b, expand, [bs * nb])?;
            let enc = self.encode(ids, mask)?.index_select(&expand, 0)?;
            let enc_mask = mask.map(|m| m.index_select(&expand, 0)).transpose()?;
            let mut cache = self.new_cache();
            let prompt = vec![vec![self.start_token()]; bs];
            crate::generate::beam_search(&prompt, cfg, |inputs, reorder| {
                if let Some(r) = reorder {
                    let idx = Tensor::from_vec(&b, r.iter().map(|&i| i as i64).collect::<Vec<_>>(), [r.len()])?;
                    cache.select_rows(&idx)?;
                }
                let t = inputs[0].len();
                let dec = Tensor::from_vec(&b, inputs.concat(), [inputs.len(), t])?;
                let logits = self.decode(&dec, &enc, enc_mask.as_ref(), Some(&mut cache))?.replicate()?;
                let (v, tl) = (logits.dims()[2], logits.dims()[1]);
                let host = logits.to_vec_f32()?;
                Ok(host.chunks(tl * v).map(|row| row[(tl - 1) * v..].to_vec()).collect())
            })
        })
    }
}
