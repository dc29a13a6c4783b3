//! What a rank's training carries from step to step ([`TrainState`]): the f32 master
//! weights, the optimizer, the f16 loss scale, the best eval so far and the step it
//! starts from; restored from a checkpoint and saved as one.

use super::checkpoint::{Checkpointer, Manifest};
use super::placing::{in_unit, PieceLayouts};
use super::reshard::{self, Saved, SavedFiles};
use super::train_config::{TrainConfig, ZeroStage};
use super::workdir;
use super::zero::UnitPieces;
use crate::optimizer::TrainOptimizer;
use redco_core::nn::Module;
use redco_core::runtime::Comm;
use redco_core::sharding::flat_shard::split_over_dp;
use redco_core::sharding::{FlatShard, ShardLayout};
use redco_core::{Backend, DType, MeshAxis, Placement, Result, Tensor};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Dynamic loss scaling (f16): the scale the loss is multiplied by before backward, halved
/// when gradients overflow, doubled after `growth_every` overflow-free steps; 1 otherwise.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LossScale {
    /// The current scale.
    pub scale: f64,
    /// Overflow-free steps since the last change.
    pub good: u64,
    growth_every: u64,
}

impl LossScale {
    /// The starting scale of `cfg` (its initial scale for f16, else 1).
    pub(crate) fn new(cfg: &TrainConfig) -> Self {
        let f16 = cfg.compute_dtype == DType::F16;
        LossScale { scale: if f16 { cfg.loss_scale.0 } else { 1.0 }, good: 0, growth_every: cfg.loss_scale.1.max(1) }
    }

    /// Gradients overflowed: the step is skipped and the scale halves (not below 1).
    pub(crate) fn overflowed(&mut self) {
        self.scale = (self.scale / 2.0).max(1.0);
        self.good = 0;
    }

    /// Gradients were finite: after `growth_every` such steps in a row the scale doubles.
    pub(crate) fn finite(&mut self) {
        self.good += 1;
        if self.good.is_multiple_of(self.growth_every) {
            self.scale *= 2.0;
        }
    }

    /// As checkpoint manifest entries.
    fn entries(&self) -> [(String, String); 2] {
        [("loss_scale".into(), self.scale.to_string()), ("good_steps".into(), self.good.to_string())]
    }

    /// Restored from a checkpoint's manifest entries (kept as is when absent).
    fn restore(&mut self, extra: &BTreeMap<String, String>) {
        if let (Some(s), Some(g)) = (extra.get("loss_scale"), extra.get("good_steps")) {
            self.scale = s.parse().unwrap_or(self.scale);
            self.good = g.parse().unwrap_or(0);
        }
    }
}

/// Hands `masters` (f32, fresh) to an offloaded `opt`: it keeps them in host memory and
/// `masters` keeps the compute copies in `compute` (in a 16-bit run the device then holds
/// no f32 master; in an f32 run the compute copy is the master's device twin). A ZeRO-3
/// piece (`piece(name)`) stays f32 on the device: the model gathers it, and its gradient
/// reaches it in its own dtype (a 16-bit piece would round the gradient). Nothing changes
/// for an optimizer that keeps its state on the device.
fn offload_masters<B: Backend>(
    opt: &mut dyn TrainOptimizer<B>,
    masters: &mut BTreeMap<String, Tensor<B>>,
    compute: DType,
    piece: &dyn Fn(&str) -> bool,
) -> Result<()> {
    let Some(host) = opt.host().cloned() else { return Ok(()) };
    let Some(hm) = opt.host_masters_mut() else { return Ok(()) };
    for (name, m) in masters.iter_mut() {
        hm.insert(name.clone(), crate::optimizer::StateTensor::Device(m.clone()).into_host(&host)?);
        if piece(name) {
            continue;
        }
        // the f32 device copy goes once the model takes the compute copy (the refresh)
        *m = redco_core::no_grad(|| m.cast(compute))?.detach().into_var();
    }
    Ok(())
}

