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

// ---------------------------------------------------------------------------------------
// Wire format
// ---------------------------------------------------------------------------------------

fn encode_request(op: u8, key: &[u8], value: &[u8]) -> Vec<u8> {
    let mut buf = Vec::with_capacity(1 + 4 + key.len() + 8 + value.len());
    buf.push(op);
    buf.extend_from_slice(&(key.len() as u32).to_le_bytes());
    buf.extend_from_slice(key);
    buf.extend_from_slice(&(value.len() as u64).to_le_bytes());
    buf.extend_from_slice(value);
    buf
}

fn encode_response(status: u8, payload: &[u8]) -> Vec<u8> {
    let mut buf = Vec::with_capacity(1 + 8 + payload.len());
    buf.push(status);
    buf.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    buf.extend_from_slice(payload);
    buf
}

fn read_array<const N: usize>(r: &mut impl Read) -> io::Result<[u8; N]> {
    let mut a = [0u8; N];
    r.read_exact(&mut a)?;
    Ok(a)
}

/// Reads exactly `len` bytes; `len` must already be checked against a limit. The buffer
/// grows as bytes arrive, so a peer that lies about a length costs nothing.
fn read_bytes(r: &mut impl Read, len: usize) -> io::Result<Vec<u8>> {
    let mut v = Vec::new();
    r.take(len as u64).read_to_end(&mut v)?;
    if v.len() != len {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("message cut short: {} of {len} bytes", v.len()),
        ));
    }
    Ok(v)
}

struct Request {
    op: u8,
    key: String,
    value: Vec<u8>,
}

enum BadRequest {
    /// The peer closed the connection between requests.
    Closed,
    /// The socket failed (or the request was cut short).
    Io(io::Error),
    /// The request breaks the protocol; the string says how.
    Malformed(String),
}

impl From<io::Error> for BadRequest {
    fn from(e: io::Error) -> Self {
        BadRequest::Io(e)
    }
}

fn read_request(r: &mut impl Read) -> std::result::Result<Request, BadRequest> {
    let [op] = match read_array::<1>(r) {
        Ok(op) => op,
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(BadRequest::Closed),
        Err(e) => return Err(BadRequest::Io(e)),
    };
    if !matches!(op, OP_HELLO | OP_SET | OP_GET | OP_ADD) {
        return Err(BadRequest::Malformed(format!("unknown op {op}")));
    }
    let key_len = u32::from_le_bytes(read_array(r)?) as usize;
    if key_len > MAX_KEY_LEN {
        return Err(BadRequest::Malformed(format!("key of {key_len} bytes is over the limit of {MAX_KEY_LEN}")));
    }
    let key = String::from_utf8(read_bytes(r, key_len)?)
        .map_err(|_| BadRequest::Malformed("key is not UTF-8".to_string()))?;
    let value_len = u64::from_le_bytes(read_array(r)?);
    let (limit, exact) = match op {
        OP_HELLO => (64, false),
        OP_SET => (MAX_VALUE_LEN as u64, false),
        _ => (8, true), // get: timeout in ms; add: delta
    };
    if value_len > limit || (exact && value_len != limit) {
        return Err(BadRequest::Malformed(format!(
            "op {op}: value of {value_len} bytes (the limit is {limit}{})",
            if exact { ", exactly" } else { "" }
        )));
    }
    let value = read_bytes(r, value_len as usize)?;
    Ok(Request { op, key, value })
}

fn read_response(r: &mut impl Read) -> io::Result<(u8, Vec<u8>)> {
    let [status] = read_array::<1>(r)?;
    if !matches!(status, ST_OK | ST_TIMEOUT | ST_ERROR) {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("not a store answer (status byte {status})")));
    }
    let len = u64::from_le_bytes(read_array(r)?);
    if len > MAX_VALUE_LEN as u64 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("answer of {len} bytes is over the limit of {MAX_VALUE_LEN}"),
        ));
    }
    Ok((status, read_bytes(r, len as usize)?))
}

// ---------------------------------------------------------------------------------------
// Server
// ---------------------------------------------------------------------------------------

/// The serving half of a [`TcpStore`]: a listener thread and one thread per connection,
/// all stopped when it is dropped.
struct Server {
    table: Arc<Table>,
    local: SocketAddr,
    conns: Arc<Mutex<HashMap<u64, TcpStream>>>,
    accept: Option<JoinHandle<()>>,
}

impl Server {
    fn bind(addr: SocketAddr) -> Result<Server> {
        let listener = TcpListener::bind(addr).map_err(|e| {
            Error::invalid("store.server", format!("cannot listen on {addr}: {e} (is another run using this port?)"))
        })?;
        let local = listener
            .local_addr()
            .map_err(|e| Error::invalid("store.server", format!("cannot read the address bound for {addr}: {e}")))?;
        let table = Arc::new(Table::default());
        let conns = Arc::new(Mutex::new(HashMap::new()));
        let accept = {
            let (table, conns) = (Arc::clone(&table), Arc::clone(&conns));
            std::thread::Builder::new()
                .name("redco-store".into())
                .spawn(move || accept_loop(&listener, &table, &conns))
                .map_err(|e| Error::invalid("store.server", format!("cannot start the server thread: {e}")))?
        };
        tracing::debug!(addr = %local, "bootstrap store serving");
        Ok(Server { table, local, conns, accept: Some(accept) })
    }
}

