//! The `Trainer`: `collate_fn`, `loss_fn` and the model in; a trained, checkpointed model
//! out. Per optimizer step: `accumulate` micro-batches (the schedule counts optimizer
//! steps), gradients summed over `dp` in buckets, clipping by the global norm over all
//! shards, AdamW on local shards (optionally ZeRO-1), one JSONL metrics line, and an
//! atomic checkpoint every N steps. The data order and every random draw derive from the
//! seed and the step, so a resumed run continues exactly where the last checkpoint was.

use super::agree::{check_shared_workdir, dp_shard, from_leader};
use super::checkpoint::{export_safetensors, Checkpointer};
use super::compiled::{pull_state, push_state, CompiledStep, StepCompiler, StepInputs};
use super::data::Dataset;
use super::metrics::{MetricsLog, StepMetrics};
use super::observe::{Observers, TrainObserver};
use super::train_config::{NanPolicy, OptimizerConfig, TrainConfig};
use super::workdir::{self, WorkdirLock};
use super::{Batch, Deployer, StepCtx};
use crate::cpu::Cpu;
use crate::dist::data_parallel::DEFAULT_BUCKET_BYTES;
use crate::dist::grad_sync::{GradSync, SyncStrategy};
use crate::dist::trace::plan_from_trace;
use crate::dist::{CommStats, ShardPlan};
use crate::nn::{Module, ModuleExt};
use crate::ops::random::mix64;
use crate::{Backend, DType, Error, GradStore, MeshAxis, Result, Tensor};
use std::collections::BTreeMap;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// The result of [`Trainer::fit`].
#[derive(Debug, Clone)]
pub struct FitReport {
    /// The step the run started from (0, or the resumed checkpoint's).
    pub start_step: u64,
    /// Mean loss of each optimizer step run here.
    pub losses: Vec<f64>,
    /// The sharding plan used.
    pub plan: ShardPlan,
    /// The mesh rank this report comes from (this process's first; rank 0's report is the
    /// one to show).
    pub rank: usize,
    /// The collective calls of each rank run in this process during the training steps,
    /// by mesh rank (every rank with thread ranks, this process's one over processes).
    pub comm: BTreeMap<usize, CommStats>,
    /// The observers that failed during the run, each as `name (hook): error` (each was
    /// warned about and detached; the run went on). Empty on ranks that do not log.
    pub observer_errors: Vec<String>,
}

type ModelFn<M, B> = Box<dyn Fn(&B) -> Result<M> + Send + Sync>;
type EvalFn<M, B> = Box<dyn Fn(&StepCtx<B>, &M, &Batch<B>) -> Result<f64> + Send + Sync>;

/// Periodic evaluation: a metric averaged over held-out batches, logged, and the best
/// checkpoint kept.
struct Eval<M, E, B: Backend> {
    data: Box<dyn Dataset<E> + Send>,
    metric: EvalFn<M, B>,
    every: u64,
    lower_is_better: bool,
}
type CollateFn<E, B> = Box<dyn Fn(&B, &[E]) -> Result<Batch<B>> + Send + Sync>;
type LossFn<M, B> = Box<dyn Fn(&StepCtx<B>, &M, &Batch<B>) -> Result<Tensor<B>> + Send + Sync>;

/// A training pipeline from three functions (and a model constructor, run on every rank),
/// on backend `B` (CPU ranks by default; the [`Deployer<B>`] makes each rank's device).
/// Checkpoints, the export and the metrics go through host memory, so they are the same
/// files on every backend.
pub struct Trainer<M, E, B: Backend = Cpu> {
    model_fn: ModelFn<M, B>,
    collate_fn: CollateFn<E, B>,
    loss_fn: LossFn<M, B>,
    eval: Option<Eval<M, E, B>>,
    compiler: Option<Arc<dyn StepCompiler<M, B>>>,
    observers: Observers,
    /// Options.
    pub config: TrainConfig,
}

/// The shuffled order of epoch `epoch` over `n` examples.
fn epoch_order(n: usize, seed: u64, epoch: u64) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    let mut s = mix64(seed ^ 0x5eed ^ epoch.wrapping_mul(0x9e37_79b9));
    for i in (1..n).rev() {
        s = mix64(s);
        v.swap(i, (s % (i as u64 + 1)) as usize);
    }
    v
}

