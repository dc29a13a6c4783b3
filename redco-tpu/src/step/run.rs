//! Running a compiled step: the runtime inputs, the per-replica batches, the host checks
//! of the ids, the one host read of the report; and each replica's state, in and out.

use super::{Binding, CompiledTrainStep, HEAD};
use crate::api::pjrt_error;
use crate::eager::Pjrt;
use crate::storage::PjrtStorage;
use redco_core::{DType, HostData, MeshAxis, Result, Shape, Tensor};
use redco_pipeline::compiled::{StepInputs, StepReport};
use std::sync::Arc;

impl CompiledTrainStep {
    /// Runs one step on `batch` with the configuration's learning rate, no loss scaling
    /// and no clipping.
    pub fn step(&mut self, batch: &[&Tensor<Pjrt>]) -> Result<StepReport> {
        let inputs = StepInputs { lr: self.cfg.lr, loss_scale: 1.0, clip_norm: None };
        self.step_with(batch, &inputs)
    }

    /// Runs one step on `batch` with `inputs` (all runtime inputs: nothing is compiled
    /// again). A step whose gradients are not finite changes nothing and says so in its
    /// report.
    pub fn step_with(&mut self, batch: &[&Tensor<Pjrt>], inputs: &StepInputs) -> Result<StepReport> {
        let got: Vec<(Shape, DType)> = batch.iter().map(|x| (x.shape().clone(), x.dtype())).collect();
        if got != self.batch {
            return Err(pjrt_error(
                "compiled step",
                format!("the batch {got:?} differs from the one the step was compiled for {:?}", self.batch),
            ));
        }
        let dp = self.mesh.dp;
        let host: Vec<HostData> = batch.iter().map(|x| x.to_host()).collect::<Result<_>>()?;
        self.check_ids(&host)?;
        // each replica's slice of the batch, on its device
        let mut per: Vec<Vec<PjrtStorage>> = Vec::with_capacity(self.replicas.len());
        for (r, rep) in self.replicas.iter().enumerate() {
            let d = self.mesh.index_along(r, MeshAxis::Dp);
            let mut v = Vec::new();
            for (h, (s, _)) in host.iter().zip(&self.batch) {
                let n = s.elem_count() / dp;
                v.push(rep.b.store(h.range(d * n, n))?);
            }
            per.push(v);
        }
        self.run(per, inputs)
    }

    /// Ids looked up in a table, checked on the host against its rows (inside the program
    /// an out-of-range id cannot stop it); `batch` is the whole batch.
    pub(crate) fn check_ids(&self, batch: &[HostData]) -> Result<()> {
        self.check_with(batch.len(), |j| batch[j].to_i64_vec())
    }

    /// [`CompiledTrainStep::check_ids`] for replica `r`'s slice of the batch, read from the
    /// kept host copy of its ids (only the entries that are looked up are read).
    pub(crate) fn check_replica_ids(&self, r: usize, batch: &[PjrtStorage]) -> Result<()> {
        let rep = self.replicas.get(r).ok_or_else(|| pjrt_error("compiled step", format!("no replica {r}")))?;
        self.check_with(batch.len(), |j| rep.b.host_ids(&batch[j], "compiled step")?.to_i64_vec())
    }

    /// Checks the ids of batch entry `j` (from `ids(j)`, for `j < n`) against every bound
    /// recorded for it.
    fn check_with(&self, n: usize, ids: impl Fn(usize) -> Result<Vec<i64>>) -> Result<()> {
        let p = self.names.len();
        for &(arg, size) in &self.checks {
            let Some(j) = arg.checked_sub(3 * p).filter(|&j| j < n) else { continue };
            if let Some(&bad) = ids(j)?.iter().find(|&&i| i < 0 || i as u64 >= size as u64) {
                return Err(redco_core::Error::IndexOutOfRange { op: "compiled step", index: bad, size });
            }
        }
        Ok(())
    }

