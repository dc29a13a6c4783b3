//! The one owner of a training run's directory ([`RunDir`]): the exclusive lock for the
//! run's lifetime, the claim (a fresh run may not silently replace an earlier one; a
//! resumed run must be the run that wrote its checkpoint), and the checkpoint the run
//! resumes from. The command line claims the directory before it writes anything into it
//! and hands the claim to [`Trainer::fit_in`](super::Trainer::fit_in);
//! [`Trainer::fit`](super::Trainer::fit) claims it itself.

use super::checkpoint::Checkpointer;
use super::workdir::{self, WorkdirLock};
use redco_core::Result;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// How a run wants its directory.
#[derive(Debug, Clone, Default)]
pub struct ClaimOptions {
    /// Continue from a checkpoint (the newest, or `resume_from`).
    pub resume: bool,
    /// The checkpoint directory to resume from instead of the newest.
    pub resume_from: Option<PathBuf>,
    /// Replace an earlier run when not resuming.
    pub overwrite: bool,
    /// What makes this run this run; on resume every key must match the checkpoint's.
    pub identity: BTreeMap<String, String>,
    /// Identity keys not known yet when claiming (e.g. the vocabulary, known once the
    /// tokenizer is read): left out of the claim's check, checked when the checkpoint loads.
    pub pending: Vec<String>,
}

/// A claimed run directory. The process that writes the run's files (the leader) holds the
/// directory's lock until this is dropped; the others only read where to resume from.
#[derive(Debug)]
pub struct RunDir {
    path: PathBuf,
    resume: Option<(u64, PathBuf)>,
    resumed: bool,
    _lock: Option<WorkdirLock>,
}

impl RunDir {
    /// Claims `path` for a run. The leader locks it (refused when another run holds it),
    /// then: a fresh run refuses an earlier run's files unless `overwrite` (which removes
    /// them); a resumed run checks the checkpoint's identity and removes partial
    /// checkpoints, or (with no checkpoint) warns and starts from step 0. Every process
    /// finds the checkpoint to resume from.
    pub fn claim(path: &Path, leader: bool, opts: &ClaimOptions) -> Result<RunDir> {
        let lock = if leader { Some(WorkdirLock::acquire(path)?) } else { None };
        let ckpt = Checkpointer::new(path, 0);
        let resume = if opts.resume { workdir::resume_target(&ckpt, opts.resume_from.as_deref())? } else { None };
        if leader {
            match &resume {
                None if !opts.resume => workdir::prepare_fresh(path, &ckpt, opts.overwrite)?,
                None => {
                    tracing::warn!(
                        workdir = %path.display(),
                        "resume asked for, but the workdir holds no checkpoint: starting from step 0"
                    );
                    workdir::truncate_metrics(path, 0)?
                }
                Some((_, dir)) => {
                    let mut recorded = ckpt.extra(dir)?;
                    for k in &opts.pending {
                        recorded.remove(&format!("{}{k}", workdir::IDENTITY_PREFIX));
                    }
                    let known: BTreeMap<String, String> = opts
                        .identity
                        .iter()
                        .filter(|(k, _)| !opts.pending.contains(k))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect();
                    workdir::check_identity(dir, &recorded, &known)?;
                    workdir::remove_partial(&ckpt)?
                }
            }
        }
        Ok(RunDir { path: path.to_path_buf(), resume, resumed: opts.resume, _lock: lock })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The checkpoint the run resumes from (its step and directory), if any.
    pub fn resume_from(&self) -> Option<&(u64, PathBuf)> {
        self.resume.as_ref()
    }

    /// The step the run starts at: the resumed checkpoint's, else 0.
    pub fn start_step(&self) -> u64 {
        self.resume.as_ref().map_or(0, |(s, _)| *s)
    }

    /// Whether the run was asked to resume (with or without a checkpoint to resume from).
    pub fn resumed(&self) -> bool {
        self.resumed
    }
}