fn lock_conns(conns: &Mutex<HashMap<u64, TcpStream>>) -> MutexGuard<'_, HashMap<u64, TcpStream>> {
    conns.lock().unwrap_or_else(PoisonError::into_inner)
}

fn accept_loop(listener: &TcpListener, table: &Arc<Table>, conns: &Arc<Mutex<HashMap<u64, TcpStream>>>) {
    let next_id = AtomicU64::new(0);
    for incoming in listener.incoming() {
        if table.closed.load(Ordering::SeqCst) {
            break;
        }
        let stream = match incoming {
            Ok(s) => s,
            Err(e) => {
                // Out of file descriptors and the like: wait a little rather than spin.
                tracing::warn!(error = %e, "bootstrap store: accept failed");
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
        };
        let peer = stream.peer_addr().map_or_else(|_| "?".to_string(), |a| a.to_string());
        let id = next_id.fetch_add(1, Ordering::Relaxed);
        match stream.try_clone() {
            Ok(clone) => {
                lock_conns(conns).insert(id, clone);
            }
            Err(e) => {
                tracing::warn!(error = %e, %peer, "bootstrap store: cannot track a connection; dropping it");
                continue;
            }
        }
        // Checked after registering: a shutdown that swept the registry before the insert
        // has set the flag before its sweep.
        if table.closed.load(Ordering::SeqCst) {
            let _ = stream.shutdown(Shutdown::Both);
            break;
        }
        let (table, conns_for_thread) = (Arc::clone(table), Arc::clone(conns));
        let spawned = std::thread::Builder::new().name("redco-store-conn".into()).spawn(move || {
            serve_connection(&table, stream, &peer);
            lock_conns(&conns_for_thread).remove(&id);
        });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "bootstrap store: cannot start a connection thread");
            if let Some(s) = lock_conns(conns).remove(&id) {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }
}

fn serve_connection(table: &Table, stream: TcpStream, peer: &str) {
    let _ = stream.set_nodelay(true);
    let _ = stream.set_write_timeout(Some(DEFAULT_IO_TIMEOUT));
    let mut reader = match stream.try_clone() {
        Ok(s) => BufReader::new(s),
        Err(_) => return,
    };
    let mut writer = stream;
    loop {
        let req = match read_request(&mut reader) {
            Ok(req) => req,
            Err(BadRequest::Closed) => return,
            Err(BadRequest::Io(e)) => {
                if !table.closed.load(Ordering::SeqCst) {
                    tracing::debug!(error = %e, peer, "bootstrap store: connection dropped");
                }
                return;
            }
            Err(BadRequest::Malformed(msg)) => {
                tracing::warn!(peer, "bootstrap store: closing a connection that sent a malformed request: {msg}");
                let _ = writer.write_all(&encode_response(ST_ERROR, format!("malformed request: {msg}").as_bytes()));
                return;
            }
        };
        let (answer, keep) = match req.op {
            OP_HELLO if req.value == MAGIC => (encode_response(ST_OK, MAGIC), true),
            OP_HELLO => (encode_response(ST_ERROR, b"handshake: not a redco store client"), false),
            OP_SET => {
                table.set(&req.key, &req.value);
                (encode_response(ST_OK, &[]), true)
            }
            OP_GET => {
                let ms = u64::from_le_bytes(req.value.as_slice().try_into().unwrap_or([0; 8]));
                match table.wait(&req.key, Duration::from_millis(ms)) {
                    Wait::Found(v) => (encode_response(ST_OK, &v), true),
                    Wait::TimedOut => (encode_response(ST_TIMEOUT, &[]), true),
                    Wait::Closed => (encode_response(ST_ERROR, b"the store is shutting down"), false),
                }
            }
            _ => {
                let delta = i64::from_le_bytes(req.value.as_slice().try_into().unwrap_or([0; 8]));
                match table.add(&req.key, delta) {
                    Ok(n) => (encode_response(ST_OK, &n.to_le_bytes()), true),
                    Err(msg) => (encode_response(ST_ERROR, msg.as_bytes()), true),
                }
            }
        };
        if writer.write_all(&answer).is_err() || !keep {
            return;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.table.close();
        for (_, s) in lock_conns(&self.conns).drain() {
            let _ = s.shutdown(Shutdown::Both);
        }
        // Wake the listener blocked in `accept` so it sees the flag and lets the port go.
        let wake = match self.local.ip() {
            IpAddr::V4(ip) if ip.is_unspecified() => SocketAddr::new(Ipv4Addr::LOCALHOST.into(), self.local.port()),
            IpAddr::V6(ip) if ip.is_unspecified() => SocketAddr::new(Ipv6Addr::LOCALHOST.into(), self.local.port()),
            _ => self.local,
        };
        let woke = TcpStream::connect_timeout(&wake, Duration::from_secs(1)).is_ok();
        if let Some(handle) = self.accept.take() {
            if woke {
                let _ = handle.join();
            } else {
                tracing::warn!(addr = %self.local, "bootstrap store: could not wake the listener; leaving its thread");
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Client
// ---------------------------------------------------------------------------------------

/// The talking half of a [`TcpStore`]: a pool of connections to the server, so that a
/// thread blocked in `get` does not hold up another thread's `set` on the same handle.
struct Client {
    addr: SocketAddr,
    io_timeout: Duration,
    pool: Mutex<Vec<TcpStream>>,
}

impl Client {
    /// Connects to `addr`, retrying until `timeout` (the server may not be up yet).
    fn open(addr: SocketAddr, io_timeout: Duration, timeout: Duration) -> Result<TcpStream> {
        let start = Instant::now();
        let mut pause = Duration::from_millis(10);
        loop {
            let left = timeout.saturating_sub(start.elapsed()).max(Duration::from_millis(1));
            let err = match TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(5))) {
                Ok(stream) => match handshake(&stream, left.min(io_timeout)) {
                    Ok(()) => {
                        let _ = stream.set_write_timeout(Some(io_timeout));
                        return Ok(stream);
                    }
                    Err(e) => format!("handshake failed: {e}"),
                },
                Err(e) => e.to_string(),
            };
            let left = timeout.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Err(Error::invalid(
                    "store.connect",
                    format!(
                        "could not reach the bootstrap store at {addr} within {} ({err}; is rank 0 up, \
                         and are MASTER_ADDR and MASTER_PORT right?)",
                        fmt_duration(timeout)
                    ),
                ));
            }
            std::thread::sleep(pause.min(left));
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }

    fn take(&self) -> Result<TcpStream> {
        let pooled = self.pool.lock().unwrap_or_else(PoisonError::into_inner).pop();
        match pooled {
            Some(s) => Ok(s),
            None => Client::open(self.addr, self.io_timeout, self.io_timeout),
        }
    }

    fn put_back(&self, stream: TcpStream) {
        self.pool.lock().unwrap_or_else(PoisonError::into_inner).push(stream);
    }

    /// One request and its answer: the payload, or `None` when the server answered
    /// "timeout". `wait` is how long the server may take by design (a `get`'s timeout);
    /// the client gives up `io_timeout` after that.
    fn call(&self, op_name: &'static str, op: u8, key: &str, value: &[u8], wait: Duration) -> Result<Option<Vec<u8>>> {
        let mut stream = self.take()?;
        let patience = wait.saturating_add(self.io_timeout).max(Duration::from_millis(1));
        let exchange = stream
            .set_read_timeout(Some(patience))
            .and_then(|()| stream.write_all(&encode_request(op, key.as_bytes(), value)))
            .and_then(|()| read_response(&mut stream));
        let (status, payload) = exchange.map_err(|e| {
            // The connection may hold half an answer: it is dropped, not pooled.
            let msg = if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) {
                format!(
                    "the bootstrap store at {} did not answer within {} (is rank 0 alive?)",
                    self.addr,
                    fmt_duration(patience)
                )
            } else {
                format!("lost the connection to the bootstrap store at {}: {e}", self.addr)
            };
            Error::invalid(op_name, msg)
        })?;
        match status {
            ST_OK => {
                self.put_back(stream);
                Ok(Some(payload))
            }
            ST_TIMEOUT => {
                self.put_back(stream);
                Ok(None)
            }
            _ => Err(Error::invalid(
                op_name,
                format!("the bootstrap store at {} refused: {}", self.addr, String::from_utf8_lossy(&payload)),
            )),
        }
    }
}

fn unexpected_timeout(op: &'static str, addr: SocketAddr) -> Error {
    Error::invalid(op, format!("the bootstrap store at {addr} answered \"timeout\" to a call that does not wait"))
}

fn handshake(mut stream: &TcpStream, patience: Duration) -> io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(patience.max(Duration::from_millis(1))))?;
    stream.write_all(&encode_request(OP_HELLO, &[], MAGIC))?;
    match read_response(&mut stream)? {
        (ST_OK, echo) if echo == MAGIC => Ok(()),
        (_, payload) => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("the peer is not a redco store ({})", String::from_utf8_lossy(&payload)),
        )),
    }
}

