//! `redco plan`: the sharding plan, communication and memory of a model on a mesh.

use super::check::{self, Recompute};
use crate::cmd::error::CliResult;
use clap::Args;
use redco_core::planning::heuristics::plan_by_names;
use redco_core::planning::planner::{human, smallest_mesh, smallest_mp, PlanReport, Workload};
use redco_core::planning::strategy::{pick, strategies, StrategyRow};
use redco_core::runtime::Mesh;
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
    /// Sequences per optimizer step (split over DP), as `train --batch-size`.
    #[arg(long = "batch-size", visible_alias = "batch", value_parser = check::count, default_value_t = 8)]
    pub batch: usize,
    /// Tokens per sequence, as `train --seq-len` (default: the model's context, up to 2048;
    /// 512 for a model without a fixed context, such as T5; printed with the plan).
    #[arg(long = "seq-len", visible_alias = "seq", value_parser = check::count)]
    pub seq: Option<usize>,
    /// Parameter and activation dtype: f32, bf16 or f16.
    #[arg(long, default_value = "bf16")]
    pub dtype: String,
    /// ZeRO stage over dp, as `train --zero`: 0, 1 (AdamW's moments sharded), 2 (also the
    /// f32 masters and the gradients) or 3 (also the decoder layers' parameters).
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=3))]
    pub zero: u8,
    /// Activation recompute, as `train --recompute`: none, block (each layer recomputed in
    /// the backward pass) or selective (each layer's cheap ops recomputed; its matmul,
    /// attention and all-reduce outputs kept); memory and communication estimated so.
    #[arg(long, value_enum, default_value_t = Recompute::None)]
    pub recompute: Recompute,
    /// ZeRO-3's unit, as `train --unit-layers`: consecutive decoder layers gathered together;
    /// default: the planner's pick (listed with the memory tools).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub unit_layers: Option<u64>,
    /// Expert parallelism for a mixture of experts, as `train --ep`: the experts split over
    /// this many ranks of dp (1 or dp).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub ep: u64,
    /// Device memory (e.g. 80GB, 24GiB): report the smallest MP that fits (for a mixture
    /// of experts, the smallest mesh, with the experts split over its dp ranks).
    #[arg(long)]
    pub device_memory: Option<String>,
    /// Plan the linear layers held as llama.cpp's blocks (q8_0, q4_0, q4_1, q4_k, q6_k), as
    /// `generate`/`serve --quantize` hold them: inference only (with --inference).
    #[arg(long)]
    pub quantize: Option<String>,
    /// Fit the device for inference instead of training.
    #[arg(long)]
    pub inference: bool,
    /// Also list optimizer offload (for a device backend: the optimizer's state and the f32
    /// masters in host memory, 4 + dtype bytes a parameter moved each step).
    #[arg(long)]
    pub offload: bool,
    /// Fail instead of replicating layers the mesh cannot split evenly.
    #[arg(long)]
    pub strict: bool,
    /// Print the plan as one JSON object (for scripts) instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// The most tokens per step (`--batch-size` x `--seq-len`) a plan is made for (2^40: beyond any
/// training run, well inside the planner's arithmetic).
const MAX_TOKENS: u128 = 1 << 40;

/// The longest default sequence length taken from a model's context.
const MAX_DEFAULT_SEQ: usize = 2048;
/// The default sequence length of a model without a fixed context (T5's usual 512).
const UNBOUNDED_DEFAULT_SEQ: usize = 512;

/// The sequence length a plan is made for, and, when it is a default, where it comes from.
fn seq_len(a: &PlanArgs, cfg: &HfConfig) -> (usize, Option<String>) {
    match (a.seq, cfg.max_positions) {
        (Some(s), _) => (s, None),
        (None, Some(ctx)) if ctx <= MAX_DEFAULT_SEQ => (ctx, Some(format!("the model's context of {ctx}"))),
        (None, Some(ctx)) => {
            (MAX_DEFAULT_SEQ, Some(format!("the model's context of {ctx}, capped at {MAX_DEFAULT_SEQ}")))
        }
        (None, None) => (
            UNBOUNDED_DEFAULT_SEQ,
            Some(format!("{} has no fixed context; {UNBOUNDED_DEFAULT_SEQ} assumed", cfg.model_type)),
        ),
    }
}

