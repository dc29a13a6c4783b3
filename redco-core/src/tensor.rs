//! `Tensor`: storage + global shape + dtype + placements + autograd node.

use crate::autograd::{self, Node};
use crate::{Backend, DType, Element, Error, HostData, Placements, Result, Shape};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A unique identity for a tensor value; gradients are keyed by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId(u64);

impl TensorId {
    fn fresh() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        TensorId(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

pub(crate) struct TensorInner<B: Backend> {
    pub(crate) id: TensorId,
    pub(crate) storage: B::Storage,
    pub(crate) shape: Shape,
    /// The shape of `storage`: `shape` with each sharded dim divided by its axis size.
    pub(crate) local: Shape,
    pub(crate) dtype: DType,
    pub(crate) placements: Placements,
    pub(crate) backend: B,
    pub(crate) node: Option<Node<B>>,
    pub(crate) is_var: bool,
}

impl<B: Backend> Drop for TensorInner<B> {
    /// Unlinks the recorded graph iteratively. The default drop recurses once per op
    /// (each node owns its inputs, which own theirs), which overflows the stack for
    /// graphs a few ten thousand ops deep although `backward` itself is iterative.
    fn drop(&mut self) {
        let Some(node) = self.node.take() else { return };
        let mut nodes = vec![node];
        let mut held: Vec<Tensor<B>> = Vec::new();
        while let Some(Node { inputs, backward, .. }) = nodes.pop() {
            // Hold the inputs while the gradient closure (which captures some of them)
            // drops, so that the closure never releases the last handle of a chain.
            held.extend(inputs);
            drop(backward);
            for mut t in held.drain(..) {
                // A uniquely held input hands its node over; then `t` drops shallowly
                // (no node, or still shared elsewhere).
                if let Some(n) = Arc::get_mut(&mut t.0).and_then(|inner| inner.node.take()) {
                    nodes.push(n);
                }
            }
        }
    }
}

/// An immutable n-dimensional array on a backend, with autograd.
///
/// Cloning is cheap (reference counted). Ops return new tensors. A tensor that is a
/// *variable* ([`Tensor::into_var`]) or that was computed from one, outside a
/// [`no_grad`](crate::no_grad) scope, records the op that made it, so that
/// [`Tensor::backward`] can return gradients.
///
/// The shape is the *global* shape; each mesh axis has a [`Placement`](crate::Placement)
/// (all `Replicate` on one device).
pub struct Tensor<B: Backend>(pub(crate) Arc<TensorInner<B>>);

impl<B: Backend> Clone for Tensor<B> {
    fn clone(&self) -> Self {
        Tensor(self.0.clone())
    }
}

impl<B: Backend> fmt::Debug for Tensor<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Tensor[{}, {:?}, {}{}]",
            self.shape(),
            self.dtype(),
            self.backend().name(),
            if self.requires_grad() { ", grad" } else { "" }
        )
    }
}

impl<B: Backend> Tensor<B> {
    /// Wraps backend storage (no gradient history). The storage must hold
    /// `shape.elem_count()` elements of `dtype`.
    pub fn from_storage(backend: &B, storage: B::Storage, shape: impl Into<Shape>, dtype: DType) -> Self {
        Self::make(backend.clone(), storage, shape.into(), dtype, None, false)
    }

    pub(crate) fn make(
        backend: B,
        storage: B::Storage,
        shape: Shape,
        dtype: DType,
        node: Option<Node<B>>,
        is_var: bool,
    ) -> Self {
        let local = shape.clone();
        Self::make_placed(backend, storage, shape, local, Placements::REPLICATED, dtype, node, is_var)
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn make_placed(
        backend: B,
        storage: B::Storage,
        shape: Shape,
        local: Shape,
        placements: Placements,
        dtype: DType,
        node: Option<Node<B>>,
        is_var: bool,
    ) -> Self {
        // the local shape of a sharded tensor comes from `placement::local_shape`, computed
        // by the sharding layer that places it; a replicated tensor's is its shape
        debug_assert!(!placements.is_replicated() || local == shape, "a replicated tensor's local shape is its shape");
        Tensor(Arc::new(TensorInner {
            id: TensorId::fresh(),
            storage,
            shape,
            local,
            dtype,
            placements,
            backend,
            node,
            is_var,
        }))
    }

    /// Wraps a rank's local shard: `storage` holds `local` elements of the global tensor of
    /// shape `shape` laid out by `placements` (no gradient history).
    pub fn from_local(
        backend: &B,
        storage: B::Storage,
        shape: Shape,
        local: Shape,
        placements: Placements,
        dtype: DType,
    ) -> Self {
        Self::make_placed(backend.clone(), storage, shape, local, placements, dtype, None, false)
    }

    /// Like `from_op`, for a result with its own placements and local shape.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn from_op_placed<F>(
        backend: &B,
        storage: B::Storage,
        shape: Shape,
        local: Shape,
        placements: Placements,
        dtype: DType,
        op: &'static str,
        inputs: &[&Tensor<B>],
        backward: F,
    ) -> Self
    where
        F: Fn(&Tensor<B>) -> Result<Vec<Option<Tensor<B>>>> + Send + Sync + 'static,
    {
        let track = autograd::is_grad_enabled() && inputs.iter().any(|t| t.requires_grad());
        let node = track.then(|| Node {
            op,
            inputs: inputs.iter().map(|t| (*t).clone()).collect(),
            backward: Box::new(backward),
            meta: autograd::OpMeta::None,
        });
        Self::make_placed(backend.clone(), storage, shape, local, placements, dtype, node, false)
    }

