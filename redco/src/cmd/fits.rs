//! Refusing work that cannot fit this machine before anything is allocated for it: a
//! training run's memory (the planner's estimate) and a generation's context and memory.

use redco_core::planning::heuristics::plan_by_names;
use redco_core::planning::strategy::Strategy;
use redco_core::runtime::Mesh;
use redco_core::DType;
use redco_models::hf::config::HfConfig;

/// Bytes of memory this machine has available for a new run (Linux's `MemAvailable`), when
/// known.
pub fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024))
}

/// The memory tools of a training run and why: an explicit `--recompute`, or (without
/// one) the planner's pick among those this model has that fit this host's available memory
/// per rank (`redco_core::planning::strategy`); refused before anything is allocated when
/// none fits, with the numbers. The ZeRO stage is taken as given (`--zero`): it changes the
/// layout of the run's checkpoints, so the planner does not switch it.
pub fn choose_strategy(
    cfg: &HfConfig,
    mesh: Mesh,
    (batch, seq): (usize, usize),
    compute: DType,
    (zero, recompute): (u8, Option<bool>),
) -> Result<(Strategy, String), String> {
    use redco_core::planning::planner::{human, Workload};
    use redco_core::planning::strategy::{pick, strategies};
    let can_recompute = matches!(cfg.model_type.as_str(), "llama" | "mistral");
    // ZeRO on one data-parallel rank changes nothing
    let zero = if mesh.dp > 1 { zero } else { 0 };
    let chosen = |r: bool| Strategy { zero, recompute: r };
    let Ok(shapes) = cfg.param_shapes() else {
        return Ok((chosen(recompute.unwrap_or(false)), "no estimate for this model".into()));
    };
    let plan = plan_by_names(&shapes, mesh);
    let dtype_bytes = if compute == DType::F32 { 4 } else { 2 };
    let work = Workload { batch, seq, dtype_bytes, zero: 0, recompute: false };
    // every rank of a process shares this host's memory
    let ranks = (mesh.size() / super::launch::world().size.max(1)).max(1) as u64;
    let avail = available_memory();
    let budget = avail.map_or(u64::MAX, |a| a / ranks);
    // (the estimate counts the f32 master weights of a 16-bit run)
    let masters = 0;
    let rows: Vec<_> = strategies(&plan, &cfg.dims(), &work, budget, masters)
        .into_iter()
        .filter(|r| r.strategy.zero == zero && recompute.is_none_or(|want| r.strategy.recompute == want))
        .filter(|r| can_recompute || (!r.strategy.recompute && r.strategy.zero < 3))
        .collect();
    if let Some(i) = pick(&rows) {
        let r = &rows[i];
        let peak = human(r.memory.total().saturating_add(masters));
        let why = match (recompute, avail) {
            (Some(_), _) => format!("--recompute; about {peak} per rank"),
            (None, Some(_)) => format!("auto: about {peak} per rank of {} available", human(budget)),
            (None, None) => format!("auto: about {peak} per rank (available memory unknown)"),
        };
        return Ok((r.strategy, why));
    }
    // nothing fits: the smallest of the candidates, against what there is
    let least = rows.iter().map(|r| r.memory.total().saturating_add(masters)).min().unwrap_or(u64::MAX);
    let need = least.saturating_mul(ranks);
    let hint =
        if can_recompute && recompute != Some(true) { "recompute activations (--recompute block), " } else { "" };
    Err(format!(
        "training with --batch-size {batch} --seq-len {seq} on mesh {mesh} needs about {} of memory (parameters, \
         gradients, optimizer state and activations), but this machine has {} available; lower --batch-size or \
         --seq-len, {hint}or split the model over more ranks (see `redco plan`)",
        human(need),
        human(avail.unwrap_or(0))
    ))
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
) -> Result<(), String> {
    let t5 = cfg.model_type == "t5";
    let total = seq.saturating_add(new);
    if let (false, Some(ctx)) = (t5, cfg.max_positions) {
        if total > ctx {
            return Err(format!(
                "the longest prompt is {seq} tokens and --max-new-tokens asks for {new} more: {total} tokens, beyond \
                 the model's context of {ctx} (max_position_embeddings); shorten the prompt or lower --max-new-tokens"
            ));
        }
    }
    let Some(avail) = available_memory() else { return Ok(()) };
    let b = |x: usize| x as u128;
    let dtype_bytes: u128 = if compute == DType::F32 { 4 } else { 2 };
    let params: u128 = match cfg.param_shapes() {
        Ok(shapes) => shapes.iter().map(|(_, s)| b(s.elem_count())).sum(),
        // encoder-decoder: two stacks of attention and feed-forward blocks, and the embedding
        Err(_) => {
            let (h, f) = (b(cfg.hidden), b(cfg.intermediate));
            2 * b(cfg.layers) * (4 * h * h + 2 * h * f) + b(cfg.vocab) * h
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
    let need = (params * dtype_bytes + kv + logits + scores).min(u128::from(u64::MAX)) as u64;
    if need > avail {
        return Err(format!(
            "generating {rows} sequence(s) (prompts x beams) of {seq} prompt tokens and {new} new ones needs about {} \
             of memory (weights, KV cache, logits and attention scores), but this machine has {} available; shorten \
             the prompts, or lower --num-beams or --max-new-tokens",
            redco_core::planning::planner::human(need),
            redco_core::planning::planner::human(avail)
        ));
    }
    Ok(())
}