/// Runs `redco plan`.
pub fn run(mut a: PlanArgs) -> CliResult<()> {
    let cfg = HfConfig::from_dir(&a.model)?;
    let (seq, seq_from) = seq_len(&a, &cfg);
    a.seq = Some(seq);
    let mesh: Mesh = a.mesh.parse().map_err(|e: redco_core::Error| e.to_string())?;
    let dtype_bytes = match a.dtype.as_str() {
        "f32" => 4,
        "bf16" | "f16" => 2,
        d => return Err(format!("unknown dtype `{d}` (use f32, bf16 or f16)").into()),
    };
    if !a.batch.is_multiple_of(mesh.dp) {
        return Err(format!("--batch-size {} does not split over dp={}", a.batch, mesh.dp).into());
    }
    if let Some(ctx) = cfg.max_positions.filter(|c| seq > *c) {
        return Err(format!("--seq-len {seq} exceeds the model's context of {ctx} tokens").into());
    }
    if (a.batch as u128) * (seq as u128) > MAX_TOKENS {
        return Err(format!(
            "--batch-size {} x --seq-len {} is {} tokens per step: at most {MAX_TOKENS} are planned",
            a.batch,
            seq,
            a.batch as u128 * seq as u128
        )
        .into());
    }
    if cfg.heads % mesh.mp != 0 || cfg.kv_heads % mesh.mp != 0 {
        let msg = format!("{} heads ({} key/value) do not split over mp={}", cfg.heads, cfg.kv_heads, mesh.mp);
        if a.strict {
            return Err(msg.into());
        }
        crate::cmd::out::warn(format_args!("redco: warning: {msg}; attention stays replicated"));
    }
    let shapes = cfg.param_shapes()?;
    let quant = super::quantize::format(a.quantize.as_deref())?;
    let stored = cfg.block_formats()?;
    if (quant.is_some() || !stored.is_empty()) && !a.inference {
        return Err("a quantized model is planned for inference only: add --inference (training runs on floats)".into());
    }
    let plan = plan_by_names(&shapes, mesh).with_ep(a.ep as usize)?.with_quant(quant, &stored);
    if a.strict {
        if let Some((n, p)) =
            plan.params.iter().find(|(_, p)| p.placement == Placement::Replicate && p.reason.contains("not divisible"))
        {
            return Err(format!("{n}: {}", p.reason).into());
        }
    }
    let pinned = a.unit_layers.map_or(0, |k| k.min(cfg.layers.max(1) as u64) as usize);
    let mut work =
        Workload { batch: a.batch, seq, dtype_bytes, zero: a.zero, recompute: a.recompute.mode(), unit_layers: pinned };
    let moe = cfg.dims().moe;
    let mesh_fit = match (&a.device_memory, moe) {
        (Some(mem), Some(m)) => {
            let bytes = check::bytes(mem)?;
            let max_ranks = (m.experts * cfg.heads.max(1)).min(MAX_RANKS);
            let found = smallest_mesh(&cfg.dims(), &work, max_ranks, bytes, !a.inference, |m| {
                plan_by_names(&shapes, m)
                    .with_ep(if m.dp > 1 { m.dp } else { 1 })
                    .ok()
                    .map(|p| p.with_quant(quant, &stored))
            });
            Some((bytes, max_ranks, found))
        }
        _ => None,
    };
    let fit = match &a.device_memory {
        Some(_) if moe.is_some() => None,
        Some(mem) => {
            let bytes = check::bytes(mem)?;
            let max_mp = cfg.heads.max(1);
            let found = smallest_mp(&cfg.dims(), &work, mesh.dp, max_mp, bytes, !a.inference, |m| {
                plan_by_names(&shapes, m).with_quant(quant, &stored)
            });
            Some((bytes, max_mp, found))
        }
        None => None,
    };
    // the memory tools on this mesh against the device budget (--device-memory, or this
    // host's available memory shared by the mesh's ranks)
    let (budget, budget_from) = match (fit.as_ref(), super::fits::available_memory()) {
        (Some((bytes, _, _)), _) => (*bytes, "--device-memory".to_string()),
        (None, _) if mesh_fit.is_some() => (mesh_fit.as_ref().map_or(0, |f| f.0), "--device-memory".to_string()),
        (None, Some(avail)) => {
            (avail / mesh.size() as u64, format!("this host's available memory / {} ranks", mesh.size()))
        }
        (None, None) => (u64::MAX, "unknown: every strategy fits".to_string()),
    };
    let rows = strategies(&plan, &cfg.dims(), &work, budget, 0, a.offload);
    let picked = pick(&rows);
    if pinned == 0 {
        // the report's own estimate (at `--zero`, `--recompute`) with the planner's unit
        work.unit_layers = rows
            .iter()
            .find(|r| r.strategy.zero == a.zero && r.strategy.recompute == a.recompute.mode() && !r.strategy.offload)
            .map_or(1, |r| r.strategy.unit_layers);
    }
    let report = PlanReport::new(plan, cfg.dims(), work);
    if a.json {
        let mut v = json(&a, &cfg, mesh, &report, fit);
        v["strategies"] = strategies_json(&rows, picked, budget, &budget_from);
        v["workload"]["seq_len_from"] = serde_json::json!(seq_from.as_deref().unwrap_or("--seq-len"));
        let text = serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?;
        crate::outln!("{text}");
        return Ok(());
    }
    crate::outln!(
        "{} ({} layers, hidden {}, {} heads, vocab {}) on mesh {mesh}; rules: name heuristics (config only)\n",
        cfg.model_type,
        cfg.layers,
        cfg.hidden,
        cfg.heads,
        cfg.vocab
    );
    let from = seq_from.map_or(String::new(), |why| format!(" (--seq-len default: {why})"));
    let held = match (quant, stored.is_empty()) {
        (Some(f), _) => format!(", linear layers as {f} blocks"),
        (None, false) => ", linear layers as the checkpoint's blocks".to_string(),
        (None, true) => String::new(),
    };
    crate::outln!("workload: batch {} x sequence {seq}{from}, {}{held}\n", a.batch, a.dtype);
    crate::out!("{report}");
    print_strategies(&rows, picked, budget, &budget_from);
    match fit {
        Some((bytes, _, Some((mp, need)))) => crate::outln!(
            "\nsmallest mp that fits {} per device for {}: mp={mp} ({} per device)",
            human(bytes),
            if a.inference { "inference" } else { "training" },
            human(need)
        ),
        Some((bytes, max_mp, None)) => crate::outln!(
            "\nno mp up to {max_mp} fits {} per device; add data-parallel ranks with ZeRO-2 (--zero 2), recompute, or smaller batches",
            human(bytes)
        ),
        None => {}
    }
    match mesh_fit {
        Some((bytes, _, Some((m, need)))) if m.dp == 1 => crate::outln!(
            "\nsmallest mesh that fits {} per device for {}: {m} (dp x mp; every expert on every rank, {} per device)",
            human(bytes),
            if a.inference { "inference" } else { "training" },
            human(need)
        ),
        Some((bytes, _, Some((m, need)))) => crate::outln!(
            "\nsmallest mesh that fits {} per device for {}: {m} (dp x mp), the experts split over its {} dp ranks \
             (--mesh {m} --ep {}; {} per device)",
            human(bytes),
            if a.inference { "inference" } else { "training" },
            m.dp,
            m.dp,
            human(need)
        ),
        Some((bytes, max_ranks, None)) => crate::outln!(
            "\nno mesh of up to {max_ranks} ranks fits {} per device with the experts split over dp; try recompute, \
             smaller batches or a shorter sequence",
            human(bytes)
        ),
        None => {}
    }
    Ok(())
}

