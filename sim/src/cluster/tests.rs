//! Unit tests of the cluster: batching, routing, the event plane and faults, on small
//! hand-made scenarios (disaggregation: `tests_disagg.rs`; the whole scenarios: `tests/`).

use super::tests_disagg::disaggregated;
use super::*;
use crate::hardware::Link;
use crate::scenario::WorkloadSpec;
use crate::scenario::{FaultKind, Routing};
use crate::workload::Request;
use kvtwin::block::BlockIdentity;
use kvtwin::ids::{LocalBlockHash, RequestId, Timestamp, WorkerId};
use kvtwin::manager::{OffloadPolicy, TierConfig};
use kvtwin::pool::EvictionPolicyKind;
use kvtwin::tier::Tier;
use std::path::Path;

/// One worker, 16-token blocks, 100 tokens a pass, prefill 1 µs a token and a decode
/// step 100 µs whatever the batch.
pub(super) fn scenario() -> Scenario {
    let text = r#"(
        name: "batching", seed: 1,
        hardware: (
            name: "h", pcie_bytes_per_s: 1000000000, pcie_latency_ns: 0,
            nvme_read_bytes_per_s: 1000000000, nvme_write_bytes_per_s: 1000000000,
            nvme_latency_ns: 0, nic_bytes_per_s: 1000000000, nic_latency_ns: 0,
            prefill_ns_per_token: 1000, decode_ns_per_token: 100000,
            max_inflight_transfers: 8,
        ),
        worker: (
            block_size_tokens: 16, bytes_per_block: 1024, onboard: CostAware,
            max_inflight_transfers: 8,
            tiers: [(tier: Device, capacity_blocks: 64)],
            batching: (max_seqs: 8, max_batch_tokens: 100, chunked_prefill: true),
        ),
        workload: MooncakeTrace(path: "unused.jsonl"),
    )"#;
    let scenario = Scenario::parse(text, Path::new("batching.ron")).unwrap();
    assert!(matches!(
        scenario.workload,
        WorkloadSpec::MooncakeTrace { .. }
    ));
    scenario
}

pub(super) fn request(id: u64, first_local: u64, input_tokens: u64, output_tokens: u64) -> Request {
    let locals: Vec<LocalBlockHash> = (0..input_tokens / 16)
        .map(|b| LocalBlockHash::new(first_local + b))
        .collect();
    Request {
        id: RequestId::new(id),
        arrival: Timestamp::ZERO,
        blocks: BlockIdentity::chain(&locals),
        input_tokens,
        output_tokens,
        think_tokens: 0,
    }
}

#[test]
fn passes_batch_decodes_and_chunk_prefills_within_the_token_budget() {
    // A (150 prompt tokens, 3 out) and B (40 tokens, 2 out) arrive at 0.
    // Pass 1, 0–100 µs: A's first 100 tokens (B arrives while it runs).
    // Pass 2, 100–190 µs: A's last 50 and B's 40: both first tokens at 190 µs.
    // Pass 3, 190–290 µs: both decode; B is done. Pass 4, 290–390 µs: A is done.
    let requests = [request(0, 1000, 150, 3), request(1, 2000, 40, 2)];
    let report = simulate(&scenario(), &requests).unwrap();
    assert_eq!(report.completed, 2);
    assert_eq!((report.ttft.p50_ms, report.ttft.max_ms), (0.19, 0.19));
    assert_eq!(
        (report.end_to_end.p50_ms, report.end_to_end.max_ms),
        (0.29, 0.39)
    );
    assert_eq!(report.passes, 4);
    // A went into the first pass at once; B, arriving during it, into the second.
    assert_eq!((report.queueing.p50_ms, report.queueing.max_ms), (0.0, 0.1));
    // Both decode one token per 100 µs pass after their first.
    assert_eq!((report.tpot.p50_ms, report.tpot.max_ms), (0.1, 0.1));
}

#[test]
fn unchunked_prompts_go_whole_and_alone_when_over_budget() {
    let mut scenario = scenario();
    scenario.worker.batching.chunked_prefill = false;
    // Pass 1, 0–150 µs: A's 150 tokens alone (over the budget, so alone).
    // Pass 2, 150–290 µs: A decodes, B's 40 tokens prefill: B's first token at
    // 190 µs, the pass ends at 290 µs.
    let requests = [request(0, 1000, 150, 3), request(1, 2000, 40, 2)];
    let report = simulate(&scenario, &requests).unwrap();
    assert_eq!((report.ttft.p50_ms, report.ttft.max_ms), (0.15, 0.19));
    assert_eq!(report.completed, 2);
}

