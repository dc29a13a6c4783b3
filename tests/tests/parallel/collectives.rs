//! The in-process collective over a mesh: values, ordering, counts and failures.

use redco_core::runtime::{CollectiveKind, Mesh, ReduceKind, SpmdOptions};
use redco_core::{Backend, DType, Error, HostData, MeshAxis, Tensor};
use redco_cpu::spmd_cpu;
use std::time::{Duration, Instant};

fn opts(timeout_ms: u64) -> SpmdOptions {
    SpmdOptions { timeout: Duration::from_millis(timeout_ms), threads_per_rank: Some(1) }
}

fn vals(r: usize, n: usize) -> Vec<f32> {
    (0..n).map(|i| (r * 10 + i) as f32).collect()
}

#[test]
fn all_reduce_gather_scatter_broadcast_on_a_2x2_mesh() {
    let mesh = Mesh::new(2, 2).unwrap();
    let out = spmd_cpu(mesh, &opts(10_000), |rk| {
        let b = &rk.backend;
        let x = b.upload(&HostData::F32(vals(rk.rank, 4)))?;
        let (d, m) = mesh.coords(rk.rank);
        let mp_peers: Vec<usize> = mesh.group_members(rk.rank, MeshAxis::Mp);
        let dp_peers: Vec<usize> = mesh.group_members(rk.rank, MeshAxis::Dp);
        // sum over mp
        let s = b.download(&rk.comm.all_reduce(MeshAxis::Mp, &x, ReduceKind::Sum, 16)?)?.to_f64_vec();
        let want: Vec<f64> = (0..4).map(|i| mp_peers.iter().map(|&p| (p * 10 + i) as f64).sum()).collect();
        assert_eq!(s, want, "sum over mp on rank {}", rk.rank);
        // max over dp
        let mx = b.download(&rk.comm.all_reduce(MeshAxis::Dp, &x, ReduceKind::Max, 16)?)?.to_f64_vec();
        let want: Vec<f64> =
            (0..4).map(|i| dp_peers.iter().map(|&p| (p * 10 + i) as f64).fold(f64::MIN, f64::max)).collect();
        assert_eq!(mx, want);
        // gather over mp, in axis order
        let g = b.download(&rk.comm.all_gather(MeshAxis::Mp, &x, 32)?)?.to_f64_vec();
        let want: Vec<f64> = mp_peers.iter().flat_map(|&p| vals(p, 4)).map(|v| v as f64).collect();
        assert_eq!(g, want);
        // reduce-scatter over dp: chunk `d` of the sum
        let rs = b.download(&rk.comm.reduce_scatter(MeshAxis::Dp, &x, 16)?)?.to_f64_vec();
        let want: Vec<f64> = (2 * d..2 * d + 2).map(|i| dp_peers.iter().map(|&p| (p * 10 + i) as f64).sum()).collect();
        assert_eq!(rs, want);
        // broadcast from mp position 1
        let bc = b.download(&rk.comm.broadcast(MeshAxis::Mp, &x, 1, 16)?)?.to_f64_vec();
        assert_eq!(bc, vals(mesh.rank_of(d, 1), 4).iter().map(|&v| v as f64).collect::<Vec<_>>());
        rk.comm.barrier()?;
        let _ = m;
        Ok(rk.comm.stats())
    })
    .unwrap();
    for st in out {
        assert_eq!(st.get(CollectiveKind::AllReduce, MeshAxis::Mp).calls, 1);
        assert_eq!(st.get(CollectiveKind::AllReduce, MeshAxis::Dp).calls, 1);
        assert_eq!(st.get(CollectiveKind::AllGather, MeshAxis::Mp).bytes, 32);
        assert_eq!(st.get(CollectiveKind::ReduceScatter, MeshAxis::Dp).calls, 1);
        assert_eq!(st.get(CollectiveKind::Broadcast, MeshAxis::Mp).calls, 1);
        assert_eq!(st.total_calls(), 6);
    }
}