    /// The result of an op: records `backward` (mapping the output gradient to one optional
    /// gradient per input) when gradients are enabled and an input requires them.
    pub(crate) fn from_op<F>(
        backend: &B,
        storage: B::Storage,
        shape: Shape,
        dtype: DType,
        op: &'static str,
        inputs: &[&Tensor<B>],
        backward: F,
    ) -> Self
    where
        F: Fn(&Tensor<B>) -> Result<Vec<Option<Tensor<B>>>> + Send + Sync + 'static,
    {
        debug_assert!(inputs.iter().all(|t| !t.is_sharded()), "{op}: sharded inputs need a placed result");
        let local = shape.clone();
        Self::from_op_placed(backend, storage, shape, local, Placements::REPLICATED, dtype, op, inputs, backward)
    }

    /// A tensor from host data; `data.len()` must equal the shape's element count.
    pub fn from_host(backend: &B, data: &HostData, shape: impl Into<Shape>) -> Result<Self> {
        let shape = shape.into();
        if data.len() != shape.elem_count() {
            return Err(Error::ElementCount { op: "from_host", expected: shape.elem_count(), got: data.len(), shape });
        }
        if !backend.supports(data.dtype()) {
            return Err(Error::UnsupportedDType { op: "from_host", dtype: data.dtype() });
        }
        let s = backend.upload(data)?;
        Ok(Self::from_storage(backend, s, shape, data.dtype()))
    }

    /// A tensor from a vector of host elements.
    pub fn from_vec<T: Element>(backend: &B, v: Vec<T>, shape: impl Into<Shape>) -> Result<Self> {
        Self::from_host(backend, &T::into_host(v), shape)
    }

    /// A rank-0 tensor holding `value`.
    pub fn scalar(backend: &B, value: f64, dtype: DType) -> Result<Self> {
        Self::full(backend, Shape::new(vec![]), value, dtype)
    }

    /// A tensor with every element equal to `value`.
    pub fn full(backend: &B, shape: impl Into<Shape>, value: f64, dtype: DType) -> Result<Self> {
        let shape = shape.into();
        let s = backend.full(shape.elem_count(), value, dtype)?;
        Ok(Self::from_storage(backend, s, shape, dtype))
    }

    /// Zeros.
    pub fn zeros(backend: &B, shape: impl Into<Shape>, dtype: DType) -> Result<Self> {
        Self::full(backend, shape, 0.0, dtype)
    }

    /// Ones.
    pub fn ones(backend: &B, shape: impl Into<Shape>, dtype: DType) -> Result<Self> {
        Self::full(backend, shape, 1.0, dtype)
    }

    /// `0, 1, .., n-1` as `I64`.
    pub fn arange(backend: &B, n: usize) -> Result<Self> {
        Self::from_vec(backend, (0..n as i64).collect::<Vec<_>>(), [n])
    }

    /// A constant with this tensor's shape, dtype, backend and layout (a `Partial` tensor
    /// gives a replicated constant).
    pub fn full_like(&self, value: f64) -> Result<Self> {
        let s = self.backend().full(self.local_shape().elem_count(), value, self.dtype())?;
        let p = crate::placement::without_partial(self.placements());
        Ok(Self::from_local(self.backend(), s, self.shape().clone(), self.local_shape().clone(), p, self.dtype()))
    }

    /// Zeros with this tensor's shape, dtype, backend and layout.
    pub fn zeros_like(&self) -> Result<Self> {
        self.full_like(0.0)
    }

    /// Ones with this tensor's shape, dtype, backend and layout.
    pub fn ones_like(&self) -> Result<Self> {
        self.full_like(1.0)
    }

    fn same_value(&self, is_var: bool) -> Self {
        let i = &self.0;
        Self::make_placed(
            i.backend.clone(),
            i.storage.clone(),
            i.shape.clone(),
            i.local.clone(),
            i.placements,
            i.dtype,
            None,
            is_var,
        )
    }

    /// The same value as a new leaf variable: gradients flow to it.
    pub fn into_var(self) -> Self {
        self.same_value(true)
    }

    /// The same value with no gradient history and not a variable.
    pub fn detach(&self) -> Self {
        self.same_value(false)
    }

