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
mod elementwise;
mod index;
mod layout;
mod matmul;
mod norm;
mod reduce;
mod rotary;
mod rows;
mod softmax;

use device::{err, groups_1d, Ctx, DevBuf};
use redco_core::backend::{BinaryOp, CmpOp, MatmulSpec, ReduceOp, RotaryMode, UnaryOp};
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

    /// True when storages of `dt` hold packed f16 on this device.
    pub(crate) fn packed(&self, dt: DType) -> bool {
        dt == DType::F16 && self.ctx.f16
    }
    /// The WGSL element type of a storage of `dt` (`f16` when packed, else that of
    /// [`Dev::of`]).
    pub(crate) fn elem(&self, dt: DType) -> &'static str {
        if self.packed(dt) {
            "f16"
        } else {
            Dev::of(dt).wgsl()
        }
    }
    /// The WGSL element type of a storage of `dt` for a kernel that binds it as `ty` (its
    /// compute type): `f16` when packed, else `ty`.
    pub(crate) fn elem_as(&self, dt: DType, ty: &'static str) -> &'static str {
        if self.packed(dt) {
            "f16"
        } else {
            ty
        }
    }
    /// The WGSL element type of a storage of `dt` for the kernels that copy bits without
    /// looking at them (`f16` when packed, else `u32`).
    pub(crate) fn bits(&self, dt: DType) -> &'static str {
        if self.packed(dt) {
            "f16"
        } else {
            "u32"
        }
    }
    /// The WGSL function storing a computed value (f32 for floats, i32 for integers) into a
    /// storage of `dt`: [`store_fn`], or `st_f16` (round, then convert) when packed.
    pub(crate) fn store(&self, dt: DType) -> &'static str {
        if self.packed(dt) {
            "st_f16"
        } else {
            store_fn(dt)
        }
    }
    /// Bytes per element of a storage of `dt` on this device.
    pub(crate) fn elem_bytes(&self, dt: DType) -> u64 {
        if self.packed(dt) {
            2
        } else {
            4
        }
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

/// The device element type of a logical dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dev {
    F32,
    I32,
    U32,
}

impl Dev {
    pub(crate) fn of(dt: DType) -> Dev {
        match dt {
            DType::F32 | DType::F16 | DType::BF16 | DType::F64 => Dev::F32,
            DType::I64 | DType::I32 => Dev::I32,
            DType::U8 => Dev::U32,
        }
    }
    pub(crate) fn wgsl(self) -> &'static str {
        match self {
            Dev::F32 => "f32",
            Dev::I32 => "i32",
            Dev::U32 => "u32",
        }
    }
}

