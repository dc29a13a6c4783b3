//! A small deterministic generator (SplitMix64) the examples share for their data and
//! environments.

use redco::ops::random::mix64;

/// SplitMix64: a state stepped by the golden-ratio increment, each output finalised.
pub struct Rng(pub u64);

impl Rng {
    /// A value uniform in `[lo, hi)`.
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        lo + (hi - lo) * (mix64(self.0) >> 11) as f64 / (1u64 << 53) as f64
    }
}
