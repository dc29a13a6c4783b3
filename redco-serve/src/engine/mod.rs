//! The continuous-batching engine ([`Engine`]): requests join the running batch at the next
//! step and leave when they finish (iteration-level scheduling, as Orca and vLLM do). Each
//! step runs one ragged batch through the model: one token of every decoding sequence,
//! then prompt chunks of the waiting ones up to a token budget (chunked prefill, so a long
//! prompt does not stall the decoding sequences), with keys and values in the paged cache.
//! When the cache runs out of blocks, the newest sequence is preempted (its blocks
//! released) and recomputed later from its tokens; its full blocks stay cached, so the
//! recomputation finds most of them.

use crate::guide::{Constraint, GuideSpec, Guides};
use crate::kv::{BlockPool, BlockTable, KvGeometry, PagedKv, PoolStats};
use redco_core::ops::paged_attention::PagedSegment;
use redco_core::{no_grad, Backend, DType, Error, Result, Tensor};
use redco_models::generate::{CausalLm, Sampling};
use std::collections::VecDeque;
use std::sync::Arc;

mod refused;
pub use refused::Refused;

/// How the engine batches and how much cache it has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineConfig {
    /// Tokens one step runs at most (decode tokens first, then prompt chunks).
    pub max_batch_tokens: usize,
    /// Sequences running at once at most.
    pub max_running: usize,
    /// Requests waiting at most; more are refused ([`Engine::add`]).
    pub max_waiting: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// KV blocks in the pool.
    pub blocks: usize,
}

/// One generation request.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The caller's id, repeated in every [`Event`].
    pub id: u64,
    /// The prompt's token ids (not empty).
    pub prompt: Vec<i64>,
    /// New tokens at most.
    pub max_tokens: usize,
    /// How each token is chosen.
    pub sampling: Sampling,
    /// Tokens that end the generation (included in the output).
    pub stop_tokens: Vec<i64>,
    /// Report each token's log-probability and this many of the most likely alternatives
    /// (`None`: no log-probabilities).
    pub logprobs: Option<usize>,
    /// Report each prompt token's log-probability (after the first, which has none) and
    /// this many alternatives, as [`Event::PromptLogprobs`] while the prompt runs (`None`:
    /// not asked). Such a prompt takes no cached prefix: every position is computed.
    pub prompt_logprobs: Option<usize>,
    /// What the output must match (constrained decoding, [`crate::guide`]); the engine
    /// needs its model's [`Guides`] ([`Engine::with_guides`]).
    pub guide: Option<Arc<GuideSpec>>,
}

/// A token's log-probability under the model (its logits' log-softmax, before sampling's
/// temperature and truncation) and the most likely tokens' with theirs, most likely first.
#[derive(Debug, Clone, PartialEq)]
pub struct Logprob {
    /// The chosen token's.
    pub logprob: f32,
    /// The most likely tokens and theirs.
    pub top: Vec<(i64, f32)>,
}

impl Logprob {
    /// Of `token` in `logits`, with the `top` most likely.
    pub fn of(logits: &[f32], token: usize, top: usize) -> Self {
        let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let lse = m + logits.iter().map(|&x| ((x - m) as f64).exp()).sum::<f64>().ln() as f32;
        let mut order: Vec<usize> = (0..logits.len()).collect();
        let top = top.min(logits.len());
        if top > 0 {
            order.select_nth_unstable_by(top - 1, |&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
            order.truncate(top);
            order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        } else {
            order.clear();
        }
        Logprob { logprob: logits[token] - lse, top: order.into_iter().map(|i| (i as i64, logits[i] - lse)).collect() }
    }
}

/// Why a sequence ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// A stop token was generated.
    Stop,
    /// `max_tokens` were generated.
    Length,
    /// The model's context is full.
    Context,
}

/// What a step produced for a request.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A new token of request `id`.
    Token {
        /// The request.
        id: u64,
        /// The token.
        token: i64,
        /// Its log-probability, when the request asked.
        logprob: Option<Logprob>,
    },
    /// Log-probabilities of prompt tokens of request `id` ([`Request::prompt_logprobs`]):
    /// the tokens at `first..first + logprobs.len()` of the prompt, in order; every
    /// position from 1 is reported once, before the request's first token.
    PromptLogprobs {
        /// The request.
        id: u64,
        /// The prompt position of the first entry (at least 1).
        first: usize,
        /// Each token and its log-probability.
        logprobs: Vec<(i64, Logprob)>,
    },
    /// Request `id` ended.
    Finished {
        /// The request.
        id: u64,
        /// Why.
        reason: Finish,
    },
}

