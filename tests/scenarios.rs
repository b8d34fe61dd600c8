//! Replays every `scenarios/*.ron` and checks what must hold for any scenario: every
//! servable request completes, and replaying the emitted events rebuilds every tier's
//! registry, and the router in the loop ends with a view that matches every worker's
//! pools (faults included: the cluster must converge once they stop), or, for a
//! scenario of vLLM engines, that their twin completes every request; and that each
//! prints, byte for byte, the report whose digest `common::REPORT_DIGESTS` keeps.
//!
//! A scenario without a shared tier (`cluster.shared_tier.capacity_blocks` 0) runs with
//! every other knob of its shared tier turned (policy, bandwidth, latency, price,
//! router credit): a store of no capacity must be no store at all, so its report keeps
//! the digest it had before the shared tier existed.

mod common;

use kvtwin_sim::cluster::simulate;
use kvtwin_sim::scenario::{Scenario, WorkerEngine};
use kvtwin_sim::validation::{is_validation_file, run_script, SimArm, ValidationScenario};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

#[test]
fn every_scenario_runs_to_completion_and_its_events_rebuild_the_pools() {
    let dir = common::repo_root().join("scenarios");
    let mut paths: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "ron"))
        // Validation scripts are not simulations: `kvtwin validate` runs them, and the
        // test below loads them.
        .filter(|p| !is_validation_file(p))
        .collect();
    paths.sort();
    assert!(!paths.is_empty(), "no scenarios in {}", dir.display());
    for (file, _) in common::REPORT_DIGESTS {
        assert!(
            paths.iter().any(|p| p.file_name().unwrap() == *file),
            "REPORT_DIGESTS names {file}, which is not in scenarios/"
        );
    }
    // The scenarios are independent and each runs on one thread: two at a time (this
    // test is most of its binary's minutes on CI's 2 cores). A failed check panics its
    // thread with the scenario's name, and the scope passes the panic on.
    let next = AtomicUsize::new(0);
    let changed = Mutex::new(Vec::new());
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get().min(4));
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                let k = next.fetch_add(1, Ordering::Relaxed);
                let Some(path) = paths.get(k) else { break };
                if let Some(mismatch) = check_scenario(path) {
                    changed.lock().unwrap().push((k, mismatch));
                }
            });
        }
    });
    let mut changed = changed.into_inner().unwrap();
    changed.sort();
    let changed: Vec<String> = changed.into_iter().map(|(_, mismatch)| mismatch).collect();
    assert!(
        changed.is_empty(),
        "reports changed:\n{}",
        changed.join("\n")
    );
}

/// Runs one scenario and checks what must hold for any; `Some` names a report whose
/// digest changed (collected, so every changed report is listed at once).
fn check_scenario(path: &Path) -> Option<String> {
    let file = path.file_name().unwrap().to_str().unwrap().to_string();
    let scenario = Scenario::load(path).unwrap_or_else(|e| panic!("{e}"));
    // Synthetic requests, reshaped by the scenario's traffic section if it has one.
    let Some(requests) = scenario.synthetic_requests().unwrap() else {
        eprintln!(
            "{}: trace workloads are replayed by the trace tests",
            path.display()
        );
        assert!(
            common::REPORT_DIGESTS.iter().any(|(name, _)| *name == file),
            "{file}: a trace scenario needs its digest in REPORT_DIGESTS too"
        );
        return None;
    };
    if let WorkerEngine::Vllm(spec) = &scenario.worker.engine {
        // The twin of vLLM engines: no kvtwin manager, so no pools or registries to
        // rebuild; every request completes (none outgrows an engine's cache here).
        let report = kvtwin_sim::vllm::run::simulate(&scenario, spec, &requests);
        assert_eq!(report.completed, report.arrived, "{}", path.display());
        assert!(report.steps > 0, "{}: nothing was served", path.display());
        return common::check_report_digest(&file, &serde_json::to_string(&report).unwrap()).err();
    }
    let (scenario, knobs) = if scenario.cluster.shared_tier.is_on() {
        (scenario, "")
    } else {
        let sets: Vec<String> = SHARED_TIER_KNOBS.iter().map(|s| s.to_string()).collect();
        let turned = scenario.with_overrides(&sets).unwrap();
        (
            turned,
            " (run with a shared tier of capacity 0 and its knobs turned)",
        )
    };
    let report = simulate(&scenario, &requests).unwrap();
    let mismatch = common::check_report_digest(&file, &report.to_json())
        .err()
        .map(|mismatch| format!("{mismatch}{knobs}"));
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
    mismatch
}

/// Every knob of a shared tier but its capacity, away from its default.
const SHARED_TIER_KNOBS: [&str; 5] = [
    "cluster.shared_tier.policy=Arc",
    "cluster.shared_tier.bytes_per_s=1",
    "cluster.shared_tier.latency_ns=999999999",
    "cluster.shared_tier.usd_per_gb_month=99",
    "cluster.shared_tier.router_credit=1.0",
];

#[test]
fn every_validation_script_loads_and_runs_on_the_simulator() {
    let dir = common::repo_root().join("scenarios");
    let mut found = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if !is_validation_file(&path) {
            continue;
        }
        found += 1;
        let script = ValidationScenario::load(&path).unwrap_or_else(|e| panic!("{e}"));
        let profile = Scenario::load(&dir.join("default.ron")).unwrap().hardware;
        let mut arm = SimArm::new(&script, profile).unwrap();
        let trace = run_script(&mut arm, &script).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            trace.phases.len(),
            script.levels.len() * script.phases.len()
        );
    }
    assert!(found > 0, "no validate_*.ron in {}", dir.display());
}
