//! The watchdog: every process posts a heartbeat (its call count per group and the call it
//! is in) to the bootstrap store twice a second; a collective that passes its deadline
//! reads its group's heartbeats to name the member that never arrived, then aborts the job.
//!
//! MPI itself never notices a rank that stalls (only one that dies), so without this a
//! stalled rank would hang every other rank forever.

use redco_core::runtime::store::{Store, TcpStore};
use redco_core::runtime::{CollectiveKind, GroupAxis, ProcessGroup};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// How often a process posts its heartbeat.
const PERIOD: Duration = Duration::from_millis(500);
/// A heartbeat older than this (five periods) means the process is gone or frozen.
const STALE: Duration = Duration::from_millis(2500);

fn slot(axis: GroupAxis) -> usize {
    match axis {
        GroupAxis::Axis(a) => a as usize,
        GroupAxis::Mesh => 2,
    }
}

fn axis_name(i: usize) -> &'static str {
    ["dp", "mp", "mesh"][i]
}

/// Which collective a process is in.
#[derive(Clone, Copy)]
struct Current {
    kind: CollectiveKind,
    group: usize,
    seq: u64,
}

/// This process's collective calls: how many it entered per group, and the one it is in.
pub(crate) struct Progress {
    rank: usize,
    seq: [AtomicU64; 3],
    current: Mutex<Option<Current>>,
}

impl Progress {
    pub(crate) fn new(rank: usize) -> Self {
        Progress { rank, seq: Default::default(), current: Mutex::new(None) }
    }

    /// A new run: counts start from zero on every process (each opens its run at the same
    /// point of the program).
    pub(crate) fn reset(&self) {
        for s in &self.seq {
            s.store(0, Ordering::SeqCst);
        }
    }

    /// Enters a call on `group`; returns its sequence number there (1-based).
    pub(crate) fn enter(&self, kind: CollectiveKind, group: GroupAxis) -> u64 {
        let g = slot(group);
        let seq = self.seq[g].fetch_add(1, Ordering::SeqCst) + 1;
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Some(Current { kind, group: g, seq });
        seq
    }

