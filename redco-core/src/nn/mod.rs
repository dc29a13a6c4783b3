//! Layers and the parameter tree.
//!
//! A [`Module`] exposes its parameters under Hugging Face-style dotted names
//! (`model.layers.0.self_attn.q_proj.weight`). [`ModuleExt`] adds visiting, counting, and
//! loading from / saving to a name -> tensor map.

mod activation;
mod attention;
mod dropout;
mod embedding;
pub mod gather;
mod init;
mod linear;
pub mod lora;
mod loss;
mod mlp;
mod moe;
mod norm;
mod placer;
mod rotary;

pub use activation::Activation;
pub use attention::{padding_mask, scaled_dot_product_attention};
pub use dropout::Dropout;
pub use embedding::Embedding;
pub use gather::{gathered, prefetch_units, NamedUnits, ParamGather};
pub use init::Init;
pub use linear::{quantize_linears, Linear};
pub use loss::{cross_entropy, IGNORE_INDEX};
pub use mlp::{GatedMlp, Mlp};
pub use moe::{load_balancing_loss, router_z_loss, Experts, RouterStats, SparseMoe};
pub use norm::{LayerNorm, RmsNorm};
pub use placer::{KeepWhole, ParamPlacer};
pub use rotary::RotaryEmbedding;

use crate::{Backend, Error, Result, Tensor};
use std::collections::BTreeMap;

/// Something that holds named parameters.
///
/// A parameter is trained when it is a variable ([`Tensor::is_var`]); one that is not (a
/// frozen weight, e.g. the base of a LoRA layer: [`ModuleExt::freeze`]) is visited, split
/// and saved like the others but gets no gradient and no optimizer state.
pub trait Module<B: Backend> {
    /// Calls `f(name, param)` for every parameter, names prefixed by `prefix`.
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor<B>));
    /// Calls `f(name, param)` with mutable access, to replace parameters.
    fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Tensor<B>));
    /// Calls `f(name, layer)` for every [`Linear`] layer (its name without `.weight`);
    /// modules built with [`crate::module!`] forward it to their fields. The default visits none.
    fn visit_linears(&self, _prefix: &str, _f: &mut dyn FnMut(&str, &Linear<B>)) {}
    /// [`Module::visit_linears`] with mutable access (to attach adapters).
    fn visit_linears_mut(&mut self, _prefix: &str, _f: &mut dyn FnMut(&str, &mut Linear<B>)) {}
    /// The units whose parameters may be held in pieces and gathered just before the unit
    /// runs (ZeRO-3): name prefixes as [`Module::visit`] gives them from the root (a
    /// transformer's blocks), in the order they run; the gatherer may have consecutive ones
    /// gathered together ([`ParamGather::units_per_gather`]). The default has none.
    fn gather_units(&self) -> Vec<String> {
        Vec::new()
    }
    /// Hands the module what makes its units' parameters whole ([`ParamGather`]); `None`
    /// takes it back (the parameters must be whole again by then). The default refuses: a
    /// module without units runs on whole parameters only.
    fn set_param_gather(&mut self, _g: Option<std::sync::Arc<dyn ParamGather<B>>>) -> Result<()> {
        Err(Error::unsupported("set_param_gather", "this model has no units to gather parameters for (ZeRO-3)"))
    }
}

/// Implements [`Module`] for a struct generic over `B: Backend` by visiting the listed fields
/// under their Hugging Face names, in order: `module!(Block { ln: "ln_1", q: "attn.q_proj" });`.
/// Further items of the impl (the ZeRO-3 hooks, say) may follow the field list.
#[macro_export]
macro_rules! module {
    ($ty:ident { $($field:ident : $name:expr),* $(,)? } $($extra:tt)*) => {
        impl<B: $crate::Backend> $crate::nn::Module<B> for $ty<B> {
            fn visit(&self, p: &str, f: &mut dyn FnMut(&str, &$crate::Tensor<B>)) {
                $( $crate::nn::Module::visit(&self.$field, &$crate::nn::join(p, $name), f); )*
            }
            fn visit_mut(&mut self, p: &str, f: &mut dyn FnMut(&str, &mut $crate::Tensor<B>)) {
                $( $crate::nn::Module::visit_mut(&mut self.$field, &$crate::nn::join(p, $name), f); )*
            }
            fn visit_linears(&self, p: &str, f: &mut dyn FnMut(&str, &$crate::nn::Linear<B>)) {
                $( $crate::nn::Module::visit_linears(&self.$field, &$crate::nn::join(p, $name), f); )*
            }
            fn visit_linears_mut(&mut self, p: &str, f: &mut dyn FnMut(&str, &mut $crate::nn::Linear<B>)) {
                $( $crate::nn::Module::visit_linears_mut(&mut self.$field, &$crate::nn::join(p, $name), f); )*
            }
            $($extra)*
        }
    };
}

/// Joins a prefix and a name with a dot (no dot for an empty prefix).
pub fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}.{name}")
    }
}

impl<B: Backend, M: Module<B>> Module<B> for Vec<M> {
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor<B>)) {
        for (i, m) in self.iter().enumerate() {
            m.visit(&join(prefix, &i.to_string()), f);
        }
    }
    fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Tensor<B>)) {
        for (i, m) in self.iter_mut().enumerate() {
            m.visit_mut(&join(prefix, &i.to_string()), f);
        }
    }
    fn visit_linears(&self, prefix: &str, f: &mut dyn FnMut(&str, &Linear<B>)) {
        for (i, m) in self.iter().enumerate() {
            m.visit_linears(&join(prefix, &i.to_string()), f);
        }
    }
    fn visit_linears_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Linear<B>)) {
        for (i, m) in self.iter_mut().enumerate() {
            m.visit_linears_mut(&join(prefix, &i.to_string()), f);
        }
    }
}

