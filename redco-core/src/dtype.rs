//! Element types and host-side buffers.

use crate::{Error, Result};
use half::{bf16, f16};

/// The element type of a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    /// 32-bit IEEE float: the default compute type.
    F32,
    /// 64-bit IEEE float: used by reference checks and gradient tests.
    F64,
    /// 16-bit IEEE float (storage; computed in f32).
    F16,
    /// bfloat16 (storage; computed in f32).
    BF16,
    /// 64-bit signed integer: token ids, targets, positions.
    I64,
    /// 32-bit signed integer.
    I32,
    /// Unsigned byte: boolean masks (0 or 1).
    U8,
}

impl DType {
    /// Bytes per element.
    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::F64 | DType::I64 => 8,
            DType::F32 | DType::I32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::U8 => 1,
        }
    }
    /// True for the floating-point types.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::F16 | DType::BF16)
    }
    /// The type in which a backend computes values of this type (f16/bf16 go to f32).
    pub fn compute_type(self) -> DType {
        match self {
            DType::F16 | DType::BF16 => DType::F32,
            d => d,
        }
    }
}

/// A typed host buffer: how data enters and leaves a backend.
#[derive(Debug, Clone, PartialEq)]
pub enum HostData {
    /// f32 values.
    F32(Vec<f32>),
    /// f64 values.
    F64(Vec<f64>),
    /// f16 values.
    F16(Vec<f16>),
    /// bf16 values.
    BF16(Vec<bf16>),
    /// i64 values.
    I64(Vec<i64>),
    /// i32 values.
    I32(Vec<i32>),
    /// u8 values.
    U8(Vec<u8>),
}