impl<M: Module<Cpu> + Send + Sync, E: Clone + Send + Sync> Trainer<M, E, Cpu> {
    /// A trainer on CPU ranks from the model constructor and the three functions.
    pub fn new(
        model_fn: impl Fn(&Cpu) -> Result<M> + Send + Sync + 'static,
        collate_fn: impl Fn(&Cpu, &[E]) -> Result<Batch<Cpu>> + Send + Sync + 'static,
        loss_fn: impl Fn(&StepCtx<Cpu>, &M, &Batch<Cpu>) -> Result<Tensor<Cpu>> + Send + Sync + 'static,
        config: TrainConfig,
    ) -> Self {
        Trainer::for_backend(model_fn, collate_fn, loss_fn, config)
    }
}

impl<M: Module<B> + Send + Sync, E: Clone + Send + Sync, B: Backend> Trainer<M, E, B> {
    /// [`Trainer::new`] on any backend: the functions take `B`'s devices, and
    /// [`Trainer::fit`] runs on a [`Deployer<B>`] (which makes each rank's device).
    pub fn for_backend(
        model_fn: impl Fn(&B) -> Result<M> + Send + Sync + 'static,
        collate_fn: impl Fn(&B, &[E]) -> Result<Batch<B>> + Send + Sync + 'static,
        loss_fn: impl Fn(&StepCtx<B>, &M, &Batch<B>) -> Result<Tensor<B>> + Send + Sync + 'static,
        config: TrainConfig,
    ) -> Self {
        Trainer {
            model_fn: Box::new(model_fn),
            collate_fn: Box::new(collate_fn),
            loss_fn: Box::new(loss_fn),
            eval: None,
            compiler: None,
            observers: Observers::default(),
            config,
        }
    }

    /// Evaluates every `every` optimizer steps (and at the end): `metric(ctx, model,
    /// batch)` is a batch's metric (e.g. its mean loss or accuracy), averaged over the
    /// batches of `data` (the last one padded); logged as `eval`, and the checkpoint with
    /// the best value (lowest when `lower_is_better`) is kept apart from pruning.
    pub fn with_eval(
        mut self,
        data: impl Dataset<E> + Send + 'static,
        metric: impl Fn(&StepCtx<B>, &M, &Batch<B>) -> Result<f64> + Send + Sync + 'static,
        every: u64,
        lower_is_better: bool,
    ) -> Self {
        self.eval = Some(Eval { data: Box::new(data), metric: Box::new(metric), every: every.max(1), lower_is_better });
        self
    }

    /// Runs every optimizer step as one compiled program per rank ([`StepCompiler`]): the
    /// forward pass, the loss, backward, the gradient sync, clipping and AdamW, with the
    /// learning rate, the loss scale and the clipping norm as runtime inputs. It needs
    /// AdamW without ZeRO-1, f32 compute and one micro-batch per step ([`Trainer::fit`]
    /// says so otherwise); `loss_fn` is then what `compiler` traces, once.
    pub fn with_compiled_step(mut self, compiler: Arc<dyn StepCompiler<M, B>>) -> Self {
        self.compiler = Some(compiler);
        self
    }

    /// Adds an observer of every run of this trainer (progress bar, TensorBoard, plots: see
    /// [`TrainObserver`]); the logging rank calls it. Observers are called in the order
    /// they were added.
    pub fn observe(mut self, observer: impl TrainObserver + 'static) -> Self {
        self.observers.push(Box::new(observer));
        self
    }

    /// Adds several observers at once ([`Trainer::observe`] for each), e.g. a front end's
    /// standard set.
    pub fn observe_all(mut self, observers: impl IntoIterator<Item = Box<dyn TrainObserver>>) -> Self {
        for o in observers {
            self.observers.push(o);
        }
        self
    }

