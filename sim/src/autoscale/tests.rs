//! The autoscaled run against what must hold whatever the planner wishes: bounds kept,
//! the router's view equal to the pools after every scale event, the same timeline for
//! the same seed; and the shipped scenarios showing what they were written to show.

use super::*;
use crate::checkers;
use crate::cluster::{simulate, Report};
use crate::scenario::Scenario;
use crate::workload::Request;
use std::path::Path;

/// A shipped scenario, with its traffic cut to `horizon_s` seconds so that tests stay
/// quick in debug builds.
fn shipped(name: &str, horizon_s: f64) -> Scenario {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../scenarios")
        .join(name);
    let mut scenario = Scenario::load(&path).unwrap();
    if let Some(traffic) = scenario.traffic.as_mut() {
        traffic.horizon_s = traffic.horizon_s.min(horizon_s);
    }
    scenario
}

fn requests(scenario: &Scenario) -> Vec<Request> {
    let generated = scenario
        .workload
        .generate(scenario.seed, scenario.worker.block_size_tokens)
        .unwrap();
    let mut shaped = scenario.shape_traffic(generated).unwrap();
    shaped.sort_by_key(|r| r.arrival);
    shaped
}

/// Runs `scenario` step by step (events delivered at once), checking after every step
/// that each pool is within the bounds and, after every scale event, that the router's
/// view equals the pools.
fn run_checked(scenario: &Scenario) -> Report {
    // Events reach the router at the instant they are published, so that its view must
    // equal the pools at every step, not only once the plane is quiet.
    let mut scenario = scenario.clone();
    scenario.cluster.event_plane.delay_us = 0;
    let scenario = &scenario;
    let spec = scenario.autoscale.clone().unwrap();
    let requests = requests(scenario);
    let mut run = Autoscaled::new(scenario, requests).unwrap();
    let mut scale_events = 0;
    while let Some(step) = run.step() {
        for (pool, serving, loading, _) in run.pools() {
            let size = serving + loading;
            assert!(
                (spec.min_replicas..=spec.max_replicas).contains(&size),
                "{pool} has {size} workers, outside {}..={}",
                spec.min_replicas,
                spec.max_replicas
            );
        }
        if matches!(step, Step::Joined | Step::Interval { scaled: true }) {
            scale_events += 1;
        }
        // After every step, scale events among them.
        assert!(
            checkers::router_view_matches_pools(run.cluster()),
            "the router's view differs from the pools after {step:?}"
        );
    }
    let report = run.into_report();
    assert!(report.routing.view_matches_pools && report.events.rebuild_matches_pools);
    assert_eq!(report.completed, report.requests, "every request is served");
    let autoscale = report.autoscale.as_ref().unwrap();
    assert_eq!(autoscale.commands_refused, 0);
    if autoscale.scale_ups + autoscale.scale_downs > 0 {
        assert!(scale_events > 0);
    }
    report
}

fn with_planner(mut scenario: Scenario, planner: PlannerSpec) -> Scenario {
    scenario.autoscale.as_mut().unwrap().planner = planner;
    scenario
}

fn load_planner() -> PlannerSpec {
    PlannerSpec::Load {
        queue_up: 2.0,
        queue_down: 0.5,
        kv_up: 0.8,
        kv_down: 0.3,
    }
}

#[test]
fn every_planner_keeps_its_bounds_and_the_router_in_step_with_the_pools() {
    for (base, horizon) in [
        ("autoscale-flap.ron", 1_200.0),
        ("autoscale-burst.ron", 360.0),
    ] {
        every_planner_within_bounds(shipped(base, horizon));
    }
}

fn every_planner_within_bounds(base: Scenario) {
    for planner in [
        PlannerSpec::Static,
        base.autoscale.as_ref().unwrap().planner.clone(),
        PlannerSpec::Throughput {
            predictor: Predictor::HoltWinters {
                alpha: 0.5,
                beta: 0.2,
                gamma: 0.0,
                season: 0,
            },
            capacity: Capacity::Given {
                prefill_tokens_per_s: 2_000.0,
                decode_tokens_per_s: 200.0,
            },
        },
        load_planner(),
    ] {
        for scale_down in [ScaleDown::Drain, ScaleDown::Kill] {
            let mut scenario = with_planner(base.clone(), planner.clone());
            let spec = scenario.autoscale.as_mut().unwrap();
            spec.scale_down = scale_down;
            spec.max_replicas = 3;
            let report = run_checked(&scenario);
            let autoscale = report.autoscale.unwrap();
            assert!(
                autoscale.peak_replicas.iter().all(|peak| *peak <= 3),
                "{planner:?}"
            );
        }
    }
}

#[test]
fn the_same_seed_gives_the_same_timeline_and_another_seed_another() {
    let scenario = shipped("autoscale-flap.ron", 1_200.0);
    let a = simulate(&scenario, &requests(&scenario)).unwrap();
    let b = simulate(&scenario, &requests(&scenario)).unwrap();
    assert_eq!(a.to_json(), b.to_json());
    assert!(!a.autoscale.as_ref().unwrap().timeline.is_empty());
    let mut other = scenario.clone();
    other.seed += 1;
    let c = simulate(&other, &requests(&other)).unwrap();
    assert_ne!(a.autoscale.unwrap().timeline, c.autoscale.unwrap().timeline);
}

