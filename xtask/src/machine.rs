//! A description of the machine, attached to every benchmark result.

/// The CPU model, the available cores and the SIMD level.
pub fn describe() -> String {
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| std::env::consts::ARCH.to_string());
    let held = if peer_isa_env().is_empty() { "" } else { ", run as AVX2-only (REDCO_ASSUME_NO_AVX512)" };
    format!("{model}, {} cores, {}{held} ({})", cores(), simd(), redco_cpu::kernel_families())
}

/// Set to anything but empty or `0`, the CPU backend (which reads it too), the benchmarks
/// and `cargo xtask test` act as on a CPU without AVX-512F.
pub const ASSUME_NO_AVX512: &str = "REDCO_ASSUME_NO_AVX512";

/// Whether [`ASSUME_NO_AVX512`] is set.
pub fn assumes_no_avx512() -> bool {
    std::env::var_os(ASSUME_NO_AVX512).is_some_and(|v| !v.is_empty() && v != "0")
}

/// The environment that holds a peer (torch, MKL) to AVX2 where the CPU backend runs as on
/// an AVX2-only machine (`REDCO_ASSUME_NO_AVX512` set); empty otherwise.
pub fn peer_isa_env() -> Vec<(&'static str, &'static str)> {
    if assumes_no_avx512() {
        vec![("MKL_ENABLE_INSTRUCTIONS", "AVX2"), ("ATEN_CPU_CAPABILITY", "avx2"), ("ONEDNN_MAX_CPU_ISA", "AVX2")]
    } else {
        Vec::new()
    }
}

/// The number of cores this process may use.
pub fn cores() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

/// The widest SIMD level detected.
pub fn simd() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512f") {
            return "AVX-512";
        }
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            return "AVX2+FMA";
        }
    }
    "scalar/other"
}
