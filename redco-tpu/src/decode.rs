//! Compiled greedy decoding: the prompt step and the one-token step of a decoder, each
//! traced once into one StableHLO program over a fixed-capacity KV cache (keys and values
//! `[batch, kv_heads, capacity, head_dim]` per layer and the written length, as
//! `redco_models::generate::FixedKvCache` holds them), compiled once and replayed for every
//! token. The cache and its length stay on the device (donated from step to step), the
//! next token is chosen on the device, and the tokens are read once, at the end.

use crate::api::pjrt_error;
use crate::eager::Pjrt;
use crate::executable::Executable;
use crate::hlo::Et;
use crate::storage::PjrtStorage;
use crate::trace::{Input, TVal, Tracer};
use redco_core::nn::{Module, ModuleExt};
use redco_core::{DType, HostData, Result, Shape, Tensor};
use std::sync::Arc;

/// Keys and values of one layer, on the tracer.
pub type KvPair = (Tensor<Tracer>, Tensor<Tracer>);

/// One traced program of the decoder and what its parameters are bound to.
struct Program {
    exe: Arc<Executable>,
    /// `Ok(i)`: argument `i` (parameters, keys and values per layer, the length, the ids);
    /// `Err(s)`: device data made when it was compiled.
    bindings: Vec<std::result::Result<usize, PjrtStorage>>,
}

/// The shape of the decoder's cache: layers and `[batch, kv_heads, capacity, head_dim]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheShape {
    /// Decoder layers.
    pub layers: usize,
    /// Rows of the batch.
    pub batch: usize,
    /// Key/value heads.
    pub kv_heads: usize,
    /// Positions the cache holds (prompt + new tokens at most).
    pub capacity: usize,
    /// Features per head.
    pub head_dim: usize,
}

/// Greedy decoding of one model with a compiled prompt step and a compiled token step.
pub struct CompiledDecode {
    b: Pjrt,
    params: Vec<PjrtStorage>,
    cache: CacheShape,
    dtype: DType,
    prompt_len: usize,
    prefill: Program,
    step: Program,
}

