//! One rank's part of [`Trainer::fit`](super::Trainer::fit) ([`RankRun`]): its model and
//! [`TrainState`], the step loop driven by a [`StepStrategy`] and a [`Cadence`], the eval,
//! the metrics and observers (rank 0), checkpoints and the export.

use super::step::{shard_batch, train_ctx, StepOutcome, StepStrategy, Trained};
use super::{Eval, StepProfile, Trainer};
use crate::agree::{check_same_as_leader, check_shared_workdir, dp_shard, from_leader};
use crate::cadence::Cadence;
use crate::checkpoint::{export_each, Checkpointer};
use crate::data::Dataset;
use crate::grad_sync::{GradSync, SyncStrategy};
use crate::metrics::{MetricsLog, StepMetrics};
use crate::placing::RankPlacer;
use crate::run_dir::RunDir;
use crate::train_config::ZeroStage;
use crate::train_state::TrainState;
use crate::{Batch, Deployer, StepCtx};
use redco_core::backend::MemoryStats;
use redco_core::nn::{Module, ModuleExt};
use redco_core::runtime::DEFAULT_BUCKET_BYTES;
use redco_core::{
    planning::ShardPlan,
    runtime::{CommStats, Rank},
};
use redco_core::{Backend, DType, Error, GradStore, MeshAxis, Result};
use std::collections::HashMap;
use std::time::Instant;

/// What a rank's run returns: its rank, losses, evals, collective counts and the observers
/// that failed.
pub(crate) struct RankResult {
    pub rank: usize,
    pub losses: Vec<f64>,
    pub evals: Vec<(u64, f64)>,
    pub stats: CommStats,
    pub observer_errors: Vec<String>,
    /// The rank's device memory at the end (where its backend counts it).
    pub memory: Option<MemoryStats>,
    /// The steps after the first timed by op family ([`TrainConfig::profile`]).
    pub profile: Option<StepProfile>,
}

/// A profile in progress: when it started and the steps and tokens since.
struct Profiling {
    since: Instant,
    steps: u64,
    tokens: u64,
}

/// A rank's run in progress.
pub(crate) struct RankRun<'a, M, E, B: Backend> {
    pub trainer: &'a Trainer<M, E, B>,
    pub dep: &'a Deployer<B>,
    pub rk: &'a Rank<B>,
    pub data: &'a dyn Dataset<E>,
    /// The model (compute copies of the masters; frozen parameters in the compute dtype).
    pub model: M,
    pub state: TrainState<B>,
    /// Frozen parameters (elements).
    pub frozen: usize,
    sync: GradSync<B>,
    /// Epoch orders, by epoch.
    cache: HashMap<u64, Vec<usize>>,
}

