//! The backends a benchmark can run on: those compiled into this xtask (`cpu` always,
//! `wgpu` with the `wgpu` feature, `cuda` with the `cuda` feature, `cpu-mpi`: CPU ranks as MPI processes, with the `mpi`
//! feature, `pjrt-eager` and `pjrt` (compiled steps) with the `tpu` feature), and the
//! feature each of the others would need.

/// Every backend name, and the xtask feature it needs (`None`: compiled in).
const BACKENDS: [(&str, Option<&str>); 6] = [
    ("cpu", None),
    ("wgpu", if cfg!(feature = "wgpu") { None } else { Some("wgpu") }),
    // CPU ranks as MPI processes (under mpirun, TCP between them), beside the thread ranks
    ("cpu-mpi", if cfg!(feature = "mpi") { None } else { Some("mpi") }),
    ("cuda", if cfg!(feature = "cuda") { None } else { Some("cuda") }),
    // PJRT (the plugin of REDCO_PJRT_PLUGIN): op by op, and the compiled training step
    ("pjrt-eager", if cfg!(feature = "tpu") { None } else { Some("tpu") }),
    ("pjrt", if cfg!(feature = "tpu") { None } else { Some("tpu") }),
];

/// The backends compiled in, for messages (`cpu` or `cpu, wgpu`).
pub fn enabled() -> String {
    BACKENDS.iter().filter(|(_, f)| f.is_none()).map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
}

/// Checks `--backend` (comma-separated) against the backends compiled in.
pub fn parse(s: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        match BACKENDS.iter().find(|(n, _)| *n == name) {
            Some((n, None)) => out.push(n.to_string()),
            Some((n, Some(f @ ("wgpu" | "mpi" | "tpu" | "cuda")))) => {
                return Err(format!(
                    "backend `{n}` is not compiled into this xtask (enabled: {}): run `cargo run --release -p xtask \
                     --features {f} -- bench ...` to benchmark it",
                    enabled()
                ))
            }
            Some((n, Some(feature))) => {
                return Err(format!(
                    "backend `{n}` is not compiled into this xtask (enabled: {}): benchmarking it needs a \
                     `{feature}` feature of xtask wiring in that backend, which xtask does not have yet",
                    enabled()
                ))
            }
            None => {
                return Err(format!(
                    "unknown backend `{name}` (known: cpu, cpu-mpi, wgpu, cuda, pjrt-eager, pjrt; enabled: {})",
                    enabled()
                ))
            }
        }
    }
    if out.is_empty() {
        return Err(format!("--backend needs at least one backend (enabled: {})", enabled()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn wgpu_is_there_exactly_with_its_feature() {
        assert_eq!(super::parse("cpu").unwrap(), ["cpu"]);
        let wgpu = super::parse("cpu, wgpu");
        if cfg!(feature = "wgpu") {
            assert_eq!(wgpu.unwrap(), ["cpu", "wgpu"]);
        } else {
            let e = wgpu.unwrap_err();
            assert!(e.contains("not compiled") && e.contains("--features wgpu"), "{e}");
        }
        if !cfg!(feature = "cuda") {
            assert!(super::parse("cuda").unwrap_err().contains("--features cuda"));
        }
        assert!(super::parse("npu").unwrap_err().contains("unknown backend"));
        assert!(super::parse("").is_err());
    }
}
