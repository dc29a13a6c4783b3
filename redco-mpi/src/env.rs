//! MPI start-up: the process's world, the per-group communicators, the bootstrap store,
//! and the job's end (`MPI_Finalize` when the last handle drops, `MPI_Abort` on failure).

use crate::collective::MpiCollective;
use crate::watchdog::{Heartbeat, Progress};
use crate::wire::Group;
use mpi::environment::Universe;
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::*;
use mpi::Threading;
use redco_core::runtime::store::{Store, TcpStore};
use redco_core::runtime::{Collective, CommFactory, GroupAxis, Launcher, Mesh, ProcessGroup, RunComms, World};
use redco_core::{Backend, Error, Result};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

/// How long a process waits for rank 0's bootstrap store at start-up.
const BOOTSTRAP_TIMEOUT: Duration = Duration::from_secs(60);

/// The MPI world communicator, shareable between threads (every call into MPI is
/// serialised by [`crate::wire::MPI_LOCK`]; MPI is started with `MPI_THREAD_SERIALIZED`).
pub(crate) struct WorldComm(pub(crate) SimpleCommunicator);
// SAFETY: the communicator is a handle; MPI allows it to be used from any thread under
// MPI_THREAD_SERIALIZED as long as calls do not overlap, which MPI_LOCK guarantees.
unsafe impl Send for WorldComm {}
// SAFETY: as above.
unsafe impl Sync for WorldComm {}

/// A started MPI: this process's world and the job's bootstrap store. MPI is finalised
/// when the last handle drops; [`Mpi::abort`] ends the whole job.
pub struct Mpi {
    world: World,
    comm: WorldComm,
    store: Arc<TcpStore>,
    progress: Arc<Progress>,
    _heartbeat: Heartbeat,
    // dropped last: MPI_Finalize
    _universe: Universe,
}

static CURRENT: Mutex<Option<Weak<Mpi>>> = Mutex::new(None);

impl Mpi {
    /// Starts MPI (once per process: a second call returns the same handle while it
    /// lives), or an error when it cannot (not built against a working MPI, initialised
    /// elsewhere, or lacking `MPI_THREAD_SERIALIZED`).
    pub fn init() -> Result<Arc<Mpi>> {
        let mut cur = CURRENT.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = cur.as_ref().and_then(Weak::upgrade) {
            return Ok(m);
        }
        if mpi::environment::is_finalized() {
            return Err(Error::invalid("mpi", "MPI was already finalised in this process and cannot start again"));
        }
        let (universe, provided) = mpi::initialize_with_threading(Threading::Serialized)
            .ok_or_else(|| Error::invalid("mpi", "MPI was already initialised outside redco-mpi"))?;
        if provided < Threading::Serialized {
            return Err(Error::invalid(
                "mpi",
                format!("this MPI provides only {provided:?} threading; redco-mpi needs MPI_THREAD_SERIALIZED"),
            ));
        }
        let comm = universe.world();
        let (rank, size) = (comm.rank() as usize, comm.size() as usize);
        let shared = comm.split_shared(rank as i32);
        let (local_rank, local_size) = (shared.rank() as usize, shared.size() as usize);
        let host = mpi::environment::processor_name().unwrap_or_else(|_| redco_core::runtime::world::hostname());
        let master = match (std::env::var("MASTER_ADDR"), std::env::var("MASTER_PORT")) {
            (Ok(a), Ok(p)) => Some(format!("{a}:{p}")),
            _ => None,
        };
        let world = World { rank, size, local_rank, local_size, host, launcher: Launcher::Mpi, master };
        let store = Arc::new(bootstrap_store(&comm, &world)?);
        let progress = Arc::new(Progress::new(rank));
        let heartbeat = Heartbeat::start(store.clone(), progress.clone());
        let m =
            Arc::new(Mpi { world, comm: WorldComm(comm), store, progress, _heartbeat: heartbeat, _universe: universe });
        *cur = Some(Arc::downgrade(&m));
        Ok(m)
    }

    /// This process's place in the job.
    pub fn world(&self) -> &World {
        &self.world
    }

    /// Ends the whole job now (`MPI_Abort` with `code`): every process exits, mpirun
    /// with `code`. For a failure the other ranks cannot learn of through a collective.
    pub fn abort(&self, code: i32) -> ! {
        // no other thread of this process is inside MPI while this holds the lock
        let _l = crate::wire::lock();
        self.comm.0.abort(code)
    }

    pub(crate) fn progress(&self) -> &Arc<Progress> {
        &self.progress
    }

    pub(crate) fn tcp_store(&self) -> &Arc<TcpStore> {
        &self.store
    }

