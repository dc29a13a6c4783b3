//! The in-process collective: ranks are threads that meet at a shared hub.
//!
//! Each group (a mesh axis and a group index) has one slot. Members deposit their buffer,
//! sleep on a condition variable until the last one arrives (no busy spinning, so ranks
//! leave the cores to compute), then each combines the deposits *in axis order*, so every
//! member gets bit-identical results. Waits have a deadline; a rank that fails marks the
//! hub as failed and wakes everyone, so the others return an error at once.
//!
//! A bucket of gradients is all-reduced where it lies: each member deposits its buffers
//! as they are, sums its slice of their concatenation straight from every member's buffers,
//! and the members then share the summed pieces, so a gradient that lies within one slice
//! is one buffer for the whole group (no concatenated copy, no copy of the sum).

use super::group::{GroupAxis, ProcessGroup};
use super::host::{
    assemble_bucket, chunk, concat_all, reduce_all, reduce_bucket_range, reduce_range, split_range, SPLIT_REDUCE_MIN,
};
use crate::backend::collective::{all_reduce_flat, Pending};
use crate::backend::collective::{Collective, CollectiveKind, ReduceKind};
use crate::backend::mesh::Mesh;
use crate::{Backend, DType, Error, HostData, MeshAxis, Result};
use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

#[derive(Default)]
struct Slot {
    round: u64,
    /// The call the members agree on: kind, length, dtype and buffers per deposit.
    call: Option<(CollectiveKind, usize, DType, usize)>,
    deposits: Vec<Option<Deposit>>,
    arrived: usize,
    taken: usize,
}

/// What a member deposits: one buffer, or a bucket of buffers that are one flat buffer.
type Deposit = Vec<Arc<HostData>>;

/// A group's slot: its [`ProcessGroup::id`].
type GroupKey = (GroupAxis, usize);

#[derive(Default)]
struct HubState {
    slots: HashMap<GroupKey, Slot>,
    failed: Option<String>,
}

/// The meeting point of every rank of one in-process mesh.
pub struct Hub {
    mesh: Mesh,
    timeout: Duration,
    state: Mutex<HubState>,
    cv: Condvar,
}

impl Hub {
    /// A hub for `mesh` whose collectives give up after `timeout`.
    pub fn new(mesh: Mesh, timeout: Duration) -> Arc<Self> {
        Arc::new(Hub { mesh, timeout, state: Mutex::new(HubState::default()), cv: Condvar::new() })
    }

    /// Marks the run as failed (a rank errored or panicked) and wakes every waiting rank.
    pub fn fail(&self, why: String) {
        let mut s = self.lock();
        if s.failed.is_none() {
            s.failed = Some(why);
        }
        drop(s);
        self.cv.notify_all();
    }

    /// Why the run failed, if it did.
    pub fn failure(&self) -> Option<String> {
        self.lock().failed.clone()
    }

    fn lock(&self) -> MutexGuard<'_, HubState> {
        // A panic while holding the lock cannot leave the state inconsistent (every update is
        // a few assignments), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Deposits `data` for member `idx` of a group of `n` and returns every member's
    /// deposit in axis order.
    fn exchange(
        &self,
        rank: usize,
        key: GroupKey,
        idx: usize,
        n: usize,
        kind: CollectiveKind,
        data: Arc<HostData>,
    ) -> Result<Vec<Arc<HostData>>> {
        let len = data.len();
        let all = self.exchange_as(rank, key, idx, n, (kind, len, 1), vec![data])?;
        Ok(all.into_iter().flat_map(|d| d.into_iter().take(1)).collect())
    }

