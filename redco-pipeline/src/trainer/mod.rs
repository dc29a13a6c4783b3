//! The `Trainer`: `collate_fn`, `loss_fn` and the model in; a trained, checkpointed model
//! out. Per optimizer step: `accumulate` micro-batches (the schedule counts optimizer
//! steps), gradients summed over `dp` in buckets, clipping by the global norm over all
//! shards, AdamW on local shards (optionally ZeRO-1), one JSONL metrics line, and an
//! atomic checkpoint every N steps. The data order and every random draw derive from the
//! seed and the step, so a resumed run continues exactly where the last checkpoint was.

mod rank_run;
mod step;

use super::compiled::{CompiledStep, StepCompiler};
use super::data::Dataset;
use super::observe::{Observers, TrainObserver};
use super::placing::SharedByShape;
use super::run_dir::{ClaimOptions, RunDir};
use super::train_config::{OptimizerConfig, TrainConfig, ZeroStage};
use super::{Batch, Deployer, StepCtx};
use rank_run::RankRun;
use redco_core::backend::{MemoryStats, OpTime};
use redco_core::nn::{KeepWhole, Module, ModuleExt, ParamPlacer};
use redco_core::ops::random::mix64;
use redco_core::planning::trace::plan_from_trace;
use redco_core::{planning::ShardPlan, runtime::CommStats};
use redco_core::{Backend, DType, Error, Result, Tensor};
use redco_cpu::Cpu;
use std::collections::BTreeMap;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;
use step::{CompiledRun, EagerStep, StepStrategy};

/// The result of [`Trainer::fit`].
#[derive(Debug, Clone)]
pub struct FitReport {
    /// The step the run started from (0, or the resumed checkpoint's).
    pub start_step: u64,
    /// Mean loss of each optimizer step run here.
    pub losses: Vec<f64>,
    /// Each evaluation of this run, as (step, value): the held-out metric rank 0 logged.
    pub evals: Vec<(u64, f64)>,
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
    /// The device memory of each rank run in this process, by mesh rank, where its backend
    /// counts it ([`Backend::memory_stats`]; its peak since the device opened): empty on
    /// the CPU backend.
    pub device_memory: BTreeMap<usize, MemoryStats>,
    /// With [`TrainConfig::profile`]: each rank's steady-state steps timed by op family,
    /// by mesh rank (where the backend times them; empty otherwise).
    pub profile: BTreeMap<usize, StepProfile>,
}

/// The steps of a run after its first, timed ([`TrainConfig::profile`]).
#[derive(Debug, Clone, PartialEq)]
pub struct StepProfile {
    /// Optimizer steps timed.
    pub steps: u64,
    /// Tokens those steps trained on (the whole batch's, every dp rank's).
    pub tokens: u64,
    /// Their wall time on this rank, the device waited for at the end.
    pub seconds: f64,
    /// The device's time by op family, longest first ([`Backend::op_profile`]).
    pub ops: Vec<OpTime>,
    /// The device's dense peak for products in the compute dtype, where the backend knows
    /// it ([`Backend::peak_flops`]).
    pub peak_flops: Option<f64>,
}

impl StepProfile {
    /// Tokens per second over the timed steps.
    pub fn tokens_per_second(&self) -> f64 {
        self.tokens as f64 / self.seconds.max(f64::MIN_POSITIVE)
    }
    /// The wall time the device rows do not cover (launch overhead, synchronisation, host
    /// work between ops): the wall time less every row that is device time.
    pub fn host_gap_seconds(&self) -> f64 {
        let device: f64 = self.ops.iter().filter(|o| !o.family.contains("host")).map(|o| o.seconds).sum();
        (self.seconds - device).max(0.0)
    }
    /// Model FLOPs utilisation: `flops_per_token` (e.g.
    /// [`train_flops_per_token`](redco_core::planning::flops::train_flops_per_token)) at the
    /// measured rate over the device's dense peak; `None` where the peak is unknown.
    pub fn mfu(&self, flops_per_token: f64) -> Option<f64> {
        Some(flops_per_token * self.tokens_per_second() / self.peak_flops?)
    }
}

impl FitReport {
    /// The report of a run that had nothing to train (already at `start_step`).
    fn empty(start_step: u64, plan: ShardPlan, rank: usize) -> Self {
        FitReport {
            start_step,
            losses: Vec::new(),
            evals: Vec::new(),
            plan,
            rank,
            comm: BTreeMap::new(),
            observer_errors: Vec::new(),
            device_memory: BTreeMap::new(),
            profile: BTreeMap::new(),
        }
    }
}

/// The model constructor: the rank's device and where its parameters go as they are made.
type ModelFn<M, B> = Box<dyn Fn(&B, &dyn ParamPlacer<B>) -> Result<M> + Send + Sync>;
type EvalFn<M, B> = Box<dyn Fn(&StepCtx<B>, &M, &Batch<B>) -> Result<f64> + Send + Sync>;

