//! What a live driver (the dashboard) may ask the cluster to keep as it runs: why each
//! request went where it went, the faults and commands as they happen, and the latencies
//! of the requests that finished lately.
//!
//! Owns: [`Observation`] (which records to keep, and how many), [`RouteRecord`],
//! [`FaultNote`], and the bounded rings that hold them between two drains. Observation is
//! off unless the driver turns it on ([`Cluster::observe`]); off, the cluster keeps
//! nothing and formats nothing. A full ring drops its oldest record and counts it.
//! Invariant: observation never changes the run: it only copies what the cluster
//! decided (the router's explained choice is the one it makes unexplained).
//! Never: feed anything back into the run, or grow without bound.

use super::{Cluster, LatencySnapshot, Percentiles};
use crate::scenario::FaultKind;
use kvtwin::ids::{Timestamp, WorkerWithDpRank};
use kvtwin::router::scheduler::Candidate;
use kvtwin::stats::Latencies;
use std::collections::VecDeque;
use std::time::Duration;

/// How many of each record [`Cluster::observe`] keeps (0: none of that kind).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Observation {
    /// Routing decisions kept between two [`Cluster::drain_routes`].
    pub routes: usize,
    /// Finished requests kept for [`Cluster::latency_window`] (the latest ones).
    pub latencies: usize,
    /// Fault notes kept between two [`Cluster::drain_faults`].
    pub faults: usize,
    /// Finished requests kept between two [`Cluster::drain_finished`] (a planner's
    /// view of the latencies of each interval).
    pub finished: usize,
}

/// One routing decision, and the candidates the router weighed for it.
#[derive(Clone, Debug, PartialEq)]
pub struct RouteRecord {
    /// Simulated time of the decision.
    pub at: Timestamp,
    /// The request's index in the run (arrival order, from 0).
    pub request: u64,
    /// Full prompt blocks the router looked up.
    pub query_blocks: usize,
    /// Every eligible worker as the scheduler weighed it, in worker order; empty under
    /// round-robin routing, which weighs nothing.
    pub candidates: Vec<Candidate>,
    /// The worker chosen.
    pub chosen: WorkerWithDpRank,
}

/// A fault that began or ended, or a command of the driver, in words.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FaultNote {
    /// Simulated time it happened.
    pub at: Timestamp,
    /// What happened ("worker 2 crashed").
    pub text: String,
}

/// One finished request's latencies, in nanoseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Finished {
    /// When it finished.
    pub at: Timestamp,
    /// Time to first token (none for a request that never got one).
    pub ttft: Option<u64>,
    /// Time per output token after the first (none for a request of one token).
    pub tpot: Option<u64>,
    /// Arrival to last token.
    pub end_to_end: u64,
    /// Arrival to the first pass that took it.
    pub queueing: Option<u64>,
}

/// The rings of an observed cluster.
#[derive(Debug, Default)]
pub(super) struct Observer {
    capacity: Observation,
    routes: VecDeque<RouteRecord>,
    routes_dropped: u64,
    faults: VecDeque<FaultNote>,
    faults_dropped: u64,
    /// Its own copies: the tally's samples are sorted in place by snapshots and lose
    /// their order and time.
    finished: VecDeque<Finished>,
    /// Finished requests since the last [`Cluster::drain_finished`].
    log: VecDeque<Finished>,
    log_dropped: u64,
}

/// Pushes `item`, first dropping the oldest while `ring` is full; returns how many it
/// dropped.
fn push_bounded<T>(ring: &mut VecDeque<T>, capacity: usize, item: T) -> u64 {
    let dropped = trim(ring, capacity.saturating_sub(1));
    if capacity > 0 {
        ring.push_back(item);
    }
    dropped
}

/// Drops the oldest of `ring` beyond `capacity`; returns how many.
fn trim<T>(ring: &mut VecDeque<T>, capacity: usize) -> u64 {
    let excess = ring.len().saturating_sub(capacity);
    ring.drain(..excess);
    excess as u64
}