impl HostData {
    /// Elements `start..start + len` of the flat buffer, as a new buffer of the same dtype.
    pub fn range(&self, start: usize, len: usize) -> HostData {
        let r = start..start + len;
        match self {
            HostData::F32(v) => HostData::F32(v[r].to_vec()),
            HostData::F64(v) => HostData::F64(v[r].to_vec()),
            HostData::F16(v) => HostData::F16(v[r].to_vec()),
            HostData::BF16(v) => HostData::BF16(v[r].to_vec()),
            HostData::I64(v) => HostData::I64(v[r].to_vec()),
            HostData::I32(v) => HostData::I32(v[r].to_vec()),
            HostData::U8(v) => HostData::U8(v[r].to_vec()),
        }
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        match self {
            HostData::F32(_) => DType::F32,
            HostData::F64(_) => DType::F64,
            HostData::F16(_) => DType::F16,
            HostData::BF16(_) => DType::BF16,
            HostData::I64(_) => DType::I64,
            HostData::I32(_) => DType::I32,
            HostData::U8(_) => DType::U8,
        }
    }
    /// The number of elements.
    pub fn len(&self) -> usize {
        match self {
            HostData::F32(v) => v.len(),
            HostData::F64(v) => v.len(),
            HostData::F16(v) => v.len(),
            HostData::BF16(v) => v.len(),
            HostData::I64(v) => v.len(),
            HostData::I32(v) => v.len(),
            HostData::U8(v) => v.len(),
        }
    }
    /// True when there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// All values converted to f64 (exact for every type but i64 beyond 2^53).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        match self {
            HostData::F32(v) => v.iter().map(|&x| x as f64).collect(),
            HostData::F64(v) => v.clone(),
            HostData::F16(v) => v.iter().map(|x| x.to_f64()).collect(),
            HostData::BF16(v) => v.iter().map(|x| x.to_f64()).collect(),
            HostData::I64(v) => v.iter().map(|&x| x as f64).collect(),
            HostData::I32(v) => v.iter().map(|&x| x as f64).collect(),
            HostData::U8(v) => v.iter().map(|&x| x as f64).collect(),
        }
    }
    /// All values converted to f32.
    pub fn to_f32_vec(&self) -> Vec<f32> {
        match self {
            HostData::F32(v) => v.clone(),
            HostData::F16(v) => par_map(v, |x| x.to_f32()),
            HostData::BF16(v) => par_map(v, bf16_to_f32),
            other => other.to_f64_vec().into_iter().map(|x| x as f32).collect(),
        }
    }
    /// Integer values as i64 (errors for float data).
    pub fn to_i64_vec(&self) -> Result<Vec<i64>> {
        match self {
            HostData::I64(v) => Ok(v.clone()),
            HostData::I32(v) => Ok(v.iter().map(|&x| x as i64).collect()),
            HostData::U8(v) => Ok(v.iter().map(|&x| x as i64).collect()),
            other => Err(Error::UnsupportedDType { op: "to_i64_vec", dtype: other.dtype() }),
        }
    }
    /// Builds a buffer of `dtype` from f64 values (rounding for narrower types).
    pub fn from_f64(values: &[f64], dtype: DType) -> HostData {
        match dtype {
            DType::F32 => HostData::F32(values.iter().map(|&x| x as f32).collect()),
            DType::F64 => HostData::F64(values.to_vec()),
            DType::F16 => HostData::F16(values.iter().map(|&x| f16::from_f64(x)).collect()),
            DType::BF16 => HostData::BF16(values.iter().map(|&x| bf16::from_f64(x)).collect()),
            DType::I64 => HostData::I64(values.iter().map(|&x| x as i64).collect()),
            DType::I32 => HostData::I32(values.iter().map(|&x| x as i32).collect()),
            DType::U8 => HostData::U8(values.iter().map(|&x| x as u8).collect()),
        }
    }
    /// Builds a buffer of `dtype` from f32 values.
    pub fn from_f32(values: Vec<f32>, dtype: DType) -> HostData {
        match dtype {
            DType::F32 => HostData::F32(values),
            DType::F16 => HostData::F16(par_map(&values, f16::from_f32)),
            DType::BF16 => HostData::BF16(par_map(&values, f32_to_bf16)),
            d => HostData::from_f64(&values.iter().map(|&x| x as f64).collect::<Vec<_>>(), d),
        }
    }
    /// This data as `dtype`, without a copy when it already is.
    pub fn into_dtype(self, dtype: DType) -> HostData {
        if self.dtype() == dtype {
            self
        } else {
            self.cast(dtype)
        }
    }

    /// Converts to another dtype.
    pub fn cast(&self, dtype: DType) -> HostData {
        if self.dtype() == dtype {
            return self.clone();
        }
        match (self, dtype) {
            (HostData::I64(v), DType::I32) => HostData::I32(v.iter().map(|&x| x as i32).collect()),
            (HostData::I32(v), DType::I64) => HostData::I64(v.iter().map(|&x| x as i64).collect()),
            // straight from the f32 values (not through a copy of them)
            (HostData::F32(v), DType::BF16) => HostData::BF16(par_map(v, f32_to_bf16)),
            (HostData::F32(v), DType::F16) => HostData::F16(par_map(v, f16::from_f32)),
            (_, DType::F32 | DType::F16 | DType::BF16) if self.dtype().compute_type() == DType::F32 => {
                HostData::from_f32(self.to_f32_vec(), dtype)
            }
            _ => HostData::from_f64(&self.to_f64_vec(), dtype),
        }
    }
    /// The values as little-endian bytes (the in-memory layout on every supported host).
    pub fn as_bytes(&self) -> &[u8] {
        match self {
            HostData::F32(v) => bytemuck::cast_slice(v),
            HostData::F64(v) => bytemuck::cast_slice(v),
            HostData::F16(v) => bytemuck::cast_slice(v),
            HostData::BF16(v) => bytemuck::cast_slice(v),
            HostData::I64(v) => bytemuck::cast_slice(v),
            HostData::I32(v) => bytemuck::cast_slice(v),
            HostData::U8(v) => v,
        }
    }
    /// Values of `dtype` from their bytes ([`HostData::as_bytes`]); a length that is not a
    /// whole number of elements is an error.
    pub fn from_bytes(dtype: DType, bytes: &[u8]) -> crate::Result<HostData> {
        if !bytes.len().is_multiple_of(dtype.size_in_bytes()) {
            return Err(crate::Error::invalid(
                "host data",
                format!("{} bytes are not a whole number of {dtype:?} elements", bytes.len()),
            ));
        }
        Ok(match dtype {
            DType::F32 => HostData::F32(bytemuck::pod_collect_to_vec(bytes)),
            DType::F64 => HostData::F64(bytemuck::pod_collect_to_vec(bytes)),
            DType::F16 => HostData::F16(bytemuck::pod_collect_to_vec(bytes)),
            DType::BF16 => HostData::BF16(bytemuck::pod_collect_to_vec(bytes)),
            DType::I64 => HostData::I64(bytemuck::pod_collect_to_vec(bytes)),
            DType::I32 => HostData::I32(bytemuck::pod_collect_to_vec(bytes)),
            DType::U8 => HostData::U8(bytes.to_vec()),
        })
    }
}

/// Host element types that convert into [`HostData`].
pub trait Element: Copy + Send + Sync + 'static {
    /// The dtype of this element type.
    const DTYPE: DType;
    /// Wraps a vector into [`HostData`].
    fn into_host(v: Vec<Self>) -> HostData;
}

macro_rules! element {
    ($t:ty, $d:ident) => {
        impl Element for $t {
            const DTYPE: DType = DType::$d;
            fn into_host(v: Vec<Self>) -> HostData {
                HostData::$d(v)
            }
        }
    };
}
element!(f32, F32);
element!(f64, F64);
element!(f16, F16);
element!(bf16, BF16);
element!(i64, I64);
element!(i32, I32);
element!(u8, U8);

