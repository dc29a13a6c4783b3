//! `Real`: the float types the CPU kernels are generic over (f32 and f64).

use num_traits::Float;

/// A compute float: f32 or f64.
pub trait Real: Float + Default + Send + Sync + std::fmt::Debug + std::iter::Sum + 'static {
    /// From f64 (rounding).
    fn of(x: f64) -> Self;
    /// To f64.
    fn to64(self) -> f64;
    /// The error function.
    fn erf(self) -> Self;
}

impl Real for f32 {
    fn of(x: f64) -> Self {
        x as f32
    }
    fn to64(self) -> f64 {
        self as f64
    }
    fn erf(self) -> Self {
        libm::erff(self)
    }
}

impl Real for f64 {
    fn of(x: f64) -> Self {
        x
    }
    fn to64(self) -> f64 {
        self
    }
    fn erf(self) -> Self {
        libm::erf(self)
    }
}
