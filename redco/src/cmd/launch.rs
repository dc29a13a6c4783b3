//! How this `redco` process's ranks run: every rank a thread of this process (no launcher),
//! or one rank per process under an MPI launcher (`mpirun`, `srun --mpi=pmix`; the `mpi`
//! feature). Chosen once, at start, from the environment.

use crate::cmd::error::CliResult;
use redco_core::runtime::world::detect_launcher_env;
use redco_core::runtime::{CommFactory, Launcher, Mesh, Threads, World};
use redco_core::Backend;
use std::sync::{Arc, Mutex};

/// The transport of this process.
#[derive(Clone)]
pub enum Transport {
    /// Thread ranks in this process.
    Threads,
    /// One rank per MPI process.
    #[cfg(feature = "mpi")]
    Mpi(Arc<redco_mpi::Mpi>),
}

static CURRENT: Mutex<Option<Transport>> = Mutex::new(None);

/// Reads the launcher from the environment and starts its transport (MPI under an MPI
/// launcher when compiled in; a clear error when the launch needs a transport this build
/// lacks).
pub fn init() -> CliResult<()> {
    let t = match detect_launcher_env() {
        Launcher::None => Transport::Threads,
        Launcher::Mpi => mpi_transport()?,
        Launcher::Torchrun => {
            let size = std::env::var("WORLD_SIZE").ok().and_then(|s| s.parse::<usize>().ok()).unwrap_or(1);
            if size > 1 {
                return Err(format!(
                    "started with torchrun-style variables (WORLD_SIZE={size}): those launch process ranks for the \
                     NCCL and PJRT transports, which this redco does not have; launch with mpirun (redco built \
                     with --features mpi), or run without a launcher for thread ranks"
                )
                .into());
            }
            Transport::Threads
        }
    };
    *CURRENT.lock().unwrap_or_else(|p| p.into_inner()) = Some(t);
    Ok(())
}

#[cfg(feature = "mpi")]
fn mpi_transport() -> CliResult<Transport> {
    Ok(redco_mpi::Mpi::init().map(Transport::Mpi)?)
}

#[cfg(not(feature = "mpi"))]
fn mpi_transport() -> CliResult<Transport> {
    match redco_core::runtime::world::mpi_env_size(|k| std::env::var(k).ok()) {
        Some(n) if n > 1 => Err(format!(
            "started by an MPI launcher with {n} processes, but this redco is built without MPI: rebuild with \
             `cargo build --release -p redco --features mpi` (needs Open MPI or MPICH and libclang), or run \
             without mpirun for thread ranks"
        )
        .into()),
        _ => Ok(Transport::Threads),
    }
}

/// The transport chosen by [`init`] (threads before it).
pub fn current() -> Transport {
    CURRENT.lock().unwrap_or_else(|p| p.into_inner()).clone().unwrap_or(Transport::Threads)
}

/// This process's place in the job.
pub fn world() -> World {
    match current() {
        Transport::Threads => World::single(),
        #[cfg(feature = "mpi")]
        Transport::Mpi(m) => m.world().clone(),
    }
}

/// Whether this process prints and writes the results (the one running mesh rank 0).
pub fn is_leader() -> bool {
    world().rank == 0
}

/// Whether ranks are processes (a launcher started more than one).
pub fn is_multi_process() -> bool {
    world().size > 1
}

/// The communicator factory of this process's ranks.
pub fn factory<B: Backend>() -> Arc<dyn CommFactory<B>> {
    match current() {
        Transport::Threads => Arc::new(Threads::new()),
        #[cfg(feature = "mpi")]
        Transport::Mpi(m) if m.world().size > 1 => m,
        #[cfg(feature = "mpi")]
        Transport::Mpi(_) => Arc::new(Threads::new()),
    }
}

/// How many of `mesh`'s ranks run on this host (they share its cores).
pub fn ranks_on_host(mesh: Mesh) -> usize {
    let w = world();
    if w.size > 1 {
        w.local_size
    } else {
        mesh.size()
    }
}

/// Ends the job: MPI is finalised when the command succeeded; after an error in a job of
/// several processes (already printed) the whole job is aborted with `code`, so no rank
/// waits for one that has gone.
pub fn finish(ok: bool, code: i32) {
    let t = CURRENT.lock().unwrap_or_else(|p| p.into_inner()).take();
    match t {
        #[cfg(feature = "mpi")]
        Some(Transport::Mpi(m)) if !ok && m.world().size > 1 => m.abort(code),
        _ => {
            let _ = (ok, code);
        }
    }
}
