//! Unit tests of a disaggregated cluster: handoffs over the NICs, decode blocks, crashes
//! of either side mid-handoff, and determinism, on small hand-made scenarios.

use super::tests::{cluster, fault, request, shared_prefix_requests, tiers_with_write_back};
use super::worker::State;
use super::*;
use crate::hardware::Link;
use crate::scenario::{Disaggregation, FaultKind, Routing};
use kvtwin::ids::WorkerWithDpRank;
use kvtwin::ids::{Timestamp, WorkerId};
use std::path::Path;

/// `prefill` prefill workers and `decode` decode workers of `scenario()` (1 GB/s
/// NICs with `nic_latency_ns`), frames of `frame_blocks` blocks, no switch.
pub(super) fn disaggregated(prefill: usize, decode: usize, frame_blocks: usize) -> Scenario {
    let mut scenario = cluster(prefill + decode, Routing::RoundRobin);
    scenario.hardware.nic_latency_ns = 5_000;
    scenario.cluster.disaggregation = Some(Disaggregation {
        prefill_workers: prefill,
        frame_blocks,
        switch_bytes_per_s: 0,
        switch_latency_ns: 0,
    });
    scenario
}

/// Nanoseconds as the report's milliseconds.
pub(super) fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

#[test]
fn a_disaggregated_request_prefills_hands_off_over_the_nic_and_decodes_elsewhere() {
    // 96 prompt tokens (6 blocks of 1,024 bytes), 3 out. The prefill worker's pass
    // takes 96 µs: the first token lands then. The handoff is one MRDN frame of
    // 6 × 1,024 + 32 = 6,176 bytes: 6,176 ns at 1 GB/s, then 5 µs of NIC latency,
    // so the decode worker has the prompt at 107,176 ns and decodes two tokens at
    // 100 µs a pass.
    let report = simulate(&disaggregated(1, 1, 16), &[request(0, 1000, 96, 3)]).unwrap();
    assert_eq!(report.completed, 1);
    assert_eq!(report.ttft.max_ms, ms(96_000));
    let landed = 96_000 + 6_176 + 5_000;
    assert_eq!(report.end_to_end.max_ms, ms(landed + 200_000));
    assert_eq!(report.tpot.max_ms, ms((landed + 200_000 - 96_000) / 2));
    let d = report.disaggregation.as_ref().unwrap();
    assert_eq!(
        (d.handoffs, d.frames, d.bytes, d.header_bytes),
        (1, 1, 6_176, 32)
    );
    assert_eq!(d.handoff_latency.max_ms, ms(6_176 + 5_000));
    assert_eq!(d.handoff_wait.max_ms, 0.0);
    assert_eq!(d.handed_off_per_prefill_worker, vec![1]);
    assert_eq!(d.received_per_decode_worker, vec![1]);
    assert_eq!(report.routing.requests_per_worker, vec![1, 0]);
    // Both workers registered the prompt's six blocks and told the router.
    assert_eq!(report.events.stored_blocks, 12);
    assert!(report.routing.view_matches_pools);
    assert!(report.events.rebuild_matches_pools);
    let nic_in = d.links.iter().find(|l| l.link == "nic_in").unwrap();
    assert_eq!((nic_in.bytes, nic_in.transfers), (6_176, 1));
    // Frames of 4 blocks: 4,128 and 2,080 bytes sent at once, through together
    // when all 6,208 bytes are (the link never idles), then the latency.
    let report = simulate(&disaggregated(1, 1, 4), &[request(0, 1000, 96, 3)]).unwrap();
    let d = report.disaggregation.as_ref().unwrap();
    assert_eq!((d.frames, d.bytes), (2, 6_208));
    assert_eq!(d.handoff_latency.max_ms, ms(6_208 + 5_000));
    assert_eq!(
        report.end_to_end.max_ms,
        ms(96_000 + 6_208 + 5_000 + 200_000)
    );
    // One output token: done on the prefill worker, nothing handed off.
    let report = simulate(&disaggregated(1, 1, 16), &[request(0, 1000, 96, 1)]).unwrap();
    let d = report.disaggregation.as_ref().unwrap();
    assert_eq!(
        (report.completed, d.handoffs, d.finished_at_prefill),
        (1, 0, 1)
    );
}

