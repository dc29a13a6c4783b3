//! Generation as a serving engine runs it: each row's real tokens (its padding left out) are
//! one segment of a ragged batch ([`CausalLm::ragged_logits`]), and each layer's keys and
//! values go in place into rows of one pool per layer ([`Tensor::write_rows`]), read by
//! [`Tensor::paged_attention`]. A decode step then writes one row per sequence and reads the
//! cached rows where they are: no copy of the cache per token (a cache grown by
//! concatenation copies every cached position at every step), and finished rows leave the
//! batch instead of running on padding.
//!
//! Every row owns a region of `stride` consecutive pool rows; the pools grow (doubling, up
//! to the longest row's need) when a row outgrows its region.

use super::{CausalLm, Generation, GenerationConfig};
use redco_core::ops::paged_attention::PagedSegment;
use redco_core::runtime::on_backend;
use redco_core::{no_grad, Backend, Error, MeshAxis, Placement, Result, Tensor};

/// The pool rows first given to each row's new tokens, when the budget is larger.
const FIRST_NEW_ROWS: usize = 32;

/// Per layer, keys and values `[rows * stride, kv_heads, head_dim]` (made at the layer's
/// first write, with the shapes and dtype its projections give: under tensor parallelism a
/// rank's heads).
struct RowsKv<B: Backend> {
    rows: usize,
    stride: usize,
    limit: usize,
    layers: Vec<Option<(Tensor<B>, Tensor<B>)>>,
}

impl<B: Backend> RowsKv<B> {
    /// Pools for `rows` rows of at most `limit` positions each, over `layers` layers, first
    /// holding `first` positions a row.
    fn new(rows: usize, first: usize, limit: usize, layers: usize) -> Self {
        RowsKv { rows, stride: first.min(limit), limit, layers: (0..layers).map(|_| None).collect() }
    }

    /// The pool rows of positions `start..start + n` of row `r`.
    fn slots(&self, r: usize, start: usize, n: usize) -> impl Iterator<Item = usize> {
        let base = r * self.stride;
        (base + start)..(base + start + n)
    }

    /// Makes room for `need` positions in every row's region: the pools grow, each row's
    /// cached positions moving with its region.
    fn reserve(&mut self, need: usize) -> Result<()> {
        if need <= self.stride {
            return Ok(());
        }
        if need > self.limit {
            return Err(Error::invalid("generate", format!("{need} positions past the {} planned", self.limit)));
        }
        let grown = (2 * self.stride).max(need).min(self.limit);
        let (rows, stride) = (self.rows, self.stride);
        let widen = |p: &Tensor<B>| -> Result<Tensor<B>> {
            let (h, d) = (p.dims()[1], p.dims()[2]);
            let room = Tensor::zeros(p.backend(), [rows, grown - stride, h, d], p.dtype())?;
            Tensor::cat(&[&p.reshape([rows, stride, h, d])?, &room], 1)?.reshape([rows * grown, h, d])
        };
        for (k, v) in self.layers.iter_mut().flatten() {
            *k = widen(k)?;
            *v = widen(v)?;
        }
        self.stride = grown;
        Ok(())
    }

    /// Writes the batch's keys and values `k`, `v` (`[1, kv_heads, T, head_dim]`, a rank's
    /// local heads) of layer `layer` to pool rows `written`, then attends the queries `q`
    /// over each segment's rows (a step of whole prompts over their own new keys).
    fn attend(
        &mut self,
        layer: usize,
        (q, k, v): (&Tensor<B>, &Tensor<B>, &Tensor<B>),
        written: &[usize],
        segments: &[PagedSegment],
        scale: f64,
    ) -> Result<Tensor<B>> {
        let n = self.layers.len();
        let (rows, stride) = (self.rows, self.stride);
        let slot =
            self.layers.get_mut(layer).ok_or_else(|| Error::invalid("generate", format!("layer {layer} of {n}")))?;
        let (h, d, t) = (k.dims()[1], k.dims()[3], k.dims()[2]);
        if slot.is_none() {
            let pool = || Tensor::zeros(k.backend(), [rows * stride, h, d], k.dtype());
            *slot = Some((pool()?, pool()?));
        }
        let (kp, vp) = slot.as_mut().expect("made above");
        kp.write_rows(written, &k.transpose(1, 2)?.reshape([t, h, d])?)?;
        vp.write_rows(written, &v.transpose(1, 2)?.reshape([t, h, d])?)?;
        if segments.iter().all(|s| s.q_len == s.slots.len()) {
            // prompts whole (the first step): each one's causal attention over its own keys,
            // the fused attention's products instead of a dot a query and key
            if let [_] = segments {
                return q.attention(k, v, None, true, scale);
            }
            let outs = segments
                .iter()
                .map(|s| {
                    let own = |x: &Tensor<B>| x.narrow(2, s.q_start, s.q_len);
                    own(q)?.attention(&own(k)?, &own(v)?, None, true, scale)
                })
                .collect::<Result<Vec<_>>>()?;
            return Tensor::cat(&outs.iter().collect::<Vec<_>>(), 2);
        }
        q.paged_attention(kp, vp, segments, scale)
    }
}

