//! Replays every `scenarios/*.ron` and checks what must hold for any scenario: every
//! servable request completes, and replaying the emitted events rebuilds every tier's
//! registry, and the router in the loop ends with a view that matches every worker's
//! pools (faults included: the cluster must converge once they stop).

mod common;

use kvtwin_sim::run::simulate;
use kvtwin_sim::scenario::Scenario;

#[test]
fn every_scenario_runs_to_completion_and_its_events_rebuild_the_pools() {
    let dir = common::repo_root().join("scenarios");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "ron"))
        .collect();
    paths.sort();
    assert!(!paths.is_empty(), "no scenarios in {}", dir.display());
    for path in paths {
        let scenario = Scenario::load(&path).unwrap_or_else(|e| panic!("{e}"));
        let Some(requests) = scenario
            .workload
            .generate(scenario.seed, scenario.worker.block_size_tokens)
        else {
            eprintln!(
                "{}: trace workloads are replayed by the trace tests",
                path.display()
            );
            continue;
        };
        let report = simulate(&scenario, &requests).unwrap();
        assert_eq!(
            report.completed + report.rejected_too_large,
            report.requests,
            "{}",
            path.display()
        );
        assert!(
            report.events.rebuild_matches_pools,
            "{}: events do not rebuild the pools",
            path.display()
        );
        // Lost events make the router refuse what follows them until a snapshot comes;
        // whatever happened, its view must match the pools by the end.
        assert!(
            report.routing.view_matches_pools,
            "{}: the router's view differs from the pools",
            path.display()
        );
        if report.routing.events_dropped == 0 {
            assert_eq!(
                report.routing.events_rejected,
                0,
                "{}: the router refused events",
                path.display()
            );
        }
        assert_eq!(
            report.faults.requests_unserved,
            0,
            "{}: requests left unserved",
            path.display()
        );
        assert!(
            report.blocks.total > 0,
            "{}: nothing was served",
            path.display()
        );
    }
}
