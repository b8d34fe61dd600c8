//! `kvtwin relay` stopped by SIGTERM while an engine is publishing: it stops reading,
//! publishes what it had queued into JetStream, exits 0 within its drain bound, and every
//! event it reports as published (acknowledged) is in the stream, read back.
//!
//! Skips with the reason when there is no nats-server, unless `KVTWIN_REQUIRE_NATS=1` or
//! `CI=true`.

mod common;

use common::start_jetstream_relay;
use kvtwin_plane::nats::{ConsumeMode, NatsServer, NatsSubscriber, SubscriberConfig};
use kvtwin_plane::service::nats_source::decode_message;
use kvtwin_plane::service::synthetic::{SyntheticConfig, SyntheticEngine};
use kvtwin_plane::wire::{DecodeLimits, EngineFormat};
use kvtwin_plane::zmq::{PublisherConfig, ZmqPublisher};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The relay's drain bound (its default) plus the time to start stopping.
const STOP_LIMIT: Duration = Duration::from_secs(13);

#[test]
fn sigterm_mid_stream_exits_0_and_everything_acknowledged_is_in_the_stream() {
    let test = "sigterm_mid_stream_exits_0_and_everything_acknowledged_is_in_the_stream";
    let Some(server) = NatsServer::start_or_skip(test) else {
        return;
    };
    let url = server.url();
    let mut publisher = ZmqPublisher::bind(&PublisherConfig::new(
        "tcp://127.0.0.1:*",
        Some("tcp://127.0.0.1:*"),
    ))
    .unwrap();
    // JSON: one event per NATS message, so the stream's messages count events.
    let relay = start_jetstream_relay(&publisher, &url, 5, &[]);
    let publishing = Arc::new(AtomicBool::new(true));
    let engine = {
        let publishing = publishing.clone();
        std::thread::spawn(move || {
            let mut engine = SyntheticEngine::new(SyntheticConfig::small(11));
            let options = EngineFormat::Vllm0_33.options();
            let mut batches = 0u64;
            while publishing.load(Ordering::Relaxed) && batches < 20_000 {
                publisher
                    .publish(&engine.next_batch().to_payload(&options))
                    .unwrap();
                batches += 1;
                std::thread::sleep(Duration::from_micros(500));
            }
            batches
        })
    };
    std::thread::sleep(Duration::from_millis(700));
    let (exit, took, stdout) = relay.terminate(STOP_LIMIT);
    publishing.store(false, Ordering::Relaxed);
    let engine_batches = engine.join().unwrap();
    assert!(
        exit.success(),
        "relay exited {exit} after {took:?}: {stdout}"
    );
    assert!(took < STOP_LIMIT, "{took:?}");
    let stats: Value = serde_json::from_str(stdout.trim()).unwrap();
    let events = stats["events"].as_u64().unwrap();
    assert!(events > 0, "nothing relayed before the stop: {stats}");
    assert_eq!(stats["publish_failures"], 0, "{stats}");
    assert_eq!(stats["abandoned_events"], 0, "{stats}");
    assert!(
        stats["batches"].as_u64().unwrap() <= engine_batches,
        "{stats} of {engine_batches}"
    );

    // Read the stream back: exactly the events the relay counted, numbered 0.. per rank.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let stored = runtime.block_on(async {
        let mut subscriber = NatsSubscriber::connect(SubscriberConfig::new(
            &url,
            "kvtwin.kv_events",
            ConsumeMode::Replay {
                stream: "kv".to_string(),
            },
        ))
        .await
        .expect("reads the stream");
        let mut ids: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
        while let Some(message) = subscriber
            .recv_timeout(Duration::from_secs(5))
            .await
            .expect("replays")
        {
            for event in decode_message(&message.payload, &DecodeLimits::default()).unwrap() {
                assert_eq!(event.worker.get(), 5);
                ids.entry(event.dp_rank).or_default().push(event.event_id);
            }
            if message.pending == Some(0) {
                break;
            }
        }
        ids
    });
    let in_stream: u64 = stored.values().map(|ids| ids.len() as u64).sum();
    assert_eq!(
        in_stream, events,
        "stream holds {in_stream}, relay acknowledged {events}"
    );
    for (rank, ids) in &stored {
        let expected: Vec<u64> = (0..ids.len() as u64).collect();
        assert_eq!(ids, &expected, "rank {rank}: event ids not 0.. in order");
    }
}

/// The other way out: the NATS server stops answering (SIGSTOP, so no ack comes and no
/// connection breaks) while the relay holds batches; SIGTERM then cannot publish them
/// within the drain bound. The relay must still stop by the bound, exit 1, and count
/// what it gave up.
#[test]
fn sigterm_with_acks_outstanding_at_the_drain_deadline_exits_1_and_counts_them() {
    let test = "sigterm_with_acks_outstanding_at_the_drain_deadline_exits_1_and_counts_them";
    let Some(server) = NatsServer::start_or_skip(test) else {
        return;
    };
    let url = server.url();
    let pid = server
        .pid()
        .expect("the test's own nats-server")
        .to_string();
    let signal = |name: &str| {
        let status = std::process::Command::new("kill")
            .args([name, &pid])
            .status()
            .unwrap();
        assert!(status.success(), "kill {name} {pid}");
    };
    let mut publisher = ZmqPublisher::bind(&PublisherConfig::new(
        "tcp://127.0.0.1:*",
        Some("tcp://127.0.0.1:*"),
    ))
    .unwrap();
    let relay = start_jetstream_relay(&publisher, &url, 6, &["--drain-timeout-s", "1"]);
    let mut engine = SyntheticEngine::new(SyntheticConfig::small(12));
    let options = EngineFormat::Vllm0_33.options();
    let mut publish = |batches: usize| {
        for _ in 0..batches {
            publisher
                .publish(&engine.next_batch().to_payload(&options))
                .unwrap();
        }
    };
    publish(10);
    std::thread::sleep(Duration::from_millis(1500));
    signal("-STOP");
    publish(50);
    std::thread::sleep(Duration::from_millis(500));
    // One second of drain, then the stop itself: well within the limit.
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        relay.terminate(Duration::from_secs(8))
    }));
    signal("-CONT");
    let (exit, took, stdout) = outcome.expect("the relay stops within its bound");
    assert_eq!(exit.code(), Some(1), "after {took:?}: {stdout}");
    let stats: Value = serde_json::from_str(stdout.trim()).unwrap();
    let unacknowledged =
        stats["abandoned_events"].as_u64().unwrap() + stats["publish_failures"].as_u64().unwrap();
    assert!(unacknowledged > 0, "{stats}");
    assert!(
        stats["events"].as_u64().unwrap() > 0,
        "the first batches went out: {stats}"
    );
}
