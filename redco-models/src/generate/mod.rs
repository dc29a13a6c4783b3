//! Text generation for decoder-only models: a KV cache, batched prompts with left padding
//! (positions from the attention mask, as transformers computes them; a model with
//! [`CausalLm::runs_ragged`], on a backend that writes rows in place, runs each row's real
//! tokens as a ragged batch over a cache written in place: for left padding the same tokens
//! as the padded batch, [`Padded`]), greedy or sampled
//! decoding, stop tokens, a maximum of new tokens and a per-token streaming callback. Under
//! tensor parallelism every rank runs the same loop on its shard of the model (the cache
//! holds its heads) and draws the same tokens from the gathered logits.
//!
//! [`generate`] returns the whole [`Generation`]; [`generate_with`] also streams each step's
//! tokens to a callback. [`GenerationConfig::for_model`] (or [`CausalLm::generation_config`])
//! starts from the model's own `eos_token_id`s and `pad_token_id`, as transformers'
//! `model.generate` does; [`BeamConfig::for_model`] does the same for [`generate_beam`].

mod beam;
mod cache;
mod fixed_cache;
mod ragged;
mod sampling;

pub use beam::{beam_search, BeamConfig};
pub use cache::KvCache;
pub use fixed_cache::{FixedKvCache, LayerKv};
pub use ragged::heads_together;
pub use sampling::{argmax, Sampling};

use crate::hf::config::HfConfig;
use redco_core::runtime::on_backend;
use redco_core::{no_grad, Backend, Error, Result, Tensor};

/// A decoder-only language model that can run step by step over a [`KvCache`].
pub trait CausalLm<B: Backend> {
    /// The model's configuration.
    fn config(&self) -> &HfConfig;
    /// The context length, when known: prompts longer than this are refused.
    fn max_positions(&self) -> Option<usize> {
        self.config().max_positions
    }
    /// The model's generation defaults: [`GenerationConfig::for_model`] of its config (stop
    /// at its end-of-sequence tokens, pad with its padding token or else the first of them).
    fn generation_config(&self) -> GenerationConfig {
        GenerationConfig::for_model(self.config())
    }
    /// An empty cache sized for this model.
    fn new_cache(&self) -> KvCache<B> {
        KvCache::new(self.config().layers)
    }
    /// Logits `[batch, vocab]` at the last of `ids` `[batch, new]`, which follow the cached
    /// positions. `mask` `[batch, cached + new]` marks real tokens (1) and padding (0);
    /// `positions` `[batch, new]` are the rotary/learned positions of the new tokens.
    fn next_logits(
        &self,
        ids: &Tensor<B>,
        mask: &Tensor<B>,
        positions: &Tensor<B>,
        cache: &mut KvCache<B>,
    ) -> Result<Tensor<B>>;
    /// Whether [`CausalLm::ragged_logits`] is implemented: [`generate`] then runs each row's
    /// real tokens as a ragged batch over a cache written in place (see the `ragged`
    /// module), instead of [`CausalLm::next_logits`] over a padded batch.
    fn runs_ragged(&self) -> bool {
        false
    }
    /// Logits `[rows.len(), vocab]` of a ragged batch (a serving engine's step): `ids`
    /// `[1, T]` are the new tokens of several sequences one after another, `positions`
    /// `[1, T]` their positions, `rows` the tokens whose logits are wanted, and each layer's
    /// attention is `attend(layer, q, k, v)` over the whole batch (`q` `[1, heads, T,
    /// head_dim]`, `k` and `v` `[1, kv_heads, T, head_dim]`, rotary embedding applied),
    /// which keeps each sequence's keys and values and attends within each sequence. The
    /// default refuses: a model a server can run overrides it.
    fn ragged_logits(
        &self,
        ids: &Tensor<B>,
        positions: &Tensor<B>,
        rows: &[usize],
        attend: &mut RaggedAttend<'_, B>,
    ) -> Result<Tensor<B>> {
        let _ = (ids, positions, rows, attend);
        Err(Error::unsupported(
            "ragged_logits",
            format!(
                "serving (ragged batches) is implemented for LLaMA models; this model is {}",
                self.config().model_type
            ),
        ))
    }
}

