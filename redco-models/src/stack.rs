//! How a decoder's layers run, shared by every decoder-only model: under ZeRO-3 each unit
//! of layers (one layer, or as many consecutive ones as the gatherer asks) on a copy of
//! its parameters gathered whole just before it runs (the next unit's gather started
//! ahead, FSDP's prefetch of one unit), and in training forwards, when asked, each unit a
//! recomputed block (activation checkpointing, block or selective). A model keeps
//! its layers and the math of one layer ([`StackLayer`]); the [`Stack`] holds the policy the
//! trainer hands it (the gatherer) and the recompute mode, and runs the loop.

use redco_core::nn::{gathered, prefetch_units, Module, ParamGather};
use redco_core::recompute::Recompute;
use redco_core::{Backend, Result, Tensor};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

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

    /// [`Stack::run`] for training without a cache, each unit of layers (one layer without
    /// a gatherer) a [`Tensor::recompute`] block (or a [`Tensor::recompute_selective`] one)
    /// whose attention is causal under `mask` (`[batch, seq]`, 0 = padding). Under ZeRO-3 a
    /// unit is gathered for its forward and again for its recomputation; the gather started
    /// ahead is the next unit's in the forward and the previous unit's (recomputed next) in
    /// the backward.
    pub fn run_recomputed<L: StackLayer<B>>(
        &self,
        layers: &[L],
        ctx: L::Ctx,
        mut h: Tensor<B>,
        side: &[Tensor<B>],
        mask: Option<&Tensor<B>>,
    ) -> Result<Tensor<B>> {
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
            let block = move |xs: &[Tensor<B>]| {
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
                let mut h = xs[0].clone();
                for l in &wholes {
                    h = l.forward(ctx, &h, &xs[1..1 + n_side], &mut |q, k, v| {
                        redco_core::nn::scaled_dot_product_attention(&q, &k, &v, mask, true, None)
                    })?;
                }
                Ok(h)
            };
            let (inputs, params) = (inputs.iter().collect::<Vec<_>>(), params.iter().collect::<Vec<_>>());
            h = match self.recompute {
                Recompute::Selective => Tensor::recompute_selective(&inputs, &params, block)?,
                _ => Tensor::recompute(&inputs, &params, block)?,
            };
        }
        Ok(h)
    }
}

/// Borrowed units with their names, as [`gathered`] takes them.
fn refs<L>(units: &[(L, String)]) -> Vec<(&L, String)> {
    units.iter().map(|(l, s)| (l, s.clone())).collect()
}