#[test]
fn decoding_takes_blocks_and_preempts_the_newest_request_when_they_run_out() {
    // Six blocks of 16 tokens. A and B (32 prompt tokens, 40 out) each need 5 blocks
    // by their last token: together they do not fit, so B, the newer, steps back
    // once A needs its blocks, and finishes after A.
    let mut scenario = scenario();
    scenario.worker.tiers[0].capacity_blocks = 6;
    let requests = [request(0, 1000, 32, 40), request(1, 2000, 32, 40)];
    let report = simulate(&scenario, &requests).unwrap();
    assert_eq!(report.completed, 2);
    assert!(report.preemptions >= 1, "{report:?}");
    assert!(report.events.rebuild_matches_pools);
    // A request too big for the device even alone is rejected, not stuck.
    let report = simulate(&scenario, &[request(0, 1000, 32, 80)]).unwrap();
    assert_eq!((report.completed, report.rejected_too_large), (0, 1));
}

/// `n` requests every `gap_us`, all starting with the same `shared` 16-token blocks
/// (a system prompt), then `own` blocks of their own, `output` tokens out.
pub(super) fn shared_prefix_requests(
    n: u64,
    gap_us: u64,
    shared: u64,
    own: u64,
    output: u64,
) -> Vec<Request> {
    (0..n)
        .map(|i| {
            let locals: Vec<LocalBlockHash> = (0..shared)
                .map(|b| LocalBlockHash::new(1 + b))
                .chain((0..own).map(|b| LocalBlockHash::new(1_000_000 + i * 1000 + b)))
                .collect();
            Request {
                id: RequestId::new(i),
                arrival: Timestamp::from_nanos(i * gap_us * 1000),
                blocks: BlockIdentity::chain(&locals),
                input_tokens: (shared + own) * 16,
                output_tokens: output,
                think_tokens: 0,
            }
        })
        .collect()
}

/// A small device writing back to host, and host to disk.
pub(super) fn tiers_with_write_back() -> Vec<TierConfig> {
    vec![
        TierConfig {
            tier: Tier::Device,
            capacity_blocks: 24,
            eviction: EvictionPolicyKind::Lru,
            offload: OffloadPolicy::WriteBack {
                low_watermark_blocks: 8,
            },
        },
        TierConfig {
            tier: Tier::Host,
            capacity_blocks: 40,
            eviction: EvictionPolicyKind::Lru,
            offload: OffloadPolicy::WriteBack {
                low_watermark_blocks: 8,
            },
        },
        TierConfig {
            tier: Tier::Disk,
            capacity_blocks: 60,
            eviction: EvictionPolicyKind::Lru,
            offload: OffloadPolicy::None,
        },
    ]
}

pub(super) fn cluster(workers: usize, routing: Routing) -> Scenario {
    let mut scenario = scenario();
    scenario.cluster.workers = workers;
    scenario.cluster.routing = routing;
    scenario
}

#[test]
fn kv_routing_spreads_a_shared_prefix_by_load_and_the_router_sees_every_pool() {
    // Every request shares its first 8 blocks: by overlap alone all would go to the
    // first worker that cached them (the hot spot); the load term spreads them.
    let requests = shared_prefix_requests(40, 20, 8, 2, 50);
    let report = simulate(&cluster(4, Routing::Kv), &requests).unwrap();
    assert_eq!(report.completed, 40);
    assert_eq!(report.routing.requests_per_worker.len(), 4);
    assert!(
        report.routing.requests_per_worker.iter().all(|n| *n >= 5),
        "{:?}",
        report.routing.requests_per_worker
    );
    // The router found the shared prefix on the worker it chose.
    assert!(report.routing.mean_overlap_blocks > 4.0, "{report:?}");
    assert!(report.routing.view_matches_pools);
    assert_eq!(report.routing.events_rejected, 0);
    assert_eq!(report.routing.events_applied, report.events.events);
}

#[test]
fn round_robin_takes_turns_and_each_worker_computes_the_shared_prefix_once() {
    // 200 µs apart: a worker's previous prompt (160 µs of prefill) is cached by the
    // time its next request comes.
    let requests = shared_prefix_requests(40, 200, 8, 2, 50);
    let rr = simulate(&cluster(4, Routing::RoundRobin), &requests).unwrap();
    assert_eq!(rr.routing.requests_per_worker, vec![10, 10, 10, 10]);
    assert_eq!(rr.routing.mean_overlap_blocks, 0.0);
    // Each worker computes the shared prefix once: 4 × 8 blocks.
    assert_eq!(rr.blocks.total - rr.blocks.computed, 40 * 8 - 4 * 8);
    assert!(rr.routing.view_matches_pools);
}

