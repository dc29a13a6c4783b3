//! Shared helpers of the redco-rs cross-crate tests.
//!
//! - [`conformance!`]: instantiates generic test functions `fn t<B: Backend>(b: &B)` for
//!   every enabled backend (one module per backend);
//! - [`composite::Composite`]: a decorator backend that forwards only the primitive ops,
//!   so the fused ops' composite defaults are tested too;
//! - [`check`]: comparisons against f64 references and gradient checks by central finite
//!   differences;
//! - [`reference`]: naive f64 implementations of every op family;
//! - [`strategies`]: proptest shapes (odd sizes, size 1, broadcasting).

pub mod blocks;
pub mod check;
pub mod composite;
pub mod models;
pub mod reference;
pub mod strategies;

use redco_core::cpu::Cpu;

/// The CPU backend under test (2 threads, to exercise the parallel paths).
pub fn cpu() -> Cpu {
    Cpu::new(2)
}

/// The CPU backend with every fused op replaced by its composite default.
pub fn composite_cpu() -> composite::Composite<Cpu> {
    composite::Composite(Cpu::new(2))
}

/// Instantiates each generic test `fn name<B: Backend>(b: &B)` once per enabled backend:
/// `cpu::name` and `composite::name` (each later backend adds its line here).
#[macro_export]
macro_rules! conformance {
    ($($t:ident),* $(,)?) => {
        mod cpu {
            $( #[test] fn $t() { super::$t(&$crate::cpu()) } )*
        }
        mod composite {
            $( #[test] fn $t() { super::$t(&$crate::composite_cpu()) } )*
        }
    };
}
