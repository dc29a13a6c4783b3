//! Optimizer offload ([`Offloaded`]): another optimizer run on the host's CPU cores with
//! its state in host memory, for a device backend whose memory is the scarce one. Each
//! update downloads the gradients, updates f32 host copies of the parameters (the host
//! masters) and the state on the CPU backend, and uploads the updated parameters; the
//! device never holds the optimizer's state (AdamW: 8 bytes per parameter).

use super::Optimizer;
use crate::cpu::Cpu;
use crate::nn::Module;
use crate::{Backend, DType, GradStore, Result, Tensor};
use std::collections::BTreeMap;

/// `inner`, an optimizer on the CPU backend, updating a device backend `B`'s parameters.
pub struct Offloaded<B: Backend> {
    host: Cpu,
    inner: Box<dyn Optimizer<Cpu>>,
    /// The host masters: f32 copies of the parameters, by name (made at the first update,
    /// and again after a state is loaded).
    masters: BTreeMap<String, Tensor<Cpu>>,
    /// The device the parameters live on (known from the first update or loaded state).
    device: Option<B>,
}

impl<B: Backend> Offloaded<B> {
    /// Runs `inner` on `threads` host threads.
    pub fn new(inner: Box<dyn Optimizer<Cpu>>, threads: usize) -> Self {
        Offloaded { host: Cpu::new(threads.max(1)), inner, masters: BTreeMap::new(), device: None }
    }
}

/// `t`'s local shard on the host, as f32, laid out as `t` (global shape and placements).
fn to_host<B: Backend>(host: &Cpu, t: &Tensor<B>) -> Result<Tensor<Cpu>> {
    let data = t.local_to_host()?;
    let data = if data.dtype() == DType::F32 { data } else { data.cast(DType::F32) };
    let s = crate::Backend::upload_owned(host, data)?;
    Ok(Tensor::from_local(host, s, t.shape().clone(), t.local_shape().clone(), t.placements(), DType::F32))
}

/// `t` (a host tensor) on `b`, laid out as `like`, in `like`'s dtype.
fn to_device<B: Backend>(b: &B, t: &Tensor<Cpu>, like: &Tensor<B>) -> Result<Tensor<B>> {
    let data = t.local_to_host()?;
    let data = if like.dtype() == DType::F32 { data } else { data.cast(like.dtype()) };
    let s = b.upload_owned(data)?;
    Ok(Tensor::from_local(b, s, like.shape().clone(), like.local_shape().clone(), like.placements(), like.dtype()))
}

impl<B: Backend> Optimizer<B> for Offloaded<B> {
    fn set_lr(&mut self, lr: f64) {
        self.inner.set_lr(lr);
    }

    fn update(&mut self, model: &mut dyn Module<B>, grads: &GradStore<B>) -> Result<()> {
        let mut host_grads = GradStore::new();
        let mut err = None;
        let (host, masters, device) = (&self.host, &mut self.masters, &mut self.device);
        model.visit("", &mut |name, p| {
            let Some(g) = grads.get(p).filter(|_| err.is_none()) else { return };
            device.get_or_insert_with(|| p.backend().clone());
            let made = match masters.get(name) {
                Some(m) => Ok(m.clone()),
                None => to_host(host, p).inspect(|m| {
                    masters.insert(name.to_string(), m.clone());
                }),
            };
            match made.and_then(|m| Ok((m, to_host(host, g)?))) {
                Ok((m, hg)) => host_grads.insert(&m, hg),
                Err(e) => err = Some(e),
            }
        });
        if let Some(e) = err {
            return Err(e);
        }
        self.inner.update(&mut self.masters, &host_grads)?;
        drop(host_grads);
        let masters = &self.masters;
        super::update_each(model, |name, p| match (grads.get(p), masters.get(name)) {
            (Some(_), Some(m)) => Ok(Some(to_device(p.backend(), m, p)?.storage().clone())),
            _ => Ok(None),
        })
    }

    fn steps(&self) -> u64 {
        self.inner.steps()
    }

    fn state_tensors(&self) -> Result<Vec<(String, Tensor<B>)>> {
        // the checkpoint writer takes `B`'s tensors: the host state is handed over uploaded
        let states = self.inner.state_tensors()?;
        let Some(b) = &self.device else { return Ok(Vec::new()) };
        states
            .into_iter()
            .map(|(n, t)| {
                let s = b.upload_owned(t.local_to_host()?)?;
                let (shape, local) = (t.shape().clone(), t.local_shape().clone());
                Ok((n, Tensor::from_local(b, s, shape, local, t.placements(), t.dtype())))
            })
            .collect()
    }

    fn load_state(&mut self, steps: u64, state: BTreeMap<String, Tensor<B>>) -> Result<()> {
        if let Some(t) = state.values().next() {
            self.device = Some(t.backend().clone());
        }
        let host = state.into_iter().map(|(n, t)| Ok((n, to_host(&self.host, &t)?))).collect::<Result<_>>()?;
        // the parameters were restored too: the host masters are taken again at the next update
        self.masters.clear();
        self.inner.load_state(steps, host)
    }
}