#[test]
fn a_tiered_worker_under_pressure_publishes_events_the_router_accepts_in_order() {
    // A small device writing back to host, and host to disk: blocks are copied down
    // and evicted in the same batches of events. Cross-tier order matters: a block stored on host must
    // reach the router before its parent leaves the device, or it is refused.
    let mut scenario = cluster(2, Routing::Kv);
    scenario.worker.tiers = tiers_with_write_back();
    let requests = shared_prefix_requests(60, 300, 4, 6, 20);
    let report = simulate(&scenario, &requests).unwrap();
    assert_eq!(report.completed, 60);
    assert!(
        report.offloaded_blocks[Tier::Host.index()] > 0,
        "{report:?}"
    );
    assert!(report.events.removed_blocks > 0, "{report:?}");
    assert_eq!(report.routing.events_rejected, 0, "{report:?}");
    assert!(report.routing.view_matches_pools);
    assert!(report.events.rebuild_matches_pools);
}

#[test]
fn the_event_plane_delays_and_loses_events_as_configured() {
    let requests = shared_prefix_requests(20, 20, 4, 2, 10);
    // Delayed: every event still arrives (the run drains the plane), in order.
    let mut delayed = cluster(2, Routing::Kv);
    delayed.cluster.event_plane.delay_us = 5_000;
    let report = simulate(&delayed, &requests).unwrap();
    assert_eq!(report.routing.events_applied, report.events.events);
    assert_eq!(report.routing.events_dropped, 0);
    assert!(report.routing.view_matches_pools);
    // Lost: the router learns nothing, and the report says its view is wrong.
    let mut lossy = cluster(2, Routing::Kv);
    lossy.cluster.event_plane.drop_probability = 1.0;
    let report = simulate(&lossy, &requests).unwrap();
    assert_eq!(report.routing.events_dropped, report.events.events);
    assert_eq!(report.routing.events_applied, 0);
    assert!(!report.routing.view_matches_pools);
    assert_eq!(report.routing.mean_overlap_blocks, 0.0);
    // Half lost, drawn from the run's seed: the same seed loses the same events.
    let mut half = cluster(2, Routing::Kv);
    half.cluster.event_plane.drop_probability = 0.5;
    let (a, b) = (
        simulate(&half, &requests).unwrap(),
        simulate(&half, &requests).unwrap(),
    );
    assert_eq!(a.to_json(), b.to_json());
    assert!(
        a.routing.events_dropped > 0 && a.routing.events_applied > 0,
        "{a:?}"
    );
}

#[test]
fn blocks_filled_by_earlier_prefill_chunks_are_hits_for_a_request_arriving_meanwhile() {
    // A's 160 tokens take two passes (100-token budget): after the first (100 µs) six
    // full blocks are registered, so B, same prompt, arriving at 150 µs, hits them.
    let mut requests = shared_prefix_requests(2, 150, 10, 0, 2);
    requests[1].arrival = Timestamp::from_nanos(150_000);
    let report = simulate(&scenario(), &requests).unwrap();
    assert_eq!(report.completed, 2);
    assert_eq!(report.blocks.device, 6, "{report:?}");
}

/// The report without `engine_events`, the one field planned decode steps change.
fn outcome(report: &Report) -> String {
    let mut value: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
    value.as_object_mut().unwrap().remove("engine_events");
    value.to_string()
}

