//! Compiled training steps: forward, loss, backward and the AdamW update of a whole model
//! traced once into one StableHLO program, compiled once and replayed, with the parameters
//! and optimizer moments kept on the device (their buffers donated to the updated ones).
//!
//! The step reads nothing from the host in the middle: the loss comes back as a device
//! value with the new state. The learning rate, the bias corrections of the step count and
//! the decay factor are runtime inputs (0-d tensors), so one program serves every step;
//! data the trace uploaded (rotary tables, masks: they depend only on the shapes) is
//! uploaded once and bound at every replay.
//!
//! Over `dp` devices of one client the step is one replicated program: each device takes
//! its slice of the batch, and the gradients and the loss are averaged by the program's
//! own `stablehlo.all_reduce` (one per parameter, which XLA may combine and overlap), so
//! the host neither moves nor sums anything between the devices.

use crate::api::pjrt_error;
use crate::eager::Pjrt;
use crate::executable::Executable;
use crate::hlo::Et;
use crate::proto::CompileOptions;
use crate::storage::PjrtStorage;
use crate::trace::{Input, TVal, Tracer};
use redco_core::nn::{Module, ModuleExt};
use redco_core::optim::AdamWConfig;
use redco_core::{DType, HostData, Result, Shape, Tensor};
use std::sync::Arc;

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

/// A training step of one model compiled into one PJRT program, on one device or
/// replicated over `dp` devices (data parallelism).
pub struct CompiledTrainStep {
    exe: Arc<Executable>,
    replicas: Vec<Replica>,
    text: String,
    names: Vec<String>,
    shapes: Vec<Shape>,
    batch: Vec<(Shape, DType)>,
    cfg: AdamWConfig,
    step: u64,
}