/// A rank's training state: what a checkpoint holds, and what the step strategies update.
pub(crate) struct TrainState<B: Backend> {
    /// f32 master weights of the trainable parameters (the optimizer, checkpoints and the
    /// export read them; the model computes with copies in the compute dtype).
    pub masters: BTreeMap<String, Tensor<B>>,
    /// The optimizer.
    pub opt: Box<dyn TrainOptimizer<B>>,
    /// The f16 loss scale.
    pub scale: LossScale,
    /// The best eval so far (as rank 0 reads it).
    pub best: Option<f64>,
    /// The step the run starts from (0, or the resumed checkpoint's).
    pub start: u64,
    /// The ZeRO stage the run uses (stages 2 and 3 change what a checkpoint holds).
    pub zero: ZeroStage,
    /// ZeRO-2 and 3: the masters (and so the optimizer state) are this rank's dp-slices
    /// ([`FlatShard`]) over this communicator; `None`: whole local shards.
    pub sliced: Option<Comm<B>>,
    /// ZeRO-3: the parameters the model holds in pieces (its units'), and how to gather
    /// them; handed to the model ([`Module::set_param_gather`]).
    pub pieces: Option<Arc<UnitPieces<B>>>,
    /// Each trainable parameter's whole layout at this mesh (what a checkpoint records, and
    /// what a checkpoint of another mesh or stage is cut for).
    pub layouts: BTreeMap<String, ShardLayout>,
}

impl<B: Backend> TrainState<B> {
    /// A fresh state for `model`'s trainable parameters at ZeRO stage `zero` (stage 2:
    /// each master is this rank's dp-slice; stage 3: the masters of the model's units are
    /// pieces the model holds itself, [`TrainState::pieces`]). `placed` are the pieces the
    /// model's constructor already holds (cut as they were made, [`RankPlacer`]); under
    /// ZeRO-3 every other unit parameter of `model` is replaced by its piece as soon as the
    /// piece is cut, so the whole parameter is dropped before the next is cut.
    ///
    /// [`RankPlacer`]: super::placing::RankPlacer
    pub(crate) fn new(
        model: &mut impl Module<B>,
        cfg: &TrainConfig,
        comm: &Comm<B>,
        best: Option<f64>,
        zero: ZeroStage,
        placed: PieceLayouts,
    ) -> Result<Self> {
        let mut opt = cfg.optimizer.build_for(zero, cfg.offload);
        opt.set_comm(Some(comm.clone()));
        let sliced = (zero >= ZeroStage::Gradients).then(|| comm.clone());
        let units = if zero == ZeroStage::Parameters { model.gather_units() } else { Vec::new() };
        if zero == ZeroStage::Parameters && cfg.unit_layers == 0 {
            return Err(redco_core::Error::invalid(
                "fit (ZeRO-3)",
                "unit_layers is 0: a ZeRO-3 unit gathers at least one of the model's blocks",
            ));
        }
        if zero == ZeroStage::Parameters && units.is_empty() {
            return Err(redco_core::Error::unsupported(
                "fit (ZeRO-3)",
                "this model has no units to gather parameters for (Module::gather_units): use ZeRO-2",
            ));
        }
        let in_unit = |name: &str| in_unit(&units, name);
        let (mut masters, mut layouts, mut whole) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
        let mut err = None;
        // the trainable parameters (the variables), in `trainable_parameters`' order
        model.visit_mut("", &mut |name, p| {
            if err.is_some() {
                return;
            }
            if let Some((shard, layout)) = placed.get(name) {
                if !p.is_var() {
                    err = Some(redco_core::Error::Parameter {
                        name: name.into(),
                        msg: format!(
                            "`{name}` was placed as a ZeRO-3 piece and then frozen: build frozen parameters whole \
                             (without the placer)"
                        ),
                    });
                    return;
                }
                // already the f32 piece: the master, and the model holds it as it is
                whole.insert(name.to_string(), layout.clone());
                layouts.insert(name.to_string(), (*shard, layout.clone()));
                masters.insert(name.to_string(), p.clone());
                *p = p.detach().into_var();
                return;
            }
            if !p.is_var() {
                return;
            }
            whole.insert(name.to_string(), ShardLayout::of(p));
            let m = match &sliced {
                Some(c) => {
                    let shard = FlatShard::of(p, c);
                    match redco_core::no_grad(|| shard.own(c, &p.cast(DType::F32)?)) {
                        Ok(slice) if in_unit(name) && !split_over_dp(p) => {
                            layouts.insert(name.to_string(), (shard, ShardLayout::of(p)));
                            let piece = shard.piece(&slice).into_var();
                            // the model holds the piece from now on (as the refresh would put it)
                            *p = piece.detach().into_var();
                            piece
                        }
                        Ok(slice) => slice.into_var(),
                        Err(e) => {
                            err = Some(e);
                            return;
                        }
                    }
                }
                None => p.clone(),
            };
            masters.insert(name.to_string(), m);
        });
        if let Some(e) = err {
            return Err(e);
        }
        offload_masters(opt.as_mut(), &mut masters, cfg.compute_dtype, &|name| layouts.contains_key(name))?;
        let pieces = (zero == ZeroStage::Parameters)
            .then(|| Arc::new(UnitPieces::new(comm.clone(), cfg.compute_dtype, layouts, cfg.unit_layers)));
        let scale = LossScale::new(cfg);
        Ok(TrainState { masters, opt, scale, best, start: 0, zero, sliced, pieces, layouts: whole })
    }

