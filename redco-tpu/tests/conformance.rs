//! The whole backend conformance suite on the PJRT backend: device 0 of a client of the
//! plugin named by `REDCO_PJRT_PLUGIN` (the suite uses one device), opened once per
//! process. Without a plugin every test fails saying so (`cargo xtask test` fetches the
//! CPU plugin): none passes without running.

fn pjrt() -> redco_tpu::Pjrt {
    static DEV: std::sync::OnceLock<Result<redco_tpu::Pjrt, String>> = std::sync::OnceLock::new();
    match DEV.get_or_init(|| redco_tpu::Pjrt::from_env(1).map_err(|e| e.to_string())) {
        Ok(p) => p.clone(),
        Err(e) => panic!("the PJRT backend is unavailable: {e}"),
    }
}

redco_tests::suite!(pjrt());
