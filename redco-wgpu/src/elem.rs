//! How each logical dtype is laid out on the device: the device element type ([`Dev`]),
//! the WGSL store function of a dtype, and, per device, the element type and
//! size of a storage (packed f16 where the adapter offers `SHADER_F16`).

use crate::Wgpu;
use redco_core::DType;

impl Wgpu {
    /// True when storages of `dt` hold packed f16 on this device.
    pub(crate) fn packed(&self, dt: DType) -> bool {
        dt == DType::F16 && self.ctx.f16
    }
    /// The WGSL element type of a storage of `dt` (`f16` when packed, else that of
    /// [`Dev::of`]).
    pub(crate) fn elem(&self, dt: DType) -> &'static str {
        if self.packed(dt) {
            "f16"
        } else {
            Dev::of(dt).wgsl()
        }
    }
    /// The WGSL element type of a storage of `dt` for a kernel that binds it as `ty` (its
    /// compute type): `f16` when packed, else `ty`.
    pub(crate) fn elem_as(&self, dt: DType, ty: &'static str) -> &'static str {
        if self.packed(dt) {
            "f16"
        } else {
            ty
        }
    }
    /// The WGSL element type of a storage of `dt` for the kernels that copy bits without
    /// looking at them (`f16` when packed, else `u32`).
    pub(crate) fn bits(&self, dt: DType) -> &'static str {
        if self.packed(dt) {
            "f16"
        } else {
            "u32"
        }
    }
    /// The WGSL function storing a computed value (f32 for floats, i32 for integers) into a
    /// storage of `dt`: [`store_fn`], or `st_f16` (round, then convert) when packed.
    pub(crate) fn store(&self, dt: DType) -> &'static str {
        if self.packed(dt) {
            "st_f16"
        } else {
            store_fn(dt)
        }
    }
    /// Bytes per element of a storage of `dt` on this device.
    pub(crate) fn elem_bytes(&self, dt: DType) -> u64 {
        if self.packed(dt) {
            2
        } else {
            4
        }
    }
}

/// The device element type of a logical dtype.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dev {
    F32,
    I32,
    U32,
}

impl Dev {
    pub(crate) fn of(dt: DType) -> Dev {
        match dt {
            DType::F32 | DType::F16 | DType::BF16 | DType::F64 => Dev::F32,
            DType::I64 | DType::I32 => Dev::I32,
            DType::U8 => Dev::U32,
        }
    }
    pub(crate) fn wgsl(self) -> &'static str {
        match self {
            Dev::F32 => "f32",
            Dev::I32 => "i32",
            Dev::U32 => "u32",
        }
    }
}

/// The WGSL function that stores a computed value in `dt` (float kernels compute in f32,
/// integer ones in i32).
fn store_fn(dt: DType) -> &'static str {
    match dt {
        DType::F16 => "round_f16",
        DType::BF16 => "round_bf16",
        DType::F32 | DType::F64 => "keep",
        DType::I64 | DType::I32 => "keep_i",
        DType::U8 => "sat_u8",
    }
}
