//! AdamW (decoupled weight decay), with optional ZeRO-1: the moments are sharded over the
//! data-parallel axis (reduce-scatter the gradient, update this rank's slice, all-gather
//! the parameter), which gives the same numbers as the replicated update.

use super::{grad_of, local_view};
use crate::nn::Module;
use crate::ops::adamw::{AdamItem, AdamMasterItem, AdamStep};
use crate::runtime::Comm;
use crate::sharding::{FlatShard, ShardLayout};
use crate::{Backend, DType, Error, GradStore, Result, Tensor};
use std::collections::BTreeMap;
use std::sync::Arc;

/// AdamW hyper-parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWConfig {
    /// Learning rate.
    pub lr: f64,
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Added to the root of the second moment.
    pub eps: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    /// Shard the moments over the data-parallel axis (ZeRO stage 1).
    pub zero1: bool,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        AdamWConfig { lr: 1e-3, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0, zero1: false }
    }
}

/// The AdamW optimizer over a module's named parameters.
pub struct AdamW<B: Backend> {
    /// Hyper-parameters (the learning rate may be changed between steps).
    pub cfg: AdamWConfig,
    step: u64,
    state: BTreeMap<String, (Tensor<B>, Tensor<B>)>,
    /// The rank's communicator, for ZeRO-1 (none: every update is local).
    comm: Option<Comm<B>>,
}

impl<B: Backend> AdamW<B> {
    /// A fresh optimizer.
    pub fn new(cfg: AdamWConfig) -> Self {
        AdamW { cfg, step: 0, state: BTreeMap::new(), comm: None }
    }

    /// The same optimizer updating over `comm` (ZeRO-1 shards its moments over `comm`'s
    /// data-parallel axis; without a communicator every update is local).
    pub fn with_comm(mut self, comm: Option<Comm<B>>) -> Self {
        self.comm = comm;
        self
    }

    /// Steps taken so far.
    pub fn steps(&self) -> u64 {
        self.step
    }

    /// The moments by parameter name (this rank's local tensors).
    pub fn state(&self) -> &BTreeMap<String, (Tensor<B>, Tensor<B>)> {
        &self.state
    }

    /// Restores the step count and the moments (as saved from [`AdamW::state`]).
    pub fn set_state(&mut self, step: u64, state: BTreeMap<String, (Tensor<B>, Tensor<B>)>) {
        self.step = step;
        self.state = state;
    }

    /// Bytes of optimizer state held by this rank.
    pub fn state_bytes(&self) -> usize {
        self.state.values().map(|(m, v)| (m.elem_count() + v.elem_count()) * m.dtype().size_in_bytes()).sum()
    }

    /// Counts one more step and returns its scalars.
    fn next_step(&mut self) -> AdamStep {
        self.step += 1;
        let c = self.cfg;
        let t = self.step as i32;
        AdamStep {
            lr: c.lr,
            beta1: c.beta1,
            beta2: c.beta2,
            eps: c.eps,
            weight_decay: c.weight_decay,
            bias1: 1.0 - c.beta1.powi(t),
            bias2: 1.0 - c.beta2.powi(t),
        }
    }

    /// Whether the moments are sharded over a data-parallel axis of more than one rank.
    fn sharded(&self) -> bool {
        self.cfg.zero1 && self.comm.as_ref().is_some_and(|c| c.mesh().dp > 1)
    }

    /// One update of every parameter of `model` that has a gradient in `grads`.
    pub fn step<M: Module<B> + ?Sized>(&mut self, model: &mut M, grads: &GradStore<B>) -> Result<()> {
        let h = self.next_step();
        let comm = self.comm.clone();
        let zero = self.sharded();
        let state = &mut self.state;
        // one fused pass per parameter (the backend's `adamw`, composite by default)
        let update = |x: &Tensor<B>, g: &Tensor<B>, st: &mut (Tensor<B>, Tensor<B>)| -> Result<Tensor<B>> {
            let b = x.backend();
            let n = x.elem_count();
            let g = if g.dtype() == x.dtype() { g.clone() } else { g.cast(x.dtype())? };
            let dt = x.dtype();
            // moments held by nobody else are updated in their own buffers (a checkpoint
            // being written holds them too: then the new moments are fresh tensors)
            let (m, v) = (&mut st.0, &mut st.1);
            if let (Some(mi), Some(vi)) = (Arc::get_mut(&mut m.0), Arc::get_mut(&mut v.0)) {
                let nx = b.adamw_into(x.storage(), g.storage(), &mut mi.storage, &mut vi.storage, n, &h)?;
                return Ok(Tensor::from_storage(b, nx, x.shape().clone(), dt));
            }
            let (nx, nm, nv) = b.adamw(x.storage(), g.storage(), st.0.storage(), st.1.storage(), n, &h)?;
            st.0 = Tensor::from_storage(b, nm, st.0.shape().clone(), dt);
            st.1 = Tensor::from_storage(b, nv, st.1.shape().clone(), dt);
            Ok(Tensor::from_storage(b, nx, x.shape().clone(), dt))
        };
        // the moments of `name`, created as zeros shaped like `x` on first use
        let moments = |state: &mut BTreeMap<String, (Tensor<B>, Tensor<B>)>, name: &str, x: &Tensor<B>| -> Result<()> {
            if !state.contains_key(name) {
                state.insert(name.to_string(), (x.zeros_like()?, x.zeros_like()?));
            }
            Ok(())
        };
        let cm = match (&comm, zero) {
            (Some(cm), true) => cm,
            _ => return crate::no_grad(|| update_all(state, model, grads, &h, update, moments)),
        };
        super::update_each(model, |name, p| {
            let Some(g) = grads.get(p) else { return Ok(None) };
            // ZeRO-1: this dp rank owns one contiguous slice of the flat local shard
            let shard = FlatShard::of(p, cm);
            let gslice = shard.reduce_scatter(cm, g)?;
            let xslice = shard.own(cm, p)?;
            moments(state, name, &xslice)?;
            let nx = update(&xslice, &gslice, state.get_mut(name).expect("inserted above"))?;
            Ok(Some(shard.gather(cm, &nx, &ShardLayout::of(p))?.storage().clone()))
        })
    }
}

