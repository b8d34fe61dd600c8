//! The router as its engines' front door: an OpenAI-compatible proxy, as Dynamo's
//! frontend, llm-d's endpoint picker and SGLang's router are.
//!
//! ```text
//! client ─ POST /v1/completions, /v1/chat/completions ─► proxy::handle
//!   openai::parse ─► tokenizer (text, chat) ─► block hashes (adapter, salt)
//!   ─► RouterState::dispatch (overlap by tier + load, engines up only) ─► Ticket
//!   ─► EngineClient::post_json ─► engine ─► answer (whole, or SSE tapped chunk by chunk)
//!   ─► RouterState::finish_request (usage, TTFT, ITL) ─► TraceRecorder (optional)
//! health::run_health_checks ─ GET /health, /v1/models ─► RouterState::set_engine_health
//! ```
//!
//! Owns: [`Frontend`] (the proxy's shared parts: the state, the engine client, the
//! tokenizer, the trace recorder, the engines' event sources), [`FrontendConfig`],
//! [`FrontendError`], and the routes it adds to the router's API ([`Frontend::routes`]):
//! `POST /v1/completions`, `POST /v1/chat/completions`, `GET /v1/models` (what the
//! engines up serve), and the admin API `GET /v1/engines`, `POST /v1/engines` (add an
//! engine, with its event stream, while the router runs) and `DELETE /v1/engines/{id}`.
//! Submodules: `openai` (request and answer shapes), `tokenizer`, `engine_client`,
//! `health`, `trace`, `proxy` (one request's path, retries, the stream tap), `admin`,
//! and `mock` (feature `testing`: a stand-in engine for fast tests).
//!
//! Invariants: no request is lost silently: each ends as an answer, an engine's own
//! error passed through, or an error of the router's in vLLM's shape, and is counted;
//! a request whose engine fails before its first byte reached the client is retried once
//! on another engine; the router's load on an engine is released however a request ends
//! (a client that goes away included). Every wait has a deadline
//! ([`engine_client::EngineTimeouts`]) and every buffer a bound.
//! Never: hold the state's lock across an await, or change an answer's content (a
//! streamed answer loses only the usage chunk the router asked for on the client's
//! behalf).

mod admin;
pub mod engine_client;
pub mod health;
#[cfg(feature = "testing")]
pub mod mock;
pub mod openai;
mod proxy;
pub mod tokenizer;
pub mod trace;

use crate::service::http::{lock, SharedState};
use crate::zmq::ZmqError;
use axum::routing::{delete, get, post};
use axum::Router;
use engine_client::{check_engine_url, EngineClient, EngineError, EngineTimeouts};
use health::HealthConfig;
use kvtwin::ids::WorkerId;
use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};
use tokenizer::PromptTokenizer;
use trace::TraceRecorder;

/// How the front door works.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrontendConfig {
    /// Deadlines with the engines.
    pub timeouts: EngineTimeouts,
    /// Health checks.
    pub health: HealthConfig,
    /// A request body larger than this is refused (413).
    pub max_request_bytes: usize,
    /// An engine's answer (not streamed) larger than this is an error (502).
    pub max_answer_bytes: usize,
    /// Other engines a request is sent to when its engine fails before answering.
    pub retries: u32,
}

impl Default for FrontendConfig {
    /// Default deadlines and checks; 32 MiB requests, 64 MiB answers; one retry.
    fn default() -> Self {
        Self {
            timeouts: EngineTimeouts::default(),
            health: HealthConfig::default(),
            max_request_bytes: 32 << 20,
            max_answer_bytes: 64 << 20,
            retries: 1,
        }
    }
}

/// Why an engine could not be added or removed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FrontendError {
    /// The URL is not one the front door speaks to.
    #[error(transparent)]
    Url(#[from] EngineError),
    /// The engine id is taken.
    #[error("engine {0} is already known")]
    Duplicate(u64),
    /// Its event stream could not be subscribed to.
    #[error("subscribing to {endpoint}: {source}")]
    Events {
        /// The endpoint.
        endpoint: String,
        /// Why.
        #[source]
        source: ZmqError,
    },
}

/// Eight hex digits that differ between router processes (the pid and the start time,
/// hashed): request ids two routers make never collide at a shared engine.
fn process_mark() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos());
    let mut bytes = nanos.to_le_bytes().to_vec();
    bytes.extend(std::process::id().to_le_bytes());
    format!("{:08x}", xxhash_rust::xxh3::xxh3_64(&bytes) as u32)
}

/// An engine's event source, started here or handed over by the binary.
struct EngineSource {
    endpoint: String,
    replay: Option<String>,
    /// Stops the subscription when dropped.
    source: crate::service::source::ZmqSource,
}

