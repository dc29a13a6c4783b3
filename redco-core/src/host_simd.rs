//! Host loops compiled for the widest vectors the CPU has: the dtype conversions of
//! [`HostData`](crate::HostData) run here whatever the backend, and the CPU backend's element
//! loops build on the same detection.

/// The environment variable that makes the CPU code paths (and `cargo xtask test`) behave as
/// on a CPU without AVX-512: set to anything but empty or `0`.
pub const ASSUME_NO_AVX512: &str = "REDCO_ASSUME_NO_AVX512";

/// True when AVX2 and FMA code paths may run. Read once per process.
#[inline]
pub fn avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *ON.get_or_init(|| std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// True when AVX-512F code paths may run: the CPU has AVX-512F and [`ASSUME_NO_AVX512`] is
/// not set, so an AVX-512 machine can run as an AVX2-only one would. Read once per process.
#[inline]
pub fn avx512f() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *ON.get_or_init(|| {
            let off = std::env::var_os(ASSUME_NO_AVX512).is_some_and(|v| !v.is_empty() && v != "0");
            !off && std::arch::is_x86_feature_detected!("avx512f")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[inline(always)]
fn run_body<R, F: FnOnce() -> R>(f: F) -> R {
    f()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,avx512bw,avx512vl,avx2,fma")]
fn run_avx512<R, F: FnOnce() -> R>(f: F) -> R {
    run_body(f)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn run_avx2<R, F: FnOnce() -> R>(f: F) -> R {
    run_body(f)
}

/// Runs `f` in a copy compiled for the widest vectors this CPU has (AVX-512, AVX2 + FMA, or
/// the baseline), so that loops inlined into it run 8 or 16 lanes wide. Work that `f` hands
/// to other threads (rayon) leaves the copy: call this inside each task.
pub fn vectorized<R, F: FnOnce() -> R>(f: F) -> R {
    #[cfg(target_arch = "x86_64")]
    if avx512f() {
        // SAFETY: the CPU has the features the copy was compiled for.
        return unsafe { run_avx512(f) };
    }
    #[cfg(target_arch = "x86_64")]
    if avx2_fma() {
        // SAFETY: the CPU has the features the copy was compiled for.
        return unsafe { run_avx2(f) };
    }
    run_body(f)
}