#[test]
fn two_handoffs_into_one_decode_worker_share_its_nic_in() {
    // Two prefill workers (round-robin) finish their prompts at 96 µs and both hand
    // off to the one decode worker: 6,176 bytes each through its 1 GB/s NIC in at
    // half speed, twice as long as one alone.
    let requests = [request(0, 1000, 96, 3), request(1, 2000, 96, 3)];
    let report = simulate(&disaggregated(2, 1, 16), &requests).unwrap();
    let d = report.disaggregation.as_ref().unwrap();
    assert_eq!(d.received_per_decode_worker, vec![2]);
    assert_eq!(d.handoff_latency.p50_ms, ms(2 * 6_176 + 5_000));
    assert_eq!(d.handoff_latency.max_ms, ms(2 * 6_176 + 5_000));
    let nic_in = d.links.iter().find(|l| l.link == "nic_in").unwrap();
    assert_eq!(nic_in.bytes, 2 * 6_176);
    // Two decode workers: one handoff each (the fewer requests, then the lower
    // index), no sharing.
    let report = simulate(&disaggregated(2, 2, 16), &requests).unwrap();
    let d = report.disaggregation.as_ref().unwrap();
    assert_eq!(d.received_per_decode_worker, vec![1, 1]);
    assert_eq!(d.handoff_latency.max_ms, ms(6_176 + 5_000));
    // A switch slower than the NICs limits both, wherever they go.
    let mut switched = disaggregated(2, 2, 16);
    if let Some(d) = switched.cluster.disaggregation.as_mut() {
        d.switch_bytes_per_s = 500_000_000;
        d.switch_latency_ns = 1_000;
    }
    let report = simulate(&switched, &requests).unwrap();
    let d = report.disaggregation.as_ref().unwrap();
    assert_eq!(d.handoff_latency.max_ms, ms(4 * 6_176 + 6_000));
    assert!(d
        .links
        .iter()
        .any(|l| l.link == "switch" && l.bytes == 2 * 6_176));
}

#[test]
fn a_slowed_nic_slows_the_handoffs_through_it() {
    // The decode node's NIC in at half speed for the whole run: 12,352 ns of wire.
    let mut scenario = disaggregated(1, 1, 16);
    scenario.faults = vec![fault(
        0,
        FaultKind::LinkSlowdown {
            worker: Some(1),
            link: Link::NicIn,
            factor: 0.5,
            for_ms: 1_000,
        },
    )];
    let report = simulate(&scenario, &[request(0, 1000, 96, 3)]).unwrap();
    let d = report.disaggregation.as_ref().unwrap();
    assert_eq!(d.handoff_latency.max_ms, ms(2 * 6_176 + 5_000));
}

#[test]
fn a_handoff_waits_for_blocks_on_its_decode_worker() {
    // Twelve device blocks a worker. A (96 tokens, 80 out) decodes on the decode
    // worker from 102,176 ns on and holds 8 blocks by the time B (96 tokens: 6
    // blocks) is prefilled at 2.096 ms, so B's handoff waits until A is done, at
    // 102,176 ns + 79 passes of 100 µs, and lands 6,176 ns later.
    let mut scenario = disaggregated(1, 1, 16);
    scenario.hardware.nic_latency_ns = 0;
    scenario.worker.tiers[0].capacity_blocks = 12;
    let mut late = request(1, 2000, 96, 2);
    late.arrival = Timestamp::from_nanos(2_000_000);
    let report = simulate(&scenario, &[request(0, 1000, 96, 80), late]).unwrap();
    assert_eq!(report.completed, 2);
    let d = report.disaggregation.as_ref().unwrap();
    assert_eq!(d.waits_for_decode_blocks, 1);
    let a_done = 102_176 + 79 * 100_000;
    assert_eq!(d.handoff_wait.max_ms, ms(a_done - 2_096_000));
    // End to end: A's and B's, whose one decode pass follows its handoff.
    let b_done = a_done + 6_176 + 100_000;
    assert_eq!(report.end_to_end.max_ms, ms(a_done));
    assert_eq!(
        report.end_to_end.mean_ms,
        ms((a_done + b_done - 2_000_000) / 2)
    );
    assert!(report.routing.view_matches_pools);
}