/// The most ranks the smallest-mesh search of a mixture of experts tries.
const MAX_RANKS: usize = 1024;

/// The memory tools table: every strategy with its per-rank peak, bytes moved and
/// recomputed per step, whether it fits, and the pick.
fn print_strategies(rows: &[StrategyRow], picked: Option<usize>, budget: u64, from: &str) {
    let b = if budget == u64::MAX { "no limit".to_string() } else { human(budget) };
    crate::outln!("\nmemory tools for training, against {b} per rank ({from}):");
    crate::outln!("  {:<52} {:>12} {:>12} {:>12}  fits", "strategy", "peak/rank", "moved/step", "recomputed");
    for (i, r) in rows.iter().enumerate() {
        crate::outln!(
            "  {:<52} {:>12} {:>12} {:>12}  {}{}",
            r.strategy.to_string(),
            human(r.memory.total()),
            human(r.comm_bytes),
            human(r.recomputed_bytes),
            if r.fits { "yes" } else { "no" },
            if picked == Some(i) { "  <- pick (fewest bytes moved and recomputed)" } else { "" }
        );
    }
    if picked.is_none() {
        crate::outln!(
            "  none fits: split the model over more ranks (see the smallest mp), or lower the batch or sequence"
        );
    }
}

/// The memory tools table as JSON.
fn strategies_json(rows: &[StrategyRow], picked: Option<usize>, budget: u64, from: &str) -> serde_json::Value {
    let rows: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            serde_json::json!({
                "zero": r.strategy.zero,
                "recompute": r.strategy.recompute.name(),
                "offload": r.strategy.offload,
                "unit_layers": r.strategy.unit_layers,
                "host_bytes_per_rank": r.host_bytes,
                "peak_bytes_per_rank": r.memory.total(),
                "comm_bytes_per_step": r.comm_bytes,
                "recomputed_bytes_per_step": r.recomputed_bytes,
                "fits": r.fits,
            })
        })
        .collect();
    serde_json::json!({
        "budget_bytes_per_rank": (budget != u64::MAX).then_some(budget),
        "budget_from": from,
        "rows": rows,
        "pick": picked,
    })
}