#[test]
fn a_static_planner_changes_nothing_in_the_run() {
    let mut scenario = with_planner(shipped("autoscale-flap.ron", 600.0), PlannerSpec::Static);
    let requests = requests(&scenario);
    let planned = simulate(&scenario, &requests).unwrap();
    let autoscale = planned.autoscale.clone().unwrap();
    assert_eq!(autoscale.scale_ups + autoscale.scale_downs, 0);
    // One worker for the whole run: its GPU-hours are the run's length.
    assert!((autoscale.gpu_hours - planned.simulated_s / 3600.0).abs() < 1e-9);
    scenario.autoscale = None;
    let mut plain = simulate(&scenario, &requests).unwrap();
    plain.autoscale = planned.autoscale.clone();
    assert_eq!(plain.to_json(), planned.to_json());
}

#[test]
fn the_flap_scenario_flip_flops_without_hysteresis_and_not_with_it() {
    let scenario = shipped("autoscale-flap.ron", 3_600.0);
    let flapping = simulate(&scenario, &requests(&scenario)).unwrap();
    let flapping = flapping.autoscale.unwrap();
    assert!(
        flapping.direction_flips >= 4,
        "expected flip-flops: {flapping}"
    );
    let mut damped = scenario.clone();
    damped.autoscale.as_mut().unwrap().hysteresis = Some(Hysteresis::default());
    let damped = simulate(&damped, &requests(&damped)).unwrap();
    let damped = damped.autoscale.unwrap();
    assert_eq!(damped.direction_flips, 0, "{damped}");
    println!(
        "flap: {} flips, {:.2} GPU-hours without hysteresis; {} flips, {:.2} GPU-hours with",
        flapping.direction_flips, flapping.gpu_hours, damped.direction_flips, damped.gpu_hours
    );
}

#[test]
fn the_burst_grows_the_prefill_pool_within_two_intervals_under_the_load_planner() {
    let scenario = shipped("autoscale-burst.ron", 360.0);
    let spec = scenario.autoscale.clone().unwrap();
    assert!(matches!(spec.planner, PlannerSpec::Load { .. }));
    let report = run_checked(&scenario);
    let autoscale = report.autoscale.unwrap();
    let burst_at = 300.0;
    let grew = autoscale
        .timeline
        .iter()
        .find(|d| d.pool == PoolKind::Prefill && d.to > d.from && d.at_s >= burst_at)
        .unwrap_or_else(|| panic!("the prefill pool never grew: {autoscale}"));
    assert!(
        grew.at_s <= burst_at + 2.0 * spec.interval_s,
        "the prefill pool grew only at {} s: {autoscale}",
        grew.at_s
    );
    // Before the burst, the base load needs no change.
    assert!(autoscale.timeline.iter().all(|d| d.at_s > burst_at));
}

#[test]
fn the_diurnal_planner_grows_and_shrinks_both_pools_with_the_load() {
    // The first six hours after dawn, twenty times as fast: the morning ramp.
    let mut scenario = shipped("autoscale-diurnal.ron", 86_400.0);
    let traffic = scenario.traffic.as_mut().unwrap();
    if let Some(crate::traffic::RateCurve::Diurnal {
        period_s,
        peak_at_s,
        ..
    }) = traffic.rate.as_mut()
    {
        *period_s /= 24.0;
        *peak_at_s /= 24.0;
    }
    traffic.horizon_s = 3_600.0;
    if let crate::scenario::WorkloadSpec::Conversations(spec) = &mut scenario.workload {
        spec.conversations = 4_000;
    }
    scenario.autoscale.as_mut().unwrap().interval_s = 30.0;
    let report = run_checked(&scenario);
    let autoscale = report.autoscale.unwrap();
    assert_eq!(autoscale.pools, [PoolKind::Prefill, PoolKind::Decode]);
    for pool in [PoolKind::Prefill, PoolKind::Decode] {
        let ups = autoscale
            .timeline
            .iter()
            .filter(|d| d.pool == pool && d.to > d.from);
        let downs = autoscale
            .timeline
            .iter()
            .filter(|d| d.pool == pool && d.to < d.from);
        assert!(ups.count() > 0 && downs.count() > 0, "{pool}: {autoscale}");
    }
    assert!(autoscale.gpu_hours > 0.0 && autoscale.slo_attainment > 0.5);
    // Four GPUs per 70B replica, from the compute model.
    assert_eq!(autoscale.gpus_per_replica, 4);
}

#[test]
fn sweeps_and_plans_see_the_planner_figures_and_the_same_report() {
    let scenario = shipped("autoscale-flap.ron", 600.0);
    let requests = requests(&scenario);
    let (report, summary) = crate::plan::run::run(&scenario, &requests).unwrap();
    assert_eq!(report, simulate(&scenario, &requests).unwrap());
    let autoscale = report.autoscale.unwrap();
    let figures = summary.autoscale.unwrap();
    assert_eq!(figures.planner, autoscale.planner);
    assert_eq!(figures.gpu_hours, autoscale.gpu_hours);
    assert_eq!(figures.direction_flips, autoscale.direction_flips);
    // A sweep over planners is a grid over the section's field.
    let static_run = crate::plan::run::configure(
        &scenario,
        &[r#"autoscale.planner="Static""#.to_string()],
        scenario.seed,
    )
    .unwrap();
    let (_, summary) = crate::plan::run::run(&static_run, &requests).unwrap();
    assert_eq!(summary.autoscale.unwrap().planner, "static");
}
