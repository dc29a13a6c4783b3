//! Learning-rate schedules with linear warmup, in optimizer steps.

/// The decay after warmup.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Decay {
    /// Constant at the peak.
    Constant,
    /// Linear to 0 at `total` steps.
    Linear,
    /// Half-cosine to 0 at `total` steps.
    Cosine,
}

/// `lr(step)` for optimizer steps `0, 1, ...`: linear warmup from 0 to `peak` over
/// `warmup` steps, then `decay` until `total`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Schedule {
    /// Peak learning rate.
    pub peak: f64,
    /// Warmup steps.
    pub warmup: u64,
    /// Total optimizer steps.
    pub total: u64,
    /// Shape after warmup.
    pub decay: Decay,
}

impl Schedule {
    /// The learning rate for optimizer step `step` (0-based).
    pub fn lr(&self, step: u64) -> f64 {
        if step < self.warmup {
            return self.peak * (step + 1) as f64 / self.warmup as f64;
        }
        let span = self.total.saturating_sub(self.warmup).max(1) as f64;
        let t = ((step - self.warmup) as f64 / span).min(1.0);
        match self.decay {
            Decay::Constant => self.peak,
            Decay::Linear => self.peak * (1.0 - t),
            Decay::Cosine => self.peak * 0.5 * (1.0 + (std::f64::consts::PI * t).cos()),
        }
    }
}
