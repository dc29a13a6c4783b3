//! Beam search as transformers 5 runs it (`GenerationMixin._beam_search`): per batch item,
//! the `2 * beams` best continuations of all running beams by accumulated log-probability;
//! those that end (a stop token, or the length limit) among the best `beams` become finished
//! hypotheses scored `sum_logprobs / new_len ** length_penalty`; the best `beams` unfinished
//! ones keep running. With `early_stopping`, an item is done once it holds `beams` finished
//! hypotheses; otherwise when no running beam can beat the worst finished one. Scores are
//! kept in f32, as torch does, so near-ties break the same way.

use crate::hf::config::HfConfig;
use redco_core::{Error, Result};

/// Beam-search options.
#[derive(Debug, Clone, PartialEq)]
pub struct BeamConfig {
    /// Beams per batch item.
    pub num_beams: usize,
    /// New tokens at most.
    pub max_new_tokens: usize,
    /// Finished scores are divided by `new_len ** length_penalty`.
    pub length_penalty: f64,
    /// Stop an item as soon as it has `num_beams` finished hypotheses.
    pub early_stopping: bool,
    /// Tokens that end a hypothesis.
    pub stop_tokens: Vec<i64>,
    /// The padding id (what transformers fills unused positions with: the pad id, or the
    /// first stop token when the pad id is 0).
    pub pad_token: i64,
}

impl BeamConfig {
    /// Beam search with `num_beams` beams and a model's defaults, as transformers takes them
    /// from `config.json` / `generation_config.json`: 8 new tokens (as
    /// [`GenerationConfig::default`](super::GenerationConfig)), length penalty 1, no early
    /// stopping, stop at any of `cfg.eos_token_ids`, pad with `cfg.pad_token_id`, or else the
    /// first end-of-sequence token, or else 0.
    pub fn for_model(cfg: &HfConfig, num_beams: usize) -> Self {
        let g = super::GenerationConfig::for_model(cfg);
        BeamConfig {
            num_beams,
            max_new_tokens: g.max_new_tokens,
            length_penalty: 1.0,
            early_stopping: false,
            stop_tokens: g.stop_tokens,
            pad_token: g.pad_token,
        }
    }
}

const NEG: f32 = -1.0e9;

fn log_softmax(x: &[f32]) -> Vec<f32> {
    let m = x.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let s: f32 = x.iter().map(|v| (v - m).exp()).sum();
    let ls = s.ln();
    x.iter().map(|v| v - m - ls).collect()
}

