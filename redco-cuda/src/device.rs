//! What CUDA the machine has: the driver library, its GPUs, and NVRTC. Every probe returns
//! an error that says what is missing instead of panicking (cudarc panics when a CUDA call
//! is made with no driver library present, so each entry point asks first).

use redco_core::{Error, Result};

/// One GPU as `redco info` lists it.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuInfo {
    /// The device ordinal.
    pub ordinal: usize,
    /// The device's name (`NVIDIA H200`).
    pub name: String,
    /// Total memory in bytes.
    pub memory: usize,
    /// Compute capability (major, minor).
    pub capability: (i32, i32),
}

impl std::fmt::Display for GpuInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (ma, mi) = self.capability;
        write!(
            f,
            "cuda:{} {} ({:.1} GiB, sm_{ma}{mi})",
            self.ordinal,
            self.name,
            self.memory as f64 / (1u64 << 30) as f64
        )
    }
}

/// The error of a backend call, named for the CUDA backend.
pub(crate) fn err(msg: impl std::fmt::Display) -> Error {
    Error::Backend { backend: "cuda".into(), msg: msg.to_string() }
}

/// Whether the CUDA driver library (`libcuda.so`) can be loaded.
pub fn driver_present() -> bool {
    // SAFETY: only tries to load the library; no CUDA call is made
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// Whether NVRTC (`libnvrtc.so`) can be loaded: kernels are compiled with it at first use.
pub fn nvrtc_present() -> bool {
    // SAFETY: as in driver_present
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Whether cuBLAS (`libcublas.so`) can be loaded: the GEMMs need it.
pub fn cublas_present() -> bool {
    // SAFETY: as in driver_present
    unsafe { cudarc::cublas::sys::is_culib_present() }
}

/// Fails with a clear message unless the driver library is present.
pub(crate) fn require_driver() -> Result<()> {
    if driver_present() {
        Ok(())
    } else {
        Err(err("no CUDA driver: libcuda.so could not be loaded (install the NVIDIA driver, or add its \
             directory to LD_LIBRARY_PATH); the cuda backend needs an NVIDIA GPU"))
    }
}

/// The machine's GPUs; an error when there is no driver, an empty list when the driver
/// sees no device.
pub fn devices() -> Result<Vec<GpuInfo>> {
    require_driver()?;
    let n = cudarc::driver::CudaContext::device_count().map_err(|e| err(format!("cannot count GPUs: {e}")))?;
    (0..n.max(0) as usize).map(info).collect()
}

/// One GPU's description (without creating a context on it).
fn info(ordinal: usize) -> Result<GpuInfo> {
    use cudarc::driver::result::device;
    let e = |what: &str, x: cudarc::driver::DriverError| err(format!("GPU {ordinal}: cannot read its {what}: {x}"));
    // SAFETY: the driver is present (checked by the caller) and initialised here
    unsafe {
        cudarc::driver::result::init().map_err(|x| e("driver", x))?;
        let dev = device::get(ordinal as i32).map_err(|x| e("handle", x))?;
        let name = device::get_name(dev).map_err(|x| e("name", x))?;
        let memory = device::total_mem(dev).map_err(|x| e("memory", x))?;
        use cudarc::driver::sys::CUdevice_attribute::*;
        let ma =
            device::get_attribute(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR).map_err(|x| e("capability", x))?;
        let mi =
            device::get_attribute(dev, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR).map_err(|x| e("capability", x))?;
        Ok(GpuInfo { ordinal, name, memory, capability: (ma, mi) })
    }
}
