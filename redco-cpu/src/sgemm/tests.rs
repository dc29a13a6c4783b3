//! Unit tests of the sgemm. The kernels' own tests need their instruction sets and live in
//! [`sweeps`] (`cargo xtask test` skips them, naming them, on a CPU without it); the same
//! sweeps through the backend's dispatching matmul, on whatever GEMM the CPU selects and on
//! the portable fallback, are in `cpu::matmul::tests` and pass on every CPU.

mod sweeps;

/// A xorshift generator of values in [-1, 1), shared with the dispatch tests.
pub(crate) struct Rng(pub(crate) u64);
impl Rng {
    /// The next value, in [-1, 1).
    pub(crate) fn next(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    /// `n` values.
    pub(crate) fn vec(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.next()).collect()
    }
}
