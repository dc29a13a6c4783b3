//! [`Nccl`]: the `Collective` of CUDA ranks over NCCL.
//!
//! One communicator spans the mesh; the groups along `dp` and `mp` are split from it with
//! `ncclCommSplit` (colour = the group along the axis, key = the index along it, as
//! [`ProcessGroup`] defines them). Ranks that are processes exchange the mesh
//! communicator's unique id through the run's bootstrap [`Store`]; ranks that are threads
//! of one process get their communicators from `ncclCommInitAll` ([`Nccl::for_threads`]).
//! Collectives are queued on the backend's stream, like its kernels. A watchdog thread
//! polls `ncclCommGetAsyncError` and the completion of each queued collective: one still
//! running after the timeout, or an asynchronous error, aborts every communicator
//! (`ncclCommAbort`) and every later call fails naming the rank, the collective and the
//! axis.

use crate::context::Cuda;
use crate::device::err;
use crate::storage::CudaStorage;
use cudarc::driver::CudaEvent;
use cudarc::nccl::sys;
use redco_core::runtime::store::Store;
use redco_core::runtime::{Collective, Mesh, ProcessGroup, ReduceKind};
use redco_core::{DType, Error, MeshAxis, Result};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Whether NCCL (`libnccl.so`) can be loaded.
pub fn nccl_present() -> bool {
    // SAFETY: only tries to load the library
    unsafe { sys::is_culib_present() }
}

fn check(r: sys::ncclResult_t, what: &str) -> Result<()> {
    if r == sys::ncclResult_t::ncclSuccess {
        return Ok(());
    }
    // SAFETY: ncclGetErrorString returns a static string for any result code
    let msg = unsafe { std::ffi::CStr::from_ptr(sys::ncclGetErrorString(r)) }.to_string_lossy().into_owned();
    Err(err(format!("NCCL {what} failed: {msg} ({r:?})")))
}

fn nccl_type(dt: DType) -> sys::ncclDataType_t {
    use sys::ncclDataType_t::*;
    match dt {
        DType::F32 => ncclFloat32,
        DType::F64 => ncclFloat64,
        DType::F16 => ncclFloat16,
        DType::BF16 => ncclBfloat16,
        DType::I64 => ncclInt64,
        DType::I32 => ncclInt32,
        DType::U8 => ncclUint8,
    }
}

/// A raw communicator (destroyed on drop unless aborted).
struct RawComm(sys::ncclComm_t);
// SAFETY: an NCCL communicator may be used from any thread (one at a time: the Mutex of
// `Comms` serialises the calls)
unsafe impl Send for RawComm {}

/// The three communicators of a rank (along dp, along mp, the mesh) and the abort state.
struct Comms {
    raw: [RawComm; 3],
    /// Set once the watchdog aborted them: why.
    aborted: Option<String>,
    /// Queued collectives not yet seen complete: (event, started, what).
    inflight: Vec<(CudaEvent, Instant, String)>,
    /// A call inside NCCL right now (enqueueing may block): (started, what).
    entering: Option<(Instant, String)>,
}

impl Drop for Comms {
    fn drop(&mut self) {
        if self.aborted.is_none() {
            for c in &self.raw {
                // SAFETY: each communicator is ours and no call is running on it
                unsafe { sys::ncclCommDestroy(c.0) };
            }
        }
    }
}

/// The NCCL collective of one rank; see the module docs.
pub struct Nccl {
    cuda: Cuda,
    mesh: Mesh,
    rank: usize,
    timeout: Duration,
    comms: Arc<Mutex<Comms>>,
}

fn lock(c: &Mutex<Comms>) -> std::sync::MutexGuard<'_, Comms> {
    c.lock().unwrap_or_else(|e| e.into_inner())
}

fn require_nccl() -> Result<()> {
    if nccl_present() {
        Ok(())
    } else {
        Err(err("NCCL is not available: libnccl.so could not be loaded (pip install nvidia-nccl-cu13 and put \
             a libnccl.so link to its libnccl.so.2 on LD_LIBRARY_PATH)"))
    }
}

/// Splits the mesh communicator into the dp and mp groups of `rank`.
fn split(mesh_comm: sys::ncclComm_t, mesh: Mesh, rank: usize) -> Result<[RawComm; 3]> {
    let mut out = Vec::new();
    for axis in [MeshAxis::Dp, MeshAxis::Mp] {
        let g = ProcessGroup::along(mesh, rank, axis);
        let mut c: sys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: a live communicator; NCCL writes the new one into `c`
        check(
            unsafe { sys::ncclCommSplit(mesh_comm, g.color as i32, g.key as i32, &mut c, std::ptr::null_mut()) },
            "comm split",
        )?;
        out.push(RawComm(c));
    }
    let mp = out.pop().ok_or_else(|| err("split"))?;
    let dp = out.pop().ok_or_else(|| err("split"))?;
    Ok([dp, mp, RawComm(mesh_comm)])
}