/// A rank's local part of `x` as a tensor of its own (under tensor parallelism, its heads).
fn local<B: Backend>(x: &Tensor<B>) -> Tensor<B> {
    Tensor::from_storage(x.backend(), x.storage().clone(), x.local_shape().clone(), x.dtype())
}

/// `q`, `k`, `v` as attention may read each rank's part of them: as they are when the
/// queries and the keys are split over `mp` alike, all whole otherwise (key/value heads that
/// `mp` does not divide stay whole while the query heads split: a rank's query heads would
/// then meet the wrong key heads; the whole attention runs on every rank, as
/// [`Tensor::attention`] does in that case).
pub fn heads_together<B: Backend>(
    q: Tensor<B>,
    k: Tensor<B>,
    v: Tensor<B>,
) -> Result<(Tensor<B>, Tensor<B>, Tensor<B>)> {
    let mp = |x: &Tensor<B>| x.placements().get(MeshAxis::Mp);
    if mp(&q) == mp(&k) && mp(&k) == mp(&v) {
        return Ok((q, k, v));
    }
    Ok((q.replicate()?, k.replicate()?, v.replicate()?))
}

/// Generates from `real` (each row's tokens without padding, none empty) as
/// [`super::generate_with`] does for `prompt` (the rows as given, padding included, of
/// length `t`), for at most `budget` new tokens.
pub(super) fn generate_ragged<B: Backend, M: CausalLm<B> + Sync + ?Sized>(
    model: &M,
    b: &B,
    (mut rows, real): (Vec<Vec<i64>>, Vec<Vec<i64>>),
    (budget, hit_context): (usize, bool),
    cfg: &GenerationConfig,
    on_token: &mut dyn FnMut(usize, &[i64]),
) -> Result<Generation> {
    let bs = rows.len();
    let longest = real.iter().map(Vec::len).max().unwrap_or(0);
    let c = model.config();
    let mut kv = RowsKv::new(bs, longest + budget.min(FIRST_NEW_ROWS), longest + budget, c.layers);
    let scale = 1.0 / (c.head_dim as f64).sqrt();
    // per row: positions cached, and its tokens for the next step
    let mut cached = vec![0usize; bs];
    let mut pending: Vec<Vec<i64>> = real;
    let mut done = vec![false; bs];
    let mut new_tokens = vec![0; bs];
    no_grad(|| {
        for step in 0..budget {
            let active: Vec<usize> = (0..bs).filter(|&r| !done[r]).collect();
            let (mut ids, mut pos, mut want, mut written, mut segments) =
                (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::with_capacity(active.len()));
            kv.reserve(active.iter().map(|&r| cached[r] + pending[r].len()).max().unwrap_or(0))?;
            for &r in &active {
                let (start, n) = (cached[r], pending[r].len());
                segments.push(PagedSegment {
                    q_start: ids.len(),
                    q_len: n,
                    slots: kv.slots(r, 0, start + n).collect(),
                });
                ids.extend_from_slice(&pending[r]);
                pos.extend((start..start + n).map(|p| p as i64));
                written.extend(kv.slots(r, start, n));
                want.push(ids.len() - 1);
            }
            let t = ids.len();
            let ids = Tensor::from_vec(b, ids, [1, t])?;
            let pos = Tensor::from_vec(b, pos, [1, t])?;
            let mut attend = |layer: usize, q: Tensor<B>, k: Tensor<B>, v: Tensor<B>| -> Result<Tensor<B>> {
                if [&q, &k, &v].iter().any(|x| x.placements().get(MeshAxis::Dp) != Placement::Replicate) {
                    return Err(Error::unsupported("generate", "attention split over dp"));
                }
                let (q, k, v) = heads_together(q, k, v)?;
                let out = kv.attend(layer, (&local(&q), &local(&k), &local(&v)), &written, &segments, scale)?;
                if !q.is_sharded() {
                    return Ok(out);
                }
                let (shape, placed) = (q.shape().clone(), q.placements());
                Ok(Tensor::from_local(
                    q.backend(),
                    out.storage().clone(),
                    shape,
                    out.shape().clone(),
                    placed,
                    out.dtype(),
                ))
            };
            // one hand-off to the backend's threads per step, not one per op
            let (host, width) = on_backend(b, || -> Result<(Vec<f32>, usize)> {
                let logits = model.ragged_logits(&ids, &pos, &want, &mut attend)?.replicate()?;
                Ok((logits.to_vec_f32()?, logits.dims()[1]))
            })?;
            let mut toks = vec![cfg.pad_token; bs];
            for (&r, logits) in active.iter().zip(host.chunks(width)) {
                new_tokens[r] += 1;
                let tok = cfg.sampling.choose(logits, (step * bs + r) as u64)? as i64;
                done[r] = cfg.stop_tokens.contains(&tok);
                cached[r] += pending[r].len();
                pending[r] = vec![tok];
                toks[r] = tok;
            }
            for (row, &tok) in rows.iter_mut().zip(&toks) {
                row.push(tok);
            }
            on_token(step, &toks);
            if done.iter().all(|d| *d) {
                break;
            }
        }
        Ok(())
    })?;
    Ok(Generation { rows, new_tokens, hit_context })
}