/// A model run by [`generate`] as a padded batch over a [`KvCache`] grown by concatenation
/// ([`CausalLm::next_logits`]), never as a ragged batch: the reference the ragged path is
/// tested against, and what a benchmark compares it with.
pub struct Padded<'a, M: ?Sized>(pub &'a M);

impl<B: Backend, M: CausalLm<B> + ?Sized> CausalLm<B> for Padded<'_, M> {
    fn config(&self) -> &HfConfig {
        self.0.config()
    }
    fn max_positions(&self) -> Option<usize> {
        self.0.max_positions()
    }
    fn generation_config(&self) -> GenerationConfig {
        self.0.generation_config()
    }
    fn new_cache(&self) -> KvCache<B> {
        self.0.new_cache()
    }
    fn next_logits(
        &self,
        ids: &Tensor<B>,
        mask: &Tensor<B>,
        positions: &Tensor<B>,
        cache: &mut KvCache<B>,
    ) -> Result<Tensor<B>> {
        self.0.next_logits(ids, mask, positions, cache)
    }
}

/// Checks a ragged batch ([`CausalLm::ragged_logits`]'s): ids `[1, T]`, positions of the
/// same shape, rows within the batch; returns `T`.
pub fn check_ragged<B: Backend>(
    model: &'static str,
    ids: &Tensor<B>,
    positions: &Tensor<B>,
    rows: &[usize],
) -> Result<usize> {
    if ids.rank() != 2 || ids.dims()[0] != 1 || positions.dims() != ids.dims() {
        return Err(Error::invalid(
            model,
            format!(
                "a ragged batch is ids [1, T] with positions [1, T], got {} and {}",
                ids.shape(),
                positions.shape()
            ),
        ));
    }
    let t = ids.dims()[1];
    if let Some(&r) = rows.iter().find(|&&r| r >= t) {
        return Err(Error::invalid(model, format!("logits of token {r} asked of a batch of {t}")));
    }
    Ok(t)
}

/// The hidden states `h` (`[1, T, d]`) of the tokens at `rows`, `[rows, d]`.
pub fn pick_rows<B: Backend>(h: &Tensor<B>, rows: &[usize]) -> Result<Tensor<B>> {
    let (t, d) = (h.dims()[1], h.dims()[2]);
    let picked = Tensor::from_vec(h.backend(), rows.iter().map(|&r| r as i64).collect::<Vec<_>>(), [rows.len()])?;
    h.reshape([t, d])?.index_select(&picked, 0)
}

/// A layer's attention over a ragged batch: `(layer, q, k, v) -> output` (see
/// [`CausalLm::ragged_logits`]).
pub type RaggedAttend<'a, B> = dyn FnMut(usize, Tensor<B>, Tensor<B>, Tensor<B>) -> Result<Tensor<B>> + 'a;

/// The hidden state of the last position, `[batch, seq, d] -> [batch, d]`.
pub fn last_position<B: Backend>(h: &Tensor<B>) -> Result<Tensor<B>> {
    let (bs, t, d) = (h.dims()[0], h.dims()[1], h.dims()[2]);
    h.narrow(1, t - 1, 1)?.reshape([bs, d])
}

/// An error when `len` positions exceed the context `ctx` of `model`.
pub fn check_context(model: &'static str, len: usize, ctx: Option<usize>) -> Result<()> {
    match ctx {
        Some(c) if len > c => Err(Error::invalid(model, format!("{len} positions exceed the model's context of {c}"))),
        _ => Ok(()),
    }
}

