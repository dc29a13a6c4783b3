//! What the commands read off a model's `config.json` beyond its fields: the split of its
//! parameters over a mesh (by name), and whether it is an encoder-decoder (T5).

use redco_core::planning::heuristics::plan_by_names;
use redco_core::{planning::ShardPlan, runtime::Mesh};
use redco_models::hf::config::HfConfig;

/// The split of the model `cfg` describes over `mesh` (none for one device).
pub fn plan(cfg: &HfConfig, mesh: Mesh) -> redco_core::Result<Option<ShardPlan>> {
    if mesh.size() == 1 {
        return Ok(None);
    }
    let shapes = cfg.param_shapes()?;
    Ok(Some(plan_by_names(&shapes, mesh)))
}

/// [`plan`] for the mesh of `comm`, bound to its rank (what a sharded load reads its
/// slices by); `None` on one device.
pub fn rank_plan<B: redco_core::Backend>(
    cfg: &HfConfig,
    comm: Option<&redco_core::runtime::Comm<B>>,
) -> redco_core::Result<Option<ShardPlan>> {
    let mesh = comm.map_or(Mesh::single(), |c| c.mesh());
    bind(plan(cfg, mesh)?.as_ref(), comm)
}

/// `plan` bound to the rank of `comm`.
pub fn bind<B: redco_core::Backend>(
    plan: Option<&ShardPlan>,
    comm: Option<&redco_core::runtime::Comm<B>>,
) -> redco_core::Result<Option<ShardPlan>> {
    plan.map(|p| p.at_rank(comm.map_or(0, |c| c.rank()))).transpose()
}

/// Whether the model directory holds a T5 (encoder-decoder) config.
pub fn is_t5(dir: &std::path::Path) -> bool {
    HfConfig::from_dir(dir).is_ok_and(|c| c.model_type == "t5")
}
