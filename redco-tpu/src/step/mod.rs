//! Compiled training steps: forward, loss, backward and the AdamW update of a whole model
//! traced once into one StableHLO program, compiled once and replayed, with the parameters
//! and optimizer moments kept on the device (their buffers donated to the updated ones).
//!
//! The step reads nothing from the host in the middle: the loss comes back as a device
//! value with the new state. The learning rate, the bias corrections of the step count and
//! the decay factor are runtime inputs (0-d tensors), so one program serves every step;
//! data the trace uploaded (rotary tables, masks: they depend only on the shapes) is
//! uploaded once and bound at every replay. Ids the model looks up in a batch tensor are
//! checked on the host against the table they index before each replay.
//!
//! Over a `dp x mp` mesh of the client's devices the step is one SPMD program, replicated
//! on every device: it is traced with a [`TracedCollective`] installed, so the sharded ops
//! of the model (Megatron's column and row pairs, the vocabulary-parallel embedding and
//! cross-entropy) emit the program's own collectives over the `mp` groups, and every
//! rank-dependent offset comes from the replica id. Each device holds its shard of the
//! parameters (from the [`ShardPlan`]) and takes its data-parallel slice of the batch; the
//! gradients and the loss are averaged over the `dp` groups by the program's own
//! `stablehlo.all_reduce`, so the host neither moves nor sums anything between devices.

use crate::api::pjrt_error;
use crate::collective::TracedCollective;
use crate::eager::Pjrt;
use crate::executable::Executable;
use crate::hlo::Et;
use crate::proto::CompileOptions;
use crate::storage::PjrtStorage;
use crate::trace::{Input, TVal, Tracer};
use redco_core::nn::{Module, ModuleExt};
use redco_core::optim::AdamWConfig;
use redco_core::placement::local_shape;
use redco_core::{
    planning::ShardPlan,
    runtime::{Comm, CommGuard, CommStats, Mesh, ReduceKind},
};
use redco_core::{DType, HostData, MeshAxis, Placement, Placements, Result, Shape, Tensor};
use redco_cpu::Cpu;
use std::sync::Arc;

mod run;

/// What a program parameter of a compiled step is bound to at each replay.
enum Binding {
    /// Step argument `i`: parameters, then first moments, second moments, the batch, and
    /// the four runtime scalars.
    Arg(usize),
    /// Device data made once when the step was compiled.
    Fixed(PjrtStorage),
}

/// The state one device keeps: its replica of the parameters and moments, and the data
/// the trace uploaded.
struct Replica {
    b: Pjrt,
    bindings: Vec<Binding>,
    params: Vec<PjrtStorage>,
    m: Vec<PjrtStorage>,
    v: Vec<PjrtStorage>,
}

/// A training step of one model compiled into one PJRT program, on one device or as one
/// SPMD program over a `dp x mp` mesh of devices (data and tensor parallelism).
pub struct CompiledTrainStep {
    exe: Arc<Executable>,
    /// One per mesh rank, in rank order.
    replicas: Vec<Replica>,
    mesh: Mesh,
    text: String,
    names: Vec<String>,
    shapes: Vec<Shape>,
    placements: Vec<Placements>,
    /// Each parameter's local shape and dtype.
    locals: Vec<Shape>,
    dtypes: Vec<DType>,
    /// `(argument, size)`: batch ids looked up in a table of `size` rows.
    checks: Vec<(usize, usize)>,
    stats: CommStats,
    batch: Vec<(Shape, DType)>,
    cfg: AdamWConfig,
    step: u64,
}

/// The number of runtime scalars: learning rate, 1 / bias1, 1 / bias2, 1 - lr * wd, the
/// loss scale and the clipping norm.
const SCALARS: usize = 6;

/// The outputs before the new state: one `[loss, gradient norm, finite]` vector.
const HEAD: usize = 1;

impl CompiledTrainStep {
    /// Traces one step of `model` (on `b`) with AdamW `cfg` on one device: `build` makes
    /// the same architecture on the tracer (its initial values are discarded), `loss`
    /// computes the loss from the batch tensors (shaped like `batch`, which every step must
    /// match).
    pub fn new<M, MT>(
        b: &Pjrt,
        model: &M,
        cfg: AdamWConfig,
        batch: &[&Tensor<Pjrt>],
        build: impl FnOnce(&Tracer) -> Result<MT>,
        loss: impl FnOnce(&MT, &[Tensor<Tracer>]) -> Result<Tensor<Tracer>>,
    ) -> Result<CompiledTrainStep>
    where
        M: Module<Pjrt>,
        MT: Module<Tracer>,
    {
        CompiledTrainStep::data_parallel(b, 1, model, cfg, batch, build, loss)
    }

