//! How every training run ends ([`finish`]): each rank's collective counts (`--comm-stats`),
//! then on the leader the LoRA export, the workdir made a Hugging Face model directory
//! (config.json, the tokenizer files), and the loss and held-out lines.

use super::{RunSetup, TrainArgs};
use crate::cmd::error::CliResult;
use redco_core::{Error, Result};
use redco_pipeline::checkpoint::write_atomic;
use redco_pipeline::FitReport;
use std::path::{Path, PathBuf};

/// What a finished run reports besides its [`FitReport`].
pub(super) struct Ending<'a> {
    /// The files copied from the model's directory into the workdir, when they exist there.
    pub files: &'a [&'a str],
    /// The PEFT task type of a LoRA export.
    pub task: &'a str,
    /// A line printed after the loss line (e.g. the bundled corpus's entropy).
    pub note: Option<String>,
    /// The model FLOPs of training one token, for `--profile`'s MFU (none: not shown).
    pub flops_per_token: Option<f64>,
}

/// `--profile`'s table: each op family's device time per step and share of the step, the
/// host's gaps, tokens/s and the model-FLOPs utilisation.
fn print_profile(p: &redco_pipeline::StepProfile, flops_per_token: Option<f64>) {
    if p.steps == 0 {
        crate::outln!("profile: no step after the first to time (run more --steps)");
        return;
    }
    let per = |s: f64| s / p.steps as f64 * 1e3;
    let step_ms = per(p.seconds);
    crate::outln!(
        "\nprofile over {} steps after the first: {:.1} ms a step, {:.0} tokens/s",
        p.steps,
        step_ms,
        p.tokens_per_second()
    );
    if let (Some(f), Some(peak)) = (flops_per_token, p.peak_flops) {
        let mfu = p.mfu(f).unwrap_or(f64::NAN);
        crate::outln!(
            "MFU {:.1}% ({:.2} GFLOP a token, 6N + 12LHQT; {:.1} TFLOP/s of the device's {:.0} dense)",
            100.0 * mfu,
            f / 1e9,
            f * p.tokens_per_second() / 1e12,
            peak / 1e12
        );
    }
    if p.ops.is_empty() {
        crate::outln!("(this backend has no device timers: no table by op family)");
        return;
    }
    crate::outln!("{:<42} {:>8} {:>10} {:>7}", "op family", "calls", "ms/step", "share");
    let mut rows: Vec<(String, u64, f64)> = p.ops.iter().map(|o| (o.family.clone(), o.calls, o.seconds)).collect();
    rows.push(("host gaps (wall time no device row covers)".into(), 0, p.host_gap_seconds()));
    for (family, calls, secs) in rows {
        let calls = if calls == 0 { "-".to_string() } else { (calls / p.steps).to_string() };
        crate::outln!("{family:<42} {calls:>8} {:>10.2} {:>6.1}%", per(secs), 100.0 * per(secs) / step_ms);
    }
}

/// Ends a run: `--comm-stats` on every process; on the leader, the LoRA export, the model
/// directory and the summary lines. Returns whether this process is the leader (the one
/// that goes on to print samples).
pub(super) fn finish(a: &TrainArgs, s: &RunSetup, report: &FitReport, steps: u64, end: Ending<'_>) -> CliResult<bool> {
    if let Some(path) = &a.comm_stats {
        write_comm_stats(path, report)?;
    }
    if !s.leader {
        return Ok(false);
    }
    let w = &a.workdir;
    if a.no_save {
        print_summary(report, steps, end);
        crate::outln!("nothing saved (--no-save): no checkpoint, no model, no sample");
        return Ok(false);
    }
    if let Some(l) = &s.lora {
        let base = a.model.clone().unwrap_or_else(|| w.clone());
        super::lora::finish(w, l, a.lora.peft(), &base, end.task)?;
    }
    // the workdir is now a Hugging Face model directory
    let cfg_text = serde_json::to_string_pretty(&s.cfg.raw).map_err(|e| e.to_string())?;
    write_atomic(&w.join("config.json"), cfg_text.as_bytes())?;
    if s.tok_dir != *w {
        for f in end.files {
            if s.tok_dir.join(f).exists() {
                std::fs::copy(s.tok_dir.join(f), w.join(f)).map_err(|e| format!("copy {f}: {e}"))?;
            }
        }
    }
    print_summary(report, steps, end);
    Ok(true)
}