impl<'a, M: Module<B> + Send + Sync, E: Clone + Send + Sync, B: Backend> RankRun<'a, M, E, B> {
    /// The rank's model split by `plan`, its state (restored from the checkpoint every rank
    /// agrees on with rank 0, when resuming) and its gradient sync.
    pub(crate) fn start(
        trainer: &'a Trainer<M, E, B>,
        (dep, rk): (&'a Deployer<B>, &'a Rank<B>),
        data: &'a dyn Dataset<E>,
        (plan, units): (&ShardPlan, &[String]),
        run: &RunDir,
    ) -> Result<Self> {
        let cfg = &trainer.config;
        let host = dep.world().host;
        check_shared_workdir(&rk.comm, &rk.backend, &dep.workdir, &host)?;
        let resume = agree_on_resume(rk, run, &host)?;
        let zero = if dep.mesh.dp > 1 { cfg.zero_stage() } else { ZeroStage::Off };
        // what decides each rank's collectives: the same on every rank, or a clear error
        let settings = [
            ("ZeRO stage", zero.number() as f64),
            ("layers a ZeRO-3 unit", if zero == ZeroStage::Parameters { cfg.unit_layers as f64 } else { 1.0 }),
            ("offload", u8::from(cfg.offload) as f64),
        ];
        check_same_as_leader(&rk.comm, &rk.backend, &host, &settings)?;
        // each parameter cut to this rank's part as it is made (a constructor that takes
        // the placer); whatever the constructor made whole, the plan cuts now
        let units = if zero == ZeroStage::Parameters { units } else { &[] };
        let placer = RankPlacer::new(plan, &rk.comm, units);
        let mut model = (trainer.model_fn)(&rk.backend, &placer)?;
        let placed = placer.into_pieces();
        plan.apply_except(&mut model, Some(&rk.comm), &|name| placed.contains_key(name))?;
        let ckpt = Checkpointer::new(&dep.workdir, cfg.keep_last);
        // the best eval so far, as rank 0 reads it
        let best0 = ckpt.best().map_or(f64::NAN, |(_, v)| v);
        let best = Some(from_leader(&rk.comm, &rk.backend, &[best0])?[0]).filter(|v| !v.is_nan());
        // only variables train; frozen parameters (e.g. a LoRA base) keep one copy in the
        // compute dtype, no gradient and no optimizer state
        let mut state = TrainState::new(&mut model, cfg, &rk.comm, best, zero, placed)?;
        if state.masters.is_empty() {
            return Err(Error::invalid("fit", "the model has no trainable parameters (every parameter is frozen)"));
        }
        let frozen = model.num_parameters() - model.num_trainable_parameters();
        cast_frozen(&mut model, cfg.compute_dtype)?;
        if let Some((step, dir)) = &resume {
            state.load(&ckpt, &rk.comm, (*step, dir), cfg)?;
            if rk.rank == 0 {
                tracing::info!(step = state.start, dir = %dir.display(), "resumed from checkpoint");
                crate::workdir::truncate_metrics(&dep.workdir, state.start)?;
            }
        }
        state.refresh(&mut model, cfg.compute_dtype)?;
        let strategy = match zero {
            ZeroStage::Off => SyncStrategy::Buckets(DEFAULT_BUCKET_BYTES),
            ZeroStage::Optimizer => SyncStrategy::Zero1,
            ZeroStage::Gradients | ZeroStage::Parameters => SyncStrategy::Slices,
        };
        if let Some(pieces) = &state.pieces {
            // ZeRO-3: the model holds its units' pieces (the refresh above put them in)
            model.set_param_gather(Some(pieces.clone() as std::sync::Arc<dyn redco_core::nn::ParamGather<B>>))?;
        }
        let sync = GradSync::new(Some(rk.comm.clone()), strategy);
        Ok(RankRun { trainer, dep, rk, data, model, state, frozen, sync, cache: HashMap::new() })
    }

