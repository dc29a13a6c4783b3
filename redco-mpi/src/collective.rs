//! The MPI `Collective`: any backend's buffers staged through host memory, summed in axis
//! order exactly as the thread transport sums them (so a run over processes gives the
//! same bits as the same run over threads).

use crate::env::Mpi;
use crate::watchdog::{diagnose, kind_name};
use crate::wire::Group;
use redco_core::runtime::host::{reduce_all, split_range, SPLIT_REDUCE_MIN};
use redco_core::runtime::{Collective, CollectiveKind, Mesh, Pending, ReduceKind};
use redco_core::{Backend, DType, Error, HostData, MeshAxis, Result};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// One process's rank over MPI: its groups along `dp` and `mp` and the mesh. Started
/// collectives ([`Collective::all_reduce_async`], all-gathers and reduce-scatters likewise)
/// run on the rank's worker thread, in the order they were started, while the rank computes.
pub struct MpiCollective<B: Backend> {
    inner: Arc<Inner>,
    backend: B,
    worker: Mutex<Option<(mpsc::Sender<Job>, std::thread::JoinHandle<()>)>>,
}

impl<B: Backend> Drop for MpiCollective<B> {
    fn drop(&mut self) {
        // the worker ends with its channel; joined here so that its share of the
        // communicators (and of MPI) is gone before the caller finalises MPI
        let w = self.worker.get_mut().unwrap_or_else(|p| p.into_inner()).take();
        if let Some((tx, handle)) = w {
            drop(tx);
            let _ = handle.join();
        }
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// What the rank and its worker share.
struct Inner {
    mpi: Arc<Mpi>,
    groups: Arc<[Group; 3]>,
    timeout: Duration,
}

/// What each member says of a call before the data moves: (kind, sequence number, element
/// count, dtype, root), so members that disagree get an error instead of MPI's undefined
/// behaviour.
const HEADER: usize = 5;

fn dtype_code(d: DType) -> i64 {
    [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64, DType::I32, DType::U8]
        .iter()
        .position(|&x| x == d)
        .unwrap_or(99) as i64
}

fn dtype_of(c: i64) -> String {
    [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64, DType::I32, DType::U8]
        .get(c as usize)
        .map_or(format!("dtype #{c}"), |d| format!("{d:?}"))
}

fn kind_of(c: i64) -> &'static str {
    [
        CollectiveKind::AllReduce,
        CollectiveKind::AllGather,
        CollectiveKind::ReduceScatter,
        CollectiveKind::Broadcast,
        CollectiveKind::Barrier,
        CollectiveKind::AllToAll,
    ]
    .get(c as usize)
    .map_or("an unknown collective", |&k| kind_name(k))
}

impl<B: Backend> MpiCollective<B> {
    pub(crate) fn new(mpi: Arc<Mpi>, groups: Arc<[Group; 3]>, backend: B, timeout: Duration) -> Self {
        MpiCollective { inner: Arc::new(Inner { mpi, groups, timeout }), backend, worker: Mutex::new(None) }
    }

    fn group(&self, axis: MeshAxis) -> &Group {
        &self.inner.groups[axis as usize]
    }

    /// Runs the collective `f` on the worker thread, after those started before it: the
    /// result, uploaded, when waited for.
    fn later(&self, f: impl FnOnce() -> Result<HostData> + Send + 'static) -> Result<Pending<B::Storage>> {
        let (tx, rx) = mpsc::channel();
        self.on_worker(Box::new(move || {
            let _ = tx.send(f());
        }))?;
        let b = self.backend.clone();
        Ok(Pending::later(move || {
            let h = rx.recv().map_err(|_| Error::invalid("mpi", "the collective worker thread stopped"))??;
            b.upload_owned(h)
        }))
    }

    /// Runs the synchronous collective `f` after every collective started before it: on
    /// the worker thread once it has started (the members of a group must call its
    /// collectives in one order, and a started all-reduce of gradient buckets may still be
    /// queued there while backward runs a blocking one, e.g. a mixture of experts'
    /// all-to-all), here otherwise.
    fn in_order(&self, f: impl FnOnce() -> Result<HostData> + Send + 'static) -> Result<HostData> {
        let started = self.worker.lock().unwrap_or_else(|p| p.into_inner()).is_some();
        if !started {
            return f();
        }
        let (tx, rx) = mpsc::channel();
        self.on_worker(Box::new(move || {
            let _ = tx.send(f());
        }))?;
        rx.recv().map_err(|_| Error::invalid("mpi", "the collective worker thread stopped"))?
    }

