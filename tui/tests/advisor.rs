//! `kvtwin advisor --replay`: a recorded event stream through a shared tier. On the
//! Mooncake conversation trace, written as the events of engines that stored every
//! request's blocks, its LRU replay is `kvtwin cache --curve` at every size asked (the
//! same hit ratio to the five decimals `cache` prints; the library's tests check the
//! counts exactly), every policy gives a row, the chart is written, and
//! lines that are not events are named and skipped.
//!
//! `kvtwin advisor --nats / --zmq` (`advisor_live.rs`): live reports of a known stream.

mod common;

use kvtwin::events::{KvCacheEvent, KvCacheEventData, StoredBlock};
use kvtwin::ids::WorkerId;
use kvtwin::tier::Tier;
use kvtwin_plane::wire::RouterEvent;
use kvtwin_sim::mooncake::{MooncakeTraceReader, TraceCheck};
use serde_json::Value;
use std::io::Write;

const CAPACITIES: &str = "1000,5000,20000,97656";

#[test]
fn lru_replay_of_the_traces_events_is_the_cache_curve() {
    let Some(trace) = common::mooncake_trace("the advisor replay test") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let events = dir.path().join("events.jsonl");
    let mut out = std::io::BufWriter::new(std::fs::File::create(&events).unwrap());
    let reader = MooncakeTraceReader::open(&trace, TraceCheck::strict(512)).unwrap();
    for (n, request) in reader.enumerate() {
        let request = request.unwrap();
        let event = RouterEvent {
            // Eight engines, by turns: a shared tier serves each what others stored.
            worker_id: WorkerId::new(n as u64 % 8),
            event: KvCacheEvent {
                event_id: n as u64,
                dp_rank: 0,
                data: KvCacheEventData::Stored {
                    parent_hash: None,
                    blocks: request
                        .blocks
                        .iter()
                        .map(|b| StoredBlock {
                            block_hash: b.sequence_hash,
                            tokens_hash: b.local_hash,
                        })
                        .collect(),
                    tier: Tier::Device,
                },
            },
        };
        out.write_all(&event.to_json()).unwrap();
        out.write_all(b"\n").unwrap();
        if n == 10 {
            // A line that is not an event: named, skipped, the rest kept.
            out.write_all(b"{\"not\": \"an event\"}\n").unwrap();
        }
    }
    drop(out);
    let trace = trace.to_str().unwrap();
    let curve: Value = serde_json::from_str(&common::kvtwin(&[
        "cache",
        "--trace",
        trace,
        "--capacity-blocks",
        CAPACITIES,
        "--curve",
        "--json",
    ]))
    .unwrap();
    let (ok, stdout, stderr) = common::kvtwin_outcome(&[
        "advisor",
        "--replay",
        events.to_str().unwrap(),
        "--capacity-blocks",
        CAPACITIES,
        "--json",
    ]);
    assert!(ok, "{stderr}");
    assert!(
        stderr.contains("events.jsonl:12: not a RouterEvent"),
        "{stderr}"
    );
    let rows: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 4 * 4, "four policies at four sizes: {stdout}");
    for (i, capacity) in CAPACITIES.split(',').enumerate() {
        let expected = &curve["rows"][i]["hit_blocks"];
        let lru = &rows[i];
        assert_eq!(lru["policy"], "lru");
        assert_eq!(lru["capacity_blocks"].to_string(), capacity);
        // `cache --json` writes ratios to five decimals; the advisor, whole.
        let (ratio, expected) = (
            lru["hit_ratio"].as_f64().unwrap(),
            expected.as_f64().unwrap(),
        );
        assert_eq!(
            format!("{:.5}", ratio),
            format!("{expected:.5}"),
            "LRU at {capacity} blocks: {ratio} against the curve's {expected}"
        );
    }
    // Cross-worker hits: with requests dealt to eight engines by turns, most of a
    // conversation's history was stored by another engine.
    let big = &rows[3];
    assert!(
        big["cross_worker_hit_blocks"].as_u64().unwrap() * 2 > big["hit_blocks"].as_u64().unwrap(),
        "{big}"
    );
    // The table and the chart.
    let plots = dir.path().join("plots");
    let table = common::kvtwin(&[
        "advisor",
        "--replay",
        events.to_str().unwrap(),
        "--capacity-blocks",
        CAPACITIES,
        "--policy",
        "lru,s3fifo",
        "--block-bytes",
        "67108864",
        "--plot",
        plots.to_str().unwrap(),
    ]);
    assert!(
        table.contains("s3fifo") && table.contains("read GiB"),
        "{table}"
    );
    assert!(!table.contains("arc"), "{table}");
    assert!(plots.join("advisor-replay.png").is_file());
}

#[test]
fn unknown_policies_and_empty_streams_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.jsonl");
    std::fs::write(&empty, "").unwrap();
    let (ok, _, stderr) = common::kvtwin_outcome(&[
        "advisor",
        "--replay",
        empty.to_str().unwrap(),
        "--capacity-blocks",
        "10",
        "--policy",
        "fifo",
    ]);
    assert!(!ok && stderr.contains("not a policy"), "{stderr}");
    let (ok, _, stderr) = common::kvtwin_outcome(&[
        "advisor",
        "--replay",
        empty.to_str().unwrap(),
        "--capacity-blocks",
        "10",
    ]);
    assert!(!ok && stderr.contains("nothing to replay"), "{stderr}");
}
