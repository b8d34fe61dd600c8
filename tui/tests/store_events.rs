//! `kvtwin store --events-*` and `kvtwin router --shared-*` as a user runs them: the
//! store's KV events reach the router, over ZMQ (with replay) or NATS, and the router
//! shows the shared tier's blocks in `POST /v1/route` (`shared_blocks`) and `/metrics`
//! (`kvtwin_router_shared_blocks`), never as a worker.
//!
//! The NATS test skips with the reason when there is no nats-server, unless
//! `KVTWIN_REQUIRE_NATS=1` or `CI=true`.

mod common;

use common::{http, listening_on, Process};
use kvtwin::block_frame;
use kvtwin::ids::SequenceHash;
use kvtwin_plane::nats::NatsServer;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Tokens of block `n` (4 a block).
fn tokens(n: u32) -> Vec<u32> {
    (0..4).map(|t| n * 10 + t).collect()
}

/// The store's address from its start-up line.
fn redis_address(line: &str) -> String {
    let start = line.find("redis://").unwrap() + "redis://".len();
    line[start..]
        .split(|c: char| c == ';' || c.is_whitespace())
        .next()
        .unwrap()
        .to_string()
}

/// MSETs the first three blocks' frames (a chain) into the store at `address`.
fn mset_chain(address: &str) {
    let mut request = b"*7\r\n$4\r\nMSET\r\n".to_vec();
    for n in 1..=3u32 {
        let key = format!("m:{n}");
        let value = block_frame::encode(
            SequenceHash::new(u64::from(n)),
            (n > 1).then(|| SequenceHash::new(u64::from(n - 1))),
            &tokens(n),
            &[n as u8; 256],
        );
        for arg in [key.as_bytes(), &value] {
            request.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
            request.extend_from_slice(arg);
            request.extend_from_slice(b"\r\n");
        }
    }
    request.extend_from_slice(b"*1\r\n$4\r\nQUIT\r\n");
    let mut stream = TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(&request).unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    assert_eq!(reply, "+OK\r\n+OK\r\n");
}

/// Waits until the router at `address` answers a prompt of the three blocks and one
/// more with the store holding all three; that answer.
fn wait_shared(address: &str) -> Value {
    let prompt: Vec<u32> = [tokens(1), tokens(2), tokens(3), tokens(9)].concat();
    let body = json!({ "tokens": prompt }).to_string();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (status, answer) = http(address, "POST", "/v1/route", &body);
        assert_eq!(status, 200, "{answer}");
        let answer: Value = serde_json::from_str(&answer).unwrap();
        if answer["shared_blocks"] == 3 {
            return answer;
        }
        assert!(
            Instant::now() < deadline,
            "the router never saw the store's blocks: {answer}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// What the router says of the shared tier besides the route: its metric, and no row
/// for the store in /v1/workers.
fn check_router(address: &str) {
    let (_, metrics) = http(address, "GET", "/metrics", "");
    assert!(
        metrics
            .lines()
            .any(|l| l == "kvtwin_router_shared_blocks 3"),
        "{metrics}"
    );
    let (_, workers) = http(address, "GET", "/v1/workers", "");
    assert!(!workers.contains("7743504665528911668"), "{workers}");
}

#[test]
fn a_router_follows_the_stores_events_over_zmq() {
    let store = Process::start(&[
        "store",
        "--listen",
        "127.0.0.1:0",
        "--memory",
        "16MiB",
        "--events-zmq",
        "tcp://127.0.0.1:*",
        "--events-replay",
        "tcp://127.0.0.1:*",
    ]);
    let line = store.wait_line("listening on redis://");
    // "...; KV events as worker ID on tcp://A:P (replay tcp://A:R)"
    let events = line.split("KV events as worker ").nth(1).unwrap();
    let endpoint = events
        .split(" on ")
        .nth(1)
        .unwrap()
        .split(' ')
        .next()
        .unwrap();
    let replay = events
        .split("(replay ")
        .nth(1)
        .unwrap()
        .trim_end_matches(')');
    let shared = format!("{endpoint},replay={replay}");
    let router = Process::start(&[
        "router",
        "--listen",
        "127.0.0.1:0",
        "--block-size",
        "4",
        // An engine the test never starts: the router binds, nothing connects.
        "--zmq",
        "1=tcp://127.0.0.1:*",
        "--shared-events",
        &shared,
        "--shared-credit",
        "0.5",
    ]);
    let address = listening_on(&router);
    mset_chain(&redis_address(&line));
    let answer = wait_shared(&address);
    assert_eq!(answer["query_blocks"], 4);
    check_router(&address);
}

#[test]
fn a_router_follows_the_stores_events_over_nats() {
    let Some(server) = NatsServer::start_or_skip("store_events_nats") else {
        return;
    };
    let url = server.url();
    let router = Process::start(&[
        "router",
        "--listen",
        "127.0.0.1:0",
        "--block-size",
        "4",
        "--zmq",
        "1=tcp://127.0.0.1:*",
        "--shared-nats",
        &url,
    ]);
    // Core NATS: the router subscribed before it says it listens, long before the store
    // below publishes anything.
    let address = listening_on(&router);
    let store = Process::start(&["store", "--listen", "127.0.0.1:0", "--events-nats", &url]);
    let line = store.wait_line("listening on redis://");
    assert!(
        line.contains("NATS") && line.contains("kvtwin.shared.kv_events"),
        "{line}"
    );
    mset_chain(&redis_address(&line));
    wait_shared(&address);
    check_router(&address);
}
