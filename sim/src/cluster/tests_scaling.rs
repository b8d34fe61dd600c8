//! Tests of a disaggregated cluster whose pools the driver grows and shrinks while it
//! runs (`Cluster::add_worker_to`, `Cluster::remove_worker`): workers added take work,
//! workers drained or killed lose no request, the router's view stays the pools at every
//! step, and the same commands at the same times make the same run.

use super::tests_disagg::{check_handoffs, disaggregated};
use super::*;
use crate::checkers::{rebuild_matches_pools, router_view_matches_pools};
use crate::workload::Request;
use kvtwin::block::BlockIdentity;
use kvtwin::ids::{LocalBlockHash, RequestId, Timestamp, WorkerId};

/// `n` requests `gap_us` apart, each of two shared prompt blocks and three of its own
/// (80 tokens), `output` tokens out.
fn requests(n: u64, gap_us: u64, output: u64) -> Vec<Request> {
    (0..n)
        .map(|i| {
            let locals: Vec<LocalBlockHash> = (0..2)
                .map(|b| LocalBlockHash::new(1 + b))
                .chain((0..3).map(|b| LocalBlockHash::new(1_000_000 + i * 1000 + b)))
                .collect();
            Request {
                id: RequestId::new(i),
                arrival: Timestamp::from_nanos(i * gap_us * 1000),
                blocks: BlockIdentity::chain(&locals),
                input_tokens: 5 * 16,
                output_tokens: output,
                think_tokens: 0,
            }
        })
        .collect()
}

/// A driver's command.
#[derive(Clone, Copy, Debug)]
enum Command {
    Add(Pool),
    Remove(u64, Removal),
}

/// What must hold after every step and every command: the router's view is the pools,
/// the registry rebuilt from the events is too, and every handoff's ends hold it.
fn check(cluster: &Cluster<'_>) {
    assert!(router_view_matches_pools(cluster), "at {:?}", cluster.now());
    assert!(rebuild_matches_pools(cluster), "at {:?}", cluster.now());
    check_handoffs(cluster);
}

/// Runs `scenario` on `requests`, the driver carrying out each command at its time (in
/// nanoseconds, in order), and `observe` seeing the cluster after every step and
/// command; checks what must hold throughout ([`check`]).
fn run(
    scenario: &Scenario,
    requests: &[Request],
    commands: &[(u64, Command)],
    mut observe: impl FnMut(&Cluster<'_>),
) -> Report {
    let mut cluster = Cluster::new(scenario, requests.iter().cloned()).unwrap();
    let mut seen = |cluster: &Cluster<'_>| {
        check(cluster);
        observe(cluster);
    };
    for (at, command) in commands {
        let at = Timestamp::from_nanos(*at);
        while cluster.next_deadline().is_some_and(|t| t <= at) && cluster.step() {
            seen(&cluster);
        }
        cluster.advance_to(at);
        match command {
            Command::Add(pool) => {
                cluster.add_worker_to(*pool).unwrap();
            }
            Command::Remove(w, how) => cluster.remove_worker(WorkerId::new(*w), *how).unwrap(),
        }
        seen(&cluster);
    }
    while cluster.step() {
        seen(&cluster);
    }
    cluster.into_report()
}

#[test]
fn workers_added_to_either_pool_mid_run_both_get_work() {
    // One prefill and one decode worker; at 3 ms a second of each joins. Round robin
    // takes turns over the prefill pool's workers, so the newcomer prefills every
    // other request from then on; handoffs go to the decode worker with fewer requests.
    let scenario = disaggregated(1, 1, 4);
    let requests = requests(60, 100, 30);
    let commands = [
        (3_000_000, Command::Add(Pool::Prefill)),
        (3_000_000, Command::Add(Pool::Decode)),
    ];
    let mut serving = Vec::new();
    let report = run(&scenario, &requests, &commands, |cluster| {
        if serving.is_empty() && cluster.workers.len() == 4 {
            serving = vec![
                cluster.serving_in(Some(Pool::Prefill)),
                cluster.serving_in(Some(Pool::Decode)),
                cluster.serving_in(None),
            ];
        }
    });
    let ids = |ids: &[u64]| ids.iter().map(|w| WorkerId::new(*w)).collect::<Vec<_>>();
    assert_eq!(serving, vec![ids(&[0, 2]), ids(&[1, 3]), Vec::new()]);
    assert_eq!((report.completed, report.faults.requests_unserved), (60, 0));
    assert_eq!(report.workers, 4);
    assert!(report.routing.requests_per_worker[2] > 0, "{report:?}");
    assert_eq!(
        report.routing.requests_per_worker[3], 0,
        "decode is not routed"
    );
    let d = report.disaggregation.as_ref().unwrap();
    assert_eq!((d.prefill_workers, d.decode_workers), (2, 2));
    assert_eq!(d.prefill_pool.as_deref(), Some(&[0, 2][..]));
    assert_eq!(d.decode_pool.as_deref(), Some(&[1, 3][..]));
    assert!(
        d.handed_off_per_prefill_worker.iter().all(|n| *n > 0),
        "{d:?}"
    );
    assert!(d.received_per_decode_worker.iter().all(|n| *n > 0), "{d:?}");
    assert_eq!(d.handoffs, 60);
    // The added nodes' NICs carried handoffs too.
    assert_eq!(
        d.links.iter().map(|l| l.bytes).collect::<Vec<_>>()[..2],
        [d.bytes, d.bytes]
    );
    assert!(report
        .to_string()
        .contains("disagg    2 prefill + 2 decode workers"));
    assert!(report.to_json().contains("\"prefill_pool\":[0,2]"));
    // Without commands, the report is as it always was: no pool lists.
    let plain = run(&scenario, &requests, &[], |_| {});
    assert!(!plain.to_json().contains("prefill_pool"));
    assert!(!plain.to_json().contains("decode_pool"));
}

