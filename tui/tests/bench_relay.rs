//! `kvtwin bench relay` end to end, small: engines → relays → its own nats-server →
//! router for a second, windowed with envelopes and paced with JSON, must deliver every
//! block it published and print the figures the issue names.
//!
//! Skips with the reason when there is no nats-server, unless `KVTWIN_REQUIRE_NATS=1` or
//! `CI=true`.

use kvtwin_plane::nats::NatsServer;
use serde_json::Value;
use std::process::Command;

fn bench(extra: &[&str]) -> Value {
    let output = Command::new(env!("CARGO_BIN_EXE_kvtwin"))
        .args([
            "bench",
            "relay",
            "--seconds",
            "1",
            "--engines",
            "2",
            "--cycle-batches",
            "50",
            "--requests-per-batch",
            "4",
        ])
        .args(extra)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{extra:?}: {stderr}");
    assert!(stderr.contains("block events per second"), "{stderr}");
    serde_json::from_slice(&output.stdout).unwrap()
}

#[test]
fn bench_relay_delivers_every_block_and_reports_throughput_and_latency() {
    // Only to learn whether a server can run here: the bench starts its own.
    if NatsServer::start_or_skip("bench_relay_delivers_every_block").is_none() {
        return;
    }
    for (extra, format, pace) in [
        (&["--window", "4"][..], "envelope", "window"),
        (&["--format", "json", "--rate", "20000"][..], "json", "rate"),
    ] {
        let report = bench(extra);
        assert_eq!(report["format"], format, "{report}");
        assert_eq!(report["pace"], pace, "{report}");
        assert_eq!(report["transport"], "core", "{report}");
        let blocks = report["blocks"].as_u64().unwrap();
        // The engines' streams repeat every 51 batches (50 and an AllBlocksCleared):
        // a second covers several cycles, so clearing and starting over is exercised.
        assert!(report["batches"].as_u64().unwrap() > 102, "{report}");
        assert!(blocks > 0, "{report}");
        assert_eq!(report["blocks_applied"].as_u64(), Some(blocks), "{report}");
        assert_eq!(report["router_dropped"], 0, "{report}");
        assert_eq!(report["relay_publish_failures"], 0, "{report}");
        assert!(report["block_events_per_s"].as_f64().unwrap() > 0.0);
        assert!(report["nats_messages_per_s"].as_f64().unwrap() > 0.0);
        let (p50, p99) = (
            report["latency_p50_us"].as_f64().unwrap(),
            report["latency_p99_us"].as_f64().unwrap(),
        );
        assert!(0.0 < p50 && p50 <= p99, "{report}");
        for stage in [
            "engine_decode",
            "nats_encode",
            "router_decode",
            "router_apply",
        ] {
            assert!(
                report["stage_ns_per_block"][stage].as_f64().unwrap() > 0.0,
                "{report}"
            );
        }
    }
}