    fn check_mesh(&self, mesh: Mesh) -> Result<()> {
        if mesh.size() != self.world.size {
            return Err(Error::invalid(
                "mpi",
                format!(
                    "mesh {mesh} has {} ranks but the job has {} processes: start as many processes as the mesh has ranks (mpirun -np {})",
                    mesh.size(),
                    self.world.size,
                    mesh.size()
                ),
            ));
        }
        Ok(())
    }
}

/// Rank 0 serves the store (at `MASTER_ADDR:MASTER_PORT` when given, else on a free port
/// of its host) and broadcasts its address; every process connects.
fn bootstrap_store(comm: &SimpleCommunicator, world: &World) -> Result<TcpStore> {
    let mut addr = [0u8; 256];
    let mut server = None;
    if world.rank == 0 {
        let port = world.master.as_ref().and_then(|m| m.rsplit_once(':')).and_then(|(_, p)| p.parse().ok());
        let bind: SocketAddr = ([0, 0, 0, 0], port.unwrap_or(0)).into();
        let s = TcpStore::server(bind)?;
        let port = s.local_addr().port();
        // one host: loopback; several: the name of rank 0's host (or MASTER_ADDR)
        let host = match &world.master {
            Some(m) => m.rsplit_once(':').map_or(m.as_str(), |(h, _)| h).to_string(),
            None if world.local_size == world.size => "127.0.0.1".into(),
            None => world.host.clone(),
        };
        let text = format!("{host}:{port}");
        addr[..text.len()].copy_from_slice(text.as_bytes());
        server = Some(s);
    }
    comm.process_at_rank(0).broadcast_into(&mut addr[..]);
    let end = addr.iter().position(|&b| b == 0).unwrap_or(addr.len());
    let text = String::from_utf8_lossy(&addr[..end]).to_string();
    let client = TcpStore::connect_host(&text, BOOTSTRAP_TIMEOUT)
        .map_err(|e| Error::invalid("mpi", format!("cannot reach the bootstrap store of rank 0 at {text}: {e}")))?;
    // the server thread lives as long as rank 0's client handle
    Ok(match server {
        Some(s) => s.with_client(client),
        None => client,
    })
}

/// One run of a mesh over MPI: the world split once per mesh-axis group.
struct MpiRun {
    mpi: Arc<Mpi>,
    groups: Arc<[Group; 3]>,
    timeout: Duration,
    failed: Mutex<Option<String>>,
}

impl<B: Backend> RunComms<B> for MpiRun {
    fn collective(&self, rank: usize, backend: &B) -> Result<Arc<dyn Collective<B>>> {
        if rank != self.mpi.world.rank {
            return Err(Error::invalid("mpi", format!("rank {rank} does not run in process {}", self.mpi.world.rank)));
        }
        Ok(Arc::new(MpiCollective::new(self.mpi.clone(), self.groups.clone(), backend.clone(), self.timeout)))
    }
    fn fail(&self, why: String) {
        let mut f = self.failed.lock().unwrap_or_else(|p| p.into_inner());
        f.get_or_insert(why);
    }
    fn failure(&self) -> Option<String> {
        self.failed.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl<B: Backend> CommFactory<B> for Mpi {
    fn name(&self) -> &'static str {
        "mpi"
    }
    fn world(&self) -> World {
        self.world.clone()
    }
    fn local_ranks(&self, mesh: Mesh) -> Result<Vec<usize>> {
        self.check_mesh(mesh)?;
        Ok(vec![self.world.rank])
    }
    fn open(&self, mesh: Mesh, timeout: Duration) -> Result<Arc<dyn RunComms<B>>> {
        self.check_mesh(mesh)?;
        let me = CURRENT
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .and_then(Weak::upgrade)
            .ok_or_else(|| Error::invalid("mpi", "the MPI handle is gone"))?;
        let rank = self.world.rank;
        let split = |g: ProcessGroup| -> Result<Group> {
            let _l = crate::wire::lock();
            let c = self
                .comm
                .0
                .split_by_color_with_key(mpi::topology::Color::with_value(g.color as i32), g.key as i32)
                .ok_or_else(|| Error::invalid("mpi", format!("MPI_Comm_split gave no communicator for {g}")))?;
            if c.size() as usize != g.size() || c.rank() as usize != g.key {
                return Err(Error::invalid(
                    "mpi",
                    format!("the split communicator of {g} has {} members, this one at {}", c.size(), c.rank()),
                ));
            }
            Ok(Group::new(c, g))
        };
        // every process splits in the same order: dp, mp, mesh
        let [dp, mp, all] = ProcessGroup::all_of(mesh, rank);
        let groups = [split(dp)?, split(mp)?, split(all)?];
        debug_assert!(matches!(groups[2].info.axis, GroupAxis::Mesh));
        self.progress.reset();
        Ok(Arc::new(MpiRun { mpi: me, groups: Arc::new(groups), timeout, failed: Mutex::new(None) }))
    }
    fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }
}