    /// The compiled step for `plan`, made once before the ranks start.
    fn compile_step(
        &self,
        compiler: &dyn StepCompiler<M, B>,
        dep: &Deployer<B>,
        data: &dyn Dataset<E>,
        plan: &ShardPlan,
    ) -> Result<Arc<dyn CompiledStep<B>>> {
        let cfg = &self.config;
        let adamw = match cfg.optimizer {
            OptimizerConfig::AdamW(c) if !c.zero1 => c,
            _ => return Err(Error::invalid("fit (compiled step)", "a compiled step runs AdamW without ZeRO-1")),
        };
        if cfg.compute_dtype != DType::F32 || cfg.accumulate != 1 {
            return Err(Error::invalid(
                "fit (compiled step)",
                format!(
                    "a compiled step runs f32 compute with one micro-batch per step (got {:?}, {} micro-batches)",
                    cfg.compute_dtype, cfg.accumulate
                ),
            ));
        }
        let local = dep.local_ranks()?;
        if local.len() != dep.mesh.size() {
            return Err(Error::invalid(
                "fit (compiled step)",
                format!(
                    "a compiled step drives every rank of the mesh from one process, but this process runs {} of its {} ranks",
                    local.len(),
                    dep.mesh.size()
                ),
            ));
        }
        let b = dep.backend(local[0], 1)?;
        let model = (self.model_fn)(&b)?;
        let (ex, _) = self.examples(data, dep.seed, 0, 0, (0, dep.mesh.dp), &mut HashMap::new())?;
        let batch = (self.collate_fn)(&b, &ex)?;
        let t0 = Instant::now();
        let step = compiler.compile(&model, plan, &batch, &adamw)?;
        tracing::info!(seconds = t0.elapsed().as_secs_f64(), "training step traced and compiled");
        Ok(step)
    }

