//! The bootstrap key-value store: how ranks that are processes exchange their first bytes.
//!
//! Before ranks on different hosts can talk through MPI, NCCL or PJRT, they must agree on a
//! few bytes: an NCCL unique id made by rank 0, the key-value exchange PJRT's distributed
//! runtime asks for, a run id, the marker that shows the workdir is shared. When MPI is there
//! it carries them; otherwise this store does, as torch's `TCPStore` does: rank 0 serves a
//! small key-value table at `MASTER_ADDR:MASTER_PORT` and every rank (rank 0 included)
//! talks to it as a client.
//!
//! The store carries bootstrap bytes only, never tensor data: values are capped at
//! [`MAX_VALUE_LEN`] and keys at [`MAX_KEY_LEN`].
//!
//! - [`Store`] is the seam: `set`, a blocking `get` with a timeout, an atomic `add` counter,
//!   and a `barrier` built on the two;
//! - [`TcpStore`] is the process implementation: a server thread (one thread per connection,
//!   a condition variable for blocking gets, no busy loop) and clients that retry connecting
//!   until the server is up;
//! - [`MemStore`] has the same semantics inside one process, for thread ranks and tests.
//!
//! # Wire protocol
//!
//! Every request is `op: u8`, `key length: u32`, key bytes (UTF-8), `value length: u64`,
//! value bytes; every answer is `status: u8` (ok, timeout, error), `payload length: u64`,
//! payload bytes. Integers are little-endian. A `get` carries its timeout in milliseconds
//! as its value, so the server answers "timeout" itself rather than holding the socket; an
//! `add` carries its delta as an `i64`. The first request on a connection is a handshake
//! that checks the peer is a redco store. Lengths are checked against the limits before
//! anything is allocated; a malformed or truncated request gets an error answer and the
//! connection is closed, the server carries on.
//!
//! The server has no authentication (neither has torch's): it is meant for a cluster's
//! private network, for the few seconds of a run's start.