/// transformers' causal-LM loss from logits `[batch, seq, vocab]`: the logits at `t` predict
/// `labels` at `t + 1`; -100 is ignored; mean over the counted tokens.
pub fn shifted_loss<B: Backend>(logits: &Tensor<B>, labels: &Tensor<B>) -> Result<Tensor<B>> {
    let t = logits.dims()[1];
    if labels.dims() != &logits.dims()[..2] {
        return Err(Error::invalid(
            "loss",
            format!("labels {} do not match the logits {}", labels.shape(), logits.shape()),
        ));
    }
    if t < 2 {
        return Err(Error::invalid("loss", "a causal-LM loss needs at least 2 positions"));
    }
    // Shift the labels left (the last position gets the ignore index) instead of cutting
    // the last position off the logits: the same (logit, label) pairs without copying the
    // `[batch, seq, vocab]` logits.
    let batch = labels.dims()[0];
    let pad = Tensor::from_vec(logits.backend(), vec![redco_core::nn::IGNORE_INDEX; batch], [batch, 1])?
        .cast(labels.dtype())?
        .redistribute(labels.placements())?;
    let shifted = Tensor::cat(&[&labels.narrow(1, 1, t - 1)?, &pad], 1)?;
    redco_core::nn::cross_entropy(logits, &shifted)
}

/// What to generate.
///
/// [`GenerationConfig::default`] knows no model: 8 new tokens, greedy, no stop token, padding
/// with 0. [`GenerationConfig::for_model`] (or [`CausalLm::generation_config`]) takes the stop
/// and padding tokens from the model's config; change the other fields with struct update
/// syntax: `GenerationConfig { max_new_tokens: 32, ..GenerationConfig::for_model(cfg) }`.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationConfig {
    /// New tokens per row at most.
    pub max_new_tokens: usize,
    /// Greedy or sampled.
    pub sampling: Sampling,
    /// A row ends when it produces one of these (the token is kept).
    pub stop_tokens: Vec<i64>,
    /// What a finished row is filled with while others go on.
    pub pad_token: i64,
}

impl Default for GenerationConfig {
    /// 8 new tokens, greedy, no stop token, padding with 0: generation that runs the full
    /// length whatever the model (see [`GenerationConfig::for_model`] for the model's own).
    fn default() -> Self {
        GenerationConfig { max_new_tokens: 8, sampling: Sampling::Greedy, stop_tokens: Vec::new(), pad_token: 0 }
    }
}

impl GenerationConfig {
    /// The defaults of a model with config `cfg`, as transformers' `model.generate` takes
    /// them from `config.json` / `generation_config.json`: greedy, 8 new tokens, stop at any
    /// of `cfg.eos_token_ids`, fill finished rows with `cfg.pad_token_id`, or else the first
    /// end-of-sequence token, or else 0.
    pub fn for_model(cfg: &HfConfig) -> Self {
        GenerationConfig { stop_tokens: cfg.eos_token_ids.clone(), pad_token: model_pad(cfg), ..Self::default() }
    }
}

/// The token a model's finished rows are padded with: its `pad_token_id`, else its first
/// `eos_token_id`, else 0 (what transformers falls back to).
fn model_pad(cfg: &HfConfig) -> i64 {
    cfg.pad_token_id.or_else(|| cfg.eos_token_ids.first().copied()).unwrap_or(0)
}

/// The result of [`generate`] and [`generate_with`].
#[derive(Debug, Clone, PartialEq)]
pub struct Generation {
    /// Per row: the prompt (with its padding) followed by the new tokens; rows that stopped
    /// early are filled with the pad token, so all rows have the same length.
    pub rows: Vec<Vec<i64>>,
    /// Tokens generated per row (up to and including its stop token).
    pub new_tokens: Vec<usize>,
    /// Whether generation ended because the context length was reached.
    pub hit_context: bool,
}

impl Generation {
    /// The rows as one `[batch, len]` id tensor.
    pub fn to_tensor<B: Backend>(&self, b: &B) -> Result<Tensor<B>> {
        let len = self.rows.first().map_or(0, Vec::len);
        Tensor::from_vec(b, self.rows.concat(), [self.rows.len(), len])
    }
}

/// The positions transformers gives a (left-)padded batch: `cumsum(mask) - 1`, with padding
/// at position 1.
pub fn positions_from_mask(mask: &[i64], seq: usize) -> Vec<i64> {
    let mut out = Vec::with_capacity(mask.len());
    for row in mask.chunks(seq) {
        let mut c = 0;
        for &m in row {
            c += (m != 0) as i64;
            out.push(if m != 0 { c - 1 } else { 1 });
        }
    }
    out
}

