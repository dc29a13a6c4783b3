//! Reverse-mode autograd over [`Tensor`]: nodes, `no_grad` scopes and the gradient store.
//!
//! Each op that takes a tensor requiring gradients records a `Node`: its inputs and a
//! closure that maps the output gradient to the inputs' gradients, written with tensor ops
//! (so it runs on every backend). [`Tensor::backward`] walks the graph in reverse
//! topological order with gradient recording turned off; [`Tensor::backward_graph`] walks
//! it with recording on, so the gradients are themselves differentiable (gradients of
//! gradients: second-order MAML, Hessian-vector products, gradient penalties). Gradient
//! functions that use a fused backend kernel, or values saved from the forward pass, take
//! a composite path of recorded ops when a graph is being built.

use crate::{Backend, Error, Result, Tensor, TensorId};
use std::cell::Cell;
use std::collections::{HashMap, HashSet};

/// The gradient function of one op.
pub(crate) type BackwardFn<B> = Box<dyn Fn(&Tensor<B>) -> Result<Vec<Option<Tensor<B>>>> + Send + Sync>;

/// One recorded op: its name, its inputs and its gradient function.
pub(crate) struct Node<B: Backend> {
    pub(crate) op: &'static str,
    pub(crate) inputs: Vec<Tensor<B>>,
    pub(crate) backward: BackwardFn<B>,
    pub(crate) meta: OpMeta,
}

/// What a recorded op did beyond its name and shapes, for the dataflow analysis that
/// derives sharding plans (`planning::trace`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum OpMeta {
    /// Nothing more to know.
    #[default]
    None,
    /// A matmul with its transpose flags.
    Matmul {
        /// lhs transposed
        trans_a: bool,
        /// rhs transposed
        trans_b: bool,
    },
    /// A permutation (`out.dims[i] = in.dims[perm[i]]`).
    Permute(Vec<usize>),
    /// An op along one dimension (reductions, narrow, cat, index_select).
    Dim(usize),
    /// A ZeRO-3 parameter gathered whole from its dp pieces: its gradient keeps its partial
    /// sum over dp (the gather's backward reduce-scatters it).
    GatheredParam,
}

thread_local! {
    static GRAD_ENABLED: Cell<bool> = const { Cell::new(true) };
    static RECOMPUTE_ENABLED: Cell<bool> = const { Cell::new(true) };
}

/// True unless the current thread is inside a [`record_inside_recompute`] scope: blocks
/// given to [`Tensor::recompute`] then drop their activations.
pub fn is_recompute_enabled() -> bool {
    RECOMPUTE_ENABLED.with(|g| g.get())
}

/// Sets whether [`Tensor::recompute`] blocks drop their activations on this thread until
/// the guard drops (the previous mode comes back).
pub struct RecomputeGuard(bool);

impl RecomputeGuard {
    /// Sets the mode to `enabled`.
    pub fn set(enabled: bool) -> Self {
        RecomputeGuard(RECOMPUTE_ENABLED.with(|g| g.replace(enabled)))
    }
}

impl Drop for RecomputeGuard {
    fn drop(&mut self) {
        RECOMPUTE_ENABLED.with(|g| g.set(self.0));
    }
}

/// Runs `f` with every [`Tensor::recompute`] block recorded op by op, as if it were not a
/// block: a planning trace reads the ops inside (the two rules need them), a run that
/// recomputes does not.
pub fn record_inside_recompute<R>(f: impl FnOnce() -> R) -> R {
    let _g = RecomputeGuard::set(false);
    f()
}

/// True unless the current thread is inside a [`no_grad`] scope.
pub fn is_grad_enabled() -> bool {
    GRAD_ENABLED.with(|g| g.get())
}

/// Restores the previous gradient mode when dropped.
pub struct GradModeGuard(bool);

impl GradModeGuard {
    /// Turns gradient recording off for this thread until the guard drops.
    pub fn no_grad() -> Self {
        Self::set(false)
    }

    /// Sets gradient recording on this thread to `enabled` until the guard drops.
    pub fn set(enabled: bool) -> Self {
        GradModeGuard(GRAD_ENABLED.with(|g| g.replace(enabled)))
    }
}

impl Drop for GradModeGuard {
    fn drop(&mut self) {
        GRAD_ENABLED.with(|g| g.set(self.0));
    }
}

/// Runs `f` without recording gradients (inference, optimizer updates).
pub fn no_grad<R>(f: impl FnOnce() -> R) -> R {
    let _g = GradModeGuard::no_grad();
    f()
}

/// Gradients of variables, keyed by [`TensorId`].
pub struct GradStore<B: Backend> {
    grads: HashMap<TensorId, Tensor<B>>,
}

impl<B: Backend> Default for GradStore<B> {
    fn default() -> Self {
        GradStore { grads: HashMap::new() }
    }
}

