//! The 16-bit result types of the GEMM ([`Sink`]): the kernels accumulate and write f32, and
//! each finished row segment of a tile block is narrowed into the 16-bit output while it is
//! still in cache, instead of a pass over a whole f32 result afterwards.

use half::{bf16, f16};
use std::mem::MaybeUninit;

mod sealed {
    /// Only the 16-bit float types implement [`super::Sink`].
    pub trait Sealed {}
    impl Sealed for half::bf16 {}
    impl Sealed for half::f16 {}
}

/// A 16-bit float type the GEMM can write its f32 result as (bf16 or f16; sealed),
/// rounding to nearest even as [`redco_core::HostData::from_f32`] does.
pub trait Sink: sealed::Sealed + Copy + Send + Sync + 'static {
    /// Writes `src` narrowed into `dst[..src.len()]`.
    fn narrow(src: &[f32], dst: &mut [MaybeUninit<Self>]);
}

impl Sink for bf16 {
    fn narrow(src: &[f32], dst: &mut [MaybeUninit<bf16>]) {
        crate::simd::vectorized(
            #[inline(always)]
            || {
                for (o, &x) in dst.iter_mut().zip(src) {
                    o.write(redco_core::dtype::f32_to_bf16(x));
                }
            },
        )
    }
}

impl Sink for f16 {
    fn narrow(src: &[f32], dst: &mut [MaybeUninit<f16>]) {
        for (o, &x) in dst.iter_mut().zip(src) {
            o.write(f16::from_f32(x));
        }
    }
}

/// Narrows `n` f32s at `src` into the `O`s at `dst` (the type-erased form the driver holds).
///
/// # Safety
/// `src[..n]` readable, `dst` writable for `n` elements of `O`, not overlapping.
pub(crate) unsafe fn narrow_raw<O: Sink>(src: *const f32, dst: *mut u8, n: usize) {
    // SAFETY: per the caller contract.
    let (s, d) =
        unsafe { (std::slice::from_raw_parts(src, n), std::slice::from_raw_parts_mut(dst as *mut MaybeUninit<O>, n)) };
    O::narrow(s, d);
}