// ---------------------------------------------------------------------------------------
// TcpStore
// ---------------------------------------------------------------------------------------

/// How a [`TcpStore`] handle reaches the table.
enum Access {
    /// The handle serves and reads its own table directly.
    Local(Arc<Table>),
    /// The handle talks to a server over TCP.
    Remote(Client),
}

/// The [`Store`] for ranks that are processes: rank 0 serves the table over TCP, every rank
/// talks to it.
///
/// A handle is a server ([`TcpStore::server`]), a client ([`TcpStore::connect`]), or both
/// (rank 0 from [`TcpStore::from_env`]). A serving handle's server lives as long as the
/// handle: dropping it closes the listener and every connection, and fails the gets still
/// waiting. A handle may be shared between threads; each concurrent call uses its own
/// connection.
pub struct TcpStore {
    // Declared before `server`: a handle that is both closes its client connections first.
    access: Access,
    server: Option<Server>,
}

impl TcpStore {
    /// Serves an empty table at `addr` (port 0 picks a free port: see
    /// [`local_addr`](TcpStore::local_addr)). The listener and each connection run on
    /// background threads; the handle's own calls read the table directly.
    pub fn server(addr: SocketAddr) -> Result<TcpStore> {
        let server = Server::bind(addr)?;
        Ok(TcpStore { access: Access::Local(Arc::clone(&server.table)), server: Some(server) })
    }

