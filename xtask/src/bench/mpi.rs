//! Benchmarks over MPI processes: starting a child under `mpirun` and adding a value over
//! the ranks. Without xtask's `mpi` feature both say how to get it.

use std::path::Path;

/// Runs `exe args` as `np` MPI processes (TCP between them) and returns rank 0's
/// standard output (the only rank that prints).
#[cfg(feature = "mpi")]
pub fn run_under_mpirun(exe: &Path, args: &[&str], np: usize) -> Result<String, String> {
    let dir = std::env::temp_dir().join(format!("redco-bench-mpi-{}", std::process::id()));
    let m = redco_mpi::launch::Mpirun::new(np);
    if !m.available() {
        return Err("mpirun is not installed (apt-get install openmpi-bin libopenmpi-dev)".into());
    }
    let r = m
        .run(exe, args, &dir, std::time::Duration::from_secs(3600))
        .map_err(|e| format!("cannot start mpirun: {e}"))?;
    let _ = std::fs::remove_dir_all(&dir);
    if r.code != Some(0) {
        return Err(format!("mpirun -np {np} {}: {}", args.join(" "), r.stderr.trim()));
    }
    Ok(r.stdout)
}

/// Without the `mpi` feature: an error that says how to get it.
#[cfg(not(feature = "mpi"))]
pub fn run_under_mpirun(_exe: &Path, _args: &[&str], _np: usize) -> Result<String, String> {
    Err("process ranks need xtask's `mpi` feature: cargo run --release -p xtask --features mpi -- bench ...".into())
}

/// `v` summed over every rank of the mesh (an all-reduce along `mp`, then `dp`).
#[cfg(feature = "mpi")]
pub fn sum_over_mesh<B: redco_core::Backend>(rk: &redco_core::runtime::Rank<B>, v: f64) -> redco_core::Result<f64> {
    use redco_core::{HostData, MeshAxis};
    let mut s = rk.backend.upload(&HostData::F32(vec![v as f32]))?;
    for axis in [MeshAxis::Mp, MeshAxis::Dp] {
        s = rk.comm.all_reduce(axis, &s, redco_core::runtime::ReduceKind::Sum, 4)?;
    }
    Ok(rk.backend.download(&s)?.to_f64_vec()[0])
}
