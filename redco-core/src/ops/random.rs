//! Counter-based random numbers and seeded dropout.
//!
//! Element `i` of a draw depends only on `(seed, i)` (a SplitMix64 hash), so every backend
//! and every mesh layout draws the same numbers for the same seed.

use crate::{Backend, Error, Result, Tensor};

/// The SplitMix64 finaliser.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The uniform value in `[0, 1)` at counter `i` of stream `seed`.
pub fn uniform_at(seed: u64, i: u64) -> f64 {
    let h = mix64(mix64(seed ^ 0x9e37_79b9_7f4a_7c15).wrapping_add(i.wrapping_mul(0x9e37_79b9_7f4a_7c15)));
    (h >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

impl<B: Backend> Tensor<B> {
    /// Uniform values in `[0, 1)` with this tensor's shape and dtype, from `seed`.
    pub fn rand_like(&self, seed: u64) -> Result<Tensor<B>> {
        let s = self.backend().rand_uniform(self.elem_count(), seed, self.dtype())?;
        Ok(Tensor::from_storage(self.backend(), s, self.shape().clone(), self.dtype()))
    }

    /// Inverted dropout: zeroes each element with probability `p` (drawn from `seed`) and
    /// scales the rest by `1 / (1 - p)`.
    pub fn dropout(&self, p: f64, seed: u64) -> Result<Tensor<B>> {
        if !(0.0..1.0).contains(&p) {
            return Err(Error::invalid("dropout", format!("probability {p} is not in [0, 1)")));
        }
        if p == 0.0 {
            return Ok(self.clone());
        }
        self.expect_float("dropout")?;
        // Draw in f32 whatever the dtype, so the mask for a seed is the same in f16, bf16
        // and f32 (rounding draws to f16 would bias the keep rate).
        let draws = self.backend().rand_uniform(self.elem_count(), seed, crate::DType::F32)?;
        let draws = Tensor::from_storage(self.backend(), draws, self.shape().clone(), crate::DType::F32);
        // A split tensor takes its slice of the global mask, so every layout drops the same
        // elements.
        let draws = draws.redistribute(crate::placement::without_partial(self.placements()))?;
        let keep = draws.compare_scalar(p, crate::backend::CmpOp::Ge)?;
        let scale = Tensor::scalar(self.backend(), 1.0 / (1.0 - p), self.dtype())?;
        let zero = Tensor::zeros(self.backend(), [], self.dtype())?;
        self.mul(&keep.where_cond(&scale, &zero)?)
    }
}
