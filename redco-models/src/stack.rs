//! How a decoder's layers run, shared by every decoder-only model: under ZeRO-3 each unit
//! of layers (one layer, or as many consecutive ones as the gatherer asks) on a copy of
//! its parameters gathered whole just before it runs (the next unit's gather started
//! ahead, FSDP's prefetch of one unit), and in training forwards, when asked, each unit a
//! recomputed block (activation checkpointing, block or selective). A model keeps
//! its layers and the math of one layer ([`StackLayer`]); the [`Stack`] holds the policy the
//! trainer hands it (the gatherer) and the recompute mode, and runs the loop.

use redco_core::nn::{gathered, prefetch_units, Module, ParamGather, RouterStats};
use redco_core::recompute::Recompute;
use redco_core::{Backend, Error, Result, Tensor};
use std::any::Any;
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// A layer's attention over its queries, keys and values (with its cache, if any).
pub type LayerAttend<'a, B> = dyn FnMut(Tensor<B>, Tensor<B>, Tensor<B>) -> Result<Tensor<B>> + 'a;

/// One decoder layer a [`Stack`] runs.
pub trait StackLayer<B: Backend>: Module<B> + Clone + Send + Sync + 'static {
    /// What the layer's forward needs besides its parameters (sizes, switches).
    type Ctx: Copy + Send + Sync + 'static;

    /// The layer over hidden states `h` (`[batch, seq, hidden]`), with the model's side
    /// inputs `side` (rotary tables, or none); `attend(q, k, v)` is its attention.
    fn forward(
        &self,
        ctx: Self::Ctx,
        h: &Tensor<B>,
        side: &[Tensor<B>],
        attend: &mut LayerAttend<'_, B>,
    ) -> Result<Tensor<B>>;
}

/// The run policy of a decoder's layers: where their parameters are gathered (ZeRO-3) and
/// what they recompute in training.
#[derive(Clone)]
pub struct Stack<B: Backend> {
    /// The layers' name prefix from the model's root (`model.layers`, `transformer.h`).
    prefix: &'static str,
    /// What each layer recomputes in the backward pass of a training forward.
    recompute: Recompute,
    /// ZeRO-3: what makes a layer's parameters whole when they are held in pieces.
    gather: Option<Arc<dyn ParamGather<B>>>,
}

impl<B: Backend> Stack<B> {
    /// Layers named `prefix.N`, kept whole and recomputing nothing.
    pub fn new(prefix: &'static str) -> Self {
        Stack { prefix, recompute: Recompute::None, gather: None }
    }

    /// The name of layer `i` from the model's root.
    fn name(&self, i: usize) -> String {
        format!("{}.{i}", self.prefix)
    }

    /// The names of `n` layers: the units ZeRO-3 gathers ([`Module::gather_units`]).
    pub fn units(&self, n: usize) -> Vec<String> {
        (0..n).map(|i| self.name(i)).collect()
    }

    /// Sets what each layer recomputes in training forwards.
    pub fn set_recompute(&mut self, mode: Recompute) {
        self.recompute = mode;
    }

    /// What each layer recomputes in training forwards.
    pub fn recompute(&self) -> Recompute {
        self.recompute
    }

    /// Hands the layers a gatherer (ZeRO-3), or takes it back.
    pub fn set_gather(&mut self, g: Option<Arc<dyn ParamGather<B>>>) {
        self.gather = g;
    }

    /// Whether a forward without a cache runs the recomputing loop: recompute is on and
    /// gradients are being recorded.
    pub fn recomputes(&self) -> bool {
        self.recompute.on() && redco_core::is_grad_enabled()
    }

    /// How many consecutive layers run as one unit: gathered together under ZeRO-3 (as
    /// the gatherer asks, [`ParamGather::units_per_gather`]) and recomputed as one block;
    /// 1 without a gatherer.
    fn group(&self) -> usize {
        self.gather.as_ref().map_or(1, |g| g.units_per_gather().max(1))
    }