impl Nccl {
    /// The collective of `rank` of `mesh` (ranks are processes, one GPU each): rank 0 puts
    /// the mesh communicator's id in `store`, the others read it (waiting up to `timeout`).
    pub fn from_store(cuda: Cuda, mesh: Mesh, rank: usize, store: &dyn Store, timeout: Duration) -> Result<Nccl> {
        Self::from_store_key(cuda, mesh, rank, store, "redco/nccl/mesh-id", timeout)
    }

    /// [`Nccl::from_store`] with the id under `key` (one key per run of a mesh).
    pub fn from_store_key(
        cuda: Cuda,
        mesh: Mesh,
        rank: usize,
        store: &dyn Store,
        key: &str,
        timeout: Duration,
    ) -> Result<Nccl> {
        require_nccl()?;
        let id = if rank == 0 {
            let mut id = sys::ncclUniqueId { internal: [0; 128] };
            // SAFETY: NCCL fills the id
            check(unsafe { sys::ncclGetUniqueId(&mut id) }, "unique id")?;
            let bytes: Vec<u8> = id.internal.iter().map(|&c| c as u8).collect();
            store.set(key, &bytes)?;
            id
        } else {
            let bytes = store.get(key, timeout)?;
            if bytes.len() != 128 {
                return Err(err(format!("the NCCL id in the store has {} bytes, not 128", bytes.len())));
            }
            let mut id = sys::ncclUniqueId { internal: [0; 128] };
            for (d, s) in id.internal.iter_mut().zip(bytes) {
                *d = s as _;
            }
            id
        };
        cuda.inner.ctx.bind_to_thread().map_err(err)?;
        let mut c: sys::ncclComm_t = std::ptr::null_mut();
        // SAFETY: every rank calls this with the same id and its own rank
        check(unsafe { sys::ncclCommInitRank(&mut c, mesh.size() as i32, id, rank as i32) }, "comm init")?;
        let raw = split(c, mesh, rank)?;
        Ok(Nccl::with(cuda, mesh, rank, raw, timeout))
    }

    /// One collective per GPU of `cudas` (rank i on `cudas[i]`), for thread ranks of one
    /// process.
    pub fn for_threads(cudas: &[Cuda], mesh: Mesh, timeout: Duration) -> Result<Vec<Nccl>> {
        require_nccl()?;
        if cudas.len() != mesh.size() {
            return Err(Error::invalid("nccl", format!("{} GPUs for a mesh of {}", cudas.len(), mesh.size())));
        }
        let devs: Vec<i32> = cudas.iter().map(|c| c.inner.ctx.ordinal() as i32).collect();
        let mut comms: Vec<sys::ncclComm_t> = vec![std::ptr::null_mut(); devs.len()];
        // SAFETY: NCCL writes one communicator per listed device
        check(unsafe { sys::ncclCommInitAll(comms.as_mut_ptr(), devs.len() as i32, devs.as_ptr()) }, "comm init all")?;
        // the splits of several communicators from one thread form one group
        // SAFETY: group calls bracket the splits
        check(unsafe { sys::ncclGroupStart() }, "group start")?;
        let raws: Result<Vec<[RawComm; 3]>> = comms.iter().enumerate().map(|(r, &c)| split(c, mesh, r)).collect();
        // SAFETY: closes the group opened above
        check(unsafe { sys::ncclGroupEnd() }, "group end")?;
        Ok(raws?.into_iter().enumerate().map(|(r, raw)| Nccl::with(cudas[r].clone(), mesh, r, raw, timeout)).collect())
    }

    fn with(cuda: Cuda, mesh: Mesh, rank: usize, raw: [RawComm; 3], timeout: Duration) -> Nccl {
        let comms = Arc::new(Mutex::new(Comms { raw, aborted: None, inflight: Vec::new(), entering: None }));
        watchdog(Arc::downgrade(&comms), rank, timeout);
        Nccl { cuda, mesh, rank, timeout, comms }
    }

    /// Aborts the communicators now (another rank failed): every later call fails with `why`.
    pub fn abort(&self, why: &str) {
        let mut g = lock(&self.comms);
        if g.aborted.is_none() {
            for raw in &g.raw {
                // SAFETY: aborting is allowed at any time, calls hanging on it return
                unsafe { sys::ncclCommAbort(raw.0) };
            }
            g.aborted = Some(format!("rank {}: aborted because {why}", self.rank));
        }
    }