/// Generates from `ids` `[batch, prompt]` (left-padded where `mask` `[batch, prompt]` is 0;
/// no mask means no padding). Stops when every row has produced a stop token, after
/// `max_new_tokens`, or at the model's context length. [`generate_with`] streams the tokens
/// as they come.
///
/// ```
/// # use redco_core::{DType, Tensor};
/// # use redco_cpu::Cpu;
/// # use redco_models::{generate::{generate, CausalLm}, hf::config::HfConfig, llama::Llama};
/// # let b = Cpu::new(1);
/// # let json = r#"{"model_type":"llama","hidden_size":16,"intermediate_size":32,"num_hidden_layers":1,
/// #   "num_attention_heads":2,"vocab_size":32,"max_position_embeddings":64,"eos_token_id":2}"#;
/// # let model = Llama::new(&b, &HfConfig::from_json(json)?, DType::F32, 0)?;
/// let prompt = Tensor::from_vec(&b, vec![1i64, 5, 9], [1, 3])?;
/// let out = generate(&model, &prompt, None, &model.generation_config())?;
/// assert_eq!(out.rows[0][..3], [1, 5, 9]);
/// # Ok::<(), redco_core::Error>(())
/// ```
pub fn generate<B: Backend, M: CausalLm<B> + Sync + ?Sized>(
    model: &M,
    ids: &Tensor<B>,
    mask: Option<&Tensor<B>>,
    cfg: &GenerationConfig,
) -> Result<Generation> {
    generate_with(model, ids, mask, cfg, |_, _| {})
}

/// [`generate`], streaming: `on_token(step, tokens)` is called after every step with the new
/// token of each row (the pad token for rows already finished).
pub fn generate_with<B: Backend, M: CausalLm<B> + Sync + ?Sized>(
    model: &M,
    ids: &Tensor<B>,
    mask: Option<&Tensor<B>>,
    cfg: &GenerationConfig,
    mut on_token: impl FnMut(usize, &[i64]),
) -> Result<Generation> {
    cfg.sampling.validate()?;
    if ids.rank() != 2 {
        return Err(Error::invalid("generate", format!("prompt ids must be [batch, seq], got {}", ids.shape())));
    }
    let (bs, t) = (ids.dims()[0], ids.dims()[1]);
    if t == 0 {
        return Err(Error::invalid("generate", "the prompt is empty"));
    }
    if let Some(m) = mask {
        if m.dims() != ids.dims() {
            return Err(Error::invalid(
                "generate",
                format!("attention mask {} does not match the prompt {}", m.shape(), ids.shape()),
            ));
        }
    }
    let mut budget = cfg.max_new_tokens;
    let mut hit_context = false;
    if let Some(ctx) = model.max_positions() {
        if t > ctx {
            return Err(Error::invalid(
                "generate",
                format!("the prompt has {t} tokens, longer than the model's context of {ctx}"),
            ));
        }
        if t + budget > ctx {
            budget = ctx - t;
            hit_context = true;
        }
    }
    let b = ids.backend().clone();
    let mut rows: Vec<Vec<i64>> = ids.to_vec_i64()?.chunks(t).map(<[i64]>::to_vec).collect();
    let mut mask_host = match mask {
        Some(m) => m.to_vec_i64()?,
        None => vec![1; bs * t],
    };
    // each row's real tokens as one segment of a ragged batch, over pools written in place
    let real: Vec<Vec<i64>> = rows
        .iter()
        .zip(mask_host.chunks(t))
        .map(|(r, m)| r.iter().zip(m).filter(|(_, m)| **m != 0).map(|(t, _)| *t).collect())
        .collect();
    if model.runs_ragged() && b.writes_rows_in_place() && budget > 0 && real.iter().all(|r| !r.is_empty()) {
        return ragged::generate_ragged(model, &b, (rows, real), (budget, hit_context), cfg, &mut on_token);
    }
    let mut len = t;
    let mut next_pos: Vec<i64> = mask_host.chunks(t).map(|r| r.iter().filter(|m| **m != 0).count() as i64).collect();
    let mut done = vec![false; bs];
    let mut new_tokens = vec![0; bs];
    let mut cache = model.new_cache();
    let mut step_ids = ids.clone();
    let mut step_pos = Tensor::from_vec(&b, positions_from_mask(&mask_host, t), [bs, t])?;
    no_grad(|| {
        for step in 0..budget {
            let m = Tensor::from_vec(&b, mask_host.clone(), [bs, len])?;
            // one hand-off to the backend's threads per step, not one per op
            let (host, v) = on_backend(&b, || -> Result<(Vec<f32>, usize)> {
                let logits = model.next_logits(&step_ids, &m, &step_pos, &mut cache)?.replicate()?;
                Ok((logits.to_vec_f32()?, logits.dims()[1]))
            })?;
            let mut toks = Vec::with_capacity(bs);
            for (r, row) in host.chunks(v).enumerate() {
                let tok = if done[r] {
                    cfg.pad_token
                } else {
                    new_tokens[r] += 1;
                    cfg.sampling.choose(row, (step * bs + r) as u64)? as i64
                };
                if cfg.stop_tokens.contains(&tok) && !done[r] {
                    done[r] = true;
                }
                toks.push(tok);
            }
            for (r, &tok) in toks.iter().enumerate() {
                rows[r].push(tok);
            }
            on_token(step, &toks);
            if done.iter().all(|d| *d) || step + 1 == budget {
                break;
            }
            // the new token is real for every row (transformers keeps extending the mask)
            let mut grown = Vec::with_capacity(bs * (len + 1));
            for row in mask_host.chunks(len) {
                grown.extend_from_slice(row);
                grown.push(1);
            }
            mask_host = grown;
            len += 1;
            step_ids = Tensor::from_vec(&b, toks, [bs, 1])?;
            step_pos = Tensor::from_vec(&b, next_pos.clone(), [bs, 1])?;
            for p in next_pos.iter_mut() {
                *p += 1;
            }
        }
        Ok(())
    })?;
    Ok(Generation { rows, new_tokens, hit_context })
}

