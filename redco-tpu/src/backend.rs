//! [`Backend`] for [`Pjrt`]: every primitive is the [`Tracer`]'s program for it, and every
//! fused op is its composite default traced into one program (so XLA fuses it), run op by
//! op only when the composite reads the host.

use crate::eager::Pjrt;
use crate::storage::PjrtStorage;
use crate::trace::{TVal, Tracer};
use redco_core::backend::{BinaryOp, CmpOp, MatmulSpec, ReduceOp, RotaryMode, UnaryOp};
use redco_core::ops::{self, adamw::AdamStep, attention::AttentionSpec};
use redco_core::{Backend, DType, HostData, Result, Shape};
use std::sync::Arc;

type S = PjrtStorage;

impl Pjrt {
    /// The single output of a traced op.
    fn one(&self, what: &'static str, ins: &[&S], f: impl FnOnce(&Tracer, &[TVal]) -> Result<TVal>) -> Result<S> {
        let mut out = self.run(what, ins, |t, v| Ok(vec![f(t, v)?]))?;
        Ok(out.remove(0))
    }

    /// A fused op with one output: its composite traced, or run eagerly on a host read.
    fn fused1(
        &self,
        what: &'static str,
        ins: &[&S],
        traced: impl FnOnce(&Tracer, &[TVal]) -> Result<TVal>,
        eager: impl FnOnce() -> Result<S>,
    ) -> Result<S> {
        let mut out = self.run_or(what, ins, |t, v| Ok(vec![traced(t, v)?]), || Ok(vec![eager()?]))?;
        Ok(out.remove(0))
    }

    /// A fused op with three outputs.
    fn fused3(
        &self,
        what: &'static str,
        ins: &[&S],
        traced: impl FnOnce(&Tracer, &[TVal]) -> Result<(TVal, TVal, TVal)>,
        eager: impl FnOnce() -> Result<(S, S, S)>,
    ) -> Result<(S, S, S)> {
        let out = self.run_or(
            what,
            ins,
            |t, v| {
                let (a, b, c) = traced(t, v)?;
                Ok(vec![a, b, c])
            },
            || {
                let (a, b, c) = eager()?;
                Ok(vec![a, b, c])
            },
        )?;
        let mut it = out.into_iter();
        match (it.next(), it.next(), it.next()) {
            (Some(a), Some(b), Some(c)) => Ok((a, b, c)),
            _ => Err(crate::api::pjrt_error(what, "the program returned fewer than three outputs")),
        }
    }
}

impl Backend for Pjrt {
    type Storage = PjrtStorage;
    redco_core::comm_slot!(Pjrt);

    fn name(&self) -> String {
        "pjrt".into()
    }
    fn supports(&self, _dtype: DType) -> bool {
        true
    }
    fn upload(&self, data: &HostData) -> Result<S> {
        self.store(data.clone())
    }
    fn upload_owned(&self, data: HostData) -> Result<S> {
        self.store(data)
    }
    fn download(&self, s: &S) -> Result<HostData> {
        match &s.host {
            Some(h) => Ok((**h).clone()),
            None => s.buf.download(),
        }
    }
    fn download_shared(&self, s: &S) -> Result<Arc<HostData>> {
        match &s.host {
            Some(h) => Ok(h.clone()),
            None => Ok(Arc::new(s.buf.download()?)),
        }
    }
    fn storage_dtype(&self, s: &S) -> DType {
        s.dtype()
    }