#[test]
fn draining_a_prefill_and_a_decode_worker_mid_run_loses_no_request() {
    // Two workers in each pool, blocks of 64 KiB (a handoff takes the fabric about
    // 0.3 ms); at 2 ms, as request 20 has just gone to worker 0, worker 0 (prefill) and
    // worker 3 (decode) drain: worker 0 is routed nothing more, no handoff is given to
    // worker 3 any more, and both leave once what they hold is done.
    let mut scenario = disaggregated(2, 2, 4);
    scenario.worker.bytes_per_block = 64 << 10;
    let requests = requests(60, 100, 30);
    let commands = [
        (2_000_000, Command::Remove(0, Removal::Drain)),
        (2_000_000, Command::Remove(3, Removal::Drain)),
    ];
    // At the drain: worker 0's requests routed, worker 3's handoffs; and whether either
    // held anything then (so that the drain had something to finish).
    let mut at_drain: Option<(u64, BTreeSet<usize>, bool)> = None;
    let mut statuses = Vec::new();
    let report = run(&scenario, &requests, &commands, |cluster| {
        let disagg = cluster.disagg.as_ref().unwrap();
        let to_3: BTreeSet<usize> = disagg
            .handoffs
            .iter()
            .filter(|(_, h)| h.to == Some(3))
            .map(|(i, _)| *i)
            .collect();
        match &at_drain {
            None if cluster.draining.len() == 2 => {
                let busy = [0, 3]
                    .iter()
                    .all(|w| !cluster.workers[*w].states.is_empty());
                at_drain = Some((cluster.workers[0].routed, to_3, busy));
            }
            None => {}
            Some((routed, handoffs, _)) => {
                assert_eq!(
                    cluster.workers[0].routed, *routed,
                    "routed to a draining worker"
                );
                assert!(
                    to_3.is_subset(handoffs),
                    "a handoff given to a draining worker"
                );
            }
        }
        let status = |w: usize| {
            let worker = &cluster.workers[w];
            (worker.removed, cluster.draining.contains(&w))
        };
        statuses.push((status(0), status(3)));
    });
    let (_, _, busy) = at_drain.expect("the drain was seen");
    assert!(
        busy,
        "both drained workers held requests when told to drain"
    );
    assert!(
        statuses.contains(&((false, true), (false, true))),
        "both drained for a while"
    );
    assert_eq!(statuses.last(), Some(&((true, false), (true, false))));
    assert_eq!((report.completed, report.faults.requests_unserved), (60, 0));
    assert_eq!(report.faults.requests_retried, 0, "a drain retries nothing");
    let d = report.disaggregation.as_ref().unwrap();
    assert_eq!((d.handoffs, d.handoffs_aborted), (60, 0));
    assert_eq!(d.prefill_pool.as_deref(), Some(&[0, 1][..]));
    assert!(report.routing.view_matches_pools);
    assert!(report.events.rebuild_matches_pools);
}

