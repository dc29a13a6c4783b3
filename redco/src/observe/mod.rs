//! Observers of a training run: TensorBoard event files, a progress bar and the loss plot,
//! plugged into a [`Trainer`](crate::pipeline::Trainer) through core's
//! [`TrainObserver`] seam (whose docs say when each hook runs and why a failing observer
//! only warns). Core itself keeps `metrics.jsonl` and plain progress lines.
//!
//! The usual set in one call:
//!
//! ```
//! use redco::nn::Module;
//! use redco::pipeline::Trainer;
//!
//! fn with_observers<M: Module<redco::cpu::Cpu> + Send + Sync, E: Clone + Send + Sync>(
//!     trainer: Trainer<M, E>,
//! ) -> Trainer<M, E> {
//!     // fit(..) then writes <workdir>/tensorboard/events.out.tfevents.*, <workdir>/loss.png,
//!     // and draws a progress bar when stderr is a terminal (plain lines otherwise)
//!     trainer.observe_all(redco::observe::standard())
//! }
//! ```
//!
//! or one by one: `trainer.observe(TensorBoard::new()).observe(LossPlot::new())`.

mod plot;
mod progress;
mod tensorboard;

pub use plot::LossPlot;
pub use progress::ProgressBar;
pub use redco_pipeline::observe::TrainObserver;
pub use tensorboard::{masked_crc32c, tfrecord, EventWriter, TensorBoard, FILE_VERSION};

use std::io::IsTerminal;

/// The standard observers: [`TensorBoard`] (`<workdir>/tensorboard/`), [`LossPlot`]
/// (`<workdir>/loss.png`), and a [`ProgressBar`] when stderr is a terminal (elsewhere,
/// as in CI or a log file, the trainer's plain progress lines stay). For
/// [`Trainer::observe_all`](crate::pipeline::Trainer::observe_all).
pub fn standard() -> Vec<Box<dyn TrainObserver>> {
    standard_with(std::io::stderr().is_terminal())
}

/// [`standard`], with the progress bar or without it.
pub fn standard_with(progress_bar: bool) -> Vec<Box<dyn TrainObserver>> {
    let mut v: Vec<Box<dyn TrainObserver>> = vec![Box::new(TensorBoard::new()), Box::new(LossPlot::new())];
    if progress_bar {
        v.push(Box::new(ProgressBar::new()));
    }
    v
}

#[cfg(test)]
mod tests;