    fn full(&self, n: usize, value: f64, dtype: DType) -> Result<S> {
        self.one("full", &[], |t, _| t.full(n, value, dtype))
    }
    fn unary(&self, op: UnaryOp, x: &S, n: usize) -> Result<S> {
        self.one("unary", &[x], |t, v| t.unary(op, &v[0], n))
    }
    fn binary(&self, op: BinaryOp, a: (&S, &Shape), b: (&S, &Shape), out: &Shape) -> Result<S> {
        self.one("binary", &[a.0, b.0], |t, v| t.binary(op, (&v[0], a.1), (&v[1], b.1), out))
    }
    fn compare(&self, op: CmpOp, a: (&S, &Shape), b: (&S, &Shape), out: &Shape) -> Result<S> {
        self.one("compare", &[a.0, b.0], |t, v| t.compare(op, (&v[0], a.1), (&v[1], b.1), out))
    }
    fn where_cond(&self, c: (&S, &Shape), a: (&S, &Shape), b: (&S, &Shape), out: &Shape) -> Result<S> {
        self.one("where", &[c.0, a.0, b.0], |t, v| t.where_cond((&v[0], c.1), (&v[1], a.1), (&v[2], b.1), out))
    }
    fn matmul(&self, a: &S, b: &S, spec: &MatmulSpec) -> Result<S> {
        self.one("matmul", &[a, b], |t, v| t.matmul(&v[0], &v[1], spec))
    }
    fn reduce(&self, op: ReduceOp, x: &S, shape: &Shape, dim: usize) -> Result<S> {
        self.one("reduce", &[x], |t, v| t.reduce(op, &v[0], shape, dim))
    }
    fn cast(&self, x: &S, n: usize, dtype: DType) -> Result<S> {
        if x.dtype() == dtype {
            return Ok(x.clone());
        }
        self.one("cast", &[x], |t, v| t.cast(&v[0], n, dtype))
    }
    fn permute(&self, x: &S, shape: &Shape, perm: &[usize]) -> Result<S> {
        self.one("permute", &[x], |t, v| t.permute(&v[0], shape, perm))
    }
    fn expand(&self, x: &S, shape: &Shape, out: &Shape) -> Result<S> {
        self.one("expand", &[x], |t, v| t.expand(&v[0], shape, out))
    }
    fn narrow(&self, x: &S, shape: &Shape, dim: usize, start: usize, len: usize) -> Result<S> {
        self.one("narrow", &[x], |t, v| t.narrow(&v[0], shape, dim, start, len))
    }
    fn cat(&self, xs: &[(&S, &Shape)], dim: usize) -> Result<S> {
        let ins: Vec<&S> = xs.iter().map(|(s, _)| *s).collect();
        self.one("cat", &ins, |t, v| {
            let pairs: Vec<(&TVal, &Shape)> = v.iter().zip(xs).map(|(tv, (_, sh))| (tv, *sh)).collect();
            t.cat(&pairs, dim)
        })
    }
    fn check_ids(&self, ids: &S, size: usize, op: &'static str) -> Result<()> {
        Pjrt::check_ids(self, ids, size, None, op)
    }
    fn index_select(&self, x: &S, shape: &Shape, dim: usize, ids: &S, n_ids: usize) -> Result<S> {
        self.check_ids(ids, shape.dims()[dim], None, "index_select")?;
        self.one("index_select", &[x, ids], |t, v| t.index_select(&v[0], shape, dim, &v[1], n_ids))
    }
    fn index_add(&self, x: &S, shape: &Shape, dim: usize, ids: &S, src: &S) -> Result<S> {
        self.check_ids(ids, shape.dims()[dim], None, "index_add")?;
        self.one("index_add", &[x, ids, src], |t, v| t.index_add(&v[0], shape, dim, &v[1], &v[2]))
    }
    fn gather(&self, x: &S, shape: &Shape, dim: usize, idx: &S, idx_shape: &Shape) -> Result<S> {
        self.check_ids(idx, shape.dims()[dim], None, "gather")?;
        self.one("gather", &[x, idx], |t, v| t.gather(&v[0], shape, dim, &v[1], idx_shape))
    }
    fn scatter_add(&self, x: &S, shape: &Shape, dim: usize, idx: &S, idx_shape: &Shape, src: &S) -> Result<S> {
        self.check_ids(idx, shape.dims()[dim], None, "scatter_add")?;
        self.one("scatter_add", &[x, idx, src], |t, v| t.scatter_add(&v[0], shape, dim, &v[1], idx_shape, &v[2]))
    }

