//! What the store's socket tests share: block frames as kvtwin's connector writes them,
//! a store serving its Redis front on a free loopback port (with KV events when asked),
//! and a client sending one RESP request and reading its reply.

#![allow(dead_code)]

use kvtwin::block_frame;
use kvtwin::ids::SequenceHash;
use kvtwin_plane::zmq::{PublisherConfig, ZmqPublisher};
use kvtwin_store::events::{publish, StoreEvents};
use kvtwin_store::resp::Limits;
use kvtwin_store::server::{serve, ServerConfig};
use kvtwin_store::store::{Store, StoreConfig};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Tokens per block in these tests.
pub(crate) const BLOCK_TOKENS: u32 = 4;

/// Bytes of each block.
pub(crate) const BLOCK_BYTES: usize = 1000;

/// The tokens of block `hash`: four of its own.
pub(crate) fn tokens_of(hash: u64) -> Vec<u32> {
    (0..BLOCK_TOKENS).map(|t| hash as u32 * 10 + t).collect()
}

/// Block `hash` under `parent` as the connector frames it.
pub(crate) fn block(hash: u64, parent: Option<u64>) -> Vec<u8> {
    block_frame::encode(
        SequenceHash::new(hash),
        parent.map(SequenceHash::new),
        &tokens_of(hash),
        &vec![hash as u8; BLOCK_BYTES],
    )
}

/// The bytes a block's record takes in memory (header, a key of up to 8 bytes, value),
/// generously: room for `n` blocks is `n` of these.
pub(crate) fn block_room(n: u64) -> u64 {
    n * (kvtwin_store::record::FIXED_HEADER + 8 + block(0, None).len()) as u64 + 200
}

/// A store of `blocks` blocks' room in memory alone, serving on a free loopback port;
/// its address.
pub(crate) async fn serve_store(blocks: u64, events: Option<StoreEvents>) -> String {
    let store = Store::open(StoreConfig {
        limits: [block_room(blocks), 0, 0],
        disk: None,
        object: None,
        max_value: 1 << 20,
        promote_on_hit: true,
        events: events.map(Arc::new),
    })
    .await
    .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let config = ServerConfig {
        token: None,
        max_clients: 16,
        limits: Limits::default(),
        tls: None,
    };
    tokio::spawn(serve(listener, Arc::new(store), config));
    address
}

/// A store publishing its events on ZMQ: its address, the PUB and the replay endpoints.
pub(crate) async fn serve_store_on_zmq(blocks: u64) -> (String, String, String) {
    let mut events = StoreEvents::new();
    let receiver = events.add_transport("zmq", 1024);
    let publisher = ZmqPublisher::bind(&PublisherConfig::new(
        "tcp://127.0.0.1:*",
        Some("tcp://127.0.0.1:*"),
    ))
    .unwrap();
    let endpoint = publisher.endpoint().to_string();
    let replay = publisher.replay_endpoint().unwrap().to_string();
    publish::start_zmq(publisher, receiver).unwrap();
    (serve_store(blocks, Some(events)).await, endpoint, replay)
}

/// Sends one request of `args` to the store at `address`; its reply as text (a bulk
/// string's header included).
pub(crate) async fn resp(address: &str, args: &[&[u8]]) -> String {
    let mut request = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        request.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        request.extend_from_slice(arg);
        request.extend_from_slice(b"\r\n");
    }
    let mut socket = tokio::net::TcpStream::connect(address).await.unwrap();
    socket.write_all(&request).await.unwrap();
    let mut reply = Vec::new();
    loop {
        let mut chunk = [0u8; 4096];
        let n = socket.read(&mut chunk).await.unwrap();
        assert!(n > 0, "the store closed the connection: {reply:?}");
        reply.extend_from_slice(&chunk[..n]);
        if let Some(end) = reply.windows(2).position(|w| w == b"\r\n") {
            let whole = match reply[0] {
                b'$' => {
                    let len: usize = std::str::from_utf8(&reply[1..end])
                        .unwrap()
                        .parse()
                        .unwrap();
                    reply.len() >= end + 2 + len + 2
                }
                _ => true,
            };
            if whole {
                return String::from_utf8_lossy(&reply).into_owned();
            }
        }
    }
}
