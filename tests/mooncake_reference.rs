//! The pool's LRU with leaf-first release reproduces the exact hit ratios of
//! `shared/data/mooncake/conversation_lru_reference.csv` (one shared LRU cache replaying
//! the Mooncake conversation trace) to the 4th decimal, at every capacity listed; so does
//! the full simulator run as one worker with a device cache of that many 512-token blocks
//! holding prompts (generated tokens take no blocks, and partial last blocks are cached,
//! as in the reference), no lower tiers and instant compute; and so does the one-pass LRU
//! curve (`cache::curve`), which equals `replay` at every listed capacity.

mod common;

use kvtwin::pool::EvictionPolicyKind;
use kvtwin_sim::cache::curve::HitCurve;
use kvtwin_sim::cache::replay;
use kvtwin_sim::cluster::simulate;
use kvtwin_sim::scenario::Scenario;
use kvtwin_sim::workload::{read_mooncake_trace, Request, TraceCheck};
use std::path::Path;

/// One row of the reference: capacity in blocks, hit_blocks, hit_tokens.
type Row = (usize, f64, f64);

/// The reference rows and the trace.
fn reference(what: &str) -> Option<(Vec<Row>, Vec<Request>)> {
    let shared = common::shared_dir(what)?;
    let dir = shared.join("data").join("mooncake");
    let requests = read_mooncake_trace(
        &dir.join("conversation_trace.jsonl"),
        TraceCheck::strict(512),
    )
    .unwrap()
    .requests;
    assert_eq!(requests.len(), 12_031);
    let csv = std::fs::read_to_string(dir.join("conversation_lru_reference.csv")).unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let column = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let (capacity, hit_blocks, hit_tokens) = (
        column("capacity_blocks"),
        column("hit_blocks"),
        column("hit_tokens"),
    );
    let rows: Vec<Row> = lines
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let fields: Vec<&str> = line.split(',').collect();
            (
                fields[capacity].parse().unwrap(),
                fields[hit_blocks].parse().unwrap(),
                fields[hit_tokens].parse().unwrap(),
            )
        })
        .collect();
    assert!(rows.len() >= 5, "the reference lists {} rows", rows.len());
    Some((rows, requests))
}

#[test]
fn the_simulator_as_one_worker_reproduces_the_mooncake_lru_reference() {
    let Some((rows, requests)) = reference("the simulator's Mooncake reference test") else {
        return;
    };
    for (capacity, expected_blocks, expected_tokens) in rows {
        let text = format!(
            r#"(
            name: "oracle", seed: 0,
            hardware: (
                name: "instant", pcie_bytes_per_s: 1000000000, pcie_latency_ns: 0,
                nvme_read_bytes_per_s: 1000000000, nvme_write_bytes_per_s: 1000000000,
                nvme_latency_ns: 0, nic_bytes_per_s: 1000000000, nic_latency_ns: 0,
                prefill_ns_per_token: 0, decode_ns_per_token: 0, max_inflight_transfers: 16,
            ),
            worker: (
                block_size_tokens: 512, bytes_per_block: 1, onboard: CostAware,
                max_inflight_transfers: 16,
                tiers: [(tier: Device, capacity_blocks: {capacity}, eviction: Lru)],
                batching: (decode_blocks: false),
                // The reference caches every hash id, the partial last block included.
                cache_partial_blocks: true,
            ),
            workload: MooncakeTrace(path: "conversation_trace.jsonl"),
        )"#
        );
        let scenario = Scenario::parse(&text, Path::new("oracle.ron")).unwrap();
        let report = simulate(&scenario, &requests).unwrap();
        assert_eq!(report.completed, 12_031, "capacity {capacity}");
        assert_reference(
            capacity,
            (report.hit_ratio, report.hit_token_ratio),
            (expected_blocks, expected_tokens),
        );
    }
}

/// Asserts hit ratios (blocks, tokens) equal the reference's to 4 decimals.
fn assert_reference(
    capacity: usize,
    (blocks, tokens): (f64, f64),
    (ref_blocks, ref_tokens): (f64, f64),
) {
    assert!(
        (blocks - ref_blocks).abs() < 5e-5,
        "capacity {capacity}: hit_blocks {blocks:.6} vs {ref_blocks}"
    );
    assert!(
        (tokens - ref_tokens).abs() < 5e-5,
        "capacity {capacity}: hit_tokens {tokens:.6} vs {ref_tokens}"
    );
}

#[test]
fn pool_reproduces_the_mooncake_lru_reference() {
    let Some((rows, requests)) = reference("the Mooncake reference test") else {
        return;
    };
    for (capacity, expected_blocks, expected_tokens) in rows {
        let row = replay(&requests, capacity, 512, EvictionPolicyKind::Lru).unwrap();
        assert_reference(
            capacity,
            (row.hit_blocks, row.hit_tokens),
            (expected_blocks, expected_tokens),
        );
    }
}

#[test]
fn one_pass_lru_curve_equals_per_capacity_replays_on_the_mooncake_trace() {
    let Some((rows, requests)) = reference("the Mooncake curve test") else {
        return;
    };
    let curve = HitCurve::lru(&requests, 512);
    for (capacity, expected_blocks, expected_tokens) in rows {
        let replayed = replay(&requests, capacity, 512, EvictionPolicyKind::Lru).unwrap();
        let row = curve.row(capacity);
        assert_eq!(row, replayed, "capacity {capacity}");
        assert_reference(
            capacity,
            (row.hit_blocks, row.hit_tokens),
            (expected_blocks, expected_tokens),
        );
    }
}