#[test]
fn a_decode_worker_out_of_blocks_preempts_and_recomputes_locally() {
    // Two long decodes on one decode worker of 10 blocks: the newer steps back,
    // prefills its prompt (still cached there) and tokens again, and finishes.
    let mut scenario = disaggregated(1, 1, 16);
    scenario.worker.tiers[0].capacity_blocks = 10;
    let requests = [request(0, 1000, 32, 100), request(1, 2000, 32, 100)];
    let report = simulate(&scenario, &requests).unwrap();
    assert_eq!(report.completed, 2);
    assert!(report.preemptions >= 1, "{report:?}");
    let d = report.disaggregation.as_ref().unwrap();
    assert_eq!(d.handoffs, 2);
    assert!(report.routing.view_matches_pools);
    assert!(report.events.rebuild_matches_pools);
}

#[test]
fn disaggregated_runs_are_deterministic_and_the_router_sees_both_pools() {
    let mut scenario = disaggregated(2, 2, 4);
    scenario.cluster.routing = Routing::Kv;
    scenario.cluster.event_plane.delay_us = 50;
    scenario.worker.tiers = tiers_with_write_back();
    let requests = shared_prefix_requests(40, 150, 6, 3, 30);
    let decode_key = WorkerWithDpRank {
        worker: WorkerId::new(3),
        dp_rank: 0,
    };
    let mut decode_view = 0;
    let report = simulate_observed(&scenario, requests.iter().cloned(), |sim| {
        decode_view = sim.route.router.indexer().blocks_of(decode_key).len();
    })
    .unwrap();
    assert_eq!(report.completed, 40);
    assert!(
        decode_view > 0,
        "the decode worker's blocks reach the router"
    );
    assert!(report.routing.view_matches_pools, "{report:?}");
    assert!(report.events.rebuild_matches_pools);
    assert_eq!(report.routing.events_rejected, 0);
    // Only the prefill pool is routed to, and both decode workers decode.
    assert_eq!(report.routing.requests_per_worker[2..], [0, 0]);
    let d = report.disaggregation.as_ref().unwrap();
    assert!(d.received_per_decode_worker.iter().all(|n| *n > 0), "{d:?}");
    assert_eq!(d.handoffs, 40);
    assert!(report
        .to_string()
        .contains("disagg    2 prefill + 2 decode workers"));
    assert_eq!(
        report.to_json(),
        simulate(&scenario, &requests).unwrap().to_json()
    );
    // Aggregated, the report has no such section at all.
    scenario.cluster.disaggregation = None;
    let aggregated = simulate(&scenario, &requests).unwrap();
    assert!(aggregated.disaggregation.is_none());
    assert!(!aggregated.to_json().contains("disaggregation"));
    assert!(!aggregated.to_string().contains("disagg"));
}

/// What a test watches after every event: the time, the blocks held on `worker`'s
/// device, and the handoff frames on the fabric.
fn watch(sim: &Cluster<'_>, worker: usize) -> (u64, usize, usize) {
    (
        sim.now.as_nanos(),
        sim.workers[worker].manager.device().counts().active,
        sim.disagg.as_ref().map_or(0, |d| d.frames_in_flight.len()),
    )
}

/// The last of `watched` by `ns`: (blocks held, frames in flight) then.
fn watched_at(watched: &[(u64, usize, usize)], ns: u64) -> (usize, usize) {
    watched
        .iter()
        .rev()
        .find(|(now, ..)| *now <= ns)
        .map(|(_, active, frames)| (*active, *frames))
        .unwrap_or_default()
}

/// What holds at every instant, crashes or not: nothing lives on a worker that is
/// down, every handoff's ends are up and hold it (the prefill worker sending, the
/// decode worker receiving or queueing it), and every frame on the fabric belongs
/// to a handoff.
pub(super) fn check_handoffs(sim: &Cluster<'_>) {
    for (w, worker) in sim.workers.iter().enumerate() {
        if !worker.up {
            assert!(worker.states.is_empty() && worker.waiting.is_empty(), "{w}");
            assert!(worker.pass.is_none(), "{w}");
        }
    }
    let Some(disagg) = sim.disagg.as_ref() else {
        return;
    };
    for (i, handoff) in &disagg.handoffs {
        let from = &sim.workers[handoff.from];
        assert!(from.up, "handoff {i} from a crashed worker");
        assert!(matches!(from.states.get(i), Some(State::Sending { .. })));
        match handoff.to {
            Some(d) => {
                let to = &sim.workers[d];
                assert!(to.up, "handoff {i} to a crashed worker");
                assert!(
                    matches!(to.states.get(i), Some(State::Receiving { .. }))
                        || to.waiting.contains(i)
                );
            }
            None => assert!(disagg.unassigned.contains(i)),
        }
    }
    for frame in disagg.frames_in_flight.values() {
        assert!(disagg.handoffs.contains_key(&frame.request));
    }
}

