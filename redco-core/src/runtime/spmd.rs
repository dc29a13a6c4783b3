//! The SPMD runner: one thread per rank, the same closure on each, and the rank's
//! communicator installed as the thread's current one.

use super::factory::{CommFactory, Threads};
use crate::backend::comm::{current_comm, Comm, CommGuard};
use crate::backend::mesh::Mesh;
use crate::{Backend, Error, Result};
use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

/// What a rank's closure receives.
pub struct Rank<B: Backend> {
    /// This rank's index in the mesh.
    pub rank: usize,
    /// The mesh.
    pub mesh: Mesh,
    /// This rank's device.
    pub backend: B,
    /// This rank's communicator (also current on the thread).
    pub comm: Comm<B>,
}

/// Options of an SPMD run.
#[derive(Debug, Clone)]
pub struct SpmdOptions {
    /// How long a collective waits for the other ranks before giving up.
    pub timeout: Duration,
    /// Compute threads per rank (default: the machine's cores divided by the ranks, at
    /// least 1, so ranks share the cores without oversubscription).
    pub threads_per_rank: Option<usize>,
}

impl Default for SpmdOptions {
    fn default() -> Self {
        SpmdOptions { timeout: Duration::from_secs(120), threads_per_rank: None }
    }
}

fn panic_message(p: &(dyn Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

/// Runs `f` once per rank of `mesh`, each on its own thread with its own backend (from
/// `make_backend(rank, threads)`) and communicator; returns the ranks' results in rank
/// order. If any rank errors or panics, the others' pending collectives fail at once and
/// the error of the rank that failed first is returned. Every rank is a thread of this
/// process ([`Threads`]); see [`spmd_with`] for other transports.
pub fn spmd<B, R, M, F>(mesh: Mesh, opts: &SpmdOptions, make_backend: M, f: F) -> Result<Vec<R>>
where
    B: Backend,
    R: Send,
    M: Fn(usize, usize) -> Result<B> + Sync,
    F: Fn(&Rank<B>) -> Result<R> + Sync,
{
    spmd_with(&Threads::new(), mesh, opts, make_backend, f)
}

/// Compute threads for each of `local` ranks of this process when `local_size` processes
/// share this host: the host's cores divided among all of them (at least 1).
pub fn threads_per_rank(local: usize, local_size: usize) -> usize {
    let cores = std::thread::available_parallelism().map(|c| c.get()).unwrap_or(1);
    (cores / (local.max(1) * local_size.max(1))).max(1)
}

/// [`spmd`] over the ranks of `mesh` that `factory` places in this process (all of them
/// for threads, one for a process per rank), with `factory`'s collectives; returns the
/// local ranks' results in rank order.
pub fn spmd_with<B, R, M, F>(
    factory: &dyn CommFactory<B>,
    mesh: Mesh,
    opts: &SpmdOptions,
    make_backend: M,
    f: F,
) -> Result<Vec<R>>
where
    B: Backend,
    R: Send,
    M: Fn(usize, usize) -> Result<B> + Sync,
    F: Fn(&Rank<B>) -> Result<R> + Sync,
{
    let local = factory.local_ranks(mesh)?;
    let threads = opts.threads_per_rank.unwrap_or_else(|| threads_per_rank(local.len(), factory.world().local_size));
    let run = factory.open(mesh, opts.timeout)?;
    let results: Vec<Result<R>> = std::thread::scope(|s| {
        let handles: Vec<_> = local
            .iter()
            .map(|&rank| {
                let (run, make_backend, f) = (run.clone(), &make_backend, &f);
                let outer = run.clone();
                std::thread::Builder::new()
                    .name(format!("redco-rank-{rank}"))
                    .spawn_scoped(s, move || {
                        let out = catch_unwind(AssertUnwindSafe(|| -> Result<R> {
                            let backend = make_backend(rank, threads)?;
                            let comm = Comm::new(run.collective(rank, &backend)?);
                            let _g = CommGuard::install(comm.clone());
                            f(&Rank { rank, mesh, backend, comm })
                        }));
                        let out = match out {
                            Ok(r) => r,
                            Err(p) => Err(Error::RankFailed { rank, msg: format!("panicked: {}", panic_message(&*p)) }),
                        };
                        if let Err(e) = &out {
                            run.fail(format!("rank {rank} failed: {e}"));
                        }
                        out
                    })
                    .map_err(|e| {
                        // the ranks already started fail at their first collective
                        outer.fail(format!("rank {rank} failed: cannot start its thread: {e}"));
                        Error::RankFailed { rank, msg: format!("cannot start its thread: {e}") }
                    })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.and_then(|h| h.join().unwrap_or_else(|_| Err(Error::invalid("spmd", "rank thread died")))))
            .collect()
    });
    if let Some(first) = run.failure() {
        // Prefer the error of the rank that failed first over the others' "aborted".
        let rank = first.strip_prefix("rank ").and_then(|s| s.split(' ').next()).and_then(|r| r.parse().ok());
        let at = rank.and_then(|r: usize| local.iter().position(|&l| l == r));
        if let Some(Err(e)) = at.and_then(|i| results.into_iter().nth(i)) {
            return Err(e);
        }
        return Err(Error::RankFailed { rank: rank.unwrap_or(0), msg: first });
    }
    results.into_iter().collect()
}

/// Runs `f` on `b`'s own compute threads ([`Backend::enter`]) with this thread's
/// communicator, gradient mode and recompute mode, and returns its result. A step of many small ops (a
/// decode step, a small model's forward) then pays one hand-off instead of one per op.
pub fn on_backend<B: Backend, R: Send>(b: &B, f: impl FnOnce() -> R + Send) -> R {
    let comm = current_comm::<B>();
    let grad = crate::is_grad_enabled();
    let recompute = crate::autograd::is_recompute_enabled();
    let mut f = Some(f);
    let mut out = None;
    b.enter(&mut || {
        let _c = comm.clone().map(CommGuard::install);
        let _g = crate::GradModeGuard::set(grad);
        let _r = crate::autograd::RecomputeGuard::set(recompute);
        if let Some(f) = f.take() {
            out = Some(f());
        }
    });
    match out {
        Some(r) => r,
        // a backend whose `enter` did not run the closure: run it here
        None => match f.take() {
            Some(f) => f(),
            None => unreachable!("the closure ran but gave no result"),
        },
    }
}
