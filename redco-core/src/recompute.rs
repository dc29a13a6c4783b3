//! Activation checkpointing (rematerialisation): a block whose intermediate activations
//! are not kept. Its forward runs without recording a graph; the backward pass runs the
//! block again, with gradients, from its saved inputs, and differentiates that. A
//! transformer trained this way keeps one hidden state per block instead of every
//! activation inside it, for one more forward per block in the backward pass (as
//! `torch.utils.checkpoint` and Megatron's full recompute do).
//!
//! Under tensor parallelism the recomputed forward repeats the block's forward
//! communication (its all-reduces), as Megatron's recompute does: one more all-reduce per
//! row-parallel layer per step.
//!
//! Selective recompute ([`Tensor::recompute_selective`], [`Recompute::Selective`]) keeps
//! the outputs of the expensive ops inside the block (matmuls, fused attention and
//! collectives) and recomputes only the rest (norms, rotary embeddings, activations,
//! products, reshapes): the policy of torch's selective activation checkpointing with
//! matmuls saved. The recomputation then repeats no matmul and no communication.

use crate::autograd::{is_grad_enabled, is_recompute_enabled, no_grad, GradModeGuard};
use crate::{Backend, Error, Result, Tensor};
use std::any::Any;
use std::cell::RefCell;
use std::sync::{Arc, Mutex};

/// A recorded node's backward, boxed.
type BackwardFn<B> = dyn Fn(&Tensor<B>) -> Result<Vec<Option<Tensor<B>>>> + Send + Sync;

/// Which activations a training step recomputes in its backward pass instead of keeping.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Recompute {
    /// Keep every activation (the fastest step).
    #[default]
    None,
    /// Recompute each block from its input: one hidden state kept per block, one more
    /// forward per block.
    Block,
    /// Keep the outputs of each block's matmuls, attention and collectives; recompute its
    /// cheap ops (norms, rotary embeddings, activations, products) from them.
    Selective,
}

impl Recompute {
    /// Whether anything is recomputed.
    pub fn on(self) -> bool {
        self != Recompute::None
    }

    /// Its name as the command line spells it: `none`, `block` or `selective`.
    pub fn name(self) -> &'static str {
        match self {
            Recompute::None => "none",
            Recompute::Block => "block",
            Recompute::Selective => "selective",
        }
    }
}

/// One kept output of a selective block: the op that made it, its element count and its
/// value.
type Kept = (&'static str, usize, Box<dyn Any + Send + Sync>);

/// What the kept-output tape of this thread is doing.
enum Tape {
    /// A selective block's forward: kept ops push their outputs.
    Record(Vec<Kept>),
    /// A selective block's recomputation: kept ops take their outputs, in order.
    Replay(Arc<Vec<Kept>>, usize),
}

thread_local! {
    static TAPE: RefCell<Option<Tape>> = const { RefCell::new(None) };
}

/// Puts `tape` on this thread until dropped; the previous one comes back.
struct TapeGuard(Option<Tape>);

impl TapeGuard {
    fn set(tape: Option<Tape>) -> Self {
        TapeGuard(TAPE.with(|t| t.replace(tape)))
    }

    /// The tape as it ended, the previous one back in place.
    fn finish(mut self) -> Option<Tape> {
        let prev = self.0.take();
        TAPE.with(|t| t.replace(prev))
    }
}

impl Drop for TapeGuard {
    fn drop(&mut self) {
        let prev = self.0.take();
        TAPE.with(|t| *t.borrow_mut() = prev);
    }
}

/// The output of an op a selective block keeps (`op` names it, `elems` is its local element
/// count): computed by `compute` and kept while the block's forward runs, taken from what
/// was kept while it is recomputed, computed plainly elsewhere. Ops call this around their
/// kernel (or collective), so the autograd node they record is the same either way.
pub(crate) fn kept<T: Clone + Send + Sync + 'static>(
    op: &'static str,
    elems: usize,
    compute: impl FnOnce() -> Result<T>,
) -> Result<T> {
    let replayed = TAPE.with(|t| -> Option<Result<T>> {
        let mut t = t.borrow_mut();
        let Some(Tape::Replay(items, at)) = t.as_mut() else { return None };
        let out = match items.get(*at) {
            Some((name, n, v)) if *name == op && *n == elems => match v.downcast_ref::<T>() {
                Some(v) => Ok(v.clone()),
                None => Err(mismatch(op, name)),
            },
            Some((name, _, _)) => Err(mismatch(op, name)),
            None => Err(Error::invalid(
                "recompute",
                format!("the recomputed block ran more {op} ops than its forward did: it must run the same ops again"),
            )),
        };
        *at += 1;
        Some(out)
    });
    if let Some(out) = replayed {
        return out;
    }
    // a kernel written with ops (a backend's composite default) keeps nothing of its own
    let inside = TapeGuard::set(None);
    let out = compute();
    drop(inside);
    let out = out?;
    TAPE.with(|t| {
        if let Some(Tape::Record(items)) = t.borrow_mut().as_mut() {
            items.push((op, elems, Box::new(out.clone())));
        }
    });
    Ok(out)
}

