//! LoRA (Hu et al., 2021): low-rank adapters on chosen [`Linear`] layers of any module,
//! the rest of the model frozen. A wrapped layer computes `x W^T + b + (alpha / r) *
//! (dropout(x) A^T) B^T` with `A [r, in]` initialised like a PyTorch linear layer and `B
//! [out, r]` zero (so training starts from the base model), as PEFT does; the adapters are
//! the only variables, so gradients, the optimizer state and checkpoints cover them alone.
//! Under tensor parallelism an adapter is split like its base layer
//! ([`plan_adapters`](crate::planning::lora::plan_adapters)): a column-split layer's `B` splits its rows, a row-split layer's `A`
//! its columns, the other factor replicated.

use super::{Init, Linear, Module, ModuleExt};
use crate::ops::random::mix64;
use crate::{Backend, Error, Result, Tensor};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The layers PEFT adapts by default in LLaMA-style (`q_proj`, `v_proj`) and T5 (`q`, `v`)
/// models.
pub const DEFAULT_TARGETS: &str = r".*\.(q_proj|v_proj|q|v)";

/// The `pipeline::StepCtx::rng` site for the dropout seed a `loss_fn` hands
/// [`set_dropout_seed`].
pub const DROPOUT_SITE: u64 = 0x4c6f_5241;

/// Which layers get adapters, and their shape.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraConfig {
    /// The adapters' rank `r`.
    pub rank: usize,
    /// `alpha`: the adapter's output is scaled by `alpha / r`.
    pub alpha: f64,
    /// Dropout on the adapter's input while gradients are recorded (training).
    pub dropout: f64,
    /// A regex that must match a linear layer's whole name (e.g.
    /// `model.layers.0.self_attn.q_proj`), as PEFT's `target_modules` string does.
    pub targets: String,
}

impl Default for LoraConfig {
    fn default() -> Self {
        LoraConfig { rank: 8, alpha: 8.0, dropout: 0.0, targets: DEFAULT_TARGETS.to_string() }
    }
}

impl LoraConfig {
    /// `alpha / r`.
    pub fn scale(&self) -> f64 {
        self.alpha / self.rank as f64
    }
    fn validate(&self) -> Result<()> {
        if self.rank == 0 {
            return Err(Error::invalid("lora", "the rank must be at least 1"));
        }
        if !(self.alpha.is_finite() && self.alpha > 0.0) {
            return Err(Error::invalid("lora", format!("alpha {} must be a positive number", self.alpha)));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(Error::invalid("lora", format!("dropout {} is not in [0, 1)", self.dropout)));
        }
        Ok(())
    }
}

/// One layer's adapter: `scale * (dropout(x) A^T) B^T`.
#[derive(Debug, Clone)]
pub struct LoraAdapter<B: Backend> {
    /// `[r, in]`
    pub a: Tensor<B>,
    /// `[out, r]`
    pub b: Tensor<B>,
    /// `alpha / r`.
    pub scale: f64,
    /// Dropout probability on the input (while gradients are recorded).
    pub dropout: f64,
    /// The dropout masks' seed, shared by the model's adapters ([`set_dropout_seed`]).
    seed: Arc<AtomicU64>,
    /// This layer's own stream of masks.
    salt: u64,
}

impl<B: Backend> LoraAdapter<B> {
    /// The adapter's contribution to its layer's output.
    pub fn forward(&self, x: &Tensor<B>) -> Result<Tensor<B>> {
        let x = if self.dropout > 0.0 && crate::is_grad_enabled() {
            x.dropout(self.dropout, mix64(self.seed.load(Ordering::Relaxed) ^ self.salt))?
        } else {
            x.clone()
        };
        x.matmul_t(&self.a)?.matmul_t(&self.b)?.scale(self.scale)
    }
    /// The rank `r`.
    pub fn rank(&self) -> usize {
        self.a.dims()[0]
    }
}

/// Freezes every parameter of `model` and attaches an adapter to each [`Linear`] whose name
/// `cfg.targets` matches; returns the adapted layers' names. The adapters' `A` draw from
/// `seed` and the layer's name. Call it before the model is split (the Trainer's model
/// constructor is the place); a layer that already has an adapter, or a pattern that matches
/// no layer, is an error, and leaves the model as it was.
pub fn add_lora<B: Backend, M: Module<B> + ?Sized>(model: &mut M, cfg: &LoraConfig, seed: u64) -> Result<Vec<String>> {
    cfg.validate()?;
    let re = regex::Regex::new(&format!("^(?:{})$", cfg.targets))
        .map_err(|e| Error::invalid("lora", format!("targets `{}` is not a valid regex: {e}", cfg.targets)))?;
    // check every target first: on error the model is unchanged
    let (mut names, mut all, mut problem) = (Vec::new(), Vec::new(), None);
    model.visit_linears("", &mut |name, layer| {
        all.push(name.to_string());
        if !re.is_match(name) || problem.is_some() {
            return;
        }
        if layer.lora.is_some() {
            problem = Some(Error::Parameter { name: name.to_string(), msg: "the layer already has an adapter".into() });
        } else if layer.weight.is_sharded() {
            problem = Some(Error::Parameter {
                name: name.to_string(),
                msg: "attach adapters before the model is split (in the model constructor)".into(),
            });
        }
        names.push(name.to_string());
    });
    if let Some(e) = problem {
        return Err(e);
    }
    if names.is_empty() {
        let shown: Vec<&str> = all.iter().take(4).map(String::as_str).collect();
        let why = if all.is_empty() {
            "the model exposes no linear layers (a module written without `module!` must implement visit_linears_mut)"
                .to_string()
        } else {
            format!("its {} linear layers are named like {}", all.len(), shown.join(", "))
        };
        return Err(Error::invalid("lora", format!("targets `{}` match no linear layer: {why}", cfg.targets)));
    }
    model.visit_mut("", &mut |_, t| *t = t.detach());
    let shared = Arc::new(AtomicU64::new(0));
    let mut err = None;
    model.visit_linears_mut("", &mut |name, layer| {
        if err.is_some() || !re.is_match(name) {
            return;
        }
        let salt = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, c| (h ^ u64::from(c)).wrapping_mul(0x100_0000_01b3));
        if let Err(e) = attach(layer, cfg, seed ^ salt, &shared, salt) {
            err = Some(Error::Parameter { name: name.to_string(), msg: e.to_string() });
        }
    });
    if let Some(e) = err {
        return Err(e);
    }
    Ok(names)
}

