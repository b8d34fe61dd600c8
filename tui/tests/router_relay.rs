//! `kvtwin router` and `kvtwin relay` as processes: a router fed by an engine over ZMQ
//! answers its HTTP API; a relay and a router meet over NATS (JetStream); both stop
//! cleanly on Ctrl-C (SIGINT), the relay printing what it did.
//!
//! The NATS test skips with the reason when there is no nats-server, unless
//! `KVTWIN_REQUIRE_NATS=1` or `CI=true`.

mod common;

use common::{http, listening_on, start_jetstream_relay, wait_worker, Process};
use kvtwin_plane::nats::NatsServer;
use kvtwin_plane::service::synthetic::{SyntheticConfig, SyntheticEngine};
use kvtwin_plane::wire::{EngineBatch, EngineEvent, EngineFormat};
use kvtwin_plane::zmq::{PublisherConfig, ZmqPublisher};
use serde_json::Value;
use std::collections::HashMap;
use std::time::Duration;

/// 30 batches of a small synthetic engine, and the number of events in them.
fn batches() -> (Vec<EngineBatch>, u64) {
    let mut engine = SyntheticEngine::new(SyntheticConfig::small(5));
    let batches: Vec<EngineBatch> = (0..30).map(|_| engine.next_batch()).collect();
    let events = batches.iter().map(|b| b.events.len() as u64).sum();
    (batches, events)
}

/// The whole token sequence of the newest request in `batches`: its blocks and their
/// ancestors, which the engine still caches (blocks something hangs off are never
/// evicted), so every block of it is a hit.
fn newest_prefix(batches: &[EngineBatch]) -> Vec<u32> {
    let mut blocks: HashMap<u64, (Option<u64>, &[u32])> = HashMap::new();
    let mut newest = None;
    for event in batches.iter().flat_map(|batch| &batch.events) {
        if let EngineEvent::BlockStored(stored) = event {
            let mut parent = stored.parent_block_hash;
            let chunks = stored.token_ids.chunks_exact(stored.block_size as usize);
            for (hash, tokens) in stored.block_hashes.iter().zip(chunks) {
                blocks.insert(*hash, (parent, tokens));
                parent = Some(*hash);
            }
            newest = parent;
        }
    }
    let mut chain = Vec::new();
    while let Some(hash) = newest {
        let (parent, tokens) = blocks[&hash];
        chain.push(tokens);
        newest = parent;
    }
    chain.into_iter().rev().flatten().copied().collect()
}

fn publish(publisher: &mut ZmqPublisher, batches: &[EngineBatch]) {
    let options = EngineFormat::Vllm0_33.options();
    for batch in batches {
        publisher.publish(&batch.to_payload(&options)).unwrap();
    }
}

#[test]
fn a_router_fed_over_zmq_answers_its_http_api_and_stops_on_ctrl_c() {
    let mut publisher = ZmqPublisher::bind(&PublisherConfig::new(
        "tcp://127.0.0.1:*",
        Some("tcp://127.0.0.1:*"),
    ))
    .unwrap();
    let source = format!(
        "7={},replay={}",
        publisher.endpoint(),
        publisher.replay_endpoint().unwrap()
    );
    let router = Process::start(&[
        "router",
        "--zmq",
        &source,
        "--listen",
        "127.0.0.1:0",
        "--block-size",
        "16",
    ]);
    let address = listening_on(&router);
    let (batches, events) = batches();
    // Batches published before the subscription reached the engine come from replay.
    publish(&mut publisher, &batches);
    let entry = wait_worker(&address, 7, events - 1);
    assert!(entry["blocks"]["device"].as_u64().unwrap() > 0, "{entry}");

    let tokens = newest_prefix(&batches);
    let (status, body) = http(
        &address,
        "POST",
        "/v1/route",
        &serde_json::json!({ "tokens": tokens }).to_string(),
    );
    assert_eq!(status, 200, "{body}");
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["worker"], 7, "{answer}");
    assert_eq!(answer["overlaps"]["7"], answer["query_blocks"], "{answer}");
    assert_eq!(http(&address, "GET", "/healthz", "").1, "ok\n");
    let (status, _) = http(&address, "POST", "/v1/route", "{}");
    assert_eq!(status, 400);
    let (_, metrics) = http(&address, "GET", "/metrics", "");
    assert!(
        metrics.contains(&format!(
            "kvtwin_router_kv_cache_events_applied_total {events}\n"
        )),
        "{metrics}"
    );
    router.interrupt();
}

#[test]
fn a_relay_and_a_router_meet_over_jetstream_and_the_relay_reports_on_ctrl_c() {
    let Some(server) = NatsServer::start_or_skip("a_relay_and_a_router_meet_over_jetstream") else {
        return;
    };
    let url = server.url();
    let mut publisher = ZmqPublisher::bind(&PublisherConfig::new(
        "tcp://127.0.0.1:*",
        Some("tcp://127.0.0.1:*"),
    ))
    .unwrap();
    let relay = start_jetstream_relay(&publisher, &url, 3, &["--envelope"]);
    let (batches, events) = batches();
    publish(&mut publisher, &batches);
    // Started after the events were stored: it rebuilds them from the stream.
    std::thread::sleep(Duration::from_millis(500));
    let router = Process::start(&[
        "router",
        "--nats",
        &url,
        "--jetstream",
        "kv",
        "--block-size",
        "16",
        "--listen",
        "127.0.0.1:0",
    ]);
    let address = listening_on(&router);
    wait_worker(&address, 3, events - 1);
    let (_, body) = http(
        &address,
        "POST",
        "/v1/route",
        &serde_json::json!({ "tokens": newest_prefix(&batches) }).to_string(),
    );
    let answer: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(answer["worker"], 3, "{answer}");
    router.interrupt();
    let stats: Value = serde_json::from_str(relay.interrupt().trim()).unwrap();
    assert_eq!(stats["events"], events, "{stats}");
    assert_eq!(stats["batches"], batches.len(), "{stats}");
    assert_eq!(stats["publish_failures"], 0, "{stats}");
}
