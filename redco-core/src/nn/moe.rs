//! A sparse mixture-of-experts feed-forward block (Mixtral's `block_sparse_moe`, Qwen3-MoE's
//! `mlp`): a linear router scores the experts, each token goes to its `top_k` best (softmax
//! in f32, optionally renormalised over the chosen ones), and every expert is a gated MLP.
//!
//! The experts run as experts: the token slots are sorted by expert on the host (the router's
//! choice is a host decision, as the counts of each group are), and each projection is one
//! [`Tensor::grouped_matmul`] over all experts' segments. The outputs are scaled by their
//! routing weights and summed back per token with `index_add`.

use super::{Activation, Linear};
use crate::ops::grouped_matmul::group_by_expert;
use crate::{Backend, DType, Error, Result, Tensor};

/// The expert weights of a [`SparseMoe`], stacked over experts in the Linear layout.
///
/// Their parameter names are `names` (under the block's `experts`), with a `*` where a
/// checkpoint names the expert: `*.w1.weight` is the stacked `[E, ..]` tensor that a
/// Hugging Face file holds as `0.w1.weight`, `1.w1.weight`, … (the loaders stack them, and
/// `save_pretrained` cuts them apart again).
#[derive(Debug, Clone)]
pub struct Experts<B: Backend> {
    /// Gate projections `[E, intermediate, hidden]` (Mixtral's `w1`).
    pub gate: Tensor<B>,
    /// Up projections `[E, intermediate, hidden]` (Mixtral's `w3`).
    pub up: Tensor<B>,
    /// Down projections `[E, hidden, intermediate]` (Mixtral's `w2`).
    pub down: Tensor<B>,
    /// The names of `gate`, `up` and `down` (e.g. `*.w1.weight`, `*.w3.weight`,
    /// `*.w2.weight` for Mixtral).
    pub names: [&'static str; 3],
}

impl<B: Backend> super::Module<B> for Experts<B> {
    fn visit(&self, p: &str, f: &mut dyn FnMut(&str, &Tensor<B>)) {
        for (t, n) in [&self.gate, &self.up, &self.down].into_iter().zip(self.names) {
            super::Module::visit(t, &super::join(p, n), f);
        }
    }
    fn visit_mut(&mut self, p: &str, f: &mut dyn FnMut(&str, &mut Tensor<B>)) {
        let names = self.names;
        for (t, n) in [&mut self.gate, &mut self.up, &mut self.down].into_iter().zip(names) {
            super::Module::visit_mut(t, &super::join(p, n), f);
        }
    }
}

/// A sparse mixture-of-experts block.
#[derive(Debug, Clone)]
pub struct SparseMoe<B: Backend> {
    /// The router: `[E, hidden]`, no bias.
    pub router: Linear<B>,
    /// The experts.
    pub experts: Experts<B>,
    /// Experts per token.
    pub top_k: usize,
    /// Renormalise the chosen experts' probabilities to sum to one (Mixtral always does;
    /// Qwen3-MoE's `norm_topk_prob`).
    pub norm_topk_prob: bool,
    /// The experts' gate activation.
    pub act: Activation,
}

crate::module!(SparseMoe { router: "gate", experts: "experts" });

/// What one block's router did, for the auxiliary losses.
#[derive(Debug, Clone)]
pub struct RouterStats<B: Backend> {
    /// Tokens counted (all of them, or those the keep flags mark).
    pub tokens: usize,
    /// `chosen[j * E + e]`: how many tokens had expert `e` as their `j`-th choice.
    pub chosen: Vec<usize>,
    /// The router's probabilities summed over tokens, `[E]` (f32, or f64 for an f64 model;
    /// differentiable).
    pub prob_sum: Tensor<B>,
    /// The squared log-sum-exp of the router logits summed over tokens (a scalar, f32): the
    /// router z-loss's numerator.
    pub z_sum: Tensor<B>,
}

impl<B: Backend> SparseMoe<B> {
    /// Experts in the block.
    pub fn num_experts(&self) -> usize {
        self.experts.gate.dims()[0]
    }

    /// The block over `x [.., hidden]`; returns its output (same shape) and the router's
    /// statistics over every token.
    pub fn forward(&self, x: &Tensor<B>) -> Result<(Tensor<B>, RouterStats<B>)> {
        self.forward_counting(x, None)
    }