/// Small all-reduces sum on every member; large ones sum one slice per member and gather
/// the slices. Lengths that do not split evenly (7, 1, 0, and 2^16 + 3 over 4 members)
/// and half-precision data give the full sum on every member, bit-identical across them.
#[test]
fn all_reduce_of_uneven_lengths_and_f16() {
    let mesh = Mesh::new(1, 4).unwrap();
    let out = spmd_cpu(mesh, &opts(10_000), |rk| {
        let b = &rk.backend;
        let mut got = Vec::new();
        for n in [7usize, 1, 0, 1000, (1 << 16) + 3] {
            let x = b.upload(&HostData::F32(vals(rk.rank, n)))?;
            let s = b.download(&rk.comm.all_reduce(MeshAxis::Mp, &x, ReduceKind::Sum, n * 4)?)?.to_f64_vec();
            let want: Vec<f64> = (0..n).map(|i| (0..4).map(|p| (p * 10 + i) as f64).sum()).collect();
            assert_eq!(s, want, "sum of {n} on rank {}", rk.rank);
            got.push(s);
        }
        let h = HostData::from_f64(&vals(rk.rank, 5).iter().map(|&v| v as f64 * 0.5).collect::<Vec<_>>(), DType::F16);
        let x = b.upload(&h)?;
        let s = b.download(&rk.comm.all_reduce(MeshAxis::Mp, &x, ReduceKind::Sum, 10)?)?;
        assert_eq!(s.dtype(), DType::F16);
        let want: Vec<f64> = (0..5).map(|i| (0..4).map(|p| (p * 10 + i) as f64 * 0.5).sum()).collect();
        assert_eq!(s.to_f64_vec(), want);
        Ok(got)
    })
    .unwrap();
    assert!(out.windows(2).all(|w| w[0] == w[1]));
}

#[test]
fn many_rounds_stay_in_order() {
    let mesh = Mesh::new(1, 4).unwrap();
    spmd_cpu(mesh, &opts(10_000), |rk| {
        for round in 0..200 {
            let x = Tensor::from_vec(&rk.backend, vec![(rk.rank + round) as f32], [1])?;
            let s = rk.comm.all_reduce(MeshAxis::Mp, x.storage(), ReduceKind::Sum, 4)?;
            let v = rk.backend.download(&s)?.to_f64_vec()[0];
            assert_eq!(v, (0..4).map(|r| (r + round) as f64).sum::<f64>());
        }
        Ok(())
    })
    .unwrap();
}

#[test]
fn a_panicking_rank_fails_the_others_fast() {
    let mesh = Mesh::new(1, 4).unwrap();
    let start = Instant::now();
    let err = spmd_cpu(mesh, &opts(30_000), |rk| {
        let x = rk.backend.upload(&HostData::F32(vec![1.0; 8]))?;
        rk.comm.all_reduce(MeshAxis::Mp, &x, ReduceKind::Sum, 32)?;
        if rk.rank == 2 {
            panic!("rank two lost its device");
        }
        rk.comm.all_reduce(MeshAxis::Mp, &x, ReduceKind::Sum, 32)?;
        Ok(())
    })
    .unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(10), "others must not wait for the timeout");
    match err {
        Error::RankFailed { rank, msg } => {
            assert_eq!(rank, 2);
            assert!(msg.contains("lost its device"), "{msg}");
        }
        other => panic!("expected RankFailed, got {other}"),
    }
}

#[test]
fn a_rank_that_skips_a_collective_times_out_the_others() {
    let mesh = Mesh::new(2, 1).unwrap();
    let start = Instant::now();
    let err = spmd_cpu(mesh, &opts(300), |rk| {
        if rk.rank == 0 {
            std::thread::sleep(Duration::from_millis(900));
            return Ok(());
        }
        let x = rk.backend.upload(&HostData::F32(vec![1.0; 2]))?;
        rk.comm.all_reduce(MeshAxis::Dp, &x, ReduceKind::Sum, 8)?;
        Ok(())
    })
    .unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(5));
    assert!(err.to_string().contains("timed out"), "{err}");
}

#[test]
fn ranks_that_disagree_get_an_error() {
    let mesh = Mesh::new(1, 2).unwrap();
    let err = spmd_cpu(mesh, &opts(5_000), |rk| {
        let n = if rk.rank == 0 { 3 } else { 4 };
        let x = rk.backend.upload(&HostData::F32(vec![1.0; n]))?;
        rk.comm.all_reduce(MeshAxis::Mp, &x, ReduceKind::Sum, n * 4)?;
        Ok(())
    })
    .unwrap_err();
    assert!(err.to_string().contains("disagree"), "{err}");
    let _ = DType::F32;
}

/// A rank's flat bucket of `n` values, which differ by rank and span many magnitudes, so
/// that a different order of summation would change the bits.
fn flat_values(rank: usize, n: usize) -> Vec<f64> {
    (0..n).map(|i| ((i * 7 + rank * 13) as f64).sin() * 10f64.powi((i % 9) as i32 - 4) + rank as f64 * 0.1).collect()
}

/// [`flat_values`] cut into buffers of `sizes` elements.
fn bucket(rank: usize, sizes: &[usize], dt: DType) -> Vec<HostData> {
    let v = flat_values(rank, sizes.iter().sum());
    let mut off = 0;
    sizes
        .iter()
        .map(|&n| {
            off += n;
            HostData::from_f64(&v[off - n..off], dt)
        })
        .collect()
}

