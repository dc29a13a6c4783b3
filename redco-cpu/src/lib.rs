//! `redco-cpu`: the CPU backend, the embedded default of the `redco` facade (`cpu::Cpu`,
//! `--backend cpu`), implementing redco-core's [`Backend`] trait; also the host that
//! offloaded optimizers run on, and [`spmd_cpu`] for CPU ranks sharing the machine's cores.
//!
//! Storage is an immutable, reference-counted host buffer. f32 and f64 compute natively;
//! f16 and bf16 are stored as such and computed in f32. Kernels are generic over the float
//! type with the op chosen once per call (no per-element dispatch), and run on the
//! backend's own rayon pool, whose size is set at construction so that several ranks can
//! share the machine's cores. Matmul uses a generated GEMM (AVX-512F, or AVX2 + FMA) where
//! the CPU has one, the `gemm` crate elsewhere.

mod adamw;
mod attention;
mod bgemm;
mod block_cache;
#[cfg(test)]
mod core_tests;
mod cross_entropy;
mod elementwise;
mod grouped;
mod half_gemv;
mod half_rows;
mod index;
mod layout;
pub mod malloc;
mod matmul;
mod norm;
mod paged_attention;
mod quant;
pub mod real;
mod reduce;
mod rotary;
pub mod sgemm;
pub(crate) mod simd;
mod softmax;
mod strided;
#[cfg(target_arch = "x86_64")]
mod weight_cache;

pub use block_cache::{BlockStats, LargeBlocks};

use redco_core::backend::{BinaryOp, CmpOp, MatmulSpec, ReduceOp, RotaryMode, UnaryOp};
use redco_core::ops::attention::AttentionSpec;
use redco_core::{Backend, DType, Error, HostData, Result, Shape};
use std::sync::Arc;

/// The CPU backend: a rayon pool of a chosen size.
#[derive(Clone)]
pub struct Cpu {
    pool: Arc<rayon::ThreadPool>,
    threads: usize,
    /// The weights kept packed for the f32 GEMM (off unless hinted, see
    /// [`Backend::hint_constant_weights`]); shared by the clones of this backend.
    #[cfg(target_arch = "x86_64")]
    weights: Arc<weight_cache::WeightCache>,
}

impl std::fmt::Debug for Cpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cpu({} threads)", self.threads)
    }
}

impl Default for Cpu {
    /// A pool with one thread per available core.
    fn default() -> Self {
        Cpu::new(std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1))
    }
}

impl Cpu {
    /// A backend computing on `threads` threads (at least 1).
    ///
    /// Panics if the operating system refuses to start the threads; [`Cpu::try_new`]
    /// returns that as an error.
    pub fn new(threads: usize) -> Self {
        Self::try_new(threads).unwrap_or_else(|e| panic!("{e}"))
    }
    /// A backend computing on `threads` threads, or an error when the threads cannot start.
    ///
    /// Creating a backend changes nothing else in the process. A program that trains or
    /// serves models (rather than a library embedding the core) should also call
    /// [`malloc::tune`] once at start: it sets glibc's allocator up for tensor-sized buffers
    /// (measured: page faults were 15% of the first training steps' time without it).
    pub fn try_new(threads: usize) -> Result<Self> {
        let threads = threads.max(1);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("redco-cpu-{i}"))
            .build()
            .map_err(|e| Error::Backend {
                backend: "cpu".into(),
                msg: format!("cannot start {threads} threads: {e}"),
            })?;
        Ok(Cpu {
            pool: Arc::new(pool),
            threads,
            #[cfg(target_arch = "x86_64")]
            weights: Arc::default(),
        })
    }
    /// The number of compute threads.
    pub fn threads(&self) -> usize {
        self.threads
    }
    /// How many weights this backend keeps packed for its GEMM (see
    /// [`Backend::hint_constant_weights`]; 0 without the hint).
    pub fn packed_weights(&self) -> u64 {
        #[cfg(target_arch = "x86_64")]
        {
            self.weights.packed_count()
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            0
        }
    }
    /// Runs `f` on this backend's pool.
    pub(crate) fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        self.pool.install(f)
    }
}

/// CPU storage: an immutable shared host buffer.
#[derive(Clone, Debug)]
pub struct CpuStorage(pub(crate) Arc<HostData>);