/// The front door; see the module documentation.
pub struct Frontend {
    state: SharedState,
    client: EngineClient,
    tokenizer: Option<Arc<PromptTokenizer>>,
    recorder: Option<TraceRecorder>,
    config: FrontendConfig,
    sources: Mutex<BTreeMap<WorkerId, EngineSource>>,
    /// Rows handed to the recorder (ids for prompts it could not tokenize).
    trace_rows: AtomicU64,
    /// The mark of this process in the request ids it makes.
    id_prefix: String,
}

impl std::fmt::Debug for Frontend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Frontend")
            .field("config", &self.config)
            .field("tokenizer", &self.tokenizer)
            .field("recorder", &self.recorder.as_ref().map(TraceRecorder::path))
            .finish()
    }
}

impl Frontend {
    /// A front door over `state`, tokenizing with `tokenizer` (text and chat prompts
    /// are routed on load alone without one) and recording served requests with
    /// `recorder`.
    pub fn new(
        state: SharedState,
        config: FrontendConfig,
        tokenizer: Option<PromptTokenizer>,
        recorder: Option<TraceRecorder>,
    ) -> Arc<Self> {
        if let Some(recorder) = &recorder {
            lock(&state).set_trace_counts(Some(recorder.counts()));
        }
        Arc::new(Self {
            state,
            client: EngineClient::new(config.timeouts),
            tokenizer: tokenizer.map(Arc::new),
            recorder,
            config,
            sources: Mutex::new(BTreeMap::new()),
            trace_rows: AtomicU64::new(0),
            id_prefix: process_mark(),
        })
    }

    /// The state it serves from.
    pub fn state(&self) -> &SharedState {
        &self.state
    }

    fn sources(&self) -> std::sync::MutexGuard<'_, BTreeMap<WorkerId, EngineSource>> {
        self.sources.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds engine `worker` at `url`, subscribing to its events at `events` (and
    /// `replay`) when given. Its health is unknown until the first check.
    pub fn add_engine(
        &self,
        worker: WorkerId,
        url: &str,
        events: Option<(&str, Option<&str>)>,
    ) -> Result<(), FrontendError> {
        let url = check_engine_url(url)?;
        if lock(&self.state).serving().engine(worker).is_some() {
            return Err(FrontendError::Duplicate(worker.get()));
        }
        if let Some((endpoint, replay)) = events {
            let source =
                crate::service::source::start_vllm_source(worker, endpoint, replay, &self.state)
                    .map_err(|source| FrontendError::Events {
                        endpoint: endpoint.to_string(),
                        source,
                    })?;
            self.adopt_source(worker, endpoint, replay, source);
        }
        lock(&self.state).add_engine(worker, &url);
        Ok(())
    }

    /// Takes over `source`, the event stream of engine `worker` started by the caller
    /// (`kvtwin router --zmq`), so removing the engine stops it.
    pub fn adopt_source(
        &self,
        worker: WorkerId,
        endpoint: &str,
        replay: Option<&str>,
        source: crate::service::source::ZmqSource,
    ) {
        let previous = self.sources().insert(
            worker,
            EngineSource {
                endpoint: endpoint.to_string(),
                replay: replay.map(str::to_string),
                source,
            },
        );
        drop(previous);
    }

    /// Removes engine `worker`: its event source stops, its rows and blocks go.
    /// Requests in flight there finish as they will. Whether it was known.
    pub fn remove_engine(&self, worker: WorkerId) -> bool {
        let source = self.sources().remove(&worker);
        if let Some(source) = source {
            let labels = crate::service::metrics::SourceLabels {
                transport: "zmq",
                endpoint: source.endpoint.clone(),
            };
            // Stopping joins the source's thread, which then applies nothing more.
            drop(source.source);
            lock(&self.state).unregister_source(&labels);
        }
        lock(&self.state).remove_engine(worker)
    }

    /// The event endpoints of engine `worker`, if it has a source here.
    fn events_of(&self, worker: WorkerId) -> Option<(String, Option<String>)> {
        self.sources()
            .get(&worker)
            .map(|source| (source.endpoint.clone(), source.replay.clone()))
    }

    /// Checks every engine's health until `stop` resolves (spawn it).
    pub async fn run_health_checks(self: Arc<Self>, stop: impl std::future::Future<Output = ()>) {
        health::run_health_checks(
            self.state.clone(),
            self.client.clone(),
            self.config.health,
            stop,
        )
        .await;
    }

    /// The routes the front door adds to the router's API (see the module
    /// documentation), to be merged before access control is layered on.
    pub fn routes(self: &Arc<Self>) -> Router {
        let limit = axum::extract::DefaultBodyLimit::max(self.config.max_request_bytes);
        Router::new()
            .route("/v1/completions", post(proxy::completions))
            .route("/v1/chat/completions", post(proxy::chat))
            .route("/v1/models", get(admin::models))
            .route("/v1/engines", get(admin::list).post(admin::add))
            .route("/v1/engines/{id}", delete(admin::remove))
            .layer(limit)
            .with_state(self.clone())
    }
}
