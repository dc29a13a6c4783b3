//! Planning: from a model to a [`ShardPlan`] (each parameter's placement and role), by
//! tracing one forward pass and applying the rules ([`trace`]) or by names
//! ([`heuristics`]); the placement of LoRA adapters ([`lora`]); the estimate of a plan's
//! memory and communication per step ([`planner`]); the choice of memory tools that
//! fits a device ([`strategy`]); and the model FLOPs a step costs ([`flops`]).
//!
//! Planning reads models (`nn`) and the sharding rules; it runs nothing and moves no data.

pub mod flops;
pub mod heuristics;
pub mod lora;
pub mod plan;
pub mod planner;
pub mod strategy;
pub mod trace;

pub use plan::{expert_index, is_expert_param, is_expert_stack, ParamPlan, Role, ShardPlan};
