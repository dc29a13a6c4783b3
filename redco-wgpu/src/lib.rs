//! `redco-wgpu`: the portable GPU backend of redco-rs.
//!
//! [`Wgpu`] implements [`redco_core::Backend`] over wgpu with WGSL kernels, one Rust file
//! per op family (`elementwise.rs` + `kernels/unary.wgsl`, `kernels/binary.wgsl`, ...,
//! `matmul.rs` + `kernels/matmul.wgsl`). It runs on Vulkan, Metal, DX12 and GL adapters,
//! and in CI on Mesa's lavapipe (a software Vulkan device).
//!
//! - **Device types.** Kernels compute floats in f32. Where the adapter offers
//!   `wgpu::Features::SHADER_F16` ([`Wgpu::has_f16`]), the device is opened with it and f16
//!   tensors are stored as packed 16-bit values (half the memory and bandwidth of f32;
//!   buffers rounded up to 4 bytes): kernels get their element types by template
//!   (`enable f16;`, `array<f16>` bindings), convert loads to f32 and round stores to f16
//!   (nearest even, overflow to infinity). `REDCO_WGPU_F16=0` turns this off. Without it, f16
//!   (and bf16 always) are stored as f32 words on the device and rounded to their type on
//!   every store; both layouts give the same f16 results (the CPU backend also computes f16
//!   and bf16 in f32). Integer ids (`I64`, `I32`) live as i32 (an uploaded I64 beyond i32 is
//!   saturated on the device, but its host copy keeps it exact, so an out-of-range id is
//!   still reported as such), `U8` masks as u32. `F64` is not supported.
//! - **Queue.** Ops record compute passes into one pending command encoder, submitted
//!   when the host needs data ([`Backend::download`], [`Backend::sync`]) or every 64
//!   dispatches; nothing is read back until the host asks.
//! - **Memory.** Storage buffers come from a pool keyed by size class, and return to it
//!   when the last storage referring to them is dropped.
//! - **Adapter.** `REDCO_WGPU_ADAPTER` (a substring of the adapter name) picks the
//!   adapter, else the first GPU found, else a CPU adapter (lavapipe); [`Wgpu::new`] errors
//!   clearly when there is none.
//! - **Errors.** A tensor beyond the device's buffer limit ([`Wgpu::max_buffer_bytes`]) is
//!   an error naming the limit; validation errors and a lost device surface as errors of the
//!   next call (a lost device fails every later call instead of hanging).
//! - **Fused ops.** Every fused op of the trait has its own kernel: softmax and
//!   log-softmax, LayerNorm and RMSNorm, and per-row cross-entropy run one row per segment
//!   of a workgroup with tree reductions in workgroup memory (`rows.rs`: short rows share a
//!   workgroup, rows of 1024 and more take a whole one); rotary embedding and AdamW (all
//!   three results in one pass) are elementwise; attention is one flash-style kernel (online
//!   softmax over key tiles in workgroup memory, grouped-query heads sharing their tiles,
//!   causal and broadcast keep-masks by strides), falling back to the composite only for a
//!   head dim whose key tile exceeds the device's workgroup memory.

/// The wgpu crate this backend is built on (its [`wgpu::AdapterInfo`] describes adapters).
pub use wgpu;

mod adamw;
mod attention;
mod cross_entropy;
mod device;
mod elem;
mod elementwise;
mod index;
mod layout;
mod matmul;
mod norm;
mod paged_attention;
mod reduce;
mod rotary;
mod rows;
mod softmax;

pub(crate) use elem::Dev;

use device::{err, groups_1d, Ctx, DevBuf};
use redco_core::backend::{BinaryOp, CmpOp, MatmulSpec, MemoryStats, ReduceOp, RotaryMode, UnaryOp};
use redco_core::ops::adamw::AdamStep;
use redco_core::ops::attention::AttentionSpec;
use redco_core::{Backend, DType, Error, HostData, Result, Shape};
use std::sync::Arc;

/// The wgpu backend: one device and its queue, shared by clones.
#[derive(Clone)]
pub struct Wgpu {
    ctx: Arc<Ctx>,
}

