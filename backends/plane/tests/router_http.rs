//! The router service's HTTP API on a real loopback socket: route by tokens and by token
//! hashes, workers, health and readiness, metrics, and bad requests answered 400 and counted.

mod support;

use kvtwin::ids::{LocalBlockHash, WorkerId};
use kvtwin::tier::Tier;
use kvtwin_plane::service::http;
use kvtwin_plane::service::state::RouterState;
use kvtwin_plane::wire::{WorkerEvent, WorkerEventData};
use std::sync::{Arc, Mutex};
use support::{http as request, json, start};

const BLOCK: usize = 4;

fn stored(
    worker: u64,
    dp_rank: u32,
    tokens: &[u32],
    tier: Tier,
    state: &RouterState,
) -> WorkerEvent {
    let hashes = state.hash_tokens(tokens);
    WorkerEvent {
        worker: WorkerId::new(worker),
        dp_rank,
        event_id: 0,
        data: WorkerEventData::Stored {
            parent: None,
            blocks: hashes
                .iter()
                .enumerate()
                .map(|(i, h)| (worker * 1000 + i as u64, *h))
                .collect(),
            tier,
        },
    }
}

#[test]
fn the_api_routes_reports_and_refuses_bad_requests() {
    let mut state = RouterState::new(BLOCK);
    let prompt: Vec<u32> = (0..16).collect();
    let events = [
        stored(7, 0, &prompt, Tier::Device, &state),
        stored(9, 1, &prompt[..8], Tier::Host, &state),
    ];
    assert_eq!(state.apply_batch(&events), 2);
    let hashes: Vec<LocalBlockHash> = state.hash_tokens(&prompt);
    let shared = Arc::new(Mutex::new(state));
    let (addr, _stop) = start(shared.clone());

    let body = format!("{{\"tokens\":{:?}}}", prompt);
    let (status, text) = request(addr, "POST", "/v1/route", Some(&body));
    assert_eq!(status, 200, "{text}");
    let answer = json(&text);
    assert_eq!(answer["worker"], 7);
    assert_eq!(answer["dp_rank"], 0);
    assert_eq!(answer["query_blocks"], 4);
    assert_eq!(answer["overlaps"]["7"], 4);
    assert_eq!(answer["overlaps"]["9:1"], 2);
    assert_eq!(answer["tier_overlaps"]["7"]["device"], 4);
    assert_eq!(answer["tier_overlaps"]["9:1"]["host"], 2);
    assert_eq!(answer["tier_overlaps"]["9:1"]["device"], 0);

    let locals: Vec<u64> = hashes.iter().map(|h| h.get()).collect();
    let body = format!("{{\"local_hashes\":{:?}}}", &locals[..2]);
    let (status, text) = request(addr, "POST", "/v1/route", Some(&body));
    assert_eq!(status, 200, "{text}");
    assert_eq!(json(&text)["overlaps"]["9:1"], 2);

    let (status, text) = request(addr, "GET", "/v1/workers", None);
    assert_eq!(status, 200);
    let workers = json(&text);
    assert_eq!(workers["workers"][0]["worker"], 7);
    assert_eq!(workers["workers"][0]["blocks"]["device"], 4);
    assert_eq!(workers["workers"][1]["dp_rank"], 1);
    assert_eq!(workers["workers"][1]["blocks"]["host"], 2);
    assert_eq!(workers["workers"][1]["last_event_id"], 0);

    assert_eq!(
        request(addr, "GET", "/healthz", None),
        (200, "ok\n".to_string())
    );
    assert_eq!(
        request(addr, "GET", "/readyz", None),
        (200, "ready\n".to_string())
    );

    let (status, text) = request(addr, "POST", "/v1/route", Some("{not json"));
    assert_eq!(status, 400);
    assert!(json(&text)["error"].as_str().unwrap().contains("bad JSON"));
    let (status, _) = request(
        addr,
        "POST",
        "/v1/route",
        Some("{\"tokens\":[1],\"local_hashes\":[2]}"),
    );
    assert_eq!(status, 400);
    let (status, _) = request(addr, "POST", "/v1/route", Some("{\"tokens\":[-1]}"));
    assert_eq!(status, 400);

    let (status, text) = request(addr, "GET", "/metrics", None);
    assert_eq!(status, 200);
    assert!(
        text.contains("kvtwin_router_kv_cache_events_applied_total 2\n"),
        "{text}"
    );
    assert!(
        text.contains("kvtwin_router_events_dropped_total{reason=\"bad_json\"} 2\n"),
        "{text}"
    );
    assert!(
        text.contains("kvtwin_router_events_dropped_total{reason=\"bad_request\"} 1\n"),
        "{text}"
    );
    assert!(
        text.contains("kvtwin_router_blocks{tier=\"device\"} 4\n"),
        "{text}"
    );
    // Nothing applied was lost to the bad requests.
    assert_eq!(http::lock(&shared).indexer().pairs(), 6);
}