impl<B: Backend> GradStore<B> {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
    /// The gradient of variable `t`, if it received one.
    pub fn get(&self, t: &Tensor<B>) -> Option<&Tensor<B>> {
        self.grads.get(&t.id())
    }
    /// The gradient by id.
    pub fn get_id(&self, id: TensorId) -> Option<&Tensor<B>> {
        self.grads.get(&id)
    }
    /// Removes and returns the gradient of `t`.
    pub fn remove(&mut self, t: &Tensor<B>) -> Option<Tensor<B>> {
        self.grads.remove(&t.id())
    }
    /// Sets the gradient of `t`.
    pub fn insert(&mut self, t: &Tensor<B>, g: Tensor<B>) {
        self.grads.insert(t.id(), g);
    }
    /// Adds `g` to the gradient held for `id`.
    pub fn accumulate(&mut self, id: TensorId, g: Tensor<B>) -> Result<()> {
        let _ng = GradModeGuard::no_grad();
        self.accumulate_in_mode(id, g)
    }

    /// [`GradStore::accumulate`] in the thread's current gradient mode (recorded when a
    /// graph of the gradients is being built).
    fn accumulate_in_mode(&mut self, id: TensorId, g: Tensor<B>) -> Result<()> {
        let v = match self.grads.remove(&id) {
            Some(prev) => {
                if prev.shape() != g.shape() {
                    return Err(Error::ShapeMismatch {
                        op: "grad accumulate",
                        lhs: prev.shape().clone(),
                        rhs: g.shape().clone(),
                    });
                }
                prev.add(&g)?
            }
            None => g,
        };
        self.grads.insert(id, v);
        Ok(())
    }
    /// Number of gradients held.
    pub fn len(&self) -> usize {
        self.grads.len()
    }
    /// True when no gradient is held.
    pub fn is_empty(&self) -> bool {
        self.grads.is_empty()
    }
    /// Iterates over `(id, gradient)`.
    pub fn iter(&self) -> impl Iterator<Item = (&TensorId, &Tensor<B>)> {
        self.grads.iter()
    }
}

/// What [`Tensor::backward_into_with`] calls with each variable whose gradient is complete.
pub type OnGradReady<'a, B> = dyn FnMut(&Tensor<B>, &mut GradStore<B>) -> Result<()> + 'a;

impl<B: Backend> Tensor<B> {
    /// Gradients of this tensor (seeded with ones) with respect to every variable it
    /// depends on.
    pub fn backward(&self) -> Result<GradStore<B>> {
        let mut store = GradStore::new();
        self.backward_into(&mut store)?;
        Ok(store)
    }

    /// Like [`Tensor::backward`], adding into `store`: calling it for several micro-batches
    /// accumulates their gradients.
    pub fn backward_into(&self, store: &mut GradStore<B>) -> Result<()> {
        self.backward_into_with(store, &mut |_, _| Ok(()))
    }

    /// [`Tensor::backward_into`], calling `on_ready(variable, store)` as soon as a
    /// variable's gradient is complete in `store` (every consumer of the variable has been
    /// differentiated: reverse topological order reaches a tensor after all its
    /// consumers). The order of the calls is the same on every rank running the same
    /// model: data-parallel gradient buckets start their all-reduce from here while the
    /// rest of the backward pass runs, and ZeRO-2 swaps the gradient for its slice.
    pub fn backward_into_with(&self, store: &mut GradStore<B>, on_ready: &mut OnGradReady<'_, B>) -> Result<()> {
        self.walk(store, on_ready, false, &mut [])
    }

    /// Gradients that record their own graph (PyTorch's `create_graph=True`): each
    /// gradient in the store depends on the variables as the forward pass did, so
    /// `grads.get(&w)` can be differentiated again (a Hessian-vector product is the
    /// backward of `sum(grad * v)`). Slower than [`Tensor::backward`]: the gradient
    /// functions run as recorded composite ops instead of fused kernels.
    pub fn backward_graph(&self) -> Result<GradStore<B>> {
        let mut store = GradStore::new();
        self.walk(&mut store, &mut |_, _| Ok(()), true, &mut [])?;
        Ok(store)
    }

    /// The gradients of this tensor with respect to `wrt` (any tensors it depends on,
    /// intermediate ones included: PyTorch's `autograd.grad(self, wrt, create_graph=True)`),
    /// recorded as a graph; `None` for a tensor the output does not depend on. MAML takes
    /// per-task gradients this way, with respect to per-task copies of the weights.
    pub fn grad_graph(&self, wrt: &[&Tensor<B>]) -> Result<Vec<Option<Tensor<B>>>> {
        let mut want: Vec<(TensorId, Option<Tensor<B>>)> = wrt.iter().map(|t| (t.id(), None)).collect();
        self.walk(&mut GradStore::new(), &mut |_, _| Ok(()), true, &mut want)?;
        Ok(want.into_iter().map(|(_, g)| g).collect())
    }

