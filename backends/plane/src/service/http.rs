//! The router service's HTTP/JSON API (axum).
//!
//! Owns: [`app`], [`app_with`] and [`app_full`] (the routes, the front door's too when
//! the router fronts engines (`super::frontend`), behind `auth::require_token` when a
//! token is set), [`serve`], [`serve_with`] and [`serve_app`] (plain HTTP or HTTPS,
//! [`Transport`]), the request and response bodies.
//! - `POST /v1/route` with `{"tokens": [u32, ...]}` (hashed with the router's block size;
//!   with `"lora_name"` and/or `"cache_salt"` beside them, under that adapter's and salt's
//!   seed as Dynamo hashes them, so only blocks of the same adapter and salt match; 503
//!   `{"error": ...}`, counted `block_size_unknown`, while a router without
//!   `--block-size` has not learned it) or `{"local_hashes": [u64, ...]}` answers `{"worker": W, "dp_rank": d, "overlaps":
//!   {"W": n, ...}, "tier_overlaps": {"W": {"device": n, "host": n, "disk": n, "remote":
//!   n}}, "query_blocks": n}`. Keys are worker ids as strings (JSON object keys), with
//!   `:d` appended for data-parallel ranks above 0. `worker` is `null` while no worker is
//!   known.
//!   When the router fronts engines, `worker` is the one it would dispatch to (engines
//!   up only, their load weighed: `RouterState::choose_engine`), `null` when none is up.
//!   Each answer is also recorded (see `RouterState::record_route`) for the stream.
//! - `GET /v1/workers`: `{"workers": [{"worker": W, "dp_rank": d, "blocks": {"device": n,
//!   "host": n, "disk": n, "remote": n}, "last_event_id": n|null, "events": n, "gaps": n,
//!   "out_of_order": n, "reconnects": n, "block_size_mismatches": n, "lost_batches": n,
//!   "restarts": n, "dropped": n, "group_filtered": n, "salt_evictions": n,
//!   "indexed_blocks": n, "evicted_blocks": n, "evicted_removals": n,
//!   "stored_under_evicted": n, "engine_hash_evictions": n, "over_declared": bool|null,
//!   "block_digest": "16 hex digits", "status": "ok"|"block_size_mismatch",
//!   "block_size": null|{"events": n, "router": n}, "engine": null|{...}}]}`: each
//!   worker rank's cached blocks (as it reports them), last event id, stream integrity
//!   counters (see `WorkerIntegrity`; gaps count occurrences), the blocks the index holds
//!   for it and what the index budget evicted (see `WorkerEvictions`); `over_declared` is
//!   null unless the router was told the workers' capacity. `block_digest` is
//!   `translate::block_digest` of the engine block hashes (and tiers) it holds, in hex: a
//!   worker (or a test) that computes the same over its own cache knows the router's view
//!   of it is exact. `engine` (rank 0 of a worker the router fronts, `--engine`): its
//!   `url`, `health` (`up`, `down`, `unknown`), `down_reason`, `models`, `adapters`,
//!   `active_requests`, `active_blocks`, `dispatched`, `succeeded`, `retried`, `failed`,
//!   `prompt_tokens`, `cached_tokens`, `predicted_cached_tokens`, `generation_tokens`,
//!   and `ttft_p50_s`, `ttft_p99_s`, `itl_p50_s`, `itl_p99_s` (bucket bounds, null
//!   without observations). `status` is `block_size_mismatch` while the rank's batches are
//!   refused for announcing `block_size.events`-token blocks against the router's
//!   `block_size.router` (until one of its events is applied).
//! - `GET /v1/stream`: server-sent events. Every 100 ms the handler looks at the state
//!   (locked briefly) through a `StreamCursor` and, when something changed, sends
//!   `event: delta` with one JSON `StreamMessage` as `data:`; a `:` keep-alive comment
//!   goes out every 5 s. The first delta is a full snapshot (`"full": true`); later ones
//!   carry only the rows changed, rows removed, the counters and the new route records:
//!
//!   ```text
//!   event: delta
//!   data: {"seq":42,"full":false,"block_size":16,
//!          "workers":[{"worker":1,"dp_rank":0,"blocks":{"device":3,"host":0,"disk":0,"remote":0},
//!                      "last_event_id":7,"events":8,"gaps":0,"out_of_order":0,"reconnects":0,
//!                      "block_size_mismatches":0,"lost_batches":0,"restarts":0,"dropped":0}],
//!          "removed":[{"worker":2,"dp_rank":0}],
//!          "counters":{"events_applied":8,"batches":3,"gaps":0,"event_id_gaps":0,"replayed":0,
//!                      "lost_batches":0,"restarts":0,"reconnects":0,"dropped":{"bad_json":1},
//!                      "routes":1,"route_query_blocks":4,"route_hit_blocks":3,
//!                      "apply_latency_p99_s":2.5e-5,"index_pairs":3},
//!          "routes":[{"seq":1,"query_blocks":4,"winner":{"worker":1,"dp_rank":0},
//!                     "candidates":[{"worker":1,"dp_rank":0,"overlap":{"device":3,"host":0,
//!                                    "disk":0,"remote":0},"load":3,"score":3}]}],
//!          "routes_missed":0}
//!   ```
//!
//!   (on one line on the wire). A router fronting engines adds `"engine"` to their rows
//!   (health, down reason, requests running and served, tokens) and `"serving"` to the
//!   counters (engines up, requests in flight, served, failed, retried, refused, tokens,
//!   TTFT / ITL / e2e percentiles). Each client has its own cursor and is sent at most one
//!   message per tick, written before the next is built: nothing queues. A client that
//!   reconnects starts again from a full snapshot.
//! - `GET /healthz`: `ok` while the process serves. `GET /readyz`: 503 with
//!   `catching up: zmq tcp://...` until every source registered in the state has done its
//!   initial replay or catch-up, with `waiting to learn the block size ...` while a
//!   router without `--block-size` has seen no `BlockStored`, with `no usable worker:
//!   block size mismatch ...` (naming each worker and the size it sends) while every
//!   known worker is refused for its block size; otherwise 200 `ready`. `GET /metrics`: OpenMetrics text
//!   (`metrics::CONTENT_TYPE`).
//!
//! With a token (`Access::token`), every request but `/healthz`, `/readyz` and (unless
//! `MetricsAccess::Token`) `/metrics` needs `Authorization: Bearer <token>`; anything
//! else is a 401 with `WWW-Authenticate: Bearer` (see `auth`). Without one, all are
//! open, as before tokens existed.
//!
//! A body that is not JSON, or has neither or both of `tokens` and `local_hashes`, is a
//! 400 with `{"error": ...}`, counted as `bad_json` / `bad_request`.
//! Never: hold the state's lock across an await, or apply events (sources do).

