//! The compiled step as the [`Trainer`](redco_pipeline::Trainer) drives it: one
//! [`CompiledTrainStep`] (one SPMD program over the mesh's devices) shared by the ranks'
//! threads. Each rank hands in its slice of the batch, as it would join a collective; the
//! last one to arrive runs the program for all of them, and every rank gets the report.
//! A rank that does not arrive within the timeout fails the step on every rank with an
//! error naming the missing ranks (never a hang).

use crate::eager::Pjrt;
use crate::step::CompiledTrainStep;
use crate::storage::PjrtStorage;
use crate::trace::Tracer;
use redco_core::nn::Module;
use redco_core::optim::AdamWConfig;
use redco_core::planning::ShardPlan;
use redco_core::{DType, Error, Result, Shape, Tensor};
use redco_pipeline::compiled::{CompiledStep, StepCompiler, StepInputs, StepReport, StepState};
use redco_pipeline::Batch;
use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// One round of the rendezvous: the ranks' slices, then the report.
struct Round {
    step: CompiledTrainStep,
    /// Rounds completed.
    done: u64,
    slots: Vec<Option<(Vec<PjrtStorage>, StepInputs)>>,
    /// The last round's outcome (an error as its message).
    result: std::result::Result<StepReport, String>,
    /// Set when a rank gave up waiting: every later step fails with it.
    failed: Option<String>,
}

/// A [`CompiledStep`] over a [`CompiledTrainStep`] for the rank threads of one process.
pub struct SharedStep {
    round: Mutex<Round>,
    arrived: Condvar,
    keys: Vec<String>,
    local: Vec<(Shape, DType)>,
    names: Vec<String>,
    timeout: Duration,
}

impl SharedStep {
    /// Shares `step` among its ranks, for batches with entries `keys` (in the step's
    /// order); a rank waits at most `timeout` for the others.
    pub fn new(step: CompiledTrainStep, keys: Vec<String>, timeout: Duration) -> SharedStep {
        let mesh = step.mesh();
        let local = step.local_batch();
        let names = step.names().to_vec();
        let round = Round {
            slots: vec![None; mesh.size()],
            step,
            done: 0,
            result: Err("no step has run".into()),
            failed: None,
        };
        SharedStep { round: Mutex::new(round), arrived: Condvar::new(), keys, local, names, timeout }
    }

    fn lock(&self) -> MutexGuard<'_, Round> {
        self.round.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Rank `rank`'s slice of the batch, in the step's order, checked against the
    /// compiled shapes.
    fn slice(&self, batch: &Batch<Pjrt>) -> Result<Vec<PjrtStorage>> {
        if batch.len() != self.keys.len() {
            let got: Vec<&String> = batch.keys().collect();
            return Err(Error::invalid(
                "compiled step",
                format!("the batch has entries {got:?}, the step was compiled for {:?}", self.keys),
            ));
        }
        self.keys
            .iter()
            .zip(&self.local)
            .map(|(k, (shape, dtype))| {
                let t = batch.get(k).ok_or_else(|| {
                    Error::invalid("compiled step", format!("the batch has no `{k}` (compiled for {:?})", self.keys))
                })?;
                if t.local_shape() != shape || t.dtype() != *dtype {
                    return Err(Error::invalid(
                        "compiled step",
                        format!(
                            "batch entry `{k}` is {} {:?} but the step was compiled for {shape} {dtype:?}",
                            t.local_shape(),
                            t.dtype()
                        ),
                    ));
                }
                Ok(t.storage().clone())
            })
            .collect()
    }
}

/// Runs the round once every slot is filled (by the last rank to arrive).
fn run_round(g: &mut Round) {
    let mut batches = Vec::with_capacity(g.slots.len());
    let mut inputs = None;
    for s in g.slots.iter_mut() {
        if let Some((b, i)) = s.take() {
            inputs.get_or_insert(i);
            batches.push(b);
        }
    }
    let run = |g: &mut Round| -> Result<StepReport> {
        let inputs = inputs.ok_or_else(|| Error::invalid("compiled step", "no rank gave the step's inputs"))?;
        for (r, b) in batches.iter().enumerate() {
            g.step.check_replica_ids(r, b)?;
        }
        g.step.run(batches, &inputs)
    };
    g.result = run(g).map_err(|e| e.to_string());
    g.done += 1;
}