    /// Runs one step with `batches[r]`, replica `r`'s slice of the batch (on its device,
    /// in the compiled order and local shapes).
    pub(crate) fn run(&mut self, batches: Vec<Vec<PjrtStorage>>, inputs: &StepInputs) -> Result<StepReport> {
        if !(inputs.loss_scale.is_finite() && inputs.loss_scale > 0.0)
            || inputs.clip_norm.is_some_and(|c| c.is_nan() || c <= 0.0)
        {
            return Err(pjrt_error(
                "compiled step",
                format!("the loss scale must be positive and finite and the clipping norm positive: {inputs:?}"),
            ));
        }
        if batches.len() != self.replicas.len() || batches.iter().any(|b| b.len() != self.batch.len()) {
            return Err(pjrt_error("compiled step", "one slice of every batch tensor per replica is needed"));
        }
        let p = self.names.len();
        let c = self.cfg;
        let t = (self.step + 1) as i32;
        let (bc1, bc2) = (1.0 - c.beta1.powi(t), 1.0 - c.beta2.powi(t));
        let clip = inputs.clip_norm.unwrap_or(f64::INFINITY);
        let scalars = [inputs.lr, 1.0 / bc1, 1.0 / bc2, 1.0 - inputs.lr * c.weight_decay, inputs.loss_scale, clip];
        let mut extra = batches;
        for (rep, v) in self.replicas.iter().zip(extra.iter_mut()) {
            for &x in &scalars {
                v.push(rep.b.store(HostData::F32(vec![x as f32]))?);
            }
        }
        let lists: Vec<Vec<&crate::Buffer>> = self
            .replicas
            .iter()
            .zip(&extra)
            .map(|(rep, ex)| {
                let args: Vec<&PjrtStorage> = rep.params.iter().chain(&rep.m).chain(&rep.v).chain(ex).collect();
                rep.bindings
                    .iter()
                    .map(|bd| match bd {
                        Binding::Arg(i) => &*args[*i].buf,
                        Binding::Fixed(s) => &*s.buf,
                    })
                    .collect()
            })
            .collect();
        let outs = if self.replicas.len() == 1 {
            vec![self.exe.execute(self.replicas[0].b.device, &lists[0])?]
        } else {
            self.exe.execute_replicated(&lists)?
        };
        drop(lists);
        self.replicas[0].b.ctx.executed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut head = None;
        for (rep, out) in self.replicas.iter_mut().zip(outs) {
            if out.len() != HEAD + 3 * p {
                return Err(pjrt_error(
                    "compiled step",
                    format!("the program returned {} outputs, not {}", out.len(), HEAD + 3 * p),
                ));
            }
            let mut it = out.into_iter().map(|buf| PjrtStorage { buf: Arc::new(buf), host: None });
            let Some(h) = it.next() else { return Err(pjrt_error("compiled step", "the program returned no loss")) };
            head.get_or_insert(h);
            rep.params = it.by_ref().take(p).collect();
            rep.m = it.by_ref().take(p).collect();
            rep.v = it.collect();
        }
        // the one host read of the step
        let head = head.ok_or_else(|| pjrt_error("compiled step", "no replica"))?.buf.download()?.to_f64_vec();
        let [loss, grad_norm, finite] = head[..] else {
            return Err(pjrt_error("compiled step", format!("the step's report has {} values, not 3", head.len())));
        };
        let finite = finite != 0.0;
        if finite {
            self.step += 1;
        }
        Ok(StepReport { loss, grad_norm, finite })
    }

    /// The optimizer steps taken (finite ones: a skipped step does not count).
    pub fn steps(&self) -> u64 {
        self.step
    }

    /// Replica `r`'s parameters, first and second moments (local shards, in the order of
    /// [`CompiledTrainStep::names`]) as tensors of its device.
    pub fn replica_state(&self, r: usize) -> Result<[Vec<Tensor<Pjrt>>; 3]> {
        let rep = self.replicas.get(r).ok_or_else(|| pjrt_error("compiled step", format!("no replica {r}")))?;
        let wrap = |v: &[PjrtStorage]| -> Vec<Tensor<Pjrt>> {
            v.iter()
                .zip(&self.locals)
                .zip(&self.dtypes)
                .map(|((s, l), d)| Tensor::from_storage(&rep.b, s.clone(), l.clone(), *d))
                .collect()
        };
        Ok([wrap(&rep.params), wrap(&rep.m), wrap(&rep.v)])
    }

    /// Replaces replica `r`'s parameters and moments (local shards in the order of
    /// [`CompiledTrainStep::names`], each of its compiled shape and dtype; moved to the
    /// replica's device when they are elsewhere) and sets the optimizer steps taken.
    pub fn set_replica_state(&mut self, r: usize, state: [Vec<Tensor<Pjrt>>; 3], steps: u64) -> Result<()> {
        let n = self.replicas.len();
        let rep = self.replicas.get(r).ok_or_else(|| pjrt_error("compiled step", format!("no replica {r} of {n}")))?;
        let mut parts = Vec::with_capacity(3);
        for (kind, ts) in ["parameter", "first moment", "second moment"].into_iter().zip(state) {
            if ts.len() != self.names.len() {
                return Err(pjrt_error(
                    "compiled step",
                    format!("{} values for {} {kind}s", ts.len(), self.names.len()),
                ));
            }
            let mut v = Vec::with_capacity(ts.len());
            for (i, t) in ts.into_iter().enumerate() {
                if t.shape() != &self.locals[i] || t.dtype() != self.dtypes[i] {
                    return Err(redco_core::Error::Parameter {
                        name: self.names[i].clone(),
                        msg: format!(
                            "the {kind} is {} {:?} but the step was compiled for {} {:?}",
                            t.shape(),
                            t.dtype(),
                            self.locals[i],
                            self.dtypes[i]
                        ),
                    });
                }
                let s = t.storage().clone();
                v.push(if t.backend().device == rep.b.device { s } else { rep.b.store(s.buf.download()?)? });
            }
            parts.push(v);
        }
        let rep = &mut self.replicas[r];
        rep.v = parts.pop().unwrap_or_default();
        rep.m = parts.pop().unwrap_or_default();
        rep.params = parts.pop().unwrap_or_default();
        self.step = steps;
        Ok(())
    }
}