use super::auth::{require_token, Access};
use super::frontend::Frontend;
use super::state::{EngineHealth, EngineSummary, RouteAnswer, RouterState};
use super::stream::StreamCursor;
use super::tls::TlsListener;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures::Stream;
use kvtwin::ids::LocalBlockHash;
use kvtwin::ids::WorkerWithDpRank;
use kvtwin::tier::Tier;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::convert::Infallible;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// How often a `/v1/stream` client's cursor looks at the state.
pub const STREAM_TICK: Duration = Duration::from_millis(100);

/// How often a `/v1/stream` client gets a keep-alive comment.
pub const STREAM_KEEP_ALIVE: Duration = Duration::from_secs(5);

/// The state as the service shares it between sources and handlers.
pub type SharedState = Arc<Mutex<RouterState>>;

/// Locks the state, even if a thread panicked holding it (every update leaves it
/// consistent between events).
pub fn lock(state: &SharedState) -> MutexGuard<'_, RouterState> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The routes over `state`, open to everyone.
pub fn app(state: SharedState) -> Router {
    app_with(state, Access::default())
}

/// The routes over `state`, with `access` deciding who may call them.
pub fn app_with(state: SharedState, access: Access) -> Router {
    app_full(state, access, None)
}

/// The routes over `state`, the front door's too when given (`--engine`), with
/// `access` deciding who may call any of them.
pub fn app_full(state: SharedState, access: Access, frontend: Option<Arc<Frontend>>) -> Router {
    let mut routes = Router::new()
        .route("/v1/route", post(route))
        .route("/v1/workers", get(workers))
        .route("/v1/stream", get(stream))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(state);
    if let Some(frontend) = frontend {
        routes = routes.merge(frontend.routes());
    }
    if access.token.is_none() {
        // No layer at all: without a token the service answers exactly as before.
        return routes;
    }
    // On the whole router, the fallback included: an unknown path is a 401 too.
    routes.layer(axum::middleware::from_fn_with_state(
        std::sync::Arc::new(access),
        require_token,
    ))
}

