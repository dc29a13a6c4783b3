//! The tracing backend: a [`Backend`] whose storage is a symbolic StableHLO value, so any
//! code written against the trait (a primitive op, a fused op's composite default, and in
//! time a whole step) records one program instead of computing.
//!
//! Values are flat (`[n]`, as the trait's storage is) and reshaped inside the program.
//! Runtime numbers (a fill value, an affine op's multiplier and addend, an exponent, a
//! clamp bound) become scalar program inputs, not constants, so one compiled program
//! serves every value; host data uploaded while tracing becomes an input too. A host read
//! ([`Backend::download`]) cannot happen inside a program: it is an error, which callers
//! treat as "run this op by op instead". `REDCO_TRACE_DEBUG=1` prints the backtrace of each
//! such read (to find what keeps a step from compiling).

use crate::hlo::{Et, Func, Ty, Val};
use crate::storage::PjrtStorage;
use redco_core::backend::{BinaryOp, CmpOp, MatmulSpec, ReduceOp, UnaryOp};
use redco_core::{Backend, DType, Error, HostData, Result, Shape};
use std::sync::{Arc, Mutex, MutexGuard};

/// The backend name a host read while tracing reports (see [`is_host_read`]).
const TRACE: &str = "pjrt-trace";

/// True when `e` is the error of a host read while tracing.
pub(crate) fn is_host_read(e: &Error) -> bool {
    matches!(e, Error::Backend { backend, .. } if backend == TRACE)
}

/// What a program parameter is bound to when the program runs.
#[derive(Debug, Clone)]
pub(crate) enum Input {
    /// Device storage passed in.
    Storage(PjrtStorage),
    /// Host data uploaded while tracing.
    Host(Arc<HostData>),
    /// A runtime scalar of this element type.
    Scalar(f64, Et),
    /// Argument `i` of a compiled step, bound at each replay.
    Arg(usize),
}

#[derive(Debug, Default)]
struct State {
    func: Func,
    inputs: Vec<Input>,
    /// Ids the program looks up, as (parameter, bound): checked on the host before a run.
    checks: Vec<(usize, usize)>,
}

/// A symbolic value of the program being traced (flat, `[n]`).
#[derive(Debug, Clone)]
pub struct TVal(pub(crate) Val);

/// The tracing backend; clones record into the same program.
#[derive(Debug, Clone, Default)]
pub struct Tracer {
    st: Arc<Mutex<State>>,
}

impl Tracer {
    /// A tracer with an empty program.
    pub fn new() -> Tracer {
        Tracer::default()
    }

    fn st(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds a parameter bound to `input`, typed `[n]` of `et`.
    pub(crate) fn input(&self, input: Input, n: usize, et: Et) -> TVal {
        let mut st = self.st();
        let ty = if matches!(input, Input::Scalar(..)) { Ty::scalar(et) } else { Ty::new(&[n], et) };
        st.inputs.push(input);
        TVal(st.func.param(ty))
    }

    /// The module returning `outs`, and the inputs of its (used) parameters in order;
    /// `donated` maps parameters (by input index) to the outputs reusing their buffers.
    pub(crate) fn finish(&self, outs: &[&TVal], donated: &[(usize, usize)]) -> (String, Vec<Input>) {
        let st = self.st();
        let vals: Vec<&Val> = outs.iter().map(|v| &v.0).collect();
        let (text, kept) = st.func.module(&vals, donated);
        (text, kept.into_iter().map(|i| st.inputs[i].clone()).collect())
    }

    /// The sum of `x` over the replicas of each group in `groups` (replica ids): the
    /// program's own `stablehlo.all_reduce`, for steps compiled over several devices.
    pub fn all_reduce_sum(&self, x: &TVal, groups: &[Vec<usize>]) -> TVal {
        self.emit(|f, _| f.all_reduce_sum(&x.0, groups))
    }

    /// Records that the ids in `ids` must lie in `0..size`, where they are a parameter of
    /// the program (ids computed inside it, such as a decoded token, are in range by
    /// construction; XLA would clamp them).
    fn check(&self, ids: &TVal, size: usize) {
        if let Some(k) = ids.0.name.strip_prefix("arg").and_then(|d| d.parse::<usize>().ok()) {
            let mut st = self.st();
            if !st.checks.contains(&(k, size)) {
                st.checks.push((k, size));
            }
        }
    }

    /// The id bounds on step arguments: `(argument, size)` for every lookup whose ids are
    /// argument `argument` of a compiled step ([`Input::Arg`]).
    pub(crate) fn arg_checks(&self) -> Vec<(usize, usize)> {
        let st = self.st();
        st.checks
            .iter()
            .filter_map(|&(k, size)| match st.inputs.get(k) {
                Some(Input::Arg(j)) => Some((*j, size)),
                _ => None,
            })
            .collect()
    }

    /// Runs `f` on the program (with scalar inputs available), returning a flat result.
    pub(crate) fn emit(&self, f: impl FnOnce(&mut Func, &mut dyn FnMut(&mut Func, f64, Et) -> Val) -> Val) -> TVal {
        let mut st = self.st();
        let State { func, inputs, .. } = &mut *st;
        let mut scalar = |fun: &mut Func, v: f64, et: Et| {
            inputs.push(Input::Scalar(v, et));
            fun.param(Ty::scalar(et))
        };
        let out = f(func, &mut scalar);
        let n = out.ty.len();
        TVal(func.reshape(&out, &[n]))
    }
}

/// `v` (flat) as `dims` in its compute type.
fn load(f: &mut Func, v: &TVal, dims: &[usize]) -> Val {
    let r = f.reshape(&v.0, dims);
    f.convert(&r, v.0.ty.et.compute())
}

fn float_only(op: &'static str, v: &TVal) -> Result<()> {
    if v.0.ty.et.is_float() {
        Ok(())
    } else {
        Err(Error::UnsupportedDType { op, dtype: v.0.ty.et.dtype() })
    }
}

fn int_ids(op: &'static str, v: &TVal) -> Result<()> {
    match v.0.ty.et {
        Et::I64 | Et::I32 => Ok(()),
        e => Err(Error::UnsupportedDType { op, dtype: e.dtype() }),
    }
}

/// `[outer, size, inner]` of `shape` around `dim`.
fn around(shape: &Shape, dim: usize) -> (usize, usize, usize) {
    let d = shape.dims();
    (d[..dim].iter().product(), d[dim], d[dim + 1..].iter().product())
}

impl Backend for Tracer {
    type Storage = TVal;
    redco_core::comm_slot!(Tracer);

