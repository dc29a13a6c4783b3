//! Seeded parameter initialisation (counter-based, so identical on every backend).

use crate::ops::random::{normal_at, uniform_at};
use crate::{Backend, DType, HostData, Result, Shape, Tensor};

/// How to fill a new parameter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// Every element equal to the value.
    Const(f64),
    /// Uniform in `[-bound, bound)`.
    Uniform(f64),
    /// Normal with mean 0 and this standard deviation.
    Normal(f64),
}

impl Init {
    /// A new variable of `shape` filled from `seed`.
    pub fn var<B: Backend>(self, b: &B, shape: impl Into<Shape>, dtype: DType, seed: u64) -> Result<Tensor<B>> {
        let shape = shape.into();
        let v = self.values(shape.elem_count(), seed);
        Ok(Tensor::from_host(b, &HostData::from_f64(&v, dtype), shape)?.into_var())
    }

    /// The first `n` values of this fill for `seed` (value `i` depends only on `(seed, i)`).
    pub fn values(self, n: usize, seed: u64) -> Vec<f64> {
        let n = n as u64;
        match self {
            Init::Const(c) => vec![c; n as usize],
            Init::Uniform(a) => (0..n).map(|i| (2.0 * uniform_at(seed, i) - 1.0) * a).collect(),
            Init::Normal(s) => (0..n).map(|i| normal_at(seed, i, s)).collect(),
        }
    }
}
