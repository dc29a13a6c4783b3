//! Placing LoRA adapters: each adapter factor is laid out like the base layer it adapts.

use crate::nn::lora::LoraAdapter;
use crate::planning::{ParamPlan, Role, ShardPlan};
use crate::{Backend, Placement};

/// Adds the adapters to `plan`, each laid out like its base layer: with the base split on
/// its output rows (column-parallel), `B` splits its rows and `A` is replicated; with the
/// base split on its input columns (row-parallel), `A` splits its columns and `B` is
/// replicated; otherwise both are replicated. The adapted layer's output is then laid out
/// as the base's; a row-parallel adapter adds the sum of an `r`-wide partial product.
pub fn plan_adapters<B: Backend>(plan: &mut ShardPlan, adapters: &[(String, LoraAdapter<B>)]) {
    for (layer, a) in adapters {
        let base = format!("{layer}.weight");
        let bp = plan.params.get(&base).map_or(Placement::Replicate, |p| p.placement);
        let (pa, pb, role) = match bp {
            Placement::Shard(0) => (Placement::Replicate, Placement::Shard(0), Role::Column),
            Placement::Shard(1) => (Placement::Shard(1), Placement::Replicate, Role::Row),
            _ => (Placement::Replicate, Placement::Replicate, Role::Replicated),
        };
        for (factor, t, placement) in [("lora_A", &a.a, pa), ("lora_B", &a.b, pb)] {
            let role = if placement == Placement::Replicate { Role::Replicated } else { role };
            plan.params.insert(
                format!("{layer}.{factor}.weight"),
                ParamPlan {
                    role,
                    shape: t.shape().clone(),
                    placement,
                    reason: format!("LoRA adapter, laid out like {base}"),
                    quant: None,
                },
            );
        }
    }
}