impl std::fmt::Debug for Wgpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Wgpu({} {:?})", self.ctx.info.name, self.ctx.info.backend)
    }
}

impl Wgpu {
    /// Opens a new device on the adapter named by `REDCO_WGPU_ADAPTER` (a case-insensitive
    /// substring of its name), else on the first of [`Wgpu::adapters`] (a GPU when there is
    /// one, before CPU adapters such as lavapipe); errors when there is none. Each call opens
    /// its own device (one per rank of an SPMD run).
    pub fn new() -> Result<Self> {
        Ok(Wgpu { ctx: Arc::new(Ctx::open()?) })
    }
    /// [`Wgpu::new`] with packed f16 storage only when `allow_f16` (and the adapter offers
    /// `SHADER_F16`), whatever `REDCO_WGPU_F16` says: `new_with_f16(false)` opens a device
    /// that keeps f16 in f32 words (see [`Wgpu::has_f16`]), to test both layouts on one
    /// machine.
    pub fn new_with_f16(allow_f16: bool) -> Result<Self> {
        Ok(Wgpu { ctx: Arc::new(Ctx::open_with(allow_f16)?) })
    }
    /// Every adapter found, in the order [`Wgpu::new`] prefers them: discrete, integrated,
    /// virtual and other GPUs, then CPU adapters.
    pub fn adapters() -> Vec<wgpu::AdapterInfo> {
        device::adapters().iter().map(|a| a.get_info()).collect()
    }
    /// The adapter this backend runs on (name, vendor, device type, driver, graphics API).
    pub fn adapter_info(&self) -> wgpu::AdapterInfo {
        self.ctx.info.clone()
    }
    /// True when this device stores f16 tensors as packed 16-bit values: the adapter offers
    /// `wgpu::Features::SHADER_F16` and `REDCO_WGPU_F16=0` was not set when the device was
    /// opened. Otherwise f16 tensors are held as f32 words rounded to f16 (as bf16 always is).
    pub fn has_f16(&self) -> bool {
        self.ctx.f16
    }
    /// The largest storage buffer this device binds, in bytes.
    pub fn max_buffer_bytes(&self) -> u64 {
        self.ctx.limits.max_storage_buffer_binding_size.min(self.ctx.limits.max_buffer_size)
    }

    /// New uninitialised storage of `len` elements of `dtype`.
    pub(crate) fn alloc(&self, len: usize, dtype: DType) -> Result<WgpuStorage> {
        let bytes = (len as u64).checked_mul(self.elem_bytes(dtype)).map(|b| b.div_ceil(4) * 4).ok_or_else(|| {
            err(format!("a tensor of {len} elements exceeds the device limit of {} bytes", self.max_buffer_bytes()))
        })?;
        let buf = self.ctx.alloc(bytes)?;
        Ok(WgpuStorage { buf: Arc::new(buf), len, dtype, host_ids: None })
    }

    /// Records kernel `key` (compiled from `src` on first use) over `groups`.
    pub(crate) fn launch(
        &self,
        key: &str,
        src: impl FnOnce() -> String,
        inputs: &[&WgpuStorage],
        out: &WgpuStorage,
        params: &[u32],
        groups: (u32, u32, u32),
    ) -> Result<()> {
        self.launch_with(key, false, src, inputs, out, params, groups)
    }

