//! `scenarios/conversation-trace.ron` (the Mooncake conversation trace on `kvtwin bench
//! sim`'s default cluster, the starting point of trace sweeps) serves every request, and
//! its report is, byte for byte, the one whose digest `common::REPORT_DIGESTS` keeps; so
//! does `scenarios/conversation-shared.ron` (eight workers and a shared tier), and on it
//! a larger store gives more of the prompt, more of it computed by another worker.

mod common;

use kvtwin_sim::cluster::simulate;
use kvtwin_sim::scenario::{Scenario, WorkloadSpec};
use kvtwin_sim::workload::read_mooncake_trace;

#[test]
fn the_conversation_trace_scenario_serves_the_whole_trace() {
    let Some(shared) = common::shared_dir("the conversation trace scenario test") else {
        return;
    };
    let path = common::repo_root().join("scenarios/conversation-trace.ron");
    let scenario = Scenario::load(&path).unwrap();
    let WorkloadSpec::MooncakeTrace { path: trace, .. } = &scenario.workload else {
        panic!("conversation-trace.ron names no trace");
    };
    // The scenario's own path, taken from its folder, is the trace in ../shared.
    let trace = path.parent().unwrap().join(trace);
    assert_eq!(
        trace.canonicalize().unwrap(),
        shared
            .join("data/mooncake/conversation_trace.jsonl")
            .canonicalize()
            .unwrap()
    );
    let requests = read_mooncake_trace(&trace, scenario.workload.trace_check(512))
        .unwrap()
        .requests;
    let report = simulate(&scenario, &requests).unwrap();
    common::check_report_digest("conversation-trace.ron", &report.to_json())
        .unwrap_or_else(|mismatch| panic!("the report changed: {mismatch}"));
    assert_eq!(report.completed, 12_031);
    assert_eq!(report.workers, 16);
    assert!(report.routing.view_matches_pools);
}

#[test]
fn eight_workers_find_more_of_the_trace_in_a_larger_shared_tier() {
    let Some(_shared) = common::shared_dir("the shared-tier trace test") else {
        return;
    };
    let path = common::repo_root().join("scenarios/conversation-shared.ron");
    let scenario = Scenario::load(&path).unwrap();
    let WorkloadSpec::MooncakeTrace { path: trace, .. } = &scenario.workload else {
        panic!("conversation-shared.ron names no trace");
    };
    let trace = path.parent().unwrap().join(trace);
    let requests = read_mooncake_trace(&trace, scenario.workload.trace_check(512))
        .unwrap()
        .requests;
    let sized = |blocks: u64| {
        let sets = [format!("cluster.shared_tier.capacity_blocks={blocks}")];
        simulate(&scenario.with_overrides(&sets).unwrap(), &requests).unwrap()
    };
    let committed = simulate(&scenario, &requests).unwrap();
    common::check_report_digest("conversation-shared.ron", &committed.to_json())
        .unwrap_or_else(|mismatch| panic!("the report changed: {mismatch}"));
    let none = sized(0);
    assert!(none.shared_tier.is_none());
    let mut last = (none.hit_ratio, 0.0);
    eprintln!("store blocks  hit ratio  from store  by another worker  TTFT mean  TTFT p50");
    for (blocks, report) in [
        (5_000, sized(5_000)),
        (20_000, committed),
        (80_000, sized(80_000)),
    ] {
        let store = report.shared_tier.as_ref().unwrap();
        eprintln!(
            "{blocks:>12}  {:>9.4}  {:>10.4}  {:>17.4}  {:>9.1}  {:>8.1}",
            report.hit_ratio,
            store.hit_ratio,
            store.cross_worker_hit_ratio,
            report.ttft.mean_ms,
            report.ttft.p50_ms
        );
        assert_eq!(report.completed, 12_031);
        assert!(report.events.rebuild_matches_pools && report.routing.view_matches_pools);
        assert!(
            report.hit_ratio > last.0 && store.cross_worker_hit_ratio > last.1,
            "{blocks} blocks: hit ratio {} and cross-worker {} against {last:?}",
            report.hit_ratio,
            store.cross_worker_hit_ratio
        );
        // Most of what a worker reads, another computed: the tier's point.
        assert!(
            store.cross_worker_blocks * 10 > store.read_blocks * 9,
            "{store:?}"
        );
        assert!(report.ttft.p50_ms < none.ttft.p50_ms, "{report}");
        last = (report.hit_ratio, store.cross_worker_hit_ratio);
    }
}