    /// The mean eval metric of `model` (every rank calls it).
    fn evaluate(
        &self,
        ev: &Eval<M, E, B>,
        dep: &Deployer<B>,
        rk: &crate::dist::Rank<B>,
        model: &M,
        step: u64,
    ) -> Result<f64>
    where
        E: Clone,
    {
        let bs = self.config.batch_size;
        let (dp, d) = (dep.mesh.dp, rk.comm.index_along(MeshAxis::Dp));
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
            for (k, t) in (self.collate_fn)(&rk.backend, &ex)? {
                batch.insert(k, dp_shard(t, dp)?);
            }
            let ctx = StepCtx {
                backend: &rk.backend,
                rank: rk.rank,
                mesh: dep.mesh,
                step,
                micro: 0,
                train: false,
                seed: dep.seed,
            };
            let v = crate::no_grad(|| (ev.metric)(&ctx, model, &batch))?;
            sum += v * real as f64;
            count += real;
        }
        Ok(sum / count.max(1) as f64)
    }

    /// The examples of micro-batch `micro` of optimizer step `step` that data-parallel
    /// position `d` of `dp` reads (its contiguous slice of the global batch), and the
    /// position of the batch's first example in the shuffled stream.
    #[allow(clippy::too_many_arguments)]
    fn examples(
        &self,
        data: &dyn Dataset<E>,
        seed: u64,
        step: u64,
        micro: usize,
        (d, dp): (usize, usize),
        cache: &mut HashMap<u64, Vec<usize>>,
    ) -> Result<(Vec<E>, usize)> {
        let n = data.len();
        let bs = self.config.batch_size;
        let per = bs / dp;
        let first = (step as usize * self.config.accumulate + micro) * bs;
        let mut out = Vec::with_capacity(per);
        for p in first + d * per..first + (d + 1) * per {
            let epoch = (p / n) as u64;
            let order = cache.entry(epoch).or_insert_with(|| epoch_order(n, seed, epoch));
            out.push(data.get(order[p % n])?);
        }
        if cache.len() > 2 {
            let keep = (first / n) as u64;
            cache.retain(|e, _| *e >= keep);
        }
        Ok((out, first))
    }

    /// This rank's collated slice of micro-batch `micro` of step `step`, the position of the
    /// batch's first example in the shuffled stream, and the tokens of the whole batch (the
    /// `tokens_key` entry's elements, else the examples, times `dp`).
    #[allow(clippy::too_many_arguments)]
    fn collated(
        &self,
        b: &B,
        data: &dyn Dataset<E>,
        seed: u64,
        (step, micro): (u64, usize),
        (d, dp): (usize, usize),
        cache: &mut HashMap<u64, Vec<usize>>,
    ) -> Result<(Batch<B>, usize, usize)> {
        let (ex, first) = self.examples(data, seed, step, micro, (d, dp), cache)?;
        let mine = first + d * ex.len();
        let local = (self.collate_fn)(b, &ex).map_err(|e| {
            Error::invalid("collate_fn", format!("step {step}, examples {mine}..{}: {e}", mine + ex.len()))
        })?;
        let tokens = self.config.tokens_key.as_ref().and_then(|k| local.get(k)).map_or(ex.len(), |t| t.elem_count());
        Ok((local, first, tokens * dp))
    }

    /// Checks the `tokens_key` entry of `batch` (collated from `what`) against
    /// `vocab_size`, when both are set: one host read of one batch, before the first step.
    /// An entry named like labels may hold [`IGNORE_INDEX`](super::token_ids::IGNORE_INDEX).
    fn check_tokens(&self, batch: &Batch<B>, what: &str) -> Result<()> {
        let (Some(key), Some(vocab)) = (&self.config.tokens_key, self.config.vocab_size) else { return Ok(()) };
        let Some(t) = batch.get(key) else { return Ok(()) };
        if t.dtype().is_float() {
            return Ok(());
        }
        let ids = t.to_vec_i64()?;
        let source = format!("collate_fn's `{key}` of {what}");
        super::token_ids::check_token_ids(&ids, vocab, key.contains("label"), &source)
    }

    /// The sharding plan for `dep`'s mesh, from one traced forward pass on one device (a
    /// new one from the deployer, as this process's first rank would get it, with one
    /// compute thread). Every process derives the same plan.
    pub fn plan(&self, dep: &Deployer<B>, data: &dyn Dataset<E>) -> Result<ShardPlan> {
        let first = dep.local_ranks()?.first().copied().unwrap_or(0);
        let b = dep.backend(first, 1)?;
        if !b.supports(self.config.compute_dtype) {
            return Err(Error::UnsupportedDType { op: "fit (compute dtype)", dtype: self.config.compute_dtype });
        }
        let mut model = (self.model_fn)(&b)?;
        // the base model is traced alone; LoRA adapters then follow their layers
        let adapters = crate::nn::lora::take_adapters(&mut model);
        // the trace follows the autograd graph: frozen parameters are traced as variables
        model.visit_mut("", &mut |_, t| {
            if !t.is_var() {
                *t = t.detach().into_var()
            }
        });
        let (ex, _) = self.examples(data, dep.seed, 0, 0, (0, 1), &mut HashMap::new())?;
        let batch = (self.collate_fn)(&b, &ex)?;
        self.check_tokens(&batch, "the first training batch")?;
        if let Some(ev) = &self.eval {
            let n = ev.data.len().min(self.config.batch_size);
            let ex: Vec<E> = (0..n).map(|i| ev.data.get(i)).collect::<Result<_>>()?;
            if !ex.is_empty() {
                self.check_tokens(&(self.collate_fn)(&b, &ex)?, "the first held-out batch")?;
            }
        }
        let ctx = StepCtx { backend: &b, rank: 0, mesh: dep.mesh, step: 0, micro: 0, train: false, seed: dep.seed };
        let loss = (self.loss_fn)(&ctx, &model, &batch)?;
        // frozen parameters are split too
        let mut plan = plan_from_trace(&model.named_parameters(), &[&loss], dep.mesh, false)?;
        crate::nn::lora::plan_adapters(&mut plan, &adapters);
        Ok(plan)
    }

    /// Trains on `data`; with `resume`, continues from the newest complete checkpoint in the
    /// workdir (if any).
    pub fn fit(&self, dep: &Deployer<B>, data: &dyn Dataset<E>, resume: bool) -> Result<FitReport> {
        let cfg = &self.config;
        if data.is_empty() {
            return Err(Error::invalid("fit", "the dataset is empty"));
        }
        if cfg.batch_size == 0 || cfg.accumulate == 0 || !cfg.batch_size.is_multiple_of(dep.mesh.dp) {
            return Err(Error::invalid(
                "fit",
                format!("batch size {} must be positive and divisible by dp={}", cfg.batch_size, dep.mesh.dp),
            ));
        }
        match cfg.compute_dtype {
            DType::F32 | DType::BF16 | DType::F16 => {}
            d => return Err(Error::UnsupportedDType { op: "fit (compute dtype)", dtype: d }),
        }
        let plan = self.plan(dep, data)?;
        tracing::info!(mesh = %dep.mesh, params = plan.params.len(), "sharding plan derived from the traced forward pass");
        let compiled = match &self.compiler {
            Some(c) => Some(self.compile_step(c.as_ref(), dep, data, &plan)?),
            None => None,
        };
        let ckpt = Checkpointer::new(&dep.workdir, cfg.keep_last);
        // the first process owns the workdir for the whole run
        let leader = dep.world().rank == 0;
        let _lock = if leader { Some(WorkdirLock::acquire(&dep.workdir)?) } else { None };
        let resume_from = if resume { workdir::resume_target(&ckpt, cfg.resume_from.as_deref())? } else { None };
        if let Some((step, dir)) = resume_from.as_ref().filter(|(step, _)| *step >= cfg.steps) {
            // already done: nothing to train, and nothing in the workdir is touched
            tracing::warn!(
                step,
                steps = cfg.steps,
                checkpoint = %dir.display(),
                "the run is already at or past its last step: nothing to train"
            );
            let rank = dep.local_ranks()?.first().copied().unwrap_or(0);
            let (comm, observer_errors) = (BTreeMap::new(), Vec::new());
            return Ok(FitReport { start_step: *step, losses: Vec::new(), plan, rank, comm, observer_errors });
        }
        if leader {
            match &resume_from {
                None if !resume => workdir::prepare_fresh(&dep.workdir, &ckpt, cfg.overwrite)?,
                None => {
                    tracing::warn!(
                        workdir = %dep.workdir.display(),
                        "resume asked for, but the workdir holds no checkpoint: starting from step 0"
                    );
                    workdir::truncate_metrics(&dep.workdir, 0)?
                }
                Some(_) => workdir::remove_partial(&ckpt)?,
            }
        }
        let host = dep.world().host;
        let results = dep.run(|rk| {
            let comm = Some(&rk.comm);
            check_shared_workdir(&rk.comm, &rk.backend, &dep.workdir, &host)?;
            // rank 0 decides where to resume from (every rank must see that checkpoint)
            let mine = resume_from.as_ref().map_or(-1.0, |(s, _)| *s as f64);
            let chosen = from_leader(&rk.comm, &rk.backend, &[mine])?[0];
            let resume_from = if chosen < 0.0 {
                None
            } else {
                let step = chosen as u64;
                let dir = ckpt.step_dir(step);
                if !dir.join("manifest.json").exists() {
                    return Err(Error::invalid(
                        "resume",
                        format!("rank 0 resumes from {} but rank {} on {host} cannot read it", dir.display(), rk.rank),
                    ));
                }
                Some((step, dir))
            };
            let mut model = (self.model_fn)(&rk.backend)?;
            plan.apply(&mut model)?;
            let mut opt = cfg.optimizer.build();
            opt.set_comm(Some(rk.comm.clone()));
            let strategy = if cfg.optimizer.zero1() { SyncStrategy::Zero1 } else { SyncStrategy::Buckets(DEFAULT_BUCKET_BYTES) };
            let sync = GradSync::new(Some(rk.comm.clone()), strategy);
            // the best eval so far, as rank 0 reads it
            let best0 = ckpt.best().map_or(f64::NAN, |(_, v)| v);
            let mut best = Some(from_leader(&rk.comm, &rk.backend, &[best0])?[0]).filter(|v| !v.is_nan());
            // f32 master weights: the optimizer, checkpoints and the export use them; the
            // model computes with copies in the compute dtype.
            // only variables train; frozen parameters (e.g. a LoRA base) keep one copy in the
            // compute dtype, no gradient and no optimizer state
            let mut masters: BTreeMap<String, Tensor<B>> = model.trainable_parameters().into_iter().collect();
            if masters.is_empty() {
                return Err(Error::invalid("fit", "the model has no trainable parameters (every parameter is frozen)"));
            }
            let frozen = model.num_parameters() - model.num_trainable_parameters();
            if frozen > 0 && compiled.is_some() {
                return Err(Error::invalid("fit (compiled step)", "a compiled step trains every parameter; this model has frozen ones"));
            }
            let mut cast_err = None;
            model.visit_mut("", &mut |_, p| {
                if !p.is_var() && p.dtype() != cfg.compute_dtype {
                    match p.cast(cfg.compute_dtype) {
                        Ok(t) => *p = t.detach(),
                        Err(e) => cast_err = Some(e),
                    }
                }
            });
            if let Some(e) = cast_err {
                return Err(e);
            }
            let mut start = 0;
            let f16 = cfg.compute_dtype == DType::F16;
            let (mut scale, mut good) = (if f16 { cfg.loss_scale.0 } else { 1.0 }, 0u64);
            if let Some((step, dir)) = &resume_from {
                let extra = ckpt.extra(dir)?;
                workdir::check_identity(dir, &extra, &cfg.identity)?;
                start = ckpt.load(comm, dir, &mut masters, opt.as_mut()).map_err(|e| workdir::with_older_hint(e, &ckpt, *step))?;
                if rk.rank == 0 {
                    tracing::info!(step = start, dir = %dir.display(), "resumed from checkpoint");
                    workdir::truncate_metrics(&dep.workdir, start)?;
                }
                if let (Some(s), Some(g)) = (extra.get("loss_scale"), extra.get("good_steps")) {
                    scale = s.parse().unwrap_or(scale);
                    good = g.parse().unwrap_or(0);
                }
            }
            let refresh = |model: &mut M, masters: &BTreeMap<String, Tensor<B>>| -> Result<()> {
                let mut err = None;
                model.visit_mut("", &mut |name, p| match masters.get(name).map(|m| m.cast(cfg.compute_dtype)) {
                    Some(Ok(t)) => *p = t.detach().into_var(),
                    Some(Err(e)) => err = Some(e),
                    // frozen
                    None => {}
                });
                err.map_or(Ok(()), Err)
            };
            refresh(&mut model, &masters)?;
            if let Some(cs) = &compiled {
                push_state(cs.as_ref(), rk.rank, &masters, opt.as_ref())?;
            }
            // rank 0 logs: metrics.jsonl, progress lines and the observers
            let mut observer_errors = Vec::new();
            let mut log = if rk.rank == 0 {
                let lines = cfg.progress_lines && !self.observers.shows_progress();
                let log = MetricsLog::open(&dep.workdir, cfg.steps, cfg.log_every, lines)?;
                self.observers.each("on_start", &mut observer_errors, |o| o.on_start(&dep.workdir, start, cfg.steps));
                Some(log)
            } else {
                None
            };
            let mut losses = Vec::new();
            let mut cache = HashMap::new();
            let (d, dp) = (rk.comm.index_along(MeshAxis::Dp), dep.mesh.dp);
            rk.comm.reset_stats();
            for step in start..cfg.steps {
                let t0 = Instant::now();
                let lr = cfg.schedule.lr(step);
                opt.set_lr(lr);
                let (loss_sum, tokens, norm) = if let Some(cs) = &compiled {
                    // this rank's slice of the batch through the compiled step
                    let (local, first, tokens) = self.collated(&rk.backend, data, dep.seed, (step, 0), (d, dp), &mut cache)?;
                    let inputs = StepInputs { lr, loss_scale: 1.0, clip_norm: cfg.clip_norm };
                    let r = cs.step(rk.rank, &local, &inputs)?;
                    if !r.loss.is_finite() {
                        // the step changed nothing (its gradients were not finite either)
                        match cfg.nan {
                            NanPolicy::Error => {
                                return Err(Error::invalid(
                                    "fit",
                                    format!("loss is {} at step {step} (examples {first}..{} of the shuffled order); the last checkpoint is intact", r.loss, first + cfg.batch_size),
                                ))
                            }
                            NanPolicy::Skip => {
                                if rk.rank == 0 {
                                    tracing::warn!(step, loss = r.loss, "skipping a step with a non-finite loss");
                                }
                                continue;
                            }
                        }
                    }
                    if !r.finite {
                        if rk.rank == 0 {
                            tracing::warn!(step, grad_norm = r.grad_norm, "non-finite gradients; the step was skipped");
                        }
                        continue;
                    }
                    (r.loss, tokens, r.grad_norm)
                } else {
                let mut grads = GradStore::new();
                let (mut loss_sum, mut tokens, mut bad) = (0.0, 0usize, None);
                for micro in 0..cfg.accumulate {
                    // this rank reads and collates only its slice of the global batch
                    let (local, first, n) = self.collated(&rk.backend, data, dep.seed, (step, micro), (d, dp), &mut cache)?;
                    tokens += n;
                    let mut batch = Batch::new();
                    for (k, t) in local {
                        let t = dp_shard(t, dp).map_err(|e| Error::invalid("fit", format!("batch entry `{k}`: {e}")))?;
                        batch.insert(k, t);
                    }
                    let ctx = StepCtx { backend: &rk.backend, rank: rk.rank, mesh: dep.mesh, step, micro, train: true, seed: dep.seed };
                    // forward and backward on the backend's own threads: one hand-off per
                    // micro-batch instead of one per op
                    let loss_fn = &self.loss_fn;
                    let (model_ref, grads_ref, sync_ref) = (&model, &mut grads, &sync);
                    // with overlap_grad_sync, the last micro-batch of an f32 step sums its dp
                    // gradients in buckets that start during backward (the sum is the
                    // masters' gradient as is)
                    let overlap = cfg.overlap_grad_sync
                        && micro + 1 == cfg.accumulate
                        && cfg.compute_dtype == DType::F32
                        && scale == 1.0;
                    let value = crate::dist::on_backend(&rk.backend, || -> Result<f64> {
                        let loss = loss_fn(&ctx, model_ref, &batch)?;
                        let replicated = loss.replicate()?;
                        // backward is queued before the loss is read (a device backend
                        // does not stall on the read); a non-finite loss discards the
                        // gradients below
                        {
                            let scaled = loss.scale(scale / cfg.accumulate as f64)?;
                            let buckets = if overlap {
                                let params: Vec<Tensor<B>> = model_ref.trainable_parameters().into_iter().map(|(_, p)| p).collect();
                                sync_ref.overlap(&params)
                            } else {
                                None
                            };
                            match buckets {
                                Some(mut buckets) => {
                                    scaled.backward_into_with(grads_ref, &mut |p, g| buckets.ready(p, g))?;
                                    buckets.finish(grads_ref)?;
                                }
                                None => scaled.backward_into(grads_ref)?,
                            }
                        }
                        replicated.to_scalar()
                    })?;
                    if !value.is_finite() {
                        bad = Some((micro, first, first + cfg.batch_size, value));
                        break;
                    }
                    loss_sum += value / cfg.accumulate as f64;
                }
                if let Some((micro, a, b, v)) = bad {
                    match cfg.nan {
                        NanPolicy::Error => {
                            return Err(Error::invalid(
                                "fit",
                                format!("loss is {v} at step {step}, micro-batch {micro} (examples {a}..{b} of the shuffled order); the last checkpoint is intact"),
                            ))
                        }
                        NanPolicy::Skip => {
                            if rk.rank == 0 {
                                tracing::warn!(step, micro, loss = v, "skipping a step with a non-finite loss");
                            }
                            continue;
                        }
                    }
                }
                // gradients of the compute copies, as f32 gradients of the masters
                let mut g32 = GradStore::new();
                for (name, p) in model.named_parameters() {
                    if let Some(g) = grads.get(&p) {
                        let g = g.cast(DType::F32)?;
                        g32.insert(&masters[&name], if scale != 1.0 { crate::no_grad(|| g.scale(1.0 / scale))? } else { g });
                    }
                }
                let mut grads = g32;
                let params: Vec<Tensor<B>> = masters.values().cloned().collect();
                sync.sync(&params, &mut grads, f16 || cfg.clip_norm.is_some())?;
                if f16 {
                    let n = sync.norm(&params, &grads)?;
                    if !n.is_finite() {
                        // overflow in f16: skip the update, halve the scale
                        scale = (scale / 2.0).max(1.0);
                        good = 0;
                        if rk.rank == 0 {
                            tracing::warn!(step, scale, "f16 gradients overflowed; step skipped, loss scale halved");
                        }
                        continue;
                    }
                    good += 1;
                    if good.is_multiple_of(cfg.loss_scale.1.max(1)) {
                        scale *= 2.0;
                    }
                }
                // clipping, the update and the compute copies: many small ops per
                // parameter, on the backend's own threads with one hand-off
                let (masters_ref, opt_ref, model_ref) = (&mut masters, &mut opt, &mut model);
                let norm = crate::dist::on_backend(&rk.backend, || -> Result<f64> {
                    let norm = match cfg.clip_norm {
                        Some(c) => sync.clip(&params, &mut grads, c)?,
                        None if sync.all_summed(dep.mesh) => sync.norm(&params, &grads)?,
                        None => f64::NAN,
                    };
                    opt_ref.update(masters_ref, &grads)?;
                    refresh(model_ref, masters_ref)?;
                    Ok(norm)
                })?;
                (loss_sum, tokens, norm)
                };
                losses.push(loss_sum);
                let dt = t0.elapsed().as_secs_f64();
                let done = step + 1;
                if let Some(cs) = &compiled {
                    // the compiled step's state back into the masters, the optimizer and the
                    // model where something below reads them
                    let per_step = (cfg.batch_size * cfg.accumulate) as u64;
                    let n = data.len() as u64;
                    let ends_epoch = cfg.checkpoint_at_epoch_end && (done * per_step) / n > (step * per_step) / n;
                    let evals = self.eval.as_ref().is_some_and(|ev| done.is_multiple_of(ev.every));
                    if evals || ends_epoch || cfg.checkpoint_every.is_some_and(|n| done.is_multiple_of(n)) || done == cfg.steps {
                        pull_state(cs.as_ref(), rk.rank, &mut masters, opt.as_mut())?;
                        refresh(&mut model, &masters)?;
                    }
                }
                let eval = match &self.eval {
                    Some(ev) if done.is_multiple_of(ev.every) || done == cfg.steps => {
                        // rank 0's value decides (the ranks' values agree; this makes sure)
                        let v = self.evaluate(ev, dep, rk, &model, step)?;
                        Some(from_leader(&rk.comm, &rk.backend, &[v])?[0])
                    }
                    _ => None,
                };
                if let Some(l) = log.as_mut() {
                    let m = StepMetrics { step: done, loss: loss_sum, lr, grad_norm: norm, tokens_per_s: tokens as f64 / dt, step_time_s: dt, eval };
                    l.log(&m, start)?;
                    self.observers.each("on_step", &mut observer_errors, |o| o.on_step(&m));
                }
                let better = match (eval, &self.eval, best) {
                    (Some(v), Some(ev), Some(b)) => if ev.lower_is_better { v < b } else { v > b },
                    (Some(_), Some(_), None) => true,
                    _ => false,
                };
                if better {
                    best = eval;
                }
                let per_step = (cfg.batch_size * cfg.accumulate) as u64;
                let n = data.len() as u64;
                let epoch_end = cfg.checkpoint_at_epoch_end && (done * per_step) / n > (step * per_step) / n;
                if better || epoch_end || cfg.checkpoint_every.is_some_and(|n| done.is_multiple_of(n)) || done == cfg.steps {
                    let mut extra = BTreeMap::from([("loss_scale".to_string(), scale.to_string()), ("good_steps".to_string(), good.to_string())]);
                    extra.extend(workdir::identity_entries(&cfg.identity));
                    let path = ckpt.save_with(comm, done, &masters, opt.as_ref(), extra)?;
                    if rk.rank == 0 {
                        tracing::info!(step = done, path = %path.display(), best = better, "checkpoint saved");
                    }
                    if better && rk.rank == 0 {
                        ckpt.mark_best(done, eval.unwrap_or_default())?;
                        ckpt.prune()?;
                    }
                }
            }
            let stats = rk.comm.stats();
            // the export holds every parameter: the trained ones and the frozen ones (in f32)
            let mut all = masters.clone();
            if frozen > 0 {
                for (name, p) in model.named_parameters() {
                    if !p.is_var() {
                        all.insert(name, p.cast(DType::F32)?);
                    }
                }
            }
            export_safetensors(comm, &all, &dep.workdir.join("model.safetensors"))?;
            if rk.rank == 0 {
                // the whole curve, across resumed runs: the last entry of every step
                let mut by_step = BTreeMap::new();
                for m in super::metrics::read_metrics(&dep.workdir)? {
                    by_step.insert(m.step, m);
                }
                let curve: Vec<_> = by_step.into_values().collect();
                self.observers.each("on_end", &mut observer_errors, |o| o.on_end(&dep.workdir, &curve));
            }
            Ok((start, losses, rk.rank, stats, observer_errors))
        })?;
        let comm: BTreeMap<usize, CommStats> = results.iter().map(|(_, _, r, c, _)| (*r, c.clone())).collect();
        let (start_step, losses, rank, _, observer_errors) =
            results.into_iter().next().ok_or_else(|| Error::invalid("fit", "no rank ran in this process"))?;
        Ok(FitReport { start_step, losses, plan, rank, comm, observer_errors })
    }
}
