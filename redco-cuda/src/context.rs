//! [`Cuda`]: one GPU, its stream, its allocator and its compiled kernels.

use crate::alloc::{MemoryStats, Pool, Source};
use crate::device::{err, require_driver};
use crate::kernels;
use crate::profile::{op_family, Profiler};
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, LaunchConfig};
use redco_core::{DType, Result};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// The CUDA backend on one GPU. Cheap to clone (the clones share the device).
#[derive(Clone)]
pub struct Cuda {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) pool: Arc<Pool>,
    pub(crate) arch: String,
    pub(crate) name: String,
    modules: Mutex<HashMap<&'static str, Arc<CudaModule>>>,
    functions: Mutex<HashMap<String, Kernel>>,
    pub(crate) blas: Mutex<Option<Arc<cudarc::cublas::CudaBlas>>>,
    pub(crate) profiler: Profiler,
    /// f32 GEMMs on TF32 tensor cores ([`Cuda::set_tf32`]).
    pub(crate) tf32: std::sync::atomic::AtomicBool,
}

/// A compiled kernel and the op family its time is counted in
/// ([`crate::profile::op_family`]).
#[derive(Clone)]
pub(crate) struct Kernel {
    f: CudaFunction,
    family: &'static str,
}

impl std::fmt::Debug for Cuda {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Cuda({}, {})", self.inner.name, self.inner.arch)
    }
}

/// Device memory from the driver, in the backend's context.
struct Driver(Arc<CudaContext>);

impl Source for Driver {
    fn alloc(&self, bytes: usize) -> Result<CUdeviceptr> {
        self.0.bind_to_thread().map_err(err)?;
        // SAFETY: the context is current; the buffer is owned by the pool until freed
        unsafe { cudarc::driver::result::malloc_sync(bytes) }.map_err(err)
    }
    fn free(&self, ptrs: &[CUdeviceptr]) {
        if self.0.bind_to_thread().is_ok() {
            // SAFETY: every pointer came from alloc and no tensor holds it any more; the
            // context is synchronised first (once for all), so no queued kernel still reads
            // them
            unsafe {
                let _ = self.0.synchronize();
                for &p in ptrs {
                    let _ = cudarc::driver::result::free_sync(p);
                }
            }
        }
    }
}

impl Cuda {
    /// The backend on GPU `ordinal`; a clear error when there is no driver or no such GPU.
    pub fn new(ordinal: usize) -> Result<Cuda> {
        require_driver()?;
        let n = CudaContext::device_count().map_err(|e| err(format!("cannot count GPUs: {e}")))?;
        if ordinal >= n.max(0) as usize {
            return Err(err(format!("there is no GPU {ordinal}: the driver sees {n}")));
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| err(format!("cannot open GPU {ordinal}: {e}")))?;
        // one stream orders every kernel and copy: buffers need no event tracking
        // SAFETY: called before any buffer of this context exists
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.default_stream();
        let name = ctx.name().map_err(err)?;
        let arch = kernels::arch_of(ctx.compute_capability().map_err(err)?);
        let pool = Pool::new(Box::new(Driver(ctx.clone())));
        Ok(Cuda {
            inner: Arc::new(Inner {
                ctx,
                stream,
                pool,
                arch,
                name,
                modules: Mutex::new(HashMap::new()),
                functions: Mutex::new(HashMap::new()),
                blas: Mutex::new(None),
                profiler: Profiler::default(),
                tf32: std::sync::atomic::AtomicBool::new(false),
            }),
        })
    }

    /// Runs f32 matmuls on TF32 tensor cores (about 10 bits of mantissa in the products,
    /// f32 accumulation: torch's `allow_tf32`) when `on`; off by default (exact f32).
    pub fn set_tf32(&self, on: bool) {
        self.inner.tf32.store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether f32 matmuls run as TF32 ([`Cuda::set_tf32`]).
    pub fn tf32(&self) -> bool {
        self.inner.tf32.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The GPU's name and architecture.
    pub fn describe(&self) -> String {
        format!("{} ({})", self.inner.name, self.inner.arch)
    }

    /// The allocator's counters (high-water mark included).
    pub fn memory(&self) -> MemoryStats {
        self.inner.pool.stats()
    }

    /// Frees the allocator's cached buffers.
    pub fn release_cached(&self) {
        self.inner.pool.release();
    }

    /// The kernel `name` of `family`, compiling the family for this GPU on first use.
    pub(crate) fn function(&self, family: &'static str, name: &str) -> Result<Kernel> {
        let key = format!("{family}/{name}");
        if let Some(f) = self.inner.functions.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
            return Ok(f.clone());
        }
        let module = {
            let mut mods = self.inner.modules.lock().unwrap_or_else(|e| e.into_inner());
            match mods.get(family) {
                Some(m) => m.clone(),
                None => {
                    let c = kernels::compile(family, &self.inner.arch)?;
                    let m = self
                        .inner
                        .ctx
                        .load_module(c.ptx)
                        .map_err(|e| err(format!("cannot load kernels/{family}.cu: {e}")))?;
                    mods.insert(family, m.clone());
                    m
                }
            }
        };
        let f =
            module.load_function(name).map_err(|e| err(format!("kernels/{family}.cu has no kernel {name}: {e}")))?;
        let k = Kernel { f, family: op_family(family, name) };
        self.inner.functions.lock().unwrap_or_else(|e| e.into_inner()).insert(key, k.clone());
        Ok(k)
    }

    /// Launches `k` with `cfg`; `args` pushes the kernel's arguments in order.
    pub(crate) fn launch<'a>(
        &'a self,
        k: &'a Kernel,
        cfg: LaunchConfig,
        args: impl FnOnce(&mut cudarc::driver::LaunchArgs<'a>),
    ) -> Result<()> {
        self.timed(k.family, || {
            let mut b = self.inner.stream.launch_builder(&k.f);
            args(&mut b);
            // SAFETY: every kernel's argument list is pushed by its one host wrapper, which
            // passes buffers of the lengths the kernel indexes
            unsafe { b.launch(cfg) }.map(|_| ()).map_err(|e| err(format!("kernel launch failed: {e}")))
        })
    }

    /// The cuBLAS handle on this backend's stream, created on first use.
    pub(crate) fn blas(&self) -> Result<Arc<cudarc::cublas::CudaBlas>> {
        let mut b = self.inner.blas.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(h) = b.as_ref() {
            return Ok(h.clone());
        }
        if !crate::device::cublas_present() {
            return Err(err("cuBLAS is not available: libcublas.so could not be loaded (it comes with the CUDA toolkit or the nvidia-cublas wheel)"));
        }
        let h = Arc::new(
            cudarc::cublas::CudaBlas::new(self.inner.stream.clone())
                .map_err(|e| err(format!("cannot create a cuBLAS handle: {e}")))?,
        );
        *b = Some(h.clone());
        Ok(h)
    }
}

/// The kernels' name for a dtype.
pub(crate) fn tn(dt: DType) -> &'static str {
    match dt {
        DType::F32 => "f32",
        DType::F64 => "f64",
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        DType::I64 => "i64",
        DType::I32 => "i32",
        DType::U8 => "u8",
    }
}
