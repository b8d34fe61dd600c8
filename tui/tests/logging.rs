//! `kvtwin router`'s logs: text by default, one JSON object a line with `--log-format
//! json` (level, message, timestamp), filtered by `RUST_LOG`; an invalid `RUST_LOG` stops
//! the start with an error naming it. A warning about one engine's stream carries the
//! `zmq_source` span's `worker_id` and `endpoint`.

mod common;

use common::{kvtwin_outcome, Process};
use kvtwin_plane::wire::{BlockStored, EngineBatch, EngineEvent, EngineFormat};
use kvtwin_plane::zmq::{PublisherConfig, ZmqPublisher};
use serde_json::Value;
use std::time::{Duration, Instant};

#[test]
fn a_warning_about_an_engine_carries_its_worker_and_endpoint() {
    let mut publisher =
        ZmqPublisher::bind(&PublisherConfig::new("tcp://127.0.0.1:*", None)).unwrap();
    let endpoint = publisher.endpoint().to_string();
    let source = format!("7={endpoint}");
    let router = Process::start_env(
        &[
            "router",
            "--listen",
            "127.0.0.1:0",
            "--block-size",
            "16",
            "--zmq",
            &source,
            "--log-format",
            "json",
        ],
        &[("RUST_LOG", "info")],
    );
    router.wait_line("listening on");
    // Blocks of 32 tokens to a router of 16: refused, and warned about.
    let stored = BlockStored {
        block_hashes: vec![1],
        token_ids: (0..32).collect(),
        block_size: 32,
        ..BlockStored::default()
    };
    let batch = EngineBatch::new(0, 0.0, vec![EngineEvent::BlockStored(stored)], Some(0));
    let payload = batch.to_payload(&EngineFormat::Vllm0_33.options());
    // Until the router's SUB socket has joined, a PUB drops what it sends: keep sending.
    let deadline = Instant::now() + Duration::from_secs(10);
    let line = loop {
        publisher.publish(&payload).unwrap();
        let lines = router.lines_now(Duration::from_millis(100));
        if let Some(line) = lines
            .into_iter()
            .find(|l| l.contains("block_size_mismatch"))
        {
            break line;
        }
        assert!(
            Instant::now() < deadline,
            "no warning about the refused batch"
        );
    };
    let record: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!(record["level"], "WARN", "{record}");
    assert_eq!(record["span"]["name"], "zmq_source", "{record}");
    assert_eq!(record["span"]["worker_id"], 7, "{record}");
    assert_eq!(record["span"]["endpoint"], endpoint, "{record}");
    router.interrupt();
}

#[test]
fn the_router_logs_json_lines_and_rust_log_filters_them() {
    let router = Process::start_env(
        &[
            "router",
            "--listen",
            "127.0.0.1:0",
            "--zmq",
            "1=tcp://127.0.0.1:1",
            "--log-format",
            "json",
        ],
        &[("RUST_LOG", "info")],
    );
    let line = router.wait_line("listening on");
    let record: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!(record["level"], "INFO", "{record}");
    let message = record["fields"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("kvtwin router: listening on http://127.0.0.1:"),
        "{message}"
    );
    assert!(record["timestamp"].is_string(), "{record}");
    router.interrupt();

    // The only test of this file: setting the variable races with no other.
    std::env::set_var("RUST_LOG", "kvtwin=[[[");
    let (ok, _, stderr) = kvtwin_outcome(&[
        "router",
        "--listen",
        "127.0.0.1:0",
        "--zmq",
        "1=tcp://127.0.0.1:1",
    ]);
    std::env::remove_var("RUST_LOG");
    assert!(!ok);
    assert!(stderr.contains("RUST_LOG=kvtwin=[[["), "{stderr}");
}
