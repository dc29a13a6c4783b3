//! When a run evaluates and checkpoints ([`Cadence`]): decided in one place for every step
//! strategy, from the configuration and the data's size.

use super::train_config::TrainConfig;

/// The run's rhythm: evaluation every `eval_every` steps and at the end, checkpoints every
/// `checkpoint_every` steps, at the end of an epoch of the data (when asked), at the end,
/// and whenever the eval improves.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cadence {
    eval_every: Option<u64>,
    checkpoint_every: Option<u64>,
    epoch_end: bool,
    /// Examples per optimizer step.
    per_step: u64,
    /// Examples in the data.
    examples: u64,
    last: u64,
}

impl Cadence {
    /// The cadence of `cfg` over `examples` examples, evaluating every `eval_every` steps
    /// when the trainer has an eval.
    pub(crate) fn new(cfg: &TrainConfig, eval_every: Option<u64>, examples: usize) -> Self {
        Cadence {
            eval_every,
            checkpoint_every: cfg.checkpoint_every,
            epoch_end: cfg.checkpoint_at_epoch_end,
            per_step: (cfg.batch_size * cfg.accumulate) as u64,
            examples: (examples as u64).max(1),
            last: cfg.steps,
        }
    }

    /// Whether the step ending at `done` steps evaluates.
    pub(crate) fn evaluates(&self, done: u64) -> bool {
        self.eval_every.is_some_and(|e| done.is_multiple_of(e) || done == self.last)
    }

    /// Whether an epoch of the data ends within the step ending at `done`.
    fn ends_epoch(&self, done: u64) -> bool {
        let step = done.saturating_sub(1);
        self.epoch_end && (done * self.per_step) / self.examples > (step * self.per_step) / self.examples
    }

    /// Whether the step ending at `done` checkpoints (`better`: its eval improved).
    pub(crate) fn checkpoints(&self, done: u64, better: bool) -> bool {
        better
            || self.ends_epoch(done)
            || self.checkpoint_every.is_some_and(|n| done.is_multiple_of(n))
            || done == self.last
    }

    /// Whether anything after the step ending at `done` reads the trained state (an eval or
    /// a checkpoint): a compiled step then hands its state back first.
    pub(crate) fn reads_state(&self, done: u64) -> bool {
        self.evaluates(done) || self.checkpoints(done, false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evals_checkpoints_and_epoch_ends_fall_where_they_should() {
        let cfg =
            TrainConfig { batch_size: 4, accumulate: 1, steps: 10, checkpoint_every: Some(4), ..Default::default() };
        // 10 examples, 4 per step: epochs end within steps 3, 5 and 8 (examples 10, 20, 30)
        let c = Cadence::new(&cfg, Some(3), 10);
        let evals: Vec<u64> = (1..=10).filter(|&d| c.evaluates(d)).collect();
        assert_eq!(evals, [3, 6, 9, 10]);
        let ckpts: Vec<u64> = (1..=10).filter(|&d| c.checkpoints(d, false)).collect();
        assert_eq!(ckpts, [3, 4, 5, 8, 10]);
        assert!(c.checkpoints(2, true));
        let reads: Vec<u64> = (1..=10).filter(|&d| c.reads_state(d)).collect();
        assert_eq!(reads, [3, 4, 5, 6, 8, 9, 10]);
        // no eval: none; no epoch-end checkpoints when not asked
        let c = Cadence::new(&TrainConfig { checkpoint_at_epoch_end: false, ..cfg }, None, 10);
        assert!(!(1..=10).any(|d| c.evaluates(d)));
        assert_eq!((1..=10).filter(|&d| c.checkpoints(d, false)).collect::<Vec<_>>(), [4, 8, 10]);
    }
}
