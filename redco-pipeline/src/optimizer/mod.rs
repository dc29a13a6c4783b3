//! The optimizer as the pipeline drives it ([`TrainOptimizer`]): a core
//! [`Optimizer`] on the parameters' backend ([`OnDevice`]), or one offloaded to the host's
//! CPU cores ([`Offloaded`]), with its state where it lives ([`StateTensor`]) so that a
//! checkpoint is written and read one tensor at a time.

mod offload;
mod state_tensor;

pub use offload::Offloaded;
pub use state_tensor::StateTensor;

use redco_core::nn::Module;
use redco_core::optim::Optimizer;
use redco_core::runtime::Comm;
use redco_core::{Backend, DType, GradStore, Result, Tensor};
use redco_cpu::Cpu;
use std::collections::BTreeMap;

/// What the trainer, checkpoints and resharding need from an optimizer: the core
/// [`Optimizer`]'s updates, and its state and f32 masters where they live (on the
/// parameters' backend, or in host memory for an offloaded one).
pub trait TrainOptimizer<B: Backend>: Send {
    /// Sets the learning rate of the next updates.
    fn set_lr(&mut self, lr: f64);
    /// Hands the optimizer its rank's communicator (see [`Optimizer::set_comm`]).
    fn set_comm(&mut self, comm: Option<Comm<B>>);
    /// One update of every parameter of `model` that has a gradient.
    fn update(&mut self, model: &mut dyn Module<B>, grads: &GradStore<B>) -> Result<()>;
    /// The mixed-precision update in one pass, where offered (see
    /// [`Optimizer::update_with_copies`]).
    fn update_with_copies(
        &mut self,
        masters: &mut dyn Module<B>,
        grads: &GradStore<B>,
        grad_scale: f64,
        dtype: DType,
    ) -> Result<Option<BTreeMap<String, B::Storage>>>;
    /// Updates done so far.
    fn steps(&self) -> u64;
    /// The state tensors (this rank's local ones), named `kind/parameter`, where they live.
    fn state_tensors(&self) -> Result<Vec<(String, StateTensor<B>)>>;
    /// Restores the update count and the state saved by [`TrainOptimizer::state_tensors`]
    /// (placed where [`TrainOptimizer::host`] says: [`StateTensor::placed`]).
    fn load_state(&mut self, steps: u64, state: BTreeMap<String, StateTensor<B>>) -> Result<()>;
    /// The host backend an offloaded optimizer keeps its state on; `None`: the state lives
    /// with the parameters on their backend.
    fn host(&self) -> Option<&Cpu> {
        None
    }
    /// The f32 masters an offloaded optimizer keeps in host memory, by parameter name:
    /// where it has one, it is the parameter's master (checkpoints and exports read it) and
    /// the tensor it updates on `B` is only the compute copy. `None`: the parameters it
    /// updates are the masters.
    fn host_masters(&self) -> Option<&BTreeMap<String, Tensor<Cpu>>> {
        None
    }
    /// [`TrainOptimizer::host_masters`], to seed or restore them.
    fn host_masters_mut(&mut self) -> Option<&mut BTreeMap<String, Tensor<Cpu>>> {
        None
    }
}

/// A core [`Optimizer`] on the parameters' backend: its state lives with the parameters.
pub struct OnDevice<B: Backend>(pub Box<dyn Optimizer<B>>);

impl<B: Backend> TrainOptimizer<B> for OnDevice<B> {
    fn set_lr(&mut self, lr: f64) {
        self.0.set_lr(lr);
    }
    fn set_comm(&mut self, comm: Option<Comm<B>>) {
        self.0.set_comm(comm);
    }
    fn update(&mut self, model: &mut dyn Module<B>, grads: &GradStore<B>) -> Result<()> {
        self.0.update(model, grads)
    }
    fn update_with_copies(
        &mut self,
        masters: &mut dyn Module<B>,
        grads: &GradStore<B>,
        grad_scale: f64,
        dtype: DType,
    ) -> Result<Option<BTreeMap<String, B::Storage>>> {
        self.0.update_with_copies(masters, grads, grad_scale, dtype)
    }
    fn steps(&self) -> u64 {
        self.0.steps()
    }
    fn state_tensors(&self) -> Result<Vec<(String, StateTensor<B>)>> {
        Ok(self.0.state_tensors()?.into_iter().map(|(n, t)| (n, StateTensor::Device(t))).collect())
    }
    fn load_state(&mut self, steps: u64, state: BTreeMap<String, StateTensor<B>>) -> Result<()> {
        let state = state.into_iter().map(|(k, t)| Ok((k.clone(), t.into_device(&k)?))).collect::<Result<_>>()?;
        self.0.load_state(steps, state)
    }
}
