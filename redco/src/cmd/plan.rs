//! `redco plan`: the sharding plan, communication and memory of a model on a mesh.

use super::check;
use clap::Args;
use redco_core::dist::heuristics::plan_by_names;
use redco_core::dist::planner::{human, smallest_mp, PlanReport, Workload};
use redco_core::dist::Mesh;
use redco_core::Placement;
use redco_models::hf::config::HfConfig;
use std::path::PathBuf;

/// Arguments of `redco plan`.
#[derive(Args)]
#[command(allow_negative_numbers = true)]
pub struct PlanArgs {
    /// Hugging Face model directory (with config.json).
    #[arg(long)]
    pub model: PathBuf,
    /// Mesh as DPxMP, e.g. 2x4 (data-parallel x model-parallel ranks).
    #[arg(long, default_value = "1x1")]
    pub mesh: String,
    /// Global batch size (split over DP).
    #[arg(long, value_parser = check::count, default_value_t = 8)]
    pub batch: usize,
    /// Sequence length.
    #[arg(long, value_parser = check::count, default_value_t = 2048)]
    pub seq: usize,
    /// Parameter and activation dtype: f32, bf16 or f16.
    #[arg(long, default_value = "bf16")]
    pub dtype: String,
    /// Shard the optimizer state over DP (ZeRO-1).
    #[arg(long)]
    pub zero1: bool,
    /// Device memory (e.g. 80GB, 24GiB): report the smallest MP that fits.
    #[arg(long)]
    pub device_memory: Option<String>,
    /// Fit the device for inference instead of training.
    #[arg(long)]
    pub inference: bool,
    /// Fail instead of replicating layers the mesh cannot split evenly.
    #[arg(long)]
    pub strict: bool,
}

fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim().to_ascii_lowercase();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("--device-memory {s}: not a size such as 80GB or 24GiB"))?;
    let mul = match unit.trim() {
        "" | "b" => 1.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        _ => return Err(format!("--device-memory {s}: unknown unit (use B, kB, MB, GB, TB, KiB, MiB, GiB)")),
    };
    let bytes = n * mul;
    if !(bytes >= 1.0 && bytes < u64::MAX as f64) {
        return Err(format!("--device-memory {s}: must be at least one byte and below 2^64"));
    }
    Ok(bytes as u64)
}

/// The most tokens per step (`--batch` x `--seq`) a plan is made for (2^40: beyond any
/// training run, well inside the planner's arithmetic).
const MAX_TOKENS: u128 = 1 << 40;

/// Runs `redco plan`.
pub fn run(a: PlanArgs) -> Result<(), String> {
    let cfg = HfConfig::from_dir(&a.model).map_err(|e| e.to_string())?;
    let mesh: Mesh = a.mesh.parse().map_err(|e: redco_core::Error| e.to_string())?;
    let dtype_bytes = match a.dtype.as_str() {
        "f32" => 4,
        "bf16" | "f16" => 2,
        d => return Err(format!("unknown dtype `{d}` (use f32, bf16 or f16)")),
    };
    if !a.batch.is_multiple_of(mesh.dp) {
        return Err(format!("batch {} does not split over dp={}", a.batch, mesh.dp));
    }
    if let Some(ctx) = cfg.max_positions.filter(|c| a.seq > *c) {
        return Err(format!("--seq {} exceeds the model's context of {ctx} tokens", a.seq));
    }
    if (a.batch as u128) * (a.seq as u128) > MAX_TOKENS {
        return Err(format!(
            "--batch {} x --seq {} is {} tokens per step: at most {MAX_TOKENS} are planned",
            a.batch,
            a.seq,
            a.batch as u128 * a.seq as u128
        ));
    }
    if cfg.heads % mesh.mp != 0 || cfg.kv_heads % mesh.mp != 0 {
        let msg = format!("{} heads ({} key/value) do not split over mp={}", cfg.heads, cfg.kv_heads, mesh.mp);
        if a.strict {
            return Err(msg);
        }
        crate::cmd::out::warn(format_args!("redco: warning: {msg}; attention stays replicated"));
    }
    let shapes = cfg.param_shapes().map_err(|e| e.to_string())?;
    let plan = plan_by_names(&shapes, mesh);
    if a.strict {
        if let Some((n, p)) =
            plan.params.iter().find(|(_, p)| p.placement == Placement::Replicate && p.reason.contains("not divisible"))
        {
            return Err(format!("{n}: {}", p.reason));
        }
    }
    let work = Workload { batch: a.batch, seq: a.seq, dtype_bytes, zero1: a.zero1 };
    crate::outln!(
        "{} ({} layers, hidden {}, {} heads, vocab {}) on mesh {mesh}; rules: name heuristics (config only)\n",
        cfg.model_type,
        cfg.layers,
        cfg.hidden,
        cfg.heads,
        cfg.vocab
    );
    crate::out!("{}", PlanReport::new(plan, cfg.dims(), work));
    if let Some(mem) = &a.device_memory {
        let bytes = parse_bytes(mem)?;
        let max_mp = cfg.heads.max(1);
        match smallest_mp(&cfg.dims(), &work, mesh.dp, max_mp, bytes, !a.inference, |m| plan_by_names(&shapes, m)) {
            Some((mp, need)) => crate::outln!(
                "\nsmallest mp that fits {} per device for {}: mp={mp} ({} per device)",
                human(bytes),
                if a.inference { "inference" } else { "training" },
                human(need)
            ),
            None => crate::outln!(
                "\nno mp up to {max_mp} fits {} per device; add data-parallel ZeRO-1 or smaller batches",
                human(bytes)
            ),
        }
    }
    Ok(())
}