    /// Connects to the store served at `addr`, retrying until `timeout`: a rank may start
    /// before rank 0's server is up. Fails within `timeout` when nobody answers.
    pub fn connect(addr: SocketAddr, timeout: Duration) -> Result<TcpStore> {
        let client = Client { addr, io_timeout: DEFAULT_IO_TIMEOUT, pool: Mutex::new(Vec::new()) };
        client.put_back(Client::open(addr, client.io_timeout, timeout)?);
        Ok(TcpStore { access: Access::Remote(client), server: None })
    }

    /// The torchrun convention: reads `MASTER_ADDR` and `MASTER_PORT` and calls
    /// [`rendezvous`](TcpStore::rendezvous). Rank 0 serves on every interface at
    /// `MASTER_PORT` and connects to itself; the other ranks connect to
    /// `MASTER_ADDR:MASTER_PORT`, waiting up to `timeout` for it.
    pub fn from_env(rank: usize, timeout: Duration) -> Result<TcpStore> {
        let var = |name: &str| {
            std::env::var(name).map_err(|_| {
                Error::invalid(
                    "store.from_env",
                    format!("{name} is not set (the launcher sets MASTER_ADDR and MASTER_PORT)"),
                )
            })
        };
        let host = var("MASTER_ADDR")?;
        let port_text = var("MASTER_PORT")?;
        let port = port_text
            .trim()
            .parse::<u16>()
            .map_err(|_| Error::invalid("store.from_env", format!("MASTER_PORT `{port_text}` is not a port number")))?;
        TcpStore::rendezvous(rank, &host, port, timeout)
    }

    /// [`from_env`](TcpStore::from_env) with the address given: rank 0 binds
    /// `0.0.0.0:port` (`[::]:port` when `host` is an IPv6 literal) and connects to it
    /// through loopback; other ranks resolve `host` (preferring IPv4, retrying while the
    /// name does not resolve) and connect, all within `timeout`.
    pub fn rendezvous(rank: usize, host: &str, port: u16, timeout: Duration) -> Result<TcpStore> {
        let bare = host.trim().trim_start_matches('[').trim_end_matches(']');
        let v6 = bare.parse::<Ipv6Addr>().is_ok();
        if rank == 0 {
            let (any, loopback): (IpAddr, IpAddr) = if v6 {
                (Ipv6Addr::UNSPECIFIED.into(), Ipv6Addr::LOCALHOST.into())
            } else {
                (Ipv4Addr::UNSPECIFIED.into(), Ipv4Addr::LOCALHOST.into())
            };
            let server = Server::bind(SocketAddr::new(any, port))?;
            let addr = SocketAddr::new(loopback, server.local.port());
            let client = Client { addr, io_timeout: DEFAULT_IO_TIMEOUT, pool: Mutex::new(Vec::new()) };
            client.put_back(Client::open(addr, client.io_timeout, timeout)?);
            return Ok(TcpStore { access: Access::Remote(client), server: Some(server) });
        }
        TcpStore::connect_to(bare, port, v6, timeout)
    }

    /// Connects to the store served at `host:port` (`[v6-literal]:port` for IPv6), resolving
    /// the name (preferring IPv4, retrying while it does not resolve) and retrying the
    /// connection, all within `timeout`.
    pub fn connect_host(host_port: &str, timeout: Duration) -> Result<TcpStore> {
        let text = host_port.trim();
        let (host, port) = text
            .rsplit_once(':')
            .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
            .ok_or_else(|| Error::invalid("store.connect", format!("`{text}` is not host:port")))?;
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        TcpStore::connect_to(bare, port, bare.parse::<Ipv6Addr>().is_ok(), timeout)
    }

    /// Attaches a client handle to this serving handle: the result serves as `self` did
    /// and makes its calls through `client`, as rank 0 does when it reaches its own server
    /// the way the other ranks do. `client` should be a client-only handle (from
    /// [`connect`](TcpStore::connect) or [`connect_host`](TcpStore::connect_host)); a
    /// server it holds is dropped. On a handle that does not serve, this is `client`.
    pub fn with_client(self, client: TcpStore) -> TcpStore {
        match self.server {
            Some(server) => TcpStore { access: client.access, server: Some(server) },
            None => client,
        }
    }