/// Counts for `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EngineStats {
    /// Requests waiting.
    pub waiting: usize,
    /// Sequences running.
    pub running: usize,
    /// Sequences preempted (their blocks released, to be recomputed).
    pub preemptions: u64,
    /// Steps run.
    pub steps: u64,
    /// Tokens generated.
    pub generated: u64,
    /// Tokens run through the model outside decode steps: prompts' (prefill) and a
    /// preempted sequence's recomputed ones; prefix-cache hits are not run, so not counted.
    pub prefilled: u64,
    /// The KV pool's counts.
    pub kv: PoolStats,
}

/// A sequence: its request, its tokens (prompt, then generated), and its cache.
struct Seq {
    req: Request,
    tokens: Vec<i64>,
    generated: usize,
    table: Option<BlockTable>,
    /// Leading tokens whose keys and values are written.
    computed: usize,
    /// Prompt positions whose log-probability was reported (from 1), when asked.
    reported: usize,
    /// The grammar state of a constrained request.
    constraint: Option<Constraint>,
}

/// One sequence's part of a step's batch.
struct Segment {
    seq: usize,
    start: usize,
    len: usize,
}

/// The engine over model `M` (or this rank's shard of it) on backend `B`.
pub struct Engine<B: Backend, M: CausalLm<B>> {
    backend: B,
    model: M,
    cfg: EngineConfig,
    pool: BlockPool,
    kv: PagedKv<B>,
    waiting: VecDeque<Seq>,
    running: Vec<Seq>,
    stats: EngineStats,
    scale: f64,
    context: Option<usize>,
    guides: Option<Arc<Guides>>,
}

impl<B: Backend, M: CausalLm<B> + Sync> Engine<B, M> {
    /// The engine with its model's vocabulary for constrained decoding: requests with a
    /// [`Request::guide`] are refused without it.
    pub fn with_guides(mut self, guides: Arc<Guides>) -> Self {
        self.guides = Some(guides);
        self
    }

    /// An engine for `model` with a cache of `cfg.blocks` blocks in `dtype` on `b`.
    pub fn new(b: &B, model: M, cfg: EngineConfig, dtype: DType) -> Result<Self> {
        Engine::split(b, model, cfg, dtype, 1)
    }

    /// An engine for this rank's shard of `model`, split over `mp` tensor-parallel ranks:
    /// its cache holds the rank's key/value heads ([`KvGeometry::split`]), `cfg.blocks`
    /// blocks of them. Every rank's engine must be handed the same requests in the same
    /// order ([`crate::lockstep`]). Tells `b` that its weights are constant
    /// ([`Backend::hint_constant_weights`]). The cache holds keys and values in `kv_dtype`
    /// (the model's dtype, or a narrower float: see [`PagedKv`]).
    pub fn split(b: &B, model: M, cfg: EngineConfig, kv_dtype: DType, mp: usize) -> Result<Self> {
        if !kv_dtype.is_float() {
            return Err(Error::config("engine", format!("a KV cache of {kv_dtype:?}: it holds floats")));
        }
        let dtype = kv_dtype;
        let c = model.config();
        let geometry = KvGeometry {
            layers: c.layers,
            kv_heads: c.kv_heads,
            head_dim: c.head_dim,
            dtype_bytes: dtype.size_in_bytes(),
            block_size: cfg.block_size.max(1),
        }
        .split(mp);
        if cfg.max_batch_tokens == 0 || cfg.max_running == 0 || cfg.blocks == 0 {
            return Err(Error::config("engine", format!("an engine needs tokens, sequences and blocks: {cfg:?}")));
        }
        let scale = 1.0 / (c.head_dim as f64).sqrt();
        let context = model.max_positions();
        // an engine only runs inference: its weights never change (the CPU backend then
        // keeps them packed for its GEMM)
        b.hint_constant_weights();
        Ok(Engine {
            backend: b.clone(),
            kv: PagedKv::new(b, geometry, cfg.blocks, dtype)?,
            pool: BlockPool::new(cfg.blocks, geometry.block_size),
            model,
            cfg,
            waiting: VecDeque::new(),
            running: Vec::new(),
            stats: EngineStats::default(),
            scale,
            context,
            guides: None,
        })
    }

