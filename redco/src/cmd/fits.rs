//! Refusing work that cannot fit this machine before anything is allocated for it: a
//! training run's memory (the planner's estimate) and a generation's context and memory.

use crate::cmd::error::CliResult;
use redco_core::planning::heuristics::plan_by_names;
use redco_core::planning::strategy::Strategy;
use redco_core::runtime::Mesh;
use redco_core::{DType, Recompute};
use redco_models::hf::config::HfConfig;

/// Bytes of memory this machine has available for a new run (Linux's `MemAvailable`), when
/// known.
pub fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024))
}

/// What a training run asks of its memory tools: the flags given (`--zero`, `--recompute`;
/// `None` where left to the planner), whether the planner may choose (`--strategy auto`),
/// the device budget per rank (`--device-memory`; else this host's available memory shared
/// by the ranks on it), and what rules stages out (LoRA: ZeRO-3 is not offered; an
/// optimizer without moments: ZeRO-1 is not).
#[derive(Debug, Clone, Copy)]
pub struct StrategyAsk {
    /// `--zero`, when given.
    pub zero: Option<u8>,
    /// `--unit-layers` (ZeRO-3's unit), when given.
    pub unit_layers: Option<usize>,
    /// `--recompute`, when given.
    pub recompute: Option<Recompute>,
    /// `--strategy auto`: what the flags leave open is the planner's pick; otherwise ZeRO-0 and
    /// no recompute.
    pub auto: bool,
    /// `--device-memory`: bytes per rank.
    pub budget: Option<u64>,
    /// The run trains LoRA adapters.
    pub lora: bool,
    /// The optimizer keeps AdamW's moments (ZeRO-1 shards them).
    pub adamw: bool,
    /// `--offload` was given.
    pub offload: bool,
    /// The backend's device memory is not the host's (offload is offered).
    pub device: bool,
    /// `--ep`: the experts split over this many ranks of dp (1: not split).
    pub ep: usize,
}

/// The memory tools of a training run and why: what the flags pin, and for what they leave
/// open (with `--strategy auto`, the default) the planner's pick among the ZeRO stages and
/// recompute this model has that fit the budget per rank (`redco_core::planning::strategy`:
/// the fewest bytes moved and recomputed); refused before anything is allocated when none
/// fits, with the numbers. A run that is resumed may get another pick: its checkpoint is
/// resharded to it.
pub fn choose_strategy(
    cfg: &HfConfig,
    mesh: Mesh,
    (batch, seq): (usize, usize),
    compute: DType,
    ask: StrategyAsk,
) -> CliResult<(Strategy, String)> {
    use redco_core::planning::planner::{human, Workload};
    use redco_core::planning::strategy::{pick, strategies};
    // ZeRO-3 gathers and recompute run per decoder layer: every decoder-only model has them
    let layered = redco_models::auto::SUPPORTED.contains(&cfg.model_type.as_str());
    let recompute = ask.recompute.or((!ask.auto).then_some(Recompute::None));
    // ZeRO on one data-parallel rank changes nothing
    let zero = if mesh.dp > 1 { ask.zero.or((!ask.auto).then_some(0)) } else { Some(0) };
    if ask.offload && !ask.device {
        return Err("--offload moves the optimizer to host memory, and the cpu backend's memory is host memory \
                    already: use it with a device backend (--backend wgpu or cuda)"
            .into());
    }
    if ask.offload && ask.zero == Some(1) && mesh.dp > 1 {
        return Err("--offload with --zero 1 is not supported: ZeRO-1 shards AdamW's moments with collectives \
                    inside the optimizer, on the device (use --zero 2 or 3 with --offload: each rank's host updates \
                    its own slice)"
            .into());
    }
    let offload = if ask.offload { Some(true) } else { (!ask.auto || !ask.device).then_some(false) };
    let offered = |z: u8| match z {
        1 => ask.adamw,
        3 => layered && !ask.lora,
        _ => true,
    };
    let Ok(shapes) = cfg.param_shapes() else {
        let chosen = Strategy {
            zero: zero.unwrap_or(0),
            recompute: recompute.unwrap_or_default(),
            offload: offload == Some(true),
            unit_layers: ask.unit_layers.unwrap_or(1),
        };
        return Ok((chosen, "no estimate for this model".into()));
    };
    let plan = plan_by_names(&shapes, mesh).with_ep(ask.ep)?;
    let dtype_bytes = if compute == DType::F32 { 4 } else { 2 };
    // ZeRO-3's unit: as given, else the planner's (auto) or one layer
    let unit_layers = ask.unit_layers.unwrap_or(if ask.auto { 0 } else { 1 });
    let work = Workload { batch, seq, dtype_bytes, zero: 0, recompute: Recompute::None, unit_layers };
    // every rank on this host shares its memory: the ranks of this process, times the
    // processes on this host
    let world = super::launch::world();
    let ranks = ((mesh.size() / world.size.max(1)).max(1) * world.local_size.max(1)) as u64;
    let avail = available_memory();
    let budget = ask.budget.unwrap_or_else(|| avail.map_or(u64::MAX, |a| a / ranks));
    let rows: Vec<_> = strategies(&plan, &cfg.dims(), &work, budget, 0, offload != Some(false))
        .into_iter()
        .filter(|r| zero.is_none_or(|z| r.strategy.zero == z) && recompute.is_none_or(|w| r.strategy.recompute == w))
        .filter(|r| offload.is_none_or(|o| r.strategy.offload == o))
        .filter(|r| (layered || !r.strategy.recompute.on()) && (ask.zero.is_some() || offered(r.strategy.zero)))
        .collect();
    let against = match (ask.budget, avail) {
        (Some(b), _) => format!("of --device-memory {}", human(b)),
        (None, Some(_)) => format!("of {} available", human(budget)),
        (None, None) => "(available memory unknown)".to_string(),
    };
    if let Some(i) = pick(&rows) {
        let r = &rows[i];
        let peak = human(r.memory.total());
        let open = rows.len() > 1;
        let why = if open {
            let fit = rows.iter().filter(|r| r.fits).count();
            format!(
                "auto: about {peak} per rank {against}; the cheapest of {fit} that fit, of {}: fewest bytes moved \
                 and recomputed (`redco plan` lists them)",
                rows.len()
            )
        } else {
            format!("as given; about {peak} per rank {against}")
        };
        return Ok((r.strategy, why));
    }
    // nothing fits: the smallest of the candidates, against what there is
    let least = rows.iter().min_by_key(|r| r.memory.total());
    let need = least.map_or(u64::MAX, |r| r.memory.total());
    let tried = least.map_or(String::new(), |r| format!(" ({}, the least of those tried)", r.strategy));
    let mut hints = Vec::new();
    if layered && recompute == Some(Recompute::None) {
        hints.push("recompute activations (--recompute selective, or block for the least memory)".to_string());
    }
    if ask.device && offload == Some(false) && zero.is_none_or(|z| z != 1) {
        hints.push("offload the optimizer to host memory (--offload)".to_string());
    }
    if mesh.dp > 1 && zero.is_some_and(|z| z < 3) {
        hints.push("shard the training state over dp (a higher --zero, or --strategy auto)".to_string());
    }
    hints.push("lower --batch-size or --seq-len".into());
    hints.push("split the model over more ranks (see `redco plan`)".into());
    Err(format!(
        "training with --batch-size {batch} --seq-len {seq} on mesh {mesh} needs about {} per rank (parameters, \
         gradients, optimizer state and activations){tried}, but each rank has {} ({}); {}",
        human(need),
        if budget == u64::MAX { "no limit".to_string() } else { human(budget) },
        match ask.budget {
            Some(_) => "--device-memory".to_string(),
            None => format!("{} available on this host, shared by {ranks} ranks", human(avail.unwrap_or(0))),
        },
        hints.join(", or ")
    )
    .into())
}