impl CpuStorage {
    /// Wraps host data.
    pub fn new(h: HostData) -> Self {
        CpuStorage(Arc::new(h))
    }
    /// The host data.
    pub fn data(&self) -> &HostData {
        &self.0
    }
}

pub(crate) use redco_core::dtype::{floats, Floats};

/// Stores compute values back in `dtype`.
pub(crate) trait Store: Sized {
    fn store(v: Vec<Self>, dtype: DType) -> HostData;
}
impl Store for f32 {
    fn store(v: Vec<f32>, dtype: DType) -> HostData {
        HostData::from_f32(v, dtype)
    }
}
impl Store for f64 {
    fn store(v: Vec<f64>, dtype: DType) -> HostData {
        HostData::from_f64(&v, dtype)
    }
}

/// Runs a generic float kernel on the compute values of one or more same-typed buffers and
/// stores the result in `$dt`.
macro_rules! float_kernel {
    ($dt:expr, [$($h:expr => $v:ident),+], $body:expr) => {{
        #[allow(unused_parens)]
        match ($($crate::floats($h)),+) {
            ($($crate::Floats::F32($v)),+) => {
                $(let $v: &[f32] = &$v;)+
                <f32 as $crate::Store>::store($body, $dt)
            }
            ($($crate::Floats::F64($v)),+) => {
                $(let $v: &[f64] = &$v;)+
                <f64 as $crate::Store>::store($body, $dt)
            }
            #[allow(unreachable_patterns)]
            _ => return Err($crate::Error::invalid("cpu kernel", "operands have different dtypes")),
        }
    }};
}
pub(crate) use float_kernel;

/// Applies a generic copy kernel to any element type, keeping the type.
macro_rules! any_kernel {
    ($h:expr, $v:ident => $body:expr) => {
        match $h {
            HostData::F32($v) => HostData::F32($body),
            HostData::F64($v) => HostData::F64($body),
            HostData::F16($v) => HostData::F16($body),
            HostData::BF16($v) => HostData::BF16($body),
            HostData::I64($v) => HostData::I64($body),
            HostData::I32($v) => HostData::I32($body),
            HostData::U8($v) => HostData::U8($body),
        }
    };
}
pub(crate) use any_kernel;

fn st(h: HostData) -> Result<CpuStorage> {
    Ok(CpuStorage::new(h))
}

fn ids_of(s: &CpuStorage, op: &'static str) -> Result<Vec<i64>> {
    s.data().to_i64_vec().map_err(|_| Error::UnsupportedDType { op, dtype: s.data().dtype() })
}

impl Backend for Cpu {
    type Storage = CpuStorage;
    redco_core::comm_slot!(Cpu);