    /// Queues `req`; refused when the queue is full, the prompt empty or longer than the
    /// context, or the sampling parameters invalid (the caller answers 429 or 400).
    pub fn add(&mut self, req: Request) -> std::result::Result<(), Refused> {
        let invalid = |m: String| Err(Refused::Invalid(m));
        if let Err(e) = req.sampling.validate() {
            return invalid(e.to_string());
        }
        if req.prompt.is_empty() {
            return invalid("the prompt is empty".into());
        }
        if let Some(ctx) = self.context.filter(|&c| req.prompt.len() >= c) {
            return invalid(format!(
                "the prompt has {} tokens, the model's context {ctx} leaves none to generate",
                req.prompt.len()
            ));
        }
        let blocks = req.prompt.len().div_ceil(self.pool.block_size());
        if blocks > self.cfg.blocks {
            return invalid(format!("the prompt needs {blocks} KV blocks, more than the cache's {}", self.cfg.blocks));
        }
        if self.waiting.len() >= self.cfg.max_waiting {
            return Err(Refused::Busy(format!("the queue is full ({} waiting)", self.waiting.len())));
        }
        let constraint = match (&req.guide, &self.guides) {
            (None, _) => None,
            (Some(spec), Some(g)) => Some(g.constraint(spec).map_err(Refused::Invalid)?),
            (Some(_), None) => return invalid("this engine has no vocabulary for constrained decoding".into()),
        };
        let tokens = req.prompt.clone();
        self.waiting.push_back(Seq { req, tokens, generated: 0, table: None, computed: 0, reported: 1, constraint });
        Ok(())
    }

    /// Removes request `id` wherever it is (a client that went away), releasing its blocks;
    /// false when it is not here.
    pub fn cancel(&mut self, id: u64) -> bool {
        if let Some(i) = self.running.iter().position(|s| s.req.id == id) {
            let s = self.running.remove(i);
            if let Some(t) = s.table {
                self.pool.free(t);
            }
            return true;
        }
        let before = self.waiting.len();
        self.waiting.retain(|s| s.req.id != id);
        before != self.waiting.len()
    }

    /// True while a request is waiting or running.
    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    /// The counts.
    pub fn stats(&self) -> EngineStats {
        EngineStats { waiting: self.waiting.len(), running: self.running.len(), kv: self.pool.stats(), ..self.stats }
    }

    /// Whether `tokens` share a full block with a running sequence whose prompt has not yet
    /// computed it: admitted now, the prefix would be computed twice; a step or two later,
    /// it is found in the cache.
    fn shares_pending_prefix(&self, tokens: &[i64]) -> bool {
        let bs = self.pool.block_size();
        self.running.iter().any(|s| {
            let common = s.tokens.iter().zip(tokens).take_while(|(a, b)| a == b).count();
            let shared_full = common / bs * bs;
            // the shared blocks, less those the running sequence has written (and registered)
            shared_full > s.computed / bs * bs && s.computed < s.tokens.len()
        })
    }

    /// Admits waiting requests while their prompts' blocks can be had (in order; one whose
    /// prompt's prefix a running sequence is computing waits for it).
    fn admit(&mut self) {
        while self.running.len() < self.cfg.max_running {
            let Some(front) = self.waiting.front() else { break };
            if self.shares_pending_prefix(&front.tokens) {
                break;
            }
            let allocated = match front.req.prompt_logprobs {
                // every position's logits are wanted: none skipped as a cached prefix
                Some(_) => self.pool.allocate_prompt_uncached(&front.tokens),
                None => self.pool.allocate_prompt(&front.tokens),
            };
            match allocated {
                Ok(p) => {
                    let mut s = self.waiting.pop_front().expect("the front was just read");
                    s.computed = p.cached_tokens;
                    s.table = Some(p.table);
                    self.running.push(s);
                }
                Err(_) => break,
            }
        }
    }

    /// Preempts the newest running sequence: its blocks released, it waits again first.
    fn preempt(&mut self) -> bool {
        let Some(mut s) = self.running.pop() else { return false };
        if let Some(t) = s.table.take() {
            self.pool.free(t);
        }
        s.computed = 0;
        self.waiting.push_front(s);
        self.stats.preemptions += 1;
        true
    }

    /// One step: admits what fits, runs one ragged batch, and returns the new tokens and
    /// the requests that ended.
    pub fn step(&mut self) -> Result<Vec<Event>> {
        self.admit();
        if self.running.is_empty() {
            return Ok(Vec::new());
        }
        // decode tokens first (one each), then prompt chunks within the budget
        let mut budget = self.cfg.max_batch_tokens;
        let mut segments = Vec::new();
        let mut order: Vec<usize> = (0..self.running.len()).collect();
        order.sort_by_key(|&i| self.running[i].tokens.len() - self.running[i].computed > 1);
        for i in order {
            let s = &self.running[i];
            let len = (s.tokens.len() - s.computed).min(budget);
            if len == 0 {
                continue;
            }
            budget -= len;
            segments.push(Segment { seq: i, start: s.computed, len });
        }
        let events = no_grad(|| self.run(&segments))?;
        self.stats.steps += 1;
        Ok(events)
    }