/// How the API is served.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub enum Transport {
    /// Plain HTTP/1.1.
    #[default]
    Plain,
    /// HTTPS: TLS with this configuration (`tls::server_config`), then HTTP/1.1.
    Tls(std::sync::Arc<rustls::ServerConfig>),
}

/// Serves `app(state)` on `listener`, plain and open, until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: SharedState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_with(
        listener,
        state,
        Access::default(),
        Transport::Plain,
        shutdown,
    )
    .await
}

/// Serves `app_with(state, access)` on `listener` over `transport` until `shutdown`
/// resolves.
pub async fn serve_with(
    listener: tokio::net::TcpListener,
    state: SharedState,
    access: Access,
    transport: Transport,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_app(listener, app_with(state, access), transport, shutdown).await
}

/// Serves `app` (from [`app_full`]) on `listener` over `transport` until `shutdown`
/// resolves.
pub async fn serve_app(
    listener: tokio::net::TcpListener,
    app: Router,
    transport: Transport,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    match transport {
        Transport::Plain => {
            axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await
        }
        Transport::Tls(config) => {
            axum::serve(TlsListener::new(listener, config), app)
                .with_graceful_shutdown(shutdown)
                .await
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RouteRequest {
    tokens: Option<Vec<u32>>,
    local_hashes: Option<Vec<u64>>,
    /// The request's LoRA adapter: its blocks are hashed under the adapter's seed.
    lora_name: Option<String>,
    /// The request's cache salt (vLLM's `cache_salt`): likewise.
    cache_salt: Option<String>,
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
    let mut body = json!({
        "worker": answer.worker.map(|key| key.worker.get()),
        "dp_rank": answer.worker.map(|key| key.dp_rank),
        "overlaps": overlaps,
        "tier_overlaps": tier_overlaps,
        "query_blocks": answer.query_blocks,
    });
    if let Some(shared) = answer.shared_blocks {
        body["shared_blocks"] = json!(shared);
    }
    body
}

async fn route(State(state): State<SharedState>, body: Bytes) -> Response {
    let request: RouteRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(error) => return bad_request(&state, "bad_json", format!("bad JSON: {error}")),
    };
    let answer = {
        let mut router = lock(&state);
        let keyed = request.lora_name.is_some() || request.cache_salt.is_some();
        let query: Vec<LocalBlockHash> = match (request.tokens, request.local_hashes) {
            (Some(tokens), None) => {
                match router.hash_request(
                    &tokens,
                    request.lora_name.as_deref(),
                    request.cache_salt.as_deref(),
                ) {
                    Ok(query) => query,
                    Err(error) => {
                        router.drop_one(error.reason());
                        drop(router);
                        let body = Json(json!({ "error": error.to_string() }));
                        return (StatusCode::SERVICE_UNAVAILABLE, body).into_response();
                    }
                }
            }
            (None, Some(hashes)) if !keyed => hashes.into_iter().map(LocalBlockHash::new).collect(),
            (None, Some(_)) => {
                drop(router);
                return bad_request(
                    &state,
                    "bad_request",
                    "\"lora_name\" and \"cache_salt\" go with \"tokens\" (\"local_hashes\" \
                     are hashed already)"
                        .to_string(),
                );
            }
            _ => {
                drop(router);
                return bad_request(
                    &state,
                    "bad_request",
                    "give exactly one of \"tokens\" and \"local_hashes\"".to_string(),
                );
            }
        };
        let mut answer = router.route(&query);
        if router.serving().has_engines() {
            // A front door answers as it would dispatch: engines up only, load weighed.
            answer.worker = router
                .choose_engine(&query, None, &[], None)
                .ok()
                .map(|(chosen, _)| chosen.worker);
        }
        router.touch_query(&query);
        router.record_route(&answer);
        answer
    };
    Json(answer_json(&answer)).into_response()
}

/// The `engine` object of a worker's row in `/v1/workers`.
fn engine_json(engine: &EngineSummary) -> Value {
    let stats = &engine.stats;
    json!({
        "url": engine.url,
        "health": engine.health.name(),
        "down_reason": match &engine.health {
            EngineHealth::Down { reason } => Some(reason.as_str()),
            _ => None,
        },
        "models": engine.models,
        "adapters": engine.adapters,
        "active_requests": engine.active_requests,
        "active_blocks": engine.active_blocks,
        "dispatched": stats.dispatched,
        "succeeded": stats.succeeded,
        "retried": stats.retried,
        "failed": stats.failed_total(),
        "prompt_tokens": stats.prompt_tokens,
        "cached_tokens": stats.cached_tokens,
        "predicted_cached_tokens": stats.predicted_cached_tokens,
        "generation_tokens": stats.generation_tokens,
        "ttft_p50_s": stats.ttft.quantile_seconds(0.5).filter(|s| s.is_finite()),
        "ttft_p99_s": stats.ttft.quantile_seconds(0.99).filter(|s| s.is_finite()),
        "itl_p50_s": stats.itl.quantile_seconds(0.5).filter(|s| s.is_finite()),
        "itl_p99_s": stats.itl.quantile_seconds(0.99).filter(|s| s.is_finite()),
    })
}

async fn workers(State(state): State<SharedState>) -> Json<Value> {
    let (workers, engines, router_block_size) = {
        let router = lock(&state);
        let workers = router.workers();
        let engines: Vec<Option<EngineSummary>> = workers
            .iter()
            .map(|summary| {
                (summary.key.dp_rank == 0)
                    .then(|| router.serving().engine(summary.key.worker))
                    .flatten()
            })
            .collect();
        (workers, engines, router.block_size())
    };
    let list: Vec<Value> = workers
        .iter()
        .zip(&engines)
        .map(|(summary, engine)| {
            json!({
                "worker": summary.key.worker.get(),
                "dp_rank": summary.key.dp_rank,
                "blocks": tiers_json(|tier| summary.blocks[tier.index()]),
                "last_event_id": summary.last_event_id,
                "events": summary.integrity.events,
                "gaps": summary.integrity.gaps,
                "out_of_order": summary.integrity.out_of_order,
                "reconnects": summary.integrity.reconnects,
                "block_size_mismatches": summary.integrity.block_size_mismatches,
                "lost_batches": summary.integrity.lost_batches,
                "restarts": summary.integrity.restarts,
                "dropped": summary.integrity.dropped,
                "group_filtered": summary.integrity.group_filtered,
                "salt_evictions": summary.integrity.salt_evictions,
                "indexed_blocks": summary.indexed_blocks,
                "evicted_blocks": summary.evictions.evicted_blocks,
                "evicted_removals": summary.evictions.evicted_removals,
                "stored_under_evicted": summary.evictions.stored_under_evicted,
                "engine_hash_evictions": summary.evictions.engine_hash_evictions,
                "over_declared": summary.over_declared,
                "block_digest": format!("{:016x}", summary.block_digest),
                "status": if summary.refused_block_size.is_some() {
                    "block_size_mismatch"
                } else {
                    "ok"
                },
                "block_size": summary.refused_block_size.map(|events| json!({
                    "events": events,
                    "router": router_block_size,
                })),
                "engine": engine.as_ref().map(engine_json),
            })
        })
        .collect();
    Json(json!({ "workers": list }))
}

async fn stream(
    State(state): State<SharedState>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let mut ticks = tokio::time::interval(STREAM_TICK);
    // A slow client skips ticks rather than bursting to catch up.
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let deltas = futures::stream::unfold(
        (state, StreamCursor::new(), ticks),
        |(state, mut cursor, mut ticks)| async move {
            loop {
                ticks.tick().await;
                // Build under the lock, serialize outside it.
                let message = {
                    let router = lock(&state);
                    cursor.next(&router)
                };
                let Some(message) = message else { continue };
                let Ok(data) = serde_json::to_string(&message) else {
                    continue;
                };
                let event = Event::default().event("delta").data(data);
                return Some((Ok(event), (state, cursor, ticks)));
            }
        },
    );
    Sse::new(deltas).keep_alive(KeepAlive::new().interval(STREAM_KEEP_ALIVE))
}

/// 200 `ready` once every registered source has caught up (a ZMQ source's first
/// replay from the start tried, a JetStream replay read to the end it had at start);
/// until then 503 with what is still catching up.
async fn readyz(State(state): State<SharedState>) -> Response {
    match lock(&state).readiness() {
        Ok(()) => "ready\n".into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response(),
    }
}

async fn metrics(State(state): State<SharedState>) -> Response {
    let text = lock(&state).render_metrics();
    ([(header::CONTENT_TYPE, super::metrics::CONTENT_TYPE)], text).into_response()
}
