//! Decisions made once, by rank 0, and broadcast: so ranks that are processes on
//! different hosts (each reading its own view of the files) never diverge. Also the checks
//! that every rank sees the same workdir and was configured as rank 0 was.

use redco_core::runtime::Comm;
use redco_core::{Backend, DType, Error, HostData, MeshAxis, Placement, Placements, Result, Shape, Tensor};
use std::path::Path;

/// Rank 0's `values`, on every rank of `comm`'s mesh (a broadcast along `mp`, then along
/// `dp`). The values travel as the bits of f64s in i32 pairs, so they arrive exactly on
/// every backend.
pub fn from_leader<B: Backend>(comm: &Comm<B>, b: &B, values: &[f64]) -> Result<Vec<f64>> {
    if comm.mesh().size() == 1 {
        return Ok(values.to_vec());
    }
    let words: Vec<i32> = values
        .iter()
        .flat_map(|v| {
            let bits = v.to_bits();
            [bits as u32 as i32, (bits >> 32) as u32 as i32]
        })
        .collect();
    let bytes = words.len() * 4;
    let mut s = b.upload(&HostData::I32(words))?;
    for axis in [MeshAxis::Mp, MeshAxis::Dp] {
        if comm.mesh().axis_size(axis) > 1 {
            s = comm.broadcast(axis, &s, 0, bytes)?;
        }
    }
    let HostData::I32(w) = b.download(&s)?.cast(DType::I32) else { unreachable!("cast to i32") };
    Ok(w.chunks_exact(2).map(|p| f64::from_bits(p[0] as u32 as u64 | ((p[1] as u32 as u64) << 32))).collect())
}

/// Rank 0's `text` (up to 255 bytes of it) on every rank, through [`from_leader`]: six
/// bytes to an f64, exact.
pub fn text_from_leader<B: Backend>(comm: &Comm<B>, b: &B, text: &str) -> Result<String> {
    let mut bytes: Vec<u8> = text.as_bytes().iter().copied().take(255).collect();
    bytes.insert(0, bytes.len() as u8);
    bytes.resize(258, 0);
    let values: Vec<f64> =
        bytes.chunks(6).map(|c| c.iter().rev().fold(0u64, |a, &x| (a << 8) | u64::from(x)) as f64).collect();
    let got = from_leader(comm, b, &values)?;
    let bytes: Vec<u8> = got.iter().flat_map(|v| (0..6).map(move |i| ((*v as u64) >> (8 * i)) as u8)).collect();
    let n = usize::from(bytes[0]);
    Ok(String::from_utf8_lossy(&bytes[1..=n]).into_owned())
}

/// Every rank checks that it sees the workdir rank 0 sees: rank 0 writes a file with a
/// fresh token, every rank reads it back. A rank on a host where the workdir is another
/// directory (not a shared filesystem) gets an error naming both hosts and the path.
pub fn check_shared_workdir<B: Backend>(comm: &Comm<B>, b: &B, workdir: &Path, host: &str) -> Result<()> {
    if comm.mesh().size() == 1 {
        return Ok(());
    }
    let path = workdir.join(".redco-shared-check");
    let token = if comm.rank() == 0 {
        let t = redco_core::ops::random::mix64(
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
                ^ (u64::from(std::process::id()) << 32),
        ) >> 12; // exact in an f64
        super::checkpoint::write_atomic(&path, t.to_string().as_bytes())?;
        t as f64
    } else {
        0.0
    };
    let token = from_leader(comm, b, &[token])?[0] as u64;
    let leader_host = text_from_leader(comm, b, host)?;
    let seen = std::fs::read_to_string(&path).ok().and_then(|s| s.trim().parse::<u64>().ok());
    let ok = seen == Some(token);
    comm.barrier()?;
    if comm.rank() == 0 {
        let _ = std::fs::remove_file(&path);
    }
    if !ok {
        return Err(Error::invalid(
            "workdir",
            format!(
                "rank {} on host {host} does not see the workdir {} that rank 0 writes on host {leader_host} (it found {}): put the workdir on a filesystem every host shares",
                comm.rank(),
                workdir.display(),
                seen.map_or("no check file".to_string(), |s| format!("another token {s}"))
            ),
        ));
    }
    Ok(())
}

