//! A flood: one engine publishing fresh `BlockStored` events as fast as it can into a
//! `kvtwin router` with a small index budget (issue 19). The router's resident memory
//! stays under a stated bound and `POST /v1/route` keeps answering, during and after.
//!
//! Linux only (resident memory from `/proc/PID/status`). No timing is asserted: a slow
//! machine publishes less, and the test then checks that the budget was reached at all.

#![cfg(target_os = "linux")]

mod common;

use common::{http, listening_on, Process};
use kvtwin_plane::wire::{BlockStored, EngineBatch, EngineEvent, EngineFormat};
use kvtwin_plane::zmq::{PublisherConfig, ZmqPublisher};
use serde_json::Value;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long the engine floods.
const FLOOD: Duration = Duration::from_secs(20);

/// The router's budget: distinct blocks, and per worker.
const MAX_BLOCKS: u64 = 20_000;

/// Resident memory the router may reach. An unbounded router passes it within the
/// flood on this project's 2-core VM (BENCHMARKS.md: ~90 bytes a block, millions of
/// blocks); the bounded one holds ~20,000 blocks (a few MB), the receive queue
/// (4,096 batches of ~10 KB at most) and the runtime.
const RSS_BOUND_KB: u64 = 160 * 1024;

const BLOCK_SIZE: u32 = 16;
const BLOCKS_PER_EVENT: u64 = 16;
const EVENTS_PER_BATCH: u64 = 4;

/// The router's resident set, kB.
fn rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kb| kb.parse().ok())
        .unwrap()
}

/// Batch `n`: fresh chains (tokens never seen before), one per event.
fn batch(n: u64) -> EngineBatch {
    let events = (0..EVENTS_PER_BATCH)
        .map(|e| {
            let first = (n * EVENTS_PER_BATCH + e) * BLOCKS_PER_EVENT;
            let tokens = (first * u64::from(BLOCK_SIZE)
                ..(first + BLOCKS_PER_EVENT) * u64::from(BLOCK_SIZE))
                .map(|t| t as u32)
                .collect();
            EngineEvent::BlockStored(BlockStored {
                block_hashes: (first..first + BLOCKS_PER_EVENT).collect(),
                token_ids: tokens,
                block_size: BLOCK_SIZE,
                ..BlockStored::default()
            })
        })
        .collect();
    EngineBatch::new(n, 0.0, events, Some(0))
}

fn route_answers(address: &str, tokens: &[u32]) {
    let body = serde_json::json!({ "tokens": tokens }).to_string();
    let (status, answer) = http(address, "POST", "/v1/route", &body);
    assert_eq!(status, 200, "{answer}");
    let answer: Value = serde_json::from_str(&answer).unwrap();
    assert_eq!(answer["query_blocks"], 4, "{answer}");
}

#[test]
fn a_flooded_router_keeps_its_budget_and_answers() {
    let publisher = ZmqPublisher::bind(&PublisherConfig {
        // The test's own memory: keep no replay ring to speak of.
        buffer_batches: 16,
        ..PublisherConfig::new("tcp://127.0.0.1:*", None)
    })
    .unwrap();
    let source = format!("1={}", publisher.endpoint());
    let max = MAX_BLOCKS.to_string();
    let router = Process::start(&[
        "router",
        "--zmq",
        &source,
        "--listen",
        "127.0.0.1:0",
        "--block-size",
        "16",
        "--max-blocks",
        &max,
        "--max-blocks-per-worker",
        &max,
        "--worker-capacity-blocks",
        &max,
    ]);
    let address = listening_on(&router);
    let pid = router.id();

    let stop = Arc::new(AtomicBool::new(false));
    let published = Arc::new(AtomicU64::new(0));
    let flood = {
        let (stop, published) = (stop.clone(), published.clone());
        let mut publisher = publisher;
        std::thread::spawn(move || {
            let options = EngineFormat::Vllm0_33.options();
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                publisher.publish(&batch(n).to_payload(&options)).unwrap();
                n += 1;
                published.store(n, Ordering::Relaxed);
            }
        })
    };
    // The first chain's tokens: evicted early on, so routed as a miss, never an error.
    let query: Vec<u32> = (0..4 * BLOCK_SIZE).collect();
    let start = Instant::now();
    let mut rss_max = 0;
    let mut routes = 0;
    while start.elapsed() < FLOOD {
        rss_max = rss_max.max(rss_kb(pid));
        route_answers(&address, &query);
        routes += 1;
        std::thread::sleep(Duration::from_millis(200));
    }
    stop.store(true, Ordering::Relaxed);
    flood.join().unwrap();
    rss_max = rss_max.max(rss_kb(pid));
    route_answers(&address, &query);

    let batches = published.load(Ordering::Relaxed);
    let blocks = batches * EVENTS_PER_BATCH * BLOCKS_PER_EVENT;
    eprintln!(
        "flood: {batches} batches ({blocks} blocks) in {FLOOD:?}, {routes} routes, router RSS max {rss_max} kB"
    );
    let (status, body) = http(&address, "GET", "/v1/workers", "");
    assert_eq!(status, 200, "{body}");
    let workers: Value = serde_json::from_str(&body).unwrap();
    let worker = &workers["workers"][0];
    eprintln!("flood: worker {worker}");
    assert!(
        worker["indexed_blocks"].as_u64().unwrap() <= MAX_BLOCKS,
        "{worker}"
    );
    // The budget was reached, and the flooding worker is flagged.
    assert!(worker["evicted_blocks"].as_u64().unwrap() > 0, "{worker}");
    assert_eq!(worker["over_declared"], true, "{worker}");
    let (_, metrics) = http(&address, "GET", "/metrics", "");
    let index_blocks: u64 = metrics
        .lines()
        .find_map(|line| line.strip_prefix("kvtwin_router_index_blocks "))
        .and_then(|value| value.parse().ok())
        .unwrap();
    assert!(index_blocks <= MAX_BLOCKS, "{index_blocks}");
    assert!(
        metrics.contains("kvtwin_router_evicted_blocks_total{worker_id=\"1\",dp_rank=\"0\"}"),
        "{metrics}"
    );
    assert!(
        rss_max < RSS_BOUND_KB,
        "router RSS reached {rss_max} kB (bound {RSS_BOUND_KB} kB)"
    );
    router.interrupt();
}