/// A factor in few characters: `4`, `2.5`, `1.33`.
fn short(x: f64) -> String {
    let text = format!("{x:.2}");
    text.trim_end_matches('0').trim_end_matches('.').to_owned()
}

/// The note for `kind` beginning.
pub(super) fn fault_began(kind: &FaultKind) -> String {
    let node = |worker: &Option<usize>| match worker {
        Some(w) => format!("worker {w}"),
        None => "every node".to_owned(),
    };
    match kind {
        FaultKind::WorkerCrash { worker, down_ms } => {
            format!("worker {worker} crashed (down {down_ms} ms)")
        }
        FaultKind::LinkSlowdown {
            worker,
            link,
            factor,
            for_ms,
        } => format!(
            "link {} of {} slowed x{} for {for_ms} ms",
            link.name(),
            node(worker),
            short(1.0 / factor)
        ),
        FaultKind::EventLoss {
            probability,
            for_ms,
        } => format!(
            "event plane losing {}% of events for {for_ms} ms",
            short(probability * 100.0)
        ),
        FaultKind::EventLag { delay_us, for_ms } => {
            format!("event plane lagging +{delay_us} µs for {for_ms} ms")
        }
        FaultKind::RouterRestart => "router restarted (workers resend snapshots)".to_owned(),
        FaultKind::SsdFailure { worker, down_ms } => {
            format!("SSD of worker {worker} failed (down {down_ms} ms)")
        }
    }
}

/// The note for `kind` ending, for those that end on their own timer (a crashed worker's
/// return is noted when it restarts).
pub(super) fn fault_ended(kind: &FaultKind) -> Option<String> {
    Some(match kind {
        FaultKind::LinkSlowdown { worker, link, .. } => match worker {
            Some(w) => format!("link {} of worker {w} back to speed", link.name()),
            None => format!("link {} of every node back to speed", link.name()),
        },
        FaultKind::EventLoss { probability, .. } => {
            format!("event plane loss of {}% over", short(probability * 100.0))
        }
        FaultKind::EventLag { delay_us, .. } => format!("event plane lag of +{delay_us} µs over"),
        FaultKind::SsdFailure { worker, .. } => format!("SSD of worker {worker} back (empty)"),
        FaultKind::WorkerCrash { .. } | FaultKind::RouterRestart => return None,
    })
}

