//! The mixture-of-experts side of [`super::Llama`] (Mixtral, Qwen3-MoE): a layer's
//! feed-forward block ([`Ffn`]: the gated MLP or a [`SparseMoe`]), the log its routers'
//! statistics reach the loss through ([`RouterLog`]), and what a config says of its experts
//! (`MoeCfg`).

use crate::hf::config::HfConfig;
use redco_core::nn::{GatedMlp, Linear, RouterStats, SparseMoe};
use redco_core::{Backend, Error, Result, Tensor};
use std::sync::{Arc, Mutex};

/// A layer's feed-forward block: LLaMA's gated MLP, or Mixtral's sparse mixture of experts.
#[derive(Clone)]
pub enum Ffn<B: Backend> {
    /// The gated MLP (`mlp`).
    Dense(GatedMlp<B>),
    /// A sparse mixture of experts, named `name` in checkpoints (Mixtral's
    /// `block_sparse_moe`), whose router statistics go to `log`.
    Moe {
        /// The block.
        moe: SparseMoe<B>,
        /// Its name in place of `mlp`.
        name: &'static str,
        /// Where the model's loss finds the routers' statistics.
        log: Arc<Mutex<RouterLog<B>>>,
    },
}

/// What the mixture-of-experts layers routed during the forward pass a loss asked for.
pub struct RouterLog<B: Backend> {
    /// Recording (only inside the loss that reads it).
    pub(super) on: bool,
    /// Which tokens count (the attention mask, flattened), if any.
    pub(super) keep: Option<Vec<bool>>,
    /// One entry per layer run.
    pub(super) stats: Vec<RouterStats<B>>,
    /// Token slots the capacity factor dropped, and slots routed, over the losses since
    /// [`Llama::take_dropped`] last read them.
    pub(super) dropped: (u64, u64),
}

impl<B: Backend> Default for RouterLog<B> {
    fn default() -> Self {
        RouterLog { on: false, keep: None, stats: Vec::new(), dropped: (0, 0) }
    }
}

impl<B: Backend> RouterLog<B> {
    /// Starts recording the routers' statistics of the tokens `keep` flags.
    pub(super) fn start(&mut self, keep: Option<Vec<bool>>) {
        (self.on, self.keep, self.stats) = (true, keep, Vec::new());
    }

    /// Stops recording: the statistics recorded, their dropped and routed slots counted
    /// (`top_k` slots a token).
    pub(super) fn finish(&mut self, top_k: usize) -> Vec<RouterStats<B>> {
        (self.on, self.keep) = (false, None);
        let stats = std::mem::take(&mut self.stats);
        for s in &stats {
            self.dropped.0 += s.dropped as u64;
            self.dropped.1 += (s.tokens * top_k) as u64;
        }
        stats
    }
}

impl<B: Backend> Ffn<B> {
    pub(super) fn forward(&self, x: &Tensor<B>) -> Result<Tensor<B>> {
        match self {
            Ffn::Dense(m) => m.forward(x),
            Ffn::Moe { moe, log, .. } => {
                if let Some(keep) = crate::stack::router_collecting() {
                    // inside a recomputed block: the statistics leave it as its outputs
                    let (y, stats) = moe.forward_counting(x, keep.as_deref())?;
                    crate::stack::push_router(stats);
                    return Ok(y);
                }
                let keep = log.lock().map_err(|_| Error::invalid("moe", "the router log was poisoned"))?.keep.clone();
                let on = log.lock().map(|l| l.on).unwrap_or(false);
                let (y, stats) = moe.forward_counting(x, if on { keep.as_deref() } else { None })?;
                if on {
                    log.lock().map_err(|_| Error::invalid("moe", "the router log was poisoned"))?.stats.push(stats);
                }
                Ok(y)
            }
        }
    }
}

impl<B: Backend> redco_core::nn::Module<B> for Ffn<B> {
    fn visit(&self, p: &str, f: &mut dyn FnMut(&str, &Tensor<B>)) {
        match self {
            Ffn::Dense(m) => m.visit(p, f),
            Ffn::Moe { moe, name, .. } => moe.visit(&renamed(p, name), f),
        }
    }
    fn visit_mut(&mut self, p: &str, f: &mut dyn FnMut(&str, &mut Tensor<B>)) {
        match self {
            Ffn::Dense(m) => m.visit_mut(p, f),
            Ffn::Moe { moe, name, .. } => moe.visit_mut(&renamed(p, name), f),
        }
    }
    fn visit_linears(&self, p: &str, f: &mut dyn FnMut(&str, &Linear<B>)) {
        match self {
            Ffn::Dense(m) => m.visit_linears(p, f),
            Ffn::Moe { moe, name, .. } => moe.visit_linears(&renamed(p, name), f),
        }
    }
    fn visit_linears_mut(&mut self, p: &str, f: &mut dyn FnMut(&str, &mut Linear<B>)) {
        match self {
            Ffn::Dense(m) => m.visit_linears_mut(p, f),
            Ffn::Moe { moe, name, .. } => moe.visit_linears_mut(&renamed(p, name), f),
        }
    }
}