#[cfg(test)]
mod tests {
    use super::super::{generate, generate_with, GenerationConfig, Padded, Sampling};
    use super::*;
    use crate::hf::config::HfConfig;
    use crate::llama::Llama;
    use redco_core::DType;
    use redco_cpu::Cpu;

    /// A left-padded batch of three prompts gives the padded run's tokens, greedy and
    /// sampled, through 40 new tokens (the pools grow past their first 32 new rows), with a
    /// row that stops early leaving the batch; the streamed tokens are the rows'.
    #[test]
    fn ragged_generation_gives_the_padded_runs_tokens() {
        let b = Cpu::new(2);
        let json = r#"{"model_type":"llama","hidden_size":32,"intermediate_size":64,"num_hidden_layers":2,
            "num_attention_heads":4,"num_key_value_heads":2,"vocab_size":40,"max_position_embeddings":64}"#;
        let m = Llama::new(&b, &HfConfig::from_json(json).unwrap(), DType::F32, 11).unwrap();
        let ids = Tensor::from_vec(&b, vec![0i64, 0, 5, 9, 3, 7, 1, 12, 0, 0, 0, 22], [3, 4]).unwrap();
        let mask = Tensor::from_vec(&b, vec![0i64, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0, 1], [3, 4]).unwrap();
        let free = GenerationConfig { max_new_tokens: 40, ..GenerationConfig::default() };
        let want = generate(&Padded(&m), &ids, Some(&mask), &free).unwrap();
        let got = generate(&m, &ids, Some(&mask), &free).unwrap();
        assert_eq!(got, want);
        assert_eq!(got.new_tokens, [40, 40, 40]);
        // row 1 stops at its fifth token; the others go on as before
        let stop = want.rows[1][4 + 4];
        let stopping = GenerationConfig { stop_tokens: vec![stop], pad_token: 39, ..free.clone() };
        let want = generate(&Padded(&m), &ids, Some(&mask), &stopping).unwrap();
        let mut seen = Vec::new();
        let got = generate_with(&m, &ids, Some(&mask), &stopping, |_, t| seen.push(t.to_vec())).unwrap();
        assert_eq!(got, want);
        assert!(got.new_tokens[1] <= 5, "{:?}", got.new_tokens);
        assert!(seen.iter().enumerate().all(|(i, t)| (0..3).all(|r| t[r] == got.rows[r][4 + i])));
        let sampled = GenerationConfig {
            sampling: Sampling::Sample { temperature: 0.8, top_k: None, top_p: None, seed: 7 },
            ..free
        };
        assert_eq!(
            generate(&m, &ids, Some(&mask), &sampled).unwrap(),
            generate(&Padded(&m), &ids, Some(&mask), &sampled).unwrap()
        );
    }

    /// The pools grow by whole regions: each row's cached rows keep their positions.
    #[test]
    fn growing_pools_keep_each_rows_positions() {
        let b = Cpu::new(1);
        let mut kv: RowsKv<Cpu> = RowsKv::new(2, 2, 5, 1);
        let k = Tensor::from_vec(&b, vec![1.0f32, 2.0, 3.0, 4.0], [1, 1, 4, 1]).unwrap();
        let written: Vec<usize> = kv.slots(0, 0, 2).chain(kv.slots(1, 0, 2)).collect();
        let segs = [
            PagedSegment { q_start: 0, q_len: 2, slots: kv.slots(0, 0, 2).collect() },
            PagedSegment { q_start: 2, q_len: 2, slots: kv.slots(1, 0, 2).collect() },
        ];
        kv.attend(0, (&k, &k, &k), &written, &segs, 1.0).unwrap();
        kv.reserve(5).unwrap();
        assert_eq!(kv.stride, 5);
        let (pool, _) = kv.layers[0].as_ref().unwrap();
        assert_eq!(pool.to_vec_f32().unwrap(), [1.0, 2.0, 0.0, 0.0, 0.0, 3.0, 4.0, 0.0, 0.0, 0.0]);
        assert!(kv.reserve(6).unwrap_err().to_string().contains("6 positions past the 5"));
    }
}