    /// Runs the steps from the state's start to the last with `stepper`, then exports.
    pub(crate) fn run(mut self, stepper: &dyn StepStrategy<M, E, B>) -> Result<RankResult> {
        let t = self.trainer;
        let cfg = &t.config;
        stepper.start(&mut self)?;
        let cadence = Cadence::new(cfg, t.eval.as_ref().map(|e| e.every), self.data.len());
        let mut out = RankResult {
            rank: self.rk.rank,
            losses: Vec::new(),
            evals: Vec::new(),
            stats: CommStats::default(),
            observer_errors: Vec::new(),
            memory: None,
            profile: None,
        };
        let mut profiling: Option<Profiling> = None;
        // rank 0 logs: metrics.jsonl, progress lines and the observers
        let mut log = self.open_log(&mut out.observer_errors)?;
        let ckpt = Checkpointer::new(&self.dep.workdir, cfg.keep_last);
        self.rk.comm.reset_stats();
        for step in self.state.start..cfg.steps {
            let t0 = Instant::now();
            let lr = cfg.schedule.lr(step);
            self.state.opt.set_lr(lr);
            // the drop counters count this step's training forwards only (not an earlier
            // evaluation's, nor a skipped step's)
            if let Some(f) = &t.dropped {
                f(&self.model)?;
            }
            let StepOutcome::Trained(trained) = stepper.step(&mut self, step, lr)? else { continue };
            out.losses.push(trained.loss);
            // the step's dropped token slots, read before an evaluation runs the model again
            let dropped = match &t.dropped {
                Some(f) => Some(f(&self.model)?).filter(|(_, routed)| *routed > 0).map(|(d, r)| d as f64 / r as f64),
                None => None,
            };
            let dt = t0.elapsed().as_secs_f64();
            match profiling.as_mut() {
                Some(p) => {
                    p.steps += 1;
                    p.tokens += trained.tokens as u64;
                }
                // the first step done: the steady state is timed from here
                None if cfg.profile => {
                    // a backend without device timers still gets its tokens/s timed
                    self.rk.backend.profile_ops();
                    self.rk.backend.sync()?;
                    profiling = Some(Profiling { since: Instant::now(), steps: 0, tokens: 0 });
                }
                None => {}
            }
            // the profile ends with the run's last step, before its eval and checkpoint
            if profiling.is_some() && step + 1 >= cfg.steps {
                out.profile = self.end_profile(profiling.take())?;
            }
            let done = step + 1;
            if cadence.reads_state(done) {
                stepper.sync_state(&mut self)?;
            }
            let eval = match &t.eval {
                Some(ev) if cadence.evaluates(done) => {
                    // rank 0's value decides (the ranks' values agree; this makes sure)
                    let v = self.evaluate(ev, step)?;
                    Some(from_leader(&self.rk.comm, &self.rk.backend, &[v])?[0])
                }
                _ => None,
            };
            if let Some(v) = eval {
                out.evals.push((done, v));
            }
            if let Some(l) = log.as_mut() {
                let m = StepMetrics { moe_dropped: dropped, ..metrics(done, lr, &trained, dt, eval) };
                l.log(&m, self.state.start)?;
                t.observers.each("on_step", &mut out.observer_errors, |o| o.on_step(&m));
            }
            let better = self.state.improves(eval, t.eval.as_ref().is_some_and(|e| e.lower_is_better));
            if cfg.save && cadence.checkpoints(done, better) {
                self.checkpoint(&ckpt, done, better, eval)?;
            }
        }
        out.stats = self.rk.comm.stats();
        if profiling.is_some() {
            out.profile = self.end_profile(profiling)?;
        }
        if cfg.save {
            self.export()?;
        }
        out.memory = self.rk.backend.memory_stats();
        if let Some(l) = &log {
            // the whole curve, across resumed runs: the last entry of every step
            let curve = l.curve();
            t.observers.each("on_end", &mut out.observer_errors, |o| o.on_end(&self.dep.workdir, &curve));
        }
        Ok(out)
    }

    /// The profile of the steps since `p` started (the device waited for first).
    fn end_profile(&self, p: Option<Profiling>) -> Result<Option<StepProfile>> {
        let Some(p) = p else { return Ok(None) };
        let ops = self.rk.backend.op_profile()?;
        self.rk.backend.sync()?;
        let (steps, tokens, seconds) = (p.steps, p.tokens, p.since.elapsed().as_secs_f64());
        let peak_flops = self.rk.backend.peak_flops(self.trainer.config.compute_dtype);
        Ok(Some(StepProfile { steps, tokens, seconds, ops, peak_flops }))
    }

    /// Rank 0's metrics log (and the observers told the run starts); none on other ranks.
    fn open_log(&self, observer_errors: &mut Vec<String>) -> Result<Option<MetricsLog>> {
        if self.rk.rank != 0 {
            return Ok(None);
        }
        let t = self.trainer;
        let cfg = &t.config;
        let lines = cfg.progress_lines && !t.observers.shows_progress();
        let log = MetricsLog::open(&self.dep.workdir, cfg.steps, cfg.log_every, lines)?;
        let (w, start) = (&self.dep.workdir, self.state.start);
        t.observers.each("on_start", observer_errors, |o| o.on_start(w, start, cfg.steps));
        Ok(Some(log))
    }

