//! [`NcclFactory`]: the `CommFactory` of CUDA ranks. It keeps the placement of another
//! factory (threads of this process, or one process per rank under MPI / torchrun) and its
//! bootstrap store, and gives every rank an [`Nccl`] collective: rank 0 of each run puts a
//! fresh NCCL id in the store, every rank joins with `ncclCommInitRank` on its own thread.

use crate::context::Cuda;
use crate::nccl::Nccl;
use redco_core::runtime::store::Store;
use redco_core::runtime::world::World;
use redco_core::runtime::{Collective, CommFactory, Mesh, RunComms};
use redco_core::Result;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// NCCL collectives over another factory's placement; see the module docs.
pub struct NcclFactory {
    inner: Arc<dyn CommFactory<Cuda>>,
    runs: AtomicU64,
}

impl NcclFactory {
    /// NCCL over `inner`'s ranks and store (`Threads` for one process).
    pub fn new(inner: Arc<dyn CommFactory<Cuda>>) -> Self {
        NcclFactory { inner, runs: AtomicU64::new(0) }
    }
}

struct NcclRun {
    mesh: Mesh,
    timeout: Duration,
    store: Arc<dyn Store>,
    key: String,
    comms: Mutex<Vec<Weak<Nccl>>>,
    failure: Mutex<Option<String>>,
}

impl CommFactory<Cuda> for NcclFactory {
    fn name(&self) -> &'static str {
        "nccl"
    }
    fn world(&self) -> World {
        self.inner.world()
    }
    fn local_ranks(&self, mesh: Mesh) -> Result<Vec<usize>> {
        self.inner.local_ranks(mesh)
    }
    fn open(&self, mesh: Mesh, timeout: Duration) -> Result<Arc<dyn RunComms<Cuda>>> {
        let n = self.runs.fetch_add(1, Ordering::Relaxed);
        Ok(Arc::new(NcclRun {
            mesh,
            timeout,
            store: self.inner.store(),
            key: format!("redco/nccl/run-{n}/mesh-id"),
            comms: Mutex::new(Vec::new()),
            failure: Mutex::new(None),
        }))
    }
    fn store(&self) -> Arc<dyn Store> {
        self.inner.store()
    }
}

impl RunComms<Cuda> for NcclRun {
    fn collective(&self, rank: usize, backend: &Cuda) -> Result<Arc<dyn Collective<Cuda>>> {
        let c =
            Arc::new(Nccl::from_store_key(backend.clone(), self.mesh, rank, &*self.store, &self.key, self.timeout)?);
        self.comms.lock().unwrap_or_else(|e| e.into_inner()).push(Arc::downgrade(&c));
        Ok(c)
    }
    fn fail(&self, why: String) {
        for c in self.comms.lock().unwrap_or_else(|e| e.into_inner()).iter().filter_map(Weak::upgrade) {
            c.abort(&why);
        }
        self.failure.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(why);
    }
    fn failure(&self) -> Option<String> {
        self.failure.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}
