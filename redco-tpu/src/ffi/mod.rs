//! The raw PJRT C API: bindings generated once from `include/pjrt_c_api.h` (no libclang
//! at build time) and [`Sized`], which fills an argument struct's `struct_size` from the
//! header.

#![allow(non_camel_case_types, non_snake_case, non_upper_case_globals, dead_code, missing_docs)]
#![allow(clippy::all)]

mod bindings;
pub use bindings::*;

/// A PJRT argument struct: [`Sized::new`] gives it zeroed with `struct_size` set to the
/// header's `PJRT_STRUCT_SIZE` (the end of its last field), as the C API asks.
pub trait Sized: core::marker::Sized {
    /// `PJRT_STRUCT_SIZE` of this struct in the committed header.
    const STRUCT_SIZE: usize;
    /// A zeroed struct (every pointer null, every count 0) with `struct_size` set.
    fn new() -> Self;
}

macro_rules! sized {
    ($t:ident, $size:ident) => {
        impl Sized for $t {
            const STRUCT_SIZE: usize = $size as usize;
            fn new() -> Self {
                // SAFETY: PJRT argument structs are plain C data (sizes, pointers, enums,
                // unions, bools) for which all-zero bytes are valid: null pointers, zero
                // counts, the first enum value, false.
                let mut v: Self = unsafe { core::mem::zeroed() };
                v.struct_size = Self::STRUCT_SIZE;
                v
            }
        }
    };
}

include!("sizes.rs");