    /// Like [`CompiledTrainStep::new`], replicated over devices `0..dp` of `b`'s client:
    /// every batch tensor is split along its first dimension (which `dp` must divide), the
    /// gradients and the loss are averaged inside the program.
    pub fn data_parallel<M, MT>(
        b: &Pjrt,
        dp: usize,
        model: &M,
        cfg: AdamWConfig,
        batch: &[&Tensor<Pjrt>],
        build: impl FnOnce(&Tracer) -> Result<MT>,
        loss: impl FnOnce(&MT, &[Tensor<Tracer>]) -> Result<Tensor<Tracer>>,
    ) -> Result<CompiledTrainStep>
    where
        M: Module<Pjrt>,
        MT: Module<Tracer>,
    {
        let plan = ShardPlan { mesh: Mesh::new(dp.max(1), 1)?, params: Default::default(), rank: None, ep: 1 };
        CompiledTrainStep::on_mesh(b, &plan, model, cfg, batch, build, loss)
    }

    /// Like [`CompiledTrainStep::new`], as one SPMD program over devices
    /// `0..dp * mp` of `b`'s client for the mesh of `plan`: device `r` is mesh rank `r`
    /// and holds its shard of every parameter as `plan` places it (`model` holds the whole
    /// values); every batch tensor is split along its first dimension over `dp` (which must
    /// divide it) and replicated over `mp`.
    pub fn on_mesh<M, MT>(
        b: &Pjrt,
        plan: &ShardPlan,
        model: &M,
        cfg: AdamWConfig,
        batch: &[&Tensor<Pjrt>],
        build: impl FnOnce(&Tracer) -> Result<MT>,
        loss: impl FnOnce(&MT, &[Tensor<Tracer>]) -> Result<Tensor<Tracer>>,
    ) -> Result<CompiledTrainStep>
    where
        M: Module<Pjrt>,
        MT: Module<Tracer>,
    {
        let meta: Vec<(Shape, DType)> = batch.iter().map(|x| (x.shape().clone(), x.dtype())).collect();
        CompiledTrainStep::on_mesh_for(b, plan, model, cfg, &meta, build, loss)
    }