/// Periodic evaluation: a metric averaged over held-out batches, logged, and the best
/// checkpoint kept.
pub(super) struct Eval<M, E, B: Backend> {
    /// The held-out examples.
    pub(super) data: Box<dyn Dataset<E> + Send>,
    /// A batch's metric.
    pub(super) metric: EvalFn<M, B>,
    /// Evaluate every this many steps (and at the end).
    pub(super) every: u64,
    /// Whether a lower value is better.
    pub(super) lower_is_better: bool,
}
type CollateFn<E, B> = Box<dyn Fn(&B, &[E]) -> Result<Batch<B>> + Send + Sync>;
type LossFn<M, B> = Box<dyn Fn(&StepCtx<B>, &M, &Batch<B>) -> Result<Tensor<B>> + Send + Sync>;

/// A training pipeline from three functions (and a model constructor, run on every rank),
/// on backend `B` (CPU ranks by default; the [`Deployer<B>`] makes each rank's device).
/// Checkpoints, the export and the metrics go through host memory, so they are the same
/// files on every backend.
pub struct Trainer<M, E, B: Backend = Cpu> {
    pub(super) model_fn: ModelFn<M, B>,
    pub(super) collate_fn: CollateFn<E, B>,
    pub(super) loss_fn: LossFn<M, B>,
    pub(super) eval: Option<Eval<M, E, B>>,
    compiler: Option<Arc<dyn StepCompiler<M, B>>>,
    pub(super) observers: Observers,
    /// Reads (and resets) the model's dropped and routed token slots after each step.
    pub(super) dropped: Option<DroppedFn<M>>,
    /// Options.
    pub config: TrainConfig,
}