/// `f` over `v`, in order, each chunk in the CPU's widest vector copy ([`crate::host_simd`]), on the
/// current rayon pool's threads for large buffers (a checkpoint's tensors while loading, the
/// bf16 activations of mixed-precision compute).
fn par_map<T: Copy + Sync, U: Send>(v: &[T], f: impl Fn(T) -> U + Sync + Send + Copy) -> Vec<U> {
    use rayon::prelude::*;
    const CHUNK: usize = 1 << 14;
    let mut out: Vec<U> = Vec::with_capacity(v.len());
    let convert = |src: &[T], dst: &mut [std::mem::MaybeUninit<U>]| {
        crate::host_simd::vectorized(
            #[inline(always)]
            || {
                for (o, &x) in dst.iter_mut().zip(src) {
                    o.write(f(x));
                }
            },
        )
    };
    let dst = &mut out.spare_capacity_mut()[..v.len()];
    if v.len() < 1 << 16 {
        convert(v, dst);
    } else {
        dst.par_chunks_mut(CHUNK).zip(v.par_chunks(CHUNK)).for_each(|(d, s)| convert(s, d));
    }
    // SAFETY: `convert` wrote every one of the first `v.len()` elements.
    unsafe { out.set_len(v.len()) };
    out
}

/// bf16 to f32: the bits shifted up (exact), a NaN made quiet as `bf16::to_f32` does;
/// branch-free, so loops over it vectorise.
#[inline(always)]
pub fn bf16_to_f32(x: bf16) -> f32 {
    let b = u32::from(x.to_bits());
    let quiet = if b & 0x7fff > 0x7f80 { 0x0040_0000 } else { 0 };
    f32::from_bits((b << 16) | quiet)
}

/// f32 to bf16, rounding to nearest even, NaN kept a (quiet) NaN, as `bf16::from_f32`,
/// branch-free so loops over it vectorise.
#[inline(always)]
pub fn f32_to_bf16(x: f32) -> bf16 {
    let b = x.to_bits();
    let rounded = (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16;
    let nan = ((b >> 16) as u16) | 0x40;
    bf16::from_bits(if x.is_nan() { nan } else { rounded })
}

/// Float values of a buffer in their compute type.
pub enum Floats<'a> {
    /// f32 values (f32, f16 and bf16 buffers).
    F32(std::borrow::Cow<'a, [f32]>),
    /// f64 values (f64 and integer buffers).
    F64(std::borrow::Cow<'a, [f64]>),
}

/// Borrows f32/f64 data, converts f16/bf16 to f32 and integers to f64.
pub fn floats(h: &HostData) -> Floats<'_> {
    match h {
        HostData::F32(v) => Floats::F32(std::borrow::Cow::Borrowed(v)),
        HostData::F64(v) => Floats::F64(std::borrow::Cow::Borrowed(v)),
        HostData::F16(_) | HostData::BF16(_) => Floats::F32(std::borrow::Cow::Owned(h.to_f32_vec())),
        _ => Floats::F64(std::borrow::Cow::Owned(h.to_f64_vec())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The branch-free conversions agree with the `half` crate's bit for bit: every 16-bit
    /// pattern up, and f32 patterns spread over the whole range (ties, subnormals,
    /// infinities, NaN payloads, overflow to infinity) down.
    #[test]
    fn bf16_conversions_match_the_half_crate() {
        for b in 0..=u16::MAX {
            let x = bf16::from_bits(b);
            assert_eq!(bf16_to_f32(x).to_bits(), x.to_f32().to_bits(), "{b:#06x}");
        }
        let specials = [
            0x7f7f_ffffu32,
            0x7f7f_8000,
            0x3f80_8000,
            0x3f81_8000,
            0x0000_0001,
            0x8000_8000,
            0x7f80_0000,
            0xff80_0000,
            0x7fc0_0001,
            0x7f80_0001,
            0xffff_ffff,
        ];
        let spread = (0..1u64 << 22).map(|i| (i.wrapping_mul(0x9e37_79b9) as u32) ^ ((i as u32) << 10));
        for bits in specials.into_iter().chain(spread) {
            let x = f32::from_bits(bits);
            assert_eq!(f32_to_bf16(x).to_bits(), bf16::from_f32(x).to_bits(), "{bits:#010x}");
        }
        let v: Vec<f32> = (0..100_000).map(|i| (i as f32 - 5e4) * 1.37e-3).collect();
        let h = HostData::from_f32(v.clone(), DType::BF16);
        let want: Vec<f32> = v.iter().map(|&x| bf16::from_f32(x).to_f32()).collect();
        assert_eq!(h.to_f32_vec(), want);
    }
}