#[test]
fn planned_decode_steps_change_nothing_but_the_count_of_queue_wakeups() {
    let mut cases: Vec<(Scenario, Vec<Request>)> = Vec::new();
    for (workers, routing, gap_us) in [
        (1, Routing::Kv, 20),
        (3, Routing::Kv, 700),
        (4, Routing::RoundRobin, 3_000),
    ] {
        cases.push((
            cluster(workers, routing),
            shared_prefix_requests(30, gap_us, 4, 3, 120),
        ));
    }
    // Preemption: decode blocks run out.
    let mut tight = scenario();
    tight.worker.tiers[0].capacity_blocks = 12;
    cases.push((
        tight,
        vec![request(0, 1000, 32, 90), request(1, 2000, 32, 90)],
    ));
    // An arrival exactly at a step end: A's prefill ends at 96 µs, its decode steps at
    // 196, 296, ... µs; B comes at 496 µs and joins the pass after the one that
    // starts then.
    let mut late = request(1, 2000, 32, 5);
    late.arrival = Timestamp::from_nanos(496_000);
    cases.push((scenario(), vec![request(0, 1000, 96, 30), late]));
    // Transfers: write-back to host and disk, onboarding from them, and the
    // deadlines they bring.
    let mut tiered = cluster(2, Routing::Kv);
    tiered.worker.tiers = tiers_with_write_back();
    // Big blocks on 1 GB/s links: copies take milliseconds, decode steps 100 µs, so
    // onboarded requests become ready in the middle of decode phases.
    tiered.worker.bytes_per_block = 4 << 20;
    tiered.worker.onboard = kvtwin::manager::OnboardPolicy::Always;
    // Every tenth request repeats a prompt, by then copied down and evicted: onboarded.
    let mut repeats = shared_prefix_requests(60, 300, 4, 6, 120);
    for i in 10..repeats.len() {
        let earlier = repeats[i - 10].blocks.clone();
        repeats[i].blocks = earlier;
    }
    cases.push((tiered, repeats));
    // Generated blocks cached and reasoning cooled at ExitThink: steps that fill a
    // block or end the reasoning are never planned away.
    // Under pressure, with write-back: when blocks cool decides what is written back
    // and evicted first.
    let mut reasoning = cluster(2, Routing::Kv);
    reasoning.worker.cache_output_blocks = true;
    reasoning.worker.tiers = tiers_with_write_back();
    reasoning.worker.tiers[0].capacity_blocks = 48;
    for tier in &mut reasoning.worker.tiers[..2] {
        tier.eviction = EvictionPolicyKind::Priority;
    }
    reasoning.worker.bytes_per_block = 1 << 20;
    let mut thinking = shared_prefix_requests(20, 400, 3, 2, 150);
    for (k, request) in thinking.iter_mut().enumerate() {
        request.think_tokens = 40 + 7 * k as u64;
    }
    cases.push((reasoning, thinking));
    // A lossy, late event plane.
    let mut lossy = cluster(2, Routing::Kv);
    lossy.cluster.event_plane.delay_us = 250;
    lossy.cluster.event_plane.drop_probability = 0.2;
    cases.push((lossy, shared_prefix_requests(25, 100, 2, 2, 60)));
    // Disaggregated: handoffs land on decode workers in the middle of their decode
    // phases (64 KiB blocks take the fabric tens of microseconds), and prefills end
    // and send new ones while they decode.
    let mut disagg = disaggregated(2, 2, 4);
    disagg.cluster.routing = Routing::Kv;
    disagg.worker.bytes_per_block = 64 << 10;
    cases.push((disagg.clone(), shared_prefix_requests(30, 700, 4, 3, 120)));
    // Round-robin, every request at once: handoffs wait for decode blocks.
    let mut crowded = disaggregated(1, 2, 16);
    crowded.worker.tiers[0].capacity_blocks = 40;
    cases.push((crowded, shared_prefix_requests(12, 0, 2, 2, 150)));
    // Crashes, aggregated: a worker goes down in the middle of a plan.
    cases.push(faulty(vec![
        fault(
            7,
            FaultKind::WorkerCrash {
                worker: 1,
                down_ms: 5,
            },
        ),
        fault(
            13,
            FaultKind::WorkerCrash {
                worker: 2,
                down_ms: 3,
            },
        ),
    ]));
    // And crashes of both pools: aborted handoffs, none up for a while.
    disagg.faults = vec![
        fault(
            3,
            FaultKind::WorkerCrash {
                worker: 0,
                down_ms: 2,
            },
        ),
        fault(
            6,
            FaultKind::WorkerCrash {
                worker: 2,
                down_ms: 4,
            },
        ),
        fault(
            7,
            FaultKind::WorkerCrash {
                worker: 3,
                down_ms: 2,
            },
        ),
    ];
    cases.push((disagg, shared_prefix_requests(30, 700, 4, 3, 120)));
    for (planned, requests) in cases {
        let mut single = planned.clone();
        single.worker.batching.plan_decode_steps = false;
        let a = simulate(&planned, &requests).unwrap();
        let b = simulate(&single, &requests).unwrap();
        assert_eq!(outcome(&a), outcome(&b));
        assert!(
            a.engine_events < b.engine_events,
            "{} vs {}",
            a.engine_events,
            b.engine_events
        );
    }
}