    /// [`Wgpu::launch`], for a kernel compiled without runtime bounds checks when `trusted`
    /// (see `Ctx::kernel`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn launch_with(
        &self,
        key: &str,
        trusted: bool,
        src: impl FnOnce() -> String,
        inputs: &[&WgpuStorage],
        out: &WgpuStorage,
        params: &[u32],
        groups: (u32, u32, u32),
    ) -> Result<()> {
        let k = self.ctx.kernel(key, inputs.len(), 1, trusted, src)?;
        let ins: Vec<&wgpu::Buffer> = inputs.iter().map(|s| s.buf.raw()).collect();
        self.ctx.dispatch(&k, &ins, &[out.buf.raw()], params, groups)
    }

    /// [`Wgpu::launch`] for a kernel with several outputs (bound after the inputs, in order).
    pub(crate) fn launch_outs(
        &self,
        key: &str,
        src: impl FnOnce() -> String,
        inputs: &[&WgpuStorage],
        outs: &[&WgpuStorage],
        params: &[u32],
        groups: (u32, u32, u32),
    ) -> Result<()> {
        let k = self.ctx.kernel(key, inputs.len(), outs.len(), false, src)?;
        let ins: Vec<&wgpu::Buffer> = inputs.iter().map(|s| s.buf.raw()).collect();
        let os: Vec<&wgpu::Buffer> = outs.iter().map(|s| s.buf.raw()).collect();
        self.ctx.dispatch(&k, &ins, &os, params, groups)
    }

    /// A one-dimensional launch over `n` invocations producing `len` elements of `dtype`.
    pub(crate) fn map_kernel(
        &self,
        key: &str,
        src: impl FnOnce() -> String,
        inputs: &[&WgpuStorage],
        n: usize,
        dtype: DType,
        params: &[u32],
    ) -> Result<WgpuStorage> {
        let out = self.alloc(n, dtype)?;
        self.launch(key, src, inputs, &out, params, groups_1d(n))?;
        Ok(out)
    }

    /// Integer ids of `s` on the host: the copy kept at upload, else a read-back.
    pub(crate) fn host_ids(&self, s: &WgpuStorage, op: &'static str) -> Result<Arc<Vec<i64>>> {
        if !matches!(s.dtype, DType::I64 | DType::I32) {
            return Err(Error::UnsupportedDType { op, dtype: s.dtype });
        }
        if let Some(h) = &s.host_ids {
            return Ok(h.clone());
        }
        let bytes = self.ctx.read(s.buf.raw(), s.len as u64 * 4)?;
        let v: Vec<i32> = bytemuck::pod_collect_to_vec(&bytes);
        Ok(Arc::new(v.into_iter().map(i64::from).collect()))
    }
}

/// wgpu storage: a pooled device buffer (of 32-bit words, or packed f16 for F16 on a device
/// with [`Wgpu::has_f16`]), its element count and logical dtype. Clones share the buffer; it returns to the pool when the last one drops.
#[derive(Clone, Debug)]
pub struct WgpuStorage {
    buf: Arc<DevBuf>,
    len: usize,
    dtype: DType,
    /// The ids as uploaded, for integer storages made from host data: the bounds checks of
    /// the index ops read them here instead of reading the device back, and an I64 value
    /// beyond the device's i32 (stored saturated) keeps its exact value for those checks
    /// and for download.
    host_ids: Option<Arc<Vec<i64>>>,
}

impl WgpuStorage {
    /// The number of elements.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True when the storage holds no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Fills the `$NAME` placeholders of a kernel template.
pub(crate) fn tpl(src: &str, subs: &[(&str, &str)]) -> String {
    let mut s = src.to_string();
    for (k, v) in subs {
        s = s.replace(k, v);
    }
    s
}

/// A u32 kernel parameter, or an error when `x` does not fit.
pub(crate) fn u32p(x: usize, what: &str) -> Result<u32> {
    u32::try_from(x).map_err(|_| err(format!("{what} = {x} exceeds the 32-bit indexing of the wgpu kernels")))
}

pub(crate) fn check_len(s: &WgpuStorage, shape: &Shape, op: &'static str) -> Result<()> {
    if s.len != shape.elem_count() {
        return Err(Error::ElementCount { op, shape: shape.clone(), expected: shape.elem_count(), got: s.len });
    }
    Ok(())
}

pub(crate) fn check_same(a: &WgpuStorage, b: &WgpuStorage, op: &'static str) -> Result<DType> {
    if a.dtype != b.dtype {
        return Err(Error::DTypeMismatch { op, lhs: a.dtype, rhs: b.dtype });
    }
    Ok(a.dtype)
}

fn unsupported_f64(dt: DType, op: &'static str) -> Result<()> {
    if dt == DType::F64 {
        return Err(Error::UnsupportedDType { op, dtype: dt });
    }
    Ok(())
}

/// The operand dtype of a fused op: a float other than F64 (which the device lacks).
fn fused_float(x: &WgpuStorage, op: &'static str) -> Result<DType> {
    if !x.dtype.is_float() || x.dtype == DType::F64 {
        return Err(Error::UnsupportedDType { op, dtype: x.dtype });
    }
    Ok(x.dtype)
}

impl Backend for Wgpu {
    type Storage = WgpuStorage;
    redco_core::comm_slot!(Wgpu);