/// Indices of the `k` largest values, largest first (the first index on ties).
fn topk(v: &[f32], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by(|&a, &b| v[b].total_cmp(&v[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

/// Runs beam search for `batch` items whose decoder prompts are `prompt` (one row per item,
/// the same length). `step(last_tokens, reorder)` must first reorder its cache rows by
/// `reorder` (flat `batch * beams` source rows; `None` on the first call, when every item's
/// beams share the prompt) and then return the logits `[batch * beams][vocab]` of the next
/// token after `last_tokens` (one per flat row; the whole prompt on the first call).
/// Returns the best hypothesis of each item: prompt + new tokens, padded to the longest.
pub fn beam_search(
    prompt: &[Vec<i64>],
    cfg: &BeamConfig,
    mut step: impl FnMut(&[Vec<i64>], Option<&[usize]>) -> Result<Vec<Vec<f32>>>,
) -> Result<Vec<Vec<i64>>> {
    let nb = cfg.num_beams;
    if nb == 0 {
        return Err(Error::invalid("beam search", "num_beams must be at least 1"));
    }
    let batch = prompt.len();
    let plen = prompt.first().map_or(0, Vec::len);
    let max_len = plen + cfg.max_new_tokens;
    let keep = 2.max(1 + cfg.stop_tokens.len()) * nb;
    let fill = if cfg.pad_token != 0 { cfg.pad_token } else { cfg.stop_tokens.first().copied().unwrap_or(0) };
    let mut running: Vec<Vec<Vec<i64>>> = prompt.iter().map(|p| vec![p.clone(); nb]).collect();
    let mut run_scores: Vec<Vec<f32>> =
        (0..batch).map(|_| (0..nb).map(|j| if j == 0 { 0.0 } else { NEG }).collect()).collect();
    let mut done_seqs: Vec<Vec<Vec<i64>>> = running.clone();
    let mut done_scores: Vec<Vec<f32>> = vec![vec![NEG; nb]; batch];
    let mut done_flag: Vec<Vec<bool>> = vec![vec![false; nb]; batch];
    let mut improvable = vec![true; batch];
    let mut cur = plen;
    let mut reorder: Option<Vec<usize>> = None;
    let mut first = true;
    while cur < max_len {
        let inputs: Vec<Vec<i64>> = if first {
            running.iter().flatten().cloned().collect()
        } else {
            running.iter().flatten().map(|s| vec![s[s.len() - 1]]).collect()
        };
        let logits = step(&inputs, reorder.as_deref())?;
        first = false;
        if logits.len() != batch * nb {
            return Err(Error::invalid("beam search", format!("{} logit rows for {} beams", logits.len(), batch * nb)));
        }
        let vocab = logits[0].len();
        let mut next_reorder = Vec::with_capacity(batch * nb);
        let mut all_hit = true;
        for b in 0..batch {
            // accumulated log-probabilities of every (beam, token)
            let mut acc = Vec::with_capacity(nb * vocab);
            for j in 0..nb {
                let lp = log_softmax(&logits[b * nb + j]);
                acc.extend(lp.iter().map(|v| v + run_scores[b][j]));
            }
            let top = topk(&acc, keep);
            let cand: Vec<(usize, i64, f32)> = top.iter().map(|&i| (i / vocab, (i % vocab) as i64, acc[i])).collect();
            let hits: Vec<bool> =
                cand.iter().map(|&(_, t, _)| cfg.stop_tokens.contains(&t) || cur + 1 >= max_len).collect();
            all_hit &= hits.iter().all(|h| *h);
            let seq_of = |&(j, t, _): &(usize, i64, f32)| {
                let mut s = running[b][j].clone();
                s.push(t);
                s
            };
            // running beams: the best unfinished continuations
            let live: Vec<f32> = cand.iter().zip(&hits).map(|(c, h)| if *h { c.2 + NEG } else { c.2 }).collect();
            let sel = topk(&live, nb);
            let new_running: Vec<Vec<i64>> = sel.iter().map(|&k| seq_of(&cand[k])).collect();
            let new_scores: Vec<f32> = sel.iter().map(|&k| live[k]).collect();
            next_reorder.extend(sel.iter().map(|&k| b * nb + cand[k].0));
            // finished hypotheses: merge the old ones with the newly ended among the best nb
            let full = done_flag[b].iter().all(|f| *f) && cfg.early_stopping;
            let pen = ((cur + 1 - plen) as f32).powf(cfg.length_penalty as f32);
            let mut merged_scores = done_scores[b].clone();
            let mut merged: Vec<(Vec<i64>, bool)> =
                done_seqs[b].iter().cloned().zip(done_flag[b].iter().cloned()).collect();
            for (k, c) in cand.iter().enumerate() {
                let just = hits[k] && k < nb;
                let mut s = c.2 / pen;
                if full {
                    s += NEG;
                }
                if !improvable[b] {
                    s += NEG;
                }
                if !just {
                    s += NEG;
                }
                merged_scores.push(s);
                merged.push((seq_of(c), just));
            }
            let best = topk(&merged_scores, nb);
            done_seqs[b] = best.iter().map(|&k| merged[k].0.clone()).collect();
            done_flag[b] = best.iter().map(|&k| merged[k].1).collect();
            done_scores[b] = best.iter().map(|&k| merged_scores[k]).collect();
            running[b] = new_running;
            run_scores[b] = new_scores;
        }
        cur += 1;
        // can a running beam still beat the worst finished hypothesis?
        for b in 0..batch {
            let best_possible = run_scores[b][0] / ((cur - plen) as f32).powf(cfg.length_penalty as f32);
            let worst = done_scores[b].iter().cloned().fold(f32::INFINITY, f32::min);
            let any = done_flag[b].iter().any(|&f| best_possible > if f { worst } else { NEG });
            improvable[b] &= any;
        }
        let open = !(done_flag.iter().all(|f| f.iter().all(|x| *x)) && cfg.early_stopping);
        if !(improvable.iter().any(|x| *x) && open && !all_hit) {
            break;
        }
        reorder = Some(next_reorder);
    }
    // the best hypothesis per item, trimmed to the longest and filled
    let best: Vec<Vec<i64>> = done_seqs.into_iter().map(|mut s| s.swap_remove(0)).collect();
    let len = best.iter().map(Vec::len).max().unwrap_or(plen);
    Ok(best
        .into_iter()
        .map(|mut s| {
            s.resize(len, fill);
            s
        })
        .collect())
}