/// Refuses, on a rank whose settings differ from rank 0's, a run whose ranks must agree on
/// them (ranks that are processes each build their own configuration: a planner that
/// reads the memory free when its process starts may choose otherwise). `settings` are
/// `(name, value)`; the error names the rank, its host and both values. A mismatch would
/// otherwise surface as ranks calling different collectives: a hang, or wrong sums.
pub fn check_same_as_leader<B: Backend>(comm: &Comm<B>, b: &B, host: &str, settings: &[(&str, f64)]) -> Result<()> {
    let mine: Vec<f64> = settings.iter().map(|(_, v)| *v).collect();
    let leader = from_leader(comm, b, &mine)?;
    let differ: Vec<String> = settings
        .iter()
        .zip(&leader)
        .filter(|((_, v), l)| v.to_bits() != l.to_bits())
        .map(|((name, v), l)| format!("{name} {v} (rank 0: {l})"))
        .collect();
    if differ.is_empty() {
        return Ok(());
    }
    Err(Error::invalid(
        "fit",
        format!(
            "rank {} on host {host} was configured otherwise than rank 0: {}; every rank must run the same \
             strategy (give --zero, --unit-layers and --offload explicitly, or the same --device-memory)",
            comm.rank(),
            differ.join(", ")
        ),
    ))
}

/// A rank's own slice of a batch entry split over `dp` (what `collate_fn` made from this
/// rank's examples), as the `Shard(0)` piece of the global batch.
pub fn dp_shard<B: Backend>(t: Tensor<B>, dp: usize) -> Result<Tensor<B>> {
    if dp == 1 {
        return Ok(t);
    }
    if t.placements() != Placements::REPLICATED || t.dims().is_empty() {
        return Err(Error::invalid(
            "fit",
            format!(
                "collate_fn must return plain tensors with a batch dimension, got {:?} {:?}",
                t.dims(),
                t.placements()
            ),
        ));
    }
    let local = t.shape().clone();
    let mut dims = local.dims().to_vec();
    dims[0] *= dp;
    let placed = Placements::REPLICATED.with(MeshAxis::Dp, Placement::Shard(0));
    Ok(Tensor::from_local(t.backend(), t.storage().clone(), Shape::new(dims), local, placed, t.dtype()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use redco_core::runtime::{Mesh, SpmdOptions};
    use redco_cpu::spmd_cpu;

    #[test]
    fn rank_zeros_values_reach_every_rank_exactly() {
        let mesh = Mesh::new(2, 2).unwrap();
        let got = spmd_cpu(mesh, &SpmdOptions::default(), |rk| {
            // each rank offers its own values; rank 0's win, bit for bit
            let mine = [rk.rank as f64 + 0.1, f64::NAN, -1.0 / 3.0 * (rk.rank + 1) as f64];
            from_leader(&rk.comm, &rk.backend, &mine)
        })
        .unwrap();
        for v in got {
            assert_eq!(v[0].to_bits(), 0.1f64.to_bits());
            assert!(v[1].is_nan());
            assert_eq!(v[2].to_bits(), (-1.0f64 / 3.0).to_bits());
        }
    }

    #[test]
    fn a_workdir_that_is_not_shared_is_named() {
        // rank 1 "on another host": its workdir path points at a different directory
        let base = std::env::temp_dir().join(format!("redco-shared-check-{}", std::process::id()));
        let dirs = [base.join("a"), base.join("b")];
        for d in &dirs {
            std::fs::create_dir_all(d).unwrap();
        }
        let mesh = Mesh::new(1, 2).unwrap();
        let r = spmd_cpu(mesh, &SpmdOptions::default(), |rk| {
            check_shared_workdir(&rk.comm, &rk.backend, &dirs[rk.rank], &format!("host{}", rk.rank))
        });
        let e = r.unwrap_err().to_string();
        assert!(e.contains("rank 1 on host host1 does not see the workdir"), "{e}");
        // the same directory everywhere passes
        spmd_cpu(mesh, &SpmdOptions::default(), |rk| check_shared_workdir(&rk.comm, &rk.backend, &dirs[0], "h"))
            .unwrap();
        let _ = std::fs::remove_dir_all(&base);
    }
}