    fn connect_to(host: &str, port: u16, prefer_v6: bool, timeout: Duration) -> Result<TcpStore> {
        let start = Instant::now();
        let addr = loop {
            let resolved = (host, port).to_socket_addrs().map(|it| it.collect::<Vec<_>>());
            let err = match resolved {
                Ok(addrs) => match addrs.iter().find(|a| a.is_ipv6() == prefer_v6).or(addrs.first()) {
                    Some(a) => break *a,
                    None => "it resolves to no address".to_string(),
                },
                Err(e) => e.to_string(),
            };
            let left = timeout.saturating_sub(start.elapsed());
            if left.is_zero() {
                return Err(Error::invalid(
                    "store.connect",
                    format!("cannot resolve the store's host `{host}` within {}: {err}", fmt_duration(timeout)),
                ));
            }
            std::thread::sleep(left.min(Duration::from_millis(200)));
        };
        TcpStore::connect(addr, timeout.saturating_sub(start.elapsed()))
    }

    /// Sets how long a client waits for an answer beyond an operation's own time (a `get`'s
    /// timeout) before it calls the server dead; [`DEFAULT_IO_TIMEOUT`] unless set. No
    /// effect on a handle that only serves.
    pub fn with_io_timeout(mut self, io_timeout: Duration) -> TcpStore {
        if let Access::Remote(client) = &mut self.access {
            client.io_timeout = io_timeout;
        }
        self
    }

    /// The store's address: for a serving handle, the address its listener is bound to
    /// (with the real port when it asked for port 0); for a client, the server it talks to.
    pub fn local_addr(&self) -> SocketAddr {
        match (&self.server, &self.access) {
            (Some(server), _) => server.local,
            (None, Access::Remote(client)) => client.addr,
            // Not constructed: a handle without a server reaches one remotely.
            (None, Access::Local(_)) => SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), 0),
        }
    }

    /// Whether this handle serves the table (rank 0).
    pub fn is_server(&self) -> bool {
        self.server.is_some()
    }

    fn at(&self) -> String {
        self.local_addr().to_string()
    }
}

impl std::fmt::Debug for TcpStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpStore").field("addr", &self.local_addr()).field("server", &self.is_server()).finish()
    }
}