/// `prefix` (ending in `mlp`) with its last part `name`.
fn renamed(prefix: &str, name: &str) -> String {
    match prefix.rsplit_once('.') {
        Some((head, _)) => format!("{head}.{name}"),
        None => name.to_string(),
    }
}

/// The mixture of experts a config describes (Mixtral, Qwen3-MoE), or `None` for a dense
/// model.
pub(super) struct MoeCfg {
    pub(super) experts: usize,
    pub(super) top_k: usize,
    /// The experts' intermediate size.
    pub(super) intermediate: usize,
    pub(super) norm_topk_prob: bool,
    /// Layers with a dense MLP instead (Qwen3-MoE's `mlp_only_layers`).
    pub(super) mlp_only: Vec<usize>,
    /// Every `step`-th layer is sparse (Qwen3-MoE's `decoder_sparse_step`).
    pub(super) step: usize,
    /// The block's checkpoint name and its experts' gate, up and down projections' names.
    pub(super) names: (&'static str, [&'static str; 3]),
}

impl MoeCfg {
    pub(super) fn of(cfg: &HfConfig) -> Result<Option<MoeCfg>> {
        let need = |key: &str| {
            cfg.num(key).ok_or_else(|| Error::config("moe", format!("a {} config.json needs `{key}`", cfg.model_type)))
        };
        match cfg.model_type.as_str() {
            "mixtral" => Ok(Some(MoeCfg {
                experts: need("num_local_experts")?,
                top_k: cfg.num("num_experts_per_tok").unwrap_or(2),
                intermediate: cfg.intermediate,
                norm_topk_prob: true,
                mlp_only: Vec::new(),
                step: 1,
                names: ("block_sparse_moe", ["w1", "w3", "w2"]),
            })),
            "qwen3_moe" => {
                let experts = match cfg.num("num_experts") {
                    Some(e) => e,
                    None => need("num_local_experts")?,
                };
                let mlp_only = match cfg.raw.get("mlp_only_layers") {
                    None | Some(serde_json::Value::Null) => Vec::new(),
                    Some(serde_json::Value::Array(a)) => a
                        .iter()
                        .map(|v| v.as_u64().map(|x| x as usize))
                        .collect::<Option<Vec<_>>>()
                        .ok_or_else(|| Error::config("moe", "`mlp_only_layers` must be a list of layer indices"))?,
                    Some(_) => return Err(Error::config("moe", "`mlp_only_layers` must be a list of layer indices")),
                };
                Ok(Some(MoeCfg {
                    experts,
                    top_k: need("num_experts_per_tok")?,
                    intermediate: need("moe_intermediate_size")?,
                    norm_topk_prob: flag(cfg, "norm_topk_prob"),
                    mlp_only,
                    step: cfg.num("decoder_sparse_step").unwrap_or(1).max(1),
                    names: ("mlp", ["gate_proj", "up_proj", "down_proj"]),
                }))
            }
            _ => Ok(None),
        }
    }

    /// Whether layer `l` is a mixture of experts (else a dense MLP), as transformers decides.
    pub(super) fn sparse(&self, l: usize) -> bool {
        !self.mlp_only.contains(&l) && self.experts > 0 && (l + 1).is_multiple_of(self.step)
    }
}

/// The tokens an attention mask keeps, one flag per token: this rank's tokens where the
/// mask is split over `dp` (the mixture of experts reads the flags of the tokens it holds).
pub(super) fn keep_flags<B: Backend>(mask: &Tensor<B>) -> Result<Vec<bool>> {
    let local = mask.local_to_host()?.to_i64_vec()?;
    Ok(local.iter().map(|&v| v != 0).collect())
}

/// A boolean field of the config (false when absent).
pub(super) fn flag(cfg: &HfConfig, key: &str) -> bool {
    cfg.raw.get(key).and_then(|v| v.as_bool()).unwrap_or(false)
}