/// Refuses a generation that cannot fit before anything is allocated for it: beyond the
/// model's context (`max_position_embeddings`, decoder-only models), or needing more
/// memory than this machine has available for the weights, the KV cache of `rows`
/// sequences (prompts x beams) of `seq + new` tokens, the prompt's logits, and the
/// attention scores of the prompt (T5's relative position bias is a `[heads, seq, seq]`
/// tensor per sequence; the decoders' fused attention holds one head group's scores per
/// thread).
pub fn check_generation_fits(
    cfg: &HfConfig,
    (rows, seq, new): (usize, usize, usize),
    compute: DType,
    threads: usize,
    quant: Option<redco_core::quant::QuantFormat>,
) -> CliResult<()> {
    let t5 = cfg.model_type == "t5";
    let total = seq.saturating_add(new);
    if let (false, Some(ctx)) = (t5, cfg.max_positions) {
        if total > ctx {
            return Err(format!(
                "the longest prompt is {seq} tokens and --max-new-tokens asks for {new} more: {total} tokens, beyond \
                 the model's context of {ctx} (max_position_embeddings); shorten the prompt or lower --max-new-tokens"
            )
            .into());
        }
    }
    let Some(avail) = available_memory() else { return Ok(()) };
    let b = |x: usize| x as u128;
    let dtype_bytes: u128 = if compute == DType::F32 { 4 } else { 2 };
    let weights: u128 = match cfg.param_shapes() {
        // the planner's count: the linear layers' blocks (--quantize, or a GGUF's) at
        // their own bytes
        Ok(shapes) => {
            let stored = cfg.block_formats().unwrap_or_default();
            let plan = redco_core::planning::heuristics::plan_by_names(&shapes, redco_core::runtime::Mesh::single())
                .with_quant(quant, &stored);
            plan.bytes_per_rank(dtype_bytes as usize) as u128
        }
        // encoder-decoder: two stacks of attention and feed-forward blocks, and the embedding
        Err(_) => {
            let (h, f) = (b(cfg.hidden), b(cfg.intermediate));
            (2 * b(cfg.layers) * (4 * h * h + 2 * h * f) + b(cfg.vocab) * h) * dtype_bytes
        }
    };
    let kv = 2 * b(cfg.layers) * b(rows) * b(total) * b(cfg.kv_heads) * b(cfg.head_dim) * dtype_bytes;
    let logits = b(rows) * b(seq) * b(cfg.vocab) * 4;
    let scores = if t5 {
        2 * b(rows) * b(cfg.heads) * b(seq) * b(seq) * 4
    } else {
        let group = b(cfg.heads / cfg.kv_heads.max(1));
        b(threads.max(1)) * group * b(seq) * b(seq) * 4 + b(rows) * b(seq) * b(seq)
    };
    let need = (weights + kv + logits + scores).min(u128::from(u64::MAX)) as u64;
    if need > avail {
        return Err(format!(
            "generating {rows} sequence(s) (prompts x beams) of {seq} prompt tokens and {new} new ones needs about {} \
             of memory (weights, KV cache, logits and attention scores), but this machine has {} available; shorten \
             the prompts, or lower --num-beams or --max-new-tokens",
            redco_core::planning::planner::human(need),
            redco_core::planning::planner::human(avail)
        )
        .into());
    }
    Ok(())
}