    /// This tensor's identity (gradients are looked up by it).
    pub fn id(&self) -> TensorId {
        self.0.id
    }
    /// The global shape.
    pub fn shape(&self) -> &Shape {
        &self.0.shape
    }
    /// The shape of this rank's local storage (the global shape unless sharded).
    pub fn local_shape(&self) -> &Shape {
        &self.0.local
    }
    /// True when some mesh axis does not replicate this tensor.
    pub fn is_sharded(&self) -> bool {
        !self.0.placements.is_replicated()
    }
    /// The global dimensions.
    pub fn dims(&self) -> &[usize] {
        self.0.shape.dims()
    }
    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.shape.rank()
    }
    /// The number of elements.
    pub fn elem_count(&self) -> usize {
        self.0.shape.elem_count()
    }
    /// The element type.
    pub fn dtype(&self) -> DType {
        self.0.dtype
    }
    /// The backend holding the storage.
    pub fn backend(&self) -> &B {
        &self.0.backend
    }
    /// The backend storage.
    pub fn storage(&self) -> &B::Storage {
        &self.0.storage
    }
    /// The placement on each mesh axis.
    pub fn placements(&self) -> Placements {
        self.0.placements
    }
    /// True for a leaf variable.
    pub fn is_var(&self) -> bool {
        self.0.is_var
    }
    /// True when gradients flow to or through this tensor.
    pub fn requires_grad(&self) -> bool {
        self.0.is_var || self.0.node.is_some()
    }
    /// Attaches `meta` to the op that just produced this tensor (no-op when nothing was
    /// recorded).
    pub(crate) fn with_meta(mut self, meta: autograd::OpMeta) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.0) {
            if let Some(n) = inner.node.as_mut() {
                n.meta = meta;
            }
        }
        self
    }

    /// The recorded op's metadata, if any.
    pub(crate) fn op_meta(&self) -> Option<&autograd::OpMeta> {
        self.0.node.as_ref().map(|n| &n.meta)
    }

    /// The inputs of the recorded op that produced this tensor.
    pub(crate) fn op_inputs(&self) -> &[Tensor<B>] {
        self.0.node.as_ref().map(|n| n.inputs.as_slice()).unwrap_or(&[])
    }

    /// The name of the op that produced this tensor, if it records one.
    pub fn op_name(&self) -> Option<&'static str> {
        self.0.node.as_ref().map(|n| n.op)
    }

    /// Copies the values to the host (forces lazy storage). A sharded or partial tensor is
    /// an error: call [`Tensor::replicate`] first (on every rank), or use
    /// [`Tensor::local_to_host`] for this rank's shard.
    pub fn to_host(&self) -> Result<HostData> {
        if self.is_sharded() {
            return Err(Error::invalid(
                "to_host",
                format!("tensor of shape {} is laid out as {:?}; replicate it first", self.shape(), self.placements()),
            ));
        }
        self.backend().download(self.storage())
    }
    /// This rank's local storage, on the host.
    pub fn local_to_host(&self) -> Result<HostData> {
        self.backend().download(self.storage())
    }
    /// The values as f32 (converted from any dtype).
    pub fn to_vec_f32(&self) -> Result<Vec<f32>> {
        Ok(self.to_host()?.to_f32_vec())
    }
    /// The values as f64 (converted from any dtype).
    pub fn to_vec_f64(&self) -> Result<Vec<f64>> {
        Ok(self.to_host()?.to_f64_vec())
    }
    /// The values of an integer tensor as i64.
    pub fn to_vec_i64(&self) -> Result<Vec<i64>> {
        self.to_host()?.to_i64_vec()
    }
    /// The single value of a one-element tensor, as f64.
    pub fn to_scalar(&self) -> Result<f64> {
        if self.elem_count() != 1 {
            return Err(Error::invalid(
                "to_scalar",
                format!("tensor of shape {} has {} elements, not 1", self.shape(), self.elem_count()),
            ));
        }
        Ok(self.to_vec_f64()?[0])
    }

    /// Errors unless both tensors have the same dtype.
    pub(crate) fn same_dtype(&self, other: &Tensor<B>, op: &'static str) -> Result<()> {
        if self.dtype() != other.dtype() {
            return Err(Error::DTypeMismatch { op, lhs: self.dtype(), rhs: other.dtype() });
        }
        Ok(())
    }

    /// Errors unless the dtype is a float type.
    pub(crate) fn expect_float(&self, op: &'static str) -> Result<()> {
        if !self.dtype().is_float() {
            return Err(Error::UnsupportedDType { op, dtype: self.dtype() });
        }
        Ok(())
    }

    /// Errors unless the dtype is an integer type (ids, targets).
    pub(crate) fn expect_int(&self, op: &'static str) -> Result<()> {
        if !matches!(self.dtype(), DType::I64 | DType::I32) {
            return Err(Error::UnsupportedDType { op, dtype: self.dtype() });
        }
        Ok(())
    }
}