#[test]
fn generated_blocks_are_cached_and_reasoning_blocks_cool_at_exit_think() {
    // 32 prompt tokens (2 blocks of 16), 100 generated, the first 60 reasoning.
    // Blocks fill as tokens are computed (all but the newest): (32 + 100 - 1) / 16 = 8
    // full blocks, 6 of them output. Blocks 2, 3 and 4 end by token 80 <= 32 + 60:
    // reasoning; block 5 holds tokens 80-95, answer tokens among them.
    let mut scenario = scenario();
    scenario.worker.cache_output_blocks = true;
    scenario.worker.tiers[0].eviction = kvtwin::pool::EvictionPolicyKind::Priority;
    let mut thinker = request(0, 1000, 32, 100);
    thinker.think_tokens = 60;
    let report = simulate(&scenario, &[thinker.clone()]).unwrap();
    assert_eq!(
        report.output_blocks,
        Some(OutputBlocksReport {
            cached: 6,
            reasoning_cooled: 3,
        })
    );
    assert!(report.routing.view_matches_pools);
    assert!(report.events.rebuild_matches_pools);
    // Without output caching nothing is registered past the prompt, and the report
    // has no such section.
    scenario.worker.cache_output_blocks = false;
    let plain = simulate(&scenario, &[thinker]).unwrap();
    assert_eq!(plain.output_blocks, None);
    assert_eq!(report.events.stored_blocks, plain.events.stored_blocks + 6);
    assert!(!plain.to_json().contains("output_blocks"));
}

#[test]
fn cached_outputs_need_decode_blocks_and_whole_prompt_blocks() {
    let mut text = String::from(
        r#"(name: "x", seed: 1,
        hardware: (name: "h", pcie_bytes_per_s: 1, pcie_latency_ns: 0,
            nvme_read_bytes_per_s: 1, nvme_write_bytes_per_s: 1, nvme_latency_ns: 0,
            nic_bytes_per_s: 1, nic_latency_ns: 0, prefill_ns_per_token: 1,
            decode_ns_per_token: 1, max_inflight_transfers: 1),
        worker: (block_size_tokens: 16, bytes_per_block: 1, onboard: CostAware,
            max_inflight_transfers: 1, tiers: [(tier: Device, capacity_blocks: 8)],
            cache_output_blocks: true, cache_partial_blocks: true),
        workload: MooncakeTrace(path: "t.jsonl"))"#,
    );
    let error = Scenario::parse(&text, Path::new("x.ron")).unwrap_err();
    assert!(error.to_string().contains("cache_output_blocks"), "{error}");
    text = text.replace(
        "cache_partial_blocks: true",
        "batching: (decode_blocks: false)",
    );
    assert!(Scenario::parse(&text, Path::new("x.ron")).is_err());
    text = text.replace("batching: (decode_blocks: false)", "");
    assert!(Scenario::parse(&text, Path::new("x.ron")).is_ok());
}

pub(super) fn fault(at_ms: u64, kind: FaultKind) -> Fault {
    Fault { at_ms, kind }
}

/// 60 requests 500 µs apart over three workers, decodes long enough (60 tokens of
/// 100 µs) that several are running on every worker at any time.
fn faulty(faults: Vec<Fault>) -> (Scenario, Vec<Request>) {
    let mut scenario = cluster(3, Routing::Kv);
    scenario.faults = faults;
    (scenario, shared_prefix_requests(60, 500, 4, 3, 60))
}

#[test]
fn a_crashed_workers_requests_finish_elsewhere_and_it_comes_back_empty() {
    let (scenario, requests) = faulty(vec![fault(
        10,
        FaultKind::WorkerCrash {
            worker: 1,
            down_ms: 10,
        },
    )]);
    let report = simulate(&scenario, &requests).unwrap();
    assert_eq!(report.completed, 60, "{report:?}");
    assert!(report.faults.requests_retried > 0, "{report:?}");
    assert_eq!(report.faults.applied, 1);
    assert!(report.routing.view_matches_pools);
    // It served before the crash and after it came back.
    assert!(report.routing.requests_per_worker[1] > report.faults.requests_retried);
    assert!(report.events.rebuild_matches_pools);
}

#[test]
fn requests_wait_while_no_worker_is_up() {
    let (mut scenario, requests) = faulty(vec![fault(
        10,
        FaultKind::WorkerCrash {
            worker: 0,
            down_ms: 50,
        },
    )]);
    scenario.cluster.workers = 1;
    let report = simulate(&scenario, &requests).unwrap();
    assert_eq!(report.completed, 60);
    assert_eq!(report.faults.requests_unserved, 0);
    // Nothing was served between 10 and 60 ms: requests arriving then waited.
    assert!(report.ttft.max_ms > 20.0, "{report:?}");
    let mut round_robin = scenario.clone();
    round_robin.cluster.routing = Routing::RoundRobin;
    let report = simulate(&round_robin, &requests).unwrap();
    assert_eq!((report.completed, report.faults.requests_unserved), (60, 0));
    assert!(report.ttft.max_ms > 20.0, "{report:?}");
}

