//! redco-rs over MPI: one rank per process, on one host or many.
//!
//! [`Mpi::init`] starts MPI (Open MPI, MPICH, or Slurm's PMIx under `srun --mpi=pmix`),
//! reads this process's [`World`](redco_core::runtime::World) from it, and brings up the
//! job's bootstrap store (rank 0 serves a [`TcpStore`](redco_core::runtime::store::TcpStore);
//! its address travels by MPI broadcast). An [`Mpi`] is a
//! [`CommFactory`](redco_core::runtime::CommFactory): a `Deployer` holding it runs the
//! process's own rank of the mesh, with an [`MpiCollective`] that moves any backend's
//! buffers through host memory:
//!
//! ```no_run
//! # fn main() -> redco_core::Result<()> {
//! let mpi = redco_mpi::Mpi::init()?;
//! let mesh = redco_core::runtime::Mesh::new(2, 2)?;
//! let dep = redco_pipeline::Deployer::new(mesh, 42, "workdir".as_ref())?.with_comm(mpi.clone())?;
//! # Ok(()) }
//! ```
//!
//! Communicators are split once per mesh-axis group (colour = the group along the axis,
//! key = the index along it). Every call checks that the group's members agree on the
//! call and the buffer size, sums in axis order (bit-identical to the thread transport),
//! sends large buffers in chunks, and runs under a watchdog: a member that never arrives
//! is named (from the heartbeats every process posts to the bootstrap store) and the job
//! is aborted with `MPI_Abort` instead of hanging.

pub mod check;
mod collective;
mod env;
pub mod launch;
mod watchdog;
mod wire;

pub use collective::MpiCollective;
pub use env::Mpi;