    fn name(&self) -> String {
        "wgpu".into()
    }
    fn supports(&self, dtype: DType) -> bool {
        dtype != DType::F64
    }
    fn memory_stats(&self) -> Option<MemoryStats> {
        Some(self.ctx.pool().stats())
    }
    fn reset_peak_memory(&self) {
        self.ctx.pool().reset_peak()
    }
    fn upload(&self, data: &HostData) -> Result<WgpuStorage> {
        let dtype = data.dtype();
        let (bytes, host_ids): (Vec<u8>, Option<Arc<Vec<i64>>>) = match data {
            HostData::F32(v) => (bytemuck::cast_slice(v).to_vec(), None),
            HostData::F16(v) if self.ctx.f16 => (bytemuck::cast_slice(v).to_vec(), None),
            HostData::F16(_) | HostData::BF16(_) => (bytemuck::cast_slice(&data.to_f32_vec()).to_vec(), None),
            HostData::F64(_) => return Err(Error::UnsupportedDType { op: "wgpu upload", dtype }),
            HostData::I32(v) => {
                (bytemuck::cast_slice(v).to_vec(), Some(Arc::new(v.iter().map(|&x| x as i64).collect())))
            }
            HostData::I64(v) => {
                let w: Vec<i32> = v.iter().map(|&x| x.clamp(i32::MIN as i64, i32::MAX as i64) as i32).collect();
                (bytemuck::cast_slice(&w).to_vec(), Some(Arc::new(v.clone())))
            }
            HostData::U8(v) => {
                let w: Vec<u32> = v.iter().map(|&x| x as u32).collect();
                (bytemuck::cast_slice(&w).to_vec(), None)
            }
        };
        let buf = self.ctx.upload_bytes(&bytes)?;
        Ok(WgpuStorage { buf: Arc::new(buf), len: data.len(), dtype, host_ids })
    }
    fn download(&self, s: &WgpuStorage) -> Result<HostData> {
        if let Some(h) = &s.host_ids {
            return Ok(match s.dtype {
                DType::I32 => HostData::I32(h.iter().map(|&x| x as i32).collect()),
                _ => HostData::I64(h.to_vec()),
            });
        }
        let bytes = self.ctx.read(s.buf.raw(), s.len as u64 * self.elem_bytes(s.dtype))?;
        if self.packed(s.dtype) {
            return Ok(HostData::F16(bytemuck::pod_collect_to_vec(&bytes)));
        }
        Ok(match Dev::of(s.dtype) {
            Dev::F32 => HostData::from_f32(bytemuck::pod_collect_to_vec(&bytes), s.dtype),
            Dev::I32 => {
                let v: Vec<i32> = bytemuck::pod_collect_to_vec(&bytes);
                match s.dtype {
                    DType::I32 => HostData::I32(v),
                    _ => HostData::I64(v.into_iter().map(i64::from).collect()),
                }
            }
            Dev::U32 => {
                let v: Vec<u32> = bytemuck::pod_collect_to_vec(&bytes);
                HostData::U8(v.into_iter().map(|x| x.min(255) as u8).collect())
            }
        })
    }
    fn storage_dtype(&self, s: &WgpuStorage) -> DType {
        s.dtype
    }
    fn sync(&self) -> Result<()> {
        self.ctx.wait()
    }