#[test]
fn killing_a_decode_worker_mid_handoff_retries_its_requests_and_all_complete() {
    // Blocks of 1 MiB: a handoff of five blocks takes the fabric about 5 ms. Worker 2
    // (decode) is killed the first moment a frame is on its way to it.
    let mut scenario = disaggregated(1, 2, 2);
    scenario.worker.bytes_per_block = 1 << 20;
    let requests = requests(12, 500, 10);
    let mut cluster = Cluster::new(&scenario, requests.iter().cloned()).unwrap();
    let to_2 = |cluster: &Cluster<'_>| {
        let disagg = cluster.disagg.as_ref().unwrap();
        disagg.frames_in_flight.values().any(|f| f.to.0 == 2)
    };
    while !to_2(&cluster) {
        assert!(cluster.step(), "a handoff to worker 2 goes out");
        check(&cluster);
    }
    cluster
        .remove_worker(WorkerId::new(2), Removal::Kill)
        .unwrap();
    check(&cluster);
    assert!(!to_2(&cluster), "its frames were aborted");
    assert_eq!(
        cluster.serving_in(Some(Pool::Decode)),
        vec![WorkerId::new(1)]
    );
    assert_eq!(
        cluster.remove_worker(WorkerId::new(2), Removal::Drain),
        Err(CommandError::UnknownWorker(WorkerId::new(2)))
    );
    while cluster.step() {
        check(&cluster);
    }
    assert_eq!(cluster.snapshot().workers[2].status, WorkerStatus::Removed);
    assert_eq!(cluster.snapshot().workers[2].pool, Some(Pool::Decode));
    let report = cluster.into_report();
    assert_eq!((report.completed, report.faults.requests_unserved), (12, 0));
    assert!(report.faults.requests_retried > 0);
    let d = report.disaggregation.as_ref().unwrap();
    assert!(d.handoffs_aborted > 0 && d.frames_aborted > 0, "{d:?}");
    assert_eq!(
        d.received_per_decode_worker[1], 0,
        "worker 2 never got one through"
    );
    assert!(report.routing.view_matches_pools);
}

#[test]
fn with_its_last_decode_worker_removed_handoffs_wait_until_one_is_added() {
    // The only decode worker is killed at 1 ms; prefilled requests wait, their blocks
    // held on the prefill worker, until a decode worker joins at 4 ms.
    let scenario = disaggregated(1, 1, 4);
    let requests = requests(20, 200, 10);
    let commands = [
        (1_000_000, Command::Remove(1, Removal::Kill)),
        (4_000_000, Command::Add(Pool::Decode)),
    ];
    let mut waited = 0;
    let report = run(&scenario, &requests, &commands, |cluster| {
        waited = waited.max(cluster.disagg.as_ref().unwrap().unassigned.len());
    });
    assert!(waited > 1, "handoffs waited for a decode worker");
    assert_eq!((report.completed, report.faults.requests_unserved), (20, 0));
    let d = report.disaggregation.as_ref().unwrap();
    assert_eq!(d.decode_pool.as_deref(), Some(&[1, 2][..]));
    assert!(d.received_per_decode_worker[1] >= waited as u64);
}

#[test]
fn the_same_scale_commands_at_the_same_times_make_the_same_run() {
    let mut scenario = disaggregated(2, 2, 4);
    scenario.cluster.routing = Routing::Kv;
    scenario.worker.bytes_per_block = 64 << 10;
    let requests = requests(80, 100, 20);
    let commands = [
        (1_000_000, Command::Add(Pool::Decode)),
        (2_000_000, Command::Remove(1, Removal::Drain)),
        (2_500_000, Command::Remove(3, Removal::Kill)),
        (3_000_000, Command::Add(Pool::Prefill)),
        (4_000_000, Command::Remove(4, Removal::Drain)),
    ];
    let first = run(&scenario, &requests, &commands, |_| {});
    let second = run(&scenario, &requests, &commands, |_| {});
    assert_eq!(first.to_json(), second.to_json());
    assert_eq!(first.completed, 80);
    let d = first.disaggregation.as_ref().unwrap();
    assert_eq!(d.prefill_pool.as_deref(), Some(&[0, 1, 5][..]));
    assert_eq!(d.decode_pool.as_deref(), Some(&[2, 3, 4][..]));
}

#[test]
fn pools_are_commands_of_disaggregated_clusters_only() {
    let requests = requests(4, 100, 3);
    let mut aggregated = disaggregated(1, 1, 4);
    aggregated.cluster.disaggregation = None;
    let mut cluster = Cluster::new(&aggregated, requests.iter().cloned()).unwrap();
    assert_eq!(
        cluster.add_worker_to(Pool::Decode),
        Err(CommandError::NotDisaggregated)
    );
    assert_eq!(
        cluster.serving_in(None),
        vec![WorkerId::new(0), WorkerId::new(1)]
    );
    assert!(cluster.serving_in(Some(Pool::Prefill)).is_empty());
    assert_eq!(cluster.snapshot().workers[0].pool, None);
    let scenario = disaggregated(1, 1, 4);
    let mut cluster = Cluster::new(&scenario, requests.iter().cloned()).unwrap();
    assert_eq!(cluster.add_worker(), Err(CommandError::Disaggregated));
    let pools: Vec<Option<Pool>> = cluster.snapshot().workers.iter().map(|w| w.pool).collect();
    assert_eq!(pools, vec![Some(Pool::Prefill), Some(Pool::Decode)]);
}
