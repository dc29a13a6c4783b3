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

/// Whether the model directory holds a T5 (encoder-decoder) config.
pub fn is_t5(dir: &std::path::Path) -> bool {
    HfConfig::from_dir(dir).is_ok_and(|c| c.model_type == "t5")
}
