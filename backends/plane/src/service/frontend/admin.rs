//! The front door's own API beside the proxy: the models its engines serve, and engines
//! added and removed while the router runs.
//!
//! Owns: the handlers of `GET /v1/models` (OpenAI's list, the union over engines up),
//! `GET /v1/engines`, `POST /v1/engines` (`{"id": N, "url": "http://HOST:PORT",
//! "events": "tcp://HOST:PORT", "replay": "tcp://HOST:PORT"}`, events and replay
//! optional: 201 with the engine, 409 when the id is taken, 400 for a bad body) and
//! `DELETE /v1/engines/{id}` (200, or 404).
//! Never: reach an engine (the health check does, on its next period).

use super::openai::error_json;
use super::{Frontend, FrontendError};
use crate::service::http::lock;
use crate::service::state::{EngineHealth, EngineSummary};
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use kvtwin::ids::WorkerId;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::sync::Arc;

fn error(status: StatusCode, message: &str, kind: &str) -> Response {
    (status, Json(error_json(message, kind, status.as_u16()))).into_response()
}

/// `GET /v1/models`: every model and adapter an engine up serves, once each.
pub(super) async fn models(State(front): State<Arc<Frontend>>) -> Json<Value> {
    let mut models: BTreeSet<(String, Option<String>)> = BTreeSet::new();
    {
        let state = lock(&front.state);
        for (worker, _) in state.serving().engine_urls() {
            let Some(engine) = state.serving().engine(worker) else {
                continue;
            };
            if engine.health != EngineHealth::Up {
                continue;
            }
            let base = engine.models.first().cloned();
            models.extend(engine.models.iter().map(|model| (model.clone(), None)));
            models.extend(
                engine
                    .adapters
                    .iter()
                    .map(|adapter| (adapter.clone(), base.clone())),
            );
        }
    }
    let data: Vec<Value> = models
        .into_iter()
        .map(|(id, parent)| json!({"id": id, "object": "model", "owned_by": "kvtwin", "parent": parent}))
        .collect();
    Json(json!({"object": "list", "data": data}))
}

fn engine_json(
    worker: WorkerId,
    engine: &EngineSummary,
    events: Option<(String, Option<String>)>,
) -> Value {
    let (events, replay) = events.map_or((None, None), |(events, replay)| (Some(events), replay));
    json!({
        "id": worker.get(),
        "url": engine.url,
        "health": engine.health.name(),
        "down_reason": match &engine.health {
            EngineHealth::Down { reason } => Some(reason.as_str()),
            _ => None,
        },
        "events": events,
        "replay": replay,
        "models": engine.models,
        "adapters": engine.adapters,
        "active_requests": engine.active_requests,
        "active_blocks": engine.active_blocks,
    })
}

/// `GET /v1/engines`.
pub(super) async fn list(State(front): State<Arc<Frontend>>) -> Json<Value> {
    let engines: Vec<(WorkerId, EngineSummary)> = {
        let state = lock(&front.state);
        state
            .serving()
            .engine_urls()
            .into_iter()
            .filter_map(|(worker, _)| state.serving().engine(worker).map(|e| (worker, e)))
            .collect()
    };
    let list: Vec<Value> = engines
        .iter()
        .map(|(worker, engine)| engine_json(*worker, engine, front.events_of(*worker)))
        .collect();
    Json(json!({ "engines": list }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AddEngine {
    id: u64,
    url: String,
    events: Option<String>,
    replay: Option<String>,
}

/// `POST /v1/engines`.
pub(super) async fn add(State(front): State<Arc<Frontend>>, body: Bytes) -> Response {
    let request: AddEngine = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(why) => {
            return error(
                StatusCode::BAD_REQUEST,
                &format!("expected {{\"id\": N, \"url\": \"http://HOST:PORT\", \"events\": \"tcp://HOST:PORT\", \"replay\": \"tcp://HOST:PORT\"}} (events and replay optional): {why}"),
                "BadRequestError",
            )
        }
    };
    if request.replay.is_some() && request.events.is_none() {
        return error(
            StatusCode::BAD_REQUEST,
            "`replay` needs `events`",
            "BadRequestError",
        );
    }
    let worker = WorkerId::new(request.id);
    let events = request
        .events
        .as_deref()
        .map(|events| (events, request.replay.as_deref()));
    let added = {
        let front = front.clone();
        let url = request.url.clone();
        let events = events.map(|(e, r)| (e.to_string(), r.map(str::to_string)));
        // Subscribing starts a thread and opens sockets: off the async workers.
        tokio::task::spawn_blocking(move || {
            let events = events.as_ref().map(|(e, r)| (e.as_str(), r.as_deref()));
            front.add_engine(worker, &url, events)
        })
        .await
    };
    match added {
        Ok(Ok(())) => {
            tracing::info!("engine {worker} added at {}", request.url);
            let summary = lock(&front.state).serving().engine(worker);
            let body = summary.map_or(Value::Null, |engine| {
                engine_json(worker, &engine, front.events_of(worker))
            });
            (StatusCode::CREATED, Json(body)).into_response()
        }
        Ok(Err(FrontendError::Duplicate(id))) => error(
            StatusCode::CONFLICT,
            &format!("engine {id} is already known; DELETE /v1/engines/{id} first"),
            "ConflictError",
        ),
        Ok(Err(why)) => error(StatusCode::BAD_REQUEST, &why.to_string(), "BadRequestError"),
        Err(_) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "adding the engine failed",
            "InternalServerError",
        ),
    }
}

/// `DELETE /v1/engines/{id}`.
pub(super) async fn remove(State(front): State<Arc<Frontend>>, Path(id): Path<u64>) -> Response {
    let worker = WorkerId::new(id);
    let removed = {
        let front = front.clone();
        tokio::task::spawn_blocking(move || front.remove_engine(worker)).await
    };
    match removed {
        Ok(true) => Json(json!({ "removed": id })).into_response(),
        Ok(false) => error(
            StatusCode::NOT_FOUND,
            &format!("no engine {id}"),
            "NotFoundError",
        ),
        Err(_) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "removing the engine failed",
            "InternalServerError",
        ),
    }
}