impl CompiledStep<Pjrt> for SharedStep {
    fn step(&self, rank: usize, batch: &Batch<Pjrt>, inputs: &StepInputs) -> Result<StepReport> {
        let mine = self.slice(batch)?;
        let mut g = self.lock();
        if let Some(f) = &g.failed {
            return Err(Error::RankFailed { rank, msg: f.clone() });
        }
        if rank >= g.slots.len() {
            return Err(Error::invalid("compiled step", format!("rank {rank} is not in the step's mesh")));
        }
        let round = g.done;
        g.slots[rank] = Some((mine, *inputs));
        if g.slots.iter().all(Option::is_some) {
            run_round(&mut g);
            self.arrived.notify_all();
        } else {
            let start = Instant::now();
            while g.done == round && g.failed.is_none() {
                let left = self.timeout.saturating_sub(start.elapsed());
                if left.is_zero() {
                    let missing: Vec<usize> = (0..g.slots.len()).filter(|&r| g.slots[r].is_none()).collect();
                    let msg = format!(
                        "rank {rank} waited {:.0} s for ranks {missing:?} to reach training step {}",
                        self.timeout.as_secs_f64(),
                        g.step.steps() + 1
                    );
                    g.failed = Some(msg.clone());
                    self.arrived.notify_all();
                    return Err(Error::RankFailed { rank, msg });
                }
                g = self.arrived.wait_timeout(g, left).map(|(g, _)| g).unwrap_or_else(|p| p.into_inner().0);
            }
            if let Some(f) = &g.failed {
                return Err(Error::RankFailed { rank, msg: f.clone() });
            }
        }
        g.result.clone().map_err(|msg| Error::RankFailed { rank, msg })
    }

    fn state(&self, rank: usize) -> Result<StepState<Pjrt>> {
        let g = self.lock();
        let [p, m, v] = g.step.replica_state(rank)?;
        let named =
            |ts: Vec<Tensor<Pjrt>>| -> BTreeMap<String, Tensor<Pjrt>> { self.names.iter().cloned().zip(ts).collect() };
        Ok(StepState { params: named(p), m: named(m), v: named(v), steps: g.step.steps() })
    }

    fn set_state(&self, rank: usize, mut state: StepState<Pjrt>) -> Result<()> {
        let ordered = |map: &mut BTreeMap<String, Tensor<Pjrt>>, what: &str| -> Result<Vec<Tensor<Pjrt>>> {
            self.names
                .iter()
                .map(|n| {
                    map.remove(n).ok_or_else(|| Error::Parameter { name: n.clone(), msg: format!("no {what} given") })
                })
                .collect()
        };
        let p = ordered(&mut state.params, "value")?;
        let m = ordered(&mut state.m, "first moment")?;
        let v = ordered(&mut state.v, "second moment")?;
        self.lock().step.set_replica_state(rank, [p, m, v], state.steps)
    }
}

/// The [`StepCompiler`] the Trainer takes for PJRT: `build` makes the model's architecture
/// on the [`Tracer`] (its values are discarded) and `loss` is the Trainer's `loss_fn`
/// written for it, traced once (so it must not depend on the step number).
pub struct PjrtStepCompiler<MT, FB, FL> {
    build: FB,
    loss: FL,
    timeout: Duration,
    _model: PhantomData<fn() -> MT>,
}

impl<MT, FB, FL> PjrtStepCompiler<MT, FB, FL> {
    /// A compiler from the traced twin of the model and of the loss; a rank waits at most
    /// `timeout` for the others at each step.
    pub fn new(build: FB, loss: FL, timeout: Duration) -> Self {
        PjrtStepCompiler { build, loss, timeout, _model: PhantomData }
    }
}

impl<M, MT, FB, FL> StepCompiler<M, Pjrt> for PjrtStepCompiler<MT, FB, FL>
where
    M: Module<Pjrt>,
    MT: Module<Tracer>,
    FB: Fn(&Tracer) -> Result<MT> + Send + Sync,
    FL: Fn(&MT, &Batch<Tracer>) -> Result<Tensor<Tracer>> + Send + Sync,
{
    fn compile(
        &self,
        model: &M,
        plan: &ShardPlan,
        batch: &Batch<Pjrt>,
        opt: &AdamWConfig,
    ) -> Result<Arc<dyn CompiledStep<Pjrt>>> {
        let Some(first) = batch.values().next() else {
            return Err(Error::invalid("compiled step", "the batch has no tensors"));
        };
        let b = first.backend().clone();
        let dp = plan.mesh.dp;
        let keys: Vec<String> = batch.keys().cloned().collect();
        // the whole batch: dp slices like this one
        let whole = batch
            .values()
            .map(|t| {
                let mut d = t.local_shape().dims().to_vec();
                match d.first_mut() {
                    Some(n) => *n *= dp,
                    None => return Err(Error::invalid("compiled step", "a batch tensor has no batch dimension")),
                }
                Ok((Shape::new(d), t.dtype()))
            })
            .collect::<Result<Vec<_>>>()?;
        let step = CompiledTrainStep::on_mesh_for(&b, plan, model, *opt, &whole, &self.build, |m, xs| {
            let traced: Batch<Tracer> = keys.iter().cloned().zip(xs.iter().cloned()).collect();
            (self.loss)(m, &traced)
        })?;
        Ok(Arc::new(SharedStep::new(step, keys, self.timeout)))
    }
}