    fn name(&self) -> String {
        "cpu".into()
    }
    fn supports(&self, _dtype: DType) -> bool {
        true
    }
    fn upload(&self, data: &HostData) -> Result<CpuStorage> {
        st(data.clone())
    }
    fn download(&self, s: &CpuStorage) -> Result<HostData> {
        Ok((*s.0).clone())
    }
    fn download_shared(&self, s: &CpuStorage) -> Result<Arc<HostData>> {
        Ok(s.0.clone())
    }
    fn upload_owned(&self, data: HostData) -> Result<CpuStorage> {
        st(data)
    }
    fn upload_shared(&self, data: Arc<HostData>) -> Result<CpuStorage> {
        Ok(CpuStorage(data))
    }
    fn storage_dtype(&self, s: &CpuStorage) -> DType {
        s.0.dtype()
    }
    fn full(&self, n: usize, value: f64, dtype: DType) -> Result<CpuStorage> {
        st(self.run(|| elementwise::full(n, value, dtype)))
    }
    fn unary(&self, op: UnaryOp, x: &CpuStorage, _n: usize) -> Result<CpuStorage> {
        let dt = x.0.dtype();
        st(self.run(|| elementwise::unary(op, &x.0, dt))?)
    }
    fn binary(
        &self,
        op: BinaryOp,
        a: (&CpuStorage, &Shape),
        b: (&CpuStorage, &Shape),
        out: &Shape,
    ) -> Result<CpuStorage> {
        let dt = check_same(a.0, b.0, "binary")?;
        check_len(a.0, a.1, "binary")?;
        check_len(b.0, b.1, "binary")?;
        st(self.run(|| elementwise::binary(op, (&a.0 .0, a.1), (&b.0 .0, b.1), out, dt))?)
    }
    fn compare(
        &self,
        op: CmpOp,
        a: (&CpuStorage, &Shape),
        b: (&CpuStorage, &Shape),
        out: &Shape,
    ) -> Result<CpuStorage> {
        check_same(a.0, b.0, "compare")?;
        check_len(a.0, a.1, "compare")?;
        check_len(b.0, b.1, "compare")?;
        st(self.run(|| elementwise::compare(op, (&a.0 .0, a.1), (&b.0 .0, b.1), out))?)
    }
    fn where_cond(
        &self,
        c: (&CpuStorage, &Shape),
        a: (&CpuStorage, &Shape),
        b: (&CpuStorage, &Shape),
        out: &Shape,
    ) -> Result<CpuStorage> {
        check_same(a.0, b.0, "where_cond")?;
        check_len(c.0, c.1, "where_cond (condition)")?;
        check_len(a.0, a.1, "where_cond")?;
        check_len(b.0, b.1, "where_cond")?;
        let HostData::U8(cond) = &*c.0 .0 else {
            return Err(Error::UnsupportedDType { op: "where_cond (condition)", dtype: c.0 .0.dtype() });
        };
        st(self.run(|| elementwise::where_cond((cond, c.1), (&a.0 .0, a.1), (&b.0 .0, b.1), out)))
    }
    fn matmul(&self, a: &CpuStorage, b: &CpuStorage, spec: &MatmulSpec) -> Result<CpuStorage> {
        let dt = check_same(a, b, "matmul")?;
        #[cfg(target_arch = "x86_64")]
        if matches!(dt, DType::F32 | DType::BF16) && self.weights.is_on() {
            if let Some(c) = self.run(|| weight_cache::packed_product(&self.weights, &a.0, &b.0, spec, self.threads)) {
                return Ok(CpuStorage::new(HostData::from_f32(c, dt)));
            }
        }
        st(self.run(|| matmul::matmul(&a.0, &b.0, spec, dt, self.threads))?)
    }
    fn grouped_matmul(&self, x: &CpuStorage, w: &CpuStorage, spec: &redco_core::GroupedSpec) -> Result<CpuStorage> {
        match self.run(|| grouped::grouped_matmul(&x.0, &w.0, spec, self.threads)) {
            Some(r) => st(r?),
            None => redco_core::ops::grouped_matmul::composite_grouped_matmul(self, x, w, spec),
        }
    }
    fn quant_matmul(
        &self,
        x: &CpuStorage,
        w: &CpuStorage,
        spec: &redco_core::ops::quant_matmul::QuantMatmulSpec,
    ) -> Result<CpuStorage> {
        st(self.run(|| quant::quant_matmul(&x.0, &w.0, spec, self.threads))?)
    }
    fn hint_constant_weights(&self) {
        #[cfg(target_arch = "x86_64")]
        self.weights.switch_on();
    }
    fn reduce(&self, op: ReduceOp, x: &CpuStorage, shape: &Shape, dim: usize) -> Result<CpuStorage> {
        st(self.run(|| reduce::reduce(op, &x.0, shape, dim))?)
    }
    fn cast(&self, x: &CpuStorage, _n: usize, dtype: DType) -> Result<CpuStorage> {
        st(self.run(|| x.0.cast(dtype)))
    }
    fn permute(&self, x: &CpuStorage, shape: &Shape, perm: &[usize]) -> Result<CpuStorage> {
        st(self.run(|| layout::permute(&x.0, shape, perm)))
    }
    fn expand(&self, x: &CpuStorage, shape: &Shape, out: &Shape) -> Result<CpuStorage> {
        st(self.run(|| layout::expand(&x.0, shape, out)))
    }
    fn narrow(&self, x: &CpuStorage, shape: &Shape, dim: usize, start: usize, len: usize) -> Result<CpuStorage> {
        st(layout::narrow(&x.0, shape, dim, start, len))
    }
    fn cat(&self, xs: &[(&CpuStorage, &Shape)], dim: usize) -> Result<CpuStorage> {
        let parts: Vec<(&HostData, &Shape)> = xs.iter().map(|(s, sh)| (&*s.0, *sh)).collect();
        st(layout::cat(&parts, dim)?)
    }
    fn index_select(
        &self,
        x: &CpuStorage,
        shape: &Shape,
        dim: usize,
        ids: &CpuStorage,
        _n: usize,
    ) -> Result<CpuStorage> {
        let ids = ids_of(ids, "index_select (ids)")?;
        st(index::index_select(&x.0, shape, dim, &ids)?)
    }
    fn writes_rows_in_place(&self) -> bool {
        true
    }
    fn write_rows(
        &self,
        dst: &mut CpuStorage,
        (_, row_len): (usize, usize),
        rows: &CpuStorage,
        src: &CpuStorage,
        _k: usize,
    ) -> Result<()> {
        let rows = ids_of(rows, "write_rows (rows)")?;
        // in place when this storage is the buffer's only holder, else on a copy
        index::write_rows(Arc::make_mut(&mut dst.0), row_len, &rows, &src.0)
    }
    fn index_add(
        &self,
        x: &CpuStorage,
        shape: &Shape,
        dim: usize,
        ids: &CpuStorage,
        src: &CpuStorage,
    ) -> Result<CpuStorage> {
        let ids = ids_of(ids, "index_add (ids)")?;
        st(index::index_add(&x.0, shape, dim, &ids, &src.0)?)
    }
    fn gather(
        &self,
        x: &CpuStorage,
        shape: &Shape,
        dim: usize,
        idx: &CpuStorage,
        idx_shape: &Shape,
    ) -> Result<CpuStorage> {
        let idx = ids_of(idx, "gather (index)")?;
        st(index::gather(&x.0, shape, dim, &idx, idx_shape)?)
    }
    fn scatter_add(
        &self,
        x: &CpuStorage,
        shape: &Shape,
        dim: usize,
        idx: &CpuStorage,
        idx_shape: &Shape,
        src: &CpuStorage,
    ) -> Result<CpuStorage> {
        let idx = ids_of(idx, "scatter_add (index)")?;
        st(index::scatter_add(&x.0, shape, dim, &idx, idx_shape, &src.0)?)
    }