    /// [`SparseMoe::forward`] whose statistics count only the tokens `keep` marks (one flag
    /// per token of `x`, in order: the attention mask, as transformers' load-balancing loss
    /// leaves padding out). Every token is still routed and computed.
    pub fn forward_counting(&self, x: &Tensor<B>, keep: Option<&[bool]>) -> Result<(Tensor<B>, RouterStats<B>)> {
        let dims = x.dims().to_vec();
        let h = *dims.last().ok_or_else(|| Error::invalid("moe", "the input has no hidden dimension"))?;
        let t = x.elem_count() / h.max(1);
        let (e, k) = (self.num_experts(), self.top_k);
        if k == 0 || k > e {
            return Err(Error::config("moe", format!("{k} experts per token of {e}")));
        }
        if keep.is_some_and(|k| k.len() != t) {
            return Err(Error::invalid("moe", format!("{} token flags for {t} tokens", keep.map_or(0, <[bool]>::len))));
        }
        let kept = |r: usize| keep.is_none_or(|k| k[r]);
        let x2 = x.reshape([t, h])?;
        // the router in f32 (as transformers computes it) or wider
        let logits = self.router.forward(&x2)?;
        let logits = if logits.dtype() == DType::F64 { logits } else { logits.cast(DType::F32)? };
        let probs = logits.softmax(-1)?;
        // the choice is the host's: the top k of each row (ties to the lower index)
        let host = probs.to_vec_f64()?;
        let mut chosen_ids = Vec::with_capacity(t * k);
        let mut chosen = vec![0usize; k * e];
        for (r, row) in host.chunks(e).enumerate() {
            let mut idx: Vec<usize> = (0..e).collect();
            idx.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
            for (j, &i) in idx[..k].iter().enumerate() {
                chosen_ids.push(i as i64);
                if kept(r) {
                    chosen[j * e + i] += 1;
                }
            }
        }
        let b = x.backend();
        let ids = Tensor::from_vec(b, chosen_ids.clone(), [t, k])?;
        let mut weights = probs.gather(&ids, -1)?;
        if self.norm_topk_prob {
            weights = weights.div(&weights.sum(-1, true)?)?;
        }
        // slot s = token * k + j; grouped by expert
        let experts: Vec<usize> = chosen_ids.iter().map(|&i| i as usize).collect();
        let (counts, order) = group_by_expert(&experts, e)?;
        let tokens_of: Vec<i64> = order.iter().map(|&s| (s / k) as i64).collect();
        let slots: Vec<i64> = order.iter().map(|&s| s as i64).collect();
        let tok = Tensor::from_vec(b, tokens_of, [t * k])?;
        let xs = x2.index_select(&tok, 0)?;
        let g = self.act.forward(&xs.grouped_matmul(&self.experts.gate, &counts, true)?)?;
        let u = xs.grouped_matmul(&self.experts.up, &counts, true)?;
        let y = g.mul(&u)?.grouped_matmul(&self.experts.down, &counts, true)?;
        let w = weights.reshape([t * k])?.index_select(&Tensor::from_vec(b, slots, [t * k])?, 0)?;
        let y = y.mul(&w.cast(y.dtype())?.reshape([t * k, 1])?)?;
        let out = Tensor::zeros(b, [t, h], y.dtype())?.index_add(&tok, &y, 0)?;
        // log-sum-exp of each row: any logit minus its log-probability
        let lse = logits.sub(&logits.log_softmax(-1)?)?.narrow(1, 0, 1)?;
        let (tokens, prob_sum, z_sum) = match keep {
            None => (t, probs.sum(0, false)?, lse.square()?.sum_all()?),
            Some(k) => {
                let flags: Vec<f64> = k.iter().map(|&f| if f { 1.0 } else { 0.0 }).collect();
                let m = Tensor::from_host(b, &crate::HostData::from_f64(&flags, probs.dtype()), [t, 1])?;
                (k.iter().filter(|&&f| f).count(), probs.mul(&m)?.sum(0, false)?, lse.square()?.mul(&m)?.sum_all()?)
            }
        };
        let stats = RouterStats { tokens, chosen, prob_sum, z_sum };
        Ok((out.reshape(dims)?, stats))
    }
}

/// transformers' load-balancing loss (`load_balancing_loss_func` without a mask) over the
/// blocks' statistics, as if their router logits were concatenated:
/// `E * sum_{j,e} f[j,e] * p[e]`, with `f` the fraction of tokens whose `j`-th choice is `e`
/// and `p` the mean router probability of `e`. Scale it by `router_aux_loss_coef` and add it to the loss.
pub fn load_balancing_loss<B: Backend>(stats: &[RouterStats<B>], num_experts: usize) -> Result<Tensor<B>> {
    let first = stats.first().ok_or_else(|| Error::invalid("load_balancing_loss", "no router statistics"))?;
    let n: usize = stats.iter().map(|s| s.tokens).sum();
    let k = first.chosen.len() / num_experts.max(1);
    let mut frac = vec![0.0f64; num_experts];
    for s in stats {
        if s.chosen.len() != k * num_experts {
            return Err(Error::invalid("load_balancing_loss", "blocks with different expert counts"));
        }
        for (i, &c) in s.chosen.iter().enumerate() {
            frac[i % num_experts] += c as f64 / n.max(1) as f64;
        }
    }
    let mut p = first.prob_sum.clone();
    for s in &stats[1..] {
        p = p.add(&s.prob_sum)?;
    }
    let b = p.backend().clone();
    let f = Tensor::from_host(&b, &crate::HostData::from_f64(&frac, p.dtype()), [num_experts])?;
    p.scale(1.0 / n.max(1) as f64)?.mul(&f)?.sum_all()?.scale(num_experts as f64)
}

/// The router z-loss (ST-MoE): the mean over tokens of the squared log-sum-exp of the
/// router logits, over every block.
pub fn router_z_loss<B: Backend>(stats: &[RouterStats<B>]) -> Result<Tensor<B>> {
    let first = stats.first().ok_or_else(|| Error::invalid("router_z_loss", "no router statistics"))?;
    let n: usize = stats.iter().map(|s| s.tokens).sum();
    let mut z = first.z_sum.clone();
    for s in &stats[1..] {
        z = z.add(&s.z_sum)?;
    }
    z.scale(1.0 / n.max(1) as f64)
}
