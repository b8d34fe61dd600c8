//! `scenarios/conversation-trace.ron` (the Mooncake conversation trace on `kvtwin bench
//! sim`'s default cluster, the starting point of trace sweeps) serves every request, and
//! its report is, byte for byte, the one whose digest `common::REPORT_DIGESTS` keeps.

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