    /// This rank's collated slice of micro-batch `micro` of step `step`, the position of the
    /// batch's first example in the shuffled stream, and the tokens of the whole batch.
    pub(crate) fn collated(&mut self, step: u64, micro: usize) -> Result<(Batch<B>, usize, usize)> {
        let (d, dp) = (self.rk.comm.index_along(MeshAxis::Dp), self.dep.mesh.dp);
        self.trainer.collated(&self.rk.backend, self.data, self.dep.seed, (step, micro), (d, dp), &mut self.cache)
    }

    /// Forward and backward of micro-batch `micro` of step `step`, the loss scaled by
    /// `scale` over the micro-batches, its gradients added into `grads`: the loss value, the
    /// batch's first example and its tokens. Runs on the backend's own threads (one hand-off
    /// per micro-batch instead of one per op); with `overlap_grad_sync`, the last
    /// micro-batch of an f32 step sums its dp gradients in buckets that start during
    /// backward; under ZeRO-2 the last micro-batch's backward slices every gradient.
    pub(crate) fn forward_backward(
        &mut self,
        step: u64,
        micro: usize,
        scale: f64,
        grads: &mut GradStore<B>,
    ) -> Result<(f64, usize, usize)> {
        let t = self.trainer;
        let cfg = &t.config;
        let (local, first, tokens) = self.collated(step, micro)?;
        let batch = shard_batch(local, self.dep.mesh.dp)?;
        let ctx = train_ctx(self, step, micro);
        let overlap =
            cfg.overlap_grad_sync && micro + 1 == cfg.accumulate && cfg.compute_dtype == DType::F32 && scale == 1.0;
        let (loss_fn, model, sync) = (&t.loss_fn, &self.model, &self.sync);
        // ZeRO-3's pieces get their slices from their gather's backward, not from the sync
        let pieces = self.state.pieces.as_deref();
        let piece = |n: &str| pieces.is_some_and(|u| u.layout(n).is_some());
        let value = redco_core::runtime::on_backend(&self.rk.backend, || -> Result<f64> {
            let loss = loss_fn(&ctx, model, &batch)?;
            let replicated = loss.replicate()?;
            // backward is queued before the loss is read (a device backend does not stall
            // on the read); a non-finite loss discards the gradients
            let scaled = loss.scale(scale / cfg.accumulate as f64)?;
            let last = micro + 1 == cfg.accumulate;
            let synced = || -> Vec<redco_core::Tensor<B>> {
                model.trainable_parameters().into_iter().filter(|(n, _)| !piece(n)).map(|(_, p)| p).collect()
            };
            match if last { sync.during_backward(&synced(), overlap) } else { None } {
                Some(mut during) => {
                    scaled.backward_into_with(grads, &mut |p, g| during.ready(p, g))?;
                    during.finish(grads)?;
                }
                None => scaled.backward_into(grads)?,
            }
            replicated.to_scalar()
        })?;
        Ok((value, first, tokens))
    }