    /// Master `name` as a whole local shard laid out as `p`, `model`'s parameter of that
    /// name (a ZeRO-2 slice or ZeRO-3 piece all-gathered over dp: one all-gather); `None`
    /// for a parameter without a master (frozen).
    pub(crate) fn whole_master(&self, name: &str, p: &Tensor<B>) -> Result<Option<Tensor<B>>> {
        let Some(m) = self.masters.get(name) else { return Ok(None) };
        let m = match self.opt.host_masters().and_then(|h| h.get(name)) {
            // offloaded: the f32 master is in host memory (uploaded for the export, alone)
            Some(h) => {
                let (b, local) = (m.backend(), m.local_shape().clone());
                let s = b.upload_owned(h.local_to_host()?)?;
                Tensor::from_local(b, s, m.shape().clone(), local, m.placements(), DType::F32)
            }
            None => m.clone(),
        };
        let Some(c) = &self.sliced else { return Ok(Some(m)) };
        Ok(Some(match self.pieces.as_ref().filter(|u| u.layout(name).is_some()) {
            Some(u) => u.whole_f32(name, &m)?,
            None => FlatShard::of(p, c).gather(c, &m, &ShardLayout::of(p))?,
        }))
    }

    /// Loads checkpoint `dir` (of step `step`): its identity checked against `cfg`'s, the
    /// masters, the optimizer state and the loss scale restored.
    pub(crate) fn load(
        &mut self,
        ckpt: &Checkpointer,
        comm: &Comm<B>,
        (step, dir): (u64, &Path),
        cfg: &TrainConfig,
    ) -> Result<()> {
        let extra = ckpt.extra(dir)?;
        workdir::check_identity(dir, &extra, &cfg.identity)?;
        let saved_stage = extra.get("zero_stage").and_then(|z| z.parse::<u8>().ok()).unwrap_or(0);
        let ours = self.zero.number();
        let manifest = Manifest::read(dir)?;
        let mesh = comm.mesh();
        // the parameters split over dp (experts under expert parallelism), here and there
        let split_here: Vec<&String> = self
            .layouts
            .iter()
            .filter(|(_, l)| l.placements.get(MeshAxis::Dp) != Placement::Replicate)
            .map(|(n, _)| n)
            .collect();
        let same_split = split_here.iter().copied().eq(manifest.dp_split.keys());
        self.start = if manifest.mesh == mesh.to_string() && saved_stage == ours && ours < 2 && same_split {
            ckpt.load(Some(comm), dir, &mut self.masters, self.opt.as_mut())
                .map_err(|e| workdir::with_older_hint(e, ckpt, step))?
        } else {
            // another mesh or stage, or state in slices: each tensor reassembled and cut
            let saved = Saved::of(&manifest, saved_stage)?;
            let files = SavedFiles::open(dir, &manifest, saved)?;
            let opt_sliced = ours >= 1 && mesh.dp > 1;
            let sliced = (self.sliced.is_some(), opt_sliced);
            let state = reshard::restore(&files, comm, &self.layouts, &mut self.masters, self.opt.as_mut(), sliced)
                .map_err(|e| workdir::with_older_hint(e, ckpt, step))?;
            self.opt.load_state(files.opt_steps().unwrap_or(manifest.step), state)?;
            if comm.rank() == 0 && (manifest.mesh != mesh.to_string() || saved_stage != ours || !same_split) {
                tracing::info!(
                    from = %format!("mesh {} ZeRO-{saved_stage}", manifest.mesh),
                    to = %format!("mesh {mesh} ZeRO-{ours}"),
                    "checkpoint resharded"
                );
            }
            manifest.step
        };
        self.scale.restore(&extra);
        Ok(())
    }