    fn full(&self, n: usize, value: f64, dtype: DType) -> Result<WgpuStorage> {
        unsupported_f64(dtype, "full")?;
        elementwise::full(self, n, value, dtype)
    }
    fn unary(&self, op: UnaryOp, x: &WgpuStorage, n: usize) -> Result<WgpuStorage> {
        if !x.dtype.is_float() {
            return Err(Error::UnsupportedDType { op: "unary", dtype: x.dtype });
        }
        elementwise::unary(self, op, x, n.min(x.len))
    }
    fn binary(
        &self,
        op: BinaryOp,
        a: (&WgpuStorage, &Shape),
        b: (&WgpuStorage, &Shape),
        out: &Shape,
    ) -> Result<WgpuStorage> {
        check_same(a.0, b.0, "binary")?;
        check_len(a.0, a.1, "binary")?;
        check_len(b.0, b.1, "binary")?;
        elementwise::binary(self, op, a, b, out)
    }
    fn compare(
        &self,
        op: CmpOp,
        a: (&WgpuStorage, &Shape),
        b: (&WgpuStorage, &Shape),
        out: &Shape,
    ) -> Result<WgpuStorage> {
        check_same(a.0, b.0, "compare")?;
        check_len(a.0, a.1, "compare")?;
        check_len(b.0, b.1, "compare")?;
        elementwise::compare(self, op, a, b, out)
    }
    fn where_cond(
        &self,
        c: (&WgpuStorage, &Shape),
        a: (&WgpuStorage, &Shape),
        b: (&WgpuStorage, &Shape),
        out: &Shape,
    ) -> Result<WgpuStorage> {
        check_same(a.0, b.0, "where_cond")?;
        check_len(c.0, c.1, "where_cond (condition)")?;
        check_len(a.0, a.1, "where_cond")?;
        check_len(b.0, b.1, "where_cond")?;
        if c.0.dtype != DType::U8 {
            return Err(Error::UnsupportedDType { op: "where_cond (condition)", dtype: c.0.dtype });
        }
        elementwise::where_cond(self, c, a, b, out)
    }
    fn matmul(&self, a: &WgpuStorage, b: &WgpuStorage, spec: &MatmulSpec) -> Result<WgpuStorage> {
        let dt = check_same(a, b, "matmul")?;
        if !dt.is_float() {
            return Err(Error::UnsupportedDType { op: "matmul", dtype: dt });
        }
        matmul::matmul(self, a, b, spec, dt)
    }
    fn reduce(&self, op: ReduceOp, x: &WgpuStorage, shape: &Shape, dim: usize) -> Result<WgpuStorage> {
        check_len(x, shape, "reduce")?;
        reduce::reduce(self, op, x, shape, dim)
    }
    fn cast(&self, x: &WgpuStorage, n: usize, dtype: DType) -> Result<WgpuStorage> {
        unsupported_f64(dtype, "cast")?;
        elementwise::cast(self, x, n.min(x.len), dtype)
    }
    fn permute(&self, x: &WgpuStorage, shape: &Shape, perm: &[usize]) -> Result<WgpuStorage> {
        check_len(x, shape, "permute")?;
        layout::permute(self, x, shape, perm)
    }
    fn expand(&self, x: &WgpuStorage, shape: &Shape, out: &Shape) -> Result<WgpuStorage> {
        check_len(x, shape, "expand")?;
        layout::expand(self, x, shape, out)
    }
    fn narrow(&self, x: &WgpuStorage, shape: &Shape, dim: usize, start: usize, len: usize) -> Result<WgpuStorage> {
        check_len(x, shape, "narrow")?;
        layout::narrow(self, x, shape, dim, start, len)
    }
    fn cat(&self, xs: &[(&WgpuStorage, &Shape)], dim: usize) -> Result<WgpuStorage> {
        for (s, sh) in xs {
            check_len(s, sh, "cat")?;
        }
        layout::cat(self, xs, dim)
    }
    fn index_select(
        &self,
        x: &WgpuStorage,
        shape: &Shape,
        dim: usize,
        ids: &WgpuStorage,
        n_ids: usize,
    ) -> Result<WgpuStorage> {
        check_len(x, shape, "index_select")?;
        index::index_select(self, x, shape, dim, ids, n_ids)
    }
    fn index_add(
        &self,
        x: &WgpuStorage,
        shape: &Shape,
        dim: usize,
        ids: &WgpuStorage,
        src: &WgpuStorage,
    ) -> Result<WgpuStorage> {
        check_len(x, shape, "index_add")?;
        check_same(x, src, "index_add")?;
        index::index_add(self, x, shape, dim, ids, src)
    }
    fn gather(
        &self,
        x: &WgpuStorage,
        shape: &Shape,
        dim: usize,
        idx: &WgpuStorage,
        idx_shape: &Shape,
    ) -> Result<WgpuStorage> {
        check_len(x, shape, "gather")?;
        check_len(idx, idx_shape, "gather (index)")?;
        index::gather(self, x, shape, dim, idx, idx_shape)
    }
    fn scatter_add(
        &self,
        x: &WgpuStorage,
        shape: &Shape,
        dim: usize,
        idx: &WgpuStorage,
        idx_shape: &Shape,
        src: &WgpuStorage,
    ) -> Result<WgpuStorage> {
        check_len(x, shape, "scatter_add")?;
        check_len(idx, idx_shape, "scatter_add (index)")?;
        check_len(src, idx_shape, "scatter_add (source)")?;
        check_same(x, src, "scatter_add")?;
        index::scatter_add(self, x, shape, dim, idx, idx_shape, src)
    }

