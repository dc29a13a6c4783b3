//! Pieces the subcommands share: parsing meshes and dtypes, and planning a checkpoint's
//! split from its configuration.

use redco_core::dist::heuristics::plan_by_names;
use redco_core::dist::{Mesh, ShardPlan};
use redco_core::DType;
use redco_models::hf::config::HfConfig;

/// Parses `DPxMP`.
pub fn mesh(s: &str) -> Result<Mesh, String> {
    s.parse().map_err(|e: redco_core::Error| e.to_string())
}

/// Parses a parameter dtype.
pub fn dtype(s: &str) -> Result<DType, String> {
    match s {
        "f32" => Ok(DType::F32),
        "bf16" => Ok(DType::BF16),
        "f16" => Ok(DType::F16),
        d => Err(format!("unknown dtype `{d}` (use f32, bf16 or f16)")),
    }
}

/// The split of the model `cfg` describes over `mesh` (none for one device).
pub fn plan(cfg: &HfConfig, mesh: Mesh) -> Result<Option<ShardPlan>, String> {
    if mesh.size() == 1 {
        return Ok(None);
    }
    let shapes = cfg.param_shapes().map_err(|e| e.to_string())?;
    Ok(Some(plan_by_names(&shapes, mesh)))
}

/// Threads per rank when `total` threads are shared by `ranks` ranks.
pub fn threads_per_rank(total: Option<usize>, ranks: usize) -> usize {
    let total = total.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    (total / ranks).max(1)
}

/// Checks that `name` is a backend compiled into this program.
pub fn backend(name: &str) -> Result<(), String> {
    match name {
        "cpu" => Ok(()),
        "wgpu" | "cuda" | "tpu" => Err(format!(
            "backend `{name}` is not compiled into this redco (build with `--features {name}` once its crate lands); \
             available: cpu"
        )),
        other => Err(format!("unknown backend `{other}` (available: cpu)")),
    }
}

/// The CPU backend's devices are its cores: a mesh with more ranks than cores is refused
/// unless `oversubscribe`.
pub fn check_devices(mesh: Mesh, threads: Option<usize>, oversubscribe: bool) -> Result<(), String> {
    let cores = threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if mesh.size() > cores && !oversubscribe {
        return Err(format!(
            "mesh {mesh} needs {} devices but the cpu backend has {cores} (cores); use a smaller mesh or --oversubscribe",
            mesh.size()
        ));
    }
    Ok(())
}

/// Whether the model directory holds a T5 (encoder-decoder) config.
pub fn is_t5(dir: &std::path::Path) -> bool {
    HfConfig::from_dir(dir).is_ok_and(|c| c.model_type == "t5")
}