#[test]
fn after_lost_events_heartbeats_and_snapshots_bring_the_router_back_in_line() {
    let loss = fault(
        10,
        FaultKind::EventLoss {
            probability: 0.5,
            for_ms: 60,
        },
    );
    let (mut scenario, requests) = faulty(vec![loss]);
    scenario.cluster.event_plane.heartbeat_ms = 5;
    let report = simulate(&scenario, &requests).unwrap();
    assert!(report.routing.events_dropped > 0);
    assert!(report.faults.snapshots > 0, "{report:?}");
    assert!(report.routing.view_matches_pools, "{report:?}");
    assert_eq!(report.completed, 60);
    // Without heartbeats the router never learns what it missed at the end.
    scenario.cluster.event_plane.heartbeat_ms = 0;
    scenario.faults[0].kind = FaultKind::EventLoss {
        probability: 1.0,
        for_ms: 1_000_000,
    };
    let report = simulate(&scenario, &requests).unwrap();
    assert!(!report.routing.view_matches_pools, "{report:?}");
}

#[test]
fn a_restarted_router_rebuilds_its_view_from_snapshots() {
    let (scenario, requests) = faulty(vec![fault(60, FaultKind::RouterRestart)]);
    let report = simulate(&scenario, &requests).unwrap();
    assert_eq!(report.faults.snapshots, 3);
    assert!(report.routing.view_matches_pools, "{report:?}");
    assert_eq!(report.routing.events_rejected, 0);
    assert_eq!(report.completed, 60);
}

#[test]
fn lagging_events_arrive_late_but_arrive() {
    let (scenario, requests) = faulty(vec![fault(
        5,
        FaultKind::EventLag {
            delay_us: 20_000,
            for_ms: 50,
        },
    )]);
    let report = simulate(&scenario, &requests).unwrap();
    assert_eq!(report.routing.events_applied, report.events.events);
    assert_eq!(report.faults.snapshots, 0);
    assert!(report.routing.view_matches_pools);
    // The events of those 50 ms went through the queue instead of straight through.
    let prompt = simulate(&faulty(Vec::new()).0, &requests).unwrap();
    assert!(report.engine_events > prompt.engine_events + 50);
}

#[test]
fn a_slow_link_slows_the_copies_on_it_until_the_fault_ends() {
    // Write-back to host over a PCIe link slowed to a tenth for the whole run, or
    // for none of it.
    let run = |factor: f64| {
        let (mut scenario, requests) = faulty(vec![fault(
            0,
            FaultKind::LinkSlowdown {
                worker: None,
                link: Link::PcieDeviceToHost,
                factor,
                for_ms: 1_000_000,
            },
        )]);
        scenario.worker.tiers = tiers_with_write_back();
        scenario.worker.bytes_per_block = 1 << 20;
        simulate(&scenario, &requests).unwrap()
    };
    let (slow, normal) = (run(0.1), run(1.0));
    // Busy time per byte carried: ten times as long at a tenth of the speed. (It
    // carries fewer bytes too: blocks are evicted before their copies can start.)
    let per_byte = |r: &Report| {
        let link = r.links.iter().find(|l| l.link == "pcie_d2h").unwrap();
        link.utilisation / link.bytes as f64
    };
    let ratio = per_byte(&slow) / per_byte(&normal);
    assert!((9.0..11.0).contains(&ratio), "{ratio}");
    let carried = |r: &Report| r.links.iter().find(|l| l.link == "pcie_d2h").unwrap().bytes;
    assert!(carried(&slow) < carried(&normal));
    assert_eq!(slow.completed, 60);
}

/// Write-back to host and disk, 1 MiB blocks (a millisecond each on the 1 GB/s NVMe
/// link, so copies are in flight at any time), every lower-tier hit onboarded, and
/// from the tenth request on each one repeating the prompt of the one ten before it,
/// by then written back and evicted: onboarded from host or disk.
fn with_a_busy_disk(faults: Vec<Fault>) -> (Scenario, Vec<Request>) {
    let (mut scenario, mut requests) = faulty(faults);
    // A host small enough to write back to disk all the time.
    scenario.worker.tiers = tiers_with_write_back();
    scenario.worker.tiers[1].capacity_blocks = 12;
    scenario.worker.tiers[1].offload = OffloadPolicy::WriteBack {
        low_watermark_blocks: 4,
    };
    scenario.worker.bytes_per_block = 1 << 20;
    scenario.worker.onboard = kvtwin::manager::OnboardPolicy::Always;
    for i in 10..requests.len() {
        let earlier = requests[i - 10].blocks.clone();
        requests[i].blocks = earlier;
    }
    (scenario, requests)
}