    /// Runs `job` on the rank's worker thread (started on first use).
    fn on_worker(&self, job: Job) -> Result<()> {
        let mut w = self.worker.lock().unwrap_or_else(|p| p.into_inner());
        if w.is_none() {
            let (tx, rx) = mpsc::channel::<Job>();
            let handle = std::thread::Builder::new()
                .name("redco-mpi-worker".into())
                .spawn(move || {
                    // ends when the collective (the sender) is dropped
                    for job in rx {
                        job();
                    }
                })
                .map_err(|e| Error::invalid("mpi", format!("cannot start the collective worker thread: {e}")))?;
            *w = Some((tx, handle));
        }
        w.as_ref()
            .expect("started above")
            .0
            .send(job)
            .map_err(|_| Error::invalid("mpi", "the collective worker thread is gone"))
    }
}

impl Inner {
    fn group(&self, axis: MeshAxis) -> &Group {
        &self.groups[axis as usize]
    }

    /// Runs one collective on `g`: the agreement check, then `body` with the deadline and
    /// the watchdog. Holds the process's MPI lock throughout.
    fn call<R>(
        &self,
        g: &Group,
        kind: CollectiveKind,
        data: Option<&HostData>,
        root: usize,
        body: impl FnOnce(Instant, crate::wire::OnTimeout<'_>) -> Result<R>,
    ) -> Result<R> {
        let progress = self.mpi.progress().clone();
        let seq = progress.enter(kind, g.info.axis);
        let start = Instant::now();
        let deadline = start + self.timeout;
        let me = self.mpi.world().rank;
        let timeout = self.timeout;
        let mpi = self.mpi.clone();
        let info = g.info.clone();
        let on_timeout = move || -> std::convert::Infallible {
            let why = diagnose(&**mpi.tcp_store(), me, &info, kind, seq);
            let msg = format!(
                "watchdog: rank {me}: {} #{seq} over {} (ranks {:?}) did not complete within {:.1}s: {why}; aborting the job",
                kind_name(kind),
                info.axis,
                info.members,
                timeout.as_secs_f64()
            );
            eprintln!("redco: error: {msg}");
            tracing::error!("{msg}");
            mpi.abort(3)
        };
        let n = g.info.size();
        let out = if n == 1 {
            body(deadline, &on_timeout)
        } else {
            let (len, dt) = data.map_or((0, 0), |d| (d.len() as i64, dtype_code(d.dtype())));
            let mine = [kind as i64, seq as i64, len, dt, root as i64];
            let bytes: Vec<u8> = mine.iter().flat_map(|v| v.to_le_bytes()).collect();
            let all = g.all_gather(&bytes, deadline, &on_timeout);
            let theirs: Vec<[i64; HEADER]> = all
                .chunks_exact(8 * HEADER)
                .map(|c| std::array::from_fn(|i| i64::from_le_bytes(c[8 * i..8 * i + 8].try_into().expect("8 bytes"))))
                .collect();
            if let Some((k, h)) = theirs.iter().enumerate().find(|(_, h)| **h != mine) {
                progress.leave();
                return Err(Error::Collective {
                    op: kind_name(kind),
                    rank: me,
                    msg: format!(
                        "ranks disagree over {}: this rank (call #{seq}) has {} on {} {} elements (root {root}), rank {} (call #{}) has {} on {} {} elements (root {})",
                        g.info.axis,
                        kind_name(kind),
                        len,
                        dtype_of(dt),
                        g.info.members[k],
                        h[1],
                        kind_of(h[0]),
                        h[2],
                        dtype_of(h[3]),
                        h[4]
                    ),
                });
            }
            body(deadline, &on_timeout)
        };
        progress.leave();
        if start.elapsed() > self.timeout / 2 {
            tracing::warn!(
                "redco-mpi: {} over {} took {:.1}s (timeout {:.1}s)",
                kind_name(kind),
                g.info.axis,
                start.elapsed().as_secs_f64(),
                self.timeout.as_secs_f64()
            );
        }
        out
    }

    /// All-reduce of host data over `axis` (the rank's thread or its worker).
    fn all_gather(&self, axis: MeshAxis, h: HostData) -> Result<HostData> {
        let g = self.group(axis);
        self.call(g, CollectiveKind::AllGather, Some(&h), 0, |deadline, on_timeout| {
            if g.info.size() == 1 {
                return Ok(h.clone());
            }
            HostData::from_bytes(h.dtype(), &g.all_gather(h.as_bytes(), deadline, on_timeout))
        })
    }

    fn reduce_scatter(&self, axis: MeshAxis, h: HostData) -> Result<HostData> {
        let g = self.group(axis);
        let n = g.info.size();
        if !h.len().is_multiple_of(n) {
            return Err(Error::Collective {
                op: "reduce_scatter",
                rank: self.mpi.world().rank,
                msg: format!("{} elements do not split into {n} equal chunks", h.len()),
            });
        }
        self.call(g, CollectiveKind::ReduceScatter, Some(&h), 0, |deadline, on_timeout| {
            if n == 1 {
                return Ok(reduce_all(&[Arc::new(h.clone())], ReduceKind::Sum));
            }
            let block = h.as_bytes().len() / n;
            let got = g.all_to_all(h.as_bytes(), block, deadline, on_timeout);
            Ok(reduce_all(&parts(&got, n, h.dtype())?, ReduceKind::Sum))
        })
    }

    fn all_reduce(&self, axis: MeshAxis, h: HostData, op: ReduceKind) -> Result<HostData> {
        let g = self.group(axis);
        let n = g.info.size();
        let dt = h.dtype();
        let len = h.len();
        self.call(g, CollectiveKind::AllReduce, Some(&h), 0, |deadline, on_timeout| {
            if n == 1 {
                return Ok(h.clone());
            }
            if len < SPLIT_REDUCE_MIN || len < n {
                // every member sums every buffer, in axis order
                let all = g.all_gather(h.as_bytes(), deadline, on_timeout);
                return Ok(reduce_all(&parts(&all, n, dt)?, op));
            }
            // reduce-scatter then all-gather: member i sums range i of every buffer (in
            // axis order), then every member gathers the sums; ranges padded to one size
            let es = dt.size_in_bytes();
            let ranges: Vec<(usize, usize)> = (0..n).map(|i| split_range(len, n, i)).collect();
            let block = ranges.iter().map(|(a, b)| b - a).max().unwrap_or(0) * es;
            let src = h.as_bytes();
            let mut send = vec![0u8; block * n];
            for (i, (a, b)) in ranges.iter().enumerate() {
                send[i * block..i * block + (b - a) * es].copy_from_slice(&src[a * es..b * es]);
            }
            let got = g.all_to_all(&send, block, deadline, on_timeout);
            let (a, b) = ranges[g.info.key];
            let mine: Vec<Arc<HostData>> = (0..n)
                .map(|r| HostData::from_bytes(dt, &got[r * block..r * block + (b - a) * es]).map(Arc::new))
                .collect::<Result<_>>()?;
            let sum = reduce_all(&mine, op);
            let mut padded = sum.as_bytes().to_vec();
            padded.resize(block, 0);
            let all = g.all_gather(&padded, deadline, on_timeout);
            let mut out = Vec::with_capacity(len * es);
            for (i, (a, b)) in ranges.iter().enumerate() {
                out.extend_from_slice(&all[i * block..i * block + (b - a) * es]);
            }
            HostData::from_bytes(dt, &out)
        })
    }
}

impl Inner {
    /// MPI's `Alltoallv` over `axis`, as an all-to-all of equal blocks padded to the
    /// largest piece: the members first gather every member's send and receive counts, so
    /// that counts that do not match are an error on every member (not a hang).
    fn all_to_all(&self, axis: MeshAxis, h: HostData, send: Vec<usize>, recv: Vec<usize>) -> Result<HostData> {
        let g = self.group(axis);
        let n = g.info.size();
        let dt = h.dtype();
        let rank = self.mpi.world().rank;
        let bad = |msg: String| Error::Collective { op: "all_to_all", rank, msg };
        if send.len() != n || recv.len() != n || send.iter().sum::<usize>() != h.len() {
            return Err(bad(format!(
                "{} elements with send counts {send:?} and receive counts {recv:?} in a group of {n}",
                h.len()
            )));
        }
        let header = HostData::from_bytes(dt, &[])?;
        self.call(g, CollectiveKind::AllToAll, Some(&header), 0, |deadline, on_timeout| {
            if n == 1 {
                return Ok(h.clone());
            }
            let mine: Vec<u8> = send.iter().chain(&recv).flat_map(|&c| (c as u64).to_le_bytes()).collect();
            let all = g.all_gather(&mine, deadline, on_timeout);
            let count = |m: usize, k: usize| {
                let at = (m * 2 * n + k) * 8;
                u64::from_le_bytes(all[at..at + 8].try_into().expect("8 bytes")) as usize
            };
            // member i's send[j] must be member j's recv[i]
            for i in 0..n {
                for j in 0..n {
                    if count(i, j) != count(j, n + i) {
                        return Err(bad(format!(
                            "member {i} sends {} elements to member {j}, which expects {}",
                            count(i, j),
                            count(j, n + i)
                        )));
                    }
                }
            }
            let es = dt.size_in_bytes();
            let block =
                (0..n).flat_map(|i| (0..n).map(move |j| (i, j))).map(|(i, j)| count(i, j)).max().unwrap_or(0) * es;
            let src = h.as_bytes();
            let mut buf = vec![0u8; block * n];
            let mut off = 0;
            for (j, &c) in send.iter().enumerate() {
                buf[j * block..j * block + c * es].copy_from_slice(&src[off..off + c * es]);
                off += c * es;
            }
            let got = g.all_to_all(&buf, block, deadline, on_timeout);
            let mut out = Vec::with_capacity(recv.iter().sum::<usize>() * es);
            for (j, &c) in recv.iter().enumerate() {
                out.extend_from_slice(&got[j * block..j * block + c * es]);
            }
            HostData::from_bytes(dt, &out)
        })
    }
}

/// The `n` equal parts of `bytes`, as `dt` values.
fn parts(bytes: &[u8], n: usize, dt: DType) -> Result<Vec<Arc<HostData>>> {
    let each = bytes.len() / n;
    bytes.chunks_exact(each.max(1)).take(n).map(|c| HostData::from_bytes(dt, c).map(Arc::new)).collect()
}

impl<B: Backend> Collective<B> for MpiCollective<B> {
    fn mesh(&self) -> Mesh {
        let (dp, mp) = (self.inner.groups[0].info.size(), self.inner.groups[1].info.size());
        Mesh { dp, mp }
    }
    fn rank(&self) -> usize {
        self.inner.mpi.world().rank
    }
    fn all_reduce(&self, axis: MeshAxis, x: &B::Storage, op: ReduceKind) -> Result<B::Storage> {
        let h = self.backend.download(x)?;
        let inner = self.inner.clone();
        self.backend.upload_owned(self.in_order(move || inner.all_reduce(axis, h, op))?)
    }
    fn all_reduce_async(&self, axis: MeshAxis, x: &B::Storage, op: ReduceKind) -> Result<Pending<B::Storage>> {
        let h = self.backend.download(x)?;
        let inner = self.inner.clone();
        self.later(move || inner.all_reduce(axis, h, op))
    }
    fn all_gather(&self, axis: MeshAxis, x: &B::Storage) -> Result<B::Storage> {
        let h = self.backend.download(x)?;
        let inner = self.inner.clone();
        self.backend.upload_owned(self.in_order(move || inner.all_gather(axis, h))?)
    }
    fn all_gather_async(&self, axis: MeshAxis, x: &B::Storage) -> Result<Pending<B::Storage>> {
        let h = self.backend.download(x)?;
        let inner = self.inner.clone();
        self.later(move || inner.all_gather(axis, h))
    }
    fn reduce_scatter(&self, axis: MeshAxis, x: &B::Storage) -> Result<B::Storage> {
        let h = self.backend.download(x)?;
        let inner = self.inner.clone();
        self.backend.upload_owned(self.in_order(move || inner.reduce_scatter(axis, h))?)
    }
    fn reduce_scatter_async(&self, axis: MeshAxis, x: &B::Storage) -> Result<Pending<B::Storage>> {
        let h = self.backend.download(x)?;
        let inner = self.inner.clone();
        self.later(move || inner.reduce_scatter(axis, h))
    }
    fn broadcast(&self, axis: MeshAxis, x: &B::Storage, root: usize) -> Result<B::Storage> {
        let h = self.backend.download(x)?;
        let g = self.group(axis);
        if root >= g.info.size() {
            return Err(Error::Collective {
                op: "broadcast",
                rank: self.rank(),
                msg: format!("root {root} is outside a group of {}", g.info.size()),
            });
        }
        let out = self.inner.call(g, CollectiveKind::Broadcast, Some(&h), root, |deadline, on_timeout| {
            let mut buf = h.as_bytes().to_vec();
            if g.info.size() > 1 {
                g.broadcast(&mut buf, root, deadline, on_timeout);
            }
            HostData::from_bytes(h.dtype(), &buf)
        })?;
        self.backend.upload_owned(out)
    }
    fn all_to_all(&self, axis: MeshAxis, x: &B::Storage, send: &[usize], recv: &[usize]) -> Result<B::Storage> {
        let h = self.backend.download(x)?;
        let (inner, send, recv) = (self.inner.clone(), send.to_vec(), recv.to_vec());
        self.backend.upload_owned(self.in_order(move || inner.all_to_all(axis, h, send, recv))?)
    }
    fn barrier(&self) -> Result<()> {
        let g = &self.inner.groups[2];
        self.inner.call(g, CollectiveKind::Barrier, None, 0, |deadline, on_timeout| {
            if g.info.size() > 1 {
                g.barrier(deadline, on_timeout);
            }
            Ok(())
        })
    }
}
