//! Two real engines sharing one `kvtwin store` through kvtwin's connector (issue 32):
//! engines 1 and 2 of scripts/engines, each with the connector's own host memory (8 MiB)
//! and the store below it (`"shared_store": "redis://ADDR"`).
//!
//! - Engine 1 is sent three prompts of 660 tokens (a 640-token prefix, 20 full blocks,
//!   and 20 of its own): it finds nothing cached anywhere, computes them and its
//!   connector writes the 20 prefix blocks of each to the store (60 keys).
//! - Engine 2, which has seen none of them, is sent the same three: each is served with
//!   640 tokens of external hits (its usage's cached tokens, and vLLM's own
//!   `vllm:external_prefix_cache_hits_total` adds up to 3 × 640), loaded from the store,
//!   and its 8 greedy output tokens are engine 1's, which computed everything.
//! - Engine 2 writes nothing back it loaded (the store still holds 60 keys), and the
//!   connector's stats count 60 blocks loaded from the shared store.
//! - A fourth prompt shares the first 10 blocks of the first: both engines find them
//!   (engine 2 kept what it loaded) and answer alike.
//! - The store announced the 60 blocks engine 1 wrote as KV events (`--events-zmq`,
//!   decoded off a SUB with the plane's decoder): BlockStored, medium EXTERNAL, each
//!   named by kvtwin's sequence hash of its prompt block with its parent's and its 32
//!   tokens (the connector's KVB2 frames carry them), and no value it could not name.
//!
//! Needs the engines' venv (`scripts/engines/cluster.py setup`); skips with the reason
//! without it, fails instead with `CI=true`.

mod common;

use common::engines::{external_hits, greedy, Cluster, EngineOptions};
use common::{Draw, Process};
use kvtwin::tokens::{compute_local_hashes, compute_sequence_hashes, HashSeed, DEFAULT_HASH_SEED};
use kvtwin_plane::wire::{EngineDecoder, EngineEvent};
use kvtwin_plane::zmq::{SubscriberConfig, SubscriberItem, ZmqSubscriber};
use serde_json::json;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;
use std::time::Instant;

const PREFIX_TOKENS: usize = 640;
const OWN_TOKENS: usize = 20;

/// The store's INFO.
fn info_of(store: &str) -> String {
    let mut stream = TcpStream::connect(store).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
        .write_all(b"*1\r\n$4\r\nINFO\r\n*1\r\n$4\r\nQUIT\r\n")
        .unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    reply
}

/// The store's DBSIZE.
fn keys_in(store: &str) -> i64 {
    let mut stream = TcpStream::connect(store).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
        .write_all(b"*1\r\n$6\r\nDBSIZE\r\n*1\r\n$4\r\nQUIT\r\n")
        .unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    let line = reply.lines().next().unwrap_or_default();
    line.strip_prefix(':')
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("DBSIZE answered {reply:?}"))
}

/// Each block the store announced: its hash, its parent's and its tokens, until `count`
/// have come (30 s at most).
fn announced(subscriber: &mut ZmqSubscriber, count: usize) -> Vec<(u64, Option<u64>, Vec<u32>)> {
    let decoder = EngineDecoder::default();
    let mut blocks = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while blocks.len() < count {
        assert!(
            Instant::now() < deadline,
            "the store announced {} of {count} blocks",
            blocks.len()
        );
        let Some(SubscriberItem::Batch(batch)) =
            subscriber.next(Duration::from_millis(200)).unwrap()
        else {
            continue;
        };
        for event in decoder
            .decode_payload(batch.seq, &batch.payload)
            .unwrap()
            .events
        {
            let EngineEvent::BlockStored(stored) = event else {
                panic!("the store removed something: {event:?}");
            };
            assert_eq!(stored.medium, Some(kvtwin::tier::Tier::Remote));
            let size = stored.block_size as usize;
            for (i, hash) in stored.block_hashes.iter().enumerate() {
                let parent = match i {
                    0 => stored.parent_block_hash,
                    _ => Some(stored.block_hashes[i - 1]),
                };
                blocks.push((
                    *hash,
                    parent,
                    stored.token_ids[i * size..(i + 1) * size].to_vec(),
                ));
            }
        }
    }
    blocks
}