    fn softmax(&self, x: &CpuStorage, shape: &Shape) -> Result<CpuStorage> {
        st(self.run(|| softmax::softmax(&x.0, shape, false))?)
    }
    fn log_softmax(&self, x: &CpuStorage, shape: &Shape) -> Result<CpuStorage> {
        st(self.run(|| softmax::softmax(&x.0, shape, true))?)
    }
    fn layer_norm(
        &self,
        x: &CpuStorage,
        shape: &Shape,
        w: Option<&CpuStorage>,
        b: Option<&CpuStorage>,
        eps: f64,
    ) -> Result<CpuStorage> {
        st(self.run(|| norm::norm(&x.0, shape, w.map(|w| &*w.0), b.map(|b| &*b.0), eps, true))?)
    }
    fn rms_norm(&self, x: &CpuStorage, shape: &Shape, w: Option<&CpuStorage>, eps: f64) -> Result<CpuStorage> {
        st(self.run(|| norm::norm(&x.0, shape, w.map(|w| &*w.0), None, eps, false))?)
    }
    fn norm_backward(
        &self,
        x: &CpuStorage,
        shape: &Shape,
        w: Option<&CpuStorage>,
        g: &CpuStorage,
        eps: f64,
        rms: bool,
    ) -> Result<CpuStorage> {
        st(self.run(|| norm::norm_grad(&x.0, shape, w.map(|w| &*w.0), &g.0, eps, !rms))?)
    }
    fn adamw(
        &self,
        x: &CpuStorage,
        g: &CpuStorage,
        m: &CpuStorage,
        v: &CpuStorage,
        n: usize,
        step: &redco_core::ops::adamw::AdamStep,
    ) -> Result<(CpuStorage, CpuStorage, CpuStorage)> {
        match self.run(|| adamw::adamw(x, g, m, v, n, step))? {
            Some((a, b, c)) => Ok((CpuStorage::new(a), CpuStorage::new(b), CpuStorage::new(c))),
            None => redco_core::ops::adamw::composite_adamw(self, x, g, m, v, n, step),
        }
    }
    fn adamw_into(
        &self,
        x: &CpuStorage,
        g: &CpuStorage,
        m: &mut CpuStorage,
        v: &mut CpuStorage,
        n: usize,
        step: &redco_core::ops::adamw::AdamStep,
    ) -> Result<CpuStorage> {
        if let Some(nx) = self.run(|| adamw::adamw_in_place(x, g, m, v, n, step)) {
            return Ok(CpuStorage::new(nx));
        }
        let (nx, nm, nv) = self.adamw(x, g, m, v, n, step)?;
        *m = nm;
        *v = nv;
        Ok(nx)
    }
    fn enter(&self, f: &mut (dyn FnMut() + Send)) {
        self.pool.install(f)
    }
    fn rotary(
        &self,
        x: &CpuStorage,
        shape: &Shape,
        cos: &CpuStorage,
        sin: &CpuStorage,
        cs_shape: &Shape,
        mode: RotaryMode,
    ) -> Result<CpuStorage> {
        st(self.run(|| rotary::rotary(&x.0, shape, &cos.0, &sin.0, cs_shape, mode))?)
    }
    fn attention(
        &self,
        q: &CpuStorage,
        k: &CpuStorage,
        v: &CpuStorage,
        mask: Option<&CpuStorage>,
        spec: &AttentionSpec,
    ) -> Result<CpuStorage> {
        attention::attention(self, q, k, v, mask, spec)
    }
    fn paged_attention(
        &self,
        q: &CpuStorage,
        k: &CpuStorage,
        v: &CpuStorage,
        spec: &redco_core::ops::paged_attention::PagedSpec<'_>,
    ) -> Result<Option<CpuStorage>> {
        paged_attention::paged_attention(self, q, k, v, spec)
    }
    fn cross_entropy(
        &self,
        logits: &CpuStorage,
        shape: &Shape,
        targets: &CpuStorage,
        ignore: i64,
    ) -> Result<CpuStorage> {
        cross_entropy::forward(self, logits, shape, targets, ignore)
    }
    fn cross_entropy_backward(
        &self,
        logits: &CpuStorage,
        shape: &Shape,
        targets: &CpuStorage,
        ignore: i64,
        grad: &CpuStorage,
    ) -> Result<CpuStorage> {
        cross_entropy::backward(self, logits, shape, targets, ignore, grad)
    }
    fn attention_backward(
        &self,
        q: &CpuStorage,
        k: &CpuStorage,
        v: &CpuStorage,
        mask: Option<&CpuStorage>,
        dout: &CpuStorage,
        spec: &AttentionSpec,
    ) -> Result<(CpuStorage, CpuStorage, CpuStorage)> {
        attention::attention_backward(self, q, k, v, mask, dout, spec)
    }
}

