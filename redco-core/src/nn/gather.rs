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

    /// The whole parameters of one unit, `(name, piece)` each, in order. The default
    /// gathers them one at a time; a gatherer that can move a unit in one collective
    /// (ZeRO-3's flat unit) does.
    fn gather_all(&self, params: &[(String, Tensor<B>)]) -> Result<Vec<Tensor<B>>> {
        params.iter().map(|(n, p)| self.gather(n, p)).collect()
    }

    /// Starts moving the unit `params` that will be gathered next (FSDP's prefetch: while
    /// the current unit computes); the next [`ParamGather::gather_all`] of the same pieces
    /// takes the moved data. The default does nothing. Every rank must prefetch the same
    /// units in the same order, and gather each one it prefetches.
    fn prefetch(&self, params: &[(String, Tensor<B>)]) -> Result<()> {
        let _ = params;
        Ok(())
    }
}

/// [`ParamGather::prefetch`] of `unit`'s parameters (visited under `prefix`).
pub fn prefetch_unit<B: Backend, M: Module<B>>(unit: &M, prefix: &str, g: &dyn ParamGather<B>) -> Result<()> {
    let mut params = Vec::new();
    unit.visit(prefix, &mut |name, p| params.push((name.to_string(), p.clone())));
    g.prefetch(&params)
}

/// A copy of `unit` (visited under `prefix`, its name from the model's root) whose every
/// parameter is whole, through `g` ([`ParamGather::gather_all`]: one call for the unit).
pub fn gathered<B: Backend, M: Module<B> + Clone>(unit: &M, prefix: &str, g: &dyn ParamGather<B>) -> Result<M> {
    let mut params = Vec::new();
    unit.visit(prefix, &mut |name, p| params.push((name.to_string(), p.clone())));
    let mut wholes = g.gather_all(&params)?.into_iter();
    let mut whole = unit.clone();
    let mut missing = false;
    whole.visit_mut(prefix, &mut |_, p| match wholes.next() {
        Some(t) => *p = t,
        None => missing = true,
    });
    if missing || wholes.next().is_some() {
        return Err(crate::Error::invalid(
            "gathered",
            format!("the gatherer of {prefix} did not return one tensor per parameter ({} asked)", params.len()),
        ));
    }
    Ok(whole)
}