#[test]
fn a_failed_ssd_loses_its_blocks_is_never_read_while_down_and_comes_back_empty() {
    let (scenario, requests) = with_a_busy_disk(vec![fault(
        26,
        FaultKind::SsdFailure {
            worker: 0,
            down_ms: 10,
        },
    )]);
    // By 26 ms worker 0 has written some blocks back to disk and onboards from it;
    // the run lasts about 50 ms.
    let (fails, back) = (
        Timestamp::from_nanos(26_000_000),
        Timestamp::from_nanos(36_000_000),
    );
    // What worker 0's disk held just before the fault, what the manager had planned
    // to onboard from it when it failed, and what it had written when it came back.
    let mut held_before = 0;
    let mut at_failure = None;
    let mut written_at_return = None;
    let mut written_at_end = 0;
    let mut observed_down = 0;
    let report = simulate_observed(&scenario, requests.iter().cloned(), |sim| {
        let worker = &sim.workers[0];
        let manager = &worker.manager;
        let disk = manager.pool(Tier::Disk).unwrap().snapshot().registered;
        let stats = manager.stats();
        if sim.now < fails {
            held_before = disk.len();
        } else if sim.now < back {
            observed_down += 1;
            assert!(manager.tier_is_down(Tier::Disk));
            // Gone at once, from the pool and from the router's view of it.
            assert!(disk.is_empty(), "at {:?}: {disk:?}", sim.now);
            let view = sim.route.router.indexer().blocks_of(worker.key);
            assert!(
                view.values()
                    .all(|tiers| tiers & (1 << Tier::Disk.index()) == 0),
                "at {:?} the router still sees disk blocks",
                sim.now
            );
            // Never planned from, never read, never written.
            let planned = stats.onboard_planned_blocks[Tier::Disk.index()];
            let then = *at_failure.get_or_insert((
                planned,
                stats.onboarded_blocks[Tier::Disk.index()],
                stats.offloaded_blocks[Tier::Disk.index()],
            ));
            assert_eq!(
                (
                    planned,
                    stats.onboarded_blocks[Tier::Disk.index()],
                    stats.offloaded_blocks[Tier::Disk.index()]
                ),
                then,
                "at {:?}",
                sim.now
            );
        } else {
            assert!(!manager.tier_is_down(Tier::Disk));
            if written_at_return.is_none() {
                assert!(disk.is_empty(), "it comes back empty");
            }
            written_at_return.get_or_insert(stats.offloaded_blocks[Tier::Disk.index()]);
            written_at_end = stats.offloaded_blocks[Tier::Disk.index()];
        }
    })
    .unwrap();
    assert!(held_before > 0, "the disk held nothing to lose");
    assert!(observed_down > 10, "{observed_down} events while down");
    assert_eq!(
        report.faults.disk_blocks_lost, held_before as u64,
        "{report:?}"
    );
    assert!(report.faults.disk_transfers_failed > 0, "{report:?}");
    // Used again once back.
    assert!(
        written_at_end > written_at_return.unwrap_or(u64::MAX),
        "{report:?}"
    );
    // Converged: every request served, the router's view exact.
    assert_eq!(report.completed, 60);
    assert_eq!(report.faults.applied, 1);
    assert!(report.routing.view_matches_pools, "{report:?}");
    assert!(report.events.rebuild_matches_pools);
    assert_eq!(report.routing.events_rejected, 0, "{report:?}");
    assert!(report
        .to_string()
        .contains(&format!("SSD failures lost {held_before} disk blocks")));
    // The same run again gives the same report.
    assert_eq!(
        report.to_json(),
        simulate(&scenario, &requests).unwrap().to_json()
    );
}

#[test]
fn an_ssd_failure_needs_a_disk_tier() {
    let mut scenario = faulty(Vec::new()).0;
    scenario.faults = vec![fault(
        1,
        FaultKind::SsdFailure {
            worker: 0,
            down_ms: 1,
        },
    )];
    let text = ron::to_string(&scenario).unwrap();
    let error = Scenario::parse(&text, Path::new("f.ron")).unwrap_err();
    assert!(error.to_string().contains("disk tier"), "{error}");
    scenario.worker.tiers = tiers_with_write_back();
    let text = ron::to_string(&scenario).unwrap();
    assert!(Scenario::parse(&text, Path::new("f.ron")).is_ok());
}

