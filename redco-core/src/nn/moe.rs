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
use crate::{Backend, DType, Error, MeshAxis, Placement, Placements, Result, Shape, Tensor};

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
    /// The capacity factor (`None`: dropless, the default, and what generation and
    /// serving use). Each expert then takes at most `ceil(factor * t * top_k / E)` of a
    /// rank's `t` tokens' slots in a forward (GShard's and DeepSpeed-MoE's per-group
    /// capacity): first choices before second ones, each in token order; a dropped slot
    /// contributes nothing (its token keeps the residual and its other experts, their
    /// weights unchanged), and is counted in [`RouterStats::dropped`].
    pub capacity_factor: Option<f64>,
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
    /// Slots of the counted tokens dropped by the capacity factor (0 when dropless; of
    /// `tokens * top_k`).
    pub dropped: usize,
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
    /// per token of `x`, in order, or per token of this rank's piece of `x`: the attention
    /// mask, as transformers' load-balancing loss leaves padding out). Every token is still
    /// routed and computed.
    ///
    /// Under a mesh the block computes on each rank's tokens ([`Tensor::to_local`]): with
    /// the experts split over `dp` (expert parallelism: the stacked weights split on their
    /// expert dim) each rank sends every token slot to the rank holding its expert and gets
    /// the outputs back, two [`Tensor::all_to_all_rows`] per block; the statistics are
    /// summed over the ranks whose tokens differ.
    pub fn forward_counting(&self, x: &Tensor<B>, keep: Option<&[bool]>) -> Result<(Tensor<B>, RouterStats<B>)> {
        let dims = x.dims().to_vec();
        let h = *dims.last().ok_or_else(|| Error::invalid("moe", "the input has no hidden dimension"))?;
        let t = x.elem_count() / h.max(1);
        let (e, k) = (self.num_experts(), self.top_k);
        if k == 0 || k > e {
            return Err(Error::config("moe", format!("{k} experts per token of {e}")));
        }
        let local_t = x.local_shape().elem_count() / h.max(1);
        if keep.is_some_and(|k| k.len() != t && k.len() != local_t) {
            return Err(Error::invalid("moe", format!("{} token flags for {t} tokens", keep.map_or(0, <[bool]>::len))));
        }
        let x2 = x.reshape([t, h])?;
        let ws = [&self.experts.gate, &self.experts.up, &self.experts.down];
        if !x2.is_sharded() && !self.router.weight.is_sharded() && ws.iter().all(|w| !w.is_sharded()) {
            let (out, stats) = self.local((&x2, None), self.router.forward(&x2)?, ws, keep, None)?;
            return Ok((out.reshape(dims)?, stats));
        }
        self.sharded(&x2, keep).and_then(|(out, stats)| Ok((out.reshape(dims)?, stats)))
    }

    /// The block on a mesh: each rank's tokens and weights as local tensors, the experts
    /// possibly split over `dp`.
    fn sharded(&self, x2: &Tensor<B>, keep: Option<&[bool]>) -> Result<(Tensor<B>, RouterStats<B>)> {
        if self.router.bias.is_some() || self.router.lora.is_some() {
            return Err(Error::unsupported("moe", "a router with a bias or an adapter under a mesh"));
        }
        // tokens split over mp are gathered: the block is replicated along mp
        let x2 = match x2.placements().get(MeshAxis::Mp) {
            Placement::Shard(_) => x2.redistribute(x2.placements().with(MeshAxis::Mp, Placement::Replicate))?,
            _ => x2.clone(),
        };
        let split = matches!(x2.placements().get(MeshAxis::Dp), Placement::Shard(0));
        if !split && matches!(x2.placements().get(MeshAxis::Dp), Placement::Shard(_)) {
            return Err(Error::unsupported("moe", "tokens split over dp along the hidden dimension"));
        }
        let differs: &[MeshAxis] = if split { &[MeshAxis::Dp] } else { &[] };
        let (pos, n) = crate::sharding::mesh_position::<B>(MeshAxis::Dp);
        let e = self.num_experts();
        let ep = match self.experts.gate.placements().get(MeshAxis::Dp) {
            Placement::Shard(0) => Some((pos, n)),
            Placement::Replicate => None,
            other => return Err(Error::unsupported("moe", format!("experts placed {other:?} over dp"))),
        };
        if ep.is_some() && !e.is_multiple_of(n) {
            return Err(Error::config("moe", format!("{e} experts do not split over {n} ranks")));
        }
        if ep.is_some() && !split && n > 1 && crate::is_grad_enabled() && x2.requires_grad() {
            // every rank would send the same slots to an expert's rank: its gradient would
            // count them n times
            return Err(Error::unsupported(
                "moe",
                "training experts split over dp on tokens replicated over dp: split the batch over dp \
                 (the trainer does), or run the experts whole (ep 1)",
            ));
        }
        // the two rules inside each expert: gate and up split on their output dim over mp,
        // down on its input dim (the plan's), each rank computing its share of every slot
        let ex = &self.experts;
        let mp_of = |w: &Tensor<B>| w.placements().get(MeshAxis::Mp);
        let tp = (mp_of(&ex.gate), mp_of(&ex.up), mp_of(&ex.down))
            == (Placement::Shard(1), Placement::Shard(1), Placement::Shard(2));
        let local = |w: &Tensor<B>, keep_mp: bool, differs: &[MeshAxis]| -> Result<Tensor<B>> {
            // the experts keep their split over dp (and over mp where the rules split
            // them); everything else is whole on each rank
            let mp = if keep_mp { w.placements().get(MeshAxis::Mp) } else { Placement::Replicate };
            let whole =
                Placements::REPLICATED.with(MeshAxis::Dp, w.placements().get(MeshAxis::Dp)).with(MeshAxis::Mp, mp);
            let w = if w.placements() == whole { w.clone() } else { w.redistribute(whole)? };
            w.to_local(differs)
        };
        let xl = x2.to_local(differs)?;
        let tl = xl.dims()[0];
        let logits = xl.matmul_t(&local(&self.router.weight, false, differs)?)?;
        let ws = [&local(&ex.gate, tp, differs)?, &local(&ex.up, tp, differs)?, &local(&ex.down, tp, differs)?];
        // with the experts split over mp, each rank's share of a slot's gradient is a
        // partial sum there: the experts read the tokens through an entry of their own
        let with_mp: Vec<MeshAxis> = differs.iter().copied().chain([MeshAxis::Mp]).collect();
        let xe = if tp { Some(x2.to_local(&with_mp)?) } else { None };
        let keep_l = keep.map(|k| if split && k.len() != tl { &k[pos * tl..(pos + 1) * tl] } else { k });
        let (out, stats) = self.local((&xl, xe.as_ref()), logits, ws, keep_l, ep)?;
        let placed = if tp {
            x2.placements().with(MeshAxis::Mp, Placement::Partial(crate::PartialOp::Sum))
        } else {
            x2.placements()
        };
        let out = Tensor::from_local_piece(&out, x2.shape().clone(), placed)?;
        if !split {
            return Ok((out, stats));
        }
        // the statistics of every rank's tokens: counts summed on the host, the
        // probabilities and log-sum-exps as partial sums over dp
        let mut mine: Vec<i64> = stats.chosen.iter().map(|&c| c as i64).collect();
        mine.push(stats.tokens as i64);
        if self.capacity_factor.is_some() {
            mine.push(stats.dropped as i64);
        }
        let all = crate::sharding::all_gather_counts(xl.backend(), MeshAxis::Dp, &mine)?;
        let sum = |i: usize| all.iter().map(|v| v.get(i).copied().unwrap_or(0) as usize).sum::<usize>();
        let partial = Placements::REPLICATED.with(MeshAxis::Dp, Placement::Partial(crate::PartialOp::Sum));
        let stats = RouterStats {
            tokens: sum(stats.chosen.len()),
            dropped: sum(stats.chosen.len() + 1),
            chosen: (0..stats.chosen.len()).map(sum).collect(),
            prob_sum: Tensor::from_local_piece(&stats.prob_sum, [e], partial)?,
            z_sum: Tensor::from_local_piece(&stats.z_sum, Shape::new(Vec::<usize>::new()), partial)?,
        };
        Ok((out, stats))
    }

    /// The block over unplaced tokens `x2 [t, hidden]` with their router logits `[t, E]`
    /// and unplaced expert weights `[gate, up, down]`; `ep`: this rank's position and the
    /// group size when the expert weights are this rank's share of the experts (the slots
    /// then travel over `dp`). `x_experts`: the same tokens as the experts read them when
    /// the experts are split over `mp` (their output is then this rank's partial sum, and
    /// the routing weights' gradient is summed over `mp`).
    fn local(
        &self,
        (x2, x_experts): (&Tensor<B>, Option<&Tensor<B>>),
        logits: Tensor<B>,
        [gate, up, down]: [&Tensor<B>; 3],
        keep: Option<&[bool]>,
        ep: Option<(usize, usize)>,
    ) -> Result<(Tensor<B>, RouterStats<B>)> {
        let (t, h) = (x2.dims()[0], x2.dims()[1]);
        let (e, k) = (logits.dims()[1], self.top_k);
        let kept = |r: usize| keep.is_none_or(|k| k[r]);
        // the router in f32 (as transformers computes it) or wider
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
        let b = x2.backend();
        let ids = Tensor::from_vec(b, chosen_ids.clone(), [t, k])?;
        let mut weights = probs.gather(&ids, -1)?;
        if self.norm_topk_prob {
            weights = weights.div(&weights.sum(-1, true)?)?;
        }
        // slot s = token * k + j; those within capacity (all of them when dropless),
        // grouped by expert
        let (live, dropped) = self.within_capacity(&chosen_ids, t, e, &kept);
        let experts: Vec<usize> = live.iter().map(|&s| chosen_ids[s] as usize).collect();
        let (counts, order) = group_by_expert(&experts, e)?;
        let order: Vec<usize> = order.into_iter().map(|i| live[i]).collect();
        let rows = order.len();
        let tokens_of: Vec<i64> = order.iter().map(|&s| (s / k) as i64).collect();
        let slots: Vec<i64> = order.iter().map(|&s| s as i64).collect();
        let tok = Tensor::from_vec(b, tokens_of, [rows])?;
        let xs = x_experts.unwrap_or(x2).index_select(&tok, 0)?;
        if x_experts.is_some() {
            weights = weights.grad_summed_over(MeshAxis::Mp)?;
        }
        let y = match ep {
            None => self.experts_on(&xs, &counts, gate, up, down)?,
            Some((pos, n)) => self.experts_over_ranks(&xs, &counts, [gate, up, down], pos, n)?,
        };
        let w = weights.reshape([t * k])?.index_select(&Tensor::from_vec(b, slots, [rows])?, 0)?;
        let y = y.mul(&w.cast(y.dtype())?.reshape([rows, 1])?)?;
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
        Ok((out, RouterStats { tokens, chosen, prob_sum, z_sum, dropped }))
    }

    /// The slots (`token * k + j`, ascending) the experts take of `chosen` (`[t * k]`
    /// expert ids of `e`), and how many slots of tokens `kept` flags were dropped: all of
    /// them when dropless; else each expert takes at most its capacity, first choices
    /// first, each choice in token order.
    fn within_capacity(&self, chosen: &[i64], t: usize, e: usize, kept: &dyn Fn(usize) -> bool) -> (Vec<usize>, usize) {
        let k = self.top_k;
        let Some(factor) = self.capacity_factor else {
            return ((0..t * k).collect(), 0);
        };
        let cap = ((factor * (t * k) as f64 / e.max(1) as f64).ceil() as usize).max(1);
        let (mut taken, mut live, mut dropped) = (vec![0usize; e], vec![false; t * k], 0);
        for j in 0..k {
            for r in 0..t {
                let x = chosen[r * k + j] as usize;
                if taken[x] < cap {
                    taken[x] += 1;
                    live[r * k + j] = true;
                } else if kept(r) {
                    dropped += 1;
                }
            }
        }
        ((0..t * k).filter(|&s| live[s]).collect(), dropped)
    }

    /// The gated experts over slots `xs` grouped by expert (`counts[e]` rows each).
    fn experts_on(
        &self,
        xs: &Tensor<B>,
        counts: &[usize],
        gate: &Tensor<B>,
        up: &Tensor<B>,
        down: &Tensor<B>,
    ) -> Result<Tensor<B>> {
        let g = self.act.forward(&xs.grouped_matmul(gate, counts, true)?)?;
        let u = xs.grouped_matmul(up, counts, true)?;
        g.mul(&u)?.grouped_matmul(down, counts, true)
    }

    /// The experts held as shares over the `n` ranks of `dp` (this one at `pos`): every
    /// slot goes to the rank holding its expert, is computed there beside the other ranks'
    /// slots for that expert, and comes back, in the order it left.
    fn experts_over_ranks(
        &self,
        xs: &Tensor<B>,
        counts: &[usize],
        [gate, up, down]: [&Tensor<B>; 3],
        pos: usize,
        n: usize,
    ) -> Result<Tensor<B>> {
        let (e, el) = (counts.len(), gate.dims()[0]);
        if el * n != e {
            return Err(Error::config("moe", format!("{el} experts on each of {n} ranks for {e} experts")));
        }
        // every rank's slots per expert (one small all-gather)
        let mine: Vec<i64> = counts.iter().map(|&c| c as i64).collect();
        let all = crate::sharding::all_gather_counts(xs.backend(), MeshAxis::Dp, &mine)?;
        let of = |j: usize, x: usize| all[j][x] as usize;
        let send: Vec<usize> = (0..n).map(|j| counts[j * el..(j + 1) * el].iter().sum()).collect();
        let recv: Vec<usize> = (0..n).map(|j| (0..el).map(|l| of(j, pos * el + l)).sum()).collect();
        let got = xs.all_to_all_rows(MeshAxis::Dp, &send, &recv)?;
        // the received slots come source by source; the experts want them expert by expert
        let mut perm = Vec::with_capacity(got.dims()[0]);
        let mut local_counts = vec![0usize; el];
        let starts: Vec<usize> = recv.iter().scan(0, |a, &r| Some(std::mem::replace(a, *a + r))).collect();
        for (l, lc) in local_counts.iter_mut().enumerate() {
            for (j, &start) in starts.iter().enumerate() {
                let inner: usize = (0..l).map(|m| of(j, pos * el + m)).sum();
                let c = of(j, pos * el + l);
                perm.extend((0..c).map(|r| (start + inner + r) as i64));
                *lc += c;
            }
        }
        let mut inverse = vec![0i64; perm.len()];
        for (i, &p) in perm.iter().enumerate() {
            inverse[p as usize] = i as i64;
        }
        let b = xs.backend();
        let rows = perm.len();
        let by_expert = got.index_select(&Tensor::from_vec(b, perm, [rows])?, 0)?;
        let y = self.experts_on(&by_expert, &local_counts, gate, up, down)?;
        let y = y.index_select(&Tensor::from_vec(b, inverse, [rows])?, 0)?;
        y.all_to_all_rows(MeshAxis::Dp, &recv, &send)
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