use crate::{Error, Result};
use std::collections::HashMap;
use std::io::{self, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The longest key the store accepts, in bytes.
pub const MAX_KEY_LEN: usize = 4096;

/// The largest value the store accepts, in bytes (1 MiB): bootstrap bytes, not tensors.
pub const MAX_VALUE_LEN: usize = 1 << 20;

/// How long a [`TcpStore`] client waits for an answer beyond the time an operation itself
/// may take (a `get`'s timeout), unless [`TcpStore::with_io_timeout`] says otherwise.
pub const DEFAULT_IO_TIMEOUT: Duration = Duration::from_secs(30);

/// The key prefix under which [`Store::barrier`] keeps its counters.
const BARRIER_PREFIX: &str = "redco/barrier/";

/// The handshake value: a peer that does not echo it is not a redco store.
const MAGIC: &[u8] = b"redco-store/1";

const OP_HELLO: u8 = 0;
const OP_SET: u8 = 1;
const OP_GET: u8 = 2;
const OP_ADD: u8 = 3;

const ST_OK: u8 = 0;
const ST_TIMEOUT: u8 = 1;
const ST_ERROR: u8 = 2;

/// A key-value store for bootstrap bytes, shared by every rank of a run.
///
/// Keys are strings, values are byte strings. Every rank sees every `set` (last write wins);
/// `get` blocks until the key exists; `add` is an atomic counter. Implementations are
/// [`TcpStore`] (ranks are processes) and [`MemStore`] (ranks are threads).
pub trait Store: Send + Sync {
    /// Sets `key` to `value`, replacing any earlier value, and wakes every rank waiting on
    /// it. Fails for a key longer than [`MAX_KEY_LEN`] or a value longer than
    /// [`MAX_VALUE_LEN`].
    fn set(&self, key: &str, value: &[u8]) -> Result<()>;

    /// The value of `key`, waiting until some rank sets it or `timeout` passes. The timeout
    /// error names the key, the store's address and the time waited.
    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>>;

    /// Adds `delta` to the counter at `key` (a missing key counts as 0) and returns the new
    /// value, atomically: of `n` ranks adding 1, each gets a different value in `1..=n`.
    /// `add(key, 0)` reads a counter. A counter is stored as its decimal text, so `get`
    /// reads it too; `add` on a key that holds something else fails.
    fn add(&self, key: &str, delta: i64) -> Result<i64>;

    /// Waits until `world_size` ranks have called `barrier` with this `name`, or `timeout`
    /// passes (the error says how many arrived).
    ///
    /// Built on [`add`](Store::add) and [`get`](Store::get). A name serves one barrier:
    /// pass a distinct name for each use (`"init"`, `"ckpt/step-100"`, ...); a name used by
    /// more than `world_size` calls is an error.
    fn barrier(&self, name: &str, world_size: usize, timeout: Duration) -> Result<()> {
        if world_size == 0 {
            return Err(Error::invalid("store.barrier", format!("barrier `{name}`: the world size is 0")));
        }
        let start = Instant::now();
        let arrived_key = format!("{BARRIER_PREFIX}{name}/arrived");
        let done_key = format!("{BARRIER_PREFIX}{name}/done");
        let world = i64::try_from(world_size).unwrap_or(i64::MAX);
        let n = self.add(&arrived_key, 1)?;
        if n > world {
            return Err(Error::invalid(
                "store.barrier",
                format!(
                    "barrier `{name}`: {n} arrivals for a world of {world_size} (a barrier name used twice, \
                     or ranks that disagree on the world size)"
                ),
            ));
        }
        if n == world {
            self.set(&done_key, b"1")?;
        }
        match self.get(&done_key, timeout.saturating_sub(start.elapsed())) {
            Ok(_) => Ok(()),
            Err(e) => {
                let arrived = self.add(&arrived_key, 0).map_or_else(|_| "?".to_string(), |n| n.to_string());
                Err(Error::invalid(
                    "store.barrier",
                    format!(
                        "barrier `{name}`: {arrived} of {world_size} ranks arrived within {}: {e}",
                        fmt_duration(timeout)
                    ),
                ))
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// The table both stores share: a map, a condition variable, a closed flag.
// ---------------------------------------------------------------------------------------

/// What a blocking read of the table came to.
enum Wait {
    Found(Vec<u8>),
    TimedOut,
    Closed,
}

#[derive(Default)]
struct Table {
    map: Mutex<HashMap<String, Vec<u8>>>,
    cv: Condvar,
    closed: AtomicBool,
}

impl Table {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, Vec<u8>>> {
        // The map is never left half-updated, so a panic elsewhere does not poison it.
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set(&self, key: &str, value: &[u8]) {
        self.lock().insert(key.to_owned(), value.to_vec());
        self.cv.notify_all();
    }

    fn add(&self, key: &str, delta: i64) -> std::result::Result<i64, String> {
        let mut map = self.lock();
        let current = match map.get(key) {
            None => 0,
            Some(v) => parse_counter(v)
                .ok_or_else(|| format!("key `{key}` holds a {}-byte value that is not a counter", v.len()))?,
        };
        let new =
            current.checked_add(delta).ok_or_else(|| format!("counter `{key}` overflows: {current} + {delta}"))?;
        map.insert(key.to_owned(), new.to_string().into_bytes());
        drop(map);
        self.cv.notify_all();
        Ok(new)
    }

    fn wait(&self, key: &str, timeout: Duration) -> Wait {
        let deadline = Instant::now().checked_add(timeout);
        let mut map = self.lock();
        loop {
            if let Some(v) = map.get(key) {
                return Wait::Found(v.clone());
            }
            if self.closed.load(Ordering::SeqCst) {
                return Wait::Closed;
            }
            map = match deadline {
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Wait::TimedOut;
                    }
                    self.cv.wait_timeout(map, deadline - now).unwrap_or_else(PoisonError::into_inner).0
                }
                None => self.cv.wait(map).unwrap_or_else(PoisonError::into_inner),
            };
        }
    }

    /// Wakes every waiter for good: they answer "closed" instead of waiting on.
    fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        // Taking the lock orders the flag before any waiter's next check.
        drop(self.lock());
        self.cv.notify_all();
    }
}

fn parse_counter(v: &[u8]) -> Option<i64> {
    std::str::from_utf8(v).ok()?.parse().ok()
}

fn check_key(op: &'static str, key: &str) -> Result<()> {
    if key.len() > MAX_KEY_LEN {
        return Err(Error::invalid(
            op,
            format!("key of {} bytes is over the store's limit of {MAX_KEY_LEN} bytes", key.len()),
        ));
    }
    Ok(())
}

fn check_value(op: &'static str, key: &str, value: &[u8]) -> Result<()> {
    if value.len() > MAX_VALUE_LEN {
        return Err(Error::invalid(
            op,
            format!(
                "value of {} bytes for key `{key}` is over the store's limit of {MAX_VALUE_LEN} bytes \
                 (the bootstrap store carries bootstrap bytes, not tensors)",
                value.len()
            ),
        ));
    }
    Ok(())
}

fn timeout_error(key: &str, at: &str, timeout: Duration, waited: Duration) -> Error {
    Error::invalid(
        "store.get",
        format!(
            "key `{key}` was not set within {} (waited {} on the store at {at})",
            fmt_duration(timeout),
            fmt_duration(waited)
        ),
    )
}

fn fmt_duration(d: Duration) -> String {
    if d >= Duration::from_secs(1) {
        format!("{:.2}s", d.as_secs_f64())
    } else {
        format!("{}ms", d.as_millis())
    }
}

fn local_get(table: &Table, key: &str, timeout: Duration, at: &str) -> Result<Vec<u8>> {
    check_key("store.get", key)?;
    let start = Instant::now();
    match table.wait(key, timeout) {
        Wait::Found(v) => Ok(v),
        Wait::TimedOut => Err(timeout_error(key, at, timeout, start.elapsed())),
        Wait::Closed => {
            Err(Error::invalid("store.get", format!("the store at {at} was shut down while waiting for `{key}`")))
        }
    }
}

fn local_add(table: &Table, key: &str, delta: i64) -> Result<i64> {
    check_key("store.add", key)?;
    table.add(key, delta).map_err(|msg| Error::invalid("store.add", msg))
}

// ---------------------------------------------------------------------------------------
// MemStore
// ---------------------------------------------------------------------------------------

/// An in-process [`Store`]: the same semantics as [`TcpStore`], for ranks that are threads
/// and for tests. Clones share one table.
#[derive(Clone, Default)]
pub struct MemStore {
    table: Arc<Table>,
}

impl MemStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
}

impl std::fmt::Debug for MemStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemStore").field("keys", &self.table.lock().len()).finish()
    }
}

impl Store for MemStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        check_key("store.set", key)?;
        check_value("store.set", key, value)?;
        self.table.set(key, value);
        Ok(())
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        local_get(&self.table, key, timeout, "in-process")
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        local_add(&self.table, key, delta)
    }
}

mod client;
mod server;
mod tcp;
#[cfg(test)]
mod tests;
mod wire;

pub use tcp::TcpStore;
