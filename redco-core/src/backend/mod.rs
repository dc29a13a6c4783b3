//! The `Backend` trait: opaque storage, a small primitive op set, and fused ops with
//! composite defaults.
//!
//! Storage is contiguous and row-major; the backend never sees strides. Every op receives
//! the shapes it needs and returns new storage. Storage may be lazy: only
//! [`Backend::download`] and [`Backend::sync`] have to force it.
//!
//! A new backend implements the primitives and inherits the fused ops from their composite
//! defaults (written once with [`Tensor`](crate::Tensor) ops, in `ops/<family>.rs`); it gets
//! faster by overriding them.
//!
//! Beside the trait live what a rank's device is handed to communicate: the
//! [`Collective`](collective::Collective) trait, the [`Mesh`](mesh::Mesh), and the rank's
//! [`Comm`](comm::Comm) with each backend's typed thread slot ([`Backend::comm_slot`]).

pub mod collective;
pub mod comm;
pub mod mesh;

use crate::ops;
use crate::{DType, HostData, Result, Shape};
use std::fmt::Debug;
use std::sync::Arc;

/// Elementwise unary ops (float tensors).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum UnaryOp {
    /// -x
    Neg,
    /// e^x
    Exp,
    /// ln x
    Log,
    /// sqrt x
    Sqrt,
    /// 1 / sqrt x
    Rsqrt,
    /// 1 / x
    Recip,
    /// |x|
    Abs,
    /// tanh x
    Tanh,
    /// 1 / (1 + e^-x)
    Sigmoid,
    /// max(x, 0)
    Relu,
    /// x * sigmoid(x)
    Silu,
    /// x * Phi(x), with the exact erf form
    GeluErf,
    /// the tanh approximation of GELU
    GeluTanh,
    /// erf x
    Erf,
    /// sin x
    Sin,
    /// cos x
    Cos,
    /// x^2
    Square,
    /// 1 where x > 0, else 0 (ReLU's derivative)
    Step,
    /// d/dx of SiLU
    SiluDeriv,
    /// d/dx of GELU (erf form)
    GeluErfDeriv,
    /// d/dx of GELU (tanh form)
    GeluTanhDeriv,
    /// x * mul + add
    Affine {
        /// multiplier
        mul: f64,
        /// addend
        add: f64,
    },
    /// x ^ e
    Powf(f64),
    /// max(x, c)
    ClampMin(f64),
}

/// Elementwise binary ops with NumPy broadcasting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryOp {
    /// a + b
    Add,
    /// a - b
    Sub,
    /// a * b
    Mul,
    /// a / b
    Div,
    /// max(a, b)
    Max,
    /// min(a, b)
    Min,
}

/// Elementwise comparisons, producing a `U8` mask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    /// a == b
    Eq,
    /// a != b
    Ne,
    /// a < b
    Lt,
    /// a <= b
    Le,
    /// a > b
    Gt,
    /// a >= b
    Ge,
}

/// Reductions along one dimension (the dimension is kept with size 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
    /// Index of the (first) maximum, as `I64`.
    ArgMax,
}

/// A batched matmul `C[b] = op(A[b]) * op(B[b])`, all operands contiguous row-major.
///
/// `A` is stored `[batch?, m, k]` (or `[batch?, k, m]` when `trans_a`), `B` is stored
/// `[batch?, k, n]` (or `[batch?, n, k]` when `trans_b`); an operand with `*_batched == false`
/// holds a single matrix shared by every batch entry. `C` is `[batch, m, n]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatmulSpec {
    /// Number of matrices in the batch.
    pub batch: usize,
    /// Rows of C.
    pub m: usize,
    /// Columns of C.
    pub n: usize,
    /// The contracted dimension.
    pub k: usize,
    /// A is stored transposed.
    pub trans_a: bool,
    /// B is stored transposed.
    pub trans_b: bool,
    /// A has one matrix per batch entry (else one shared matrix).
    pub a_batched: bool,
    /// B has one matrix per batch entry (else one shared matrix).
    pub b_batched: bool,
}