#[test]
fn a_prefill_worker_crashing_mid_handoff_aborts_its_frames_and_the_request_is_prefilled_elsewhere()
{
    // Two prefill workers, one decode worker, blocks of 1 MiB in frames of two. A (96
    // tokens: 6 blocks, 3 out) is prefilled on worker 0 by 96 µs (its first token
    // then) and its three frames of 2,097,184 bytes share the NICs; at 1 ms, 904,000
    // bytes through, worker 0 crashes. The frames are aborted, worker 2 gives back
    // the 6 blocks it reserved, and A goes to worker 1: 96 prompt tokens and the one
    // generated, 97 µs, so its second token at 1.097 ms. The new handoff carries 7
    // blocks (the generated token's KV spills into a seventh), 2+2+2+1 in four
    // frames, 7,340,160 bytes through by 8,437,160 ns and landed 5 µs later; then
    // one decode pass of 100 µs.
    let mut scenario = disaggregated(2, 1, 2);
    scenario.worker.bytes_per_block = 1 << 20;
    scenario.faults = vec![fault(
        1,
        FaultKind::WorkerCrash {
            worker: 0,
            down_ms: 10,
        },
    )];
    let mut watched = Vec::new();
    let report = simulate_observed(&scenario, [request(0, 1000, 96, 3)], |sim| {
        check_handoffs(sim);
        watched.push(watch(sim, 2));
    })
    .unwrap();
    assert_eq!(report.completed, 1);
    assert_eq!(report.ttft.max_ms, ms(96_000));
    let landed = 1_097_000 + 7_340_160 + 5_000;
    assert_eq!(report.end_to_end.max_ms, ms(landed + 100_000));
    assert_eq!(report.faults.requests_retried, 1);
    assert_eq!(report.routing.requests_per_worker, vec![1, 1, 0]);
    let d = report.disaggregation.as_ref().unwrap();
    assert_eq!((d.handoffs_aborted, d.frames_aborted), (1, 3));
    assert_eq!((d.handoffs, d.frames), (1, 3 + 4));
    assert_eq!(d.bytes, 3 * 2_097_184 + 7_340_160);
    assert_eq!(d.handed_off_per_prefill_worker, vec![1, 1]);
    assert_eq!(d.received_per_decode_worker, vec![1]);
    assert_eq!(d.handoff_latency.max_ms, ms(7_340_160 + 5_000));
    // Only the bytes that went through before the crash count on the NIC.
    let nic_in = d.links.iter().find(|l| l.link == "nic_in").unwrap();
    assert!(
        nic_in.bytes.abs_diff(904_000 + 7_340_160) <= 3,
        "{}",
        nic_in.bytes
    );
    assert!(report.to_string().contains("1 handoffs aborted by crashes"));
    // Worker 2 held the 6 blocks of the first handoff until the crash, none until
    // the second, then 7.
    let at = |ns: u64| watched_at(&watched, ns);
    assert_eq!(at(999_999), (6, 3));
    assert_eq!(at(1_000_000), (0, 0));
    assert_eq!(at(1_097_000), (7, 4));
    assert!(report.routing.view_matches_pools, "{report:?}");
    assert!(report.events.rebuild_matches_pools);
}

