//! Optimizer offload ([`Offloaded`]): another optimizer run on the host's CPU cores with
//! its state and the f32 masters in host memory, for a device backend whose memory is the
//! scarce one. Each update downloads the gradients, updates the host masters and the
//! state on the CPU backend, and uploads the updated parameters in the dtype they are held
//! in on the device (a 16-bit run's compute copies): the device holds neither the
//! optimizer's state (AdamW: 8 bytes per parameter) nor f32 masters (4 more in a 16-bit
//! run). Checkpoints read the host tensors where they are ([`StateTensor::Host`]).

use super::state_tensor::{device_copy, host_copy};
use super::{StateTensor, TrainOptimizer};
use redco_core::nn::Module;
use redco_core::optim::{update_each, Optimizer};
use redco_core::runtime::Comm;
use redco_core::{Backend, DType, GradStore, Result, Tensor};
use redco_cpu::Cpu;
use std::collections::BTreeMap;

/// `inner`, an optimizer on the CPU backend, updating a device backend `B`'s parameters.
pub struct Offloaded<B: Backend> {
    host: Cpu,
    inner: Box<dyn Optimizer<Cpu>>,
    /// The host masters: f32 copies of the parameters, by name (seeded by the trainer from
    /// its f32 masters or a checkpoint; otherwise taken from a parameter at its first
    /// update).
    masters: BTreeMap<String, Tensor<Cpu>>,
    _device: std::marker::PhantomData<fn() -> B>,
}

impl<B: Backend> Offloaded<B> {
    /// Runs `inner` on `threads` host threads.
    pub fn new(inner: Box<dyn Optimizer<Cpu>>, threads: usize) -> Self {
        Offloaded { host: Cpu::new(threads.max(1)), inner, masters: BTreeMap::new(), _device: std::marker::PhantomData }
    }
}

impl<B: Backend> TrainOptimizer<B> for Offloaded<B> {
    fn set_lr(&mut self, lr: f64) {
        self.inner.set_lr(lr);
    }

    /// The host optimizer updates every parameter whole: nothing to communicate.
    fn set_comm(&mut self, comm: Option<Comm<B>>) {
        let _ = comm;
    }

    /// Not offered: the update runs on the host and uploads the compute copies itself.
    fn update_with_copies(
        &mut self,
        masters: &mut dyn Module<B>,
        grads: &GradStore<B>,
        grad_scale: f64,
        dtype: DType,
    ) -> Result<Option<BTreeMap<String, B::Storage>>> {
        let _ = (masters, grads, grad_scale, dtype);
        Ok(None)
    }

    fn update(&mut self, model: &mut dyn Module<B>, grads: &GradStore<B>) -> Result<()> {
        let mut host_grads = GradStore::new();
        let mut err = None;
        let (host, masters) = (&self.host, &mut self.masters);
        model.visit("", &mut |name, p| {
            let Some(g) = grads.get(p).filter(|_| err.is_none()) else { return };
            let made = match masters.get(name) {
                Some(m) => Ok(m.clone()),
                None => host_copy(host, p).inspect(|m| {
                    masters.insert(name.to_string(), m.clone());
                }),
            };
            match made.and_then(|m| Ok((m, host_copy(host, g)?))) {
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
        update_each(model, |name, p| match (grads.get(p), masters.get(name)) {
            (Some(_), Some(m)) => Ok(Some(device_copy(p.backend(), m, p)?.storage().clone())),
            _ => Ok(None),
        })
    }

    fn steps(&self) -> u64 {
        self.inner.steps()
    }

    fn state_tensors(&self) -> Result<Vec<(String, StateTensor<B>)>> {
        // the host state stays where it is: the checkpoint writer reads it from there
        let states = self.inner.state_tensors()?;
        Ok(states.into_iter().map(|(n, t)| (n, StateTensor::Host(t))).collect())
    }

    fn load_state(&mut self, steps: u64, state: BTreeMap<String, StateTensor<B>>) -> Result<()> {
        // the inner optimizer's backend is the host: its "device" state is host memory
        let host = state.into_iter().map(|(n, t)| Ok((n, t.into_host(&self.host)?))).collect::<Result<_>>()?;
        self.inner.load_state(steps, host)
    }

    fn host(&self) -> Option<&Cpu> {
        Some(&self.host)
    }

    fn host_masters(&self) -> Option<&BTreeMap<String, Tensor<Cpu>>> {
        Some(&self.masters)
    }

    fn host_masters_mut(&mut self) -> Option<&mut BTreeMap<String, Tensor<Cpu>>> {
        Some(&mut self.masters)
    }
}
