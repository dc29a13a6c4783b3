//! The MPI calls: nonblocking collectives on bytes, polled to completion against a
//! deadline (so a watchdog can act instead of hanging in MPI), in chunks below MPI's
//! `int` counts.

use mpi::topology::SimpleCommunicator;
use mpi::traits::*;
use redco_core::runtime::ProcessGroup;
use std::mem::ManuallyDrop;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Serialises every call into MPI in this process (MPI runs with `MPI_THREAD_SERIALIZED`:
/// a rank's collectives come from its backend's compute threads and from its worker for
/// started all-reduces). Held for one MPI call at a time, never across a wait, so two
/// collectives in flight on different groups both make progress.
static MPI_LOCK: Mutex<()> = Mutex::new(());

/// Holds [`MPI_LOCK`].
pub(crate) fn lock() -> MutexGuard<'static, ()> {
    MPI_LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// Largest piece of one rank's buffer per MPI call (`REDCO_MPI_CHUNK_BYTES`, default 64 MiB;
/// MPI counts are C `int`s).
pub(crate) fn chunk_bytes() -> usize {
    static C: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *C.get_or_init(|| {
        std::env::var("REDCO_MPI_CHUNK_BYTES")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|&n: &usize| n > 0)
            .unwrap_or(64 << 20)
            .min(i32::MAX as usize / 2)
    })
}

/// One mesh-axis group's communicator.
pub(crate) struct Group {
    /// Freed under [`MPI_LOCK`] when the group drops.
    pub(crate) comm: ManuallyDrop<SimpleCommunicator>,
    pub(crate) info: ProcessGroup,
}

impl Drop for Group {
    fn drop(&mut self) {
        let _l = lock();
        // SAFETY: dropped once, here; the field is never used again
        unsafe { ManuallyDrop::drop(&mut self.comm) }
    }
}

// SAFETY: an MPI communicator is a handle usable from any thread under
// MPI_THREAD_SERIALIZED as long as calls do not overlap; every call holds MPI_LOCK.
unsafe impl Send for Group {}
// SAFETY: as above.
unsafe impl Sync for Group {}

/// A call that did not complete by its deadline.
pub(crate) struct TimedOut;

/// Polls `req` until it completes (spinning briefly, then sleeping 20 us between tests so
/// a waiting rank leaves the cores to the others) or `deadline` passes.
fn wait<'a, D: ?Sized, S: mpi::request::Scope<'a>>(
    mut req: mpi::request::Request<'a, D, S>,
    deadline: Instant,
) -> Result<(), (TimedOut, mpi::request::Request<'a, D, S>)> {
    let mut spins = 0u32;
    loop {
        let tested = {
            let _l = lock();
            req.test()
        };
        match tested {
            Ok(_) => return Ok(()),
            Err(r) => req = r,
        }
        spins += 1;
        if spins < 2000 {
            std::hint::spin_loop();
        } else {
            if Instant::now() >= deadline {
                return Err((TimedOut, req));
            }
            std::thread::sleep(Duration::from_micros(20));
        }
    }
}

/// What a timed-out wait does: it never returns (the watchdog aborts the job; an MPI
/// request cannot be taken back).
pub(crate) type OnTimeout<'f> = &'f dyn Fn() -> std::convert::Infallible;

// the timeout handler aborts the job: nothing after it runs
#[allow(unreachable_code)]
fn finish<'a, D: ?Sized, S: mpi::request::Scope<'a>>(
    req: mpi::request::Request<'a, D, S>,
    deadline: Instant,
    on_timeout: OnTimeout<'_>,
) {
    if let Err((TimedOut, r)) = wait(req, deadline) {
        // keep the request alive (its scope would panic on an unfinished request)
        std::mem::forget(r);
        on_timeout();
    }
}

impl Group {
    /// Wraps the communicator of `info`.
    pub(crate) fn new(comm: SimpleCommunicator, info: ProcessGroup) -> Self {
        Group { comm: ManuallyDrop::new(comm), info }
    }

    /// Every member's `send` (all of one length), concatenated in key order.
    pub(crate) fn all_gather(&self, send: &[u8], deadline: Instant, on_timeout: OnTimeout<'_>) -> Vec<u8> {
        let n = self.info.size();
        let len = send.len();
        let mut out = vec![0u8; len * n];
        let piece = chunk_bytes();
        if len <= piece {
            mpi::request::scope(|sc| {
                let req = {
                    let _l = lock();
                    self.comm.immediate_all_gather_into(sc, send, &mut out[..])
                };
                finish(req, deadline, on_timeout);
            });
            return out;
        }
        let mut buf = vec![0u8; piece * n];
        let mut a = 0;
        while a < len {
            let b = (a + piece).min(len);
            let w = b - a;
            let recv = &mut buf[..w * n];
            mpi::request::scope(|sc| {
                let req = {
                    let _l = lock();
                    self.comm.immediate_all_gather_into(sc, &send[a..b], &mut *recv)
                };
                finish(req, deadline, on_timeout);
            });
            for r in 0..n {
                out[r * len + a..r * len + b].copy_from_slice(&recv[r * w..(r + 1) * w]);
            }
            a = b;
        }
        out
    }

    /// `send` holds one block of `block` bytes per member, in key order; returns the
    /// blocks every member sent to this one, in key order.
    pub(crate) fn all_to_all(
        &self,
        send: &[u8],
        block: usize,
        deadline: Instant,
        on_timeout: OnTimeout<'_>,
    ) -> Vec<u8> {
        let n = self.info.size();
        debug_assert_eq!(send.len(), block * n);
        let mut out = vec![0u8; block * n];
        let piece = chunk_bytes();
        if block <= piece {
            mpi::request::scope(|sc| {
                let req = {
                    let _l = lock();
                    self.comm.immediate_all_to_all_into(sc, send, &mut out[..])
                };
                finish(req, deadline, on_timeout);
            });
            return out;
        }
        let (mut sbuf, mut rbuf) = (vec![0u8; piece * n], vec![0u8; piece * n]);
        let mut a = 0;
        while a < block {
            let b = (a + piece).min(block);
            let w = b - a;
            for r in 0..n {
                sbuf[r * w..(r + 1) * w].copy_from_slice(&send[r * block + a..r * block + b]);
            }
            let (s, rv) = (&sbuf[..w * n], &mut rbuf[..w * n]);
            mpi::request::scope(|sc| {
                let req = {
                    let _l = lock();
                    self.comm.immediate_all_to_all_into(sc, s, &mut *rv)
                };
                finish(req, deadline, on_timeout);
            });
            for r in 0..n {
                out[r * block + a..r * block + b].copy_from_slice(&rv[r * w..(r + 1) * w]);
            }
            a = b;
        }
        out
    }

    /// The buffer of member `root` (every member passes a buffer of the same length).
    pub(crate) fn broadcast(&self, buf: &mut [u8], root: usize, deadline: Instant, on_timeout: OnTimeout<'_>) {
        let piece = chunk_bytes();
        let root = self.comm.process_at_rank(root as i32);
        for part in buf.chunks_mut(piece) {
            mpi::request::scope(|sc| {
                let req = {
                    let _l = lock();
                    root.immediate_broadcast_into(sc, part)
                };
                finish(req, deadline, on_timeout);
            });
        }
    }

    /// Waits until every member arrives.
    pub(crate) fn barrier(&self, deadline: Instant, on_timeout: OnTimeout<'_>) {
        let req = {
            let _l = lock();
            self.comm.immediate_barrier()
        };
        finish(req, deadline, on_timeout);
    }
}