#[test]
fn a_crashed_decode_workers_requests_are_prefilled_again_and_decoded_elsewhere() {
    // One prefill worker, two decode workers: A (96 tokens, 3 out) goes to worker 1.
    // Receiving: 1 MiB blocks, one frame of 6,291,488 bytes, not in by 1 ms, when
    // worker 1 crashes. The frame is aborted and worker 0 lets A's blocks go; A is
    // prefilled there again, hitting 5 of its own blocks (the last is computed to
    // produce a token): 16 tokens and its generated one, 17 µs. Its 7 blocks (the
    // generated token's KV too) go to worker 2 in one frame of 7,340,064 bytes, and
    // it decodes its last token there.
    let mut receiving = disaggregated(1, 2, 16);
    receiving.worker.bytes_per_block = 1 << 20;
    receiving.faults = vec![fault(
        1,
        FaultKind::WorkerCrash {
            worker: 1,
            down_ms: 50,
        },
    )];
    let mut active = Vec::new();
    let report = simulate_observed(&receiving, [request(0, 1000, 96, 3)], |sim| {
        check_handoffs(sim);
        active.push(watch(sim, 0));
    })
    .unwrap();
    assert_eq!(report.completed, 1);
    let landed = 1_017_000 + 7_340_064 + 5_000;
    assert_eq!(report.end_to_end.max_ms, ms(landed + 100_000));
    assert_eq!(report.faults.requests_retried, 1);
    assert_eq!(report.blocks.computed, 6, "counted once, when first served");
    let d = report.disaggregation.as_ref().unwrap();
    assert_eq!((d.handoffs_aborted, d.frames_aborted), (1, 1));
    assert_eq!((d.handoffs, d.frames), (1, 2));
    assert_eq!(d.received_per_decode_worker, vec![0, 1]);
    assert_eq!(d.handed_off_per_prefill_worker, vec![2]);
    // Worker 0 held A's 6 blocks while sending, and let them go at the crash: the
    // retry takes 5 of them back, cached, and a new one, and sends its frame.
    assert_eq!(watched_at(&active, 999_999), (6, 1));
    assert_eq!(watched_at(&active, 1_000_000), (6, 0));
    assert_eq!(watched_at(&active, 1_017_000), (6, 1));
    assert!(report.routing.view_matches_pools, "{report:?}");
    assert!(report.events.rebuild_matches_pools);
    // Decoding: 1 KiB blocks, A (30 out) lands on worker 1 at 107,176 ns and has
    // generated 9 tokens by 1 ms (a pass every 100 µs from 107,176 ns; the one in
    // flight then is dropped with the crash). Prefilled again: 16 + 9 tokens, 25 µs;
    // 7 blocks in 7,200 bytes to worker 2 by 1,037,200 ns; 20 more passes.
    let mut decoding = disaggregated(1, 2, 16);
    decoding.faults = receiving.faults.clone();
    let report = simulate_observed(&decoding, [request(0, 1000, 96, 30)], check_handoffs).unwrap();
    assert_eq!(report.completed, 1);
    assert_eq!(report.ttft.max_ms, ms(96_000));
    assert_eq!(
        report.end_to_end.max_ms,
        ms(1_025_000 + 7_200 + 5_000 + 20 * 100_000)
    );
    let d = report.disaggregation.as_ref().unwrap();
    // Nothing was in flight: the handoff had landed.
    assert_eq!((d.handoffs_aborted, d.frames_aborted), (0, 0));
    assert_eq!(d.received_per_decode_worker, vec![1, 1]);
    assert_eq!(report.faults.requests_retried, 1);
    // 8 decode passes on worker 1 (the ninth dropped), 20 on worker 2, 2 prefills.
    assert_eq!(report.passes, 8 + 20 + 2);
    assert!(report.routing.view_matches_pools, "{report:?}");
    assert!(report.events.rebuild_matches_pools);
}

#[test]
fn handoffs_wait_while_no_decode_worker_is_up_and_go_when_it_is_back() {
    // One decode worker, down from 1 to 6 ms. A (96 tokens, 30 out) decoding there
    // has 9 tokens at the crash and is prefilled again by 1,025,000 ns; B (96 tokens,
    // 3 out) arrives at 2 ms and is prefilled by 2,096,000 ns. Both handoffs wait,
    // their blocks held on the prefill worker, and go at 6 ms, in that order, sharing
    // worker 1's NIC: B's 6,176 bytes through at 12,352 ns, A's 7,200 at 13,376 ns,
    // each landing 5 µs later. B decodes alone from 6,017,352 ns, then with A: B is
    // done at 6,217,352 ns, A 19 passes later.
    let mut scenario = disaggregated(1, 1, 16);
    scenario.faults = vec![fault(
        1,
        FaultKind::WorkerCrash {
            worker: 1,
            down_ms: 5,
        },
    )];
    let mut late = request(1, 2000, 96, 3);
    late.arrival = Timestamp::from_nanos(2_000_000);
    let requests = [request(0, 1000, 96, 30), late];
    let mut held = Vec::new();
    let report = simulate_observed(&scenario, requests.iter().cloned(), |sim| {
        check_handoffs(sim);
        held.push(watch(sim, 0));
    })
    .unwrap();
    assert_eq!((report.completed, report.faults.requests_unserved), (2, 0));
    let (a_done, b_done) = (6_217_352 + 19 * 100_000, 6_217_352);
    assert_eq!(report.end_to_end.max_ms, ms(a_done));
    assert_eq!(
        report.end_to_end.mean_ms,
        ms((a_done + b_done - 2_000_000) / 2)
    );
    let d = report.disaggregation.as_ref().unwrap();
    assert_eq!(d.handoffs, 1 + 2);
    assert_eq!(d.received_per_decode_worker, vec![3]);
    assert_eq!(d.handoff_wait.max_ms, ms(6_000_000 - 1_025_000));
    assert_eq!(d.waits_for_decode_blocks, 0);
    // The prefill worker held both prompts (6 blocks each) while no decode worker
    // was up, and sent both when it came back.
    assert_eq!(watched_at(&held, 5_999_999), (12, 0));
    assert_eq!(watched_at(&held, 6_000_000), (12, 2));
    assert_eq!(watched_at(&held, 6_018_376), (0, 0));
    assert!(report.routing.view_matches_pools, "{report:?}");
    assert!(report.events.rebuild_matches_pools);
}

