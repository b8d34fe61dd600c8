//! Unit tests of the shared tier in the cluster: reads of what another worker wrote,
//! the router's credit, crashes mid-read (the store itself: `crate::shared`).

use super::tests::{cluster, fault, shared_prefix_requests};
use super::*;
use crate::scenario::{FaultKind, Routing};

/// `workers` behind `routing`, with a store of `capacity_blocks` at `bytes_per_s`.
fn with_store(
    workers: usize,
    routing: Routing,
    capacity_blocks: u64,
    bytes_per_s: u64,
) -> Scenario {
    let mut scenario = cluster(workers, routing);
    scenario.cluster.shared_tier.capacity_blocks = capacity_blocks;
    scenario.cluster.shared_tier.bytes_per_s = bytes_per_s;
    scenario.cluster.shared_tier.latency_ns = 1_000;
    scenario
}

#[test]
fn each_worker_reads_the_prefix_another_computed_instead_of_computing_it() {
    // Round robin, 200 µs apart: without a store each of the 4 workers computes the
    // 8-block system prompt once (see the test of round robin); with one, only the
    // first does, and the other three read it.
    let requests = shared_prefix_requests(40, 200, 8, 2, 50);
    let none = simulate(&cluster(4, Routing::RoundRobin), &requests).unwrap();
    let shared = simulate(
        &with_store(4, Routing::RoundRobin, 1_000, 1_000_000_000),
        &requests,
    )
    .unwrap();
    assert_eq!(none.blocks.computed, 40 * 2 + 4 * 8);
    assert_eq!(shared.blocks.computed, 40 * 2 + 8);
    assert_eq!(shared.blocks.shared, 3 * 8);
    let store = shared.shared_tier.as_ref().unwrap();
    assert_eq!((store.reads, store.read_blocks), (3, 24));
    assert_eq!(
        store.cross_worker_blocks, 24,
        "written by worker 0, read by 1–3"
    );
    // Each request's own 2 blocks and the prefix once; each registered block once.
    assert_eq!(store.written_blocks, 40 * 2 + 8);
    assert!((store.cross_worker_hit_ratio - 24.0 / 400.0).abs() < 1e-12);
    assert!(shared.hit_ratio > none.hit_ratio);
    // A read of 8 blocks (8,192 bytes) takes 8.192 µs and 1 µs of latency; computing
    // their 128 tokens, 128 µs.
    assert!(shared.ttft.mean_ms < none.ttft.mean_ms, "{shared}");
    assert_eq!(store.read_time.max_ms, 0.009192);
    assert!(shared.events.rebuild_matches_pools && shared.routing.view_matches_pools);
    // Without a store the JSON has no trace of one.
    assert!(!none.to_json().contains("shared"), "{}", none.to_json());
}

#[test]
fn a_slow_store_delays_the_first_token_of_the_request_reading_from_it() {
    // One worker, a store of 1 MB/s. Request 1 (at 40 ms) finds request 0's prompt on
    // the device and reads nothing; a crash at 50 ms wipes the device, so request 2 (at
    // 80 ms) reads the 8-block prefix: 8 KiB at 1 MB/s, 8.2 ms, where computing it takes
    // 128 µs.
    let requests = shared_prefix_requests(3, 40_000, 8, 2, 5);
    let mut scenario = with_store(1, Routing::Kv, 1_000, 1_000_000);
    scenario.faults = vec![fault(
        50,
        FaultKind::WorkerCrash {
            worker: 0,
            down_ms: 1,
        },
    )];
    let report = simulate(&scenario, &requests).unwrap();
    let store = report.shared_tier.as_ref().unwrap();
    assert_eq!(report.completed, 3);
    assert_eq!((store.reads, store.read_blocks), (1, 8));
    assert_eq!(
        store.cross_worker_blocks, 0,
        "its own blocks, from before the crash"
    );
    assert_eq!(store.read_time.max_ms, 8.193);
    assert!(report.ttft.max_ms > 8.193, "{report}");
}

#[test]
fn the_kv_router_credits_a_prefix_found_only_in_the_store() {
    // One 32-block system prompt, and load weighed lightly (0.1 a block): by device
    // overlap alone the router piles requests on the worker that cached the prompt
    // until ten of them run there. With the store holding the prompt, a worker without
    // it is credited for reading it (fully, at credit 1), so load decides sooner, and
    // less of the overlap is on the device.
    let requests = shared_prefix_requests(40, 20, 32, 2, 50);
    let mut credited = with_store(4, Routing::Kv, 1_000, 1_000_000_000);
    credited.cluster.scheduler.block_load_weight = 0.1;
    credited.cluster.shared_tier.router_credit = 1.0;
    let mut uncredited = credited.clone();
    uncredited.cluster.shared_tier.router_credit = 0.0;
    let a = simulate(&credited, &requests).unwrap();
    let b = simulate(&uncredited, &requests).unwrap();
    assert_eq!((a.completed, b.completed), (40, 40));
    assert!(
        a.routing.mean_overlap_blocks < b.routing.mean_overlap_blocks,
        "credited {} uncredited {}",
        a.routing.mean_overlap_blocks,
        b.routing.mean_overlap_blocks
    );
    let spread = |r: &Report| {
        let n = &r.routing.requests_per_worker;
        n.iter().max().unwrap() - n.iter().min().unwrap()
    };
    assert!(spread(&a) <= spread(&b), "{a}\n{b}");
    assert!(a.shared_tier.unwrap().read_blocks > b.shared_tier.unwrap().read_blocks);
}