#[test]
fn a_prefix_one_engine_computed_is_loaded_by_the_other_from_the_shared_store() {
    let test = "engines_shared_store";
    let store = Process::start(&[
        "store",
        "--listen",
        "127.0.0.1:0",
        "--memory",
        "64MiB",
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
    let mut subscriber = ZmqSubscriber::new(SubscriberConfig::new(endpoint, Some(replay))).unwrap();
    let address = line
        .split("redis://")
        .nth(1)
        .and_then(|rest| rest.split([';', ' ']).next())
        .unwrap_or_else(|| panic!("no address in {line:?}"))
        .to_string();
    let options = EngineOptions {
        connector: Some(
            json!({"host_bytes": 8 << 20, "shared_store": format!("redis://{address}")})
                .to_string(),
        ),
        ..EngineOptions::default()
    };
    let Some(cluster) = Cluster::start_or_skip(test, 2, &options) else {
        return;
    };
    let mut draw = Draw(32);
    let prompts: Vec<Vec<u32>> = (0..3)
        .map(|_| draw.tokens((PREFIX_TOKENS + OWN_TOKENS) as u64))
        .collect();

    let computed: Vec<(Vec<u64>, u64)> = prompts.iter().map(|p| greedy(&cluster, 1, p)).collect();
    assert!(
        computed.iter().all(|(_, cached)| *cached == 0),
        "engine 1 found something cached: {computed:?}"
    );
    assert_eq!(external_hits(&cluster, 1), 0.0);
    assert_eq!(
        keys_in(&address),
        3 * 20,
        "engine 1 wrote each prompt's 20 full prefix blocks"
    );
    // The store announced each of them, named as the router names the prompt's blocks.
    let mut expected = Vec::new();
    for prompt in &prompts {
        let prefix = &prompt[..PREFIX_TOKENS];
        let locals = compute_local_hashes(prefix, 32, HashSeed::new(DEFAULT_HASH_SEED));
        let hashes: Vec<u64> = compute_sequence_hashes(&locals)
            .iter()
            .map(|h| h.get())
            .collect();
        for (i, hash) in hashes.iter().enumerate() {
            let parent = (i > 0).then(|| hashes[i - 1]);
            expected.push((*hash, parent, prefix[i * 32..(i + 1) * 32].to_vec()));
        }
    }
    let mut got = announced(&mut subscriber, 3 * 20);
    got.sort();
    expected.sort();
    assert_eq!(got, expected, "the store's BlockStored events");
    let info = info_of(&address);
    assert!(info.contains("non_block_values:0"), "{info}");

    for (i, prompt) in prompts.iter().enumerate() {
        let (tokens, cached) = greedy(&cluster, 2, prompt);
        assert_eq!(
            cached, PREFIX_TOKENS as u64,
            "prompt {i}: engine 2's cached tokens"
        );
        assert_eq!(
            tokens, computed[i].0,
            "prompt {i}: engine 2 answers as engine 1 did"
        );
    }
    assert_eq!(external_hits(&cluster, 2), (3 * PREFIX_TOKENS) as f64);
    assert_eq!(
        keys_in(&address),
        3 * 20,
        "engine 2 sent back nothing it loaded"
    );

    // Half of the first prompt, then tokens of its own: each engine holds those 10
    // blocks in its own host memory (engine 2 kept what it loaded).
    let mut half = prompts[0][..PREFIX_TOKENS / 2].to_vec();
    half.extend(draw.tokens(OWN_TOKENS as u64));
    let (from_2, cached_2) = greedy(&cluster, 2, &half);
    let (from_1, cached_1) = greedy(&cluster, 1, &half);
    assert_eq!((cached_1, cached_2), (320, 320));
    assert_eq!(from_1, from_2);
    let log = std::fs::read_to_string(&cluster.engine(2).log).unwrap_or_default();
    assert!(
        log.contains("kvtwin connector: shared store redis://"),
        "engine 2's log does not name the shared store"
    );
    assert!(!log.contains("not written to the shared store"), "{log}");
}