#[test]
fn disaggregated_crashes_are_deterministic_and_the_cluster_converges() {
    // Both pools lose workers, one after another, with handoffs in flight (64 KiB
    // blocks take the fabric a while), and for a millisecond neither decode worker
    // is up.
    let mut scenario = disaggregated(2, 2, 4);
    scenario.cluster.routing = Routing::Kv;
    scenario.cluster.event_plane.delay_us = 50;
    scenario.worker.tiers = tiers_with_write_back();
    scenario.worker.bytes_per_block = 64 << 10;
    let crash = |at_ms: u64, worker: usize, down_ms: u64| {
        fault(at_ms, FaultKind::WorkerCrash { worker, down_ms })
    };
    scenario.faults = vec![
        crash(1, 0, 2),
        crash(2, 2, 2),
        crash(3, 3, 2),
        crash(4, 1, 1),
    ];
    let requests = shared_prefix_requests(40, 150, 6, 3, 30);
    let mut unassigned_max = 0;
    let report = simulate_observed(&scenario, requests.iter().cloned(), |sim| {
        check_handoffs(sim);
        let unassigned = sim.disagg.as_ref().map_or(0, |d| d.unassigned.len());
        unassigned_max = unassigned_max.max(unassigned);
    })
    .unwrap();
    assert!(unassigned_max > 0, "handoffs waited for a decode worker");
    assert_eq!(report.completed, 40, "{report:?}");
    assert_eq!(report.faults.requests_unserved, 0);
    assert!(report.faults.requests_retried > 0, "{report:?}");
    let d = report.disaggregation.as_ref().unwrap();
    assert!(d.handoffs_aborted > 0 && d.frames_aborted > 0, "{d:?}");
    // Every request was handed off once to the end, besides the aborted ones.
    assert_eq!(
        d.handed_off_per_prefill_worker.iter().sum::<u64>(),
        d.handoffs + d.handoffs_aborted
    );
    assert!(report.routing.view_matches_pools, "{report:?}");
    assert!(report.events.rebuild_matches_pools);
    assert_eq!(
        report.to_json(),
        simulate(&scenario, &requests).unwrap().to_json()
    );
}

#[test]
fn disaggregation_needs_both_pools_and_frames_of_a_block() {
    let check = |prefill: usize, frame_blocks: usize| {
        let mut scenario = disaggregated(1, 1, 16);
        if let Some(d) = scenario.cluster.disaggregation.as_mut() {
            d.prefill_workers = prefill;
            d.frame_blocks = frame_blocks;
        }
        let text = ron::to_string(&scenario).unwrap();
        Scenario::parse(&text, Path::new("d.ron")).map(|_| ())
    };
    assert!(check(1, 16).is_ok());
    for prefill in [0, 2, 3] {
        let error = check(prefill, 16).unwrap_err().to_string();
        assert!(
            error.starts_with("d.ron: cluster: disaggregation.prefill_workers"),
            "{error}"
        );
    }
    let error = check(1, 0).unwrap_err().to_string();
    assert!(error.contains("frame_blocks"), "{error}");
    // A scenario built in code is checked by the run too.
    let mut scenario = disaggregated(1, 1, 16);
    scenario.cluster.workers = 1;
    assert!(matches!(
        simulate(&scenario, &[request(0, 1000, 96, 3)]),
        Err(SimError::EmptyPool { .. })
    ));
}
