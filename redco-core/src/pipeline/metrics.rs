//! Metrics: one JSONL line per optimizer step, and a progress line for humans.

use crate::{Error, Result};
use std::fs::{File, OpenOptions};
use std::io::{IsTerminal, Write};
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
}

/// Appends metrics to `metrics.jsonl` and prints progress (a progress bar with ETA on a
/// terminal, plain lines otherwise, as in CI).
pub struct MetricsLog {
    file: File,
    start: Instant,
    total: u64,
    tty: bool,
    every: u64,
}

impl MetricsLog {
    /// Opens (appending) `<workdir>/metrics.jsonl`.
    pub fn open(workdir: &Path, total: u64, every: u64) -> Result<Self> {
        let path = workdir.join("metrics.jsonl");
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| Error::invalid("metrics", format!("cannot open {}: {e}", path.display())))?;
        Ok(MetricsLog { file, start: Instant::now(), total, tty: std::io::stderr().is_terminal(), every: every.max(1) })
    }

    /// Records one step.
    pub fn log(&mut self, m: &StepMetrics, first_step: u64) -> Result<()> {
        let line = serde_json::to_string(m).map_err(|e| Error::invalid("metrics", e.to_string()))?;
        writeln!(self.file, "{line}").map_err(|e| Error::invalid("metrics", e.to_string()))?;
        let done = m.step - first_step;
        let left = self.total.saturating_sub(m.step);
        let eta = if done > 0 { self.start.elapsed().as_secs_f64() / done as f64 * left as f64 } else { 0.0 };
        if self.tty {
            let w = 30usize;
            let fill = (w as f64 * m.step as f64 / self.total.max(1) as f64) as usize;
            // progress is for a human watching: a closed or failing stderr is not the run's
            // failure, so its write errors are ignored
            let _ = write!(
                std::io::stderr(),
                "\r[{}{}] {}/{} loss {:.4} lr {:.2e} {:.0} tok/s ETA {:.0}s   ",
                "#".repeat(fill.min(w)),
                " ".repeat(w - fill.min(w)),
                m.step,
                self.total,
                m.loss,
                m.lr,
                m.tokens_per_s,
                eta
            );
            if m.step == self.total {
                let _ = writeln!(std::io::stderr());
            }
        } else if m.step.is_multiple_of(self.every) || m.step == self.total {
            let _ = writeln!(
                std::io::stderr(),
                "step {}/{} loss {:.4} lr {:.3e} grad_norm {:.3} {:.0} tok/s eta {:.0}s",
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
    let text =
        std::fs::read_to_string(&path).map_err(|e| Error::invalid("metrics", format!("{}: {e}", path.display())))?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l)
                .map_err(|e| Error::invalid("metrics", format!("{} line {}: {e}", path.display(), i + 1)))
        })
        .collect()
}
