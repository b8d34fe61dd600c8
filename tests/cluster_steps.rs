//! The steppable cluster: a run paused, looked at and resumed is the run that never
//! paused, and workers added or removed mid-run take traffic and leave the router's view
//! equal to the pools (`scenarios/cluster-faults.ron`: crashes, slow links, a lossy and
//! slow event plane, a failed SSD and a router restart along the way).

mod common;

use kvtwin::ids::{Timestamp, WorkerId};
use kvtwin_sim::checkers::{rebuild_matches_pools, router_view_matches_pools};
use kvtwin_sim::cluster::{Cluster, CommandError, Removal, WorkerStatus};
use kvtwin_sim::scenario::{Fault, FaultKind, Scenario};
use kvtwin_sim::workload::Request;
use std::time::Duration;

fn cluster_faults() -> (Scenario, Vec<Request>) {
    let path = common::repo_root().join("scenarios/cluster-faults.ron");
    let scenario = Scenario::load(&path).unwrap_or_else(|e| panic!("{e}"));
    let requests = scenario
        .workload
        .generate(scenario.seed, scenario.worker.block_size_tokens)
        .expect("a synthetic workload");
    (scenario, requests)
}

#[test]
fn pausing_snapshotting_and_resuming_at_100_points_changes_nothing() {
    let (scenario, requests) = cluster_faults();
    let last_arrival = requests.iter().map(|r| r.arrival).max().unwrap();
    let mut cluster = Cluster::new(&scenario, requests.iter().cloned()).unwrap();
    let mut previous = cluster.snapshot();
    let mut seen_faults = 0;
    for k in 1..=100u64 {
        let pause =
            Timestamp::ZERO.saturating_add(Duration::from_nanos(last_arrival.as_nanos() / 100 * k));
        cluster.advance_to(pause);
        assert_eq!(cluster.now(), pause);
        assert!(cluster.next_deadline().is_none_or(|next| next > pause));
        let snapshot = cluster.snapshot();
        assert_eq!(snapshot.at, pause);
        // Counters only grow, and every request is somewhere.
        assert!(snapshot.requests_arrived >= previous.requests_arrived);
        assert!(snapshot.requests_completed >= previous.requests_completed);
        assert_eq!(
            snapshot.requests_arrived,
            snapshot.requests_completed
                + snapshot.requests_in_flight as u64
                + snapshot.requests_rejected,
            "at {pause:?}"
        );
        assert_eq!(snapshot.workers.len(), 8);
        for (now, before) in snapshot.workers.iter().zip(&previous.workers) {
            assert!(now.routed >= before.routed && now.completed >= before.completed);
            let rates = now.rates_since(before, pause.saturating_duration_since(previous.at));
            assert!(rates.completed_per_s >= 0.0 && rates.events_per_s >= 0.0);
            if now.status == WorkerStatus::Serving {
                let device = now.blocks[0].expect("every worker has a device tier");
                assert!(device.active + device.cached <= device.capacity);
            }
        }
        assert!(snapshot
            .links
            .iter()
            .all(|l| (0.0..=1.0).contains(&l.utilisation)));
        seen_faults = snapshot.faults_applied;
        previous = snapshot;
    }
    assert_eq!(seen_faults, 6, "every fault of the timeline began by then");
    // The rest, one step at a time.
    while cluster.step() {}
    assert!(cluster.next_deadline().is_none());
    let report = cluster.into_report();
    // The digest is that of one uninterrupted run (tests/scenarios.rs checks it).
    common::check_report_digest("cluster-faults.ron", &report.to_json())
        .unwrap_or_else(|mismatch| panic!("pausing changed the run: {mismatch}"));
}

#[test]
fn workers_added_take_traffic_and_workers_removed_leave_the_router_in_line() {
    let (scenario, mut requests) = cluster_faults();
    // The first ten minutes of traffic: the crash, the slow link, the lossy plane and
    // the SSD failure all happen in it.
    requests.retain(|r| r.arrival < Timestamp::ZERO.saturating_add(Duration::from_secs(600)));
    let total = requests.len() as u64;
    let mut cluster = Cluster::new(&scenario, requests).unwrap();
    let at = |s: u64| Timestamp::ZERO.saturating_add(Duration::from_secs(s));

    cluster.advance_to(at(30));
    let added = cluster.add_worker().unwrap();
    assert_eq!(added, WorkerId::new(8));
    cluster.advance_to(at(150));
    let snapshot = cluster.snapshot();
    let newcomer = &snapshot.workers[8];
    assert_eq!(newcomer.status, WorkerStatus::Serving);
    assert!(
        newcomer.routed > 0 && newcomer.completed > 0,
        "the added worker takes traffic: {newcomer:?}"
    );
    assert!(router_view_matches_pools(&cluster));

    // Drain one worker, kill another (and inject a crash of a third on the way).
    cluster
        .remove_worker(WorkerId::new(1), Removal::Drain)
        .unwrap();
    cluster
        .remove_worker(WorkerId::new(2), Removal::Kill)
        .unwrap();
    cluster
        .inject(Fault {
            at_ms: 170_000,
            kind: FaultKind::WorkerCrash {
                worker: 4,
                down_ms: 20_000,
            },
        })
        .unwrap();
    assert_eq!(
        cluster.remove_worker(WorkerId::new(2), Removal::Drain),
        Err(CommandError::UnknownWorker(WorkerId::new(2)))
    );
    assert!(matches!(
        cluster.inject(Fault {
            at_ms: 0,
            kind: FaultKind::WorkerCrash {
                worker: 99,
                down_ms: 1,
            },
        }),
        Err(CommandError::Fault(_))
    ));
    let routed_before: Vec<u64> = cluster
        .snapshot()
        .workers
        .iter()
        .map(|w| w.routed)
        .collect();
    cluster.advance_to(at(400));
    let snapshot = cluster.snapshot();
    assert_eq!(snapshot.workers[1].status, WorkerStatus::Removed);
    assert_eq!(snapshot.workers[2].status, WorkerStatus::Removed);
    assert_eq!(snapshot.workers[4].status, WorkerStatus::Serving);
    for gone in [1, 2] {
        assert_eq!(
            snapshot.workers[gone].routed, routed_before[gone],
            "a removed worker gets no new request"
        );
        assert!(cluster
            .router()
            .indexer()
            .blocks_of(kvtwin::ids::WorkerWithDpRank {
                worker: WorkerId::new(gone as u64),
                dp_rank: 0,
            })
            .is_empty());
    }
    assert!(router_view_matches_pools(&cluster));
    assert!(rebuild_matches_pools(&cluster));

    while cluster.step() {}
    let report = cluster.into_report();
    assert_eq!(report.workers, 9);
    assert_eq!(report.requests, total);
    assert_eq!(report.completed + report.rejected_too_large, total);
    assert_eq!(report.faults.applied, 7);
    assert!(report.routing.view_matches_pools);
    assert!(report.events.rebuild_matches_pools);
}
