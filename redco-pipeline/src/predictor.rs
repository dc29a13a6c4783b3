//! The `Predictor`: `collate_fn` and `pred_fn` in, outputs in input order out.

use super::data::Dataset;
use super::{Batch, Deployer, StepCtx};
use redco_core::nn::Module;
use redco_core::planning::ShardPlan;
use redco_core::{no_grad, Backend, Error, MeshAxis, Result};
use redco_cpu::Cpu;

type ModelFn<M, B> = Box<dyn Fn(&B) -> Result<M> + Send + Sync>;
type CollateFn<E, B> = Box<dyn Fn(&B, &[E]) -> Result<Batch<B>> + Send + Sync>;
type PredFn<M, O, B> = Box<dyn Fn(&StepCtx<B>, &M, &Batch<B>) -> Result<Vec<O>> + Send + Sync>;
type OutputFn<O> = Box<dyn Fn(usize, &O) -> Result<()> + Send + Sync>;

/// An inference pipeline on backend `B` (CPU ranks by default). The last batch is padded
/// with copies of its last example (so every batch has the same shape) and the padding's
/// outputs are dropped.
pub struct Predictor<M, E, O, B: Backend = Cpu> {
    model_fn: ModelFn<M, B>,
    collate_fn: CollateFn<E, B>,
    pred_fn: PredFn<M, O, B>,
    output_fn: Option<OutputFn<O>>,
    /// Examples per batch (split over `dp`).
    pub batch_size: usize,
}

impl<M: Module<Cpu>, E: Clone + Send + Sync, O: Send> Predictor<M, E, O, Cpu> {
    /// A predictor on CPU ranks from the model constructor and the two functions. `pred_fn`
    /// returns one output per example of the (whole) batch.
    pub fn new(
        model_fn: impl Fn(&Cpu) -> Result<M> + Send + Sync + 'static,
        collate_fn: impl Fn(&Cpu, &[E]) -> Result<Batch<Cpu>> + Send + Sync + 'static,
        pred_fn: impl Fn(&StepCtx<Cpu>, &M, &Batch<Cpu>) -> Result<Vec<O>> + Send + Sync + 'static,
        batch_size: usize,
    ) -> Self {
        Predictor::for_backend(model_fn, collate_fn, pred_fn, batch_size)
    }
}

impl<M: Module<B>, E: Clone + Send + Sync, O: Send, B: Backend> Predictor<M, E, O, B> {
    /// [`Predictor::new`] on any backend: the functions take `B`'s devices, and
    /// [`Predictor::predict`] runs on a [`Deployer<B>`] (which makes each rank's device).
    pub fn for_backend(
        model_fn: impl Fn(&B) -> Result<M> + Send + Sync + 'static,
        collate_fn: impl Fn(&B, &[E]) -> Result<Batch<B>> + Send + Sync + 'static,
        pred_fn: impl Fn(&StepCtx<B>, &M, &Batch<B>) -> Result<Vec<O>> + Send + Sync + 'static,
        batch_size: usize,
    ) -> Self {
        Predictor {
            model_fn: Box::new(model_fn),
            collate_fn: Box::new(collate_fn),
            pred_fn: Box::new(pred_fn),
            output_fn: None,
            batch_size,
        }
    }

    /// Calls `output_fn(index, &output)` on rank 0 for every output, in input order, as
    /// soon as its batch is done (e.g. to stream predictions to a file).
    pub fn with_output(mut self, output_fn: impl Fn(usize, &O) -> Result<()> + Send + Sync + 'static) -> Self {
        self.output_fn = Some(Box::new(output_fn));
        self
    }

    /// Outputs for every example of `data`, in order, with the model laid out by `plan`.
    /// Each rank reads and collates only its `dp` slice of every batch; `pred_fn` returns
    /// the whole batch's outputs (gathering what it needs), so every rank, rank 0 included,
    /// returns every output in input order.
    pub fn predict(&self, dep: &Deployer<B>, data: &dyn Dataset<E>, plan: &ShardPlan) -> Result<Vec<O>> {
        let bs = self.batch_size;
        if bs == 0 || !bs.is_multiple_of(dep.mesh.dp) {
            return Err(Error::invalid(
                "predict",
                format!("batch size {bs} must be positive and divisible by dp={}", dep.mesh.dp),
            ));
        }
        let mut all = dep.run(|rk| {
            let mut model = (self.model_fn)(&rk.backend)?;
            plan.apply(&mut model, Some(&rk.comm))?;
            let n = data.len();
            let mut out = Vec::with_capacity(n);
            let (dp, d) = (dep.mesh.dp, rk.comm.index_along(MeshAxis::Dp));
            let per = bs / dp;
            for (bi, start) in (0..n).step_by(bs).enumerate() {
                // this rank reads and collates only its slice of the batch (the last batch
                // padded with copies of its last example)
                let real = (n - start).min(bs);
                let ex: Vec<E> = (start + d * per..start + (d + 1) * per)
                    .map(|i| data.get(i.min(start + real - 1)))
                    .collect::<Result<_>>()?;
                let mut batch = Batch::new();
                for (k, t) in (self.collate_fn)(&rk.backend, &ex)? {
                    batch.insert(k, super::agree::dp_shard(t, dp)?);
                }
                let ctx = StepCtx {
                    backend: &rk.backend,
                    rank: rk.rank,
                    mesh: dep.mesh,
                    step: bi as u64,
                    micro: 0,
                    train: false,
                    seed: dep.seed,
                };
                let o = no_grad(|| (self.pred_fn)(&ctx, &model, &batch))?;
                if o.len() != bs {
                    return Err(Error::invalid("pred_fn", format!("returned {} outputs for a batch of {bs}", o.len())));
                }
                for o in o.into_iter().take(real) {
                    if let (Some(f), 0) = (&self.output_fn, rk.rank) {
                        f(out.len(), &o)?;
                    }
                    out.push(o);
                }
            }
            Ok(out)
        })?;
        Ok(all.swap_remove(0))
    }
}