    /// Layers `range` with their names, as [`gathered`] takes them.
    fn named<'l, L>(&self, layers: &'l [L], range: std::ops::Range<usize>) -> Vec<(&'l L, String)> {
        range.map(|i| (&layers[i], self.name(i))).collect()
    }

    /// The layers over `h`; `attend(i, q, k, v)` is layer `i`'s attention (with its cache).
    /// Under ZeRO-3 each unit of layers runs on its gathered parameters, the next unit's
    /// gather moving while it computes.
    pub fn run<L: StackLayer<B>>(
        &self,
        layers: &[L],
        ctx: L::Ctx,
        mut h: Tensor<B>,
        side: &[Tensor<B>],
        attend: &mut crate::generate::RaggedAttend<'_, B>,
    ) -> Result<Tensor<B>> {
        let Some(g) = &self.gather else {
            for (i, l) in layers.iter().enumerate() {
                h = l.forward(ctx, &h, side, &mut |q, k, v| attend(i, q, k, v))?;
            }
            return Ok(h);
        };
        let (n, k) = (layers.len(), self.group());
        for start in (0..n).step_by(k) {
            let end = (start + k).min(n);
            let wholes = gathered(&self.named(layers, start..end), g.as_ref())?;
            prefetch_units(&self.named(layers, end..(end + k).min(n)), g.as_ref())?;
            for (i, l) in (start..end).zip(&wholes) {
                h = l.forward(ctx, &h, side, &mut |q, k, v| attend(i, q, k, v))?;
            }
        }
        Ok(h)
    }

    /// [`Stack::run_recomputed_collecting`] collecting nothing: the hidden states only.
    pub fn run_recomputed<L: StackLayer<B>>(
        &self,
        layers: &[L],
        ctx: L::Ctx,
        h: Tensor<B>,
        side: &[Tensor<B>],
        mask: Option<&Tensor<B>>,
    ) -> Result<Tensor<B>> {
        Ok(self.run_recomputed_collecting(layers, ctx, h, side, mask, None)?.0)
    }

    /// [`Stack::run`] for training without a cache, each unit of layers (one layer without
    /// a gatherer) a [`Tensor::recompute`] block (or a [`Tensor::recompute_selective`] one)
    /// whose attention is causal under `mask` (`[batch, seq]`, 0 = padding). Under ZeRO-3 a
    /// unit is gathered for its forward and again for its recomputation; the gather started
    /// ahead is the next unit's in the forward and the previous unit's (recomputed next) in
    /// the backward. With `router` (`Some(keep)`: the token flags the statistics count), the
    /// mixture-of-experts layers' router statistics ([`collect_router`]) leave each block as
    /// more outputs of its recomputation, so the load-balancing loss over them differentiates
    /// into the recomputed routers; they are returned in layer order beside the hidden
    /// states.
    pub fn run_recomputed_collecting<L: StackLayer<B>>(
        &self,
        layers: &[L],
        ctx: L::Ctx,
        mut h: Tensor<B>,
        side: &[Tensor<B>],
        mask: Option<&Tensor<B>>,
        router: Option<Option<Vec<bool>>>,
    ) -> Result<(Tensor<B>, Vec<RouterStats<B>>)> {
        let mut stats = Vec::new();
        let n_side = side.len();
        let (n, k) = (layers.len(), self.group());
        for start in (0..n).step_by(k) {
            let end = (start + k).min(n);
            let mut params = Vec::new();
            for l in &layers[start..end] {
                l.visit("", &mut |_, p| params.push(p.clone()));
            }
            let mut inputs = vec![h];
            inputs.extend(side.iter().cloned());
            inputs.extend(mask.cloned());
            let owned = |r: std::ops::Range<usize>| -> Vec<(L, String)> {
                r.map(|i| (layers[i].clone(), self.name(i))).collect()
            };
            let (unit, gather) = (owned(start..end), self.gather.clone());
            let next = owned(end..(end + k).min(n));
            let prev = owned(start.saturating_sub(k)..start);
            let ran = AtomicBool::new(false);
            // what the first run counted of each router (host counts), for the statistics
            let counted: Arc<Mutex<Vec<Counted>>> = Arc::default();
            let (router, counted_in) = (router.clone(), counted.clone());
            let block = move |xs: &[Tensor<B>]| -> Result<Vec<Tensor<B>>> {
                let mask = xs.get(1 + n_side);
                let wholes = match &gather {
                    Some(g) => {
                        let wholes = gathered(&refs(&unit), g.as_ref())?;
                        let again = ran.swap(true, Ordering::Relaxed);
                        prefetch_units(&refs(if again { &prev } else { &next }), g.as_ref())?;
                        wholes
                    }
                    None => unit.iter().map(|(l, _)| l.clone()).collect(),
                };
                let run = || -> Result<Tensor<B>> {
                    let mut h = xs[0].clone();
                    for l in &wholes {
                        h = l.forward(ctx, &h, &xs[1..1 + n_side], &mut |q, k, v| {
                            redco_core::nn::scaled_dot_product_attention(&q, &k, &v, mask, true, None)
                        })?;
                    }
                    Ok(h)
                };
                let Some(keep) = &router else { return Ok(vec![run()?]) };
                let (h, got) = collect_router(keep.clone(), run)?;
                let mut counted = counted_in.lock().unwrap_or_else(|p| p.into_inner());
                if counted.is_empty() {
                    *counted = got.iter().map(|s| (s.tokens, s.chosen.clone(), s.dropped)).collect();
                }
                let mut outs = vec![h];
                outs.extend(got.into_iter().flat_map(|s| [s.prob_sum, s.z_sum]));
                Ok(outs)
            };
            let (inputs, params) = (inputs.iter().collect::<Vec<_>>(), params.iter().collect::<Vec<_>>());
            let mut outs = Tensor::recompute_many(self.recompute, &inputs, &params, block)?.into_iter();
            h = outs.next().ok_or_else(|| Error::invalid("recompute", "a block without its hidden states"))?;
            let counted = std::mem::take(&mut *counted.lock().unwrap_or_else(|p| p.into_inner()));
            for (tokens, chosen, dropped) in counted {
                let (Some(prob_sum), Some(z_sum)) = (outs.next(), outs.next()) else {
                    return Err(Error::invalid(
                        "recompute",
                        "a block returned fewer router statistics than it counted",
                    ));
                };
                stats.push(RouterStats { tokens, chosen, prob_sum, z_sum, dropped });
            }
        }
        Ok((h, stats))
    }
}