    /// The update from the compute copies' gradients `grads` of step `step`: as f32
    /// gradients of the masters (unscaled), summed over dp, checked for f16 overflow,
    /// clipped, applied by the optimizer, and the compute copies refreshed. The global
    /// gradient norm, or `None` when an f16 overflow skipped the step.
    pub(crate) fn update(&mut self, grads: GradStore<B>, step: u64) -> Result<Option<f64>> {
        let t = self.trainer;
        let cfg = &t.config;
        let scale = self.state.scale.scale;
        let f16 = cfg.compute_dtype == DType::F16;
        // the one-pass mixed-precision update ([`Optimizer::update_with_copies`]) where the
        // masters are whole (no ZeRO slices or pieces) and the compute copies 16-bit; with
        // nothing to sum over dp and no loss scale, its kernel reads the 16-bit gradients
        // as they are
        let fusable = cfg.compute_dtype != DType::F32 && self.state.sliced.is_none() && self.state.pieces.is_none();
        let native = fusable && self.dep.mesh.dp == 1 && scale == 1.0;
        // the gradients as the masters' (ZeRO-2: already f32 slices), and whether each
        // master's parameter is split over mp (slices do not say)
        let mut g32 = GradStore::new();
        let (mut params, mut split) = (Vec::new(), Vec::new());
        for (name, p) in self.model.named_parameters() {
            if let (Some(g), Some(m)) = (grads.get(&p), self.state.masters.get(&name)) {
                let g = if native { g.clone() } else { g.cast(DType::F32)? };
                let g = if scale != 1.0 { redco_core::no_grad(|| g.scale(1.0 / scale))? } else { g };
                g32.insert(m, g);
                params.push(m.clone());
                // a ZeRO-3 piece's split is its whole parameter's
                let layout = self.state.pieces.as_ref().and_then(|u| u.layout(&name)).map(|(_, l)| l.placements);
                let placed = layout.unwrap_or_else(|| p.placements());
                split.push(matches!(placed.get(MeshAxis::Mp), redco_core::Placement::Shard(_)));
            }
        }
        drop(grads);
        let mut grads = g32;
        self.sync.sync(&params, &mut grads, f16 || cfg.clip_norm.is_some())?;
        if f16 {
            if !self.sync.norm(&params, &grads, &split)?.is_finite() {
                // overflow in f16: skip the update, halve the scale
                self.state.scale.overflowed();
                if self.rk.rank == 0 {
                    let scale = self.state.scale.scale;
                    tracing::warn!(step, scale, "f16 gradients overflowed; step skipped, loss scale halved");
                }
                return Ok(None);
            }
            self.state.scale.finite();
        }
        // clipping, the update and the compute copies: many small ops per parameter, on the
        // backend's own threads with one hand-off
        let (state, model, sync, mesh) = (&mut self.state, &mut self.model, &self.sync, self.dep.mesh);
        let norm = redco_core::runtime::on_backend(&self.rk.backend, || -> Result<f64> {
            let dtype = cfg.compute_dtype;
            let norm = if fusable {
                let needed = cfg.clip_norm.is_some() || sync.all_summed(mesh);
                let norm = if needed { sync.norm(&params, &grads, &split)? } else { f64::NAN };
                let coef = cfg.clip_norm.map_or(1.0, |c| redco_core::optim::clip_factor(norm, c));
                if let Some(copies) = state.opt.update_with_copies(&mut state.masters, &grads, coef, dtype)? {
                    state.install(model, copies, dtype)?;
                    return Ok(norm);
                }
                // not offered by this optimizer: the separate passes below, on f32 gradients
                // clipped by the norm just taken
                for p in &params {
                    if let Some(g) = grads.get(p).filter(|g| g.dtype() != DType::F32).cloned() {
                        grads.insert(p, g.cast(DType::F32)?);
                    }
                }
                if let Some(c) = cfg.clip_norm {
                    redco_core::optim::scale_to_norm(&params, &mut grads, norm, c)?;
                }
                norm
            } else {
                match cfg.clip_norm {
                    Some(c) => sync.clip(&params, &mut grads, c, &split)?,
                    None if sync.all_summed(mesh) => sync.norm(&params, &grads, &split)?,
                    None => f64::NAN,
                }
            };
            state.opt.update(&mut state.masters, &grads)?;
            state.refresh(model, dtype)?;
            Ok(norm)
        })?;
        Ok(Some(norm))
    }

    /// The mean eval metric of the model (every rank calls it).
    fn evaluate(&self, ev: &Eval<M, E, B>, step: u64) -> Result<f64> {
        let bs = self.trainer.config.batch_size;
        let (dp, d) = (self.dep.mesh.dp, self.rk.comm.index_along(MeshAxis::Dp));
        let per = bs / dp;
        let n = ev.data.len();
        let (mut sum, mut count) = (0.0, 0usize);
        for start in (0..n).step_by(bs) {
            // this rank reads and collates its slice of the batch only (the last batch
            // padded with copies of its last example)
            let real = (n - start).min(bs);
            let ex: Vec<E> = (start + d * per..start + (d + 1) * per)
                .map(|i| ev.data.get(i.min(start + real - 1)))
                .collect::<Result<_>>()?;
            let mut batch = Batch::new();
            for (k, t) in (self.trainer.collate_fn)(&self.rk.backend, &ex)? {
                batch.insert(k, dp_shard(t, dp)?);
            }
            let ctx = StepCtx { train: false, micro: 0, ..train_ctx(self, step, 0) };
            let v = redco_core::no_grad(|| (ev.metric)(&ctx, &self.model, &batch))?;
            sum += v * real as f64;
            count += real;
        }
        Ok(sum / count.max(1) as f64)
    }

