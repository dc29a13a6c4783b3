//! Redco-style name heuristics: the fallback where no trace is available. Projections
//! named like q/k/v/gate/up/fc_in/wi split their output dim (column), o/down/fc_out/wo
//! their input dim (row); embeddings and heads split the vocabulary; each expert of a
//! mixture of experts splits the same way (`w1`/`w3` columns, `w2` a row; expert
//! parallelism splits the experts themselves over dp); the rest is replicated. Dims the mesh does not divide are replicated, and the plan says so.

use super::plan::{ParamPlan, Role, ShardPlan};
use crate::runtime::mesh::Mesh;
use crate::{Placement, Shape};
use std::collections::BTreeMap;

const COLUMN: &[&str] = &[
    "q_proj",
    "k_proj",
    "v_proj",
    "gate_proj",
    "up_proj",
    "fc_in",
    "wi",
    "wi_0",
    "wi_1",
    "q",
    "k",
    "v",
    "fc1",
    "c_fc",
];
const ROW: &[&str] = &["o_proj", "out_proj", "down_proj", "fc_out", "wo", "o", "fc2", "c_proj", "dense"];
const VOCAB: &[&str] = &[
    "embed",
    "embed_tokens",
    "embed_positions",
    "wte",
    "wpe",
    "shared",
    "word_embeddings",
    "position_embeddings",
    "lm_head",
];
/// An expert's first projections (Qwen3-MoE's, Mixtral's `w1` and `w3`) and its last.
const EXPERT_COLUMN: &[&str] = &["gate_proj", "up_proj", "w1", "w3"];
const EXPERT_ROW: &[&str] = &["down_proj", "w2"];
/// Tables whose columns are attention heads (T5's relative-position bias).
const HEAD_TABLES: &[&str] = &["relative_attention_bias"];

/// The plan the name heuristics give for parameters `(name, shape)` on `mesh`.
pub fn plan_by_names(params: &[(String, Shape)], mesh: Mesh) -> ShardPlan {
    let mut out = BTreeMap::new();
    for (name, shape) in params {
        let parts: Vec<&str> = name.split('.').collect();
        let leaf = parts.last().copied().unwrap_or("");
        let owner = if parts.len() >= 2 { parts[parts.len() - 2] } else { "" };
        let is_w = leaf == "weight";
        let (want, role, why) = if super::plan::is_expert_param(name) {
            // each expert split by the two rules (a stack `[E, ..]` one dim further in);
            // expert parallelism splits the experts themselves over dp (ShardPlan::with_ep)
            let off = usize::from(super::plan::is_expert_stack(name) && shape.rank() == 3);
            if EXPERT_COLUMN.contains(&owner) && shape.rank() == 2 + off {
                (Placement::Shard(off), Role::Column, "column of an expert (name)")
            } else if EXPERT_ROW.contains(&owner) && shape.rank() == 2 + off {
                (Placement::Shard(1 + off), Role::Row, "row of an expert (name)")
            } else {
                (Placement::Replicate, Role::Replicated, "replicated")
            }
        } else if VOCAB.contains(&owner) && ((is_w && shape.rank() == 2) || (!is_w && shape.rank() == 1)) {
            let role = if owner == "lm_head" { Role::VocabHead } else { Role::VocabTable };
            let role = if is_w { role } else { Role::Column };
            (Placement::Shard(0), role, "vocabulary split (name)")
        } else if HEAD_TABLES.contains(&owner) && is_w && shape.rank() == 2 {
            (Placement::Shard(1), Role::Column, "split by heads (name)")
        } else if COLUMN.contains(&owner) && shape.rank() <= 2 {
            (Placement::Shard(0), Role::Column, "column (name)")
        } else if ROW.contains(&owner) && is_w && shape.rank() == 2 {
            (Placement::Shard(1), Role::Row, "row (name)")
        } else {
            (Placement::Replicate, Role::Replicated, "replicated")
        };
        let (placement, role, reason) = match want {
            Placement::Shard(d) if !shape.dims()[d].is_multiple_of(mesh.mp) => (
                Placement::Replicate,
                Role::Replicated,
                format!("replicated: dim {d} ({}) not divisible by mp={}", shape.dims()[d], mesh.mp),
            ),
            p => (if mesh.mp == 1 { Placement::Replicate } else { p }, role, why.to_string()),
        };
        out.insert(name.clone(), ParamPlan { role, shape: shape.clone(), placement, reason, quant: None });
    }
    ShardPlan { mesh, params: out, rank: None, ep: 1 }
}
