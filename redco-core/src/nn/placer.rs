//! Where a model's parameters go as its constructor makes them ([`ParamPlacer`]). A
//! constructor that takes a placer hands it each parameter, by name, the moment it can be
//! made: the trainer's placer cuts it to what this rank keeps (its tensor-parallel shard,
//! or under ZeRO-3 its piece) and drops the rest at once, so no rank ever holds the whole
//! model; the planning trace's placer shares one buffer among parameters of one shape. A
//! constructor that takes none builds every parameter whole ([`KeepWhole`]) and is cut
//! afterwards, as before.

use crate::{Backend, Result, Shape, Tensor};

/// Decides what a rank keeps of each parameter while a model is built.
pub trait ParamPlacer<B: Backend>: Send + Sync {
    /// Parameter `name` (as [`Module::visit`](super::Module::visit) names it from the root)
    /// of global `shape`, as this rank keeps it. `make` builds it whole; a placer calls it
    /// at most once and may keep a tensor of another local shape (a shard or a piece).
    fn place(&self, name: &str, shape: &Shape, make: &mut dyn FnMut() -> Result<Tensor<B>>) -> Result<Tensor<B>>;
    /// The experts `lo..hi` of the `count` stacked as `stack` (a name with a `*`) that this
    /// rank keeps: under expert parallelism its share, so that the others are never made;
    /// every expert by default.
    fn expert_range(&self, stack: &str, count: usize) -> (usize, usize) {
        let _ = stack;
        (0, count)
    }
    /// Whether the placer shares one buffer among parameters of one shape (a trace that
    /// reads the dataflow, not the values): a stack of experts is then handed to
    /// [`ParamPlacer::place`] whole, so that stacks share a buffer too.
    fn shares_by_shape(&self) -> bool {
        false
    }
    /// A stack of experts `stack` (a name with a `*`), made from its experts as
    /// [`ParamPlacer::place`] kept them, as this rank keeps it (the trainer's placer cuts a
    /// ZeRO-3 unit's stack into its piece here, one layer's experts whole at a time); as
    /// made by default.
    fn place_stack(&self, stack: &str, made: Tensor<B>) -> Result<Tensor<B>> {
        let _ = stack;
        Ok(made)
    }
}

/// Keeps every parameter whole, as made.
#[derive(Debug, Clone, Copy, Default)]
pub struct KeepWhole;

impl<B: Backend> ParamPlacer<B> for KeepWhole {
    fn place(&self, _name: &str, _shape: &Shape, make: &mut dyn FnMut() -> Result<Tensor<B>>) -> Result<Tensor<B>> {
        make()
    }
}