#[test]
fn a_fault_naming_a_missing_worker_is_an_error() {
    let mut scenario = faulty(Vec::new()).0;
    scenario.faults = vec![fault(
        1,
        FaultKind::WorkerCrash {
            worker: 7,
            down_ms: 1,
        },
    )];
    let text = ron::to_string(&scenario).unwrap();
    let error = Scenario::parse(&text, Path::new("f.ron")).unwrap_err();
    assert!(
        error.to_string().starts_with("f.ron: faults[0]:"),
        "{error}"
    );
}

#[test]
fn a_fault_injected_mid_run_is_the_fault_on_the_timeline_but_for_queue_wakeups() {
    // Decodes are planned many steps ahead while nothing arrives; a crash injected in the
    // middle of its worker's plan cuts the plan at the crash, as knowing the crash from
    // the start would have: the crash keeps exactly the tokens of the steps done by then.
    let (mut scenario, mut requests) = faulty(Vec::new());
    requests.truncate(20);
    scenario.worker.tiers = tiers_with_write_back();
    let ms = |ns: u64| Timestamp::from_nanos(ns * 1_000_000);
    // Where worker 1's plan spans a whole millisecond with steps on both sides of it.
    let mut probe = Cluster::new(&scenario, requests.iter().cloned()).unwrap();
    let crash_ms = loop {
        assert!(probe.step(), "worker 1 never planned across a millisecond");
        let Some(pass) = probe.workers[1].pass.as_ref() else {
            continue;
        };
        let next_ms = pass.first_step_ends_at.as_nanos().div_ceil(1_000_000);
        let (_, steps_to_crash) = pass.first_step_ending_at_or_after(
            ms(next_ms),
            &probe.shape.compute,
            probe.shape.device_capacity_tokens,
        );
        if steps_to_crash < pass.steps && probe.now() < ms(next_ms) {
            break next_ms;
        }
    };
    let crash = fault(
        crash_ms,
        FaultKind::WorkerCrash {
            worker: 1,
            down_ms: 5,
        },
    );
    let slow = fault(
        crash_ms + 2,
        FaultKind::LinkSlowdown {
            worker: None,
            link: Link::PcieDeviceToHost,
            factor: 0.5,
            for_ms: 3,
        },
    );
    // Injected at the moment the plan is in flight.
    let mut cluster = Cluster::new(&scenario, requests.iter().cloned()).unwrap();
    while cluster.now() < probe.now() {
        assert!(cluster.step());
    }
    assert!(cluster.workers[1]
        .pass
        .as_ref()
        .is_some_and(|p| p.ends_at > ms(crash_ms)));
    cluster.inject(crash.clone()).unwrap();
    cluster.inject(slow.clone()).unwrap();
    let injected = cluster.run();
    // On the timeline from the start.
    scenario.faults = vec![crash, slow];
    let planned = simulate(&scenario, &requests).unwrap();
    assert_eq!(planned.faults.applied, 2);
    assert!(planned.faults.requests_retried > 0);
    assert_eq!(outcome(&injected), outcome(&planned));
}

#[test]
fn commands_answer_with_typed_errors_where_they_cannot_apply() {
    let (scenario, requests) = faulty(Vec::new());
    let mut cluster = Cluster::new(&scenario, requests.iter().cloned()).unwrap();
    assert_eq!(
        cluster.remove_worker(WorkerId::new(7), Removal::Kill),
        Err(CommandError::UnknownWorker(WorkerId::new(7)))
    );
    let ssd = fault(
        1,
        FaultKind::SsdFailure {
            worker: 0,
            down_ms: 1,
        },
    );
    assert_eq!(
        cluster.inject(ssd),
        Err(CommandError::Fault(
            "an SSD failure needs a worker with a disk tier"
        ))
    );
    let mut disaggregated =
        Cluster::new(&disaggregated(1, 1, 4), requests.iter().cloned()).unwrap();
    assert_eq!(disaggregated.add_worker(), Err(CommandError::Disaggregated));
    // A worker drained at once, with nothing on it, leaves at once; the run goes on.
    cluster
        .remove_worker(WorkerId::new(2), Removal::Drain)
        .unwrap();
    assert_eq!(cluster.snapshot().workers[2].status, WorkerStatus::Removed);
    let report = cluster.run();
    assert_eq!(report.completed, 60);
    assert_eq!(report.routing.requests_per_worker[2], 0);
    assert!(report.routing.view_matches_pools);
}
