//! `redco info`.

use crate::cmd::error::CliResult;
use clap::Args;

/// Arguments of `redco info`.
#[derive(Args)]
pub struct InfoArgs {
    /// Print one JSON object (for scripts) instead of lines.
    #[arg(long)]
    pub json: bool,
}

/// The backends compiled into this binary.
pub fn backends() -> Vec<&'static str> {
    let mut v = vec!["cpu"];
    v.extend(cfg!(feature = "wgpu").then_some("wgpu"));
    v.extend(cfg!(feature = "tpu").then_some("pjrt"));
    v.extend(cfg!(feature = "cuda").then_some("cuda"));
    v
}

/// The transports between ranks compiled in.
pub fn transports() -> Vec<&'static str> {
    let mut v = vec!["threads"];
    v.extend(cfg!(feature = "mpi").then_some("mpi"));
    v
}

/// `redco --version`: the version, the git revision it was built from, the backends and
/// the transports.
pub fn version() -> String {
    format!(
        "{} (git {}; backends: {}; transports: {})",
        env!("CARGO_PKG_VERSION"),
        env!("REDCO_GIT_REV"),
        backends().join(", "),
        transports().join(", ")
    )
}

/// Prints the backends and transports compiled in, this process's world and the CPU threads.
pub fn run(a: InfoArgs) -> CliResult<()> {
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    if a.json {
        let w = super::launch::world();
        let v = serde_json::json!({
            "version": env!("CARGO_PKG_VERSION"),
            "git_revision": env!("REDCO_GIT_REV"),
            "backends": backends(),
            "transports": transports(),
            "world": {"rank": w.rank, "size": w.size, "local_rank": w.local_rank, "local_size": w.local_size,
                      "host": w.host, "launcher": format!("{:?}", w.launcher)},
            "cpu": {"threads": threads, "kernels": redco_cpu::kernel_families().to_string()},
        });
        crate::outln!("{}", serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?);
        return Ok(());
    }
    crate::outln!("redco {}", version());
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
    crate::outln!("cpu: {threads} threads, kernels: {}", redco_cpu::kernel_families());
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