/// What the first run of a recomputed block counted of one router: tokens, choices per
/// expert and slots dropped ([`RouterStats`]'s host part).
type Counted = (usize, Vec<usize>, usize);

/// A router statistics collector: the token flags to count, and what was collected.
type Collector = (Option<Vec<bool>>, Vec<Box<dyn Any>>);

thread_local! {
    /// The router statistics collector of the block running on this thread: the token
    /// flags to count, and the statistics of each mixture-of-experts layer run so far.
    static ROUTER: RefCell<Option<Collector>> = const { RefCell::new(None) };
}

/// `f()` with the router statistics of every mixture-of-experts layer it runs collected
/// (counting the tokens `keep` flags) and returned in order: a layer asks
/// [`router_collecting`] whether to count, and hands its statistics to [`push_router`].
pub fn collect_router<B: Backend, T>(
    keep: Option<Vec<bool>>,
    f: impl FnOnce() -> Result<T>,
) -> Result<(T, Vec<RouterStats<B>>)> {
    /// Puts the previous collector back when dropped (on unwinding too).
    struct Restore(Option<Option<Collector>>);
    impl Drop for Restore {
        fn drop(&mut self) {
            if let Some(prev) = self.0.take() {
                ROUTER.with(|r| *r.borrow_mut() = prev);
            }
        }
    }
    let mut restore = Restore(Some(ROUTER.with(|r| r.replace(Some((keep, Vec::new()))))));
    let out = f();
    let prev = restore.0.take().unwrap_or_default();
    let got = ROUTER.with(|r| r.replace(prev)).map(|(_, got)| got).unwrap_or_default();
    let out = out?;
    let stats = got
        .into_iter()
        .map(|s| s.downcast::<RouterStats<B>>().map(|s| *s))
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|_| Error::invalid("moe", "router statistics of another backend were collected"))?;
    Ok((out, stats))
}

/// The token flags to count when a [`collect_router`] is collecting on this thread
/// (`Some(None)`: every token), `None` otherwise.
pub fn router_collecting() -> Option<Option<Vec<bool>>> {
    ROUTER.with(|r| r.borrow().as_ref().map(|(keep, _)| keep.clone()))
}

/// Hands a mixture-of-experts layer's statistics to the collector on this thread.
pub fn push_router<B: Backend>(stats: RouterStats<B>) {
    ROUTER.with(|r| {
        if let Some((_, got)) = r.borrow_mut().as_mut() {
            got.push(Box::new(stats));
        }
    });
}

/// Borrowed units with their names, as [`gathered`] takes them.
fn refs<L>(units: &[(L, String)]) -> Vec<(&L, String)> {
    units.iter().map(|(l, s)| (l, s.clone())).collect()
}
