//! Parameters held in pieces and gathered where a unit runs (ZeRO-3 / FSDP): a model that
//! has units (a transformer's blocks, [`Module::gather_units`]) and has been handed a
//! [`ParamGather`] ([`Module::set_param_gather`]) runs each unit on a copy whose parameters
//! are whole ([`gathered`]), made just before the unit's forward and dropped after it. The
//! gather is recorded: its backward hands each piece its part of the gradient. The model
//! only marks where its units run; what a piece is and how it is gathered belongs to
//! whoever sharded it (the trainer, over its communicator).

use super::Module;
use crate::{Backend, Result, Tensor};

/// Makes whole parameters from the pieces a module holds.
pub trait ParamGather<B: Backend>: Send + Sync {
    /// The whole parameter `name` (as [`Module::visit`] names it from the model's root)
    /// from `piece`, the tensor the module holds; a parameter that is not in pieces comes
    /// back as it is.
    fn gather(&self, name: &str, piece: &Tensor<B>) -> Result<Tensor<B>>;
}

/// A copy of `unit` (visited under `prefix`, its name from the model's root) whose every
/// parameter is whole, through `g`.
pub fn gathered<B: Backend, M: Module<B> + Clone>(unit: &M, prefix: &str, g: &dyn ParamGather<B>) -> Result<M> {
    let mut whole = unit.clone();
    let mut err = None;
    whole.visit_mut(prefix, &mut |name, p| {
        if err.is_none() {
            match g.gather(name, p) {
                Ok(t) => *p = t,
                Err(e) => err = Some(e),
            }
        }
    });
    err.map_or(Ok(whole), Err)
}
