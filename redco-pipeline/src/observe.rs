//! The observer seam: what a front end plugs into a [`Trainer`](super::Trainer) to watch a
//! run (a progress bar, TensorBoard event files, a loss plot) without core knowing any of
//! them.
//!
//! Core itself writes `<workdir>/metrics.jsonl` (one [`StepMetrics`] line per optimizer
//! step, the run's record, read back by resume and by [`read_metrics`](super::metrics::read_metrics))
//! and, unless turned off, plain progress lines on stderr. Everything else is an observer;
//! the `redco` facade crate has the usual ones (`redco::observe`).
//!
//! # When the hooks run
//!
//! Only the rank that logs calls them: mesh rank 0, so in one process with thread ranks
//! one thread, and with ranks as processes (MPI, torchrun-style launchers) only the
//! process that holds rank 0. In a [`Trainer::fit`](super::Trainer::fit) call:
//!
//! 1. [`TrainObserver::on_start`] once, when the run knows its first step (0, or the step
//!    of the checkpoint it resumed from) and before the first step;
//! 2. [`TrainObserver::on_step`] after each optimizer step that updated the model (a step
//!    skipped for a non-finite loss or overflowing gradients is not reported), after its
//!    line was appended to `metrics.jsonl`;
//! 3. [`TrainObserver::on_end`] once the run completed and the model was exported, with
//!    the whole curve across resumed runs. A run that fails calls no `on_end`: an observer
//!    that holds something (a terminal line, a file) releases it in its `Drop`.
//!
//! # Errors
//!
//! An observer is a view of the run, never its record: `metrics.jsonl` and the checkpoints
//! are. So a failing observer (a full disk under its event file, a plot it cannot write)
//! does not stop hours of training: its error is logged as a `tracing` warning naming the
//! observer and the hook, the observer is detached from the trainer (no flood of the same
//! warning every step, and no later hook on a half-written state), and the error is
//! listed in [`FitReport::observer_errors`](super::FitReport::observer_errors), where a
//! caller that needs the observer's output can make it fatal. Everything an observer
//! shows can be rebuilt from `metrics.jsonl` afterwards.

use super::metrics::StepMetrics;
use redco_core::Result;
use std::path::Path;
use std::sync::Mutex;

/// Watches a training run from the logging rank: see the [module docs](self) for when each
/// hook runs and what happens when one fails. Every hook has a default that does nothing,
/// so an observer implements only what it needs.
///
/// ```
/// use redco_pipeline::metrics::StepMetrics;
/// use redco_pipeline::observe::TrainObserver;
///
/// /// Remembers the lowest loss seen.
/// #[derive(Default)]
/// struct Best(f64);
///
/// impl TrainObserver for Best {
///     fn on_step(&mut self, m: &StepMetrics) -> redco_core::Result<()> {
///         if self.0 == 0.0 || m.loss < self.0 {
///             self.0 = m.loss;
///         }
///         Ok(())
///     }
/// }
/// ```
pub trait TrainObserver: Send {
    /// The run starts in `workdir` at `first_step` (0, or the resumed checkpoint's step;
    /// the first [`StepMetrics::step`] reported is `first_step + 1`) and ends at
    /// `total_steps`.
    fn on_start(&mut self, workdir: &Path, first_step: u64, total_steps: u64) -> Result<()> {
        let _ = (workdir, first_step, total_steps);
        Ok(())
    }

    /// An optimizer step completed (its line is already in `metrics.jsonl`).
    fn on_step(&mut self, metrics: &StepMetrics) -> Result<()> {
        let _ = metrics;
        Ok(())
    }

    /// The run completed: `curve` is the whole curve of the workdir, across resumed runs
    /// (the last record of every step, in step order), as `metrics.jsonl` holds it.
    fn on_end(&mut self, workdir: &Path, curve: &[StepMetrics]) -> Result<()> {
        let _ = (workdir, curve);
        Ok(())
    }

    /// Whether this observer shows progress itself (e.g. a progress bar): then the
    /// trainer prints no plain progress lines of its own, whatever
    /// [`TrainConfig::progress_lines`](super::TrainConfig::progress_lines) says.
    fn shows_progress(&self) -> bool {
        false
    }

    /// The observer's name in warnings (its type's name by default).
    fn name(&self) -> String {
        std::any::type_name::<Self>().to_string()
    }
}

impl<T: TrainObserver + ?Sized> TrainObserver for Box<T> {
    fn on_start(&mut self, workdir: &Path, first_step: u64, total_steps: u64) -> Result<()> {
        (**self).on_start(workdir, first_step, total_steps)
    }
    fn on_step(&mut self, metrics: &StepMetrics) -> Result<()> {
        (**self).on_step(metrics)
    }
    fn on_end(&mut self, workdir: &Path, curve: &[StepMetrics]) -> Result<()> {
        (**self).on_end(workdir, curve)
    }
    fn shows_progress(&self) -> bool {
        (**self).shows_progress()
    }
    fn name(&self) -> String {
        (**self).name()
    }
}

/// The observers a trainer holds, behind a lock (the ranks are threads that share the
/// trainer; only the logging rank takes it). Detaches an observer at its first error.
#[derive(Default)]
pub(crate) struct Observers {
    list: Mutex<Vec<Box<dyn TrainObserver>>>,
}

impl Observers {
    /// Adds one.
    pub(crate) fn push(&mut self, o: Box<dyn TrainObserver>) {
        self.list.get_mut().unwrap_or_else(|p| p.into_inner()).push(o);
    }

    /// Whether one of them shows progress itself.
    pub(crate) fn shows_progress(&self) -> bool {
        self.lock().iter().any(|o| o.shows_progress())
    }

    /// Calls `hook` on each observer; one that fails is warned about, recorded in
    /// `errors` and detached.
    pub(crate) fn each(
        &self,
        what: &str,
        errors: &mut Vec<String>,
        mut hook: impl FnMut(&mut dyn TrainObserver) -> Result<()>,
    ) {
        self.lock().retain_mut(|o| match hook(o.as_mut()) {
            Ok(()) => true,
            Err(e) => {
                let name = o.name();
                tracing::warn!(observer = %name, hook = what, error = %e, "a training observer failed; it is detached for the rest of the run (metrics.jsonl is complete)");
                errors.push(format!("{name} ({what}): {e}"));
                false
            }
        });
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Box<dyn TrainObserver>>> {
        // an observer that panicked left nothing this list depends on half-changed
        self.list.lock().unwrap_or_else(|p| p.into_inner())
    }
}