/// Parameters by name, each with its gradient (local views).
type WithGrads<B> = BTreeMap<String, (Tensor<B>, Tensor<B>)>;

/// The parameters of `model` with a gradient: their local views and local gradients (in
/// the gradient's dtype when `cast` is false, else the parameter's), by name.
fn with_grads<B: Backend, M: Module<B> + ?Sized>(model: &M, grads: &GradStore<B>, cast: bool) -> Result<WithGrads<B>> {
    let mut work = BTreeMap::new();
    let mut err = None;
    model.visit("", &mut |name, p| {
        if err.is_some() {
            return;
        }
        let g = match grad_of(name, p, grads) {
            Ok(Some(g)) if !cast || g.dtype() == p.dtype() => Ok(local_view(g)),
            Ok(Some(g)) => local_view(g).cast(p.dtype()),
            Ok(None) => return,
            Err(e) => Err(e),
        };
        match g {
            Ok(g) => drop(work.insert(name.to_string(), (local_view(p), g))),
            Err(e) => err = Some(e),
        }
    });
    err.map_or(Ok(work), Err)
}

impl<B: Backend> AdamW<B> {
    /// [`super::Optimizer::update_with_copies`] for replicated moments: one
    /// [`Backend::adamw_master_many`] over every f32 master with a gradient (moments shared
    /// with a checkpoint being written are copied first: the update never writes a buffer
    /// someone else reads). `None` when a master with a gradient is not f32.
    fn step_with_copies<M: Module<B> + ?Sized>(
        &mut self,
        masters: &mut M,
        grads: &GradStore<B>,
        grad_scale: f64,
        dtype: DType,
    ) -> Result<Option<BTreeMap<String, B::Storage>>> {
        let work = crate::no_grad(|| with_grads(masters, grads, false))?;
        if work.values().any(|(x, _)| x.dtype() != DType::F32) {
            return Ok(None);
        }
        let Some(b) = work.values().next().map(|(x, _)| x.backend().clone()) else { return Ok(Some(BTreeMap::new())) };
        let h = self.next_step();
        let state = &mut self.state;
        crate::no_grad(|| -> Result<Option<BTreeMap<String, B::Storage>>> {
            for (name, (x, _)) in &work {
                if !state.contains_key(name) {
                    state.insert(name.clone(), (x.zeros_like()?, x.zeros_like()?));
                }
            }
            let (mut names, mut items) = (Vec::new(), Vec::new());
            for (name, st) in state.iter_mut() {
                let Some((x, g)) = work.get(name) else { continue };
                // moments a checkpoint being written holds too: a tensor of our own over the
                // same buffer, which the backend copies before writing (its `adamw_into`)
                for t in [&mut st.0, &mut st.1] {
                    if Arc::get_mut(&mut t.0).is_none() {
                        *t = Tensor::from_storage(&b, t.storage().clone(), t.shape().clone(), t.dtype());
                    }
                }
                let (Some(mi), Some(vi)) = (Arc::get_mut(&mut st.0 .0), Arc::get_mut(&mut st.1 .0)) else {
                    return Err(Error::invalid("adamw", format!("the moments of {name} are shared")));
                };
                names.push(name.clone());
                let n = x.elem_count();
                items.push(AdamMasterItem {
                    x: x.storage(),
                    g: g.storage(),
                    m: &mut mi.storage,
                    v: &mut vi.storage,
                    n,
                });
            }
            let out = b.adamw_master_many(&mut items, &h, grad_scale, dtype)?;
            drop(items);
            if out.len() != names.len() {
                return Err(Error::invalid("adamw_master_many", format!("{} results for {}", out.len(), names.len())));
            }
            let (mut new, mut copies) = (BTreeMap::new(), BTreeMap::new());
            for (name, (nx, c)) in names.into_iter().zip(out) {
                new.insert(name.clone(), nx);
                copies.insert(name, c);
            }
            super::update_each(masters, |name, _| Ok(new.remove(name)))?;
            Ok(Some(copies))
        })
    }
}