    /// [`Hub::exchange`] of a [`Deposit`], where the members agree on `(kind, len, parts)`
    /// (and the dtype) rather than on the lengths of their deposits: the slices of a
    /// reduce-scatter may differ by one; a bucket's length is its total and `parts` its
    /// number of buffers, whatever number of pieces a member deposits.
    fn exchange_as(
        &self,
        rank: usize,
        key: GroupKey,
        idx: usize,
        n: usize,
        (kind, len, parts): (CollectiveKind, usize, usize),
        data: Deposit,
    ) -> Result<Vec<Deposit>> {
        let deadline = Instant::now() + self.timeout;
        let err = |msg: String| Error::Collective { op: kind_name(kind), rank, msg };
        let call = (kind, len, data.first().map_or(DType::U8, |d| d.dtype()), parts);
        let mut st = self.lock();
        // Wait for the previous round of this group to be fully read.
        loop {
            if let Some(f) = &st.failed {
                return Err(err(format!("aborted: {f}")));
            }
            let slot = st.slots.entry(key).or_default();
            if slot.deposits.is_empty() {
                slot.deposits = vec![None; n];
            }
            if slot.taken == 0 && slot.deposits[idx].is_none() {
                break;
            }
            st = self.wait(st, deadline).map_err(|_| err(self.timeout_msg()))?;
        }
        let slot = st.slots.get_mut(&key).expect("slot exists");
        if let Some(other) = slot.call {
            if other != call {
                let msg = format!(
                    "ranks disagree: this rank called {} on {} {:?} elements in {} buffers, another called {} on {} {:?} in {}",
                    kind_name(kind),
                    call.1,
                    call.2,
                    call.3,
                    kind_name(other.0),
                    other.1,
                    other.2,
                    other.3
                );
                drop(st);
                self.fail(format!("rank {rank}: {msg}"));
                return Err(err(msg));
            }
        }
        slot.call = Some(call);
        slot.deposits[idx] = Some(data);
        slot.arrived += 1;
        let round = slot.round;
        self.cv.notify_all();
        loop {
            if let Some(f) = &st.failed {
                return Err(err(format!("aborted: {f}")));
            }
            let slot = &st.slots[&key];
            if slot.round == round && slot.arrived == n {
                break;
            }
            st = self.wait(st, deadline).map_err(|_| err(self.timeout_msg()))?;
        }
        let slot = st.slots.get_mut(&key).expect("slot exists");
        let all: Vec<Deposit> = slot.deposits.iter().map(|d| d.clone().expect("all arrived")).collect();
        slot.taken += 1;
        if slot.taken == n {
            slot.deposits = vec![None; n];
            slot.arrived = 0;
            slot.taken = 0;
            slot.call = None;
            slot.round += 1;
            self.cv.notify_all();
        }
        Ok(all)
    }

    fn wait<'a>(
        &'a self,
        st: MutexGuard<'a, HubState>,
        deadline: Instant,
    ) -> std::result::Result<MutexGuard<'a, HubState>, ()> {
        let now = Instant::now();
        if now >= deadline {
            return Err(());
        }
        let (st, _) = self.cv.wait_timeout(st, deadline - now).unwrap_or_else(|p| p.into_inner());
        Ok(st)
    }

    fn timeout_msg(&self) -> String {
        format!(
            "timed out after {:.1}s waiting for the other ranks (a rank died, hangs, or skipped this collective)",
            self.timeout.as_secs_f64()
        )
    }
}

fn kind_name(k: CollectiveKind) -> &'static str {
    k.name()
}

/// One rank's handle on a [`Hub`], over any backend (buffers travel through host memory).
pub struct ThreadCollective<B: Backend> {
    hub: Arc<Hub>,
    rank: usize,
    backend: B,
    /// This rank's groups along `dp` and `mp` and the mesh, made once.
    groups: [ProcessGroup; 3],
}

impl<B: Backend> ThreadCollective<B> {
    /// The handle of `rank`, moving data with `backend`.
    pub fn new(hub: Arc<Hub>, rank: usize, backend: B) -> Self {
        let groups = ProcessGroup::all_of(hub.mesh, rank);
        ThreadCollective { hub, rank, backend, groups }
    }

    fn group(&self, axis: MeshAxis) -> (GroupKey, usize, usize) {
        let g = &self.groups[axis as usize];
        (g.id(), g.key, g.size())
    }

    fn swap(&self, axis: MeshAxis, kind: CollectiveKind, x: &B::Storage) -> Result<(Vec<Arc<HostData>>, usize)> {
        let (key, idx, n) = self.group(axis);
        let data = self.backend.download_shared(x)?;
        Ok((self.hub.exchange(self.rank, key, idx, n, kind, data)?, idx))
    }