/// A grouped matmul ([`Backend::grouped_matmul`]): `x [sum(counts), k]` with its rows in
/// groups of `counts[e]`, times one matrix per group, `w [E, n, k]` (`trans_w`) or
/// `w [E, k, n]`, into `[sum(counts), n]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupedSpec {
    /// Rows per group (expert), in order; a group may be empty.
    pub counts: Vec<usize>,
    /// The contracted dimension.
    pub k: usize,
    /// Columns of the result.
    pub n: usize,
    /// `w` is stored `[E, n, k]` (each matrix transposed, the Linear layout).
    pub trans_w: bool,
}

/// The two rotary-embedding conventions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RotaryMode {
    /// GPT-J: pairs (`x[2i]`, `x[2i+1]`) rotate together.
    Interleaved,
    /// LLaMA / GPT-NeoX: (`x[i]`, `x[i + d/2]`) rotate together.
    HalfSplit,
}

/// Device memory held by a backend's tensors (as torch's `memory_allocated` and
/// `max_memory_allocated` count it: buffers lent out, not those cached for reuse).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryStats {
    /// Bytes held now.
    pub in_use: u64,
    /// The most bytes held at once since the device opened or [`Backend::reset_peak_memory`].
    pub peak: u64,
}

/// Device time of one family of ops ([`Backend::op_profile`]).
#[derive(Debug, Clone, PartialEq)]
pub struct OpTime {
    /// The family (`matmul`, `attention forward`, `AdamW`, ...).
    pub family: String,
    /// Calls timed.
    pub calls: u64,
    /// Seconds of device time (host time for rows that say so).
    pub seconds: f64,
}

