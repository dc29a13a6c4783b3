//! Text-to-text training with an encoder-decoder ([`T5`]), as the three functions: a
//! `collate_fn` that pads (source, target) pairs the way transformers' data collator for
//! seq2seq does (sources padded with the pad id under an attention mask, targets padded
//! with -100 so that padding is ignored by the loss), the loss (decoder inputs are the
//! labels shifted right behind `decoder_start_token_id`, inside [`T5::loss`]) and greedy
//! generation for held-out sources.

use crate::generate::{GenerationConfig, Sampling};
use crate::t5::T5;
use redco_core::{Backend, Error, Result, Tensor};
use redco_pipeline::Batch;

/// One training example: token ids of the source and of the target (each with its end of
/// sequence token when the tokenizer adds one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pair {
    /// Encoder input ids.
    pub source: Vec<i64>,
    /// Target ids (the labels).
    pub target: Vec<i64>,
}

/// Pads a batch of pairs to its longest source and longest target: `input_ids` and
/// `attention_mask` `[batch, source]` (`pad` after each source, mask 0 there), `labels`
/// `[batch, target]` (-100 after each target).
pub fn collate_pairs<B: Backend>(b: &B, pairs: &[Pair], pad: i64) -> Result<Batch<B>> {
    if pairs.is_empty() {
        return Err(Error::invalid("seq2seq", "an empty batch of pairs"));
    }
    if let Some(i) = pairs.iter().position(|p| p.source.is_empty() || p.target.is_empty()) {
        return Err(Error::invalid("seq2seq", format!("pair {i} of the batch has an empty source or target")));
    }
    let s = pairs.iter().map(|p| p.source.len()).max().unwrap_or(1);
    let t = pairs.iter().map(|p| p.target.len()).max().unwrap_or(1);
    let n = pairs.len();
    let (mut ids, mut mask, mut labels) =
        (Vec::with_capacity(n * s), Vec::with_capacity(n * s), Vec::with_capacity(n * t));
    for p in pairs {
        ids.extend(p.source.iter().copied().chain(std::iter::repeat_n(pad, s - p.source.len())));
        mask.extend((0..s).map(|i| i64::from(i < p.source.len())));
        labels.extend(p.target.iter().copied().chain(std::iter::repeat_n(-100, t - p.target.len())));
    }
    Ok(Batch::from([
        ("input_ids".to_string(), Tensor::from_vec(b, ids, [n, s])?),
        ("attention_mask".to_string(), Tensor::from_vec(b, mask, [n, s])?),
        ("labels".to_string(), Tensor::from_vec(b, labels, [n, t])?),
    ]))
}

/// The mean cross-entropy of the targets of a batch from [`collate_pairs`] (padding
/// ignored; the decoder reads the labels shifted right).
pub fn seq2seq_loss<B: Backend>(model: &T5<B>, batch: &Batch<B>) -> Result<Tensor<B>> {
    let get = |k: &str| batch.get(k).ok_or_else(|| Error::invalid("seq2seq", format!("the batch has no `{k}`")));
    model.loss(get("input_ids")?, Some(get("attention_mask")?), get("labels")?, None)
}

/// Greedy outputs for `sources` (batched, padded like [`collate_pairs`]), at most
/// `max_new_tokens` each, without the decoder start token and cut at the end of sequence
/// token (the model's `eos_token_id`s, kept out of the output).
pub fn generate_targets<B: Backend>(
    b: &B,
    model: &T5<B>,
    sources: &[Vec<i64>],
    max_new_tokens: usize,
) -> Result<Vec<Vec<i64>>> {
    if sources.is_empty() {
        return Ok(vec![]);
    }
    let pad = model.cfg.pad_token_id.unwrap_or(0);
    let eos = &model.cfg.eos_token_ids;
    let pairs: Vec<Pair> = sources.iter().map(|s| Pair { source: s.clone(), target: vec![pad] }).collect();
    let batch = collate_pairs(b, &pairs, pad)?;
    let cfg = GenerationConfig { max_new_tokens, sampling: Sampling::Greedy, stop_tokens: eos.clone(), pad_token: pad };
    let rows = model.generate(&batch["input_ids"], Some(&batch["attention_mask"]), &cfg)?;
    Ok(rows.into_iter().map(|r| r.into_iter().skip(1).take_while(|t| !eos.contains(t)).collect()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use redco_cpu::Cpu;

    #[test]
    fn pairs_pad_sources_under_a_mask_and_targets_with_minus_100() {
        let b = Cpu::new(1);
        let pairs =
            [Pair { source: vec![5, 6, 1], target: vec![7, 1] }, Pair { source: vec![8, 1], target: vec![9, 9, 9, 1] }];
        let batch = collate_pairs(&b, &pairs, 0).expect("collate");
        assert_eq!(batch["input_ids"].to_vec_i64().expect("ids"), [5, 6, 1, 8, 1, 0]);
        assert_eq!(batch["attention_mask"].to_vec_i64().expect("mask"), [1, 1, 1, 1, 1, 0]);
        assert_eq!(batch["labels"].to_vec_i64().expect("labels"), [7, 1, -100, -100, 9, 9, 9, 1]);
        let empty = [Pair { source: vec![], target: vec![1] }];
        assert!(collate_pairs(&b, &empty, 0).is_err());
    }
}