    /// The shared-memory bucket all-reduce of [`Collective::all_reduce_bucket_async`]: one
    /// rendezvous to see the members' buffers, each member reduces its slice of the flat
    /// bucket (a piece per buffer it meets), a second rendezvous to share the pieces.
    fn reduce_bucket(
        &self,
        axis: MeshAxis,
        xs: &[(B::Storage, usize)],
        total: usize,
        op: ReduceKind,
    ) -> Result<Vec<B::Storage>> {
        let (key, idx, n) = self.group(axis);
        let mine: Deposit = xs.iter().map(|(s, _)| self.backend.download_shared(s)).collect::<Result<_>>()?;
        let sizes: Vec<usize> = mine.iter().map(|h| h.len()).collect();
        if let Some(k) = (0..xs.len()).find(|&k| xs[k].1 != sizes[k]) {
            let msg = format!("bucket buffer {k} holds {} elements, not the {} given", sizes[k], xs[k].1);
            return Err(Error::invalid("all_reduce_bucket", msg));
        }
        let dt = mine[0].dtype();
        let call = (CollectiveKind::AllReduce, total, sizes.len());
        let members = self.hub.exchange_as(self.rank, key, idx, n, call, mine)?;
        let differs =
            |m: &Deposit| m.len() != sizes.len() || m.iter().zip(&sizes).any(|(h, &l)| h.len() != l || h.dtype() != dt);
        if let Some(j) = members.iter().position(differs) {
            let theirs: Vec<usize> = members[j].iter().map(|h| h.len()).collect();
            let msg = format!(
                "ranks disagree: this rank's bucket holds buffers of {sizes:?} elements, member {j}'s of {theirs:?}"
            );
            self.hub.fail(format!("rank {}: {msg}", self.rank));
            return Err(Error::Collective { op: "all_reduce", rank: self.rank, msg });
        }
        let (a, b) = split_range(total, n, idx);
        let pieces = reduce_bucket_range(&members, op, a, b).ok_or_else(|| Error::Collective {
            op: "all_reduce",
            rank: self.rank,
            msg: format!("a bucket all-reduce sums f32 or f64 buffers, not {dt:?}"),
        })?;
        drop(members);
        let pieces: Deposit = pieces.into_iter().map(Arc::new).collect();
        let all = self.hub.exchange_as(self.rank, key, idx, n, call, pieces)?;
        let sums = assemble_bucket(&all, &sizes).ok_or_else(|| Error::Collective {
            op: "all_reduce",
            rank: self.rank,
            msg: "the members' reduced pieces do not make up the bucket".into(),
        })?;
        sums.into_iter().map(|h| self.backend.upload_shared(h)).collect()
    }
}

