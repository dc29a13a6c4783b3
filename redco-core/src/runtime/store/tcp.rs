//! [`TcpStore`]: the store over TCP, serving (rank 0) and/or calling a server.

use super::client::*;
use super::server::*;
use super::*;

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
