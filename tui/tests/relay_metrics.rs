//! `kvtwin relay --metrics-listen`: the relay's counters as Prometheus metrics while it
//! runs, the same figures as its stats line.
//!
//! Skips with the reason when there is no nats-server, unless `KVTWIN_REQUIRE_NATS=1` or
//! `CI=true`.

mod common;

use common::{http, start_jetstream_relay};
use kvtwin_plane::nats::NatsServer;
use kvtwin_plane::service::synthetic::{SyntheticConfig, SyntheticEngine};
use kvtwin_plane::wire::EngineFormat;
use kvtwin_plane::zmq::{PublisherConfig, ZmqPublisher};
use serde_json::Value;
use std::time::{Duration, Instant};

/// `name{worker_id="8"}`'s value in `text`.
fn sample(text: &str, name: &str) -> Option<u64> {
    let prefix = format!("{name}{{worker_id=\"8\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .and_then(|value| value.trim().parse().ok())
}

#[test]
fn the_relay_serves_its_counters_as_prometheus_metrics() {
    let Some(server) = NatsServer::start_or_skip("the_relay_serves_its_counters") else {
        return;
    };
    let mut publisher = ZmqPublisher::bind(&PublisherConfig::new(
        "tcp://127.0.0.1:*",
        Some("tcp://127.0.0.1:*"),
    ))
    .unwrap();
    let relay = start_jetstream_relay(
        &publisher,
        &server.url(),
        8,
        &["--metrics-listen", "127.0.0.1:0"],
    );
    let line = relay.wait_line("metrics on http://");
    let address = line
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap()
        .to_string();
    let (status, body) = http(&address, "GET", "/healthz", "");
    assert_eq!((status, body.trim()), (200, "ok"));

    let mut engine = SyntheticEngine::new(SyntheticConfig::small(8));
    let options = EngineFormat::Vllm0_33.options();
    let mut events = 0u64;
    for _ in 0..15 {
        let batch = engine.next_batch();
        events += batch.events.len() as u64;
        publisher.publish(&batch.to_payload(&options)).unwrap();
    }
    // Everything relayed (and acknowledged) shows in the counters.
    let deadline = Instant::now() + Duration::from_secs(20);
    let text = loop {
        let (status, text) = http(&address, "GET", "/metrics", "");
        assert_eq!(status, 200, "{text}");
        if sample(&text, "kvtwin_relay_events_total") == Some(events) {
            break text;
        }
        assert!(
            Instant::now() < deadline,
            "never reached {events} events:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    for family in [
        "batches",
        "events",
        "blocks",
        "messages",
        "publish_failures",
        "engine_restarts",
        "lost_batches",
        "abandoned_events",
        "zmq_reconnects",
        "zmq_disconnects",
        "nats_reconnects",
        "dropped",
    ] {
        assert!(
            text.contains(&format!("# TYPE kvtwin_relay_{family} counter")),
            "{family}:\n{text}"
        );
    }
    assert!(text.trim_end().ends_with("# EOF"));
    // The stats line at exit says the same.
    let stats: Value = serde_json::from_str(relay.interrupt().trim()).unwrap();
    assert_eq!(stats["events"], events, "{stats}");
    assert_eq!(
        Some(stats["batches"].as_u64().unwrap()),
        sample(&text, "kvtwin_relay_batches_total")
    );
}