/// `--device-memory`'s answer: the bytes per device, the largest mp tried, and the smallest
/// mp that fits with its bytes per device (none fits: `None`).
type Fit = (u64, usize, Option<(usize, u64)>);

/// The plan as JSON: the model, the workload, every parameter's placement and bytes per
/// device, the predicted collectives of one training step, memory, and the fit.
fn json(a: &PlanArgs, cfg: &HfConfig, mesh: Mesh, r: &PlanReport, fit: Option<Fit>) -> serde_json::Value {
    use serde_json::json;
    let params: Vec<serde_json::Value> = r
        .plan
        .params
        .iter()
        .map(|(name, p)| {
            let n = p.shape.elem_count() as u64;
            let local = if matches!(p.placement, Placement::Shard(_)) { n / mesh.mp as u64 } else { n };
            json!({
                "name": name,
                "shape": p.shape.dims(),
                "placement": match p.placement { Placement::Shard(d) => format!("shard({d})"), _ => "replicate".into() },
                "bytes_per_device": local * r.work.dtype_bytes as u64,
                "reason": p.reason,
            })
        })
        .collect();
    let comm: Vec<serde_json::Value> = r
        .comm
        .entries()
        .into_iter()
        .map(|(k, axis, c)| json!({"kind": format!("{k:?}"), "axis": format!("{axis:?}"), "calls": c.calls, "bytes": c.bytes}))
        .collect();
    let mem = |m: &redco_core::planning::planner::Memory| json!({"params": m.params, "grads": m.grads, "optimizer": m.optimizer, "activations": m.activations, "total": m.total()});
    json!({
        "model": {"model_type": cfg.model_type, "layers": cfg.layers, "hidden": cfg.hidden, "heads": cfg.heads, "vocab": cfg.vocab},
        "mesh": {"dp": mesh.dp, "mp": mesh.mp},
        "workload": {"batch_size": a.batch, "seq_len": a.seq.unwrap_or(0), "dtype": a.dtype, "zero": a.zero, "recompute": a.recompute.name(), "unit_layers": r.work.unit_layers},
        "rules": "name heuristics (config only)",
        "params": params,
        "comm_per_step": comm,
        "memory_per_device": {"train": mem(&r.train), "inference": r.infer},
        "fit": fit.map(|(bytes, max_mp, found)| json!({
            "device_memory": bytes,
            "for": if a.inference { "inference" } else { "training" },
            "smallest_mp": found.map(|(mp, _)| mp),
            "bytes_per_device": found.map(|(_, need)| need),
            "max_mp_tried": max_mp,
        })),
    })
}