fn mismatch(op: &str, kept: &str) -> Error {
    Error::invalid(
        "recompute",
        format!(
            "the recomputed block ran {op} where its forward kept the output of another {kept}: it must run the \
             same ops again"
        ),
    )
}

impl<B: Backend> Tensor<B> {
    /// `f(inputs)`, recomputed in the backward pass instead of keeping its activations.
    ///
    /// `params` are the variables `f` reads besides `inputs` (a block's weights): their
    /// gradients reach the store as if `f` had been recorded. `f` must compute the same
    /// values when called again (no dropout drawn from a changing state). With gradients
    /// off, or when nothing needs them, or inside
    /// [`record_inside_recompute`](crate::autograd::record_inside_recompute) (a planning
    /// trace), this is just `f(inputs)`, recorded. Second-order gradients through a
    /// recomputed block are refused.
    pub fn recompute<F>(inputs: &[&Tensor<B>], params: &[&Tensor<B>], f: F) -> Result<Tensor<B>>
    where
        F: Fn(&[Tensor<B>]) -> Result<Tensor<B>> + Send + Sync + 'static,
    {
        Self::rematerialised(inputs, params, f, false)
    }

    /// [`Tensor::recompute`], keeping the outputs of the matmuls, fused attention and
    /// collectives `f` runs (as its forward made them) and recomputing only its other ops
    /// in the backward pass: no matmul and no communication runs twice. `f` must run the
    /// same ops when called again; a recomputation that does not is refused.
    pub fn recompute_selective<F>(inputs: &[&Tensor<B>], params: &[&Tensor<B>], f: F) -> Result<Tensor<B>>
    where
        F: Fn(&[Tensor<B>]) -> Result<Tensor<B>> + Send + Sync + 'static,
    {
        Self::rematerialised(inputs, params, f, true)
    }

    /// [`Tensor::recompute`] (or, with `mode` [`Recompute::Selective`],
    /// [`Tensor::recompute_selective`]) of a block with several outputs: `f` returns them
    /// all, the same number each time it runs, and the gradients arriving at any of them
    /// reach `inputs` and `params` through one recomputation (the block again, then one
    /// backward pass seeded at every output). A mixture of experts' router statistics leave
    /// a recomputed decoder layer this way, beside its hidden state. `mode`
    /// [`Recompute::None`] runs `f` recorded.
    pub fn recompute_many<F>(
        mode: Recompute,
        inputs: &[&Tensor<B>],
        params: &[&Tensor<B>],
        f: F,
    ) -> Result<Vec<Tensor<B>>>
    where
        F: Fn(&[Tensor<B>]) -> Result<Vec<Tensor<B>>> + Send + Sync + 'static,
    {
        if !mode.on() {
            let owned: Vec<Tensor<B>> = inputs.iter().map(|t| (*t).clone()).collect();
            return f(&owned);
        }
        Self::rematerialised_many(inputs, params, f, mode == Recompute::Selective)
    }