    /// Saves the state as the checkpoint of step `done`, recording the loss scale and the
    /// run's identity; returns its directory.
    pub(crate) fn save(&self, ckpt: &Checkpointer, comm: &Comm<B>, done: u64, cfg: &TrainConfig) -> Result<PathBuf> {
        let mut extra: BTreeMap<String, String> = self.scale.entries().into_iter().collect();
        extra.insert("zero_stage".into(), self.zero.number().to_string());
        extra.extend(workdir::identity_entries(&cfg.identity));
        let layouts = self.sliced.as_ref().map(|_| &self.layouts);
        ckpt.save_laid_out(Some(comm), done, &self.masters, self.opt.as_ref(), extra, layouts)
    }

    /// Whether eval value `v` beats the best so far (the first one always does); records it
    /// when it does.
    pub(crate) fn improves(&mut self, v: Option<f64>, lower_is_better: bool) -> bool {
        let better = match (v, self.best) {
            (Some(v), Some(b)) => {
                if lower_is_better {
                    v < b
                } else {
                    v > b
                }
            }
            (Some(_), None) => true,
            _ => false,
        };
        if better {
            self.best = v;
        }
        better
    }

    /// Puts the compute copies an optimizer wrote with its update
    /// ([`Optimizer::update_with_copies`](redco_core::optim::Optimizer::update_with_copies)) into
    /// `model`, laid out as their masters (whole masters only: no ZeRO slices or pieces);
    /// parameters without a copy keep theirs.
    pub(crate) fn install(
        &self,
        model: &mut impl Module<B>,
        mut copies: BTreeMap<String, B::Storage>,
        dtype: DType,
    ) -> Result<()> {
        if self.sliced.is_some() || self.pieces.is_some() {
            return Err(redco_core::Error::invalid(
                "fit",
                "compute copies of sliced masters must be gathered, not installed",
            ));
        }
        model.visit_mut("", &mut |name, p| {
            let (Some(m), Some(s)) = (self.masters.get(name), copies.remove(name)) else { return };
            let (shape, local) = (m.shape().clone(), m.local_shape().clone());
            *p = Tensor::from_local(m.backend(), s, shape, local, m.placements(), dtype).into_var();
        });
        Ok(())
    }

    /// Copies the masters into `model`'s trainable parameters in `dtype` (the compute
    /// copies the next step runs with; ZeRO-2's slices cast, then all-gathered); frozen
    /// parameters are left alone.
    pub(crate) fn refresh(&self, model: &mut impl Module<B>, dtype: DType) -> Result<()> {
        let mut err = None;
        let copy = |name: &str, m: &Tensor<B>, p: &Tensor<B>| -> Result<Tensor<B>> {
            if self.pieces.as_ref().is_some_and(|u| u.layout(name).is_some()) {
                // ZeRO-3: the model holds the f32 piece and gathers it where it runs
                return Ok(m.clone());
            }
            let m = m.cast(dtype)?;
            match &self.sliced {
                Some(c) => FlatShard::of(p, c).gather(c, &m, &ShardLayout::of(p)),
                None => Ok(m),
            }
        };
        model.visit_mut("", &mut |name, p| match self.masters.get(name).map(|m| copy(name, m, p)) {
            Some(Ok(t)) => *p = t.detach().into_var(),
            Some(Err(e)) => err = Some(e),
            // frozen
            None => {}
        });
        err.map_or(Ok(()), Err)
    }
}
