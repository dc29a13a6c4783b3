//! `Composite<B>`: forwards the primitive ops of `B` and keeps every fused op at its
//! composite default, so that the defaults a new backend inherits are tested as well.

use redco_core::backend::{BinaryOp, CmpOp, MatmulSpec, ReduceOp, UnaryOp};
use redco_core::{Backend, DType, HostData, Result, Shape};

thread_local! {
    static MATMULS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// The matmul kernels a [`Composite`] backend has run on this thread (to count what a
/// step runs, as the recompute tests do).
pub fn matmul_calls() -> usize {
    MATMULS.with(|m| m.get())
}

/// A decorator backend exposing only the primitives of the wrapped backend.
#[derive(Debug, Clone)]
pub struct Composite<B>(pub B);

impl<B: Backend> Backend for Composite<B> {
    type Storage = B::Storage;
    fn name(&self) -> String {
        format!("composite({})", self.0.name())
    }
    fn supports(&self, d: DType) -> bool {
        self.0.supports(d)
    }
    fn upload(&self, d: &HostData) -> Result<B::Storage> {
        self.0.upload(d)
    }
    fn download(&self, s: &B::Storage) -> Result<HostData> {
        self.0.download(s)
    }
    fn storage_dtype(&self, s: &B::Storage) -> DType {
        self.0.storage_dtype(s)
    }
    fn sync(&self) -> Result<()> {
        self.0.sync()
    }
    fn full(&self, n: usize, v: f64, d: DType) -> Result<B::Storage> {
        self.0.full(n, v, d)
    }
    fn unary(&self, op: UnaryOp, x: &B::Storage, n: usize) -> Result<B::Storage> {
        self.0.unary(op, x, n)
    }
    fn binary(
        &self,
        op: BinaryOp,
        a: (&B::Storage, &Shape),
        b: (&B::Storage, &Shape),
        o: &Shape,
    ) -> Result<B::Storage> {
        self.0.binary(op, a, b, o)
    }
    fn compare(&self, op: CmpOp, a: (&B::Storage, &Shape), b: (&B::Storage, &Shape), o: &Shape) -> Result<B::Storage> {
        self.0.compare(op, a, b, o)
    }
    fn where_cond(
        &self,
        c: (&B::Storage, &Shape),
        a: (&B::Storage, &Shape),
        b: (&B::Storage, &Shape),
        o: &Shape,
    ) -> Result<B::Storage> {
        self.0.where_cond(c, a, b, o)
    }
    fn matmul(&self, a: &B::Storage, b: &B::Storage, s: &MatmulSpec) -> Result<B::Storage> {
        MATMULS.with(|m| m.set(m.get() + 1));
        self.0.matmul(a, b, s)
    }
    fn reduce(&self, op: ReduceOp, x: &B::Storage, s: &Shape, d: usize) -> Result<B::Storage> {
        self.0.reduce(op, x, s, d)
    }
    fn cast(&self, x: &B::Storage, n: usize, d: DType) -> Result<B::Storage> {
        self.0.cast(x, n, d)
    }
    fn permute(&self, x: &B::Storage, s: &Shape, p: &[usize]) -> Result<B::Storage> {
        self.0.permute(x, s, p)
    }
    fn expand(&self, x: &B::Storage, s: &Shape, o: &Shape) -> Result<B::Storage> {
        self.0.expand(x, s, o)
    }
    fn narrow(&self, x: &B::Storage, s: &Shape, d: usize, st: usize, l: usize) -> Result<B::Storage> {
        self.0.narrow(x, s, d, st, l)
    }
    fn cat(&self, xs: &[(&B::Storage, &Shape)], d: usize) -> Result<B::Storage> {
        self.0.cat(xs, d)
    }
    fn index_select(&self, x: &B::Storage, s: &Shape, d: usize, ids: &B::Storage, n: usize) -> Result<B::Storage> {
        self.0.index_select(x, s, d, ids, n)
    }
    fn index_add(&self, x: &B::Storage, s: &Shape, d: usize, ids: &B::Storage, src: &B::Storage) -> Result<B::Storage> {
        self.0.index_add(x, s, d, ids, src)
    }
    fn gather(&self, x: &B::Storage, s: &Shape, d: usize, i: &B::Storage, is: &Shape) -> Result<B::Storage> {
        self.0.gather(x, s, d, i, is)
    }
    fn scatter_add(
        &self,
        x: &B::Storage,
        s: &Shape,
        d: usize,
        i: &B::Storage,
        is: &Shape,
        src: &B::Storage,
    ) -> Result<B::Storage> {
        self.0.scatter_add(x, s, d, i, is, src)
    }
}
