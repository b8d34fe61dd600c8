//! The Grafana dashboard shipped in `deploy/grafana/kvtwin-router.json`: every series a
//! panel queries exists in what `GET /metrics` serves (a router with a budget, events
//! applied, an eviction and a route recorded), every label a panel groups by is on those
//! series, and the datasource is the dashboard's `${datasource}` variable, never a
//! hard-coded uid.

use kvtwin::ids::{LocalBlockHash, WorkerId};
use kvtwin::router::indexer::IndexBudget;
use kvtwin::tier::Tier;
use kvtwin_plane::service::metrics::SourceLabels;
use kvtwin_plane::service::state::{RouterLimits, RouterState};
use kvtwin_plane::wire::{WorkerEvent, WorkerEventData};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// A router that has seen what every panel shows: two workers' blocks in two tiers, an
/// eviction past its per-worker cap, a gap in one worker's event ids, and a route.
fn metrics_text() -> String {
    let limits = RouterLimits {
        budget: IndexBudget {
            max_blocks_per_worker: Some(3),
            ..IndexBudget::UNBOUNDED
        },
        worker_capacity_blocks: Some(2),
        ..RouterLimits::default()
    };
    let mut state = RouterState::with_limits(4, limits);
    // A source, so its per-connection series exist (a router has one per --zmq flag).
    state.register_source(
        SourceLabels {
            transport: "zmq",
            endpoint: "tcp://127.0.0.1:5557".to_string(),
        },
        true,
    );
    let stored =
        |worker: u64, event_id: u64, parent: Option<u64>, first: u64, tier: Tier| WorkerEvent {
            worker: WorkerId::new(worker),
            dp_rank: 0,
            event_id,
            data: WorkerEventData::Stored {
                parent,
                blocks: (first..first + 2)
                    .map(|engine| (engine, LocalBlockHash::new(engine * 7)))
                    .collect(),
                tier,
            },
        };
    for event in [
        stored(1, 0, None, 10, Tier::Device),
        stored(1, 1, Some(11), 12, Tier::Device),
        stored(2, 0, None, 10, Tier::Host),
        // Worker 2 skips event id 1: a gap.
        stored(2, 2, Some(11), 12, Tier::Host),
    ] {
        let _ = state.apply(&event);
    }
    let query: Vec<LocalBlockHash> = [10u64, 11]
        .iter()
        .map(|e| LocalBlockHash::new(e * 7))
        .collect();
    let answer = state.route(&query);
    state.record_route(&answer);
    state.drop_one("bad_json");
    state.render_metrics()
}

/// Series name → the label names its lines carry.
fn series(text: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let labels = out.entry(line[..name_end].to_string()).or_default();
        if let (Some(open), Some(close)) = (line.find('{'), line.find('}')) {
            for pair in line[open + 1..close].split(',') {
                if let Some((label, _)) = pair.split_once('=') {
                    labels.insert(label.trim().to_string());
                }
            }
        }
    }
    out
}

/// Every string under `key` anywhere in `value`.
fn strings_under<'a>(value: &'a Value, key: &str, out: &mut Vec<&'a str>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str() == key, v) {
                    (true, Value::String(s)) => out.push(s),
                    _ => strings_under(v, key, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| strings_under(v, key, out)),
        _ => {}
    }
}

/// The `kvtwin_...` identifiers of a PromQL expression.
fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let bytes = expr.as_bytes();
    let mut i = 0;
    while let Some(at) = expr[i..].find("kvtwin_") {
        let start = i + at;
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        names.push(expr[start..end].to_string());
        i = end;
    }
    names
}

/// The labels of `by (...)` clauses in a PromQL expression.
fn grouped_by(expr: &str) -> Vec<String> {
    let mut labels = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("by (") {
        rest = &rest[at + 4..];
        if let Some(close) = rest.find(')') {
            labels.extend(rest[..close].split(',').map(|l| l.trim().to_string()));
            rest = &rest[close..];
        }
    }
    labels.retain(|l| !l.is_empty() && l != "le");
    labels
}

#[test]
fn every_series_the_dashboard_queries_is_served_with_its_labels() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/grafana/kvtwin-router.json"
    );
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let served = series(&metrics_text());

    let mut exprs = Vec::new();
    strings_under(&dashboard, "expr", &mut exprs);
    assert!(exprs.len() >= 10, "{} queries", exprs.len());
    let mut queried = BTreeSet::new();
    for expr in &exprs {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "a query of no kvtwin series: {expr}");
        for name in &names {
            let labels = served.get(name).unwrap_or_else(|| {
                panic!(
                    "{name} (in {expr}) is not served; served: {:?}",
                    served.keys()
                )
            });
            for label in grouped_by(expr) {
                assert!(
                    labels.contains(&label),
                    "{name} has no label {label} (in {expr}): {labels:?}"
                );
            }
            queried.insert(name.clone());
        }
    }
    // The panels cover the budget, the per-worker view and the event plane's health.
    for needed in [
        "kvtwin_router_index_blocks",
        "kvtwin_router_evicted_blocks_total",
        "kvtwin_router_kv_cache_events_applied_total",
        "kvtwin_router_source_reconnects_total",
    ] {
        assert!(queried.contains(needed), "no panel shows {needed}");
    }

    // The datasource is the variable, never a uid of someone's Grafana.
    let mut uids = Vec::new();
    strings_under(&dashboard, "uid", &mut uids);
    let dashboard_uid = dashboard["uid"].as_str().unwrap_or_default();
    for uid in uids.into_iter().filter(|uid| *uid != dashboard_uid) {
        assert_eq!(uid, "${datasource}", "a hard-coded datasource uid");
    }
    let variables = dashboard["templating"]["list"].as_array().unwrap();
    assert!(
        variables.iter().any(|v| v["name"] == "datasource"
            && v["type"] == "datasource"
            && v["query"] == "prometheus"),
        "no ${{datasource}} variable"
    );
}

#[test]
fn the_served_metrics_are_what_the_test_expects() {
    // A guard on the fixture: the router above did evict and did see a gap.
    let text = metrics_text();
    println!("{text}");
    assert!(
        text.contains("kvtwin_router_evicted_blocks_total{"),
        "{text}"
    );
}
