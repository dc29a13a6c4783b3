//! The store's server: a listener thread and one thread per connection over the shared table.

use super::wire::*;
use super::*;

/// The serving half of a [`TcpStore`]: a listener thread and one thread per connection,
/// all stopped when it is dropped.
pub(super) struct Server {
    pub(super) table: Arc<Table>,
    pub(super) local: SocketAddr,
    pub(super) conns: Arc<Mutex<HashMap<u64, TcpStream>>>,
    pub(super) accept: Option<JoinHandle<()>>,
}

impl Server {
    pub(super) fn bind(addr: SocketAddr) -> Result<Server> {
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

pub(super) fn lock_conns(conns: &Mutex<HashMap<u64, TcpStream>>) -> MutexGuard<'_, HashMap<u64, TcpStream>> {
    conns.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(super) fn accept_loop(listener: &TcpListener, table: &Arc<Table>, conns: &Arc<Mutex<HashMap<u64, TcpStream>>>) {
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

pub(super) fn serve_connection(table: &Table, stream: TcpStream, peer: &str) {
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
