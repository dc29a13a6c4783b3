//! A self-check of a transport, like nccl-tests: every collective on every axis and dtype
//! against an f64 reference, with a digest of each result's bytes, so a run over
//! processes can be compared bit for bit with the same run over threads. The
//! `redco-mpi-check` program runs it under `mpirun`; the tests run it both ways.

use redco_core::runtime::{Comm, ReduceKind};
use redco_core::{Backend, DType, Error, HostData, MeshAxis, Result};

/// One checked call: its name and the FNV-1a digest of its result's bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    /// `op/axis/dtype/len`.
    pub name: String,
    /// FNV-1a of the result's bytes.
    pub digest: u64,
}

fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// The input of mesh rank `rank` for a buffer of `len`: distinct per rank and element,
/// with a spread of magnitudes (so the summation order shows in the low bits).
fn input(rank: usize, len: usize, salt: usize) -> Vec<f64> {
    (0..len)
        .map(|i| {
            let x = ((rank * 7919 + i * 104_729 + salt * 31) % 1_000_003) as f64;
            ((x * 0.618_033_988_7).fract() - 0.5) * 10f64.powi((i % 5) as i32 - 2)
        })
        .collect()
}

fn tolerance(dt: DType) -> f64 {
    match dt {
        DType::F64 | DType::I64 => 1e-12,
        DType::F32 => 1e-5,
        _ => 2e-2,
    }
}

fn host(v: &[f64], dt: DType) -> HostData {
    match dt {
        // integers: the values scaled, so they are not all zero
        DType::I64 => HostData::I64(v.iter().map(|x| (x * 1000.0).round() as i64).collect()),
        d => HostData::from_f64(v, d),
    }
}

fn expect_close(name: &str, got: &HostData, want: &[f64], dt: DType) -> Result<()> {
    let g = got.to_f64_vec();
    if g.len() != want.len() {
        return Err(Error::invalid("check", format!("{name}: {} elements, expected {}", g.len(), want.len())));
    }
    let scale = want.iter().fold(0.0f64, |m, x| m.max(x.abs())).max(1e-30);
    for (i, (a, b)) in g.iter().zip(want).enumerate() {
        if (a - b).abs() > tolerance(dt) * scale {
            return Err(Error::invalid("check", format!("{name}: element {i} is {a}, expected {b}")));
        }
    }
    Ok(())
}

/// Runs every collective of `comm` on `b`: all-reduce (sum and max; small, and `big`
/// elements, above the split threshold), all-gather, reduce-scatter, broadcast from the
/// last member, all-to-all with uneven counts, over `dp` and `mp`, in f32, f64, f16, bf16 and i64; then a barrier.
/// Each result is checked against an f64 reference; returns the digests.
pub fn battery<B: Backend>(comm: &Comm<B>, b: &B, big: usize) -> Result<Vec<Checked>> {
    let mesh = comm.mesh();
    let rank = comm.rank();
    let mut out = Vec::new();
    for axis in [MeshAxis::Dp, MeshAxis::Mp] {
        let members = mesh.group_members(rank, axis);
        let n = members.len();
        let me = mesh.index_along(rank, axis);
        for dt in [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64] {
            if !b.supports(dt) {
                continue;
            }
            let as_dt = |v: Vec<f64>| host(&v, dt).to_f64_vec();
            let mut record = |name: String, h: &HostData| out.push(Checked { digest: fnv(h.as_bytes()), name });
            for (len, salt) in [(1000usize, 1usize), (big, 2)] {
                for op in [ReduceKind::Sum, ReduceKind::Max] {
                    let mine = b.upload(&host(&input(rank, len, salt), dt))?;
                    let got = b.download(&comm.all_reduce(axis, &mine, op, len * dt.size_in_bytes())?)?;
                    let parts: Vec<Vec<f64>> = members.iter().map(|&m| as_dt(input(m, len, salt))).collect();
                    let want: Vec<f64> = (0..len)
                        .map(|i| match op {
                            ReduceKind::Sum => parts.iter().map(|p| p[i]).sum(),
                            ReduceKind::Max => parts.iter().map(|p| p[i]).fold(f64::MIN, f64::max),
                        })
                        .collect();
                    let name = format!("all_reduce_{op:?}/{axis:?}/{dt:?}/{len}");
                    expect_close(&name, &got, &want, dt)?;
                    record(name, &got);
                }
            }
            let len = 333;
            let mine = b.upload(&host(&input(rank, len, 3), dt))?;
            let got = b.download(&comm.all_gather(axis, &mine, n * len * dt.size_in_bytes())?)?;
            let want: Vec<f64> = members.iter().flat_map(|&m| as_dt(input(m, len, 3))).collect();
            let name = format!("all_gather/{axis:?}/{dt:?}/{len}");
            expect_close(&name, &got, &want, dt)?;
            record(name, &got);

            let len = n * 500;
            let mine = b.upload(&host(&input(rank, len, 4), dt))?;
            let got = b.download(&comm.reduce_scatter(axis, &mine, len * dt.size_in_bytes())?)?;
            let parts: Vec<Vec<f64>> = members.iter().map(|&m| as_dt(input(m, len, 4))).collect();
            let want: Vec<f64> = (me * 500..(me + 1) * 500).map(|i| parts.iter().map(|p| p[i]).sum()).collect();
            let name = format!("reduce_scatter/{axis:?}/{dt:?}/{len}");
            expect_close(&name, &got, &want, dt)?;
            record(name, &got);

            let len = 257;
            let root = n - 1;
            let mine = b.upload(&host(&input(rank, len, 5), dt))?;
            let got = b.download(&comm.broadcast(axis, &mine, root, len * dt.size_in_bytes())?)?;
            let name = format!("broadcast/{axis:?}/{dt:?}/{len}");
            expect_close(&name, &got, &as_dt(input(members[root], len, 5)), dt)?;
            record(name, &got);

            // all-to-all with uneven counts, some of them zero: member i sends
            // `count(i, j)` values to member j, its pieces in member order
            let count = |i: usize, j: usize| if (i + 2 * j).is_multiple_of(3) { 0 } else { (i * 37 + j * 11) % 50 + 1 };
            let sent = |i: usize| -> Vec<f64> { as_dt(input(members[i], (0..n).map(|j| count(i, j)).sum(), 6)) };
            let send: Vec<usize> = (0..n).map(|j| count(me, j)).collect();
            let recv: Vec<usize> = (0..n).map(|i| count(i, me)).collect();
            let mine = b.upload(&host(&input(rank, send.iter().sum(), 6), dt))?;
            let bytes = send.iter().sum::<usize>() * dt.size_in_bytes();
            let got = b.download(&comm.all_to_all(axis, &mine, &send, &recv, bytes)?)?;
            let want: Vec<f64> = (0..n)
                .flat_map(|i| {
                    let at: usize = (0..me).map(|j| count(i, j)).sum();
                    sent(i)[at..at + count(i, me)].to_vec()
                })
                .collect();
            let name = format!("all_to_all/{axis:?}/{dt:?}");
            expect_close(&name, &got, &want, dt)?;
            record(name, &got);
        }
    }
    comm.barrier()?;
    Ok(out)
}