    /// Saves the checkpoint of step `done` (and, when its eval `eval` is the best so far,
    /// marks it best and prunes the others).
    fn checkpoint(&self, ckpt: &Checkpointer, done: u64, better: bool, eval: Option<f64>) -> Result<()> {
        let path = self.state.save(ckpt, &self.rk.comm, done, &self.trainer.config)?;
        if self.rk.rank == 0 {
            tracing::info!(step = done, path = %path.display(), best = better, "checkpoint saved");
            if better {
                ckpt.mark_best(done, eval.unwrap_or_default())?;
                ckpt.prune()?;
            }
        }
        Ok(())
    }

    /// Writes `model.safetensors`: every parameter, the trained ones (their masters) and
    /// the frozen ones, in f32, one whole tensor at a time.
    fn export(&self) -> Result<()> {
        let params: std::collections::BTreeMap<String, redco_core::Tensor<B>> =
            self.model.named_parameters().into_iter().collect();
        let entries: Vec<(String, DType, Vec<usize>)> = params
            .iter()
            .map(|(n, p)| {
                let dims = self.state.layouts.get(n).map_or_else(|| p.dims().to_vec(), |l| l.shape.dims().to_vec());
                (n.clone(), DType::F32, dims)
            })
            .collect();
        let path = self.dep.workdir.join("model.safetensors");
        export_each(Some(&self.rk.comm), &entries, &path, |name| {
            let p = &params[name];
            match self.state.whole_master(name, p)? {
                Some(m) => Ok(m),
                None => p.cast(DType::F32),
            }
        })
    }
}

/// The checkpoint every rank resumes from: rank 0's choice, which every rank must be able
/// to read.
fn agree_on_resume<B: Backend>(rk: &Rank<B>, run: &RunDir, host: &str) -> Result<Option<(u64, std::path::PathBuf)>> {
    let mine = run.resume_from().map_or(-1.0, |(s, _)| *s as f64);
    let chosen = from_leader(&rk.comm, &rk.backend, &[mine])?[0];
    if chosen < 0.0 {
        return Ok(None);
    }
    let step = chosen as u64;
    let dir = Checkpointer::new(run.path(), 0).step_dir(step);
    if !dir.join("manifest.json").exists() {
        return Err(Error::invalid(
            "resume",
            format!("rank 0 resumes from {} but rank {} on {host} cannot read it", dir.display(), rk.rank),
        ));
    }
    Ok(Some((step, dir)))
}

/// Frozen parameters (not variables) cast once to the compute dtype.
fn cast_frozen<B: Backend>(model: &mut impl Module<B>, dtype: DType) -> Result<()> {
    let mut err = None;
    model.visit_mut("", &mut |_, p| {
        if !p.is_var() && p.dtype() != dtype {
            match p.cast(dtype) {
                Ok(t) => *p = t.detach(),
                Err(e) => err = Some(e),
            }
        }
    });
    err.map_or(Ok(()), Err)
}

/// The metrics line of the step ending at `done`.
fn metrics(done: u64, lr: f64, t: &Trained, dt: f64, eval: Option<f64>) -> StepMetrics {
    StepMetrics {
        step: done,
        loss: t.loss,
        lr,
        grad_norm: t.grad_norm,
        tokens_per_s: t.tokens as f64 / dt,
        step_time_s: dt,
        eval,
        moe_dropped: None,
    }
}
