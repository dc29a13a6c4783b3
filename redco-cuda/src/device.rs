//! What CUDA the machine has: the driver library, its GPUs, and NVRTC. Every probe returns
//! an error that says what is missing instead of panicking (cudarc panics when a CUDA call
//! is made with no driver library present, so each entry point asks first).

use redco_core::{DType, Error, Result};

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

/// Dense bf16 (and f16) tensor-core peaks in TFLOP/s from the vendor's datasheets, by a
/// piece of the device's name, most specific first: the rate the datasheet's boost clock
/// gives, below what the device's maximum clock attribute would (an H100 SXM reports 1.98
/// GHz; its 989 TFLOP/s are at 1.83).
const DATASHEET: [(&str, f64); 8] = [
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),
    ("H200", 989.0),
    ("GH200", 989.0),
    ("B200", 2250.0),
    ("A100", 312.0),
    ("L40S", 362.0),
];

/// The device's dense peak in FLOP/s for products in `dtype` with f32 accumulation: the
/// datasheet's where the name is known, else `SMs x clock x` the architecture's tensor
/// FLOPs per SM per clock (sm_80: 2048; sm_90: 4096; sm_100: 8192; sm_86/89: 512, the
/// GeForce rate with f32 accumulation). bf16 and f16 share the rate, f32 runs as TF32 at
/// half of it; f64 and architectures before sm_80 (no bf16) give `None`.
pub fn dense_peak_flops(name: &str, capability: (i32, i32), sms: i32, clock_khz: i32, dtype: DType) -> Option<f64> {
    let half_rate = match DATASHEET.iter().find(|(n, _)| name.contains(n)) {
        Some((_, tflops)) => tflops * 1e12,
        None => {
            let per_sm = match capability {
                (8, 0) => 2048.0,
                (8, _) => 512.0,
                (9, _) => 4096.0,
                (10, _) => 8192.0,
                _ => return None,
            };
            sms as f64 * clock_khz as f64 * 1e3 * per_sm
        }
    };
    match dtype {
        DType::BF16 | DType::F16 => Some(half_rate),
        DType::F32 => Some(half_rate / 2.0),
        _ => None,
    }
}

impl crate::Cuda {
    /// [`dense_peak_flops`] of this backend's GPU.
    pub fn dense_peak(&self, dtype: DType) -> Option<f64> {
        use cudarc::driver::sys::CUdevice_attribute::*;
        let ctx = &self.inner.ctx;
        let cc = ctx.compute_capability().ok()?;
        let sms = ctx.attribute(CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT).ok()?;
        let clock = ctx.attribute(CU_DEVICE_ATTRIBUTE_CLOCK_RATE).ok()?;
        dense_peak_flops(&self.inner.name, cc, sms, clock, dtype)
    }
}

#[cfg(test)]
mod tests {
    use super::dense_peak_flops;
    use redco_core::DType;

    #[test]
    fn peaks_come_from_the_datasheet_or_the_sm_count_and_clock() {
        let h200 = dense_peak_flops("NVIDIA H200", (9, 0), 132, 1_980_000, DType::BF16).unwrap();
        assert_eq!(h200, 989e12);
        assert_eq!(dense_peak_flops("NVIDIA H100 80GB HBM3", (9, 0), 132, 1_980_000, DType::F32), Some(494.5e12));
        assert_eq!(dense_peak_flops("NVIDIA H100 PCIe", (9, 0), 114, 1_755_000, DType::F16), Some(756e12));
        // an unlisted Hopper part: SMs x clock x 4096
        let other = dense_peak_flops("NVIDIA H800", (9, 0), 132, 1_830_000, DType::BF16).unwrap();
        assert!((other / 1e12 - 989.4).abs() < 0.1, "{other}");
        // an RTX 4090: 128 SMs at 2.52 GHz, 512 a clock with f32 accumulation
        let ada = dense_peak_flops("NVIDIA GeForce RTX 4090", (8, 9), 128, 2_520_000, DType::BF16).unwrap();
        assert!((ada / 1e12 - 165.2).abs() < 0.1, "{ada}");
        assert_eq!(dense_peak_flops("Tesla V100", (7, 0), 80, 1_530_000, DType::BF16), None);
        assert_eq!(dense_peak_flops("NVIDIA H200", (9, 0), 132, 1_980_000, DType::F64), None);
    }
}
