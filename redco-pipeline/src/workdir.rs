//! A training run's ownership of its workdir: an exclusive lock for the run's lifetime, no
//! silent replacement of an earlier run, the run's identity checked on resume, and
//! metrics cut back to the resumed step.

use super::checkpoint::Checkpointer;
use redco_core::{Error, Result};
use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The lock file's name in the workdir.
pub const LOCK_FILE: &str = ".redco.lock";
/// The prefix of identity entries in a checkpoint manifest's `extra`.
pub const IDENTITY_PREFIX: &str = "identity/";

/// An exclusive lock on a workdir, held until the last handle is dropped (the operating
/// system releases it if the process dies, so a killed run never leaves the workdir
/// locked). A run holds it through its [`RunDir`](super::run_dir::RunDir): a program that
/// claims its workdir before setting a run up (as `redco train` does) hands that claim to
/// `Trainer::fit_in` instead of locking twice; a second lock, from this process or
/// another, is refused.
#[derive(Debug, Clone)]
pub struct WorkdirLock {
    _file: Arc<File>,
}

impl WorkdirLock {
    /// Locks `workdir` (creating it), or fails naming the run that holds it.
    pub fn acquire(workdir: &Path) -> Result<WorkdirLock> {
        fs::create_dir_all(workdir).map_err(|e| Error::io("workdir", "cannot create", workdir, e))?;
        let path = workdir.join(LOCK_FILE);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(|e| Error::io("workdir", "cannot open", &path, e))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => {
                let mut holder = String::new();
                let _ = file.read_to_string(&mut holder);
                let holder = holder.trim();
                let who = if holder.is_empty() { "another run".to_string() } else { format!("another run ({holder})") };
                return Err(Error::invalid(
                    "workdir",
                    format!(
                        "{} is in use by {who}; wait for it to finish or choose another workdir",
                        workdir.display()
                    ),
                ));
            }
            Err(fs::TryLockError::Error(e)) => return Err(Error::io("workdir", "cannot lock", &path, e)),
        }
        let host = std::env::var("HOSTNAME").unwrap_or_default();
        let me = format!(
            "pid {}{}",
            std::process::id(),
            if host.is_empty() { String::new() } else { format!(" on {host}") }
        );
        // who holds it is informative only: a failure to write it does not stop the run
        let _ = file.set_len(0).and_then(|()| file.write_all(me.as_bytes()));
        Ok(WorkdirLock { _file: Arc::new(file) })
    }
}

/// Before a run that does not resume: refuses a workdir holding an earlier run's
/// checkpoints or metrics unless `overwrite`, in which case those are removed. Leftover
/// partial checkpoints (`step-*.tmp`, from a run that died while writing) are removed
/// either way.
pub fn prepare_fresh(workdir: &Path, ckpt: &Checkpointer, overwrite: bool) -> Result<()> {
    let metrics = workdir.join("metrics.jsonl");
    let done = ckpt.complete()?;
    let has_metrics = fs::metadata(&metrics).is_ok_and(|m| m.len() > 0);
    if !done.is_empty() || has_metrics {
        if !overwrite {
            let what = match done.iter().map(|(s, _)| *s).max() {
                Some(s) => format!("checkpoints up to step {s}"),
                None => "a metrics.jsonl".to_string(),
            };
            return Err(Error::invalid(
                "workdir",
                format!(
                    "{} holds an earlier run ({what}); continue it with --resume (`fit(.., resume = true)`), \
                     replace it with --overwrite (`TrainConfig::overwrite`), or choose another workdir",
                    workdir.display()
                ),
            ));
        }
        if ckpt.dir.exists() {
            fs::remove_dir_all(&ckpt.dir).map_err(|e| Error::io("workdir", "cannot remove", &ckpt.dir, e))?;
        }
        if metrics.exists() {
            fs::remove_file(&metrics).map_err(|e| Error::io("workdir", "cannot remove", &metrics, e))?;
        }
    }
    remove_partial(ckpt)
}

/// Removes `step-*.tmp` directories: checkpoints whose writing never finished.
pub fn remove_partial(ckpt: &Checkpointer) -> Result<()> {
    let Ok(rd) = fs::read_dir(&ckpt.dir) else { return Ok(()) };
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if name.starts_with("step-") && name.ends_with(".tmp") {
            let p = e.path();
            fs::remove_dir_all(&p).map_err(|e| Error::io("workdir", "cannot remove the partial checkpoint", &p, e))?;
        }
    }
    Ok(())
}

