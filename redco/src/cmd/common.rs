//! Pieces the subcommands share: parsing meshes and dtypes, and planning a checkpoint's
//! split from its configuration.

use redco_core::dist::heuristics::plan_by_names;
use redco_core::dist::{spmd_with, Mesh, ShardPlan, SpmdOptions};
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

/// Threads per rank when `total` threads (default: the host's cores) are shared by the
/// `ranks` ranks of `mesh` that run on this host (every rank for thread ranks; the host's
/// processes under a launcher).
pub fn threads_per_rank(total: Option<usize>, mesh: Mesh) -> usize {
    let mine = own_cores();
    if total.is_none() && super::launch::is_multi_process() && mine < host_cores() {
        // the launcher bound this process to its own cores: they are the rank's
        return mine;
    }
    let total = total.unwrap_or_else(host_cores);
    (total / super::launch::ranks_on_host(mesh)).max(1)
}

/// The cores this process may run on (its affinity mask).
fn own_cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// The host's online cores (`/sys/devices/system/cpu/online`), whatever this process's
/// affinity; at least this process's own.
pub fn host_cores() -> usize {
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").ok().map(|s| {
        s.trim()
            .split(',')
            .filter_map(|r| match r.split_once('-') {
                Some((a, b)) => Some(b.parse::<usize>().ok()? + 1 - a.parse::<usize>().ok()?),
                None => r.parse::<usize>().ok().map(|_| 1),
            })
            .sum::<usize>()
    });
    online.unwrap_or(0).max(own_cores())
}

/// A compute backend compiled into this program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// The CPU backend (always compiled in).
    Cpu,
    /// The wgpu backend (the `wgpu` feature): one device per rank.
    #[cfg(feature = "wgpu")]
    Wgpu,
    /// The PJRT backend (the `tpu` feature): one device of the plugin's client per rank.
    #[cfg(feature = "tpu")]
    Pjrt,
    /// The CUDA backend (the `cuda` feature): one GPU per rank.
    #[cfg(feature = "cuda")]
    Cuda,
}

/// The backends compiled into this program, for messages.
const AVAILABLE: &str = {
    // every combination spelt out: const code cannot join strings
    match (cfg!(feature = "wgpu"), cfg!(feature = "tpu"), cfg!(feature = "cuda")) {
        (false, false, false) => "cpu",
        (true, false, false) => "cpu, wgpu",
        (false, true, false) => "cpu, pjrt",
        (false, false, true) => "cpu, cuda",
        (true, true, false) => "cpu, wgpu, pjrt",
        (true, false, true) => "cpu, wgpu, cuda",
        (false, true, true) => "cpu, pjrt, cuda",
        (true, true, true) => "cpu, wgpu, pjrt, cuda",
    }
};

/// The backend `name`, if it is compiled into this program.
pub fn backend(name: &str) -> Result<BackendKind, String> {
    match name {
        "cpu" => Ok(BackendKind::Cpu),
        #[cfg(feature = "wgpu")]
        "wgpu" => Ok(BackendKind::Wgpu),
        #[cfg(not(feature = "wgpu"))]
        "wgpu" => Err(format!(
            "backend `wgpu` is not compiled into this redco (build with `--features wgpu`); available: {AVAILABLE}"
        )),
        #[cfg(feature = "tpu")]
        "pjrt" | "tpu" => Ok(BackendKind::Pjrt),
        #[cfg(not(feature = "tpu"))]
        "pjrt" | "tpu" => Err(format!(
            "backend `{name}` is not compiled into this redco (build with `--features tpu`); available: {AVAILABLE}"
        )),
        #[cfg(feature = "cuda")]
        "cuda" => Ok(BackendKind::Cuda),
        #[cfg(not(feature = "cuda"))]
        "cuda" => Err(format!(
            "backend `cuda` is not compiled into this redco (build with `--features cuda`); available: {AVAILABLE}"
        )),
        other => Err(format!("unknown backend `{other}` (available: {AVAILABLE})")),
    }
}

/// Runs `f` on each rank of `mesh` with a backend from `make(rank, threads)` and returns
/// this process's first rank's result: on this thread, without a communicator, for one
/// device; as an SPMD run otherwise (a thread per rank, or this process's rank under a
/// launcher).
pub fn on_mesh<B, R, M, F>(mesh: Mesh, threads: usize, make: M, f: F) -> redco_core::Result<R>
where
    B: redco_core::Backend,
    R: Send,
    M: Fn(usize, usize) -> redco_core::Result<B> + Sync,
    F: Fn(&B) -> redco_core::Result<R> + Sync,
{
    if mesh.size() == 1 && !super::launch::is_multi_process() {
        return f(&make(0, threads)?);
    }
    let opts = SpmdOptions { threads_per_rank: Some(threads), ..SpmdOptions::default() };
    let factory = super::launch::factory::<B>();
    spmd_with(&*factory, mesh, &opts, make, |rk| f(&rk.backend)).map(|mut v| v.swap_remove(0))
}