/// What [`Trainer::count_dropped`] is handed: the model's token slots dropped by a
/// capacity factor and slots routed since the last call (which resets them).
type DroppedFn<M> = Box<dyn Fn(&M) -> Result<(u64, u64)> + Send + Sync>;

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
        Trainer::for_backend_placed(move |b: &B, _: &dyn ParamPlacer<B>| model_fn(b), collate_fn, loss_fn, config)
    }

    /// [`Trainer::for_backend`] with a model constructor that hands each parameter, as it
    /// makes it, to the [`ParamPlacer`] it is given: the trainer's placer keeps only this
    /// rank's shard of it (under ZeRO-3 a unit parameter's f32 piece) and drops the whole
    /// at once, so building never holds the whole model (the planning trace's placer
    /// shares one buffer per shape). Parameters must come out of the constructor as the
    /// placer returned them; one frozen after it was placed as a ZeRO-3 piece is refused
    /// (build frozen parameters with [`KeepWhole`] instead).
    pub fn for_backend_placed(
        model_fn: impl Fn(&B, &dyn ParamPlacer<B>) -> Result<M> + Send + Sync + 'static,
        collate_fn: impl Fn(&B, &[E]) -> Result<Batch<B>> + Send + Sync + 'static,
        loss_fn: impl Fn(&StepCtx<B>, &M, &Batch<B>) -> Result<Tensor<B>> + Send + Sync + 'static,
        config: TrainConfig,
    ) -> Self {
        Trainer {
            model_fn: Box::new(model_fn),
            collate_fn: Box::new(collate_fn),
            loss_fn: Box::new(loss_fn),
            eval: None,
            dropped: None,
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

    /// Counts a mixture of experts' dropped token slots: after each optimizer step `f`
    /// reads the model's slots dropped by its capacity factor and the slots routed since
    /// the last call (and resets them), and the step's metrics carry the dropped share
    /// ([`StepMetrics::moe_dropped`](crate::metrics::StepMetrics::moe_dropped)).
    pub fn count_dropped(mut self, f: impl Fn(&M) -> Result<(u64, u64)> + Send + Sync + 'static) -> Self {
        self.dropped = Some(Box::new(f));
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
        if let Some(why) = super::compiled::ineligible(cfg) {
            return Err(Error::unsupported("fit (compiled step)", why));
        }
        let OptimizerConfig::AdamW(adamw) = cfg.optimizer else {
            return Err(Error::unsupported("fit (compiled step)", "compiled steps run AdamW"));
        };
        let local = dep.local_ranks()?;
        if local.len() != dep.mesh.size() {
            return Err(Error::unsupported(
                "fit (compiled step)",
                format!(
                    "a compiled step drives every rank of the mesh from one process, but this process runs {} of its {} ranks",
                    local.len(),
                    dep.mesh.size()
                ),
            ));
        }
        let b = dep.backend(local[0], 1)?;
        let model = (self.model_fn)(&b, &KeepWhole)?;
        let (ex, _) = self.examples(data, dep.seed, 0, 0, (0, dep.mesh.dp), &mut HashMap::new())?;
        let batch = (self.collate_fn)(&b, &ex)?;
        let t0 = Instant::now();
        let step = compiler.compile(&model, plan, &batch, &adamw)?;
        tracing::info!(seconds = t0.elapsed().as_secs_f64(), "training step traced and compiled");
        Ok(step)
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
    pub(super) fn collated(
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
        self.plan_and_units(dep, data).map(|(plan, _)| plan)
    }

    /// [`Trainer::plan`], and the model's ZeRO-3 units ([`Module::gather_units`]). The traced
    /// model is built with [`SharedByShape`]: a model constructor that takes the placer
    /// ([`Trainer::for_backend_placed`]) holds one buffer per parameter shape here, not the
    /// whole model.
    fn plan_and_units(&self, dep: &Deployer<B>, data: &dyn Dataset<E>) -> Result<(ShardPlan, Vec<String>)> {
        let first = dep.local_ranks()?.first().copied().unwrap_or(0);
        let b = dep.backend(first, 1)?;
        if !b.supports(self.config.compute_dtype) {
            return Err(Error::UnsupportedDType { op: "fit (compute dtype)", dtype: self.config.compute_dtype });
        }
        let mut model = (self.model_fn)(&b, &SharedByShape::new())?;
        let units = model.gather_units();
        // the base model is traced alone; LoRA adapters then follow their layers
        let adapters = redco_core::nn::lora::take_adapters(&mut model);
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
        // the dataflow does not depend on the batch size: one example is traced, so the
        // trace's activations are one example's (a 0.7B model's batch of four, recorded,
        // is gigabytes in every process)
        let batch = if ex.len() > 1 { (self.collate_fn)(&b, &ex[..1])? } else { batch };
        // the trace reads every op, those inside recomputed blocks too
        let loss = redco_core::autograd::record_inside_recompute(|| (self.loss_fn)(&ctx, &model, &batch))?;
        // frozen parameters are split too
        let mut plan = plan_from_trace(&model.named_parameters(), &[&loss], dep.mesh, false)?;
        redco_core::planning::lora::plan_adapters(&mut plan, &adapters);
        Ok((plan.with_ep(self.config.ep)?, units))
    }

    /// The checks a run makes before anything else: data, batch size, compute dtype, and
    /// for a compiled step the configuration it can run.
    fn check_run(&self, dep: &Deployer<B>, data: &dyn Dataset<E>) -> Result<()> {
        let cfg = &self.config;
        if data.is_empty() {
            return Err(Error::invalid("fit", "the dataset is empty"));
        }
        if cfg.batch_size == 0 || cfg.accumulate == 0 || !cfg.batch_size.is_multiple_of(dep.mesh.dp) {
            return Err(Error::config(
                "fit",
                format!("batch size {} must be positive and divisible by dp={}", cfg.batch_size, dep.mesh.dp),
            ));
        }
        if cfg.zero_stage() == ZeroStage::Optimizer && matches!(cfg.optimizer, OptimizerConfig::Sgd { .. }) {
            return Err(Error::config(
                "fit",
                "ZeRO-1 shards AdamW's moments and SGD has none to shard: use ZeRO-2 (its masters and gradients \
                 are sharded with any optimizer) or AdamW",
            ));
        }
        if cfg.offload && dep.mesh.dp > 1 && cfg.zero_stage() == ZeroStage::Optimizer {
            return Err(Error::unsupported(
                "fit (offload)",
                "offloading the optimizer with ZeRO-1 is not supported: ZeRO-1's moments are sharded by \
                 collectives inside the optimizer, on the device (use ZeRO-2 or 3 with offload: each rank's host \
                 updates its own slice)",
            ));
        }
        if cfg.offload && self.compiler.is_some() {
            return Err(Error::unsupported(
                "fit (offload)",
                "a compiled step updates on the device: offload needs the eager step",
            ));
        }
        match cfg.compute_dtype {
            DType::F32 | DType::BF16 | DType::F16 => Ok(()),
            d => Err(Error::UnsupportedDType { op: "fit (compute dtype)", dtype: d }),
        }
    }

    /// Trains on `data`; with `resume`, continues from the newest complete checkpoint in the
    /// workdir (or [`TrainConfig::resume_from`]). Claims the workdir ([`RunDir::claim`]) once
    /// the plan is made; see [`Trainer::fit_in`].
    pub fn fit(&self, dep: &Deployer<B>, data: &dyn Dataset<E>, resume: bool) -> Result<FitReport> {
        let cfg = &self.config;
        self.check_run(dep, data)?;
        let prepared = self.prepare(dep, data)?;
        let opts = ClaimOptions {
            resume,
            resume_from: cfg.resume_from.clone(),
            overwrite: cfg.overwrite,
            identity: cfg.identity.clone(),
            pending: Vec::new(),
        };
        let run = RunDir::claim(&dep.workdir, dep.world().rank == 0, &opts)?;
        self.train(dep, data, prepared, &run)
    }

    /// Trains on `data` in a run directory the caller has claimed ([`RunDir::claim`], e.g.
    /// before writing its own files there): the sharding plan from one traced forward pass,
    /// the compiled step when one is given, then every rank's steps ([`TrainConfig::steps`]
    /// in all; a run already at or past them trains nothing and rewrites nothing).
    pub fn fit_in(&self, dep: &Deployer<B>, data: &dyn Dataset<E>, run: &RunDir) -> Result<FitReport> {
        self.check_run(dep, data)?;
        let prepared = self.prepare(dep, data)?;
        self.train(dep, data, prepared, run)
    }

    /// The plan, and the compiled step when there is a compiler.
    fn prepare(&self, dep: &Deployer<B>, data: &dyn Dataset<E>) -> Result<Prepared<B>> {
        let (plan, units) = self.plan_and_units(dep, data)?;
        tracing::info!(mesh = %dep.mesh, params = plan.params.len(), "sharding plan derived from the traced forward pass");
        let compiled = match &self.compiler {
            Some(c) => Some(self.compile_step(c.as_ref(), dep, data, &plan)?),
            None => None,
        };
        Ok(Prepared { plan, units, compiled })
    }

    /// Every local rank's run, as one report.
    fn train(&self, dep: &Deployer<B>, data: &dyn Dataset<E>, p: Prepared<B>, run: &RunDir) -> Result<FitReport> {
        let Prepared { plan, units, compiled } = p;
        // (a run stopped after its last checkpoint but before its export finishes the export)
        let exported = dep.workdir.join("model.safetensors").exists();
        if let Some((step, dir)) = run.resume_from().filter(|(step, _)| *step >= self.config.steps && exported) {
            // already done: nothing to train, and nothing in the workdir is touched
            tracing::warn!(
                step,
                steps = self.config.steps,
                checkpoint = %dir.display(),
                "the run is already at or past its last step: nothing to train"
            );
            let rank = dep.local_ranks()?.first().copied().unwrap_or(0);
            return Ok(FitReport::empty(*step, plan, rank));
        }
        let stepper: Box<dyn StepStrategy<M, E, B> + Sync> = match compiled {
            Some(cs) => Box::new(CompiledRun(cs)),
            None => Box::new(EagerStep),
        };
        let results =
            dep.run(|rk| RankRun::start(self, (dep, rk), data, (&plan, &units), run)?.run(stepper.as_ref()))?;
        let comm: BTreeMap<usize, CommStats> = results.iter().map(|r| (r.rank, r.stats.clone())).collect();
        let device_memory = results.iter().filter_map(|r| Some((r.rank, r.memory?))).collect();
        let profile = results.iter().filter_map(|r| Some((r.rank, r.profile.clone()?))).collect();
        let first = results.into_iter().next().ok_or_else(|| Error::invalid("fit", "no rank ran in this process"))?;
        Ok(FitReport {
            start_step: run.start_step(),
            losses: first.losses,
            evals: first.evals,
            plan,
            rank: first.rank,
            comm,
            observer_errors: first.observer_errors,
            device_memory,
            profile,
        })
    }
}

/// What a run needs before its ranks start: the sharding plan and the compiled step.
struct Prepared<B: Backend> {
    plan: ShardPlan,
    /// The model's ZeRO-3 units.
    units: Vec<String>,
    compiled: Option<Arc<dyn CompiledStep<B>>>,
}

#[cfg(test)]
mod profile_tests {
    use super::{OpTime, StepProfile};

    #[test]
    fn a_profile_gives_tokens_per_second_host_gaps_and_mfu() {
        let op = |f: &str, s: f64| OpTime { family: f.into(), calls: 10, seconds: s };
        let p = StepProfile {
            steps: 4,
            tokens: 4 * 8192,
            seconds: 2.0,
            ops: vec![op("matmul", 1.2), op("AdamW", 0.3), op("allocator (driver calls, host)", 0.25)],
            peak_flops: Some(1e15),
        };
        assert_eq!(p.tokens_per_second(), 16384.0);
        // the host's allocator row is not device time
        assert!((p.host_gap_seconds() - 0.5).abs() < 1e-12);
        let mfu = p.mfu(5e9).unwrap();
        assert!((mfu - 5e9 * 16384.0 / 1e15).abs() < 1e-12);
        assert_eq!(StepProfile { peak_flops: None, ..p.clone() }.mfu(5e9), None);
        // device rows longer than the wall (clock skew) give no negative gap
        assert_eq!(StepProfile { seconds: 1.0, ..p }.host_gap_seconds(), 0.0);
    }
}
