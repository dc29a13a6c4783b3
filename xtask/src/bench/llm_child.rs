//! The child process of `cargo xtask bench llm` (`bench llm --child`): one repetition of
//! one redco system (a backend and a mesh) on the bench LLaMA, printed as one JSON line:
//! the seconds of each timed training step (and its phases), forward pass and `generate`,
//! the last training loss and the process's peak resident set.

use super::decode::redco_once;
use super::llm::{hf_config, Shape, ADAMW, BATCH, PROMPT, SEQ};
use redco_core::nn::Module;
use redco_core::nn::ModuleExt;
use redco_core::optim::{AdamW, Optimizer};
use redco_core::planning::trace::plan_from_trace;
use redco_core::{no_grad, Backend, DType, Error, MeshAxis, Tensor};
use redco_core::{
    planning::ShardPlan,
    runtime::{on_backend, Mesh, Rank, SpmdOptions},
};
use redco_cpu::spmd_cpu;
use redco_models::hf::config::HfConfig;
use redco_models::llama::Llama;
use redco_pipeline::data_parallel::{sync_grads, OverlappedBuckets, DEFAULT_BUCKET_BYTES};
use std::collections::BTreeMap;
use std::time::Instant;

/// Deterministic pseudo-random token ids in `0..vocab`.
pub(super) fn token_ids(n: usize, vocab: usize, seed: u64) -> Vec<i64> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s % vocab as u64) as i64
        })
        .collect()
}

/// `VmHWM` (this process's peak resident set) in bytes.
pub(super) fn peak_rss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

/// What a rank measured, in seconds per timed run.
pub(super) struct RankTimes {
    pub(super) train: Vec<f64>,
    pub(super) phases: Vec<[f64; 4]>,
    pub(super) fwd: Vec<f64>,
    pub(super) decode: Vec<f64>,
    pub(super) loss: f64,
}

/// What every rank measures, the same on every backend.
struct Job<'a> {
    cfg: &'a HfConfig,
    mesh: Mesh,
    plan: Option<&'a ShardPlan>,
    ids: &'a [i64],
    prompt: &'a [i64],
    steps: usize,
    new: usize,
    only: Option<&'a str>,
    overlap: bool,
    /// The compute dtype (F32, or BF16 with f32 master weights in training).
    dtype: DType,
}