    /// Leaves the current call.
    pub(crate) fn leave(&self) {
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    fn encode(&self) -> String {
        let s: Vec<u64> = self.seq.iter().map(|a| a.load(Ordering::SeqCst)).collect();
        let cur = *self.current.lock().unwrap_or_else(|p| p.into_inner());
        let cur = cur.map_or("-".to_string(), |c| format!("{}:{}:{}", kind_name(c.kind), c.group, c.seq));
        format!("{} {} {} {} {}", s[0], s[1], s[2], cur, now_ms())
    }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

pub(crate) fn kind_name(k: CollectiveKind) -> &'static str {
    k.name()
}

fn key(rank: usize) -> String {
    format!("redco/heartbeat/{rank}")
}

/// The thread that posts this process's heartbeat; stops when dropped.
pub(crate) struct Heartbeat {
    stop: Arc<AtomicBool>,
}

impl Heartbeat {
    pub(crate) fn start(store: Arc<TcpStore>, progress: Arc<Progress>) -> Heartbeat {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let spawned = std::thread::Builder::new().name("redco-mpi-heartbeat".into()).spawn(move || {
            while !flag.load(Ordering::Relaxed) {
                // a store that went away (rank 0 exited) ends the heartbeat quietly
                if store.set(&key(progress.rank), progress.encode().as_bytes()).is_err() {
                    break;
                }
                std::thread::sleep(PERIOD);
            }
        });
        if let Err(e) = spawned {
            tracing::warn!("redco-mpi: no heartbeat thread ({e}); a stalled rank will not be named");
        }
        Heartbeat { stop }
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Why `group`'s call `seq` (of `kind`, on this process) has not completed, from the
/// members' heartbeats: who never entered it, who stopped responding.
pub(crate) fn diagnose(store: &dyn Store, me: usize, group: &ProcessGroup, kind: CollectiveKind, seq: u64) -> String {
    let g = slot(group.axis);
    let now = now_ms();
    let mut found = Vec::new();
    for &m in group.members.iter().filter(|&&m| m != me) {
        let Ok(bytes) = store.get(&key(m), Duration::from_secs(1)) else {
            found.push(format!("rank {m} never posted a heartbeat (it did not start, or its host is unreachable)"));
            continue;
        };
        let text = String::from_utf8_lossy(&bytes).to_string();
        let f: Vec<&str> = text.split(' ').collect();
        let (Some(theirs), Some(cur), Some(t)) =
            (f.get(g).and_then(|s| s.parse::<u64>().ok()), f.get(3), f.get(4).and_then(|s| s.parse::<u64>().ok()))
        else {
            found.push(format!("rank {m} posted an unreadable heartbeat {text:?}"));
            continue;
        };
        let age = now.saturating_sub(t) as f64 / 1000.0;
        let doing = match cur.split(':').collect::<Vec<_>>()[..] {
            [k, gi, s] => {
                format!("it is waiting in {k} #{s} over {}", gi.parse::<usize>().map_or("?", |i| axis_name(i.min(2))))
            }
            _ => "it is computing, outside any collective".to_string(),
        };
        if age > STALE.as_secs_f64() {
            found.push(format!(
                "rank {m} is not responding (last heartbeat {age:.1}s ago, when it had made {theirs} calls over {} and {})",
                axis_name(g),
                doing.replacen("it is", "was", 1)
            ));
        } else if theirs < seq {
            found.push(format!(
                "rank {m} never entered this {} (it has made {theirs} calls over {}; {doing})",
                kind_name(kind),
                axis_name(g)
            ));
        }
    }
    if found.is_empty() {
        "every member entered it; the transport itself is stuck".to_string()
    } else {
        found.join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redco_core::runtime::store::MemStore;
    use redco_core::runtime::Mesh;
    use redco_core::MeshAxis;

    fn post(store: &MemStore, p: &Progress, age_ms: u64) {
        let mut text = p.encode();
        // rewrite the time field to make the heartbeat `age_ms` old
        let cut = text.rfind(' ').unwrap();
        text.truncate(cut);
        text.push_str(&format!(" {}", now_ms() - age_ms));
        store.set(&key(p.rank), text.as_bytes()).unwrap();
    }

    #[test]
    fn the_member_behind_and_the_silent_member_are_named() {
        let store = MemStore::new();
        let mesh = Mesh::new(1, 4).unwrap();
        let g = ProcessGroup::along(mesh, 0, MeshAxis::Mp);
        let axis = GroupAxis::Axis(MeshAxis::Mp);
        // rank 1 is in the same call, rank 2 is one call behind (computing), rank 3 is silent
        let ps: Vec<Progress> = (0..4).map(Progress::new).collect();
        for (r, p) in ps.iter().enumerate() {
            let calls = if r == 2 { 4 } else { 5 };
            for _ in 0..calls {
                p.enter(CollectiveKind::AllReduce, axis);
            }
            if r == 2 {
                p.leave();
            }
        }
        post(&store, &ps[1], 100);
        post(&store, &ps[2], 100);
        post(&store, &ps[3], 9_000);
        let why = diagnose(&store, 0, &g, CollectiveKind::AllReduce, 5);
        assert!(!why.contains("rank 1"), "{why}");
        assert!(
            why.contains("rank 2 never entered this all_reduce (it has made 4 calls over mp; it is computing"),
            "{why}"
        );
        assert!(why.contains("rank 3 is not responding (last heartbeat 9.0s ago"), "{why}");
        // a member that never posted
        let fresh = MemStore::new();
        let why = diagnose(&fresh, 0, &g, CollectiveKind::Barrier, 1);
        assert!(why.contains("rank 1 never posted a heartbeat"), "{why}");
    }
}
