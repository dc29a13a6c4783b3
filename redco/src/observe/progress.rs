//! A progress bar for terminals (indicatif).

use redco_core::Result;
use redco_pipeline::metrics::StepMetrics;
use redco_pipeline::observe::TrainObserver;
use std::path::Path;

/// The [`TrainObserver`] that draws a progress bar on stderr: steps done of the total, the
/// last loss, learning rate and tokens/s, and the time left. It
/// [shows progress](TrainObserver::shows_progress), so the trainer's plain progress lines
/// are off while it is installed. Meant for terminals ([`std::io::IsTerminal`]); where
/// stderr is not one, indicatif draws nothing, so keep the plain lines there instead
/// ([`standard`](super::standard) does).
#[derive(Debug, Default)]
pub struct ProgressBar {
    bar: Option<indicatif::ProgressBar>,
}

impl ProgressBar {
    /// A bar, drawn from the run's start.
    pub fn new() -> Self {
        ProgressBar::default()
    }
}

/// The bar's layout.
const TEMPLATE: &str = "{spinner} [{elapsed_precise}] {bar:30.cyan/blue} {pos}/{len} {msg} ETA {eta}";

impl TrainObserver for ProgressBar {
    fn on_start(&mut self, _workdir: &Path, first_step: u64, total_steps: u64) -> Result<()> {
        let style = indicatif::ProgressStyle::with_template(TEMPLATE)
            .map_err(|e| redco_core::Error::invalid("progress bar", e.to_string()))?
            .progress_chars("=> ");
        let bar = indicatif::ProgressBar::new(total_steps).with_style(style).with_position(first_step);
        // the time left comes from this run's steps, not the resumed ones
        bar.reset_eta();
        bar.set_message("starting");
        self.bar = Some(bar);
        Ok(())
    }

    fn on_step(&mut self, m: &StepMetrics) -> Result<()> {
        if let Some(bar) = &self.bar {
            let eval = m.eval.map_or(String::new(), |e| format!(" eval {e:.4}"));
            bar.set_message(format!("loss {:.4}{eval} lr {:.2e} {:.0} tok/s", m.loss, m.lr, m.tokens_per_s));
            bar.set_position(m.step);
        }
        Ok(())
    }

    fn on_end(&mut self, _workdir: &Path, _curve: &[StepMetrics]) -> Result<()> {
        if let Some(bar) = self.bar.take() {
            bar.finish();
        }
        Ok(())
    }

    fn shows_progress(&self) -> bool {
        true
    }

    fn name(&self) -> String {
        "progress bar".into()
    }
}
