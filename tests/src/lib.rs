//! Shared helpers of the redco-rs cross-crate tests.
//!
//! - [`conformance!`]: instantiates generic test functions `fn t<B: Backend>(b: &B)` for
//!   every enabled backend (one module per backend);
//! - [`composite::Composite`]: a decorator backend that forwards only the primitive ops,
//!   so the fused ops' composite defaults are tested too;
//! - [`check`]: comparisons against f64 references and gradient checks by central finite
//!   differences;
//! - [`reference`](mod@reference): naive f64 implementations of every op family;
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

/// The wgpu backend under test, opened once per process and shared by every test.
///
/// Returns `None` (after printing why) when no wgpu adapter is available, so the wgpu
/// instantiations skip on machines without a Vulkan/Metal/DX12/GL driver; with
/// `REDCO_REQUIRE_WGPU=1` (set in CI) a missing adapter fails the test instead.
pub fn wgpu() -> Option<redco_wgpu::Wgpu> {
    static DEV: std::sync::OnceLock<Result<redco_wgpu::Wgpu, String>> = std::sync::OnceLock::new();
    match DEV.get_or_init(|| redco_wgpu::Wgpu::new().map_err(|e| e.to_string())) {
        Ok(w) => Some(w.clone()),
        Err(e) if std::env::var("REDCO_REQUIRE_WGPU").is_ok_and(|v| v == "1") => {
            panic!("REDCO_REQUIRE_WGPU=1 but the wgpu backend is unavailable: {e}")
        }
        Err(e) => {
            eprintln!("skipping a wgpu test: {e} (set REDCO_REQUIRE_WGPU=1 to make this a failure)");
            None
        }
    }
}

/// A second wgpu device, opened without packed f16 (f16 kept in f32 words), for running the
/// wgpu tests on both f16 layouts; `None` (the tests skip) when [`wgpu`] is unavailable or
/// has no packed f16 itself (the second run would repeat the first).
pub fn wgpu_f32_words() -> Option<redco_wgpu::Wgpu> {
    static DEV: std::sync::OnceLock<Option<redco_wgpu::Wgpu>> = std::sync::OnceLock::new();
    DEV.get_or_init(|| {
        let packed = wgpu()?;
        if !packed.has_f16() {
            return None;
        }
        let w = redco_wgpu::Wgpu::new_with_f16(false).expect("the wgpu adapter opened once already");
        assert!(!w.has_f16());
        Some(w)
    })
    .clone()
}

/// The PJRT backend under test: device 0 of one client of the plugin named by
/// `REDCO_PJRT_PLUGIN` (with 4 devices on the CPU plugin), opened once per process.
///
/// Panics, naming what is missing, when no plugin is given or it does not load: these
/// tests never pass without running (`cargo xtask test` fetches the CPU plugin, or leaves
/// them out by name where it cannot).
pub fn pjrt() -> redco_tpu::Pjrt {
    static DEV: std::sync::OnceLock<Result<redco_tpu::Pjrt, String>> = std::sync::OnceLock::new();
    match DEV.get_or_init(|| redco_tpu::Pjrt::from_env(4).map_err(|e| e.to_string())) {
        Ok(p) => p.clone(),
        Err(e) => panic!("the PJRT backend is unavailable: {e}"),
    }
}

/// Instantiates each generic test `fn name<B: Backend>(b: &B)` once per enabled backend:
/// `cpu::name`, `composite::name`, `wgpu::name` (skipped without a wgpu adapter) and
/// `wgpu_f32_words::name` (the same on a device keeping f16 in f32 words; skipped when the
/// first has no packed f16); each later backend adds its line here.
#[macro_export]
macro_rules! conformance {
    ($($t:ident),* $(,)?) => {
        mod cpu {
            $( #[test] fn $t() { super::$t(&$crate::cpu()) } )*
        }
        mod composite {
            $( #[test] fn $t() { super::$t(&$crate::composite_cpu()) } )*
        }
        mod wgpu {
            $( #[test] fn $t() { if let Some(b) = $crate::wgpu() { super::$t(&b) } } )*
        }
        mod pjrt {
            $( #[test] fn $t() { super::$t(&$crate::pjrt()) } )*
        }
        mod wgpu_f32_words {
            $( #[test] fn $t() { if let Some(b) = $crate::wgpu_f32_words() { super::$t(&b) } } )*
        }
    };
}