impl CompiledDecode {
    /// Traces the prompt step (ids `[batch, prompt_len]`) and the token step (`[batch, 1]`)
    /// of `model`: `build` makes the architecture on the tracer (its values are replaced by
    /// the model's); `logits(model, ids, kv, len)` runs it over the cache's keys and values
    /// per layer and written length (`I64`, `[1]`) and returns the logits `[batch, t,
    /// vocab]` with the updated cache and length.
    pub fn new<M, MT>(
        b: &Pjrt,
        model: &M,
        cache: CacheShape,
        prompt_len: usize,
        build: impl Fn(&Tracer) -> Result<MT>,
        logits: impl Fn(
            &MT,
            &Tensor<Tracer>,
            Vec<KvPair>,
            Tensor<Tracer>,
        ) -> Result<(Tensor<Tracer>, Vec<KvPair>, Tensor<Tracer>)>,
    ) -> Result<CompiledDecode>
    where
        M: Module<Pjrt>,
        MT: Module<Tracer>,
    {
        if prompt_len == 0 || prompt_len >= cache.capacity {
            return Err(pjrt_error(
                "compiled decode",
                format!("a prompt of {prompt_len} tokens needs 1 ..< capacity ({})", cache.capacity),
            ));
        }
        let named = model.named_parameters();
        let dtype = named.first().map_or(DType::F32, |(_, p)| p.dtype());
        if let Some((n, _)) = named.iter().find(|(_, p)| p.is_sharded()) {
            return Err(pjrt_error("compiled decode", format!("`{n}` is sharded: compiled decoding runs at mesh 1x1")));
        }
        let params: Vec<PjrtStorage> = named.iter().map(|(_, p)| p.storage().clone()).collect();
        let meta: Vec<(Shape, DType)> = named.iter().map(|(_, p)| (p.shape().clone(), p.dtype())).collect();
        let trace = |t: usize| -> Result<Program> {
            let tr = Tracer::new();
            let arg = |i: usize, s: &Shape, d: DType| {
                let v: TVal = tr.input(Input::Arg(i), s.elem_count(), Et::of(d));
                Tensor::from_storage(&tr, v, s.clone(), d)
            };
            let p = meta.len();
            let xs: Vec<Tensor<Tracer>> = meta.iter().enumerate().map(|(i, (s, d))| arg(i, s, *d)).collect();
            let kv_shape = Shape::new([cache.batch, cache.kv_heads, cache.capacity, cache.head_dim]);
            let kv: Vec<(Tensor<Tracer>, Tensor<Tracer>)> = (0..cache.layers)
                .map(|l| (arg(p + 2 * l, &kv_shape, dtype), arg(p + 2 * l + 1, &kv_shape, dtype)))
                .collect();
            let n = p + 2 * cache.layers;
            let len = arg(n, &Shape::new([1]), DType::I64);
            let ids = arg(n + 1, &Shape::new([cache.batch, t]), DType::I64);
            let mut m = build(&tr)?;
            let mut idx = 0;
            m.visit_mut("", &mut |_, x| {
                if let Some(new) = xs.get(idx) {
                    *x = new.clone();
                }
                idx += 1;
            });
            let (next, kv, len) = redco_core::no_grad(|| -> Result<_> {
                let (lg, kv, len) = logits(&m, &ids, kv, len)?;
                Ok((lg.narrow(1, t - 1, 1)?.argmax(-1, false)?, kv, len))
            })?;
            if kv.len() != cache.layers {
                return Err(pjrt_error(
                    "compiled decode",
                    format!("{} layers of cache came back, not {}", kv.len(), cache.layers),
                ));
            }
            let mut outs = vec![next.storage().clone()];
            for (k, v) in &kv {
                outs.push(k.storage().clone());
                outs.push(v.storage().clone());
            }
            outs.push(len.storage().clone());
            let refs: Vec<&TVal> = outs.iter().collect();
            // the cache and its length give their buffers to the new ones
            let donated: Vec<(usize, usize)> = (0..=2 * cache.layers).map(|j| (p + j, 1 + j)).collect();
            let (text, inputs) = tr.finish(&refs, &donated);
            let exe = b.program(&text, "decode step")?;
            let bindings = inputs
                .into_iter()
                .map(|inp| match inp {
                    Input::Arg(i) => Ok(Ok(i)),
                    Input::Storage(s) => Ok(Err(s)),
                    Input::Host(h) => Ok(Err(b.store((*h).clone())?)),
                    Input::Scalar(x, et) => Ok(Err(b.store(crate::eager::scalar(x, et))?)),
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(Program { exe, bindings })
        };
        let prefill = trace(prompt_len)?;
        let step = trace(1)?;
        Ok(CompiledDecode { b: b.clone(), params, cache, dtype, prompt_len, prefill, step })
    }

    fn run(&self, prog: &Program, kv: &[PjrtStorage], ids: &PjrtStorage) -> Result<Vec<PjrtStorage>> {
        let args: Vec<&PjrtStorage> = self.params.iter().chain(kv).chain(std::iter::once(ids)).collect();
        let bound: Vec<&crate::Buffer> = prog
            .bindings
            .iter()
            .map(|bd| match bd {
                Ok(i) => &*args[*i].buf,
                Err(s) => &*s.buf,
            })
            .collect();
        let outs = prog.exe.execute(self.b.device, &bound)?;
        self.b.ctx.executed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(outs.into_iter().map(|buf| PjrtStorage { buf: Arc::new(buf), host: None }).collect())
    }

    /// `new` greedy tokens after `prompt` (`[batch, prompt_len]`, `I64`), as one row per
    /// batch entry; two program executions for the first token, one for each other, and one
    /// read of the tokens at the end.
    pub fn generate(&self, prompt: &Tensor<Pjrt>, new: usize) -> Result<Vec<Vec<i64>>> {
        let c = self.cache;
        if prompt.dims() != [c.batch, self.prompt_len] || prompt.dtype() != DType::I64 {
            return Err(pjrt_error(
                "compiled decode",
                format!(
                    "the prompt {:?} {} is not the I64 [{}, {}] the decoder was compiled for",
                    prompt.dtype(),
                    prompt.shape(),
                    c.batch,
                    self.prompt_len
                ),
            ));
        }
        if self.prompt_len + new > c.capacity {
            return Err(pjrt_error(
                "compiled decode",
                format!("{} prompt + {new} new tokens exceed the cache's {} positions", self.prompt_len, c.capacity),
            ));
        }
        let n = c.batch * c.kv_heads * c.capacity * c.head_dim;
        let mut kv: Vec<PjrtStorage> =
            (0..2 * c.layers).map(|_| self.b.full_storage(n, self.dtype)).collect::<Result<_>>()?;
        kv.push(self.b.store(HostData::I64(vec![0]))?);
        let mut ids = prompt.storage().clone();
        let mut tokens = Vec::with_capacity(new);
        for i in 0..new {
            let prog = if i == 0 { &self.prefill } else { &self.step };
            let mut outs = self.run(prog, &kv, &ids)?.into_iter();
            ids = outs.next().ok_or_else(|| pjrt_error("compiled decode", "the program returned nothing"))?;
            tokens.push(ids.clone());
            kv = outs.collect();
        }
        let mut rows = vec![Vec::with_capacity(new); c.batch];
        for t in tokens {
            match t.buf.download()? {
                HostData::I64(v) => v.into_iter().enumerate().for_each(|(r, x)| rows[r].push(x)),
                other => return Err(pjrt_error("compiled decode", format!("tokens of dtype {:?}", other.dtype()))),
            }
        }
        Ok(rows)
    }
}
