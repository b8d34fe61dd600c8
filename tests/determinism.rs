//! Every scenario gives a byte-identical report when run twice with the same seed; another
//! seed gives another.

mod common;

use kvtwin_sim::cluster::simulate;
use kvtwin_sim::scenario::{Scenario, WorkerEngine};
use kvtwin_sim::validation::is_validation_file;
use std::path::Path;

fn report_json(path: &Path, seed: u64) -> Option<String> {
    let mut scenario = Scenario::load(path).unwrap();
    scenario.seed = seed;
    // A tenth of the traffic keeps the test quick in debug builds.
    scenario.workload.thin_out(10);
    // Synthetic requests, reshaped by the scenario's traffic section if it has one.
    let Some(requests) = scenario.synthetic_requests().unwrap() else {
        eprintln!(
            "{}: trace workloads are replayed by the trace tests",
            path.display()
        );
        return None;
    };
    if let WorkerEngine::Vllm(spec) = &scenario.worker.engine {
        let report = kvtwin_sim::vllm::run::simulate(&scenario, spec, &requests);
        return Some(serde_json::to_string(&report).unwrap());
    }
    Some(simulate(&scenario, &requests).unwrap().to_json())
}

#[test]
fn every_scenario_with_the_same_seed_gives_a_byte_identical_report() {
    let seed = std::env::var("KVTWIN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7);
    let mut paths: Vec<_> = std::fs::read_dir(common::repo_root().join("scenarios"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "ron"))
        // Validation scripts run on real hardware; they are not simulations.
        .filter(|p| !is_validation_file(p))
        .collect();
    paths.sort();
    assert!(!paths.is_empty());
    for path in paths {
        let Some(first) = report_json(&path, seed) else {
            continue;
        };
        let second = report_json(&path, seed).unwrap();
        assert_eq!(
            first,
            second,
            "{}: nondeterminism; reproduce with KVTWIN_SEED={seed} cargo test --test determinism",
            path.display()
        );
        assert_ne!(
            first,
            report_json(&path, seed + 1).unwrap(),
            "{}: the seed must matter",
            path.display()
        );
    }
}
