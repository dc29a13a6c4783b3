//! The one place a `--backend` name becomes a backend type. [`backend`] parses the name
//! into a [`BackendKind`]; [`dispatch`] makes that backend's [`Devices`] (how a rank gets
//! its device, how one device is made for this process alone, which transport connects
//! the ranks) and hands them to an [`OnBackend`] visitor, generic over the backend, which
//! builds a [`Deployer`], runs a closure on every rank of a mesh, or uses one device. A
//! backend's extras for the command line (PJRT's compiled training step) are the
//! [`CliBackend`] trait's.

use crate::cmd::launch;
use redco_core::runtime::{spmd_with, Comm, CommFactory, Mesh, SpmdOptions};
use redco_core::{Backend, Result};
use redco_cpu::Cpu;
use redco_models::auto::AutoModel;
use redco_models::hf::config::HfConfig;
use redco_pipeline::{Deployer, Trainer};
use std::sync::Arc;
use std::time::Duration;

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

impl BackendKind {
    /// Whether the backend multiplies by block-quantized weights in place (its own
    /// `quant_matmul` kernels: the CPU's integer dot products, CUDA's `kernels/quant.cu`),
    /// so that a GGUF file's blocks are kept as they are rather than dequantized.
    pub fn reads_blocks(self) -> bool {
        match self {
            BackendKind::Cpu => true,
            #[cfg(feature = "cuda")]
            BackendKind::Cuda => true,
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }
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

/// The backend `name`, if it is compiled into this program. `pjrt` is the backend's name
/// (its type is `redco_tpu::Pjrt`); `tpu`, the facade feature's name, is taken as an alias.
pub fn backend(name: &str) -> std::result::Result<BackendKind, String> {
    match name {
        "cpu" => Ok(BackendKind::Cpu),
        #[cfg(feature = "wgpu")]
        "wgpu" => Ok(BackendKind::Wgpu),
        #[cfg(not(feature = "wgpu"))]
        "wgpu" => Err(format!(
            "backend `wgpu` is not compiled into this redco (build with `--features wgpu`); available: {AVAILABLE}"
        )
        .into()),
        #[cfg(feature = "tpu")]
        "pjrt" | "tpu" => Ok(BackendKind::Pjrt),
        #[cfg(not(feature = "tpu"))]
        "pjrt" | "tpu" => Err(format!(
            "backend `{name}` is not compiled into this redco (build with `--features tpu`); available: {AVAILABLE}"
        )
        .into()),
        #[cfg(feature = "cuda")]
        "cuda" => Ok(BackendKind::Cuda),
        #[cfg(not(feature = "cuda"))]
        "cuda" => Err(format!(
            "backend `cuda` is not compiled into this redco (build with `--features cuda`); available: {AVAILABLE}"
        )
        .into()),
        other => Err(format!("unknown backend `{other}` (available: {AVAILABLE})")),
    }
}

/// The compiled training step of a decoder-only model, as `redco train` asks for it (read
/// by the backends that compile whole steps: PJRT, with the `tpu` feature).
#[cfg_attr(not(feature = "tpu"), allow(dead_code))]
pub struct LmStep {
    /// The model's configuration.
    pub cfg: HfConfig,
    /// The seed of its initial weights.
    pub seed: u64,
    /// How long a collective waits.
    pub timeout: Duration,
    /// Why the step must run op by op (a flag, LoRA, process ranks, the configuration), if
    /// it must.
    pub blocked: Option<String>,
    /// Whether this process prints.
    pub leader: bool,
}

/// What the command line needs from a backend beyond [`Backend`].
pub trait CliBackend: Backend {
    /// `trainer` with this backend's compiled training step for the decoder-only model of
    /// `step`, when the backend compiles whole steps (PJRT); as it is otherwise.
    fn with_lm_step(
        trainer: Trainer<AutoModel<Self>, Vec<i64>, Self>,
        step: &LmStep,
    ) -> Trainer<AutoModel<Self>, Vec<i64>, Self> {
        let _ = step;
        trainer
    }
}

impl CliBackend for Cpu {}
#[cfg(feature = "wgpu")]
impl CliBackend for redco_wgpu::Wgpu {}
#[cfg(feature = "cuda")]
impl CliBackend for redco_cuda::Cuda {}

type MakeRank<B> = dyn Fn(usize, usize) -> Result<B> + Send + Sync;

/// How a command gets devices of backend `B`: each rank's, one for this process alone, and
/// the transport between ranks.
pub struct Devices<B: Backend> {
    kind: BackendKind,
    /// Rank `rank`'s device with `threads` CPU threads.
    make: Arc<MakeRank<B>>,
    /// One device for work this process does alone, with `threads` CPU threads.
    one: fn(usize) -> Result<B>,
    /// The transport of a training run's ranks.
    comm: Arc<dyn CommFactory<B>>,
}

impl<B: CliBackend> Devices<B> {
    /// A [`Deployer`] over `mesh` with these devices and transport (CPU ranks share
    /// `threads` threads, default every core; `timeout`: seconds a collective waits).
    pub fn deployer(
        &self,
        mesh: Mesh,
        seed: u64,
        workdir: &std::path::Path,
        (threads, timeout): (Option<usize>, Option<f64>),
    ) -> Result<Deployer<B>> {
        let make = self.make.clone();
        let mut dep =
            Deployer::with_backend(mesh, seed, workdir, move |r, t| make(r, t))?.with_comm(self.comm.clone())?;
        if self.kind == BackendKind::Cpu {
            dep.opts.threads_per_rank = Some(super::cores::threads_per_rank(threads, mesh));
        }
        if let Some(t) = timeout {
            dep.opts.timeout = Duration::from_secs_f64(t);
        }
        Ok(dep)
    }

    /// One device for this process alone (e.g. the sample after training), with `threads`
    /// CPU threads.
    pub fn one(&self, threads: usize) -> Result<B> {
        (self.one)(threads)
    }

    /// Runs `f` on each rank of `mesh` (`threads` CPU threads per rank) and returns this
    /// process's first rank's result: on this thread, without a communicator, for one
    /// device; as an SPMD run otherwise (a thread per rank, or this process's rank under a
    /// launcher, connected as the launcher says).
    pub fn on_mesh<R: Send>(
        &self,
        mesh: Mesh,
        threads: usize,
        f: impl Fn(&B, Option<&Comm<B>>) -> Result<R> + Sync,
    ) -> Result<R> {
        if mesh.size() == 1 && !launch::is_multi_process() {
            return f(&(self.make)(0, threads)?, None);
        }
        let opts = SpmdOptions { threads_per_rank: Some(threads), ..SpmdOptions::default() };
        let factory = launch::factory::<B>();
        spmd_with(&*factory, mesh, &opts, |r, t| (self.make)(r, t), |rk| f(&rk.backend, Some(&rk.comm)))
            .map(|mut v| v.swap_remove(0))
    }
}

/// What a command does once its backend type is known.
pub trait OnBackend {
    /// What it returns.
    type Out;
    /// Runs with the chosen backend's devices.
    fn run<B: CliBackend>(self, devices: Devices<B>) -> Result<Self::Out>;
}

/// Runs `v` with the devices of backend `kind` for a run over `mesh`: the one match over
/// the backends.
pub fn dispatch<V: OnBackend>(kind: BackendKind, mesh: Mesh, v: V) -> Result<V::Out> {
    // (only PJRT's devices depend on the mesh)
    let _ = mesh;
    match kind {
        BackendKind::Cpu => v.run(Devices {
            kind,
            make: Arc::new(|_, threads| Cpu::try_new(threads)),
            one: Cpu::try_new,
            comm: launch::factory(),
        }),
        // one device per rank
        #[cfg(feature = "wgpu")]
        BackendKind::Wgpu => v.run(Devices {
            kind,
            make: Arc::new(|_, _| redco_wgpu::Wgpu::new()),
            one: |_| redco_wgpu::Wgpu::new(),
            comm: launch::factory(),
        }),
        // one device of the plugin's client per rank
        #[cfg(feature = "tpu")]
        BackendKind::Pjrt => {
            let size = mesh.size();
            v.run(Devices {
                kind,
                make: Arc::new(move |rank, _| super::pjrt::backend(rank, size)),
                one: |_| super::pjrt::backend(0, 1),
                comm: launch::factory(),
            })
        }
        // one GPU per rank, NCCL between them
        #[cfg(feature = "cuda")]
        BackendKind::Cuda => v.run(Devices {
            kind,
            make: Arc::new(|rank, _| super::cuda::backend(rank)),
            one: |_| super::cuda::backend(0),
            comm: super::cuda::factory(),
        }),
    }
}
