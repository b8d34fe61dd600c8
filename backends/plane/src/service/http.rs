//! The router service's HTTP/JSON API (axum).
//!
//! Owns: [`app`] (the routes), [`serve`], the request and response bodies.
//! - `POST /v1/route` with `{"tokens": [u32, ...]}` (hashed with the router's block size)
//!   or `{"local_hashes": [u64, ...]}` answers `{"worker": W, "dp_rank": d, "overlaps":
//!   {"W": n, ...}, "tier_overlaps": {"W": {"device": n, "host": n, "disk": n, "remote":
//!   n}}, "query_blocks": n}`. Keys are worker ids as strings (JSON object keys), with
//!   `:d` appended for data-parallel ranks above 0. `worker` is `null` while no worker is
//!   known.
//! - `GET /v1/workers`: each worker rank's cached blocks per tier and last event id.
//! - `GET /healthz`: `ok`. `GET /metrics`: Prometheus text.
//!
//! A body that is not JSON, or has neither or both of `tokens` and `local_hashes`, is a
//! 400 with `{"error": ...}`, counted as `bad_json` / `bad_request`.
//! Never: hold the state's lock across an await, or apply events (sources do).

use super::state::{RouteAnswer, RouterState};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use kvtwin::ids::LocalBlockHash;
use kvtwin::ids::WorkerWithDpRank;
use kvtwin::tier::Tier;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// The state as the service shares it between sources and handlers.
pub type SharedState = Arc<Mutex<RouterState>>;

/// Locks the state, even if a thread panicked holding it (every update leaves it
/// consistent between events).
pub fn lock(state: &SharedState) -> MutexGuard<'_, RouterState> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The routes over `state`.
pub fn app(state: SharedState) -> Router {
    Router::new()
        .route("/v1/route", post(route))
        .route("/v1/workers", get(workers))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/metrics", get(metrics))
        .with_state(state)
}

/// Serves `app(state)` on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: SharedState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, app(state))
        .with_graceful_shutdown(shutdown)
        .await
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RouteRequest {
    tokens: Option<Vec<u32>>,
    local_hashes: Option<Vec<u64>>,
}

fn bad_request(state: &SharedState, reason: &'static str, message: String) -> Response {
    lock(state).drop_one(reason);
    (StatusCode::BAD_REQUEST, Json(json!({ "error": message }))).into_response()
}

/// The key of a worker rank in JSON objects.
pub fn worker_label(key: WorkerWithDpRank) -> String {
    if key.dp_rank == 0 {
        key.worker.get().to_string()
    } else {
        format!("{}:{}", key.worker.get(), key.dp_rank)
    }
}

fn tiers_json(counts: impl Fn(Tier) -> u64) -> Value {
    let mut map = Map::new();
    for tier in Tier::ALL {
        map.insert(tier.name().to_string(), json!(counts(tier)));
    }
    Value::Object(map)
}

/// The JSON body of a route answer.
pub fn answer_json(answer: &RouteAnswer) -> Value {
    let mut overlaps = Map::new();
    let mut tier_overlaps = Map::new();
    for overlap in &answer.overlaps {
        let label = worker_label(overlap.worker);
        overlaps.insert(label.clone(), json!(overlap.blocks));
        tier_overlaps.insert(
            label,
            tiers_json(|tier| u64::from(overlap.by_tier[tier.index()])),
        );
    }
    json!({
        "worker": answer.worker.map(|key| key.worker.get()),
        "dp_rank": answer.worker.map(|key| key.dp_rank),
        "overlaps": overlaps,
        "tier_overlaps": tier_overlaps,
        "query_blocks": answer.query_blocks,
    })
}

async fn route(State(state): State<SharedState>, body: Bytes) -> Response {
    let request: RouteRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(error) => return bad_request(&state, "bad_json", format!("bad JSON: {error}")),
    };
    let answer = {
        let router = lock(&state);
        let query: Vec<LocalBlockHash> = match (request.tokens, request.local_hashes) {
            (Some(tokens), None) => router.hash_tokens(&tokens),
            (None, Some(hashes)) => hashes.into_iter().map(LocalBlockHash::new).collect(),
            _ => {
                drop(router);
                return bad_request(
                    &state,
                    "bad_request",
                    "give exactly one of \"tokens\" and \"local_hashes\"".to_string(),
                );
            }
        };
        router.route(&query)
    };
    Json(answer_json(&answer)).into_response()
}

async fn workers(State(state): State<SharedState>) -> Json<Value> {
    let workers = lock(&state).workers();
    let list: Vec<Value> = workers
        .iter()
        .map(|summary| {
            json!({
                "worker": summary.key.worker.get(),
                "dp_rank": summary.key.dp_rank,
                "blocks": tiers_json(|tier| summary.blocks[tier.index()]),
                "last_event_id": summary.last_event_id,
            })
        })
        .collect();
    Json(json!({ "workers": list }))
}

async fn metrics(State(state): State<SharedState>) -> Response {
    let text = lock(&state).render_metrics();
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text).into_response()
}