/// Errors unless `s` holds exactly `shape.elem_count()` elements (a shape that does not
/// describe the buffer would otherwise read out of bounds).
fn check_len(s: &CpuStorage, shape: &Shape, op: &'static str) -> Result<()> {
    if s.0.len() != shape.elem_count() {
        return Err(Error::ElementCount { op, shape: shape.clone(), expected: shape.elem_count(), got: s.0.len() });
    }
    Ok(())
}

fn check_same(a: &CpuStorage, b: &CpuStorage, op: &'static str) -> Result<DType> {
    let (da, db) = (a.0.dtype(), b.0.dtype());
    if da != db {
        return Err(Error::DTypeMismatch { op, lhs: da, rhs: db });
    }
    Ok(da)
}

/// The fast f32 GEMM, when available: `c = a * b` with `a`, `b` given by (row, column)
/// strides. Returns false (leaving `c` untouched) when it does not apply.
#[allow(clippy::too_many_arguments)]
pub(crate) fn sgemm_hook(
    a: &[f32],
    b: &[f32],
    c: &mut [f32],
    m: usize,
    n: usize,
    k: usize,
    a_st: (usize, usize),
    b_st: (usize, usize),
    threads: usize,
) -> bool {
    if !sgemm_enabled() {
        return false;
    }
    let a = sgemm::MatRef { data: a, rs: a_st.0, cs: a_st.1 };
    let b = sgemm::MatRef { data: b, rs: b_st.0, cs: b_st.1 };
    sgemm::sgemm(m, n, k, a, b, c, n, false, threads)
}

