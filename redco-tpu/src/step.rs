//! Compiled training steps: forward, loss, backward and the AdamW update of a whole model
//! traced once into one StableHLO program, compiled once and replayed, with the parameters
//! and optimizer moments kept on the device (their buffers donated to the updated ones).
//!
//! The step reads nothing from the host in the middle: the loss comes back as a device
//! value with the new state. The learning rate, the bias corrections of the step count and
//! the decay factor are runtime inputs (0-d tensors), so one program serves every step;
//! data the trace uploaded (rotary tables, masks: they depend only on the shapes) is
//! uploaded once and bound at every replay.

use crate::api::pjrt_error;
use crate::eager::Pjrt;
use crate::executable::Executable;
use crate::hlo::Et;
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

/// A training step of one model compiled into one PJRT program (mesh 1x1).
pub struct CompiledTrainStep {
    b: Pjrt,
    exe: Arc<Executable>,
    bindings: Vec<Binding>,
    text: String,
    names: Vec<String>,
    shapes: Vec<Shape>,
    params: Vec<PjrtStorage>,
    m: Vec<PjrtStorage>,
    v: Vec<PjrtStorage>,
    batch: Vec<(Shape, DType)>,
    cfg: AdamWConfig,
    step: u64,
}

/// The number of runtime scalars: learning rate, 1 / bias1, 1 / bias2, 1 - lr * wd.
const SCALARS: usize = 4;

impl CompiledTrainStep {
    /// Traces one step of `model` (on `b`) with AdamW `cfg`: `build` makes the same
    /// architecture on the tracer (its initial values are discarded), `loss` computes the
    /// loss from the batch tensors (shaped like `batch`, which every step must match).
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
        let named = model.named_parameters();
        let names: Vec<String> = named.iter().map(|(n, _)| n.clone()).collect();
        let shapes: Vec<Shape> = named.iter().map(|(_, p)| p.shape().clone()).collect();
        let dtypes: Vec<DType> = named.iter().map(|(_, p)| p.dtype()).collect();
        if let Some((n, _)) = named.iter().find(|(_, p)| p.is_sharded()) {
            return Err(pjrt_error("compiled step", format!("`{n}` is sharded: compiled steps run at mesh 1x1")));
        }
        let params: Vec<PjrtStorage> = named.iter().map(|(_, p)| p.storage().clone()).collect();
        let zeros = |i: usize| b.full_storage(shapes[i].elem_count(), dtypes[i]);
        let m = (0..params.len()).map(zeros).collect::<Result<Vec<_>>>()?;
        let v = (0..params.len()).map(zeros).collect::<Result<Vec<_>>>()?;
        let p = params.len();
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
        let bt: Vec<Tensor<Tracer>> =
            batch_meta.iter().enumerate().map(|(j, (s, d))| tv(arg(3 * p + j, s.elem_count(), *d), s, *d)).collect();
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
        let mut outs = vec![l.detach()];
        let (mut nx, mut nm, mut nv) = (Vec::new(), Vec::new(), Vec::new());
        redco_core::no_grad(|| -> Result<()> {
            for i in 0..p {
                let x = xs[i].detach();
                let g = match grads.get(&xs[i]) {
                    Some(g) => g.cast(x.dtype())?,
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
        let exe = b.program(&text, "train step")?;
        let bindings = inputs
            .into_iter()
            .map(|inp| match inp {
                Input::Arg(i) => Ok(Binding::Arg(i)),
                Input::Storage(s) => Ok(Binding::Fixed(s)),
                Input::Host(h) => Ok(Binding::Fixed(b.store((*h).clone())?)),
                Input::Scalar(x, et) => Ok(Binding::Fixed(b.store(crate::eager::scalar(x, et))?)),
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(CompiledTrainStep {
            b: b.clone(),
            exe,
            bindings,
            text,
            names,
            shapes,
            params,
            m,
            v,
            batch: batch_meta,
            cfg,
            step: 0,
        })
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
        let sc: Vec<PjrtStorage> =
            scalars.iter().map(|&s| self.b.store(HostData::F32(vec![s as f32]))).collect::<Result<_>>()?;
        let p = self.params.len();
        let args: Vec<&PjrtStorage> = self
            .params
            .iter()
            .chain(&self.m)
            .chain(&self.v)
            .chain(batch.iter().map(|x| x.storage()))
            .chain(&sc)
            .collect();
        let bound: Vec<&crate::Buffer> = self
            .bindings
            .iter()
            .map(|bd| match bd {
                Binding::Arg(i) => &*args[*i].buf,
                Binding::Fixed(s) => &*s.buf,
            })
            .collect();
        let outs = self.exe.execute(self.b.device, &bound)?;
        self.b.ctx.executed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if outs.len() != 1 + 3 * p {
            return Err(pjrt_error(
                "compiled step",
                format!("the program returned {} outputs, not {}", outs.len(), 1 + 3 * p),
            ));
        }
        let mut it = outs.into_iter().map(|buf| PjrtStorage { buf: Arc::new(buf), host: None });
        let loss = it.next().expect("checked above");
        self.params = it.by_ref().take(p).collect();
        self.m = it.by_ref().take(p).collect();
        self.v = it.collect();
        Ok(Tensor::from_storage(&self.b, loss, Shape::new([]), DType::F32))
    }

    /// Writes the current parameters into `model` (the one the step was made from).
    pub fn load_into<M: Module<Pjrt>>(&self, model: &mut M) -> Result<()> {
        let mut idx = 0;
        let (b, params, shapes) = (&self.b, &self.params, &self.shapes);
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

    /// The StableHLO text of the step.
    pub fn program(&self) -> &str {
        &self.text
    }
}

impl Pjrt {
    /// `n` zeros of `dtype` as device storage.
    pub(crate) fn full_storage(&self, n: usize, dtype: DType) -> Result<PjrtStorage> {
        redco_core::Backend::full(self, n, 0.0, dtype)
    }
}
