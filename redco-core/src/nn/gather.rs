//! Parameters held in pieces and gathered where a unit runs (ZeRO-3 / FSDP): a model that
//! has units (a transformer's blocks, [`Module::gather_units`]) and has been handed a
//! [`ParamGather`] ([`Module::set_param_gather`]) runs each unit on a copy whose parameters
//! are whole ([`gathered`]), made just before the unit's forward and dropped after it. The
//! gather is recorded: its backward hands each piece its part of the gradient. The model
//! only marks where its units run; what a piece is and how it is gathered belongs to
//! whoever sharded it (the trainer, over its communicator), and so does how many
//! consecutive units one gather moves ([`ParamGather::units_per_gather`]: the planner's
//! choice, fewer and larger collectives against more parameters whole at a time).

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

    /// How many consecutive units ([`Module::gather_units`]) the model gathers together:
    /// their parameters in one [`ParamGather::gather_all`] (one collective), prefetched
    /// together, and, where the model recomputes activations, recomputed as one block. The
    /// default is 1: each unit (a transformer block) on its own.
    fn units_per_gather(&self) -> usize {
        1
    }
}

/// Consecutive units, each with its name from the model's root (the prefix its parameters
/// are visited under).
pub type NamedUnits<'a, M> = [(&'a M, String)];

/// `(name, piece)` of every parameter of `units`, in order.
fn params_of<B: Backend, M: Module<B>>(units: &NamedUnits<'_, M>) -> Vec<(String, Tensor<B>)> {
    let mut params = Vec::new();
    for (unit, prefix) in units {
        unit.visit(prefix, &mut |name, p| params.push((name.to_string(), p.clone())));
    }
    params
}

/// [`ParamGather::prefetch`] of the parameters of `units` (one gather); nothing when
/// `units` is empty.
pub fn prefetch_units<B: Backend, M: Module<B>>(units: &NamedUnits<'_, M>, g: &dyn ParamGather<B>) -> Result<()> {
    if units.is_empty() {
        return Ok(());
    }
    g.prefetch(&params_of(units))
}

/// Copies of `units` whose every parameter is whole, through `g`
/// ([`ParamGather::gather_all`]: one call for all of them).
pub fn gathered<B: Backend, M: Module<B> + Clone>(units: &NamedUnits<'_, M>, g: &dyn ParamGather<B>) -> Result<Vec<M>> {
    let params = params_of(units);
    let mut wholes = g.gather_all(&params)?.into_iter();
    let mut missing = false;
    let copies = units
        .iter()
        .map(|(unit, prefix)| {
            let mut whole = (*unit).clone();
            whole.visit_mut(prefix, &mut |_, p| match wholes.next() {
                Some(t) => *p = t,
                None => missing = true,
            });
            whole
        })
        .collect();
    if missing || wholes.next().is_some() {
        let names: Vec<&str> = units.iter().map(|(_, n)| n.as_str()).collect();
        return Err(crate::Error::invalid(
            "gathered",
            format!(
                "the gatherer of {} did not return one tensor per parameter ({} asked)",
                names.join(", "),
                params.len()
            ),
        ));
    }
    Ok(copies)
}
