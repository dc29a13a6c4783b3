//! The store's client side: connections to the server (pooled, retried), one call each.

use super::wire::*;
use super::*;

/// The talking half of a [`TcpStore`]: a pool of connections to the server, so that a
/// thread blocked in `get` does not hold up another thread's `set` on the same handle.
pub(super) struct Client {
    pub(super) addr: SocketAddr,
    pub(super) io_timeout: Duration,
    pub(super) pool: Mutex<Vec<TcpStream>>,
}

impl Client {
    /// Connects to `addr`, retrying until `timeout` (the server may not be up yet).
    pub(super) fn open(addr: SocketAddr, io_timeout: Duration, timeout: Duration) -> Result<TcpStream> {
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

    pub(super) fn take(&self) -> Result<TcpStream> {
        let pooled = self.pool.lock().unwrap_or_else(PoisonError::into_inner).pop();
        match pooled {
            Some(s) => Ok(s),
            None => Client::open(self.addr, self.io_timeout, self.io_timeout),
        }
    }

    pub(super) fn put_back(&self, stream: TcpStream) {
        self.pool.lock().unwrap_or_else(PoisonError::into_inner).push(stream);
    }

    /// One request and its answer: the payload, or `None` when the server answered
    /// "timeout". `wait` is how long the server may take by design (a `get`'s timeout);
    /// the client gives up `io_timeout` after that.
    pub(super) fn call(
        &self,
        op_name: &'static str,
        op: u8,
        key: &str,
        value: &[u8],
        wait: Duration,
    ) -> Result<Option<Vec<u8>>> {
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

pub(super) fn unexpected_timeout(op: &'static str, addr: SocketAddr) -> Error {
    Error::invalid(op, format!("the bootstrap store at {addr} answered \"timeout\" to a call that does not wait"))
}

pub(super) fn handshake(mut stream: &TcpStream, patience: Duration) -> io::Result<()> {
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
