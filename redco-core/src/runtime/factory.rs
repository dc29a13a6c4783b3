//! The seam between the pipeline and the transports: a `CommFactory` says which ranks of a
//! mesh this process runs and makes each one's [`Collective`].
//!
//! Threads (every rank in this process, meeting at a [`Hub`]) are the implementation in
//! core; MPI (`redco-mpi`, one rank per process), NCCL (`redco-cuda`) and PJRT
//! (`redco-tpu`) are others, each in its own crate. A `pipeline::Deployer`
//! holds one, so the same trainer runs whatever the transport.

use super::store::{MemStore, Store};
use super::threads::{Hub, ThreadCollective};
use super::world::World;
use crate::backend::collective::Collective;
use crate::backend::mesh::Mesh;
use crate::{Backend, Result};
use std::sync::Arc;
use std::time::Duration;

/// The communicators of one run of a mesh, as this process sees them.
pub trait RunComms<B: Backend>: Send + Sync {
    /// The collective of local rank `rank` (a mesh rank this process runs), moving data
    /// with `backend`. Called once per local rank, on that rank's thread.
    fn collective(&self, rank: usize, backend: &B) -> Result<Arc<dyn Collective<B>>>;
    /// A local rank failed with `why`: the other local ranks' pending and future
    /// collectives fail at once (ranks in other processes learn it from the transport: the
    /// process exits, or their watchdog fires).
    fn fail(&self, why: String);
    /// The first failure reported by a local rank, if any.
    fn failure(&self) -> Option<String>;
}

/// Makes the communicators of a run: threads, MPI, NCCL, PJRT.
pub trait CommFactory<B: Backend>: Send + Sync {
    /// The transport's name (`threads`, `mpi`, ...), for reports and errors.
    fn name(&self) -> &'static str;
    /// This process's place in the job.
    fn world(&self) -> World;
    /// The ranks of `mesh` that run in this process, in rank order (every rank for
    /// threads; this process's one for a process-per-rank transport). A mesh that does not
    /// fit the world is an error that says both sizes.
    fn local_ranks(&self, mesh: Mesh) -> Result<Vec<usize>>;
    /// Opens a run of `mesh` whose collectives give up after `timeout`: the per-axis
    /// communicators are created here, once.
    fn open(&self, mesh: Mesh, timeout: Duration) -> Result<Arc<dyn RunComms<B>>>;
    /// The job's bootstrap key-value store (small bytes only: ids, flags, the workdir
    /// check), shared by every process.
    fn store(&self) -> Arc<dyn Store>;
}

/// Every rank of the mesh is a thread of this process ([`ThreadCollective`]).
#[derive(Clone)]
pub struct Threads {
    store: Arc<MemStore>,
}

impl Default for Threads {
    fn default() -> Self {
        Threads { store: Arc::new(MemStore::new()) }
    }
}

impl Threads {
    /// The in-process transport.
    pub fn new() -> Self {
        Threads::default()
    }
}

impl std::fmt::Debug for Threads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Threads")
    }
}

struct ThreadRun {
    hub: Arc<Hub>,
}

impl<B: Backend> RunComms<B> for ThreadRun {
    fn collective(&self, rank: usize, backend: &B) -> Result<Arc<dyn Collective<B>>> {
        Ok(Arc::new(ThreadCollective::new(self.hub.clone(), rank, backend.clone())))
    }
    fn fail(&self, why: String) {
        self.hub.fail(why);
    }
    fn failure(&self) -> Option<String> {
        self.hub.failure()
    }
}

impl<B: Backend> CommFactory<B> for Threads {
    fn name(&self) -> &'static str {
        "threads"
    }
    fn world(&self) -> World {
        World::single()
    }
    fn local_ranks(&self, mesh: Mesh) -> Result<Vec<usize>> {
        Ok((0..mesh.size()).collect())
    }
    fn open(&self, mesh: Mesh, timeout: Duration) -> Result<Arc<dyn RunComms<B>>> {
        Ok(Arc::new(ThreadRun { hub: Hub::new(mesh, timeout) }))
    }
    fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }
}
