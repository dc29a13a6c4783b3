//! The `Deployer`: where and how a pipeline runs.

use redco_core::ops::random::mix64;
use redco_core::runtime::{spmd_with, CommFactory, Mesh, Rank, SpmdOptions, Threads, World};
use redco_core::{Backend, Error, Result};
use redco_cpu::Cpu;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How a rank's device is made: `make(rank, threads_per_rank)`.
pub type MakeBackend<B> = dyn Fn(usize, usize) -> Result<B> + Send + Sync;

/// The mesh, the seed, the working directory, the SPMD options and the backend of a run:
/// every rank gets its own device from [`Deployer::backend`] (CPU ranks sharing the cores
/// by default; see [`Deployer::with_backend`] for others).
pub struct Deployer<B: Backend = Cpu> {
    /// The mesh (`dp x mp`).
    pub mesh: Mesh,
    /// The seed of data order, dropout and initialisation.
    pub seed: u64,
    /// Where checkpoints and metrics go.
    pub workdir: PathBuf,
    /// Timeouts and threads per rank.
    pub opts: SpmdOptions,
    make_backend: Arc<MakeBackend<B>>,
    /// The transport: which ranks run here and how they talk (threads by default).
    comm: Arc<dyn CommFactory<B>>,
}

impl<B: Backend> Clone for Deployer<B> {
    fn clone(&self) -> Self {
        Deployer {
            mesh: self.mesh,
            seed: self.seed,
            workdir: self.workdir.clone(),
            opts: self.opts.clone(),
            make_backend: self.make_backend.clone(),
            comm: self.comm.clone(),
        }
    }
}

impl<B: Backend> std::fmt::Debug for Deployer<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Deployer")
            .field("mesh", &self.mesh)
            .field("seed", &self.seed)
            .field("workdir", &self.workdir)
            .field("opts", &self.opts)
            .field("backend", &std::any::type_name::<B>())
            .field("transport", &self.comm.name())
            .finish()
    }
}

impl Deployer<Cpu> {
    /// A deployer on CPU ranks that share the machine's cores; creates `workdir`.
    pub fn new(mesh: Mesh, seed: u64, workdir: &Path) -> Result<Self> {
        Deployer::with_backend(mesh, seed, workdir, |_, threads| Cpu::try_new(threads))
    }
}

impl<B: Backend> Deployer<B> {
    /// A deployer whose ranks run on devices from `make_backend(rank, threads_per_rank)`
    /// (e.g. `|_, _| Wgpu::new()`: one device per rank); creates `workdir`.
    pub fn with_backend(
        mesh: Mesh,
        seed: u64,
        workdir: &Path,
        make_backend: impl Fn(usize, usize) -> Result<B> + Send + Sync + 'static,
    ) -> Result<Self> {
        std::fs::create_dir_all(workdir).map_err(|e| Error::io("deployer", "cannot create workdir", workdir, e))?;
        Ok(Deployer {
            mesh,
            seed,
            workdir: workdir.to_path_buf(),
            opts: SpmdOptions::default(),
            make_backend: Arc::new(make_backend),
            comm: Arc::new(Threads::new()),
        })
    }

    /// The same deployer with its ranks made and connected by `comm` (e.g. one rank per
    /// MPI process, from `redco-mpi`). The mesh must fit `comm`'s world.
    pub fn with_comm(mut self, comm: Arc<dyn CommFactory<B>>) -> Result<Self> {
        comm.local_ranks(self.mesh)?;
        self.comm = comm;
        Ok(self)
    }

    /// The transport.
    pub fn comm(&self) -> &Arc<dyn CommFactory<B>> {
        &self.comm
    }

    /// This process's place in the job.
    pub fn world(&self) -> World {
        self.comm.world()
    }

    /// Whether this process runs mesh rank 0 (the rank that logs, writes the manifest,
    /// metrics and plots, and returns the report the user sees).
    pub fn is_leader(&self) -> bool {
        self.comm.local_ranks(self.mesh).map(|l| l.first() == Some(&0)).unwrap_or(false)
    }

    /// The ranks of the mesh this process runs.
    pub fn local_ranks(&self) -> Result<Vec<usize>> {
        self.comm.local_ranks(self.mesh)
    }

    /// A new device as rank `rank` with `threads` compute threads would get it (outside an
    /// SPMD run: e.g. to trace the model once before the ranks start).
    pub fn backend(&self, rank: usize, threads: usize) -> Result<B> {
        (self.make_backend)(rank, threads)
    }

    /// Runs `f` on every rank of this process (one thread and one device each); the local
    /// ranks' results in rank order (every rank's with threads, this process's one with a
    /// process per rank).
    pub fn run<R: Send>(&self, f: impl Fn(&Rank<B>) -> Result<R> + Sync) -> Result<Vec<R>> {
        spmd_with(&*self.comm, self.mesh, &self.opts, |rank, threads| (self.make_backend)(rank, threads), f)
    }
}

/// What `loss_fn` and `pred_fn` see besides the model and the batch.
pub struct StepCtx<'a, B: Backend> {
    /// This rank's device.
    pub backend: &'a B,
    /// This rank.
    pub rank: usize,
    /// The mesh.
    pub mesh: Mesh,
    /// Optimizer step (0-based) and micro-batch within it.
    pub step: u64,
    /// Micro-batch index within the step.
    pub micro: usize,
    /// Training (dropout on) or evaluation.
    pub train: bool,
    /// The run's seed.
    pub seed: u64,
}

impl<B: Backend> StepCtx<'_, B> {
    /// A dropout seed for call site `site` of this micro-batch: the same on every rank and
    /// mesh, different at every step, micro-batch and site.
    pub fn rng(&self, site: u64) -> u64 {
        mix64(mix64(self.seed ^ (self.step << 20) ^ self.micro as u64) ^ site)
    }
}