    fn softmax(&self, x: &S, shape: &Shape) -> Result<S> {
        self.fused1(
            "softmax",
            &[x],
            |t, v| ops::softmax::composite_softmax(t, &v[0], shape),
            || ops::softmax::composite_softmax(self, x, shape),
        )
    }
    fn log_softmax(&self, x: &S, shape: &Shape) -> Result<S> {
        self.fused1(
            "log_softmax",
            &[x],
            |t, v| ops::softmax::composite_log_softmax(t, &v[0], shape),
            || ops::softmax::composite_log_softmax(self, x, shape),
        )
    }
    fn layer_norm(&self, x: &S, shape: &Shape, weight: Option<&S>, bias: Option<&S>, eps: f64) -> Result<S> {
        let mut ins = vec![x];
        ins.extend(weight);
        ins.extend(bias);
        let (wi, bi) = (weight.map(|_| 1), bias.map(|_| 1 + weight.is_some() as usize));
        self.fused1(
            "layer_norm",
            &ins,
            |t, v| ops::norm::composite_layer_norm(t, &v[0], shape, wi.map(|i| &v[i]), bi.map(|i| &v[i]), eps),
            || ops::norm::composite_layer_norm(self, x, shape, weight, bias, eps),
        )
    }
    fn rms_norm(&self, x: &S, shape: &Shape, weight: Option<&S>, eps: f64) -> Result<S> {
        let mut ins = vec![x];
        ins.extend(weight);
        self.fused1(
            "rms_norm",
            &ins,
            |t, v| ops::norm::composite_rms_norm(t, &v[0], shape, v.get(1), eps),
            || ops::norm::composite_rms_norm(self, x, shape, weight, eps),
        )
    }
    fn rotary(&self, x: &S, shape: &Shape, cos: &S, sin: &S, cs_shape: &Shape, mode: RotaryMode) -> Result<S> {
        self.fused1(
            "rotary",
            &[x, cos, sin],
            |t, v| ops::rotary::composite_rotary(t, &v[0], shape, &v[1], &v[2], cs_shape, mode),
            || ops::rotary::composite_rotary(self, x, shape, cos, sin, cs_shape, mode),
        )
    }
    fn adamw(&self, x: &S, g: &S, m: &S, v: &S, n: usize, step: &AdamStep) -> Result<(S, S, S)> {
        self.fused3(
            "adamw",
            &[x, g, m, v],
            |t, a| ops::adamw::composite_adamw(t, &a[0], &a[1], &a[2], &a[3], n, step),
            || ops::adamw::composite_adamw(self, x, g, m, v, n, step),
        )
    }
    fn cross_entropy(&self, logits: &S, shape: &Shape, targets: &S, ignore_index: i64) -> Result<S> {
        self.check_ids(targets, shape.dims()[1], Some(ignore_index), "cross_entropy")?;
        self.fused1(
            "cross_entropy",
            &[logits, targets],
            |t, v| ops::cross_entropy::composite_cross_entropy(t, &v[0], shape, &v[1], ignore_index),
            || ops::cross_entropy::composite_cross_entropy(self, logits, shape, targets, ignore_index),
        )
    }
    fn cross_entropy_backward(&self, logits: &S, shape: &Shape, targets: &S, ignore_index: i64, grad: &S) -> Result<S> {
        self.check_ids(targets, shape.dims()[1], Some(ignore_index), "cross_entropy_backward")?;
        self.fused1(
            "cross_entropy_backward",
            &[logits, targets, grad],
            |t, v| ops::cross_entropy::composite_cross_entropy_backward(t, &v[0], shape, &v[1], ignore_index, &v[2]),
            || ops::cross_entropy::composite_cross_entropy_backward(self, logits, shape, targets, ignore_index, grad),
        )
    }
    fn attention(&self, q: &S, k: &S, v: &S, mask: Option<&S>, spec: &AttentionSpec) -> Result<S> {
        let mut ins = vec![q, k, v];
        ins.extend(mask);
        self.fused1(
            "attention",
            &ins,
            |t, a| ops::attention::composite_attention(t, &a[0], &a[1], &a[2], a.get(3), spec),
            || ops::attention::composite_attention(self, q, k, v, mask, spec),
        )
    }
    fn attention_backward(
        &self,
        q: &S,
        k: &S,
        v: &S,
        mask: Option<&S>,
        dout: &S,
        spec: &AttentionSpec,
    ) -> Result<(S, S, S)> {
        let mut ins = vec![q, k, v, dout];
        ins.extend(mask);
        self.fused3(
            "attention_backward",
            &ins,
            |t, a| ops::attention_grad::composite_attention_backward(t, &a[0], &a[1], &a[2], a.get(4), &a[3], spec),
            || ops::attention_grad::composite_attention_backward(self, q, k, v, mask, dout, spec),
        )
    }
}