/// Beam search for a decoder-only model (transformers' semantics, see [`beam_search`]) from
/// `ids` `[batch, prompt]`, left-padded where `mask` is 0. Returns per row the prompt and the
/// best hypothesis' new tokens.
pub fn generate_beam<B: Backend, M: CausalLm<B> + Sync + ?Sized>(
    model: &M,
    ids: &Tensor<B>,
    mask: Option<&Tensor<B>>,
    cfg: &BeamConfig,
) -> Result<Vec<Vec<i64>>> {
    if ids.rank() != 2 {
        return Err(Error::invalid("generate", format!("prompt ids must be [batch, seq], got {}", ids.shape())));
    }
    let (bs, t, nb) = (ids.dims()[0], ids.dims()[1], cfg.num_beams.max(1));
    check_context("generate", t, model.max_positions())?;
    let mut cfg = cfg.clone();
    if let Some(ctx) = model.max_positions() {
        cfg.max_new_tokens = cfg.max_new_tokens.min(ctx - t);
    }
    let b = ids.backend().clone();
    let prompt: Vec<Vec<i64>> = ids.to_vec_i64()?.chunks(t).map(<[i64]>::to_vec).collect();
    let mask_rows: Vec<Vec<i64>> = match mask {
        Some(m) => m.to_vec_i64()?.chunks(t).map(<[i64]>::to_vec).collect(),
        None => vec![vec![1; t]; bs],
    };
    // every beam of an item shares its mask and positions
    let mut flat_mask: Vec<Vec<i64>> = mask_rows.iter().flat_map(|r| std::iter::repeat_n(r.clone(), nb)).collect();
    let mut next_pos: Vec<i64> = flat_mask.iter().map(|r| r.iter().filter(|m| **m != 0).count() as i64).collect();
    let mut cache = model.new_cache();
    no_grad(|| {
        beam_search(&prompt, &cfg, |inputs, reorder| {
            if let Some(r) = reorder {
                let idx = Tensor::from_vec(&b, r.iter().map(|&i| i as i64).collect::<Vec<_>>(), [r.len()])?;
                cache.select_rows(&idx)?;
                for row in flat_mask.iter_mut() {
                    row.push(1);
                }
            }
            let n = inputs.len();
            let len = inputs[0].len();
            let pos: Vec<i64> = if reorder.is_none() {
                positions_from_mask(&flat_mask.concat(), len)
            } else {
                let p = next_pos.clone();
                next_pos.iter_mut().for_each(|x| *x += 1);
                p
            };
            let ids = Tensor::from_vec(&b, inputs.concat(), [n, len])?;
            let pos = Tensor::from_vec(&b, pos, [n, len])?;
            let width = flat_mask[0].len();
            let m = Tensor::from_vec(&b, flat_mask.concat(), [n, width])?;
            let logits = on_backend(&b, || model.next_logits(&ids, &m, &pos, &mut cache)?.replicate()?.to_vec_f32())?;
            let v = logits.len() / n;
            Ok(logits.chunks(v).map(<[f32]>::to_vec).collect())
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llama::Llama;
    use redco_core::DType;
    use redco_cpu::Cpu;

    fn tiny_llama(b: &Cpu, eos: &[i64], pad: Option<i64>) -> Llama<Cpu> {
        let json = r#"{"model_type":"llama","hidden_size":16,"intermediate_size":32,"num_hidden_layers":1,
            "num_attention_heads":2,"vocab_size":24,"max_position_embeddings":64}"#;
        let mut cfg = HfConfig::from_json(json).expect("config");
        cfg.eos_token_ids = eos.to_vec();
        cfg.pad_token_id = pad;
        Llama::new(b, &cfg, DType::F32, 3).expect("model")
    }

    #[test]
    fn the_models_config_gives_stop_and_pad_tokens() {
        let b = Cpu::new(1);
        let m = tiny_llama(&b, &[2, 7], None);
        let g = m.generation_config();
        assert_eq!((g.stop_tokens, g.pad_token, g.max_new_tokens), (vec![2, 7], 2, 8));
        assert_eq!(g.sampling, Sampling::Greedy);
        assert_eq!(GenerationConfig::for_model(&tiny_llama(&b, &[2], Some(5)).cfg).pad_token, 5);
        assert_eq!(GenerationConfig::for_model(&tiny_llama(&b, &[], None).cfg), GenerationConfig::default());
        let beams = BeamConfig::for_model(&m.cfg, 3);
        assert_eq!((beams.num_beams, beams.stop_tokens, beams.pad_token), (3, vec![2, 7], 2));
    }

    /// With the model's own config, generation stops a row at the model's end-of-sequence
    /// token (kept) and pads it with that token (no `pad_token_id`) while the others go on.
    #[test]
    fn generate_stops_at_the_models_eos_by_default() {
        let b = Cpu::new(1);
        let ids = Tensor::from_vec(&b, vec![1i64, 4, 9, 1, 11, 3], [2, 3]).expect("ids");
        // the tokens without a stop token; then the first token of row 0 becomes the eos
        let free = generate(&tiny_llama(&b, &[], None), &ids, None, &GenerationConfig::default()).expect("generate");
        assert_eq!(free.new_tokens, [8, 8]);
        let eos = free.rows[0][3];
        let m = tiny_llama(&b, &[eos], None);
        let g = generate(&m, &ids, None, &m.generation_config()).expect("generate");
        let row1 = &free.rows[1][3..];
        let stop1 = row1.iter().position(|&t| t == eos).map_or(8, |i| i + 1);
        assert_eq!(g.new_tokens, [1, stop1]);
        let len = 3 + stop1;
        assert_eq!(g.rows[0][..4], free.rows[0][..4]);
        assert!(g.rows[0][4..].iter().all(|&t| t == eos), "{:?}", g.rows[0]);
        assert_eq!(g.rows[1], free.rows[1][..len]);
        assert!(g.rows.iter().all(|r| r.len() == len));
        // streaming sees the same tokens
        let mut seen = Vec::new();
        let s = generate_with(&m, &ids, None, &m.generation_config(), |_, t| seen.push(t.to_vec())).expect("stream");
        assert_eq!(s, g);
        assert_eq!(seen.len(), stop1);
        assert!(seen.iter().enumerate().all(|(i, t)| t[0] == g.rows[0][3 + i] && t[1] == g.rows[1][3 + i]));
    }
}
