//! `scenarios/reasoning-priority.ron`: with generated blocks cached, evicting by phase
//! (finished reasoning first) keeps more of the prompt prefixes that later turns hit on
//! the GPU than plain LRU does, so fewer are onboarded from host or recomputed.

mod common;

use kvtwin::pool::EvictionPolicyKind;
use kvtwin_sim::cluster::{simulate, Report};
use kvtwin_sim::scenario::Scenario;

fn run(eviction: EvictionPolicyKind) -> Report {
    let mut scenario =
        Scenario::load(&common::repo_root().join("scenarios/reasoning-priority.ron")).unwrap();
    // A third of the conversations keeps the test quick in debug builds.
    scenario.workload.thin_out(3);
    for tier in &mut scenario.worker.tiers {
        tier.eviction = eviction;
    }
    let requests = scenario
        .workload
        .generate(scenario.seed, scenario.worker.block_size_tokens)
        .unwrap();
    simulate(&scenario, &requests).unwrap()
}

#[test]
fn evicting_finished_reasoning_first_keeps_more_prompt_prefixes_on_the_gpu() {
    let priority = run(EvictionPolicyKind::Priority);
    let lru = run(EvictionPolicyKind::Lru);
    for report in [&priority, &lru] {
        assert_eq!(report.completed, report.requests);
        assert!(report.routing.view_matches_pools);
        let outputs = report.output_blocks.expect("the scenario caches outputs");
        assert!(outputs.reasoning_cooled > 0);
    }
    assert_eq!(priority.blocks.total, lru.blocks.total);
    assert!(
        priority.blocks.device > lru.blocks.device,
        "device hits: priority {} vs LRU {}",
        priority.blocks.device,
        lru.blocks.device
    );
    assert!(
        priority.hit_ratio >= lru.hit_ratio,
        "hit ratio: priority {} vs LRU {}",
        priority.hit_ratio,
        lru.hit_ratio
    );
    let onboarded = |r: &Report| r.blocks.host + r.blocks.disk;
    assert!(onboarded(&priority) < onboarded(&lru));
}
