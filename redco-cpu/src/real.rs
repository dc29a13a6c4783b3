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
    /// `e^x`, by a branch-free routine for f32 that vectorises inside loops (within 2 ulp).
    fn fexp(self) -> Self;
    /// Replaces each `x` of `row` with `e^(x - m)` and returns their sum.
    fn exp_shift_sum(row: &mut [Self], m: Self) -> Self {
        let mut s = Self::zero();
        for x in row.iter_mut() {
            *x = (*x - m).exp();
            s = s + *x;
        }
        s
    }
    /// The largest value of `row` (`-inf` when empty).
    fn row_max(row: &[Self]) -> Self {
        row.iter().copied().fold(Self::neg_infinity(), Self::max)
    }
    /// `(sum(x - mean), sum((x - mean)^2))` over `row`, in f64.
    fn moments(row: &[Self], mean: f64) -> (f64, f64) {
        row.iter().fold((0.0, 0.0), |(s, q), v| {
            let d = v.to64() - mean;
            (s + d, q + d * d)
        })
    }
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
    #[inline(always)]
    fn fexp(self) -> Self {
        super::simd::exp_f32(self)
    }
    fn exp_shift_sum(row: &mut [f32], m: f32) -> f32 {
        super::simd::exp_shift_sum(row, m)
    }
    fn row_max(row: &[f32]) -> f32 {
        super::simd::max(row)
    }
    fn moments(row: &[f32], mean: f64) -> (f64, f64) {
        super::simd::moments(row, mean)
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
    #[inline(always)]
    fn fexp(self) -> Self {
        self.exp()
    }
}
