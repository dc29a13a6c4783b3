//! The store's tests: TCP and in-process, the limits, hostile clients, timeouts.

use super::wire::*;
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
