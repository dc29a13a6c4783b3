//! `redco info`.

/// Prints the backends and transports compiled in, this process's world and the CPU threads.
pub fn run() -> Result<(), String> {
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    crate::outln!("redco {}", env!("CARGO_PKG_VERSION"));
    crate::outln!(
        "backends: cpu (embedded){}{}{}",
        if cfg!(feature = "wgpu") { ", wgpu" } else { "" },
        if cfg!(feature = "tpu") { ", pjrt" } else { "" },
        if cfg!(feature = "cuda") { ", cuda" } else { "" }
    );
    crate::outln!(
        "transports: threads{}",
        if cfg!(feature = "mpi") { ", mpi (ranks as processes under mpirun / srun)" } else { "" }
    );
    let w = super::launch::world();
    crate::outln!("world: {w}");
    crate::outln!("cpu: {threads} threads, kernels: {}", redco_core::cpu::kernel_families());
    #[cfg(feature = "wgpu")]
    wgpu_adapters();
    #[cfg(feature = "tpu")]
    super::pjrt::describe();
    #[cfg(feature = "cuda")]
    super::cuda::describe();
    Ok(())
}

/// Lists the wgpu adapters in the order `--backend wgpu` prefers them, marking the one it
/// would open (`REDCO_WGPU_ADAPTER`, a substring of the name, picks another).
#[cfg(feature = "wgpu")]
fn wgpu_adapters() {
    let adapters = redco_wgpu::Wgpu::adapters();
    let wanted = std::env::var("REDCO_WGPU_ADAPTER").ok().filter(|s| !s.is_empty()).map(|s| s.to_lowercase());
    let chosen = match &wanted {
        Some(w) => adapters.iter().position(|a| a.name.to_lowercase().contains(w)),
        None => (!adapters.is_empty()).then_some(0),
    };
    if adapters.is_empty() {
        crate::outln!("wgpu: no adapter found (on Linux install a Vulkan driver, e.g. mesa-vulkan-drivers)");
    }
    for (i, a) in adapters.iter().enumerate() {
        crate::outln!(
            "wgpu adapter {i}: {} ({:?}, {:?}, driver {}){}",
            a.name,
            a.backend,
            a.device_type,
            format!("{} {}", a.driver, a.driver_info).trim(),
            if chosen == Some(i) { "  <- used" } else { "" }
        );
    }
    if let (Some(w), None) = (&wanted, chosen) {
        crate::outln!("wgpu: no adapter name contains REDCO_WGPU_ADAPTER={w:?}");
    }
}