    fn softmax(&self, x: &WgpuStorage, shape: &Shape) -> Result<WgpuStorage> {
        fused_float(x, "softmax")?;
        check_len(x, shape, "softmax")?;
        softmax::softmax(self, x, shape, false)
    }
    fn log_softmax(&self, x: &WgpuStorage, shape: &Shape) -> Result<WgpuStorage> {
        fused_float(x, "log_softmax")?;
        check_len(x, shape, "log_softmax")?;
        softmax::softmax(self, x, shape, true)
    }
    fn layer_norm(
        &self,
        x: &WgpuStorage,
        shape: &Shape,
        weight: Option<&WgpuStorage>,
        bias: Option<&WgpuStorage>,
        eps: f64,
    ) -> Result<WgpuStorage> {
        fused_float(x, "layer_norm")?;
        check_len(x, shape, "layer_norm")?;
        norm::norm(self, x, shape, weight, bias, eps, true)
    }
    fn rms_norm(&self, x: &WgpuStorage, shape: &Shape, weight: Option<&WgpuStorage>, eps: f64) -> Result<WgpuStorage> {
        fused_float(x, "rms_norm")?;
        check_len(x, shape, "rms_norm")?;
        norm::norm(self, x, shape, weight, None, eps, false)
    }
    fn rotary(
        &self,
        x: &WgpuStorage,
        shape: &Shape,
        cos: &WgpuStorage,
        sin: &WgpuStorage,
        cs_shape: &Shape,
        mode: RotaryMode,
    ) -> Result<WgpuStorage> {
        fused_float(x, "rotary")?;
        check_len(x, shape, "rotary")?;
        rotary::rotary(self, x, shape, cos, sin, cs_shape, mode)
    }
    fn adamw(
        &self,
        x: &WgpuStorage,
        g: &WgpuStorage,
        m: &WgpuStorage,
        v: &WgpuStorage,
        n: usize,
        step: &AdamStep,
    ) -> Result<(WgpuStorage, WgpuStorage, WgpuStorage)> {
        fused_float(x, "adamw")?;
        adamw::adamw(self, x, g, m, v, n, step)
    }
    fn cross_entropy(
        &self,
        logits: &WgpuStorage,
        shape: &Shape,
        targets: &WgpuStorage,
        ignore_index: i64,
    ) -> Result<WgpuStorage> {
        fused_float(logits, "cross_entropy")?;
        check_len(logits, shape, "cross_entropy")?;
        cross_entropy::cross_entropy(self, logits, shape, targets, ignore_index)
    }
    fn paged_attention(
        &self,
        q: &WgpuStorage,
        k: &WgpuStorage,
        v: &WgpuStorage,
        spec: &redco_core::ops::paged_attention::PagedSpec<'_>,
    ) -> Result<Option<WgpuStorage>> {
        paged_attention::paged_attention(self, q, k, v, spec)
    }
    fn attention(
        &self,
        q: &WgpuStorage,
        k: &WgpuStorage,
        v: &WgpuStorage,
        mask: Option<&WgpuStorage>,
        spec: &AttentionSpec,
    ) -> Result<WgpuStorage> {
        fused_float(q, "attention")?;
        match attention::attention(self, q, k, v, mask, spec)? {
            Some(out) => Ok(out),
            None => redco_core::ops::attention::composite_attention(self, q, k, v, mask, spec),
        }
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
pub(crate) use tests::test_device;
