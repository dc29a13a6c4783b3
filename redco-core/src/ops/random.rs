//! Counter-based random numbers and seeded dropout.
//!
//! Element `i` of a draw depends only on `(seed, i)` (a SplitMix64 hash), so every backend
//! and every mesh layout draws the same numbers for the same seed.

use crate::{Backend, DType, Error, HostData, Result, Shape, Tensor};

/// The SplitMix64 finaliser.
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `scale` times the standard normal value at counter `i` of stream `seed` (Box-Muller on
/// the uniform values at counters `2i` and `2i + 1`).
pub fn normal_at(seed: u64, i: u64, scale: f64) -> f64 {
    let u1 = uniform_at(seed, 2 * i).max(1e-300);
    let u2 = uniform_at(seed, 2 * i + 1);
    scale * (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

/// The uniform value in `[0, 1)` at counter `i` of stream `seed`.
pub fn uniform_at(seed: u64, i: u64) -> f64 {
    let h = mix64(mix64(seed ^ 0x9e37_79b9_7f4a_7c15).wrapping_add(i.wrapping_mul(0x9e37_79b9_7f4a_7c15)));
    (h >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

impl<B: Backend> Tensor<B> {
    /// A tensor of uniform values in `[0, 1)` drawn from `seed` (PyTorch's `torch.rand`;
    /// element `i` depends only on `(seed, i)`, so every backend gives the same values).
    /// Floating-point dtypes only.
    pub fn rand(backend: &B, shape: impl Into<Shape>, dtype: DType, seed: u64) -> Result<Tensor<B>> {
        if !dtype.is_float() {
            return Err(Error::UnsupportedDType { op: "rand", dtype });
        }
        let shape = shape.into();
        let s = backend.rand_uniform(shape.elem_count(), seed, dtype)?;
        Ok(Tensor::from_storage(backend, s, shape, dtype))
    }

    /// A tensor of standard normal values (mean 0, standard deviation 1) drawn from `seed`
    /// (PyTorch's `torch.randn`; Box-Muller over the same counter-based uniforms, computed in
    /// f64 on the host, so every backend gives the same values). Floating-point dtypes only.
    pub fn randn(backend: &B, shape: impl Into<Shape>, dtype: DType, seed: u64) -> Result<Tensor<B>> {
        if !dtype.is_float() {
            return Err(Error::UnsupportedDType { op: "randn", dtype });
        }
        let shape = shape.into();
        let v: Vec<f64> = (0..shape.elem_count() as u64).map(|i| normal_at(seed, i, 1.0)).collect();
        Tensor::from_host(backend, &HostData::from_f64(&v, dtype), shape)
    }

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