/// The replicated update of every parameter of `model` with a gradient: one
/// [`Backend::adamw_many`] over all of them (moments shared with a checkpoint being
/// written go through `update`, which leaves those buffers alone).
fn update_all<B: Backend, M: Module<B> + ?Sized>(
    state: &mut BTreeMap<String, (Tensor<B>, Tensor<B>)>,
    model: &mut M,
    grads: &GradStore<B>,
    h: &AdamStep,
    update: impl Fn(&Tensor<B>, &Tensor<B>, &mut (Tensor<B>, Tensor<B>)) -> Result<Tensor<B>>,
    moments: impl Fn(&mut BTreeMap<String, (Tensor<B>, Tensor<B>)>, &str, &Tensor<B>) -> Result<()>,
) -> Result<()> {
    // the parameters with a gradient, their local views and gradients in their dtype
    let work = with_grads(model, grads, true)?;
    let Some(b) = work.values().next().map(|(x, _)| x.backend().clone()) else { return Ok(()) };
    for (name, (x, _)) in &work {
        moments(state, name, x)?;
    }
    let mut new: BTreeMap<String, B::Storage> = BTreeMap::new();
    let mut names = Vec::new();
    let mut items = Vec::new();
    for (name, st) in state.iter_mut() {
        let Some((x, g)) = work.get(name) else { continue };
        let unique = Arc::get_mut(&mut st.0 .0).is_some() && Arc::get_mut(&mut st.1 .0).is_some();
        if !unique {
            new.insert(name.clone(), update(x, g, st)?.storage().clone());
            continue;
        }
        if let (Some(mi), Some(vi)) = (Arc::get_mut(&mut st.0 .0), Arc::get_mut(&mut st.1 .0)) {
            let n = x.elem_count();
            names.push(name.clone());
            items.push(AdamItem { x: x.storage(), g: g.storage(), m: &mut mi.storage, v: &mut vi.storage, n });
        }
    }
    let out = b.adamw_many(&mut items, h)?;
    if out.len() != names.len() {
        return Err(Error::invalid("adamw_many", format!("{} new parameters for {}", out.len(), names.len())));
    }
    new.extend(names.into_iter().zip(out));
    super::update_each(model, |name, _| Ok(new.remove(name)))
}

impl<B: Backend> super::Optimizer<B> for AdamW<B> {
    fn set_lr(&mut self, lr: f64) {
        self.cfg.lr = lr;
    }
    fn set_comm(&mut self, comm: Option<Comm<B>>) {
        self.comm = comm;
    }
    fn update(&mut self, model: &mut dyn Module<B>, grads: &GradStore<B>) -> Result<()> {
        self.step(model, grads)
    }
    fn update_with_copies(
        &mut self,
        masters: &mut dyn Module<B>,
        grads: &GradStore<B>,
        grad_scale: f64,
        dtype: DType,
    ) -> Result<Option<BTreeMap<String, B::Storage>>> {
        if self.sharded() {
            return Ok(None);
        }
        self.step_with_copies(masters, grads, grad_scale, dtype)
    }
    fn steps(&self) -> u64 {
        self.step
    }
    fn state_tensors(&self) -> Result<Vec<(String, Tensor<B>)>> {
        let mut v = Vec::new();
        for (n, (m, s)) in &self.state {
            v.push((format!("adam_m/{n}"), m.clone()));
            v.push((format!("adam_v/{n}"), s.clone()));
        }
        Ok(v)
    }
    fn load_state(&mut self, steps: u64, mut state: BTreeMap<String, Tensor<B>>) -> Result<()> {
        let names: Vec<String> = state.keys().filter_map(|k| k.strip_prefix("adam_m/").map(str::to_string)).collect();
        let mut out = BTreeMap::new();
        for n in names {
            let (mk, vk) = (format!("adam_m/{n}"), format!("adam_v/{n}"));
            let m =
                state.remove(&mk).ok_or_else(|| Error::Parameter { name: n.clone(), msg: "adam_m missing".into() })?;
            let v = state.remove(&vk).ok_or_else(|| Error::Parameter {
                name: n.clone(),
                msg: "adam_v missing from the checkpoint".into(),
            })?;
            out.insert(n, (m, v));
        }
        self.set_state(steps, out);
        Ok(())
    }
}
