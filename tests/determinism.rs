//! The same scenario and seed give a byte-identical report; another seed gives another.

mod common;

use kvtwin_sim::run::simulate;
use kvtwin_sim::scenario::{Scenario, WorkloadSpec};

fn report_json(seed: u64) -> String {
    let mut scenario = Scenario::load(&common::repo_root().join("scenarios/default.ron")).unwrap();
    scenario.seed = seed;
    let WorkloadSpec::Conversations(spec) = &mut scenario.workload else {
        panic!("default.ron is synthetic")
    };
    // A tenth of the default traffic keeps the test quick in debug builds.
    spec.conversations /= 10;
    let requests = spec.generate(scenario.seed, scenario.worker.block_size_tokens);
    simulate(&scenario, &requests).unwrap().to_json()
}

#[test]
fn the_same_seed_gives_a_byte_identical_report() {
    let seed = std::env::var("KVTWIN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7);
    let first = report_json(seed);
    let second = report_json(seed);
    assert_eq!(
        first, second,
        "nondeterminism; reproduce with KVTWIN_SEED={seed} cargo test --test determinism"
    );
    assert_ne!(first, report_json(seed + 1), "the seed must matter");
}