impl Job<'_> {
    fn want(&self, measure: &str) -> bool {
        self.only.is_none_or(|o| o == measure)
    }

    /// One rank's measures: a warm-up then `steps` timed runs of each.
    fn measure<B: Backend>(&self, rk: &Rank<B>) -> redco_core::Result<RankTimes> {
        let (b, steps, vocab) = (&rk.backend, self.steps, self.cfg.vocab);
        let mut model = Llama::new(b, self.cfg, DType::F32, 0)?;
        if let Some(p) = self.plan {
            p.apply(&mut model, Some(&rk.comm))?;
        }
        // f32 master weights (what AdamW updates) and the model's copies in the compute
        // dtype, refreshed after each step, as the Trainer's mixed precision
        let mixed = self.dtype != DType::F32;
        let mut masters: BTreeMap<String, Tensor<B>> = model.named_parameters().into_iter().collect();
        let dtype = self.dtype;
        let refresh = |model: &mut Llama<B>, masters: &BTreeMap<String, Tensor<B>>| -> redco_core::Result<()> {
            let mut err = None;
            model.visit_mut("", &mut |name, p| match masters[name].cast(dtype) {
                Ok(t) => *p = t.detach().into_var(),
                Err(e) => err = Some(e),
            });
            err.map_or(Ok(()), Err)
        };
        if mixed {
            refresh(&mut model, &masters)?;
        }
        let whole = Tensor::from_vec(b, self.ids.to_vec(), [BATCH, SEQ])?;
        let ids = if self.mesh.dp > 1 { whole.shard_along(MeshAxis::Dp, 0)? } else { whole };
        let comm = Some(rk.comm.clone());
        let mut opt = AdamW::new(ADAMW).with_comm(comm.clone());
        let mut out = RankTimes { train: vec![], phases: vec![], fwd: vec![], decode: vec![], loss: f64::NAN };
        for i in (0..=steps).filter(|_| self.want("train")) {
            let t = Instant::now();
            let (model_ref, opt_ref, ids_ref, comm_ref) = (&mut model, &mut opt, &ids, &comm);
            let (masters_ref, refresh_ref) = (&mut masters, &refresh);
            let (value, phases) = on_backend(b, move || -> redco_core::Result<(f64, [f64; 4])> {
                let mut lap = Instant::now();
                let mut split = || {
                    let s = lap.elapsed().as_secs_f64();
                    lap = Instant::now();
                    s
                };
                let loss = model_ref.loss(ids_ref, None, ids_ref)?;
                let value = loss.replicate()?.to_scalar()?;
                let f = split();
                // with --overlap, dp gradient buckets start their all-reduce during
                // backward and "grad sync" is the wait for them after it
                let mut params: Vec<Tensor<B>> = model_ref.named_parameters().into_iter().map(|(_, p)| p).collect();
                let mut grads = redco_core::GradStore::new();
                let mut buckets = comm_ref
                    .clone()
                    .filter(|c| self.overlap && c.mesh().dp > 1)
                    .map(|c| OverlappedBuckets::new(c, &params, DEFAULT_BUCKET_BYTES));
                match buckets.as_mut() {
                    Some(bk) => loss.backward_into_with(&mut grads, &mut |p, g| bk.ready(p, g))?,
                    None => loss.backward_into(&mut grads)?,
                }
                if mixed {
                    // gradients of the compute copies, as f32 gradients of the masters
                    let mut g32 = redco_core::GradStore::new();
                    for (name, p) in model_ref.named_parameters() {
                        if let Some(g) = grads.get(&p) {
                            g32.insert(&masters_ref[&name], g.cast(DType::F32)?);
                        }
                    }
                    grads = g32;
                    params = masters_ref.values().cloned().collect();
                }
                let bw = split();
                match buckets {
                    Some(bk) => bk.finish(&mut grads)?,
                    None => sync_grads(comm_ref.as_ref(), &params, &mut grads, DEFAULT_BUCKET_BYTES)?,
                }
                let sync = split();
                if mixed {
                    opt_ref.update(masters_ref, &grads)?;
                    refresh_ref(model_ref, masters_ref)?;
                } else {
                    opt_ref.step(model_ref, &grads)?;
                }
                // queued device work counts in the step
                b.sync()?;
                Ok((value, [f, bw, sync, split()]))
            })?;
            out.loss = value;
            if i > 0 {
                out.train.push(t.elapsed().as_secs_f64());
                out.phases.push(phases);
            }
        }
        if self.want("train") && !out.loss.is_finite() {
            return Err(Error::invalid("bench llm", format!("the training loss is {}", out.loss)));
        }
        drop(opt);
        for i in (0..=steps).filter(|_| self.want("forward")) {
            let t = Instant::now();
            let logits = no_grad(|| on_backend(b, || model.forward(&ids, None, None)))?;
            b.sync()?;
            if i > 0 {
                out.fwd.push(t.elapsed().as_secs_f64());
            }
            if logits.shape().dims() != [BATCH, SEQ, vocab] {
                return Err(Error::invalid("bench llm", format!("logits of shape {}", logits.shape())));
            }
        }
        let p = Tensor::from_vec(b, self.prompt.to_vec(), [1, PROMPT])?;
        for i in (0..=steps).filter(|_| self.want("decode")) {
            let s = redco_once(&model, &p, self.new).map_err(|e| Error::invalid("bench llm decode", e))?;
            if i > 0 {
                out.decode.push(s);
            }
        }
        Ok(out)
    }
}