/// Runs the generic per-rank function `$f` (called as `$f(&backend)`) over `$mesh` on the
/// backend `$kind` (a [`BackendKind`]) with `$threads` CPU threads per rank, and returns
/// rank 0's result.
macro_rules! on_backend {
    ($kind:expr, $mesh:expr, $threads:expr, $f:expr) => {
        match $kind {
            $crate::cmd::common::BackendKind::Cpu => $crate::cmd::common::on_mesh(
                $mesh,
                $threads,
                |_, t| redco_core::cpu::Cpu::try_new(t),
                |b: &redco_core::cpu::Cpu| $f(b),
            ),
            #[cfg(feature = "wgpu")]
            $crate::cmd::common::BackendKind::Wgpu => $crate::cmd::common::on_mesh(
                $mesh,
                $threads,
                |_, _| redco_wgpu::Wgpu::new(),
                |b: &redco_wgpu::Wgpu| $f(b),
            ),
            #[cfg(feature = "tpu")]
            $crate::cmd::common::BackendKind::Pjrt => $crate::cmd::common::on_mesh(
                $mesh,
                $threads,
                |rank, _| $crate::cmd::pjrt::backend(rank, $mesh.size()),
                |b: &redco_tpu::Pjrt| $f(b),
            ),
            #[cfg(feature = "cuda")]
            $crate::cmd::common::BackendKind::Cuda => $crate::cmd::common::on_mesh(
                $mesh,
                $threads,
                |rank, _| $crate::cmd::cuda::backend(rank),
                |b: &redco_cuda::Cuda| $f(b),
            ),
        }
    };
}
pub(crate) use on_backend;

/// The CPU backend's devices are its cores: a mesh with more ranks than cores is refused
/// unless `oversubscribe`.
pub fn check_devices(mesh: Mesh, threads: Option<usize>, oversubscribe: bool) -> Result<(), String> {
    let cores = threads.unwrap_or_else(host_cores);
    let here = super::launch::ranks_on_host(mesh);
    if here > cores && !oversubscribe {
        let w = super::launch::world();
        let whose = if w.size > 1 {
            format!("{here} ranks run on host {}", w.host)
        } else {
            format!("mesh {mesh} needs {here} devices")
        };
        let has = match threads {
            Some(t) => format!("{t} (--threads {t})"),
            None => format!("{cores} (cores)"),
        };
        return Err(format!("{whose} but the cpu backend has {has}; use a smaller mesh or --oversubscribe"));
    }
    Ok(())
}

/// Whether the model directory holds a T5 (encoder-decoder) config.
pub fn is_t5(dir: &std::path::Path) -> bool {
    HfConfig::from_dir(dir).is_ok_and(|c| c.model_type == "t5")
}

/// Bytes of memory this machine has available for a new run (Linux's `MemAvailable`), when
/// known.
pub fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib.saturating_mul(1024))
}

/// Refuses a training run whose estimated memory (f32 master weights, gradients, AdamW
/// moments and activations: the planner's per-rank estimate, for this host's ranks) is
/// beyond what the machine has available, before anything is allocated: a clear error
/// instead of an aborted allocation of tens of gigabytes.
pub fn check_training_fits(cfg: &HfConfig, mesh: Mesh, batch: usize, seq: usize, compute: DType) -> Result<(), String> {
    use redco_core::dist::planner::{train_memory, Workload};
    let (Ok(shapes), Some(avail)) = (cfg.param_shapes(), available_memory()) else { return Ok(()) };
    let plan = plan_by_names(&shapes, mesh);
    let dtype_bytes = if compute == DType::F32 { 4 } else { 2 };
    let work = Workload { batch, seq, dtype_bytes, zero1: false };
    let m = train_memory(&plan, &cfg.dims(), &work, false);
    // master weights stay f32 whatever the compute dtype; every rank of a process shares
    // this host's memory
    let ranks = mesh.size() as u64 / super::launch::world().size.max(1) as u64;
    let need = m.total().saturating_add(m.params / dtype_bytes as u64 * 4).saturating_mul(ranks.max(1));
    if need > avail {
        return Err(format!(
            "training with --batch-size {batch} --seq-len {seq} on mesh {mesh} needs about {} of memory (parameters, \
             gradients, optimizer state and activations), but this machine has {} available; lower --batch-size or \
             --seq-len, or split the model over more ranks (see `redco plan`)",
            redco_core::dist::planner::human(need),
            redco_core::dist::planner::human(avail)
        ));
    }
    Ok(())
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
            redco_core::dist::planner::human(need),
            redco_core::dist::planner::human(avail)
        ));
    }
    Ok(())
}