/// The kernel families this machine runs, as benchmarks report them: the f32 GEMM
/// (`avx512` or `avx2`: the generated kernels; `gemm-crate`: the portable one), the bf16 GEMM
/// (`amx` or `avx512-bf16`, see [`bf16_gemm`]; else `f32 kernel, widened in packing`
/// where a generated f32 GEMM runs, or `widened to f32`), the element
/// loops (`avx512`, `avx2` or `baseline`) and the products against 16-bit weights (`avx512`,
/// `avx2` or `portable`).
pub fn kernel_families() -> String {
    let gemm = match sgemm::Isa::detect() {
        Some(isa) if sgemm_enabled() => isa.name(),
        _ => "gemm-crate",
    };
    let bf16 = match bf16_gemm() {
        Some(engine) => engine,
        None if sgemm_enabled() => "f32 kernel, widened in packing",
        None => "widened to f32",
    };
    format!("f32 GEMM {gemm}, bf16 GEMM {bf16}, element loops {}, 16-bit GEMV {}", simd::family(), half_gemv::family())
        + &format!(", quantized dots {}", quant::family())
}

/// True when bf16 matrix products run on AMX tiles (`TDPBF16PS`, f32 accumulation): the CPU
/// has AMX-BF16 (Sapphire Rapids and later Xeons), the OS grants this process the tile
/// state, and neither `REDCO_NO_AMX` nor `REDCO_ASSUME_NO_AVX512` is set. Elsewhere bf16
/// operands run on the f32 GEMM (widened as they are packed).
pub fn amx_bf16() -> bool {
    bgemm::Engine::Amx.runs() && bgemm::engine() == Some(bgemm::Engine::Amx)
}

/// True when this CPU and process can run the AVX512-BF16 bf16 GEMM (`VDPBF16PS`: AMD Zen 4
/// and later, Intel Cooper Lake and Sapphire Rapids), whether or not it is the one chosen
/// (AMX is preferred where it runs, and the engine is used only where `VDPBF16PS` outruns
/// f32 FMAs on this core, measured once per process). False under `REDCO_ASSUME_NO_AVX512`.
pub fn avx512_bf16() -> bool {
    bgemm::Engine::Dot.runs()
}

/// The kernel bf16 x bf16 matrix products run on in this process: `amx` (see
/// [`amx_bf16`]), `avx512-bf16` (where AMX does not run or `REDCO_NO_AMX` is set,
/// `REDCO_NO_BF16_DOT` is not, and `VDPBF16PS` outruns f32 FMAs here: AMD Zen 4 and later,
/// not Intel's cores), or `None`: the operands run on the f32 GEMM, widened as its packers
/// read them (or, without a generated GEMM, widened to f32 copies).
pub fn bf16_gemm() -> Option<&'static str> {
    bgemm::engine().map(bgemm::Engine::name)
}

pub(crate) use redco_core::host_simd::{avx2_fma, avx512f};

/// True when one of the generated GEMMs runs here: the CPU has AVX-512F (see [`avx512f`]) or
/// AVX2 with FMA, and
/// `REDCO_NO_SGEMM` is unset (set, the backend falls back to the `gemm` crate, for
/// comparisons). Read once per process; tests that want both paths in one process pass
/// [`matmul::F32Gemm`] instead.
pub(crate) fn sgemm_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("REDCO_NO_SGEMM").is_none() && sgemm::is_supported())
}

/// [`spmd`](fn@redco_core::runtime::spmd) on CPU ranks that share the machine's cores.
pub fn spmd_cpu<R: Send, F>(
    mesh: redco_core::runtime::Mesh,
    opts: &redco_core::runtime::SpmdOptions,
    f: F,
) -> Result<Vec<R>>
where
    F: Fn(&redco_core::runtime::Rank<Cpu>) -> Result<R> + Sync,
{
    redco_core::runtime::spmd(mesh, opts, |_, t| Cpu::try_new(t), f)
}