/// The checkpoint a resuming run starts from: `chosen` (its step read from its manifest)
/// when given, else the newest complete one; `None` when there is none.
pub fn resume_target(ckpt: &Checkpointer, chosen: Option<&Path>) -> Result<Option<(u64, PathBuf)>> {
    match chosen {
        Some(dir) => {
            let m = super::checkpoint::Manifest::read(dir)?;
            let inside = match (dir.canonicalize(), ckpt.step_dir(m.step).canonicalize()) {
                (Ok(a), Ok(b)) => a == b,
                _ => false,
            };
            if !inside {
                return Err(Error::invalid(
                    "resume",
                    format!(
                        "{} is not a checkpoint of this workdir (resuming from one needs it at {})",
                        dir.display(),
                        ckpt.step_dir(m.step).display()
                    ),
                ));
            }
            Ok(Some((m.step, dir.to_path_buf())))
        }
        None => ckpt.latest(),
    }
}

/// `e`, a failure to load the checkpoint of `step`, with the older complete checkpoints
/// named, since resuming from one of them takes the user's word (`resume_from`).
pub fn with_older_hint(e: Error, ckpt: &Checkpointer, step: u64) -> Error {
    let mut older: Vec<(u64, PathBuf)> =
        ckpt.complete().unwrap_or_default().into_iter().filter(|(s, _)| *s < step).collect();
    older.sort();
    if older.is_empty() {
        return e;
    }
    let names: Vec<String> = older.iter().rev().map(|(_, d)| d.display().to_string()).collect();
    Error::invalid(
        "resume",
        format!(
            "{e}; older checkpoints: {}; resume from one with --resume-from DIR (`TrainConfig::resume_from`)",
            names.join(", ")
        ),
    )
}

/// The identity entries to record in a checkpoint's `extra`.
pub fn identity_entries(identity: &BTreeMap<String, String>) -> impl Iterator<Item = (String, String)> + '_ {
    identity.iter().map(|(k, v)| (format!("{IDENTITY_PREFIX}{k}"), v.clone()))
}

/// Ok when the identity recorded in checkpoint `dir` (its manifest's `extra`) matches
/// `identity` on every key either side has; else an error listing every difference.
pub fn check_identity(
    dir: &Path,
    recorded: &BTreeMap<String, String>,
    identity: &BTreeMap<String, String>,
) -> Result<()> {
    let then: BTreeMap<&str, &str> =
        recorded.iter().filter_map(|(k, v)| k.strip_prefix(IDENTITY_PREFIX).map(|k| (k, v.as_str()))).collect();
    let mut diffs = Vec::new();
    for (k, v) in identity {
        match then.get(k.as_str()) {
            Some(t) if *t == v => {}
            Some(t) => diffs.push(format!("{k} was {t}, is now {v}")),
            None if then.is_empty() => {}
            None => diffs.push(format!("{k} was not recorded, is now {v}")),
        }
    }
    for (k, t) in &then {
        if !identity.contains_key(*k) {
            diffs.push(format!("{k} was {t}, is now not given"));
        }
    }
    if diffs.is_empty() {
        return Ok(());
    }
    Err(Error::invalid(
        "resume",
        format!(
            "{} belongs to another run: {}; resume with the same settings, or start a new run in another workdir",
            dir.display(),
            diffs.join("; ")
        ),
    ))
}

/// Cuts `<workdir>/metrics.jsonl` back to the steps up to `step` (a resumed run re-runs the
/// later ones), rewriting it atomically. Lines that do not parse are kept.
pub fn truncate_metrics(workdir: &Path, step: u64) -> Result<()> {
    let path = workdir.join("metrics.jsonl");
    let Ok(text) = fs::read_to_string(&path) else { return Ok(()) };
    let keep: Vec<&str> = text
        .lines()
        .filter(|l| {
            serde_json::from_str::<serde_json::Value>(l)
                .ok()
                .and_then(|v| v.get("step").and_then(|s| s.as_u64()))
                .is_none_or(|s| s <= step)
        })
        .collect();
    if keep.len() == text.lines().count() {
        return Ok(());
    }
    let mut out = keep.join("\n");
    if !out.is_empty() {
        out.push('\n');
    }
    super::checkpoint::write_atomic(&path, out.as_bytes())
}

#[cfg(test)]
mod tests;