    /// Runs `segments` through the model and samples where a sequence's last token ran.
    fn run(&mut self, segments: &[Segment]) -> Result<Vec<Event>> {
        let mut ids = Vec::new();
        let mut pos = Vec::new();
        let mut rows = Vec::new();
        // per segment: the prompt positions whose next token's log-probability its rows give
        let mut scored: Vec<std::ops::Range<usize>> = Vec::with_capacity(segments.len());
        for sg in segments {
            let s = &self.running[sg.seq];
            let at = ids.len();
            ids.extend_from_slice(&s.tokens[sg.start..sg.start + sg.len]);
            pos.extend((sg.start..sg.start + sg.len).map(|p| p as i64));
            // the row of position q gives the log-probability of prompt token q + 1
            let prompt = s.req.prompt.len();
            let range = match s.req.prompt_logprobs {
                Some(_) => (sg.start.max(s.reported - 1))..(sg.start + sg.len).min(prompt - 1),
                None => 0..0,
            };
            rows.extend(range.clone().map(|q| at + q - sg.start));
            scored.push(range);
            if sg.start + sg.len == s.tokens.len() {
                rows.push(ids.len() - 1);
            }
        }
        let b = self.backend.clone();
        let t = ids.len();
        let ids = Tensor::from_vec(&b, ids, [1, t])?;
        let pos = Tensor::from_vec(&b, pos, [1, t])?;
        // where each new token's keys and values go, and each segment's rows to attend over
        let mut written = Vec::with_capacity(t);
        let mut paged = Vec::with_capacity(segments.len());
        let mut at = 0;
        for sg in segments {
            let table = self.running[sg.seq].table.as_ref().expect("a running sequence has its blocks");
            written.extend(self.kv.slots(table, sg.start, sg.len)?);
            let slots = self.kv.slots(table, 0, sg.start + sg.len)?;
            paged.push(PagedSegment { q_start: at, q_len: sg.len, slots });
            at += sg.len;
        }
        let (kv, scale) = (&mut self.kv, self.scale);
        // under tensor parallelism q, k and v hold this rank's heads: the cache and the
        // kernel see the local tensors, and the output is this rank's heads of the whole
        let local =
            |x: &Tensor<B>| Tensor::from_storage(x.backend(), x.storage().clone(), x.local_shape().clone(), x.dtype());
        let mut attend = |layer: usize, q: Tensor<B>, k: Tensor<B>, v: Tensor<B>| -> Result<Tensor<B>> {
            // key/value heads that mp does not divide stay whole (so does the cache's
            // geometry, `KvGeometry::split`): the queries then join them whole
            let (q, k, v) = redco_models::generate::heads_together(q, k, v)?;
            kv.write_rows(layer, &written, &local(&k), &local(&v))?;
            let out = kv.attend_batch(layer, &local(&q), &paged, scale)?;
            if !q.is_sharded() {
                return Ok(out);
            }
            let (shape, placed) = (q.shape().clone(), q.placements());
            Ok(Tensor::from_local(q.backend(), out.storage().clone(), shape, out.shape().clone(), placed, out.dtype()))
        };
        // the logits gathered: every rank draws the same tokens. The whole forward runs on
        // the backend's own compute threads: one hand-off per step instead of two thread
        // switches per op (a decode step is hundreds of small ops)
        let model = &self.model;
        // the constrained sequences that draw this step: their masks are computed (on this
        // thread's neighbour) while the forward pass runs
        let mut masks: Vec<(usize, Constraint)> = Vec::new();
        for sg in segments {
            let s = &mut self.running[sg.seq];
            if sg.start + sg.len == s.tokens.len() {
                masks.extend(s.constraint.take().map(|c| (sg.seq, c)));
            }
        }
        let (forward, prepared) = std::thread::scope(|scope| {
            let masker = (!masks.is_empty()).then(|| {
                scope.spawn(move || {
                    for (_, c) in masks.iter_mut() {
                        // a failure here fails again where the mask is applied, ending
                        // that request alone
                        let _ = c.prepare();
                    }
                    masks
                })
            });
            let forward = redco_core::runtime::on_backend(&b, || -> Result<(Vec<f32>, usize)> {
                let logits = model.ragged_logits(&ids, &pos, &rows, &mut attend)?.replicate()?;
                Ok((logits.to_vec_f32()?, logits.dims()[1]))
            });
            let prepared = masker.map(|h| h.join());
            (forward, prepared)
        });
        match prepared {
            Some(Ok(done)) => {
                for (i, c) in done {
                    self.running[i].constraint = Some(c);
                }
            }
            Some(Err(_)) => return Err(Error::invalid("engine", "the grammar engine panicked")),
            None => {}
        }
        let (host, vocab) = forward?;
        let mut events = Vec::new();
        let mut done = Vec::new();
        let mut row = 0;
        for (sg, range) in segments.iter().zip(scored) {
            let s = &mut self.running[sg.seq];
            if let (Some(top), false) = (s.req.prompt_logprobs, range.is_empty()) {
                let first = range.start + 1;
                let logprobs = range
                    .map(|q| {
                        let logits = &host[row * vocab..(row + 1) * vocab];
                        row += 1;
                        let t = s.req.prompt[q + 1];
                        (t, Logprob::of(logits, t as usize, top))
                    })
                    .collect::<Vec<_>>();
                s.reported = first + logprobs.len();
                events.push(Event::PromptLogprobs { id: s.req.id, first, logprobs });
            }
            // every segment but a decode step (the one newest token of a generating sequence)
            let decode = s.generated > 0 && sg.len == 1 && sg.start + 1 == s.tokens.len();
            if !decode {
                self.stats.prefilled += sg.len as u64;
            }
            s.computed = sg.start + sg.len;
            let table = s.table.as_mut().expect("a running sequence has its blocks");
            self.pool.computed(table, s.computed);
            if s.computed < s.tokens.len() {
                continue;
            }
            let logits = &host[row * vocab..(row + 1) * vocab];
            row += 1;
            // the draw is the token's index, as `generate` draws for a batch of one; a
            // constrained sequence draws among the tokens its grammar allows
            let chosen = match s.constraint.as_mut() {
                Some(c) => {
                    let mut masked = logits.to_vec();
                    match c.apply(&mut masked) {
                        Ok(()) => Some(s.req.sampling.choose(&masked, s.generated as u64)?),
                        Err(e) => {
                            tracing::warn!(id = s.req.id, error = %e, "constrained decoding ended a request");
                            None
                        }
                    }
                }
                None => Some(s.req.sampling.choose(logits, s.generated as u64)?),
            };
            let Some(chosen) = chosen else {
                // the grammar allows nothing more: the request ends here
                events.push(Event::Finished { id: s.req.id, reason: Finish::Stop });
                done.push(s.req.id);
                continue;
            };
            let logprob = s.req.logprobs.map(|top| Logprob::of(logits, chosen, top));
            let token = chosen as i64;
            // the grammar's end: nothing more may follow this token
            let grammar_done = match s.constraint.as_mut().filter(|_| !s.req.stop_tokens.contains(&token)) {
                Some(c) => c.consume(token).is_err() || c.is_stopped(),
                None => false,
            };
            s.tokens.push(token);
            s.generated += 1;
            self.stats.generated += 1;
            events.push(Event::Token { id: s.req.id, token, logprob });
            let reason = if s.req.stop_tokens.contains(&token) || grammar_done {
                Some(Finish::Stop)
            } else if s.generated >= s.req.max_tokens {
                Some(Finish::Length)
            } else if self.context.is_some_and(|c| s.tokens.len() >= c) {
                Some(Finish::Context)
            } else if s.tokens.len() >= self.cfg.blocks * self.pool.block_size() {
                // the whole cache could not hold one more token of it
                Some(Finish::Length)
            } else {
                None
            };
            if let Some(reason) = reason {
                events.push(Event::Finished { id: s.req.id, reason });
                done.push(s.req.id);
            }
        }
        for id in done {
            self.cancel(id);
        }
        self.grow()?;
        Ok(events)
    }

    /// Puts each running sequence's newest token into its table, preempting the newest
    /// sequences while no block is free (a sequence that cannot get one waits again).
    fn grow(&mut self) -> Result<()> {
        let mut i = 0;
        while i < self.running.len() {
            let s = &mut self.running[i];
            let table = s.table.as_mut().expect("a running sequence has its blocks");
            if table.len() == s.tokens.len() {
                i += 1;
                continue;
            }
            let token = s.tokens[table.len()];
            if self.pool.append(table, token).is_ok() {
                continue;
            }
            // the newest sequence goes (this one, when it is the newest)
            if !self.preempt() {
                return Err(Error::invalid("engine", "the KV cache cannot hold one more token of one sequence"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