#[test]
fn a_bucket_all_reduce_gives_the_bits_of_the_flat_all_reduce() {
    // ranges of the reduce split cross buffer boundaries (3 members), empty and one-element
    // buffers, both reductions, f32 and f64; the flat all-reduce of the concatenation is the
    // reference (its values are checked against f64 sums above)
    let sizes = [40_000usize, 0, 1, 33_333, 5, 20_000];
    let total: usize = sizes.iter().sum();
    for (mesh, dt) in [(Mesh::new(3, 1).unwrap(), DType::F32), (Mesh::new(2, 2).unwrap(), DType::F64)] {
        let shared = spmd_cpu(mesh, &opts(20_000), |rk| {
            let b = &rk.backend;
            let xs: Vec<(_, usize)> = bucket(rk.rank, &sizes, dt)
                .iter()
                .map(|h| Ok((b.upload(h)?, h.len())))
                .collect::<redco_core::Result<_>>()?;
            let flat = b.upload(&HostData::from_f64(&flat_values(rk.rank, total), dt))?;
            let mut last = None;
            for op in [ReduceKind::Sum, ReduceKind::Max] {
                let bytes = total * dt.size_in_bytes();
                let got = rk.comm.all_reduce_bucket_async(b, MeshAxis::Dp, &xs, op, bytes)?.wait()?;
                let want = b.download(&rk.comm.all_reduce(MeshAxis::Dp, &flat, op, bytes)?)?;
                assert_eq!(got.len(), sizes.len());
                let mut cat = Vec::new();
                for (g, &n) in got.iter().zip(&sizes) {
                    let h = b.download(g)?;
                    assert_eq!((h.len(), h.dtype()), (n, dt));
                    cat.extend_from_slice(h.as_bytes());
                }
                assert!(cat == want.as_bytes(), "{op:?} over {mesh} in {dt:?}: the bucket's bits differ");
                last = Some(got);
            }
            // each bucket is counted as one all-reduce of its bytes
            let c = rk.comm.stats().get(CollectiveKind::AllReduce, MeshAxis::Dp);
            assert_eq!((c.calls, c.bytes), (4, 4 * (total * dt.size_in_bytes()) as u64));
            // where each buffer lies: the last lies within the last member's slice
            Ok(last.unwrap_or_default())
        })
        .unwrap();
        // (the storages are all alive here, so equal addresses mean one buffer)
        let at = |r: usize, k: usize| shared[r][k].data() as *const HostData;
        // every dp group holds the sum of a buffer that lies within one member's slice once,
        // shared by its members; one that a slice boundary cuts is put together by each
        let n = mesh.dp;
        let cuts: Vec<usize> = (1..n).map(|j| j * (total / n) + j.min(total % n)).collect();
        for g in 0..mesh.mp {
            let members = mesh.group_members(mesh.rank_of(0, g), MeshAxis::Dp);
            let mut off = 0;
            for (k, &len) in sizes.iter().enumerate() {
                let cut = cuts.iter().any(|&c| off < c && c < off + len);
                off += len;
                if len > 0 {
                    let same = members[1..].iter().all(|&r| at(r, k) == at(members[0], k));
                    assert_eq!(same, !cut, "{mesh}: buffer {k} shared: {same}, cut by a slice boundary: {cut}");
                }
            }
        }
    }
}

#[test]
fn ranks_whose_buckets_disagree_get_an_error() {
    // the same total in differently cut buffers, and one buffer against two
    for other in [vec![30_000usize, 50_000], vec![80_000]] {
        let start = Instant::now();
        let err = spmd_cpu(Mesh::new(2, 1).unwrap(), &opts(10_000), |rk| {
            let sizes = if rk.rank == 0 { vec![40_000, 40_000] } else { other.clone() };
            let b = &rk.backend;
            let xs: Vec<(_, usize)> = bucket(rk.rank, &sizes, DType::F32)
                .iter()
                .map(|h| Ok((b.upload(h)?, h.len())))
                .collect::<redco_core::Result<_>>()?;
            rk.comm.all_reduce_bucket_async(b, MeshAxis::Dp, &xs, ReduceKind::Sum, 320_000)?.wait()?;
            Ok(())
        })
        .unwrap_err();
        assert!(err.to_string().contains("disagree"), "{err}");
        assert!(start.elapsed() < Duration::from_secs(5), "the ranks waited for the timeout");
    }
}

#[test]
fn mesh_parsing_and_errors() {
    assert_eq!("2x4".parse::<Mesh>().unwrap(), Mesh::new(2, 4).unwrap());
    assert!("2by4".parse::<Mesh>().is_err());
    assert!("0x2".parse::<Mesh>().is_err());
    let m = Mesh::new(2, 3).unwrap();
    assert_eq!(m.coords(4), (1, 1));
    assert_eq!(m.group_members(4, MeshAxis::Mp), vec![3, 4, 5]);
    assert_eq!(m.group_members(4, MeshAxis::Dp), vec![1, 4]);
}