    /// `f(inputs)` recomputed in the backward pass, keeping what selective recompute keeps
    /// when `selective`.
    fn rematerialised<F>(inputs: &[&Tensor<B>], params: &[&Tensor<B>], f: F, selective: bool) -> Result<Tensor<B>>
    where
        F: Fn(&[Tensor<B>]) -> Result<Tensor<B>> + Send + Sync + 'static,
    {
        let mut outs = Self::rematerialised_many(inputs, params, move |xs| Ok(vec![f(xs)?]), selective)?;
        match (outs.pop(), outs.is_empty()) {
            (Some(y), true) => Ok(y),
            _ => Err(Error::invalid("recompute", "a one-output block returned another count")),
        }
    }

    /// The outputs of `f(inputs)`, recomputed in the backward pass (keeping what selective
    /// recompute keeps when `selective`). One output is one recorded node; several are one
    /// node each, fed by a shared node that recomputes once all their gradients are in.
    fn rematerialised_many<F>(
        inputs: &[&Tensor<B>],
        params: &[&Tensor<B>],
        f: F,
        selective: bool,
    ) -> Result<Vec<Tensor<B>>>
    where
        F: Fn(&[Tensor<B>]) -> Result<Vec<Tensor<B>>> + Send + Sync + 'static,
    {
        let owned: Vec<Tensor<B>> = inputs.iter().map(|t| (*t).clone()).collect();
        let needed = inputs.iter().chain(params).any(|t| t.requires_grad());
        if !is_grad_enabled() || !is_recompute_enabled() || !needed {
            return f(&owned);
        }
        let (outs, tape) = if selective {
            let guard = TapeGuard::set(Some(Tape::Record(Vec::new())));
            let outs = no_grad(|| f(&owned))?;
            match guard.finish() {
                Some(Tape::Record(items)) => (outs, Some(Arc::new(items))),
                _ => unreachable!("the block's tape is put back as it was recorded"),
            }
        } else {
            // a block recomputed whole inside a selective one keeps nothing of its own
            let _none = TapeGuard::set(None);
            (no_grad(|| f(&owned))?, None)
        };
        let count = outs.len();
        let f = Arc::new(f);
        let kept: Vec<Tensor<B>> = params.iter().map(|t| (*t).clone()).collect();
        let all: Vec<&Tensor<B>> = inputs.iter().chain(params).copied().collect();
        // the gradients of the inputs and params from those of the outputs (`seeds`, one
        // per output, `None` where none arrived)
        let backward = move |seeds: Vec<Option<Tensor<B>>>| -> Result<Vec<Option<Tensor<B>>>> {
            if is_grad_enabled() {
                return Err(Error::unsupported(
                    "recompute",
                    "second-order gradients through a recomputed block are not supported: turn recompute off \
                     where a gradient graph is built (backward_graph, grad_graph)",
                ));
            }
            // the block again, recorded, from its saved inputs (fresh leaves for those that
            // need a gradient)
            let _on = GradModeGuard::set(true);
            let xs: Vec<Tensor<B>> =
                owned.iter().map(|x| if x.requires_grad() { x.detach().into_var() } else { x.detach() }).collect();
            let ys = match &tape {
                Some(items) => {
                    let guard = TapeGuard::set(Some(Tape::Replay(items.clone(), 0)));
                    let ys = f(&xs)?;
                    match guard.finish() {
                        Some(Tape::Replay(items, at)) if at == items.len() => ys,
                        _ => {
                            return Err(Error::invalid(
                                "recompute",
                                "the recomputed block ran fewer kept ops than its forward did: it must run the same ops again",
                            ))
                        }
                    }
                }
                None => {
                    let _none = TapeGuard::set(None);
                    f(&xs)?
                }
            };
            if ys.len() != seeds.len() {
                return Err(Error::invalid(
                    "recompute",
                    format!("the recomputed block returned {} outputs, its forward {}", ys.len(), seeds.len()),
                ));
            }
            let wrt: Vec<&Tensor<B>> = xs.iter().chain(&kept).collect();
            let live: Vec<(Tensor<B>, Tensor<B>)> = ys
                .into_iter()
                .zip(seeds)
                .filter_map(|(y, g)| g.filter(|_| y.requires_grad()).map(|g| (y, g)))
                .collect();
            let mut grads = match live.len() {
                0 => return Ok(vec![None; wrt.len()]),
                1 => {
                    let (y, g) = &live[0];
                    drop(_on);
                    y.grads_seeded(g.clone(), &wrt)?
                }
                _ => {
                    // one root over every output: its backward hands each output its seed
                    let b = live[0].0.backend().clone();
                    let roots: Vec<&Tensor<B>> = live.iter().map(|(y, _)| y).collect();
                    let seeds: Vec<Tensor<B>> = live.iter().map(|(_, g)| g.clone()).collect();
                    let zero = no_grad(|| Tensor::zeros(&b, [], crate::DType::F32))?;
                    let scalar = crate::Shape::new(Vec::<usize>::new());
                    let join = Tensor::from_op_placed(
                        &b,
                        zero.storage().clone(),
                        scalar.clone(),
                        scalar,
                        crate::Placements::default(),
                        crate::DType::F32,
                        "recompute_outputs",
                        &roots,
                        move |_| Ok(seeds.iter().cloned().map(Some).collect()),
                    );
                    drop(_on);
                    join.grads_seeded(zero, &wrt)?
                }
            };
            // an input that needed no gradient gets none
            for (i, x) in owned.iter().enumerate() {
                if !x.requires_grad() {
                    grads[i] = None;
                }
            }
            Ok(grads)
        };
        let op = if selective { "recompute_selective" } else { "recompute" };
        let placed = |t: &Tensor<B>, op: &'static str, ins: &[&Tensor<B>], bw| {
            Tensor::from_op_placed(
                t.backend(),
                t.storage().clone(),
                t.shape().clone(),
                t.local_shape().clone(),
                t.placements(),
                t.dtype(),
                op,
                ins,
                bw,
            )
        };
        if count == 1 {
            let bw = move |g: &Tensor<B>| backward(vec![Some(g.clone())]);
            return Ok(vec![placed(&outs[0], op, &all, Box::new(bw) as Box<BackwardFn<B>>)]);
        }
        // several outputs: each hands its gradient to the shared slots; the block's node,
        // reached after all of them (they read its token), recomputes once
        let slots: Arc<Mutex<Vec<Option<Tensor<B>>>>> = Arc::new(Mutex::new(vec![None; count]));
        let b = outs
            .first()
            .map(|t| t.backend().clone())
            .ok_or_else(|| Error::invalid("recompute", "a block with no outputs"))?;
        let token = {
            let slots = slots.clone();
            let zero = no_grad(|| Tensor::zeros(&b, [], crate::DType::F32))?;
            let bw = move |_: &Tensor<B>| {
                let seeds = std::mem::take(&mut *slots.lock().unwrap_or_else(|p| p.into_inner()));
                backward(seeds)
            };
            placed(&zero, op, &all, Box::new(bw) as Box<BackwardFn<B>>)
        };
        Ok(outs
            .iter()
            .enumerate()
            .map(|(i, y)| {
                let (slots, b) = (slots.clone(), b.clone());
                let bw = move |g: &Tensor<B>| -> Result<Vec<Option<Tensor<B>>>> {
                    let mut s = slots.lock().unwrap_or_else(|p| p.into_inner());
                    s[i] = Some(match s[i].take() {
                        Some(prev) => prev.add(g)?,
                        None => g.clone(),
                    });
                    Ok(vec![Some(Tensor::zeros(&b, [], crate::DType::F32)?)])
                };
                placed(y, "recompute_output", &[&token], Box::new(bw) as Box<BackwardFn<B>>)
            })
            .collect())
    }
}
