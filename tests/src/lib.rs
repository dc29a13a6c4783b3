//! Shared helpers of the redco-rs cross-crate tests.
//!
//! - [`suite`](mod@suite) and [`suite!`]: the backend conformance suite, which a backend
//!   crate instantiates on its own device with one line;
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
pub mod one_step;
pub mod reference;
pub mod strategies;
pub mod suite;

use redco_cpu::Cpu;

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