    /// The timeout after which a collective aborts the communicators.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Queues one NCCL call on communicator `which` (0 dp, 1 mp, 2 mesh). The lock is not
    /// held during the call (NCCL may block in it, connecting to a peer that never comes),
    /// so the watchdog can abort the communicator meanwhile.
    fn call(
        &self,
        which: usize,
        what: String,
        f: impl FnOnce(sys::ncclComm_t, sys::cudaStream_t) -> sys::ncclResult_t,
    ) -> Result<()> {
        self.cuda.inner.ctx.bind_to_thread().map_err(err)?;
        let stream = self.cuda.inner.stream.cu_stream() as sys::cudaStream_t;
        // the watchdog times the call from here, also while NCCL is still enqueueing it
        let started = Instant::now();
        let comm = {
            let mut c = lock(&self.comms);
            if let Some(why) = &c.aborted {
                return Err(Error::RankFailed { rank: self.rank, msg: why.clone() });
            }
            c.entering = Some((started, what.clone()));
            c.raw[which].0
        };
        // the collective's device time (a rank's wait for its peers included) in a profile
        let r = self.cuda.timed("collectives", || Ok(f(comm, stream)))?;
        let mut c = lock(&self.comms);
        c.entering = None;
        if let Some(why) = &c.aborted {
            return Err(Error::RankFailed { rank: self.rank, msg: why.clone() });
        }
        check(r, &what)?;
        let ev = self.cuda.inner.ctx.new_event(None).map_err(err)?;
        ev.record(&self.cuda.inner.stream).map_err(err)?;
        c.inflight.push((ev, started, what));
        Ok(())
    }

    fn which(axis: MeshAxis) -> usize {
        match axis {
            MeshAxis::Dp => 0,
            MeshAxis::Mp => 1,
        }
    }
}

/// Polls the rank's queued collectives and NCCL's asynchronous errors every 100 ms;
/// aborts the communicators on a timeout or an error. Ends when the collective is dropped.
fn watchdog(comms: std::sync::Weak<Mutex<Comms>>, rank: usize, timeout: Duration) {
    std::thread::Builder::new()
        .name(format!("redco-nccl-watchdog-{rank}"))
        .spawn(move || {
            while let Some(c) = comms.upgrade() {
                {
                    let mut g = lock(&c);
                    if g.aborted.is_some() {
                        return;
                    }
                    g.inflight.retain(|(ev, _, _)| !ev.is_complete());
                    let late = g
                        .inflight
                        .iter()
                        .find(|(_, t, _)| t.elapsed() > timeout)
                        .map(|(_, t, w)| (t.elapsed(), w.clone()));
                    let mut failed = late.map(|(d, w)| {
                        format!("rank {rank}: NCCL {w} did not complete within {:.0} s", d.as_secs_f64())
                    });
                    for raw in &g.raw {
                        let mut r = sys::ncclResult_t::ncclSuccess;
                        // SAFETY: a live communicator; NCCL writes its pending error
                        unsafe { sys::ncclCommGetAsyncError(raw.0, &mut r) };
                        if r != sys::ncclResult_t::ncclSuccess
                            && r != sys::ncclResult_t::ncclInProgress
                            && failed.is_none()
                        {
                            failed = Some(format!("rank {rank}: NCCL reported {r:?}"));
                        }
                    }
                    if let Some(why) = failed {
                        for raw in &g.raw {
                            // SAFETY: aborting a communicator is allowed while calls hang on it
                            unsafe { sys::ncclCommAbort(raw.0) };
                        }
                        g.aborted = Some(format!("{why}; the communicators were aborted"));
                        return;
                    }
                }
                drop(c);
                std::thread::sleep(Duration::from_millis(100));
            }
        })
        .ok();
}