/// The child: one repetition of one redco system (`backend` on `mesh`), printed as one JSON
/// line; `only` (`train`, `forward` or `decode`) runs one measure alone (for profiling).
pub fn child(
    backend: &str,
    mesh: Mesh,
    threads_per_rank: usize,
    (steps, new): (usize, usize),
    only: Option<&str>,
    overlap: bool,
    shape: Shape,
) -> Result<(), String> {
    if let Some(o) = only.filter(|o| !["train", "forward", "decode"].contains(o)) {
        return Err(format!("--only {o}: expected train, forward or decode"));
    }
    let (_, cfg) = hf_config(shape)?;
    let vocab = cfg.vocab;
    let ids = token_ids(BATCH * SEQ, vocab, 1);
    let prompt: Vec<i64> = (0..PROMPT as i64).map(|i| (i * 37 + 11) % vocab as i64).collect();
    // the sharding plan, traced from a short forward pass on one CPU device (the plan does
    // not depend on the backend)
    let plan = if mesh.size() > 1 {
        let b = redco_cpu::Cpu::try_new(threads_per_rank * mesh.size()).map_err(|e| e.to_string())?;
        let m = Llama::new(&b, &cfg, DType::F32, 0).map_err(|e| e.to_string())?;
        let ids = Tensor::from_vec(&b, ids[..2 * 8].to_vec(), [2, 8]).map_err(|e| e.to_string())?;
        let loss = m.loss(&ids, None, &ids).map_err(|e| e.to_string())?;
        Some(plan_from_trace(&m.named_parameters(), &[&loss], mesh, false).map_err(|e| e.to_string())?)
    } else {
        None
    };
    let dtype = if shape.dtype == "bf16" { DType::BF16 } else { DType::F32 };
    if dtype != DType::F32 && (overlap || backend.starts_with("pjrt")) {
        return Err(format!(
            "--dtype {}: measured without --overlap, on the cpu, cpu-mpi, wgpu and cuda backends",
            shape.dtype
        ));
    }
    let job =
        Job { cfg: &cfg, mesh, plan: plan.as_ref(), ids: &ids, prompt: &prompt, steps, new, only, overlap, dtype };
    let opts = SpmdOptions { threads_per_rank: Some(threads_per_rank), ..Default::default() };
    let with_rss = |r: RankTimes| (r, peak_rss() as f64);
    let results = match backend {
        "cpu" => spmd_cpu(mesh, &opts, |rk| job.measure(rk).map(with_rss)),
        // one device per rank
        #[cfg(feature = "wgpu")]
        "wgpu" => {
            redco_core::runtime::spmd(mesh, &opts, |_, _| redco_wgpu::Wgpu::new(), |rk| job.measure(rk).map(with_rss))
        }
        // one GPU per rank, NCCL between them
        #[cfg(feature = "cuda")]
        "cuda" => {
            let nccl = redco_cuda::NcclFactory::new(std::sync::Arc::new(redco_core::runtime::Threads::new()));
            redco_core::runtime::spmd_with(
                &nccl,
                mesh,
                &opts,
                |rank, _| redco_cuda::Cuda::new(rank),
                |rk| job.measure(rk).map(with_rss),
            )
        }
        // one process per rank: the peak RSS is the sum over the processes
        #[cfg(feature = "mpi")]
        "cpu-mpi" => {
            let mpi = redco_mpi::Mpi::init().map_err(|e| e.to_string())?;
            let f: &dyn redco_core::runtime::CommFactory<redco_cpu::Cpu> = &*mpi;
            let r = redco_core::runtime::spmd_with(
                f,
                mesh,
                &opts,
                |_, t| redco_cpu::Cpu::try_new(t),
                |rk| {
                    let times = job.measure(rk)?;
                    Ok((times, super::mpi::sum_over_mesh(rk, peak_rss() as f64)?))
                },
            );
            if mpi.world().rank != 0 {
                return r.map(|_| ()).map_err(|e| e.to_string());
            }
            r
        }
        // one device of one PJRT client per rank, every op its own program
        #[cfg(feature = "tpu")]
        "pjrt-eager" => {
            let base = redco_tpu::Pjrt::from_env(mesh.size()).map_err(|e| e.to_string())?;
            redco_core::runtime::spmd(mesh, &opts, |rank, _| base.on_device(rank), |rk| job.measure(rk).map(with_rss))
        }
        // the training step compiled into one SPMD program over the mesh's devices
        #[cfg(feature = "tpu")]
        "pjrt" => {
            let b = redco_tpu::Pjrt::from_env(mesh.size()).map_err(|e| e.to_string())?;
            let r = super::llm_pjrt::measure_compiled(&b, mesh, &cfg, (&ids, &prompt), (steps, new), only)?;
            Ok(vec![with_rss(r)])
        }
        other => return Err(super::backends::parse(other).err().unwrap_or_else(|| format!("backend `{other}`"))),
    }
    .map_err(|e| e.to_string())?;
    let (r, rss) = results.into_iter().next().ok_or("no rank results")?;
    let out = serde_json::json!({
        "train_s": r.train,
        "phases_s": r.phases,
        "fwd_s": r.fwd,
        "decode_s": r.decode,
        "loss": r.loss,
        "peak_rss": rss,
    });
    println!("{out}");
    Ok(())
}
