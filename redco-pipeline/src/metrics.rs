//! Metrics: one JSONL line per optimizer step, and plain progress lines for humans.

use redco_core::{Error, Result};
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::Path;
use std::time::Instant;

/// What is logged for one optimizer step.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StepMetrics {
    /// Optimizer step (1-based: the number of updates done).
    pub step: u64,
    /// Mean loss over the step's micro-batches.
    pub loss: f64,
    /// Learning rate used for this update.
    pub lr: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Tokens (or examples) processed per second in this step.
    pub tokens_per_s: f64,
    /// Wall time of the step in seconds.
    pub step_time_s: f64,
    /// The eval metric, on steps where it was computed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval: Option<f64>,
    /// A mixture of experts with a capacity factor: the share of its token slots (every
    /// layer, every rank) the capacity dropped in this step's forward passes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe_dropped: Option<f64>,
}

/// Appends metrics to `metrics.jsonl` and, when asked, prints a plain progress line every
/// `every` steps on stderr (a front end that draws a progress bar turns them off; see
/// [`TrainObserver`](super::observe::TrainObserver)).
pub struct MetricsLog {
    file: File,
    start: Instant,
    total: u64,
    every: Option<u64>,
    /// Every step's last entry: the file's lines when opened, then each one logged.
    curve: BTreeMap<u64, StepMetrics>,
}

impl MetricsLog {
    /// Opens (appending) `<workdir>/metrics.jsonl`, for a run of `total` steps; with
    /// `lines`, a progress line is printed every `every` steps and at the last.
    pub fn open(workdir: &Path, total: u64, every: u64, lines: bool) -> Result<Self> {
        let path = workdir.join("metrics.jsonl");
        // the earlier lines (a resumed run's, already cut back to its step); one that does
        // not parse is left out of the curve, as it was kept in the file
        let curve = std::fs::read_to_string(&path)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<StepMetrics>(l).ok())
            .map(|m| (m.step, m))
            .collect();
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| Error::io("metrics", "cannot open", path, e))?;
        Ok(MetricsLog { file, start: Instant::now(), total, every: lines.then_some(every.max(1)), curve })
    }

    /// The whole curve, across resumed runs: the last entry of every step, in step order.
    pub fn curve(&self) -> Vec<StepMetrics> {
        self.curve.values().copied().collect()
    }

    /// Records one step (`first_step`: the step the run started from, for the ETA).
    pub fn log(&mut self, m: &StepMetrics, first_step: u64) -> Result<()> {
        let line = serde_json::to_string(m).map_err(|e| Error::invalid("metrics", e.to_string()))?;
        writeln!(self.file, "{line}").map_err(|e| Error::invalid("metrics", e.to_string()))?;
        self.curve.insert(m.step, *m);
        let Some(every) = self.every else { return Ok(()) };
        if m.step.is_multiple_of(every) || m.step == self.total {
            let done = m.step.saturating_sub(first_step);
            let left = self.total.saturating_sub(m.step);
            let eta = if done > 0 { self.start.elapsed().as_secs_f64() / done as f64 * left as f64 } else { 0.0 };
            // progress is for a human watching: a closed or failing stderr is not the run's
            // failure, so its write errors are ignored
            let dropped = m.moe_dropped.map(|d| format!(" dropped {:.2}%", 100.0 * d)).unwrap_or_default();
            let _ = writeln!(
                std::io::stderr(),
                "step {}/{} loss {:.4} lr {:.3e} grad_norm {:.3}{dropped} {:.0} tok/s eta {:.0}s",
                m.step,
                self.total,
                m.loss,
                m.lr,
                m.grad_norm,
                m.tokens_per_s,
                eta
            );
        }
        Ok(())
    }
}

/// Reads a `metrics.jsonl` back.
pub fn read_metrics(workdir: &Path) -> Result<Vec<StepMetrics>> {
    let path = workdir.join("metrics.jsonl");
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io("metrics", "cannot read", &path, e))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l)
                .map_err(|e| Error::data("metrics", format!("{} line {}: {e}", path.display(), i + 1)))
        })
        .collect()
}
