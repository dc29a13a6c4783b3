//! `redco-mpi-check`: checks MPI across a job's processes, like nccl-tests. Run it as
//! `mpirun -np N redco-mpi-check [--mesh DPxMP] [--big N] [--out DIR]`: every collective
//! on every mesh axis and dtype against an f64 reference (and, with `--out`, each result's
//! digest per rank, to compare with a thread run), the members' disagreement check, and the
//! bus bandwidth of a large all-reduce. `--stall-rank R --timeout S` makes rank R stop
//! before a barrier (alive, heartbeat running) to show the watchdog naming it.

use redco_core::runtime::{spmd_with, Mesh, ReduceKind, SpmdOptions};
use redco_core::{Backend, Error, HostData, MeshAxis, Result};
use redco_cpu::Cpu;
use redco_mpi::check::battery;
use redco_mpi::Mpi;
use std::path::PathBuf;
use std::time::{Duration, Instant};

struct Args {
    mesh: Option<Mesh>,
    big: usize,
    out: Option<PathBuf>,
    stall: Option<usize>,
    timeout: f64,
}

fn parse() -> std::result::Result<Args, String> {
    let mut a = Args { mesh: None, big: 70_000, out: None, stall: None, timeout: 120.0 };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut v = || it.next().ok_or_else(|| format!("{k} needs a value"));
        match k.as_str() {
            "--mesh" => a.mesh = Some(v()?.parse().map_err(|e: Error| e.to_string())?),
            "--big" => a.big = v()?.parse().map_err(|_| "--big takes a number of elements")?,
            "--out" => a.out = Some(PathBuf::from(v()?)),
            "--stall-rank" => a.stall = Some(v()?.parse().map_err(|_| "--stall-rank takes a rank")?),
            "--timeout" => a.timeout = v()?.parse().map_err(|_| "--timeout takes seconds")?,
            "-h" | "--help" => {
                println!("usage: mpirun -np N redco-mpi-check [--mesh DPxMP] [--big N] [--out DIR] [--stall-rank R] [--timeout S]");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument `{other}`")),
        }
    }
    Ok(a)
}

fn run(mpi: &Mpi, a: &Args) -> Result<()> {
    let w = mpi.world().clone();
    let mesh = a.mesh.unwrap_or(Mesh { dp: 1, mp: w.size });
    let opts = SpmdOptions { timeout: Duration::from_secs_f64(a.timeout), threads_per_rank: Some(1) };
    let factory: &dyn redco_core::runtime::CommFactory<Cpu> = mpi;
    spmd_with(
        factory,
        mesh,
        &opts,
        |_, t| Cpu::try_new(t),
        |rk| {
            if a.stall == Some(rk.rank) {
                eprintln!("redco-mpi-check: rank {} stalls before the barrier (as asked)", rk.rank);
                loop {
                    std::thread::sleep(Duration::from_secs(3600));
                }
            }
            if a.stall.is_some() {
                rk.comm.barrier()?;
                return Ok(());
            }
            let checks = battery(&rk.comm, &rk.backend, a.big)?;
            // members that disagree on a buffer's size get an error, and the group goes on
            let len = 10 + rk.comm.index_along(MeshAxis::Mp);
            let s = rk.backend.upload(&HostData::F32(vec![1.0; len]))?;
            match rk.comm.all_reduce(MeshAxis::Mp, &s, ReduceKind::Sum, len * 4) {
                Err(e) if mesh.mp > 1 && e.to_string().contains("ranks disagree") => {}
                Ok(_) if mesh.mp == 1 => {}
                other => {
                    return Err(Error::invalid(
                        "check",
                        format!("a size disagreement was not caught: {:?}", other.err()),
                    ))
                }
            }
            rk.comm.barrier()?;
            // bus bandwidth of a 64 MiB all-reduce over the whole of mp
            let n = 16 << 20;
            let s = rk.backend.upload(&HostData::F32(vec![1.0; n]))?;
            let t = Instant::now();
            let reps = 3;
            for _ in 0..reps {
                rk.comm.all_reduce(MeshAxis::Mp, &s, ReduceKind::Sum, n * 4)?;
            }
            let dt = t.elapsed().as_secs_f64() / reps as f64;
            let k = mesh.mp as f64;
            if rk.rank == 0 {
                println!(
                "redco-mpi-check: {} processes on {} host(s), mesh {mesh}: {} collectives agree with the f64 reference",
                w.size,
                w.size.div_ceil(w.local_size.max(1)),
                checks.len()
            );
                println!(
                    "redco-mpi-check: all_reduce of 64 MiB over mp: {:.1} ms, bus bandwidth {:.2} GB/s",
                    dt * 1e3,
                    2.0 * (k - 1.0) / k * (n * 4) as f64 / dt / 1e9
                );
            }
            if let Some(dir) = &a.out {
                std::fs::create_dir_all(dir).map_err(|e| Error::io("check", "cannot create", dir, e))?;
                let rows: Vec<String> = checks.iter().map(|c| format!("{} {:016x}", c.name, c.digest)).collect();
                let path = dir.join(format!("rank-{}.txt", rk.rank));
                std::fs::write(&path, rows.join("\n") + "\n")
                    .map_err(|e| Error::io("check", "cannot write", &path, e))?;
            }
            let _ = rk.backend.sync();
            Ok(())
        },
    )?;
    Ok(())
}

fn main() {
    let a = match parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("redco-mpi-check: error: {e}");
            std::process::exit(2);
        }
    };
    let mpi = match Mpi::init() {
        Ok(m) => m,
        Err(e) => {
            eprintln!("redco-mpi-check: error: {e}");
            std::process::exit(2);
        }
    };
    if let Err(e) = run(&mpi, &a) {
        eprintln!("redco-mpi-check: error: rank {}: {e}", mpi.world().rank);
        mpi.abort(2);
    }
}