/// The run's summary lines: the loss, the note, the held-out loss, the device's peak, the
/// profile and the heap's peak.
fn print_summary(report: &FitReport, steps: u64, end: Ending<'_>) {
    let first = report.losses.first().copied().unwrap_or(f64::NAN);
    let last = report.losses.last().copied().unwrap_or(f64::NAN);
    crate::outln!("\nloss {first:.4} -> {last:.4} over steps {}..{steps}", report.start_step + 1);
    if let Some(note) = end.note {
        crate::outln!("{note}");
    }
    if let Some((_, e)) = report.evals.last() {
        crate::outln!("held-out loss {e:.4}");
    }
    if let Some(peak) = report.device_memory.values().map(|m| m.peak).max() {
        crate::outln!(
            "peak device memory: {} (the most a rank's device held in tensors at once)",
            redco_core::planning::planner::human(peak)
        );
    }
    if let Some(p) = report.profile.get(&report.rank) {
        print_profile(p, end.flops_per_token);
    }
    if let Some(st) = report.comm.get(&report.rank) {
        use redco_core::runtime::CollectiveKind;
        let a2a = st.get(CollectiveKind::AllToAll, redco_core::MeshAxis::Dp);
        if a2a.calls > 0 {
            crate::outln!(
                "expert parallelism: {} all-to-alls over dp sent {} from rank {} in {:.2} s (their wall time, the \
                 wait for the other ranks included)",
                a2a.calls,
                redco_core::planning::planner::human(a2a.bytes),
                report.rank,
                st.seconds(CollectiveKind::AllToAll, redco_core::MeshAxis::Dp)
            );
        }
    }
    let heap = crate::ALLOC.peak_live_bytes();
    if heap > 0 {
        crate::outln!(
            "peak heap: {} (the most this process held allocated at once, the planner's kind of \
             figure; its resident set adds the allocators' free memory, code and stacks)",
            redco_core::planning::planner::human(heap as u64)
        );
    }
}

/// CPU threads for work this process does alone after the run (a sample): its share of
/// `--threads` (default every core) among the host's processes.
pub(super) fn own_threads(a: &TrainArgs) -> usize {
    let threads = a.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    (threads / super::super::launch::world().local_size).max(1)
}

/// Writes each local rank's collective counts as JSON, `{rank, stats: [{kind, axis, calls,
/// bytes}], seconds: [{kind, axis, seconds}]}` (the wall time of the synchronous calls),
/// one file per rank (`{rank}` in `path` replaced by it).
fn write_comm_stats(path: &Path, report: &redco_pipeline::FitReport) -> Result<()> {
    for (rank, stats) in &report.comm {
        let file = PathBuf::from(path.to_string_lossy().replace("{rank}", &rank.to_string()));
        let rows: Vec<serde_json::Value> = stats
            .entries()
            .into_iter()
            .map(|(k, axis, c)| {
                serde_json::json!({"kind": format!("{k:?}"), "axis": format!("{axis:?}"), "calls": c.calls, "bytes": c.bytes})
            })
            .collect();
        let seconds: Vec<serde_json::Value> = stats
            .entries()
            .into_iter()
            .map(|(k, axis, _)| {
                serde_json::json!({"kind": format!("{k:?}"), "axis": format!("{axis:?}"), "seconds": stats.seconds(k, axis)})
            })
            .collect();
        let text = serde_json::to_string_pretty(&serde_json::json!({"rank": rank, "stats": rows, "seconds": seconds}))
            .map_err(|e| Error::invalid("comm-stats", e.to_string()))?;
        redco_pipeline::checkpoint::write_atomic(&file, text.as_bytes())?;
    }
    Ok(())
}