impl Cluster<'_> {
    /// Keeps, from now on, as many records of each kind as `observation` says (all zero:
    /// stops observing and forgets what was kept). Observing changes nothing in the run:
    /// its report is the one an unobserved run gives.
    pub fn observe(&mut self, observation: Observation) {
        if observation == Observation::default() {
            self.observer = None;
            return;
        }
        let observer = self.observer.get_or_insert_with(Box::default);
        observer.capacity = observation;
        observer.routes_dropped += trim(&mut observer.routes, observation.routes);
        observer.faults_dropped += trim(&mut observer.faults, observation.faults);
        trim(&mut observer.finished, observation.latencies);
        observer.log_dropped += trim(&mut observer.log, observation.finished);
    }

    /// The requests that finished since the last call, in the order they finished.
    pub fn drain_finished(&mut self) -> Vec<Finished> {
        self.observer
            .as_mut()
            .map_or_else(Vec::new, |o| o.log.drain(..).collect())
    }

    /// Finished requests dropped, since observation began, because their ring was full.
    pub fn finished_dropped(&self) -> u64 {
        self.observer.as_ref().map_or(0, |o| o.log_dropped)
    }

    /// The routing decisions made since the last call, oldest first.
    pub fn drain_routes(&mut self) -> Vec<RouteRecord> {
        self.observer
            .as_mut()
            .map_or_else(Vec::new, |o| o.routes.drain(..).collect())
    }

    /// Routing decisions dropped, since observation began, because their ring was full.
    pub fn routes_dropped(&self) -> u64 {
        self.observer.as_ref().map_or(0, |o| o.routes_dropped)
    }

    /// The fault notes written since the last call, oldest first.
    pub fn drain_faults(&mut self) -> Vec<FaultNote> {
        self.observer
            .as_mut()
            .map_or_else(Vec::new, |o| o.faults.drain(..).collect())
    }

    /// Fault notes dropped, since observation began, because their ring was full.
    pub fn faults_dropped(&self) -> u64 {
        self.observer.as_ref().map_or(0, |o| o.faults_dropped)
    }

    /// Latencies of the requests that finished within the last `window` of simulated
    /// time (up to [`Cluster::now`], inclusive), among the latest ones kept
    /// ([`Observation::latencies`]); all zero when none did or nothing is kept. Only
    /// finished requests count, their TTFT and queueing too (a snapshot's count those of
    /// requests still running as well); over a whole run, the report's.
    pub fn latency_window(&self, window: Duration) -> LatencySnapshot {
        let Some(observer) = &self.observer else {
            return LatencySnapshot::default();
        };
        let now = self.now();
        let (mut ttft, mut tpot, mut end_to_end, mut queueing) = (
            Latencies::new(),
            Latencies::new(),
            Latencies::new(),
            Latencies::new(),
        );
        // Finished in time order: the window is the ring's tail.
        for finished in observer
            .finished
            .iter()
            .rev()
            .take_while(|f| now.saturating_duration_since(f.at) <= window)
        {
            finished.ttft.into_iter().for_each(|ns| ttft.push(ns));
            finished.tpot.into_iter().for_each(|ns| tpot.push(ns));
            end_to_end.push(finished.end_to_end);
            finished
                .queueing
                .into_iter()
                .for_each(|ns| queueing.push(ns));
        }
        LatencySnapshot {
            ttft: Percentiles::of(ttft),
            tpot: Percentiles::of(tpot),
            end_to_end: Percentiles::of(end_to_end),
            queueing: Percentiles::of(queueing),
        }
    }

    /// Whether routing decisions are kept (then the router explains them).
    pub(super) fn observing_routes(&self) -> bool {
        self.observer
            .as_ref()
            .is_some_and(|o| o.capacity.routes > 0)
    }

    /// Keeps a routing decision, if they are kept.
    pub(super) fn record_route(&mut self, record: RouteRecord) {
        if let Some(o) = self.observer.as_mut() {
            o.routes_dropped += push_bounded(&mut o.routes, o.capacity.routes, record);
        }
    }

    /// Notes what `text` says happened now, if faults are noted (`text` is only called
    /// then: an unobserved run formats nothing).
    pub(super) fn note(&mut self, text: impl FnOnce() -> String) {
        let at = self.now();
        if let Some(o) = self.observer.as_mut().filter(|o| o.capacity.faults > 0) {
            let note = FaultNote { at, text: text() };
            o.faults_dropped += push_bounded(&mut o.faults, o.capacity.faults, note);
        }
    }

    /// Keeps a finished request's latencies, if they are kept.
    pub(super) fn record_finished(&mut self, finished: Finished) {
        if let Some(o) = self.observer.as_mut() {
            push_bounded(&mut o.finished, o.capacity.latencies, finished);
            o.log_dropped += push_bounded(&mut o.log, o.capacity.finished, finished);
        }
    }

    /// Whether finished requests' latencies are kept.
    pub(super) fn observing_latencies(&self) -> bool {
        self.observer
            .as_ref()
            .is_some_and(|o| o.capacity.latencies > 0 || o.capacity.finished > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Removal, Report};
    use super::*;
    use crate::hardware::Link;
    use crate::scenario::{Fault, Routing, Scenario};
    use crate::workload::Request;
    use kvtwin::block::BlockIdentity;
    use kvtwin::ids::{LocalBlockHash, RequestId, WorkerId};
    use std::path::Path;

    /// Three workers of 48 device blocks, 16-token blocks, 200 tokens a pass, prefill
    /// 1 µs a token and a decode step 100 µs: small enough to preempt.
    fn scenario(routing: Routing, faults: Vec<Fault>) -> Scenario {
        let text = r#"(
            name: "observe", seed: 7,
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
                tiers: [
                    (tier: Device, capacity_blocks: 48, eviction: Lru, offload: WriteBack(low_watermark_blocks: 8)),
                    (tier: Host, capacity_blocks: 96, eviction: Lru, offload: None),
                ],
                batching: (max_seqs: 8, max_batch_tokens: 200, chunked_prefill: true),
            ),
            cluster: (workers: 3, routing: Kv, event_plane: (delay_us: 50, heartbeat_ms: 2)),
            workload: MooncakeTrace(path: "unused.jsonl"),
        )"#;
        let mut scenario = Scenario::parse(text, Path::new("observe.ron")).unwrap();
        scenario.cluster.routing = routing;
        scenario.faults = faults;
        scenario
    }

    /// `n` requests 300 µs apart: 4 shared blocks (one of 3 system prompts), 3 of their
    /// own, 40 tokens out.
    fn requests(n: u64) -> Vec<Request> {
        (0..n)
            .map(|i| {
                let locals: Vec<LocalBlockHash> = (0..4)
                    .map(|b| LocalBlockHash::new(1 + (i % 3) * 100 + b))
                    .chain((0..3).map(|b| LocalBlockHash::new(1_000_000 + i * 1000 + b)))
                    .collect();
                Request {
                    id: RequestId::new(i),
                    arrival: Timestamp::from_nanos(i * 300_000),
                    blocks: BlockIdentity::chain(&locals),
                    input_tokens: 7 * 16,
                    output_tokens: 40,
                    think_tokens: 0,
                }
            })
            .collect()
    }

    fn faults() -> Vec<Fault> {
        vec![
            Fault {
                at_ms: 4,
                kind: FaultKind::WorkerCrash {
                    worker: 1,
                    down_ms: 3,
                },
            },
            Fault {
                at_ms: 5,
                kind: FaultKind::LinkSlowdown {
                    worker: Some(2),
                    link: Link::PcieDeviceToHost,
                    factor: 0.25,
                    for_ms: 2,
                },
            },
            Fault {
                at_ms: 6,
                kind: FaultKind::EventLoss {
                    probability: 0.2,
                    for_ms: 1,
                },
            },
        ]
    }

    const ALL: Observation = Observation {
        routes: 10_000,
        latencies: 10_000,
        faults: 100,
        finished: 10_000,
    };

    /// Runs with `observation`, stepping and draining every few steps; the report, the
    /// routes and the notes drained.
    fn observed(
        scenario: &Scenario,
        requests: &[Request],
        observation: Observation,
    ) -> (Report, Vec<RouteRecord>, Vec<FaultNote>) {
        let mut cluster = Cluster::new(scenario, requests.iter().cloned()).unwrap();
        cluster.observe(observation);
        let (mut routes, mut notes) = (Vec::new(), Vec::new());
        let mut steps = 0;
        while cluster.step() {
            steps += 1;
            if steps % 7 == 0 {
                routes.extend(cluster.drain_routes());
                notes.extend(cluster.drain_faults());
                let _ = cluster.latency_window(Duration::from_millis(2));
                let _ = cluster.snapshot();
            }
        }
        routes.extend(cluster.drain_routes());
        notes.extend(cluster.drain_faults());
        (cluster.into_report(), routes, notes)
    }

    #[test]
    fn observing_changes_nothing_in_the_run() {
        for routing in [Routing::Kv, Routing::RoundRobin] {
            let scenario = scenario(routing, faults());
            let requests = requests(60);
            let plain = Cluster::new(&scenario, requests.iter().cloned())
                .unwrap()
                .run();
            assert!(plain.completed > 0 && plain.faults.applied == 3);
            for observation in [
                ALL,
                Observation {
                    routes: 3,
                    latencies: 2,
                    faults: 1,
                    finished: 3,
                },
            ] {
                let (report, ..) = observed(&scenario, &requests, observation);
                assert_eq!(
                    report.to_json(),
                    plain.to_json(),
                    "{routing:?} {observation:?}"
                );
            }
        }
    }

    #[test]
    fn every_kv_decision_is_recorded_with_the_candidates_it_weighed() {
        let kv = scenario(Routing::Kv, Vec::new());
        let requests = requests(40);
        let (report, routes, _) = observed(&kv, &requests, ALL);
        assert_eq!(routes.len() as u64, report.requests);
        for (n, record) in routes.iter().enumerate() {
            assert_eq!(
                record.request, n as u64,
                "one decision per request, in order"
            );
            assert_eq!(record.query_blocks, 6, "the last block is always computed");
            assert_eq!(record.candidates.len(), 3);
            let chosen = record
                .candidates
                .iter()
                .find(|c| c.worker == record.chosen)
                .expect("the chosen worker was a candidate");
            // Temperature 0: the cheapest wins.
            assert!(record.candidates.iter().all(|c| c.cost >= chosen.cost));
        }
        assert!(routes
            .iter()
            .any(|r| r.candidates.iter().any(|c| c.overlap_blocks > 0)));
        let per_worker: Vec<u64> = (0..3)
            .map(|w| {
                routes
                    .iter()
                    .filter(|r| r.chosen.worker == WorkerId::new(w))
                    .count() as u64
            })
            .collect();
        assert_eq!(per_worker, report.routing.requests_per_worker);
        // Round-robin weighs nothing.
        let (_, routes, _) = observed(&scenario(Routing::RoundRobin, Vec::new()), &requests, ALL);
        assert_eq!(routes.len(), 40);
        assert!(routes.iter().all(|r| r.candidates.is_empty()));
    }

    #[test]
    fn a_full_ring_keeps_the_latest_and_counts_what_it_dropped() {
        let scenario = scenario(Routing::Kv, Vec::new());
        let mut cluster = Cluster::new(&scenario, requests(10)).unwrap();
        assert!(cluster.drain_routes().is_empty(), "off by default");
        cluster.observe(Observation {
            routes: 4,
            ..Observation::default()
        });
        while cluster.step() {}
        let kept: Vec<u64> = cluster.drain_routes().iter().map(|r| r.request).collect();
        assert_eq!(kept, [6, 7, 8, 9]);
        assert_eq!(cluster.routes_dropped(), 6);
        assert!(cluster.drain_routes().is_empty(), "drained");
    }

    #[test]
    fn faults_and_commands_are_noted_as_they_happen() {
        let scenario = scenario(Routing::Kv, faults());
        let mut cluster = Cluster::new(&scenario, requests(60)).unwrap();
        cluster.observe(ALL);
        cluster.advance_to(Timestamp::from_nanos(2_000_000));
        let added = cluster.add_worker().unwrap();
        cluster
            .remove_worker(WorkerId::new(0), Removal::Drain)
            .unwrap();
        cluster
            .inject(Fault {
                at_ms: 8,
                kind: FaultKind::EventLag {
                    delay_us: 500,
                    for_ms: 1,
                },
            })
            .unwrap();
        while cluster.step() {}
        let notes: Vec<String> = cluster
            .drain_faults()
            .into_iter()
            .map(|n| format!("{} {}", n.at.as_nanos() / 1000, n.text))
            .collect();
        assert_eq!(added, WorkerId::new(3));
        let expected = [
            "2000 worker 3 added",
            "2000 worker 0 draining",
            "2000 fault injected, due at 8 ms: event plane lagging +500 µs for 1 ms",
            "4000 worker 1 crashed (down 3 ms)",
            "5000 link pcie_d2h of worker 2 slowed x4 for 2 ms",
            "6000 event plane losing 20% of events for 1 ms",
            "7000 worker 1 restarted (empty)",
            "7000 link pcie_d2h of worker 2 back to speed",
            "7000 event plane loss of 20% over",
            "8000 event plane lagging +500 µs for 1 ms",
            "9000 event plane lag of +500 µs over",
        ];
        let (drained, rest): (Vec<&String>, Vec<&String>) = notes
            .iter()
            .partition(|n| n.ends_with("drained and removed"));
        assert_eq!(drained.len(), 1, "{notes:#?}");
        assert_eq!(rest, expected.iter().collect::<Vec<_>>(), "{notes:#?}");
        assert_eq!(cluster.faults_dropped(), 0);
    }

    #[test]
    fn the_latency_window_over_the_whole_run_is_the_reports_and_a_short_one_less() {
        let scenario = scenario(Routing::Kv, faults());
        let mut cluster = Cluster::new(&scenario, requests(60)).unwrap();
        cluster.observe(ALL);
        let mut mid = None;
        while cluster.step() {
            if mid.is_none() && cluster.snapshot().requests_completed >= 20 {
                let short = cluster.latency_window(Duration::from_millis(1));
                let long = cluster.latency_window(Duration::from_secs(3600));
                mid = Some((short, long, cluster.snapshot().latency));
            }
        }
        let (short, long, so_far) = mid.unwrap();
        // A long window is the run so far for what is counted when a request finishes;
        // the snapshot's TTFT and queueing also count requests still running.
        assert_eq!(
            (long.end_to_end, long.tpot),
            (so_far.end_to_end, so_far.tpot)
        );
        assert!(short.end_to_end.max_ms <= long.end_to_end.max_ms);
        assert_ne!(short, long, "a 1 ms window holds fewer requests");
        let whole = cluster.latency_window(Duration::from_secs(3600));
        let report = cluster.into_report();
        assert_eq!(
            (whole.ttft, whole.tpot, whole.end_to_end, whole.queueing),
            (report.ttft, report.tpot, report.end_to_end, report.queueing)
        );
    }

    #[test]
    fn the_snapshots_hit_ratio_is_the_reports_at_the_end() {
        let scenario = scenario(Routing::Kv, faults());
        let mut cluster = Cluster::new(&scenario, requests(60)).unwrap();
        let mut ratios = Vec::new();
        while cluster.step() {
            ratios.push(cluster.snapshot().blocks.hit_ratio());
        }
        let last = cluster.snapshot().blocks;
        let report = cluster.into_report();
        assert!(report.hit_ratio > 0.0);
        assert_eq!(last, report.blocks);
        assert_eq!(last.hit_ratio(), report.hit_ratio);
        assert_eq!(last.hit_token_ratio(), report.hit_token_ratio);
        assert!(
            ratios.iter().any(|r| *r > 0.0 && *r != report.hit_ratio),
            "it moves mid-run"
        );
    }

    #[test]
    fn queued_and_running_partition_each_workers_requests_and_preemptions_count_up() {
        let scenario = scenario(Routing::Kv, faults());
        let mut cluster = Cluster::new(&scenario, requests(60)).unwrap();
        let (mut preemptions, mut saw_queued) = (0, false);
        while cluster.step() {
            let snapshot = cluster.snapshot();
            assert!(snapshot.preemptions >= preemptions);
            preemptions = snapshot.preemptions;
            let held: usize = snapshot.workers.iter().map(|w| w.queued + w.running).sum();
            let parked = cluster.requests.parked.len();
            assert_eq!(
                held + parked,
                snapshot.requests_in_flight,
                "at {}",
                snapshot.at
            );
            for (w, worker) in cluster.workers.iter().enumerate() {
                let s = &snapshot.workers[w];
                assert_eq!(
                    s.queued + s.running,
                    worker.states.len() + worker.waiting.len()
                );
            }
            saw_queued |= snapshot.workers.iter().any(|w| w.queued > 0);
        }
        let report = cluster.into_report();
        assert!(report.preemptions > 0, "the scenario preempts");
        assert_eq!(preemptions, report.preemptions);
        assert!(saw_queued);
    }
}