    /// The gradients of this tensor, seeded with `seed` (the gradient of a later loss with
    /// respect to it), with respect to `wrt`; `None` where it does not depend on one. No
    /// graph is recorded. The backward pass of a recomputed block runs through this.
    pub(crate) fn grads_seeded(&self, seed: Tensor<B>, wrt: &[&Tensor<B>]) -> Result<Vec<Option<Tensor<B>>>> {
        let mut want: Vec<(TensorId, Option<Tensor<B>>)> = wrt.iter().map(|t| (t.id(), None)).collect();
        let mut store = GradStore::new();
        self.walk_from(Some(seed), &mut store, &mut |_, _| Ok(()), false, &mut want)?;
        // a variable reached that is not in `wrt` would lose its gradient here
        if store.iter().any(|(id, _)| !want.iter().any(|(w, _)| w == id)) {
            return Err(Error::invalid(
                "recompute",
                "the recomputed block reads a variable not listed in its params: its gradient would be lost",
            ));
        }
        Ok(want.into_iter().map(|(_, g)| g).collect())
    }

    fn walk(
        &self,
        store: &mut GradStore<B>,
        on_ready: &mut OnGradReady<'_, B>,
        create_graph: bool,
        want: &mut [(TensorId, Option<Tensor<B>>)],
    ) -> Result<()> {
        self.walk_from(None, store, on_ready, create_graph, want)
    }

    fn walk_from(
        &self,
        seed: Option<Tensor<B>>,
        store: &mut GradStore<B>,
        on_ready: &mut OnGradReady<'_, B>,
        create_graph: bool,
        want: &mut [(TensorId, Option<Tensor<B>>)],
    ) -> Result<()> {
        if !self.requires_grad() {
            return Err(Error::invalid(
                "backward",
                "the tensor does not depend on any variable (or was computed under no_grad)",
            ));
        }
        let _mode = GradModeGuard::set(create_graph);
        let order = topo_order(self);
        let mut pending: HashMap<TensorId, Tensor<B>> = HashMap::new();
        let seed = match seed {
            Some(s) => s,
            None => self.ones_like()?,
        };
        pending.insert(self.id(), seed);
        for t in order.iter().rev() {
            let Some(g) = pending.remove(&t.id()) else { continue };
            let g = deliver(t, g)?;
            for (id, slot) in want.iter_mut() {
                if *id == t.id() {
                    *slot = Some(g.clone());
                }
            }
            if t.is_var() {
                store.accumulate_in_mode(t.id(), g.clone())?;
                on_ready(t, store)?;
            }
            let Some(node) = &t.0.node else { continue };
            let grads = (node.backward)(&g)?;
            for (input, gi) in node.inputs.iter().zip(grads) {
                let Some(gi) = gi else { continue };
                if !input.requires_grad() {
                    continue;
                }
                if gi.shape() != input.shape() {
                    return Err(Error::invalid(
                        "backward",
                        format!("gradient of {} has shape {}, expected {}", node.op, gi.shape(), input.shape()),
                    ));
                }
                let gi = if gi.dtype() != input.dtype() { gi.cast(input.dtype())? } else { gi };
                match pending.remove(&input.id()) {
                    Some(prev) => pending.insert(input.id(), prev.add(&gi)?),
                    None => pending.insert(input.id(), gi),
                };
            }
        }
        Ok(())
    }
}

/// The gradient of `t`, laid out as `t` is (partial sums summed): gradients from every
/// consumer of `t` accumulate first, so a replicated activation feeding several split
/// layers costs one all-reduce (Megatron's conjugate of the identity). A variable's
/// gradient keeps a partial sum over the data-parallel axis: the optimizer reduces those
/// in buckets (as does the gradient of a ZeRO-3 parameter gathered for a unit: its gather's
/// backward reduce-scatters it).
fn deliver<B: Backend>(t: &Tensor<B>, g: Tensor<B>) -> Result<Tensor<B>> {
    use crate::{MeshAxis, PartialOp, Placement};
    if !t.is_sharded() && !g.is_sharded() {
        return Ok(g);
    }
    let mut target = crate::placement::without_partial(t.placements());
    // a variable's gradient, and a gathered ZeRO-3 parameter's (its backward
    // reduce-scatters), keep their partial sum over dp
    let gathered = t.0.node.as_ref().is_some_and(|n| n.meta == OpMeta::GatheredParam);
    if (t.is_var() || gathered) && g.placements().get(MeshAxis::Dp) == Placement::Partial(PartialOp::Sum) {
        target = target.with(MeshAxis::Dp, Placement::Partial(PartialOp::Sum));
    }
    if g.placements() == target {
        Ok(g)
    } else {
        g.redistribute(target)
    }
}

/// Tensors reachable from `root` through recorded nodes, inputs before outputs.
fn topo_order<B: Backend>(root: &Tensor<B>) -> Vec<Tensor<B>> {
    let mut order = Vec::new();
    let mut seen = HashSet::new();
    let mut stack: Vec<(Tensor<B>, bool)> = vec![(root.clone(), false)];
    while let Some((t, expanded)) = stack.pop() {
        if expanded {
            order.push(t);
            continue;
        }
        if !seen.insert(t.id()) {
            continue;
        }
        stack.push((t.clone(), true));
        if let Some(node) = &t.0.node {
            for i in &node.inputs {
                if i.requires_grad() && !seen.contains(&i.id()) {
                    stack.push((i.clone(), false));
                }
            }
        }
    }
    order
}
