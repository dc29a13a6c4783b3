//! The MPI transport over real processes (`mpirun --oversubscribe --mca btl tcp,self`: TCP
//! between the ranks, the path between hosts): every collective gives the bits the thread
//! transport gives, with large buffers in chunks too; members that disagree on a size get
//! an error; a rank that never enters a collective is named by the others' watchdog and
//! the job ends within the timeout.

use redco_core::runtime::{Mesh, SpmdOptions};
use redco_cpu::spmd_cpu;
use redco_mpi::check::battery;
use redco_mpi::launch::Mpirun;
use std::path::{Path, PathBuf};
use std::time::Duration;

const BIG: usize = 70_000;

fn exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_redco-mpi-check"))
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("redco-mpi-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn mpirun(np: usize) -> Mpirun {
    let m = Mpirun::new(np);
    assert!(
        m.available(),
        "mpirun is not installed: apt-get install openmpi-bin libopenmpi-dev (cargo xtask test does)"
    );
    m
}

/// The digests the battery gives on thread ranks, per rank, as the program writes them.
fn thread_digests(mesh: Mesh) -> Vec<String> {
    spmd_cpu(mesh, &SpmdOptions::default(), |rk| {
        let rows: Vec<String> =
            battery(&rk.comm, &rk.backend, BIG)?.iter().map(|c| format!("{} {:016x}", c.name, c.digest)).collect();
        Ok(rows.join("\n") + "\n")
    })
    .unwrap()
}

fn process_digests(dir: &Path, mesh: Mesh) -> Vec<String> {
    (0..mesh.size()).map(|r| std::fs::read_to_string(dir.join(format!("rank-{r}.txt"))).unwrap()).collect()
}

#[test]
fn every_collective_over_processes_equals_threads_bit_for_bit() {
    for (mesh, chunk) in [("2x2", None), ("1x2", None), ("2x2", Some("4096"))] {
        let mesh: Mesh = mesh.parse().unwrap();
        let dir = scratch(&format!("battery-{mesh}"));
        let mut m = mpirun(mesh.size());
        if let Some(c) = chunk {
            // every buffer above 4 KiB goes in pieces
            m = m.env("REDCO_MPI_CHUNK_BYTES", c);
        }
        let out = dir.join("digests");
        let r = m
            .run(
                &exe(),
                &["--mesh", &mesh.to_string(), "--big", &BIG.to_string(), "--out", out.to_str().unwrap()],
                &dir,
                Duration::from_secs(120),
            )
            .unwrap();
        assert_eq!(r.code, Some(0), "mesh {mesh}, chunk {chunk:?}:\n{}\n{}", r.stdout, r.stderr);
        assert!(r.stdout.contains("collectives agree with the f64 reference"), "{}", r.stdout);
        let (procs, threads) = (process_digests(&out, mesh), thread_digests(mesh));
        assert_eq!(procs.len(), threads.len());
        for (rank, (p, t)) in procs.iter().zip(&threads).enumerate() {
            assert!(p.lines().count() >= 70, "rank {rank}: {} checks", p.lines().count());
            assert_eq!(p, t, "rank {rank} at {mesh} (chunk {chunk:?}): processes and threads differ");
        }
    }
}

#[test]
fn a_rank_that_never_enters_a_collective_is_named_and_the_job_ends() {
    let dir = scratch("stall");
    let job = mpirun(4).spawn(&exe(), &["--mesh", "2x2", "--stall-rank", "3", "--timeout", "3"], &dir).unwrap();
    let pids: Vec<u32> = (0..40)
        .find_map(|_| {
            std::thread::sleep(Duration::from_millis(100));
            let p = job.rank_pids();
            (p.len() == 4).then_some(p)
        })
        .unwrap_or_default();
    let r = job.wait(Duration::from_secs(60)).unwrap();
    for p in pids {
        let _ = redco_mpi::launch::Job::signal(p, "KILL");
    }
    assert!(!r.timed_out, "the job hung:\n{}", r.stderr);
    assert_ne!(r.code, Some(0));
    assert!(r.elapsed < Duration::from_secs(30), "ended after {:?}", r.elapsed);
    assert!(
        r.stderr.contains("watchdog") && r.stderr.contains("rank 3 never entered this barrier"),
        "the others name the stalled rank:\n{}",
        r.stderr
    );
}

#[test]
fn a_mesh_that_does_not_fit_the_world_is_an_error() {
    let dir = scratch("misfit");
    let r = mpirun(2).run(&exe(), &["--mesh", "2x2"], &dir, Duration::from_secs(60)).unwrap();
    assert_ne!(r.code, Some(0));
    assert!(r.stderr.contains("mesh 2x2 has 4 ranks but the job has 2 processes"), "{}", r.stderr);
}