impl<B: Backend, M: Module<B>> Module<B> for Option<M> {
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor<B>)) {
        if let Some(m) = self {
            m.visit(prefix, f);
        }
    }
    fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Tensor<B>)) {
        if let Some(m) = self {
            m.visit_mut(prefix, f);
        }
    }
    fn visit_linears(&self, prefix: &str, f: &mut dyn FnMut(&str, &Linear<B>)) {
        if let Some(m) = self {
            m.visit_linears(prefix, f);
        }
    }
    fn visit_linears_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Linear<B>)) {
        if let Some(m) = self {
            m.visit_linears_mut(prefix, f);
        }
    }
}

/// A name -> tensor map is a module whose parameters are its entries (used for f32 master
/// weights in mixed precision).
impl<B: Backend> Module<B> for BTreeMap<String, Tensor<B>> {
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor<B>)) {
        for (k, t) in self {
            f(&join(prefix, k), t);
        }
    }
    fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Tensor<B>)) {
        for (k, t) in self.iter_mut() {
            f(&join(prefix, k), t);
        }
    }
}

/// A bare parameter is a module with one unnamed entry (its name is the prefix).
impl<B: Backend> Module<B> for Tensor<B> {
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Tensor<B>)) {
        f(prefix, self)
    }
    fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Tensor<B>)) {
        f(prefix, self)
    }
}

/// Parameter-tree helpers for every [`Module`].
pub trait ModuleExt<B: Backend>: Module<B> {
    /// `(name, tensor)` for every parameter, in visiting order.
    fn named_parameters(&self) -> Vec<(String, Tensor<B>)> {
        let mut v = Vec::new();
        self.visit("", &mut |n, t| v.push((n.to_string(), t.clone())));
        v
    }
    /// The parameter called `name` (as [`ModuleExt::named_parameters`] names it), if any.
    fn parameter(&self, name: &str) -> Option<Tensor<B>> {
        let mut found = None;
        self.visit("", &mut |n, t| {
            if found.is_none() && n == name {
                found = Some(t.clone());
            }
        });
        found
    }
    /// `(name, tensor)` for every parameter that trains (a variable), in visiting order.
    fn trainable_parameters(&self) -> Vec<(String, Tensor<B>)> {
        let mut v = Vec::new();
        self.visit("", &mut |n, t| {
            if t.is_var() {
                v.push((n.to_string(), t.clone()))
            }
        });
        v
    }
    /// The number of scalar parameters that train.
    fn num_trainable_parameters(&self) -> usize {
        let mut n = 0;
        self.visit("", &mut |_, t| {
            if t.is_var() {
                n += t.elem_count()
            }
        });
        n
    }
    /// Freezes every parameter whose name matches `pattern` (a regex, searched in the
    /// name): it stays in the module, is split and saved, but gets no gradient and no
    /// optimizer state. Returns how many were frozen; a pattern that is invalid or matches
    /// nothing is an error.
    fn freeze(&mut self, pattern: &str) -> Result<usize> {
        let re = regex::Regex::new(pattern)
            .map_err(|e| Error::invalid("freeze", format!("`{pattern}` is not a valid regex: {e}")))?;
        let mut n = 0;
        self.visit_mut("", &mut |name, t| {
            if re.is_match(name) {
                *t = t.detach();
                n += 1;
            }
        });
        if n == 0 {
            return Err(Error::invalid("freeze", format!("`{pattern}` matches no parameter")));
        }
        Ok(n)
    }
    /// The number of scalar parameters.
    fn num_parameters(&self) -> usize {
        let mut n = 0;
        self.visit("", &mut |_, t| n += t.elem_count());
        n
    }
    /// The parameters as a name -> tensor map.
    fn state_dict(&self) -> BTreeMap<String, Tensor<B>> {
        self.named_parameters().into_iter().collect()
    }
    /// Replaces every parameter by the entry of `map` with its name, cast to the
    /// parameter's dtype, as a fresh variable. Errors name every missing entry, every entry
    /// whose shape differs and, when `strict`, every entry the module does not have; on
    /// error no parameter is changed.
    fn load_state_dict(&mut self, map: &BTreeMap<String, Tensor<B>>, strict: bool) -> Result<()> {
        let mut problems = Vec::new();
        let mut seen = std::collections::HashSet::new();
        self.visit("", &mut |n, t| {
            seen.insert(n.to_string());
            match map.get(n) {
                None => problems.push(format!("`{n}` is missing")),
                Some(v) if v.shape() != t.shape() => {
                    problems.push(format!("`{n}` has shape {} in the map but {} in the module", v.shape(), t.shape()))
                }
                Some(_) => {}
            }
        });
        if strict {
            problems.extend(map.keys().filter(|k| !seen.contains(*k)).map(|k| format!("`{k}` is unexpected")));
        }
        if !problems.is_empty() {
            return Err(Error::Parameter {
                name: problems[0].trim_matches('`').split('`').next().unwrap_or("").into(),
                msg: problems.join("; "),
            });
        }
        // a frozen parameter stays frozen
        let mut failure = None;
        self.visit_mut("", &mut |n, t| match map[n].cast(t.dtype()) {
            Ok(v) => *t = if t.is_var() { v.detach().into_var() } else { v.detach() },
            Err(e) => failure = Some(e),
        });
        failure.map_or(Ok(()), Err)
    }
}

impl<B: Backend, M: Module<B> + ?Sized> ModuleExt<B> for M {}
