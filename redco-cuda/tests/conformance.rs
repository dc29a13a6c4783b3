//! The whole backend conformance suite on the CUDA backend (GPU 0, opened once per
//! process). Without a driver or a GPU every test skips saying why; with
//! `REDCO_REQUIRE_CUDA=1` (set by `cargo xtask gpu-check cuda`) it fails instead.

fn cuda() -> Option<redco_cuda::Cuda> {
    static DEV: std::sync::OnceLock<Result<redco_cuda::Cuda, String>> = std::sync::OnceLock::new();
    match DEV.get_or_init(|| redco_cuda::Cuda::new(0).map_err(|e| e.to_string())) {
        Ok(c) => Some(c.clone()),
        Err(e) if std::env::var("REDCO_REQUIRE_CUDA").is_ok_and(|v| v == "1") => {
            panic!("REDCO_REQUIRE_CUDA=1 but the CUDA backend is unavailable: {e}")
        }
        Err(e) => {
            eprintln!("skipping a CUDA test: {e} (set REDCO_REQUIRE_CUDA=1 to make this a failure)");
            None
        }
    }
}

redco_tests::suite!(@optional cuda());