    /// [`CompiledTrainStep::on_mesh`] for whole batches of these shapes and dtypes.
    pub fn on_mesh_for<M, MT>(
        b: &Pjrt,
        plan: &ShardPlan,
        model: &M,
        cfg: AdamWConfig,
        batch: &[(Shape, DType)],
        build: impl FnOnce(&Tracer) -> Result<MT>,
        loss: impl FnOnce(&MT, &[Tensor<Tracer>]) -> Result<Tensor<Tracer>>,
    ) -> Result<CompiledTrainStep>
    where
        M: Module<Pjrt>,
        MT: Module<Tracer>,
    {
        let mesh = plan.mesh;
        let (dp, sizes) = (mesh.dp, [mesh.dp, mesh.mp]);
        if let Some((x, _)) = batch.iter().find(|(x, _)| x.rank() == 0 || x.dims()[0] % dp != 0) {
            return Err(pjrt_error(
                "compiled step",
                format!("a batch tensor of shape {x} does not split over dp = {dp} along its first dimension"),
            ));
        }
        let have = b.client().devices().len();
        if mesh.size() > have {
            return Err(pjrt_error(
                "compiled step",
                format!("mesh {mesh} needs {} devices but the client has {have}", mesh.size()),
            ));
        }
        let devices: Vec<Pjrt> = (0..mesh.size()).map(|r| b.on_device(r)).collect::<Result<_>>()?;
        let named = model.named_parameters();
        let names: Vec<String> = named.iter().map(|(n, _)| n.clone()).collect();
        let shapes: Vec<Shape> = named.iter().map(|(_, p)| p.shape().clone()).collect();
        let dtypes: Vec<DType> = named.iter().map(|(_, p)| p.dtype()).collect();
        if let Some((n, _)) = named.iter().find(|(_, p)| p.is_sharded()) {
            return Err(pjrt_error(
                "compiled step",
                format!("`{n}` is already sharded: pass the whole model and the plan that splits it"),
            ));
        }
        let placements: Vec<Placements> = names.iter().map(|n| plan.placements(n)).collect();
        let locals: Vec<Shape> = shapes
            .iter()
            .zip(&placements)
            .zip(&names)
            .map(|((s, p), n)| {
                local_shape(s, *p, sizes).map_err(|e| pjrt_error("compiled step", format!("`{n}`: {e}")))
            })
            .collect::<Result<_>>()?;
        let p = named.len();
        let t = Tracer::new();
        let comm = Comm::new(Arc::new(TracedCollective::new(&t, mesh)));
        let _installed = CommGuard::install(comm.clone());
        let arg = |i: usize, n: usize, d: DType| t.input(Input::Arg(i), n, Et::of(d));
        let tv = |val: TVal, s: &Shape, d: DType| Tensor::from_storage(&t, val, s.clone(), d);
        // each rank's shard of every parameter, placed as planned
        let xs: Vec<Tensor<Tracer>> = (0..p)
            .map(|i| {
                let v = arg(i, locals[i].elem_count(), dtypes[i]);
                Tensor::from_local(&t, v, shapes[i].clone(), locals[i].clone(), placements[i], dtypes[i]).into_var()
            })
            .collect();
        let ms: Vec<Tensor<Tracer>> =
            (0..p).map(|i| tv(arg(p + i, locals[i].elem_count(), dtypes[i]), &locals[i], dtypes[i])).collect();
        let vs: Vec<Tensor<Tracer>> =
            (0..p).map(|i| tv(arg(2 * p + i, locals[i].elem_count(), dtypes[i]), &locals[i], dtypes[i])).collect();
        let batch_meta: Vec<(Shape, DType)> = batch.to_vec();
        // each replica's slice of the batch
        let bt: Vec<Tensor<Tracer>> = batch_meta
            .iter()
            .enumerate()
            .map(|(j, (s, d))| {
                let mut dims = s.dims().to_vec();
                dims[0] /= dp;
                let local = Shape::new(dims);
                tv(arg(3 * p + j, local.elem_count(), *d), &local, *d)
            })
            .collect();
        let k = 3 * p + batch.len();
        let sc: Vec<Tensor<Tracer>> =
            (0..SCALARS).map(|j| tv(arg(k + j, 1, DType::F32), &Shape::new([]), DType::F32)).collect();

        let mut mt = build(&t)?;
        // the traced twin must be the same architecture, parameter by parameter
        let twin = mt.named_parameters();
        if let Some(((n, s), (tn, tp))) =
            names.iter().zip(&shapes).zip(&twin).find(|((n, s), (tn, tp))| *n != tn || *s != tp.shape())
        {
            return Err(pjrt_error(
                "compiled step",
                format!("the traced model differs from the model: `{tn}` {} where the model has `{n}` {s}", tp.shape()),
            ));
        }
        drop(twin);
        let mut idx = 0;
        mt.visit_mut("", &mut |_, x| {
            if let Some(new) = xs.get(idx) {
                *x = new.clone();
            }
            idx += 1;
        });
        if idx != p {
            return Err(pjrt_error("compiled step", format!("the traced model has {idx} parameters, the model {p}")));
        }
        let l = loss(&mt, &bt)?;
        let (lr, ib1, ib2, decay, scale, clip) = (&sc[0], &sc[1], &sc[2], &sc[3], &sc[4], &sc[5]);
        // backward of the loss times the runtime loss scale
        let grads = l.mul(scale)?.backward()?;
        // the mean over the data-parallel replicas, by the program's own all-reduce
        let mean = |x: &Tensor<Tracer>| -> Result<Tensor<Tracer>> {
            if dp == 1 {
                return Ok(x.clone());
            }
            let bytes = x.elem_count() * x.dtype().size_in_bytes();
            let s = comm.all_reduce(MeshAxis::Dp, x.storage(), ReduceKind::Sum, bytes)?;
            Tensor::from_storage(&t, s, x.shape().clone(), x.dtype()).scale(1.0 / dp as f64)
        };
        let local =
            |x: &Tensor<Tracer>| Tensor::from_storage(&t, x.storage().clone(), x.local_shape().clone(), x.dtype());
        let lv = redco_core::no_grad(|| l.detach().replicate())?;
        let mean_loss = redco_core::no_grad(|| mean(&local(&lv)))?;
        let mut outs = Vec::with_capacity(HEAD + 3 * p);
        let (mut nx, mut nm, mut nv) = (Vec::new(), Vec::new(), Vec::new());
        redco_core::no_grad(|| -> Result<()> {
            // each parameter's gradient: unscaled, averaged over dp, as its local shard
            let mut gs = Vec::with_capacity(p);
            for i in 0..p {
                let x = local(&xs[i].detach());
                gs.push(match grads.get(&xs[i]) {
                    Some(g) => mean(&local(&g.redistribute(placements[i])?).cast(x.dtype())?.div(scale)?)?,
                    None => x.zeros_like()?,
                });
            }
            // the global norm (split shards add up over mp, one scalar all-reduce, as in
            // Megatron), the clip factor, and whether the step is finite
            let zero = || Tensor::zeros(&t, [], DType::F32);
            let (mut split, mut whole) = (zero()?, zero()?);
            for (g, pl) in gs.iter().zip(&placements) {
                let sq = g.cast(DType::F32)?.square()?.sum_all()?;
                if matches!(pl.get(MeshAxis::Mp), Placement::Shard(_)) {
                    split = split.add(&sq)?;
                } else {
                    whole = whole.add(&sq)?;
                }
            }
            if mesh.mp > 1 && placements.iter().any(|pl| matches!(pl.get(MeshAxis::Mp), Placement::Shard(_))) {
                let r = comm.all_reduce(MeshAxis::Mp, split.storage(), ReduceKind::Sum, 4)?;
                split = Tensor::from_storage(&t, r, Shape::new([]), DType::F32);
            }
            let norm = split.add(&whole)?.sqrt()?;
            let finite = norm.sub(&norm)?.compare_scalar(0.0, redco_core::backend::CmpOp::Eq)?;
            let factor = clip.div(&norm)?.minimum(&Tensor::ones(&t, [], DType::F32)?)?;
            // [loss, norm, finite]: one read at the end of the step
            let one = |x: &Tensor<Tracer>| x.cast(DType::F32)?.reshape([1]);
            outs.push(Tensor::cat(&[&one(&mean_loss)?, &one(&norm)?, &one(&finite)?], 0)?);
            for i in 0..p {
                let x = local(&xs[i].detach());
                let g = gs[i].mul(&factor.cast(x.dtype())?)?;
                let m = ms[i].scale(cfg.beta1)?.add(&g.scale(1.0 - cfg.beta1)?)?;
                let v = vs[i].scale(cfg.beta2)?.add(&g.square()?.scale(1.0 - cfg.beta2)?)?;
                let denom = v.mul(ib2)?.sqrt()?.add_scalar(cfg.eps)?;
                let upd = m.mul(ib1)?.div(&denom)?;
                let new_x = x.mul(decay)?.sub(&upd.mul(lr)?)?;
                // a step whose gradients are not finite changes nothing
                nx.push(finite.where_cond(&new_x, &x)?);
                nm.push(finite.where_cond(&m, &ms[i])?);
                nv.push(finite.where_cond(&v, &vs[i])?);
            }
            Ok(())
        })?;
        drop(_installed);
        outs.extend(nx);
        outs.extend(nm);
        outs.extend(nv);
        let vals: Vec<TVal> = outs.iter().map(|o| o.storage().clone()).collect();
        let refs: Vec<&TVal> = vals.iter().collect();
        // parameters and moments (inputs 0..3p) give their buffers to outputs 1..=3p
        let donated: Vec<(usize, usize)> = (0..3 * p).map(|i| (i, i + HEAD)).collect();
        let (text, inputs) = t.finish(&refs, &donated);
        let checks = t.arg_checks();
        let options = if mesh.size() == 1 {
            CompileOptions::portable()
        } else {
            CompileOptions::replicated(
                &devices.iter().map(|d| d.client().devices()[d.device].id as i64).collect::<Vec<_>>(),
            )
        };
        let exe = b.program_with(&text, "train step", &options)?;
        // each device: its shard of the parameters, zero moments, the trace's uploads
        let host_params: Vec<HostData> = named.iter().map(|(_, x)| x.to_host()).collect::<Result<_>>()?;
        let replicas = devices
            .into_iter()
            .enumerate()
            .map(|(r, d)| {
                let bindings = inputs
                    .iter()
                    .map(|inp| match inp {
                        Input::Arg(i) => Ok(Binding::Arg(*i)),
                        Input::Storage(s) => Ok(Binding::Fixed(d.store(s.buf.download()?)?)),
                        Input::Host(h) => Ok(Binding::Fixed(d.store((**h).clone())?)),
                        Input::Scalar(x, et) => Ok(Binding::Fixed(d.store(crate::eager::scalar(*x, *et))?)),
                    })
                    .collect::<Result<Vec<_>>>()?;
                let params = (0..p)
                    .map(|i| d.store(shard_of(&host_params[i], &shapes[i], placements[i], mesh, r)?))
                    .collect::<Result<Vec<_>>>()?;
                let zeros = |i: usize| d.full_storage(locals[i].elem_count(), dtypes[i]);
                let m = (0..p).map(zeros).collect::<Result<Vec<_>>>()?;
                let v = (0..p).map(zeros).collect::<Result<Vec<_>>>()?;
                Ok(Replica { b: d, bindings, params, m, v })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(CompiledTrainStep {
            exe,
            replicas,
            mesh,
            text,
            names,
            shapes,
            placements,
            locals,
            dtypes,
            checks,
            stats: comm.stats(),
            batch: batch_meta,
            cfg,
            step: 0,
        })
    }

    /// Writes the current parameters into `model` (the one the step was made from), the
    /// shards of a split parameter put back together.
    pub fn load_into<M: Module<Pjrt>>(&self, model: &mut M) -> Result<()> {
        let whole = (0..self.names.len()).map(|i| self.parameter(i)).collect::<Result<Vec<_>>>()?;
        let b = &self.replicas[0].b;
        let mut idx = 0;
        let mut err = None;
        model.visit_mut("", &mut |_, x| {
            if let Some(h) = whole.get(idx) {
                match Tensor::from_host(b, h, self.shapes[idx].clone()) {
                    Ok(t) => *x = t.into_var(),
                    Err(e) => err = err.take().or(Some(e)),
                }
            }
            idx += 1;
        });
        err.map_or(Ok(()), Err)
    }

    /// The whole value of parameter `i` on the host: replica 0's, or the concatenation of
    /// the shards held along the `mp` axis.
    fn parameter(&self, i: usize) -> Result<HostData> {
        let Placement::Shard(d) = self.placements[i].get(MeshAxis::Mp) else {
            return self.replicas[0].params[i].buf.download();
        };
        let cpu = Cpu::new(1);
        let local = local_shape(&self.shapes[i], self.placements[i], [self.mesh.dp, self.mesh.mp])?;
        let parts = (0..self.mesh.mp)
            .map(|m| {
                let h = self.replicas[self.mesh.rank_of(0, m)].params[i].buf.download()?;
                Tensor::from_host(&cpu, &h, local.clone())
            })
            .collect::<Result<Vec<_>>>()?;
        Tensor::cat(&parts.iter().collect::<Vec<_>>(), d as isize)?.to_host()
    }

    /// Each batch tensor's slice on one replica (its first dimension split over dp), in
    /// the compiled order.
    pub fn local_batch(&self) -> Vec<(Shape, DType)> {
        self.batch
            .iter()
            .map(|(s, d)| {
                let mut dims = s.dims().to_vec();
                if let Some(n) = dims.first_mut() {
                    *n /= self.mesh.dp;
                }
                (Shape::new(dims), *d)
            })
            .collect()
    }

    /// The mesh the step runs on.
    pub fn mesh(&self) -> Mesh {
        self.mesh
    }

    /// The collectives the trace called, by kind and mesh axis (each one is an op of the
    /// program: see [`CompiledTrainStep::ops`]).
    pub fn comm_stats(&self) -> &CommStats {
        &self.stats
    }

    /// The number of `stablehlo.<name>` ops in the step's program (`all_reduce`,
    /// `all_gather`, `reduce_scatter`, ...).
    pub fn ops(&self, name: &str) -> usize {
        self.text.matches(&format!("\"stablehlo.{name}\"")).count()
    }

    /// The parameter names, in the order of the program's arguments.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The number of `stablehlo.all_reduce` ops in the step's program.
    pub fn all_reduces(&self) -> usize {
        self.ops("all_reduce")
    }

    /// The StableHLO text of the step.
    pub fn program(&self) -> &str {
        &self.text
    }
}

/// Rank `r`'s shard of a parameter of global `shape` (whole values `h`) laid out as `p`
/// on `mesh`.
fn shard_of(h: &HostData, shape: &Shape, p: Placements, mesh: Mesh, r: usize) -> Result<HostData> {
    match p.get(MeshAxis::Mp) {
        Placement::Shard(d) => {
            let cpu = Cpu::new(1);
            let len = shape.dims()[d] / mesh.mp;
            let whole = Tensor::from_host(&cpu, h, shape.clone())?;
            whole.narrow(d as isize, mesh.index_along(r, MeshAxis::Mp) * len, len)?.to_host()
        }
        _ => Ok(h.clone()),
    }
}

impl Pjrt {
    /// `n` zeros of `dtype` as device storage.
    pub(crate) fn full_storage(&self, n: usize, dtype: DType) -> Result<PjrtStorage> {
        redco_core::Backend::full(self, n, 0.0, dtype)
    }
}