/// A compute device and its kernels. See the module docs.
pub trait Backend: Clone + Send + Sync + Debug + 'static {
    /// Opaque device storage of one contiguous buffer.
    type Storage: Clone + Send + Sync + Debug + 'static;

    /// A short name such as `cpu` or `wgpu`.
    fn name(&self) -> String;
    /// This backend type's per-thread communicator slot, where the sharded tensor ops find
    /// the rank's [`Comm`](comm::Comm). A backend declares it with
    /// `redco_core::comm_slot!(MyBackend);` in its `impl Backend` block; the default (none)
    /// runs single-rank only, and a sharded op on it says so.
    fn comm_slot() -> Option<&'static std::thread::LocalKey<comm::CommSlot<Self>>> {
        None
    }
    /// True when the backend can store and compute `dtype`.
    fn supports(&self, dtype: DType) -> bool;
    /// Copies host data into new storage.
    fn upload(&self, data: &HostData) -> Result<Self::Storage>;
    /// Copies storage back to the host (forces lazy storage).
    fn download(&self, s: &Self::Storage) -> Result<HostData>;
    /// The dtype of a storage.
    fn storage_dtype(&self, s: &Self::Storage) -> DType;
    /// The host data of `s`, shared rather than copied when the storage already lives in
    /// host memory (the CPU backend); collectives staged through the host use it.
    fn download_shared(&self, s: &Self::Storage) -> Result<Arc<HostData>> {
        Ok(Arc::new(self.download(s)?))
    }
    /// Storage made from owned host data (taken over without a copy where the backend
    /// keeps host memory).
    fn upload_owned(&self, data: HostData) -> Result<Self::Storage> {
        self.upload(&data)
    }
    /// Storage made from shared host data (taken over without a copy, and still shared,
    /// where the backend keeps host memory: ranks of one process can then hold one buffer).
    fn upload_shared(&self, data: Arc<HostData>) -> Result<Self::Storage> {
        self.upload(&data)
    }
    /// Waits for every queued operation (a no-op for eager backends).
    fn sync(&self) -> Result<()> {
        Ok(())
    }
    /// The device memory this backend's tensors hold, where the backend counts it (device
    /// backends); `None` (the default) where it is host memory, counted by the allocator.
    fn memory_stats(&self) -> Option<MemoryStats> {
        None
    }
    /// Starts [`MemoryStats::peak`] again from what is held now.
    fn reset_peak_memory(&self) {}
    /// Starts timing the device's work by op family (dropping an earlier profile); `false`
    /// (the default) where the backend has no device timers.
    fn profile_ops(&self) -> bool {
        false
    }
    /// The device time of each op family since [`Backend::profile_ops`] (waits for the
    /// device), longest first, and stops timing; empty where nothing was profiled.
    fn op_profile(&self) -> Result<Vec<OpTime>> {
        Ok(Vec::new())
    }
    /// The device's dense peak rate in FLOP/s for products in `dtype` (tensor cores, f32
    /// accumulation), where the backend knows it: what model-FLOPs utilisation divides by.
    fn peak_flops(&self, dtype: DType) -> Option<f64> {
        let _ = dtype;
        None
    }

    /// A buffer of `n` elements, all equal to `value`.
    fn full(&self, n: usize, value: f64, dtype: DType) -> Result<Self::Storage>;
    /// Elementwise unary op on `n` elements.
    fn unary(&self, op: UnaryOp, x: &Self::Storage, n: usize) -> Result<Self::Storage>;
    /// Elementwise binary op; the result has the broadcast shape `out`.
    fn binary(
        &self,
        op: BinaryOp,
        a: (&Self::Storage, &Shape),
        b: (&Self::Storage, &Shape),
        out: &Shape,
    ) -> Result<Self::Storage>;
    /// Elementwise comparison into a `U8` mask of broadcast shape `out`.
    fn compare(
        &self,
        op: CmpOp,
        a: (&Self::Storage, &Shape),
        b: (&Self::Storage, &Shape),
        out: &Shape,
    ) -> Result<Self::Storage>;
    /// `cond ? a : b` with broadcasting; `cond` is `U8`.
    fn where_cond(
        &self,
        cond: (&Self::Storage, &Shape),
        a: (&Self::Storage, &Shape),
        b: (&Self::Storage, &Shape),
        out: &Shape,
    ) -> Result<Self::Storage>;
    /// Batched matmul, see [`MatmulSpec`].
    fn matmul(&self, a: &Self::Storage, b: &Self::Storage, spec: &MatmulSpec) -> Result<Self::Storage>;
    /// The grouped matmul of a mixture of experts, see [`GroupedSpec`]: each group's rows
    /// times its own matrix, in one call. The default runs one GEMM per non-empty group
    /// ([`ops::grouped_matmul::composite_grouped_matmul`]); a backend overrides it with a
    /// kernel that reads every group in place.
    fn grouped_matmul(&self, x: &Self::Storage, w: &Self::Storage, spec: &GroupedSpec) -> Result<Self::Storage> {
        ops::grouped_matmul::composite_grouped_matmul(self, x, w, spec)
    }
    /// `x [m, k]` times the transpose of a block-quantized matrix `w` (`U8 [n, row_bytes]`,
    /// see [`ops::quant_matmul::QuantMatmulSpec`]), into `[m, n]` of `x`'s dtype. The
    /// default dequantizes the blocks and runs one GEMM
    /// ([`ops::quant_matmul::composite_quant_matmul`]); a backend overrides it with a
    /// kernel that reads the blocks in place.
    fn quant_matmul(
        &self,
        x: &Self::Storage,
        w: &Self::Storage,
        spec: &ops::quant_matmul::QuantMatmulSpec,
    ) -> Result<Self::Storage> {
        ops::quant_matmul::composite_quant_matmul(self, x, w, spec)
    }
    /// Reduction of `x` (shape `shape`) along `dim`, keeping it with size 1.
    fn reduce(&self, op: ReduceOp, x: &Self::Storage, shape: &Shape, dim: usize) -> Result<Self::Storage>;
    /// Converts to `dtype`.
    fn cast(&self, x: &Self::Storage, n: usize, dtype: DType) -> Result<Self::Storage>;
    /// Copies `x` with its dimensions permuted (`out.dims[i] = shape.dims[perm[i]]`).
    fn permute(&self, x: &Self::Storage, shape: &Shape, perm: &[usize]) -> Result<Self::Storage>;
    /// Copies `x` broadcast to `out` (a materialised expand).
    fn expand(&self, x: &Self::Storage, shape: &Shape, out: &Shape) -> Result<Self::Storage>;
    /// Copies the slice `start..start + len` of dimension `dim`.
    fn narrow(&self, x: &Self::Storage, shape: &Shape, dim: usize, start: usize, len: usize) -> Result<Self::Storage>;
    /// Concatenates along `dim`; shapes agree elsewhere.
    fn cat(&self, xs: &[(&Self::Storage, &Shape)], dim: usize) -> Result<Self::Storage>;
    /// Selects entries `ids` (an integer storage of `n_ids` elements) along `dim`.
    /// Ids outside `0..shape[dim]` are an error.
    fn index_select(
        &self,
        x: &Self::Storage,
        shape: &Shape,
        dim: usize,
        ids: &Self::Storage,
        n_ids: usize,
    ) -> Result<Self::Storage>;
    /// Returns `x` (shape `shape`) with `src` rows added at `ids` along `dim`
    /// (`src` has `shape` with `dim` replaced by the number of ids).
    fn index_add(
        &self,
        x: &Self::Storage,
        shape: &Shape,
        dim: usize,
        ids: &Self::Storage,
        src: &Self::Storage,
    ) -> Result<Self::Storage>;
    /// `out[.., i, ..] = x[.., idx[.., i, ..], ..]` along `dim`; `idx` has shape `idx_shape`
    /// equal to `shape` except along `dim`.
    fn gather(
        &self,
        x: &Self::Storage,
        shape: &Shape,
        dim: usize,
        idx: &Self::Storage,
        idx_shape: &Shape,
    ) -> Result<Self::Storage>;
    /// The adjoint of [`Backend::gather`]: returns `x` with `src` (shape `idx_shape`) added at
    /// the gathered positions.
    fn scatter_add(
        &self,
        x: &Self::Storage,
        shape: &Shape,
        dim: usize,
        idx: &Self::Storage,
        idx_shape: &Shape,
        src: &Self::Storage,
    ) -> Result<Self::Storage>;
    /// Whether [`Backend::write_rows`] writes in place (a few rows cost a few rows, not the
    /// whole table): `false` (the default) where it rebuilds the table; `generate` writes its
    /// cache row by row only where this is true.
    fn writes_rows_in_place(&self) -> bool {
        false
    }
    /// Writes the `k` rows of `src` (`[k, row_len]`) over rows `rows` (`k` distinct `I64`
    /// ids in `0..n`, checked by the caller) of `dst` (`[n, row_len]`, `src`'s dtype): a KV
    /// cache written a few tokens at a time. A backend that can writes in place (the CPU
    /// backend, when no other tensor shares `dst`'s buffer); the default builds the new
    /// table from primitives (an index-add of the rows over zeros, chosen row by row), which
    /// costs the whole table.
    fn write_rows(
        &self,
        dst: &mut Self::Storage,
        (n, row_len): (usize, usize),
        rows: &Self::Storage,
        src: &Self::Storage,
        k: usize,
    ) -> Result<()> {
        let dt = self.storage_dtype(dst);
        let (table, col) = (Shape::new([n, row_len]), Shape::new([n, 1]));
        let hit = self.index_add(&self.full(n, 0.0, dt)?, &Shape::new([n]), 0, rows, &self.full(k, 1.0, dt)?)?;
        let zero = self.full(1, 0.0, dt)?;
        let written = self.compare(CmpOp::Gt, (&hit, &col), (&zero, &Shape::new([1, 1])), &col)?;
        let placed = self.index_add(&self.full(n * row_len, 0.0, dt)?, &table, 0, rows, src)?;
        *dst = self.where_cond((&written, &col), (&placed, &table), (dst, &table), &table)?;
        Ok(())
    }
    /// Checks that the integer ids in `ids` lie in `0..size`, or returns
    /// [`Error::IndexOutOfRange`](crate::Error::IndexOutOfRange) naming `op`: for lookups
    /// whose kernel sees only ids already made safe (the vocabulary-parallel embedding).
    /// The default reads the ids back; a tracing backend, which cannot stop a program in
    /// the middle, records the bound and checks the program's inputs before each run.
    fn check_ids(&self, ids: &Self::Storage, size: usize, op: &'static str) -> Result<()> {
        let raw = self.download(ids)?.to_i64_vec()?;
        match raw.iter().find(|&&i| i < 0 || i as u64 >= size as u64) {
            Some(&bad) => Err(crate::Error::IndexOutOfRange { op, index: bad, size }),
            None => Ok(()),
        }
    }
    /// `n` uniform values in `[0, 1)` from a counter-based generator keyed by `seed`:
    /// element `i` depends only on `(seed, i)`, so every backend draws the same numbers.
    fn rand_uniform(&self, n: usize, seed: u64, dtype: DType) -> Result<Self::Storage> {
        let v: Vec<f64> = (0..n as u64).map(|i| crate::ops::random::uniform_at(seed, i)).collect();
        self.upload(&HostData::from_f64(&v, dtype))
    }

    // ----- fused ops, with composite defaults -----

    /// Softmax over the last dimension.
    fn softmax(&self, x: &Self::Storage, shape: &Shape) -> Result<Self::Storage> {
        ops::softmax::composite_softmax(self, x, shape)
    }
    /// Log-softmax over the last dimension.
    fn log_softmax(&self, x: &Self::Storage, shape: &Shape) -> Result<Self::Storage> {
        ops::softmax::composite_log_softmax(self, x, shape)
    }
    /// LayerNorm over the last dimension with optional scale and bias.
    fn layer_norm(
        &self,
        x: &Self::Storage,
        shape: &Shape,
        weight: Option<&Self::Storage>,
        bias: Option<&Self::Storage>,
        eps: f64,
    ) -> Result<Self::Storage> {
        ops::norm::composite_layer_norm(self, x, shape, weight, bias, eps)
    }
    /// RMSNorm over the last dimension with optional scale.
    fn rms_norm(
        &self,
        x: &Self::Storage,
        shape: &Shape,
        weight: Option<&Self::Storage>,
        eps: f64,
    ) -> Result<Self::Storage> {
        ops::norm::composite_rms_norm(self, x, shape, weight, eps)
    }
    /// The input gradient of [`Backend::layer_norm`] (`rms` false) or
    /// [`Backend::rms_norm`] (`rms` true) over the last dimension of `shape`, for the
    /// output gradient `g` (same shape): with `gx = g * weight` (`g` without a weight) and
    /// `xhat` the normalised input, LayerNorm's `rstd (gx - mean(gx) - xhat mean(gx xhat))`
    /// and RMSNorm's `rstd (gx - xhat mean(gx xhat))`, row by row. The weight's and bias's
    /// gradients (sums over rows) stay with the caller. A backend with a fused kernel
    /// overrides it; the default is the composite.
    #[allow(clippy::too_many_arguments)]
    fn norm_backward(
        &self,
        x: &Self::Storage,
        shape: &Shape,
        weight: Option<&Self::Storage>,
        g: &Self::Storage,
        eps: f64,
        rms: bool,
    ) -> Result<Self::Storage> {
        ops::norm::composite_norm_backward(self, x, shape, weight, g, eps, rms)
    }
    /// Runs `f` on the backend's own compute threads when it has them (the CPU backend's
    /// pool), so the ops `f` issues need no hand-off from the calling thread; the default
    /// runs `f` in place. Call it through [`crate::runtime::on_backend`], which carries the
    /// thread's communicator and gradient mode over.
    fn enter(&self, f: &mut (dyn FnMut() + Send)) {
        f()
    }
    /// A hint from a program that only runs inference (an inference server): the storages
    /// it multiplies by again and again are constant weights, so the backend may keep them
    /// in a layout its kernels read faster, at the cost of memory (the CPU backend keeps an
    /// f32 weight packed for its GEMM from the first product by it on: one more copy of
    /// each such weight). Never changes a result. The default does nothing.
    fn hint_constant_weights(&self) {}
    /// Rotary embedding of `x` (shape `[.., seq, head_dim]`) on its first `2 * cos.cols`
    /// features; `cos`/`sin` have shape `cs_shape` = `[seq, rot/2]` (or `[batch, seq, rot/2]`
    /// when `x` is `[batch, heads, seq, head_dim]` and positions differ per row).
    #[allow(clippy::too_many_arguments)]
    fn rotary(
        &self,
        x: &Self::Storage,
        shape: &Shape,
        cos: &Self::Storage,
        sin: &Self::Storage,
        cs_shape: &Shape,
        mode: RotaryMode,
    ) -> Result<Self::Storage> {
        ops::rotary::composite_rotary(self, x, shape, cos, sin, cs_shape, mode)
    }
    /// One AdamW step of a flat parameter `x` with gradient `g` and moments `m`, `v` (`n`
    /// elements each); returns the new `(x, m, v)`.
    #[allow(clippy::too_many_arguments)]
    fn adamw(
        &self,
        x: &Self::Storage,
        g: &Self::Storage,
        m: &Self::Storage,
        v: &Self::Storage,
        n: usize,
        step: &ops::adamw::AdamStep,
    ) -> Result<(Self::Storage, Self::Storage, Self::Storage)> {
        ops::adamw::composite_adamw(self, x, g, m, v, n, step)
    }
    /// [`Backend::adamw`] that writes the new moments over `m` and `v`, in their own
    /// buffers where the backend can (no page of a fresh allocation to fault in: a large
    /// model's moments are hundreds of megabytes each), and returns the new `x`. The
    /// default runs [`Backend::adamw`] and replaces `m` and `v` with its outputs.
    #[allow(clippy::too_many_arguments)]
    fn adamw_into(
        &self,
        x: &Self::Storage,
        g: &Self::Storage,
        m: &mut Self::Storage,
        v: &mut Self::Storage,
        n: usize,
        step: &ops::adamw::AdamStep,
    ) -> Result<Self::Storage> {
        let (nx, nm, nv) = self.adamw(x, g, m, v, n, step)?;
        *m = nm;
        *v = nv;
        Ok(nx)
    }
    /// One AdamW step of many parameters at once: each item's new moments over its `m`
    /// and `v` as [`Backend::adamw_into`] writes them, and the new parameters in the
    /// items' order. A backend that updates them all in one pass (one kernel launch on a
    /// GPU instead of one per parameter) overrides it; the default runs
    /// [`Backend::adamw_into`] per item.
    fn adamw_many(
        &self,
        items: &mut [ops::adamw::AdamItem<'_, Self::Storage>],
        step: &ops::adamw::AdamStep,
    ) -> Result<Vec<Self::Storage>> {
        items.iter_mut().map(|it| self.adamw_into(it.x, it.g, it.m, it.v, it.n, step)).collect()
    }
    /// The mixed-precision AdamW step of many parameters at once: each item's moments
    /// updated as [`Backend::adamw_into`] does (in their own buffers where the backend
    /// can), with the gradient (any float dtype) read as f32 and multiplied by
    /// `grad_scale` (the loss scale's inverse and the clipping factor folded in); returns,
    /// in the items' order, each new f32 master and its compute copy in `copy`. A GPU backend does
    /// it in one pass over the bytes (one launch); the default
    /// ([`ops::adamw::composite_adamw_master_many`]) casts, scales, updates and casts per
    /// item.
    fn adamw_master_many(
        &self,
        items: &mut [ops::adamw::AdamMasterItem<'_, Self::Storage>],
        step: &ops::adamw::AdamStep,
        grad_scale: f64,
        copy: DType,
    ) -> Result<Vec<(Self::Storage, Self::Storage)>> {
        ops::adamw::composite_adamw_master_many(self, items, step, grad_scale, copy)
    }
    /// The sum of the squares of every element of the tensors `xs` (contiguous storages
    /// and their shapes): one scalar, accumulated in f64 where the backend has it (else
    /// f32). A global gradient norm reads it. The default
    /// ([`ops::reduce::composite_sum_squares`]) casts, squares and sums each tensor and
    /// adds the sums in order; a GPU backend reads every tensor once in its own dtype.
    fn sum_squares_many(&self, xs: &[(&Self::Storage, &Shape)]) -> Result<Self::Storage> {
        ops::reduce::composite_sum_squares(self, xs)
    }
    /// Per-row cross-entropy of `logits` (`[n, vocab]`) against integer `targets` (`[n]`);
    /// rows whose target equals `ignore_index` give 0. Returns `[n]`.
    fn cross_entropy(
        &self,
        logits: &Self::Storage,
        shape: &Shape,
        targets: &Self::Storage,
        ignore_index: i64,
    ) -> Result<Self::Storage> {
        ops::cross_entropy::composite_cross_entropy(self, logits, shape, targets, ignore_index)
    }
    /// The gradient of [`Backend::cross_entropy`] with respect to `logits`, given the
    /// per-row output gradient `grad` (`[n]`): `(softmax(row) - onehot(target)) * grad`,
    /// zero on ignored rows.
    fn cross_entropy_backward(
        &self,
        logits: &Self::Storage,
        shape: &Shape,
        targets: &Self::Storage,
        ignore_index: i64,
        grad: &Self::Storage,
    ) -> Result<Self::Storage> {
        ops::cross_entropy::composite_cross_entropy_backward(self, logits, shape, targets, ignore_index, grad)
    }
    /// [`Tensor::paged_attention`](crate::Tensor::paged_attention) in one kernel: the
    /// queries `q` (`[q_heads, tokens, head_dim]`) over the pools' rows `k`, `v` (`[rows,
    /// kv_heads, head_dim]`) as `spec`'s segments say; `None` (the default) where the
    /// backend has no such kernel (the op then gathers each segment's rows and runs
    /// [`Backend::attention`]).
    fn paged_attention(
        &self,
        q: &Self::Storage,
        k: &Self::Storage,
        v: &Self::Storage,
        spec: &ops::paged_attention::PagedSpec<'_>,
    ) -> Result<Option<Self::Storage>> {
        let _ = (q, k, v, spec);
        Ok(None)
    }
    /// Scaled-dot-product attention, see [`ops::attention::AttentionSpec`].
    fn attention(
        &self,
        q: &Self::Storage,
        k: &Self::Storage,
        v: &Self::Storage,
        mask: Option<&Self::Storage>,
        spec: &ops::attention::AttentionSpec,
    ) -> Result<Self::Storage> {
        ops::attention::composite_attention(self, q, k, v, mask, spec)
    }
    /// The gradients `(dq, dk, dv)` of [`Backend::attention`] given the output gradient
    /// `dout` (shaped like `q`). Masked scores pass gradient as if the mask were added
    /// (0 / most-negative-finite), so a fully masked row spreads its gradient uniformly.
    #[allow(clippy::too_many_arguments)]
    fn attention_backward(
        &self,
        q: &Self::Storage,
        k: &Self::Storage,
        v: &Self::Storage,
        mask: Option<&Self::Storage>,
        dout: &Self::Storage,
        spec: &ops::attention::AttentionSpec,
    ) -> Result<(Self::Storage, Self::Storage, Self::Storage)> {
        ops::attention_grad::composite_attention_backward(self, q, k, v, mask, dout, spec)
    }
}
