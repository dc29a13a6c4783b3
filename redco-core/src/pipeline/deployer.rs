//! The `Deployer`: where and how a pipeline runs.

use crate::cpu::Cpu;
use crate::dist::{spmd_cpu, Mesh, Rank, SpmdOptions};
use crate::ops::random::mix64;
use crate::{Backend, Error, Result};
use std::path::{Path, PathBuf};

/// The mesh, the seed, the working directory and the SPMD options of a run (CPU ranks).
#[derive(Debug, Clone)]
pub struct Deployer {
    /// The mesh (`dp x mp`).
    pub mesh: Mesh,
    /// The seed of data order, dropout and initialisation.
    pub seed: u64,
    /// Where checkpoints and metrics go.
    pub workdir: PathBuf,
    /// Timeouts and threads per rank.
    pub opts: SpmdOptions,
}

impl Deployer {
    /// A deployer; creates `workdir`.
    pub fn new(mesh: Mesh, seed: u64, workdir: &Path) -> Result<Self> {
        std::fs::create_dir_all(workdir)
            .map_err(|e| Error::invalid("deployer", format!("cannot create workdir {}: {e}", workdir.display())))?;
        Ok(Deployer { mesh, seed, workdir: workdir.to_path_buf(), opts: SpmdOptions::default() })
    }

    /// Runs `f` on every rank (threads sharing the cores); results in rank order.
    pub fn run<R: Send>(&self, f: impl Fn(&Rank<Cpu>) -> Result<R> + Sync) -> Result<Vec<R>> {
        spmd_cpu(self.mesh, &self.opts, f)
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