/// The WGSL function that stores a computed value in `dt` (float kernels compute in f32,
/// integer ones in i32).
pub(crate) fn store_fn(dt: DType) -> &'static str {
    match dt {
        DType::F16 => "round_f16",
        DType::BF16 => "round_bf16",
        DType::F32 | DType::F64 => "keep",
        DType::I64 | DType::I32 => "keep_i",
        DType::U8 => "sat_u8",
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

    fn name(&self) -> String {
        "wgpu".into()
    }
    fn supports(&self, dtype: DType) -> bool {
        dtype != DType::F64
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

/// A device for the unit tests: `None` (with a note) without an adapter, a panic then with
/// `REDCO_REQUIRE_WGPU=1`.
#[cfg(test)]
pub(crate) fn test_device() -> Option<Wgpu> {
    match Wgpu::new() {
        Ok(w) => Some(w),
        Err(e) if std::env::var("REDCO_REQUIRE_WGPU").is_ok_and(|v| v == "1") => {
            panic!("REDCO_REQUIRE_WGPU=1 but no wgpu adapter: {e}")
        }
        Err(e) => {
            eprintln!("skipped: no wgpu adapter: {e}");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With `SHADER_F16`, an f16 tensor takes 2 bytes per element on the device (4 with
    /// the f32-word layout, and always for bf16) and round-trips exactly.
    #[test]
    fn f16_storage_is_packed_when_the_adapter_has_shader_f16() {
        let Some(w) = test_device() else { return };
        let n = 1001;
        let v: Vec<half::f16> = (0..n).map(|i| half::f16::from_f32(i as f32 * 0.37 - 150.0)).collect();
        let x = w.upload(&HostData::F16(v.clone())).unwrap();
        let y = w.alloc(n, DType::F16).unwrap();
        let b = w.alloc(n, DType::BF16).unwrap();
        println!("has_f16: {}, f16 buffer {} bytes for {n} elements", w.has_f16(), y.buf.raw().size());
        let per_elem = if w.has_f16() { 2 } else { 4 };
        assert_eq!(w.elem_bytes(DType::F16), per_elem);
        assert_eq!(w.elem_bytes(DType::BF16), 4);
        for s in [&x, &y] {
            let size = s.buf.raw().size();
            assert!(size >= n as u64 * per_elem && size < n as u64 * per_elem * 5 / 4 + 256, "{size}");
        }
        assert!(b.buf.raw().size() >= n as u64 * 4);
        let wanted_f16 = std::env::var("REDCO_WGPU_F16").map_or(true, |v| v.trim() != "0");
        let offered = device::adapters()
            .iter()
            .find(|a| a.get_info().name == w.ctx.info.name && a.get_info().backend == w.ctx.info.backend)
            .is_some_and(|a| a.features().contains(wgpu::Features::SHADER_F16));
        assert_eq!(w.has_f16(), wanted_f16 && offered);
        assert_eq!(w.download(&x).unwrap(), HostData::F16(v));
    }

    /// Every op family on f16 gives bit-identical results with packed f16 and with the
    /// f32-word layout (both compute in f32 and round to f16 on every store).
    #[test]
    fn f16_packed_and_f32_word_layouts_agree_bit_for_bit() {
        let Some(packed) = test_device() else { return };
        if !packed.has_f16() {
            eprintln!("skipped: the device has no packed f16 (no SHADER_F16 or REDCO_WGPU_F16=0)");
            return;
        }
        let words = Wgpu { ctx: Arc::new(Ctx::open_with(false).unwrap()) };
        assert!(!words.has_f16());
        let results = |w: &Wgpu| -> Vec<HostData> { f16_workload(w).unwrap() };
        let (a, b) = (results(&packed), results(&words));
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            assert_eq!(x, y, "result {i} differs between the layouts");
        }
    }

    fn f16_workload(w: &Wgpu) -> Result<Vec<HostData>> {
        let h = |n: usize, s: f32| -> HostData {
            HostData::F16((0..n).map(|i| half::f16::from_f32(((i * 37 % 23) as f32 / 7.0 - 1.5) * s)).collect())
        };
        let sh = |d: &[usize]| Shape::new(d.to_vec());
        let x = w.upload(&h(7 * 12, 1.0))?; // [7, 12]
        let y = w.upload(&h(12, 2.0))?; // [12]
        let xs = sh(&[7, 12]);
        let mut out = vec![
            w.unary(UnaryOp::Exp, &x, 84)?,
            w.unary(UnaryOp::GeluTanh, &x, 83)?,
            w.binary(BinaryOp::Mul, (&x, &xs), (&y, &sh(&[12])), &xs)?,
            w.compare(CmpOp::Gt, (&x, &xs), (&y, &sh(&[12])), &xs)?,
        ];
        out.push(w.where_cond((&out[3], &xs), (&x, &xs), (&y, &sh(&[12])), &xs)?);
        out.push(w.full(5, 1.2345, DType::F16)?);
        let f = w.cast(&x, 84, DType::F32)?;
        out.push(w.cast(&w.unary(UnaryOp::Affine { mul: 1.001, add: 0.0 }, &f, 84)?, 84, DType::F16)?);
        out.push(w.cast(&x, 84, DType::BF16)?);
        out.push(w.cast(&out[7], 84, DType::F16)?);
        out.push(w.cast(&x, 84, DType::I32)?);
        out.push(w.cast(&out[9], 84, DType::F16)?);
        out.push(f);
        out.push(w.permute(&x, &xs, &[1, 0])?);
        out.push(w.narrow(&x, &xs, 1, 3, 5)?);
        out.push(w.narrow(&x, &xs, 0, 1, 3)?);
        out.push(w.cat(&[(&x, &xs), (&y, &sh(&[1, 12]))], 0)?);
        out.push(w.expand(&y, &sh(&[1, 12]), &xs)?);
        for op in [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::ArgMax] {
            out.push(w.reduce(op, &x, &xs, 1)?);
            out.push(w.reduce(op, &x, &xs, 0)?);
        }
        let long = w.upload(&h(3 * 700, 0.5))?;
        out.push(w.reduce(ReduceOp::Sum, &long, &sh(&[3, 700]), 1)?);
        out.push(w.reduce(ReduceOp::Max, &long, &sh(&[3, 700]), 1)?);
        let ids = w.upload(&HostData::I64(vec![3, 0, 3, 6]))?;
        out.push(w.index_select(&x, &xs, 0, &ids, 4)?);
        let src = w.upload(&h(4 * 12, 3.0))?;
        out.push(w.index_add(&x, &xs, 0, &ids, &src)?);
        let gi = w.upload(&HostData::I64((0..84).map(|i| (i * 5 % 12) as i64).collect()))?;
        out.push(w.gather(&x, &xs, 1, &gi, &xs)?);
        out.push(w.scatter_add(&x, &xs, 1, &gi, &xs, &x)?);
        for (m, n, k) in [(7, 12, 12), (7, 5, 12), (8, 12, 4)] {
            let spec =
                MatmulSpec { batch: 1, m, n, k, trans_a: false, trans_b: true, a_batched: true, b_batched: true };
            out.push(w.matmul(&x, &w.upload(&h(n * k, 0.5))?, &spec)?);
            let spec = MatmulSpec { trans_b: false, ..spec };
            out.push(w.matmul(&x, &w.upload(&h(n * k, 0.5))?, &spec)?);
        }
        out.push(w.softmax(&x, &xs)?);
        out.push(w.log_softmax(&x, &xs)?);
        out.push(w.layer_norm(&x, &xs, Some(&y), Some(&y), 1e-5)?);
        out.push(w.rms_norm(&x, &xs, Some(&y), 1e-5)?);
        let cs = w.upload(&h(7 * 3, 0.3))?;
        out.push(w.rotary(&x, &xs, &cs, &cs, &sh(&[7, 3]), RotaryMode::HalfSplit)?);
        out.push(w.rotary(&x, &xs, &cs, &cs, &sh(&[7, 3]), RotaryMode::Interleaved)?);
        let t = w.upload(&HostData::I64(vec![1, 0, -100, 11, 5, 2, 3]))?;
        out.push(w.cross_entropy(&x, &xs, &t, -100)?);
        let step =
            AdamStep { lr: 1e-2, beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.1, bias1: 0.1, bias2: 0.001 };
        let (p, m, v) = w.adamw(&x, &x, &x, &w.unary(UnaryOp::Abs, &x, 84)?, 84, &step)?;
        out.extend([p, m, v]);
        let q = w.upload(&h(2 * 3 * 8, 0.7))?;
        let spec = AttentionSpec {
            batch: 1,
            q_heads: 2,
            kv_heads: 1,
            q_len: 3,
            kv_len: 4,
            head_dim: 8,
            scale: 0.35,
            causal: true,
            mask_shape: None,
        };
        let kv = w.upload(&h(4 * 8, 0.9))?;
        out.push(w.attention(&q, &kv, &kv, None, &spec)?);
        out.iter().map(|s| w.download(s)).collect()
    }

    /// A device that goes away (here destroyed) makes the next op and read-back return an
    /// error, promptly, instead of hanging or panicking.
    #[test]
    fn a_lost_device_gives_an_error_not_a_hang() {
        let Some(w) = test_device() else { return };
        let x = w.upload(&HostData::F32(vec![1.0, 2.0, 3.0])).unwrap();
        let y = w.unary(UnaryOp::Exp, &x, 3).unwrap();
        w.download(&y).unwrap();
        w.ctx.device.destroy();
        let t0 = std::time::Instant::now();
        let r = w.unary(UnaryOp::Exp, &x, 3).and_then(|z| w.download(&z));
        let e = r.expect_err("an op on a destroyed device must fail");
        println!("after destroy: {e} ({:?})", t0.elapsed());
        assert!(e.to_string().contains("lost"), "{e}");
        assert!(t0.elapsed() < std::time::Duration::from_secs(30));
        // and it stays failed
        assert!(w.download(&x).is_err());
        assert!(w.sync().is_err());
    }
}