fn attach<B: Backend>(
    layer: &mut Linear<B>,
    cfg: &LoraConfig,
    seed: u64,
    shared: &Arc<AtomicU64>,
    salt: u64,
) -> Result<()> {
    if layer.lora.is_some() {
        return Err(Error::invalid("lora", "the layer already has an adapter"));
    }
    if layer.weight.is_sharded() {
        return Err(Error::invalid("lora", "attach adapters before the model is split (in the model constructor)"));
    }
    if let Some(f) = layer.quant {
        return Err(Error::unsupported("lora", format!("an adapter on a layer quantized to {f} blocks (QLoRA)")));
    }
    let (out, inp) = (layer.weight.dims()[0], layer.weight.dims()[1]);
    let (b, dtype) = (layer.weight.backend().clone(), layer.weight.dtype());
    let a = Init::Uniform(1.0 / (inp.max(1) as f64).sqrt()).var(&b, [cfg.rank, inp], dtype, seed)?;
    let zero = Tensor::zeros(&b, [out, cfg.rank], dtype)?.into_var();
    layer.lora = Some(LoraAdapter { a, b: zero, scale: cfg.scale(), dropout: cfg.dropout, seed: shared.clone(), salt });
    Ok(())
}

/// Sets the seed of every adapter's dropout masks (e.g. from the step, in `loss_fn`), so a
/// run draws the same masks when it is repeated or resumed.
pub fn set_dropout_seed<B: Backend, M: Module<B> + ?Sized>(model: &M, seed: u64) {
    model.visit_linears("", &mut |_, l| {
        if let Some(a) = &l.lora {
            a.seed.store(seed, Ordering::Relaxed);
        }
    });
}

/// The names of `name`'s adapter factors: `(X.lora_A.weight, X.lora_B.weight)` for a base
/// weight `X.weight`.
fn base_of(adapter: &str) -> Option<(&str, bool)> {
    if let Some(p) = adapter.strip_suffix("lora_A.weight") {
        Some((p, true))
    } else {
        adapter.strip_suffix("lora_B.weight").map(|p| (p, false))
    }
}

/// Removes every adapter from `model` and returns them by layer name (the planner traces
/// the base model alone, then places the adapters with [`plan_adapters`](crate::planning::lora::plan_adapters)).
pub fn take_adapters<B: Backend, M: Module<B> + ?Sized>(model: &mut M) -> Vec<(String, LoraAdapter<B>)> {
    let mut out = Vec::new();
    model.visit_linears_mut("", &mut |name, l| {
        if let Some(a) = l.lora.take() {
            out.push((name.to_string(), a));
        }
    });
    out
}

/// The adapters of `params` folded into their base weights, `W + scale * B A` (computed in
/// f32, stored in the base's dtype), and the adapter entries removed: a plain model's
/// parameters. An adapter without its partner or its base is an error.
pub fn merge<B: Backend>(params: &BTreeMap<String, Tensor<B>>, scale: f64) -> Result<BTreeMap<String, Tensor<B>>> {
    let mut out: BTreeMap<String, Tensor<B>> =
        params.iter().filter(|(k, _)| base_of(k).is_none()).map(|(k, v)| (k.clone(), v.clone())).collect();
    for name in params.keys() {
        let Some((prefix, true)) = base_of(name) else { continue };
        let missing = |what: &str| Error::Parameter { name: name.clone(), msg: format!("its {what} is missing") };
        let a = &params[name];
        let b = params.get(&format!("{prefix}lora_B.weight")).ok_or_else(|| missing("lora_B partner"))?;
        let base = format!("{prefix}weight");
        let w = out.get(&base).ok_or_else(|| missing("base weight"))?;
        let delta = crate::no_grad(|| b.cast(crate::DType::F32)?.matmul(&a.cast(crate::DType::F32)?)?.scale(scale))?;
        let merged = crate::no_grad(|| w.cast(crate::DType::F32)?.add(&delta)?.cast(w.dtype()))?;
        out.insert(base, merged);
    }
    if let Some(b) = params.keys().find(|k| k.ends_with("lora_B.weight")) {
        let prefix = b.trim_end_matches("lora_B.weight");
        if !params.contains_key(&format!("{prefix}lora_A.weight")) {
            return Err(Error::Parameter { name: b.clone(), msg: "its lora_A partner is missing".into() });
        }
    }
    Ok(out)
}

/// The number of adapter parameters and frozen parameters of `model`.
pub fn counts<B: Backend, M: Module<B> + ?Sized>(model: &M) -> (usize, usize) {
    let trainable = model.num_trainable_parameters();
    (trainable, model.num_parameters() - trainable)
}
