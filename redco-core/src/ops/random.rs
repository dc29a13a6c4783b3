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
        let v = crate::nn::Init::Normal(1.0).values(shape.elem_count(), seed);
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

#[cfg(test)]
mod tests {
    use crate::cpu::Cpu;
    use crate::{DType, Tensor};

    #[test]
    fn rand_is_seeded_uniform() {
        let dev = Cpu::new(1);
        let a = Tensor::rand(&dev, [100, 50], DType::F32, 7).unwrap().to_vec_f64().unwrap();
        let b = Tensor::rand(&dev, [5000], DType::F32, 7).unwrap().to_vec_f64().unwrap();
        assert_eq!(a, b, "the values depend on the seed and the index only");
        assert!(a.iter().all(|x| (0.0..1.0).contains(x)));
        let mean = a.iter().sum::<f64>() / a.len() as f64;
        assert!((mean - 0.5).abs() < 0.02, "mean {mean}");
        let c = Tensor::rand(&dev, [5000], DType::F32, 8).unwrap().to_vec_f64().unwrap();
        assert_ne!(a, c);
        assert!(Tensor::rand(&dev, [2], DType::I64, 0).is_err());
    }

    #[test]
    fn randn_has_unit_moments() {
        let dev = Cpu::new(1);
        let v = Tensor::randn(&dev, [20_000], DType::F64, 3).unwrap().to_vec_f64().unwrap();
        let n = v.len() as f64;
        let mean = v.iter().sum::<f64>() / n;
        let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
        // 5 standard errors
        assert!(mean.abs() < 5.0 / n.sqrt(), "mean {mean}");
        assert!((var - 1.0).abs() < 5.0 * (2.0 / n).sqrt(), "variance {var}");
        let within_one = v.iter().filter(|x| x.abs() < 1.0).count() as f64 / n;
        assert!((within_one - 0.6827).abs() < 0.02, "P(|x| < 1) = {within_one}");
        assert!(Tensor::randn(&dev, [2], DType::U8, 0).is_err());
    }
}