/// The number of runtime scalars: learning rate, 1 / bias1, 1 / bias2, 1 - lr * wd.
const SCALARS: usize = 4;

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
        let dp = dp.max(1);
        if let Some(x) = batch.iter().find(|x| x.rank() == 0 || x.dims()[0] % dp != 0) {
            return Err(pjrt_error(
                "compiled step",
                format!(
                    "a batch tensor of shape {} does not split over dp = {dp} along its first dimension",
                    x.shape()
                ),
            ));
        }
        let devices: Vec<Pjrt> = (0..dp).map(|r| b.on_device(r)).collect::<Result<_>>()?;
        let named = model.named_parameters();
        let names: Vec<String> = named.iter().map(|(n, _)| n.clone()).collect();
        let shapes: Vec<Shape> = named.iter().map(|(_, p)| p.shape().clone()).collect();
        let dtypes: Vec<DType> = named.iter().map(|(_, p)| p.dtype()).collect();
        if let Some((n, _)) = named.iter().find(|(_, p)| p.is_sharded()) {
            return Err(pjrt_error("compiled step", format!("`{n}` is sharded: compiled steps run at mesh 1x1")));
        }
        let p = named.len();
        let t = Tracer::new();
        let arg = |i: usize, n: usize, d: DType| t.input(Input::Arg(i), n, Et::of(d));
        let tv = |val: TVal, s: &Shape, d: DType| Tensor::from_storage(&t, val, s.clone(), d);
        let xs: Vec<Tensor<Tracer>> =
            (0..p).map(|i| tv(arg(i, shapes[i].elem_count(), dtypes[i]), &shapes[i], dtypes[i]).into_var()).collect();
        let ms: Vec<Tensor<Tracer>> =
            (0..p).map(|i| tv(arg(p + i, shapes[i].elem_count(), dtypes[i]), &shapes[i], dtypes[i])).collect();
        let vs: Vec<Tensor<Tracer>> =
            (0..p).map(|i| tv(arg(2 * p + i, shapes[i].elem_count(), dtypes[i]), &shapes[i], dtypes[i])).collect();
        let batch_meta: Vec<(Shape, DType)> = batch.iter().map(|x| (x.shape().clone(), x.dtype())).collect();
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
        let grads = l.backward()?;
        let (lr, ib1, ib2, decay) = (&sc[0], &sc[1], &sc[2], &sc[3]);
        let group = vec![(0..dp).collect::<Vec<usize>>()];
        // the mean over the replicas, by the program's own all-reduce
        let mean = |x: &Tensor<Tracer>| -> Result<Tensor<Tracer>> {
            if dp == 1 {
                return Ok(x.clone());
            }
            let s = t.all_reduce_sum(x.storage(), &group);
            Tensor::from_storage(&t, s, x.shape().clone(), x.dtype()).scale(1.0 / dp as f64)
        };
        let mut outs = vec![redco_core::no_grad(|| mean(&l.detach()))?];
        let (mut nx, mut nm, mut nv) = (Vec::new(), Vec::new(), Vec::new());
        redco_core::no_grad(|| -> Result<()> {
            for i in 0..p {
                let x = xs[i].detach();
                let g = match grads.get(&xs[i]) {
                    Some(g) => mean(&g.cast(x.dtype())?)?,
                    None => x.zeros_like()?,
                };
                let m = ms[i].scale(cfg.beta1)?.add(&g.scale(1.0 - cfg.beta1)?)?;
                let v = vs[i].scale(cfg.beta2)?.add(&g.square()?.scale(1.0 - cfg.beta2)?)?;
                let denom = v.mul(ib2)?.sqrt()?.add_scalar(cfg.eps)?;
                let upd = m.mul(ib1)?.div(&denom)?;
                nx.push(x.mul(decay)?.sub(&upd.mul(lr)?)?);
                nm.push(m);
                nv.push(v);
            }
            Ok(())
        })?;
        outs.extend(nx);
        outs.extend(nm);
        outs.extend(nv);
        let vals: Vec<TVal> = outs.iter().map(|o| o.storage().clone()).collect();
        let refs: Vec<&TVal> = vals.iter().collect();
        // parameters and moments (inputs 0..3p) give their buffers to outputs 1..=3p
        let donated: Vec<(usize, usize)> = (0..3 * p).map(|i| (i, i + 1)).collect();
        let (text, inputs) = t.finish(&refs, &donated);
        let options = if dp == 1 {
            CompileOptions::portable()
        } else {
            CompileOptions::replicated(
                &devices.iter().map(|d| d.client().devices()[d.device].id as i64).collect::<Vec<_>>(),
            )
        };
        let exe = b.program_with(&text, "train step", &options)?;
        // each device: its copy of the parameters, zero moments, the trace's uploads
        let host_params: Vec<HostData> = named.iter().map(|(_, x)| x.to_host()).collect::<Result<_>>()?;
        let replicas = devices
            .into_iter()
            .map(|d| {
                let bindings = inputs
                    .iter()
                    .map(|inp| match inp {
                        Input::Arg(i) => Ok(Binding::Arg(*i)),
                        Input::Storage(s) => Ok(Binding::Fixed(d.store(s.buf.download()?)?)),
                        Input::Host(h) => Ok(Binding::Fixed(d.store((**h).clone())?)),
                        Input::Scalar(x, et) => Ok(Binding::Fixed(d.store(crate::eager::scalar(*x, *et))?)),
                    })
                    .collect::<Result<Vec<_>>>()?;
                let params = host_params.iter().map(|h| d.store(h.clone())).collect::<Result<Vec<_>>>()?;
                let zeros = |i: usize| d.full_storage(shapes[i].elem_count(), dtypes[i]);
                let m = (0..p).map(zeros).collect::<Result<Vec<_>>>()?;
                let v = (0..p).map(zeros).collect::<Result<Vec<_>>>()?;
                Ok(Replica { b: d, bindings, params, m, v })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(CompiledTrainStep { exe, replicas, text, names, shapes, batch: batch_meta, cfg, step: 0 })
    }

    /// Runs one step on `batch` and returns the loss (still on the device).
    pub fn step(&mut self, batch: &[&Tensor<Pjrt>]) -> Result<Tensor<Pjrt>> {
        let got: Vec<(Shape, DType)> = batch.iter().map(|x| (x.shape().clone(), x.dtype())).collect();
        if got != self.batch {
            return Err(pjrt_error(
                "compiled step",
                format!("the batch {got:?} differs from the one the step was compiled for {:?}", self.batch),
            ));
        }
        self.step += 1;
        let c = self.cfg;
        let t = self.step as i32;
        let (bc1, bc2) = (1.0 - c.beta1.powi(t), 1.0 - c.beta2.powi(t));
        let scalars = [c.lr, 1.0 / bc1, 1.0 / bc2, 1.0 - c.lr * c.weight_decay];
        let dp = self.replicas.len();
        // each replica's slice of the batch and the runtime scalars, on its device
        let host: Vec<HostData> = batch.iter().map(|x| x.to_host()).collect::<Result<_>>()?;
        let mut extra: Vec<Vec<PjrtStorage>> = Vec::with_capacity(dp);
        for (r, rep) in self.replicas.iter().enumerate() {
            let mut v = Vec::new();
            for (h, (s, _)) in host.iter().zip(&self.batch) {
                let per = s.elem_count() / dp;
                v.push(rep.b.store(slice(h, r * per, per))?);
            }
            for &x in &scalars {
                v.push(rep.b.store(HostData::F32(vec![x as f32]))?);
            }
            extra.push(v);
        }
        let p = self.names.len();
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
        let outs = if dp == 1 {
            vec![self.exe.execute(self.replicas[0].b.device, &lists[0])?]
        } else {
            self.exe.execute_replicated(&lists)?
        };
        drop(lists);
        let b0 = self.replicas[0].b.clone();
        b0.ctx.executed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut loss = None;
        for (rep, out) in self.replicas.iter_mut().zip(outs) {
            if out.len() != 1 + 3 * p {
                return Err(pjrt_error(
                    "compiled step",
                    format!("the program returned {} outputs, not {}", out.len(), 1 + 3 * p),
                ));
            }
            let mut it = out.into_iter().map(|buf| PjrtStorage { buf: Arc::new(buf), host: None });
            let Some(l) = it.next() else { return Err(pjrt_error("compiled step", "the program returned no loss")) };
            loss.get_or_insert(l);
            rep.params = it.by_ref().take(p).collect();
            rep.m = it.by_ref().take(p).collect();
            rep.v = it.collect();
        }
        let loss = loss.ok_or_else(|| pjrt_error("compiled step", "no replica"))?;
        Ok(Tensor::from_storage(&b0, loss, Shape::new([]), DType::F32))
    }

    /// Writes the current parameters into `model` (the one the step was made from).
    pub fn load_into<M: Module<Pjrt>>(&self, model: &mut M) -> Result<()> {
        let mut idx = 0;
        let rep = &self.replicas[0];
        let (b, params, shapes) = (&rep.b, &rep.params, &self.shapes);
        model.visit_mut("", &mut |_, x| {
            if let Some(s) = params.get(idx) {
                *x = Tensor::from_storage(b, s.clone(), shapes[idx].clone(), x.dtype()).into_var();
            }
            idx += 1;
        });
        Ok(())
    }

    /// The parameter names, in the order of the program's arguments.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// The number of `stablehlo.all_reduce` ops in the step's program.
    pub fn all_reduces(&self) -> usize {
        self.text.matches("\"stablehlo.all_reduce\"").count()
    }

    /// The StableHLO text of the step.
    pub fn program(&self) -> &str {
        &self.text
    }
}

/// Elements `start..start + len` of `h`.
fn slice(h: &HostData, start: usize, len: usize) -> HostData {
    let r = start..start + len;
    match h {
        HostData::F32(v) => HostData::F32(v[r].to_vec()),
        HostData::F64(v) => HostData::F64(v[r].to_vec()),
        HostData::F16(v) => HostData::F16(v[r].to_vec()),
        HostData::BF16(v) => HostData::BF16(v[r].to_vec()),
        HostData::I64(v) => HostData::I64(v[r].to_vec()),
        HostData::I32(v) => HostData::I32(v[r].to_vec()),
        HostData::U8(v) => HostData::U8(v[r].to_vec()),
    }
}

impl Pjrt {
    /// `n` zeros of `dtype` as device storage.
    pub(crate) fn full_storage(&self, n: usize, dtype: DType) -> Result<PjrtStorage> {
        redco_core::Backend::full(self, n, 0.0, dtype)
    }
}