    fn name(&self) -> String {
        "pjrt".into()
    }
    fn supports(&self, _dtype: DType) -> bool {
        true
    }
    fn upload(&self, data: &HostData) -> Result<TVal> {
        Ok(self.input(Input::Host(Arc::new(data.clone())), data.len(), Et::of(data.dtype())))
    }
    fn upload_owned(&self, data: HostData) -> Result<TVal> {
        let (n, et) = (data.len(), Et::of(data.dtype()));
        Ok(self.input(Input::Host(Arc::new(data)), n, et))
    }
    fn download(&self, _s: &TVal) -> Result<HostData> {
        if std::env::var_os("REDCO_TRACE_DEBUG").is_some() {
            eprintln!("host read while tracing:\n{}", std::backtrace::Backtrace::force_capture());
        }
        Err(Error::Backend { backend: TRACE.into(), msg: "a host read cannot happen inside a compiled program".into() })
    }
    fn storage_dtype(&self, s: &TVal) -> DType {
        s.0.ty.et.dtype()
    }

    fn full(&self, n: usize, value: f64, dtype: DType) -> Result<TVal> {
        let et = Et::of(dtype);
        Ok(self.emit(|f, scalar| {
            let s = scalar(f, value, et.compute());
            let s = f.convert(&s, et);
            f.splat(&s, &[n])
        }))
    }
    fn unary(&self, op: UnaryOp, x: &TVal, n: usize) -> Result<TVal> {
        float_only("unary", x)?;
        let et = x.0.ty.et;
        Ok(self.emit(|f, scalar| {
            let v = load(f, x, &[n]);
            let ct = v.ty.et;
            let r = f.unary(op, &v, &mut |f, s| scalar(f, s, ct));
            f.convert(&r, et)
        }))
    }
    fn binary(&self, op: BinaryOp, a: (&TVal, &Shape), b: (&TVal, &Shape), out: &Shape) -> Result<TVal> {
        let et = a.0 .0.ty.et;
        Ok(self.emit(|f, _| {
            let x = load(f, a.0, a.1.dims());
            let y = load(f, b.0, b.1.dims());
            let y = f.convert(&y, x.ty.et);
            let x = f.broadcast(&x, out.dims());
            let y = f.broadcast(&y, out.dims());
            let r = f.binary_op(op, &x, &y);
            f.convert(&r, et)
        }))
    }
    fn compare(&self, op: CmpOp, a: (&TVal, &Shape), b: (&TVal, &Shape), out: &Shape) -> Result<TVal> {
        Ok(self.emit(|f, _| {
            let x = load(f, a.0, a.1.dims());
            let y = load(f, b.0, b.1.dims());
            let y = f.convert(&y, x.ty.et);
            let x = f.broadcast(&x, out.dims());
            let y = f.broadcast(&y, out.dims());
            let p = f.compare(op, &x, &y);
            f.convert(&p, Et::U8)
        }))
    }
    fn where_cond(&self, c: (&TVal, &Shape), a: (&TVal, &Shape), b: (&TVal, &Shape), out: &Shape) -> Result<TVal> {
        let et = a.0 .0.ty.et;
        Ok(self.emit(|f, _| {
            let cv = f.reshape(&c.0 .0, c.1.dims());
            let cv = f.broadcast(&cv, out.dims());
            let zero = f.const_like(0.0, &cv);
            let p = f.compare(CmpOp::Ne, &cv, &zero);
            let x = f.reshape(&a.0 .0, a.1.dims());
            let y = f.reshape(&b.0 .0, b.1.dims());
            let y = f.convert(&y, et);
            let x = f.broadcast(&x, out.dims());
            let y = f.broadcast(&y, out.dims());
            f.select(&p, &x, &y)
        }))
    }
    fn matmul(&self, a: &TVal, b: &TVal, spec: &MatmulSpec) -> Result<TVal> {
        let et = a.0.ty.et;
        Ok(self.emit(|f, _| {
            let x = f.convert(&a.0, et.compute());
            let y = f.convert(&b.0, et.compute());
            let r = f.matmul(&x, &y, spec);
            f.convert(&r, et)
        }))
    }
    fn reduce(&self, op: ReduceOp, x: &TVal, shape: &Shape, dim: usize) -> Result<TVal> {
        let et = x.0.ty.et;
        Ok(self.emit(|f, _| {
            let v = load(f, x, shape.dims());
            let r = f.reduce(op, &v, dim);
            if op == ReduceOp::ArgMax {
                r
            } else {
                f.convert(&r, et)
            }
        }))
    }
    fn cast(&self, x: &TVal, _n: usize, dtype: DType) -> Result<TVal> {
        Ok(self.emit(|f, _| f.convert(&x.0, Et::of(dtype))))
    }
    fn permute(&self, x: &TVal, shape: &Shape, perm: &[usize]) -> Result<TVal> {
        Ok(self.emit(|f, _| {
            let v = f.reshape(&x.0, shape.dims());
            f.transpose(&v, perm)
        }))
    }
    fn expand(&self, x: &TVal, shape: &Shape, out: &Shape) -> Result<TVal> {
        Ok(self.emit(|f, _| {
            let v = f.reshape(&x.0, shape.dims());
            f.broadcast(&v, out.dims())
        }))
    }
    fn narrow(&self, x: &TVal, shape: &Shape, dim: usize, start: usize, len: usize) -> Result<TVal> {
        Ok(self.emit(|f, _| {
            let v = f.reshape(&x.0, shape.dims());
            f.slice(&v, dim, start, len)
        }))
    }
    fn cat(&self, xs: &[(&TVal, &Shape)], dim: usize) -> Result<TVal> {
        Ok(self.emit(|f, _| {
            let vs: Vec<Val> = xs.iter().map(|(x, s)| f.reshape(&x.0, s.dims())).collect();
            let refs: Vec<&Val> = vs.iter().collect();
            f.concat(&refs, dim)
        }))
    }
    fn check_ids(&self, ids: &TVal, size: usize, op: &'static str) -> Result<()> {
        int_ids(op, ids)?;
        self.check(ids, size);
        Ok(())
    }
    fn index_select(&self, x: &TVal, shape: &Shape, dim: usize, ids: &TVal, _n_ids: usize) -> Result<TVal> {
        int_ids("index_select", ids)?;
        let (o, s, i) = around(shape, dim);
        self.check(ids, s);
        Ok(self.emit(|f, _| f.take(&x.0, &ids.0, o, s, i)))
    }
    fn index_add(&self, x: &TVal, shape: &Shape, dim: usize, ids: &TVal, src: &TVal) -> Result<TVal> {
        int_ids("index_add", ids)?;
        let (o, s, i) = around(shape, dim);
        let et = x.0.ty.et;
        Ok(self.emit(|f, _| {
            let xv = f.convert(&x.0, et.compute());
            let sv = f.convert(&src.0, et.compute());
            let r = f.put_add(&xv, &ids.0, &sv, o, s, i);
            f.convert(&r, et)
        }))
    }
    fn gather(&self, x: &TVal, shape: &Shape, dim: usize, idx: &TVal, idx_shape: &Shape) -> Result<TVal> {
        int_ids("gather", idx)?;
        Ok(self.emit(|f, _| f.gather_along(&x.0, shape.dims(), dim, &idx.0, idx_shape.dims())))
    }
    fn scatter_add(
        &self,
        x: &TVal,
        shape: &Shape,
        dim: usize,
        idx: &TVal,
        idx_shape: &Shape,
        src: &TVal,
    ) -> Result<TVal> {
        int_ids("scatter_add", idx)?;
        let et = x.0.ty.et;
        Ok(self.emit(|f, _| {
            let xv = f.convert(&x.0, et.compute());
            let sv = f.convert(&src.0, et.compute());
            let r = f.scatter_add_along(&xv, shape.dims(), dim, &idx.0, idx_shape.dims(), &sv);
            f.convert(&r, et)
        }))
    }
}