impl<B: Backend> Collective<B> for ThreadCollective<B> {
    fn mesh(&self) -> Mesh {
        self.hub.mesh
    }
    fn rank(&self) -> usize {
        self.rank
    }
    fn all_reduce(&self, axis: MeshAxis, x: &B::Storage, op: ReduceKind) -> Result<B::Storage> {
        // Reduce-scatter then all-gather, both through shared memory: each member sums
        // only its own slice of the deposits, in parallel with the others, and every
        // member then copies the summed slices together (the same bits on every rank).
        // Small buffers (a decode step's activations) skip the second rendezvous, whose
        // wake-up latency would cost more than summing everything on every member.
        let (parts, idx) = self.swap(axis, CollectiveKind::AllReduce, x)?;
        let (key, _, n) = self.group(axis);
        if n == 1 || parts[0].len() < SPLIT_REDUCE_MIN {
            return self.backend.upload_owned(reduce_all(&parts, op));
        }
        let len = parts[0].len();
        let (a, b) = split_range(len, n, idx);
        let mine = Arc::new(reduce_range(&parts, op, a, b));
        drop(parts);
        let sums = self.hub.exchange_as(self.rank, key, idx, n, (CollectiveKind::AllReduce, len, 1), vec![mine])?;
        let sums: Vec<Arc<HostData>> = sums.into_iter().flatten().collect();
        self.backend.upload_owned(concat_all(&sums))
    }
    fn all_reduce_bucket_async(
        &self,
        b: &B,
        axis: MeshAxis,
        xs: &[(B::Storage, usize)],
        op: ReduceKind,
    ) -> Result<Pending<Vec<B::Storage>>> {
        // Each member sums its slice of the bucket straight from the members' buffers, and
        // every member takes the summed buffers as they are: one shared buffer per gradient
        // for the whole group (only one cut by a slice boundary is put together), no
        // concatenated copy of the bucket (the bits are those of the flat all-reduce).
        let n = self.group(axis).2;
        let total: usize = xs.iter().map(|x| x.1).sum();
        let dt = xs.first().map(|(s, _)| self.backend.storage_dtype(s));
        let one_float = matches!(dt, Some(DType::F32 | DType::F64))
            && xs.iter().all(|(s, _)| Some(self.backend.storage_dtype(s)) == dt);
        if n == 1 || xs.len() < 2 || total < SPLIT_REDUCE_MIN || !one_float {
            return all_reduce_flat(self, b, axis, xs, op);
        }
        Ok(Pending::ready(self.reduce_bucket(axis, xs, total, op)))
    }
    fn all_gather(&self, axis: MeshAxis, x: &B::Storage) -> Result<B::Storage> {
        let (parts, _) = self.swap(axis, CollectiveKind::AllGather, x)?;
        self.backend.upload_owned(concat_all(&parts))
    }
    fn reduce_scatter(&self, axis: MeshAxis, x: &B::Storage) -> Result<B::Storage> {
        let n = self.hub.mesh.axis_size(axis);
        let (parts, idx) = self.swap(axis, CollectiveKind::ReduceScatter, x)?;
        if parts[0].len() % n != 0 {
            return Err(Error::Collective {
                op: "reduce_scatter",
                rank: self.rank,
                msg: format!("{} elements do not split into {n} equal chunks", parts[0].len()),
            });
        }
        let mine: Vec<Arc<HostData>> = parts.iter().map(|p| Arc::new(chunk(p, idx, n))).collect();
        self.backend.upload_owned(reduce_all(&mine, ReduceKind::Sum))
    }
    fn broadcast(&self, axis: MeshAxis, x: &B::Storage, root: usize) -> Result<B::Storage> {
        let (parts, _) = self.swap(axis, CollectiveKind::Broadcast, x)?;
        let p = parts.get(root).ok_or_else(|| Error::Collective {
            op: "broadcast",
            rank: self.rank,
            msg: format!("root {root} is outside a group of {}", parts.len()),
        })?;
        self.backend.upload(p)
    }
    fn all_to_all(&self, axis: MeshAxis, x: &B::Storage, send: &[usize], recv: &[usize]) -> Result<B::Storage> {
        // each member deposits its buffer cut into one piece per member, and takes the
        // pieces addressed to it, in member order
        let (key, idx, n) = self.group(axis);
        let h = self.backend.download_shared(x)?;
        let err = |msg: String| Error::Collective { op: "all_to_all", rank: self.rank, msg };
        if send.len() != n || recv.len() != n || send.iter().sum::<usize>() != h.len() {
            return Err(err(format!(
                "{} elements with send counts {send:?} and receive counts {recv:?} in a group of {n}",
                h.len()
            )));
        }
        let mut off = 0;
        let pieces: Deposit = send
            .iter()
            .map(|&c| {
                off += c;
                Arc::new(h.range(off - c, c))
            })
            .collect();
        drop(h);
        let members = self.hub.exchange_as(self.rank, key, idx, n, (CollectiveKind::AllToAll, n, n), pieces)?;
        let mine: Vec<Arc<HostData>> = members.iter().map(|m| m[idx].clone()).collect();
        drop(members);
        if let Some(j) = (0..n).find(|&j| mine[j].len() != recv[j]) {
            let msg = format!("member {j} sent {} elements to this one, which expected {}", mine[j].len(), recv[j]);
            self.hub.fail(format!("rank {}: {msg}", self.rank));
            return Err(err(msg));
        }
        self.backend.upload_owned(concat_all(&mine))
    }
    fn barrier(&self) -> Result<()> {
        let g = &self.groups[2];
        self.hub.exchange(
            self.rank,
            g.id(),
            g.key,
            g.size(),
            CollectiveKind::Barrier,
            Arc::new(HostData::U8(vec![])),
        )?;
        Ok(())
    }
}