impl Store for TcpStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        check_key("store.set", key)?;
        check_value("store.set", key, value)?;
        match &self.access {
            Access::Local(table) => {
                table.set(key, value);
                Ok(())
            }
            Access::Remote(client) => match client.call("store.set", OP_SET, key, value, Duration::ZERO)? {
                Some(_) => Ok(()),
                None => Err(unexpected_timeout("store.set", client.addr)),
            },
        }
    }

    fn get(&self, key: &str, timeout: Duration) -> Result<Vec<u8>> {
        match &self.access {
            Access::Local(table) => local_get(table, key, timeout, &self.at()),
            Access::Remote(client) => {
                check_key("store.get", key)?;
                let start = Instant::now();
                let ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
                client
                    .call("store.get", OP_GET, key, &ms.to_le_bytes(), timeout)?
                    .ok_or_else(|| timeout_error(key, &self.at(), timeout, start.elapsed()))
            }
        }
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        match &self.access {
            Access::Local(table) => local_add(table, key, delta),
            Access::Remote(client) => {
                check_key("store.add", key)?;
                let payload = client
                    .call("store.add", OP_ADD, key, &delta.to_le_bytes(), Duration::ZERO)?
                    .ok_or_else(|| unexpected_timeout("store.add", client.addr))?;
                let bytes: [u8; 8] = payload.as_slice().try_into().map_err(|_| {
                    Error::invalid(
                        "store.add",
                        format!("the store at {} answered {} bytes, not 8", client.addr, payload.len()),
                    )
                })?;
                Ok(i64::from_le_bytes(bytes))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    const WAIT: Duration = Duration::from_secs(10);

    fn loopback0() -> SocketAddr {
        SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 0)
    }

    fn serve() -> (TcpStore, SocketAddr) {
        let server = TcpStore::server(loopback0()).unwrap();
        let addr = server.local_addr();
        assert_ne!(addr.port(), 0);
        (server, addr)
    }

    /// A port that nothing listens on (bound, read, released).
    fn free_port() -> u16 {
        TcpListener::bind(loopback0()).unwrap().local_addr().unwrap().port()
    }

    fn err_text<T: std::fmt::Debug>(r: Result<T>) -> String {
        r.unwrap_err().to_string()
    }

    #[test]
    fn set_get_across_threads_over_tcp() {
        let (server, addr) = serve();
        let writer = std::thread::spawn(move || {
            let c = TcpStore::connect(addr, WAIT).unwrap();
            c.set("nccl/id", b"\x00\x01\x02unique").unwrap();
            c.set("big", &vec![7u8; MAX_VALUE_LEN]).unwrap();
        });
        let reader = TcpStore::connect(addr, WAIT).unwrap();
        assert_eq!(reader.get("nccl/id", WAIT).unwrap(), b"\x00\x01\x02unique");
        assert_eq!(reader.get("big", WAIT).unwrap(), vec![7u8; MAX_VALUE_LEN]);
        writer.join().unwrap();
        // The serving handle reads its own table, and its sets reach the clients.
        assert_eq!(server.get("nccl/id", WAIT).unwrap(), b"\x00\x01\x02unique");
        server.set("run/id", b"r-42").unwrap();
        assert_eq!(reader.get("run/id", WAIT).unwrap(), b"r-42");
        // Last write wins; an empty value is a value.
        reader.set("run/id", b"").unwrap();
        assert_eq!(server.get("run/id", WAIT).unwrap(), b"");
        assert!(server.is_server() && !reader.is_server());
        assert_eq!(reader.local_addr(), addr);
    }

    #[test]
    fn blocking_get_is_satisfied_later() {
        let (_server, addr) = serve();
        let waiter = std::thread::spawn(move || {
            let c = TcpStore::connect(addr, WAIT).unwrap();
            let start = Instant::now();
            let v = c.get("late", WAIT).unwrap();
            (v, start.elapsed())
        });
        std::thread::sleep(Duration::from_millis(300));
        TcpStore::connect(addr, WAIT).unwrap().set("late", b"here").unwrap();
        let (v, waited) = waiter.join().unwrap();
        assert_eq!(v, b"here");
        assert!(waited >= Duration::from_millis(200), "returned after {waited:?}, before the set");
        assert!(waited < Duration::from_secs(5));
    }

    #[test]
    fn one_handle_serves_a_blocked_get_and_a_set_at_once() {
        let (_server, addr) = serve();
        let c = Arc::new(TcpStore::connect(addr, WAIT).unwrap());
        let c2 = Arc::clone(&c);
        let waiter = std::thread::spawn(move || c2.get("k", WAIT).unwrap());
        std::thread::sleep(Duration::from_millis(100));
        c.set("k", b"v").unwrap();
        assert_eq!(waiter.join().unwrap(), b"v");
    }

    #[test]
    fn get_timeout_names_key_address_and_time() {
        let (server, addr) = serve();
        let c = TcpStore::connect(addr, WAIT).unwrap();
        let start = Instant::now();
        let msg = err_text(c.get("never/set", Duration::from_millis(250)));
        let waited = start.elapsed();
        assert!(waited >= Duration::from_millis(250) && waited < Duration::from_secs(5), "{waited:?}");
        assert!(msg.contains("never/set") && msg.contains(&addr.to_string()) && msg.contains("250ms"), "{msg}");
        // The connection is still good after a timeout.
        c.set("k", b"v").unwrap();
        assert_eq!(c.get("k", WAIT).unwrap(), b"v");
        let msg = err_text(server.get("never/set", Duration::from_millis(50)));
        assert!(msg.contains("never/set") && msg.contains(&addr.to_string()) && msg.contains("50ms"), "{msg}");
        let msg = err_text(MemStore::new().get("mem/key", Duration::from_millis(20)));
        assert!(msg.contains("mem/key") && msg.contains("20ms"), "{msg}");
    }

    #[test]
    fn add_counts_atomically_from_many_clients() {
        let (server, addr) = serve();
        let (clients, adds) = (8, 50);
        let handles: Vec<_> = (0..clients)
            .map(|_| {
                std::thread::spawn(move || {
                    let c = TcpStore::connect(addr, WAIT).unwrap();
                    (0..adds).map(|_| c.add("counter", 1).unwrap()).collect::<Vec<_>>()
                })
            })
            .collect();
        let mut seen: Vec<i64> = handles.into_iter().flat_map(|h| h.join().unwrap()).collect();
        seen.sort_unstable();
        let total = (clients * adds) as i64;
        assert_eq!(seen, (1..=total).collect::<Vec<_>>());
        assert_eq!(server.add("counter", 0).unwrap(), total);
        assert_eq!(server.add("counter", -total).unwrap(), 0);
        // A counter reads as its decimal text; a non-counter value is refused.
        let c = TcpStore::connect(addr, WAIT).unwrap();
        assert_eq!(c.add("c2", 5).unwrap(), 5);
        assert_eq!(c.get("c2", WAIT).unwrap(), b"5");
        c.set("text", b"hello").unwrap();
        let msg = err_text(c.add("text", 1));
        assert!(msg.contains("text") && msg.contains("not a counter"), "{msg}");
        assert!(err_text(c.add("c2", i64::MAX)).contains("overflows"));
        // The client recovers after a refused call.
        assert_eq!(c.add("c2", 1).unwrap(), 6);
    }

    #[test]
    fn barrier_holds_four_clients_until_all_arrive() {
        let (_server, addr) = serve();
        let world = 4;
        let arrived = Arc::new(AtomicUsize::new(0));
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                let arrived = Arc::clone(&arrived);
                std::thread::spawn(move || {
                    let c = TcpStore::connect(addr, WAIT).unwrap();
                    for round in 1..=3 {
                        std::thread::sleep(Duration::from_millis(20 * rank as u64));
                        arrived.fetch_add(1, Ordering::SeqCst);
                        c.barrier(&format!("round-{round}"), world, WAIT).unwrap();
                        assert!(arrived.load(Ordering::SeqCst) >= world * round, "left barrier {round} early");
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }

    #[test]
    fn barrier_timeout_and_misuse_are_errors() {
        let store = MemStore::new();
        for _ in 0..2 {
            let s = store.clone();
            std::thread::spawn(move || {
                let _ = s.barrier("short", 4, Duration::from_millis(300));
            });
        }
        while store.add(&format!("{BARRIER_PREFIX}short/arrived"), 0).unwrap() < 2 {
            std::thread::sleep(Duration::from_millis(5));
        }
        let msg = err_text(store.barrier("short", 4, Duration::from_millis(100)));
        assert!(msg.contains("barrier `short`: 3 of 4 ranks arrived within 100ms"), "{msg}");
        store.barrier("solo", 1, WAIT).unwrap();
        assert!(err_text(store.barrier("solo", 1, WAIT)).contains("used twice"));
        assert!(err_text(store.barrier("zero", 0, WAIT)).contains("world size is 0"));
    }

    #[test]
    fn mem_store_has_the_same_semantics_across_threads() {
        let store = MemStore::new();
        let handles: Vec<_> = (0..4)
            .map(|rank| {
                let s = store.clone();
                std::thread::spawn(move || {
                    s.set(&format!("addr/{rank}"), format!("host-{rank}").as_bytes()).unwrap();
                    s.barrier("all-set", 4, WAIT).unwrap();
                    let peers: Vec<_> = (0..4).map(|r| s.get(&format!("addr/{r}"), WAIT).unwrap()).collect();
                    (s.add("n", 1).unwrap(), peers)
                })
            })
            .collect();
        let mut counts = Vec::new();
        for h in handles {
            let (n, peers) = h.join().unwrap();
            counts.push(n);
            assert_eq!(peers, (0..4).map(|r| format!("host-{r}").into_bytes()).collect::<Vec<_>>());
        }
        counts.sort_unstable();
        assert_eq!(counts, vec![1, 2, 3, 4]);
        assert!(format!("{store:?}").contains("MemStore"));
    }

    #[test]
    fn oversized_keys_and_values_are_rejected() {
        let (server, addr) = serve();
        let c = TcpStore::connect(addr, WAIT).unwrap();
        let big = vec![0u8; MAX_VALUE_LEN + 1];
        let long_key = "k".repeat(MAX_KEY_LEN + 1);
        for store in [&c as &dyn Store, &server, &MemStore::new()] {
            let msg = err_text(store.set("blob", &big));
            assert!(
                msg.contains("blob") && msg.contains(&(MAX_VALUE_LEN + 1).to_string()) && msg.contains("limit"),
                "{msg}"
            );
            assert!(err_text(store.set(&long_key, b"v")).contains("key of"));
            assert!(err_text(store.get(&long_key, WAIT)).contains("key of"));
            assert!(err_text(store.add(&long_key, 1)).contains("key of"));
        }
        // A peer that claims a huge value gets an error answer, not an allocation.
        let mut raw = TcpStream::connect(addr).unwrap();
        raw.set_read_timeout(Some(WAIT)).unwrap();
        let mut req = vec![OP_SET];
        req.extend_from_slice(&1u32.to_le_bytes());
        req.push(b'x');
        req.extend_from_slice(&u64::MAX.to_le_bytes());
        raw.write_all(&req).unwrap();
        let (status, payload) = read_response(&mut raw).unwrap();
        assert_eq!(status, ST_ERROR);
        assert!(String::from_utf8_lossy(&payload).contains("malformed"));
        // The client's connection is unaffected.
        c.set("small", b"ok").unwrap();
        assert_eq!(c.get("small", WAIT).unwrap(), b"ok");
    }

    #[test]
    fn garbage_clients_do_not_crash_the_server() {
        let (server, addr) = serve();
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut junk: Vec<Vec<u8>> = (0..16)
            .map(|i| {
                let len = [0, 1, 3, 13, 100, 4096, 70_000][i % 7];
                (0..len).map(|_| next() as u8).collect()
            })
            .collect();
        // Hand-made bad requests: unknown op, huge key length, non-UTF-8 key, a get whose
        // value is not 8 bytes, a truncated set, a wrong handshake.
        junk.push(vec![200, 0, 0, 0, 0]);
        junk.push([vec![OP_GET], u32::MAX.to_le_bytes().to_vec()].concat());
        junk.push([vec![OP_SET], 2u32.to_le_bytes().to_vec(), vec![0xff, 0xfe], 0u64.to_le_bytes().to_vec()].concat());
        junk.push([vec![OP_GET], 1u32.to_le_bytes().to_vec(), b"k".to_vec(), 3u64.to_le_bytes().to_vec()].concat());
        junk.push(
            [vec![OP_SET], 1u32.to_le_bytes().to_vec(), b"k".to_vec(), 10u64.to_le_bytes().to_vec(), b"abc".to_vec()]
                .concat(),
        );
        junk.push(encode_request(OP_HELLO, b"", b"not-the-magic"));
        for bytes in &junk {
            let mut raw = TcpStream::connect(addr).unwrap();
            let _ = raw.write_all(bytes); // the server may hang up mid-write
            let _ = raw.shutdown(Shutdown::Write);
        }
        // Garbage that stays connected and silent does not block others either.
        let mut idle = TcpStream::connect(addr).unwrap();
        idle.write_all(&[OP_SET, 1, 0]).unwrap();
        let c = TcpStore::connect(addr, WAIT).unwrap();
        c.set("still", b"alive").unwrap();
        assert_eq!(c.get("still", WAIT).unwrap(), b"alive");
        assert_eq!(server.get("still", WAIT).unwrap(), b"alive");
        // A client of the protocol reading garbage answers gets an error, not a panic.
        let fake = TcpListener::bind(loopback0()).unwrap();
        let fake_addr = fake.local_addr().unwrap();
        let answer = std::thread::spawn(move || {
            let (mut s, _) = fake.accept().unwrap();
            let _ = s.write_all(&[ST_OK, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]);
            std::thread::sleep(Duration::from_millis(200));
        });
        let msg = err_text(TcpStore::connect(fake_addr, Duration::from_millis(150)));
        assert!(msg.contains("handshake") || msg.contains("could not reach"), "{msg}");
        answer.join().unwrap();
    }

    #[test]
    fn connect_to_a_port_nobody_listens_on_times_out() {
        let addr = SocketAddr::new(Ipv4Addr::LOCALHOST.into(), free_port());
        let start = Instant::now();
        let msg = err_text(TcpStore::connect(addr, Duration::from_millis(300)));
        let took = start.elapsed();
        assert!(took >= Duration::from_millis(290) && took < Duration::from_millis(1500), "{took:?}");
        assert!(msg.contains(&addr.to_string()) && msg.contains("300ms"), "{msg}");
    }

    #[test]
    fn a_dead_server_gives_errors_not_hangs() {
        let (server, addr) = serve();
        let c = TcpStore::connect(addr, WAIT).unwrap().with_io_timeout(Duration::from_millis(300));
        let c = Arc::new(c);
        let c2 = Arc::clone(&c);
        let waiter = std::thread::spawn(move || c2.get("never", WAIT));
        std::thread::sleep(Duration::from_millis(100));
        let start = Instant::now();
        drop(server);
        assert!(waiter.join().unwrap().is_err());
        assert!(c.set("k", b"v").is_err());
        assert!(start.elapsed() < Duration::from_secs(5));
        // The port is free again.
        TcpStore::server(addr).unwrap();

        // A server that accepts, shakes hands, then never answers: the read timeout fires.
        let mute = TcpListener::bind(loopback0()).unwrap();
        let mute_addr = mute.local_addr().unwrap();
        let mute_thread = std::thread::spawn(move || {
            let (mut s, _) = mute.accept().unwrap();
            let mut hello = vec![0u8; 1 + 4 + 8 + MAGIC.len()];
            s.read_exact(&mut hello).unwrap();
            s.write_all(&encode_response(ST_OK, MAGIC)).unwrap();
            std::thread::sleep(Duration::from_millis(800));
        });
        let c = TcpStore::connect(mute_addr, WAIT).unwrap().with_io_timeout(Duration::from_millis(200));
        let start = Instant::now();
        let msg = err_text(c.set("k", b"v"));
        assert!(start.elapsed() < Duration::from_millis(800), "{:?}", start.elapsed());
        assert!(msg.contains("did not answer") && msg.contains(&mute_addr.to_string()), "{msg}");
        mute_thread.join().unwrap();
    }

    #[test]
    fn rendezvous_waits_for_rank_zero() {
        let port = free_port();
        let early = std::thread::spawn(move || {
            let c = TcpStore::rendezvous(1, "localhost", port, WAIT).unwrap();
            c.set("from/1", b"hi").unwrap();
            c.barrier("ready", 2, WAIT).unwrap();
            c.get("from/0", WAIT).unwrap()
        });
        std::thread::sleep(Duration::from_millis(200));
        let rank0 = TcpStore::rendezvous(0, "127.0.0.1", port, WAIT).unwrap();
        assert!(rank0.is_server());
        assert_eq!(rank0.local_addr().port(), port);
        rank0.set("from/0", b"hello").unwrap();
        rank0.barrier("ready", 2, WAIT).unwrap();
        assert_eq!(rank0.get("from/1", WAIT).unwrap(), b"hi");
        assert_eq!(early.join().unwrap(), b"hello");

        // connect_host and with_client: a server that talks to itself through TCP.
        let (server, addr) = serve();
        let client = TcpStore::connect_host(&format!("localhost:{}", addr.port()), WAIT).unwrap();
        let both = server.with_client(client);
        assert!(both.is_server() && both.local_addr() == addr);
        both.set("k", b"v").unwrap();
        assert_eq!(TcpStore::connect(addr, WAIT).unwrap().get("k", WAIT).unwrap(), b"v");
        assert!(err_text(TcpStore::connect_host("no-port", WAIT)).contains("host:port"));
    }
}
