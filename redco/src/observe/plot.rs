//! The loss plot, drawn when a run ends.

use redco_core::Result;
use redco_pipeline::metrics::StepMetrics;
use redco_pipeline::observe::TrainObserver;
use std::path::{Path, PathBuf};

/// The [`TrainObserver`] that draws the whole training curve (across resumed runs) to
/// `<workdir>/loss.png` when a run ends, with [`crate::plot::loss_plot`]: loss, its
/// smoothed trend, eval points and the learning rate on a right axis.
#[derive(Debug, Clone, Default)]
pub struct LossPlot {
    path: Option<PathBuf>,
}

impl LossPlot {
    /// The plot at `<workdir>/loss.png`.
    pub fn new() -> Self {
        LossPlot::default()
    }

    /// The plot at `path` instead.
    pub fn to(path: impl Into<PathBuf>) -> Self {
        LossPlot { path: Some(path.into()) }
    }
}

impl TrainObserver for LossPlot {
    fn on_end(&mut self, workdir: &Path, curve: &[StepMetrics]) -> Result<()> {
        let path = self.path.clone().unwrap_or_else(|| workdir.join("loss.png"));
        crate::plot::loss_plot(curve, &path)
    }

    fn name(&self) -> String {
        "loss plot".into()
    }
}