impl Collective<Cuda> for Nccl {
    fn mesh(&self) -> Mesh {
        self.mesh
    }
    fn rank(&self) -> usize {
        self.rank
    }
    fn all_reduce(&self, axis: MeshAxis, x: &CudaStorage, op: ReduceKind) -> Result<CudaStorage> {
        let y = self.cuda.alloc(x.len(), x.dtype())?;
        let rop = match op {
            ReduceKind::Sum => sys::ncclRedOp_t::ncclSum,
            ReduceKind::Max => sys::ncclRedOp_t::ncclMax,
        };
        let (src, dst, n, t) = (x.ptr(), y.ptr(), x.len(), nccl_type(x.dtype()));
        // SAFETY: both buffers hold n elements of the dtype
        self.call(Self::which(axis), format!("all_reduce along {axis:?}"), |c, s| unsafe {
            sys::ncclAllReduce(src as _, dst as _, n, t, rop, c, s)
        })?;
        Ok(y)
    }
    fn all_gather(&self, axis: MeshAxis, x: &CudaStorage) -> Result<CudaStorage> {
        let size = self.mesh.axis_size(axis);
        let y = self.cuda.alloc(x.len() * size, x.dtype())?;
        let (src, dst, n, t) = (x.ptr(), y.ptr(), x.len(), nccl_type(x.dtype()));
        // SAFETY: the output holds `size` times the input
        self.call(Self::which(axis), format!("all_gather along {axis:?}"), |c, s| unsafe {
            sys::ncclAllGather(src as _, dst as _, n, t, c, s)
        })?;
        Ok(y)
    }
    fn reduce_scatter(&self, axis: MeshAxis, x: &CudaStorage) -> Result<CudaStorage> {
        let size = self.mesh.axis_size(axis);
        if !x.len().is_multiple_of(size) {
            return Err(Error::invalid(
                "reduce_scatter",
                format!("{} elements do not split over {size} ranks", x.len()),
            ));
        }
        let y = self.cuda.alloc(x.len() / size, x.dtype())?;
        let (src, dst, n, t) = (x.ptr(), y.ptr(), x.len() / size, nccl_type(x.dtype()));
        // SAFETY: the input holds `size` chunks of the output's length
        self.call(Self::which(axis), format!("reduce_scatter along {axis:?}"), |c, s| unsafe {
            sys::ncclReduceScatter(src as _, dst as _, n, t, sys::ncclRedOp_t::ncclSum, c, s)
        })?;
        Ok(y)
    }
    fn broadcast(&self, axis: MeshAxis, x: &CudaStorage, root: usize) -> Result<CudaStorage> {
        if root >= self.mesh.axis_size(axis) {
            return Err(Error::invalid(
                "broadcast",
                format!("root {root} of a group of {}", self.mesh.axis_size(axis)),
            ));
        }
        let y = self.cuda.alloc(x.len(), x.dtype())?;
        let (src, dst, n, t) = (x.ptr(), y.ptr(), x.len(), nccl_type(x.dtype()));
        // SAFETY: both buffers hold n elements
        self.call(Self::which(axis), format!("broadcast along {axis:?}"), |c, s| unsafe {
            sys::ncclBroadcast(src as _, dst as _, n, t, root as i32, c, s)
        })?;
        Ok(y)
    }
    fn all_to_all(&self, axis: MeshAxis, x: &CudaStorage, send: &[usize], recv: &[usize]) -> Result<CudaStorage> {
        let n = self.mesh.axis_size(axis);
        if send.len() != n || recv.len() != n || send.iter().sum::<usize>() != x.len() {
            return Err(Error::invalid(
                "all_to_all",
                format!("{} elements with send counts {send:?} and receive counts {recv:?} over {n} ranks", x.len()),
            ));
        }
        let y = self.cuda.alloc(recv.iter().sum(), x.dtype())?;
        let (src, dst, t, es) = (x.ptr(), y.ptr(), nccl_type(x.dtype()), x.dtype().size_in_bytes() as u64);
        let (send, recv) = (send.to_vec(), recv.to_vec());
        // one group of paired sends and receives, as NCCL's documentation builds an
        // all-to-all with uneven counts
        // SAFETY: piece j of the input starts at the sum of the counts before it and holds
        // send[j] elements; the output holds the sum of recv, piece j at its offset
        self.call(Self::which(axis), format!("all_to_all along {axis:?}"), |c, s| unsafe {
            let r = sys::ncclGroupStart();
            if r != sys::ncclResult_t::ncclSuccess {
                return r;
            }
            let (mut so, mut ro) = (0u64, 0u64);
            for peer in 0..n {
                let r = sys::ncclSend((src + so * es) as _, send[peer], t, peer as i32, c, s);
                if r != sys::ncclResult_t::ncclSuccess {
                    sys::ncclGroupEnd();
                    return r;
                }
                let r = sys::ncclRecv((dst + ro * es) as _, recv[peer], t, peer as i32, c, s);
                if r != sys::ncclResult_t::ncclSuccess {
                    sys::ncclGroupEnd();
                    return r;
                }
                so += send[peer] as u64;
                ro += recv[peer] as u64;
            }
            sys::ncclGroupEnd()
        })?;
        Ok(y)
    }
    fn barrier(&self) -> Result<()> {
        let x = self.cuda.fill(1, 0.0, DType::F32)?;
        let (p, t) = (x.ptr(), nccl_type(DType::F32));
        // SAFETY: an in-place one-element all-reduce over the mesh
        self.call(2, "barrier".into(), |c, s| unsafe {
            sys::ncclAllReduce(p as _, p as _, 1, t, sys::ncclRedOp_t::ncclSum, c, s)
        })?;
        // the barrier waits for the stream (the watchdog aborts it if a rank never comes)
        let r = self.cuda.inner.stream.synchronize();
        if let Some(why) = &lock(&self.comms).aborted {
            return Err(Error::RankFailed { rank: self.rank, msg: why.clone() });
        }
        r.map_err(|e| err(format!("barrier: {e}")))
    }
}
