//! The front door's side of the router state: the engines behind `kvtwin router
//! --engine`, whether each is up, what it serves, the requests in flight on it and the
//! load they put there, the scheduler that weighs a prompt's overlap against that load,
//! and what was served.
//!
//! Owns: [`Serving`] (inside [`RouterState`], under its one lock), [`EngineHealth`],
//! [`EngineSummary`], [`Dispatch`], [`Outcome`], [`ServedStats`] and the `RouterState`
//! methods the proxy calls: [`RouterState::add_engine`], [`RouterState::remove_engine`],
//! [`RouterState::set_engine_health`], [`RouterState::set_engine_models`],
//! [`RouterState::dispatch`], [`RouterState::note_output`],
//! [`RouterState::finish_request`].
//!
//! The choice is Dynamo's KV router's, in kvtwin's [`Scheduler`]: the blocks a prompt
//! still has to prefill on a worker after its overlap there (less the shared credit of
//! those a shared store holds beyond it, `super::shared`), plus the blocks of the
//! requests already running there (prompt and output so far), plus optionally a weight
//! per running request; the cheapest wins, ties broken by a seeded RNG. Load is counted
//! from dispatch to the request's end, so fresh prompts spread over idle engines even
//! when every cache is full.
//!
//! Invariants: a worker is a candidate only while its engine is [`EngineHealth::Up`];
//! every dispatched request is in `inflight` until [`RouterState::finish_request`] takes
//! it out (the proxy's ticket makes sure it does, on every path), and the per-worker
//! load the scheduler sees is the sum over `inflight`; at most `max_inflight` requests
//! are in flight (then [`DispatchError::AtCapacity`]). An engine marked down has its
//! blocks cleared from the index (its process is gone, so is its cache), which is not a
//! restart: the restart is counted once, by the event stream, when the engine's
//! sequence starts again.
//! Never: do I/O or read a clock (the proxy measures and hands durations in).

use super::RouterState;
use crate::service::frontend::trace::TraceCounts;
use crate::service::metrics::{Histogram, E2E_BUCKETS_S, ITL_BUCKETS_S, TTFT_BUCKETS_S};
use crate::service::stream::{RouteCandidate, RouteRecord, TierCounts, WorkerKey};
use kvtwin::ids::{LocalBlockHash, WorkerId, WorkerWithDpRank};
use kvtwin::router::scheduler::{Candidate, Scheduler, SchedulerConfig, WorkerLoad};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Requests in flight at most, unless configured otherwise.
pub const DEFAULT_MAX_INFLIGHT: usize = 4096;

/// Models remembered per engine at most (base models and adapters together).
pub const MODELS_MAX: usize = 256;

/// How the front door chooses and how much it takes on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ServingConfig {
    /// The cost formula's weights, tier credits, temperature and seed.
    pub scheduler: SchedulerConfig,
    /// Requests in flight at most, all engines together.
    pub max_inflight: usize,
}

impl Default for ServingConfig {
    /// Dynamo's defaults: overlap weight 1, a block of load weighs a block of prefill,
    /// temperature 0; [`DEFAULT_MAX_INFLIGHT`].
    fn default() -> Self {
        Self {
            scheduler: SchedulerConfig::default(),
            max_inflight: DEFAULT_MAX_INFLIGHT,
        }
    }
}

/// Whether an engine takes requests.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EngineHealth {
    /// Not yet probed: not routed to.
    Unknown,
    /// Its health check answered: routed to.
    Up,
    /// Its health check or a request to it failed: not routed to.
    Down {
        /// Why, in words (the probe's or the request's error).
        reason: String,
    },
}

impl EngineHealth {
    /// `unknown`, `up` or `down`.
    pub fn name(&self) -> &'static str {
        match self {
            EngineHealth::Unknown => "unknown",
            EngineHealth::Up => "up",
            EngineHealth::Down { .. } => "down",
        }
    }
}

/// What was served, per engine or in all: requests, tokens and latencies.
#[derive(Clone, Debug, PartialEq)]
pub struct ServedStats {
    /// Requests dispatched (each try: a retried request counts on both engines).
    pub dispatched: u64,
    /// Requests answered in full.
    pub succeeded: u64,
    /// Requests that failed on this engine and were sent to another.
    pub retried: u64,
    /// Requests that failed for good, by reason.
    pub failed: BTreeMap<&'static str, u64>,
    /// Prompt tokens of the requests answered (as the engine counted them).
    pub prompt_tokens: u64,
    /// Of those, tokens the engine found cached (`prompt_tokens_details.cached_tokens`).
    pub cached_tokens: u64,
    /// Of those, tokens the router predicted cached at dispatch
    /// ([`predicted_cached_tokens`]).
    pub predicted_cached_tokens: u64,
    /// Output tokens of the requests answered.
    pub generation_tokens: u64,
    /// Time to the first output token (streamed requests).
    pub ttft: Histogram,
    /// Time between output chunks (streamed requests).
    pub itl: Histogram,
    /// Time from arrival to the last byte.
    pub e2e: Histogram,
}

impl Default for ServedStats {
    fn default() -> Self {
        Self {
            dispatched: 0,
            succeeded: 0,
            retried: 0,
            failed: BTreeMap::new(),
            prompt_tokens: 0,
            cached_tokens: 0,
            predicted_cached_tokens: 0,
            generation_tokens: 0,
            ttft: Histogram::new(TTFT_BUCKETS_S),
            itl: Histogram::new(ITL_BUCKETS_S),
            e2e: Histogram::new(E2E_BUCKETS_S),
        }
    }
}

impl ServedStats {
    /// Failed requests, all reasons.
    pub fn failed_total(&self) -> u64 {
        self.failed.values().sum()
    }

    fn record(&mut self, outcome: &Outcome, predicted_cached_tokens: u64) {
        match outcome {
            Outcome::Served(served) => {
                self.succeeded += 1;
                self.prompt_tokens += served.prompt_tokens;
                self.cached_tokens += served.cached_tokens;
                self.predicted_cached_tokens += predicted_cached_tokens;
                self.generation_tokens += served.generation_tokens;
                if let Some(ttft) = served.ttft {
                    self.ttft.observe(ttft);
                }
                for gap in &served.itl {
                    self.itl.observe(*gap);
                }
                self.e2e.observe(served.e2e);
            }
            Outcome::Retried { .. } => self.retried += 1,
            Outcome::Failed { reason } => *self.failed.entry(reason).or_default() += 1,
        }
    }
}

/// One engine as the front door knows it.
#[derive(Clone, Debug)]
struct Engine {
    url: String,
    health: EngineHealth,
    /// Base models it serves (from its `/v1/models`), empty until known.
    models: Vec<String>,
    /// LoRA adapters it serves.
    adapters: Vec<String>,
    stats: ServedStats,
    active_requests: u64,
    active_blocks: u64,
}

/// What `/v1/workers` and the stream say of an engine.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineSummary {
    /// Its base URL.
    pub url: String,
    /// Up, down (and why) or not yet probed.
    pub health: EngineHealth,
    /// Base models it serves.
    pub models: Vec<String>,
    /// LoRA adapters it serves.
    pub adapters: Vec<String>,
    /// Requests running there now.
    pub active_requests: u64,
    /// Blocks of those (prompt and output so far).
    pub active_blocks: u64,
    /// What it served.
    pub stats: ServedStats,
}

/// A request in flight.
#[derive(Clone, Copy, Debug)]
struct InFlight {
    worker: WorkerWithDpRank,
    prompt_tokens: u64,
    generated: u64,
    /// Blocks counted in its worker's load now.
    blocks: u64,
    predicted_cached_tokens: u64,
}

/// Where a request goes, and the handle to report on it.
#[derive(Clone, Debug, PartialEq)]
pub struct Dispatch {
    /// The request's id, for [`RouterState::note_output`] and
    /// [`RouterState::finish_request`].
    pub request: u64,
    /// The chosen worker rank.
    pub worker: WorkerWithDpRank,
    /// Its engine's base URL.
    pub url: String,
    /// Whether the engine serves more than one data-parallel rank (the proxy then names
    /// the rank to it).
    pub ranked: bool,
    /// The prompt's overlap with that worker's cache, in blocks.
    pub overlap_blocks: u32,
    /// The route record's sequence number.
    pub route_seq: u64,
}

/// Why no engine took a request.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DispatchError {
    /// No engine is up (or none is left after the ones already tried).
    #[error("no engine is up{}", describe_down(.0))]
    NoEngineUp(Vec<(u64, String)>),
    /// No engine up serves the model asked for.
    #[error("the model `{0}` does not exist on any engine that is up")]
    UnknownModel(String),
    /// `max_inflight` requests are in flight.
    #[error("the router has {0} requests in flight, its limit")]
    AtCapacity(usize),
    /// The request is pinned (`nvext.backend_instance_id`) to an engine the router does
    /// not know.
    #[error("no engine has the id {0} (nvext.backend_instance_id)")]
    UnknownEngine(u64),
}

fn describe_down(down: &[(u64, String)]) -> String {
    if down.is_empty() {
        return String::new();
    }
    let list: Vec<String> = down
        .iter()
        .map(|(worker, reason)| format!("engine {worker}: {reason}"))
        .collect();
    format!(" ({})", list.join("; "))
}

impl DispatchError {
    /// A stable label for counters.
    pub fn reason(&self) -> &'static str {
        match self {
            DispatchError::NoEngineUp(_) => "no_engine_up",
            DispatchError::UnknownModel(_) => "unknown_model",
            DispatchError::AtCapacity(_) => "at_capacity",
            DispatchError::UnknownEngine(_) => "unknown_engine",
        }
    }
}

/// A request answered in full.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Served {
    /// Prompt tokens, as the engine counted them (`usage.prompt_tokens`).
    pub prompt_tokens: u64,
    /// Of those, cached (`usage.prompt_tokens_details.cached_tokens`; 0 if not said).
    pub cached_tokens: u64,
    /// Output tokens (`usage.completion_tokens`).
    pub generation_tokens: u64,
    /// Time to the first output chunk, for a streamed answer.
    pub ttft: Option<Duration>,
    /// Gaps between output chunks, for a streamed answer.
    pub itl: Vec<Duration>,
    /// Arrival to the last byte.
    pub e2e: Duration,
}

/// How a dispatched request ended on its engine.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// Answered in full.
    Served(Served),
    /// Failed there and sent to another engine.
    Retried {
        /// Why, a stable label.
        reason: &'static str,
    },
    /// Failed for good.
    Failed {
        /// Why, a stable label.
        reason: &'static str,
    },
}

/// The front door's state; see the module documentation.
#[derive(Debug)]
pub struct Serving {
    engines: BTreeMap<WorkerId, Engine>,
    scheduler: Scheduler,
    inflight: BTreeMap<u64, InFlight>,
    next_request: u64,
    max_inflight: usize,
    totals: ServedStats,
    /// Requests refused before reaching an engine, by reason.
    refused: BTreeMap<&'static str, u64>,
    /// Requests whose prompt the router could not tokenize (routed on load alone), by
    /// reason.
    untokenized: BTreeMap<&'static str, u64>,
    /// The trace recorder's counts, when one records.
    trace_counts: Option<Arc<TraceCounts>>,
}

impl Default for Serving {
    fn default() -> Self {
        Self::new(ServingConfig::default())
    }
}

impl Serving {
    /// No engines, choosing with `config`.
    pub fn new(config: ServingConfig) -> Self {
        Self {
            engines: BTreeMap::new(),
            scheduler: Scheduler::new(config.scheduler),
            inflight: BTreeMap::new(),
            next_request: 1,
            max_inflight: config.max_inflight.max(1),
            totals: ServedStats::default(),
            refused: BTreeMap::new(),
            untokenized: BTreeMap::new(),
            trace_counts: None,
        }
    }

    /// Whether any engine was configured (the router is a front door).
    pub fn has_engines(&self) -> bool {
        !self.engines.is_empty()
    }

    /// Engines up now.
    pub fn engines_up(&self) -> usize {
        self.engines
            .values()
            .filter(|engine| engine.health == EngineHealth::Up)
            .count()
    }

    /// Requests in flight now.
    pub fn inflight(&self) -> usize {
        self.inflight.len()
    }

    /// What was served, all engines.
    pub fn totals(&self) -> &ServedStats {
        &self.totals
    }

    /// Requests refused before reaching an engine, by reason.
    pub fn refused(&self) -> &BTreeMap<&'static str, u64> {
        &self.refused
    }

    /// Requests routed on load alone because their prompt was not tokenized, by reason.
    pub fn untokenized(&self) -> &BTreeMap<&'static str, u64> {
        &self.untokenized
    }

    /// The trace recorder's counts, if one records.
    pub fn trace_counts(&self) -> Option<&TraceCounts> {
        self.trace_counts.as_deref()
    }

    /// Each engine's URL, in worker order.
    pub fn engine_urls(&self) -> Vec<(WorkerId, String)> {
        self.engines
            .iter()
            .map(|(worker, engine)| (*worker, engine.url.clone()))
            .collect()
    }

    fn summary(engine: &Engine) -> EngineSummary {
        EngineSummary {
            url: engine.url.clone(),
            health: engine.health.clone(),
            models: engine.models.clone(),
            adapters: engine.adapters.clone(),
            active_requests: engine.active_requests,
            active_blocks: engine.active_blocks,
            stats: engine.stats.clone(),
        }
    }

    /// The engine of `worker`, if it is one.
    pub fn engine(&self, worker: WorkerId) -> Option<EngineSummary> {
        self.engines.get(&worker).map(Self::summary)
    }

    /// `Err` with why when engines are configured and none is up.
    pub(super) fn readiness(&self) -> Result<(), String> {
        if self.engines.is_empty() || self.engines_up() > 0 {
            return Ok(());
        }
        let down: Vec<String> = self
            .engines
            .iter()
            .map(|(worker, engine)| match &engine.health {
                EngineHealth::Down { reason } => format!("engine {worker} down: {reason}"),
                other => format!("engine {worker} {}", other.name()),
            })
            .collect();
        Err(format!("no engine up ({})", down.join("; ")))
    }

    /// Sets the scheduler's view of `key`'s load from the requests in flight there.
    fn sync_load(&mut self, key: WorkerWithDpRank) {
        let (blocks, requests) = self
            .inflight
            .values()
            .filter(|request| request.worker == key)
            .fold((0, 0), |(blocks, requests), request| {
                (blocks + request.blocks, requests + 1)
            });
        if self.scheduler.load(key).is_some() {
            self.scheduler.set_load(
                key,
                WorkerLoad {
                    active_blocks: blocks,
                    active_requests: requests,
                },
            );
        }
    }
}

/// The prompt tokens an engine will find cached given the router's overlap: the
/// overlapping blocks' tokens, but never the prompt's last token, which vLLM always
/// computes (it needs one to sample from), so a prompt cached whole recomputes its last
/// block (`vllm/v1/core/kv_cache_manager.py`, `get_computed_blocks`: at most
/// `prompt_len - 1` tokens are taken from the cache, in whole blocks).
pub fn predicted_cached_tokens(overlap_blocks: u32, prompt_tokens: u64, block_size: usize) -> u64 {
    if block_size == 0 || prompt_tokens == 0 {
        return 0;
    }
    let block_size = block_size as u64;
    let most = (prompt_tokens - 1) / block_size * block_size;
    (u64::from(overlap_blocks) * block_size).min(most)
}

/// `ceil(tokens / block_size)`, 0 for a block size of 0.
fn blocks_of(tokens: u64, block_size: usize) -> u64 {
    if block_size == 0 {
        return 0;
    }
    tokens.div_ceil(block_size as u64)
}

impl RouterState {
    /// The front door's state.
    pub fn serving(&self) -> &Serving {
        &self.serving
    }

    /// Replaces the front door's choice and bounds (before any request).
    pub fn configure_serving(&mut self, config: ServingConfig) {
        let engines = std::mem::take(&mut self.serving.engines);
        let trace_counts = self.serving.trace_counts.take();
        self.serving = Serving::new(config);
        self.serving.engines = engines;
        self.serving.trace_counts = trace_counts;
        self.bump();
    }

    /// Adds the engine of `worker` at `url` (its health unknown until probed), or
    /// changes a known one's URL. Its row exists from now on, with or without events.
    pub fn add_engine(&mut self, worker: WorkerId, url: &str) {
        let engine = self
            .serving
            .engines
            .entry(worker)
            .or_insert_with(|| Engine {
                url: url.to_string(),
                health: EngineHealth::Unknown,
                models: Vec::new(),
                adapters: Vec::new(),
                stats: ServedStats::default(),
                active_requests: 0,
                active_blocks: 0,
            });
        engine.url = url.to_string();
        self.touch(WorkerWithDpRank { worker, dp_rank: 0 });
    }

    /// Removes the engine of `worker` and every rank's row and blocks; requests in
    /// flight there finish as they will. Whether it was known.
    pub fn remove_engine(&mut self, worker: WorkerId) -> bool {
        if self.serving.engines.remove(&worker).is_none() {
            return false;
        }
        self.serving.scheduler.remove_workers_of(worker);
        for key in self.rows_of(worker) {
            self.forget_rank(key);
        }
        tracing::info!("engine {worker} removed");
        true
    }

    /// The ranks of `worker` known from its events (rank 0 when none).
    fn ranks_of(&self, worker: WorkerId) -> Vec<WorkerWithDpRank> {
        let mut ranks = self.rows_of(worker);
        if ranks.is_empty() {
            ranks.push(WorkerWithDpRank { worker, dp_rank: 0 });
        }
        ranks
    }

    /// Marks `worker`'s engine down because its process is gone (its port refuses
    /// connections), and clears the blocks the index held for it: a dead engine's cache
    /// is gone, and a restarted one publishes anew (its source counts the restart when
    /// the sequence starts over). Whether the health changed.
    pub fn mark_engine_gone(&mut self, worker: WorkerId, reason: String) -> bool {
        let changed = self.set_engine_health(worker, EngineHealth::Down { reason });
        if self.serving.engines.contains_key(&worker) {
            self.clear_blocks_of(worker);
        }
        changed
    }

    /// Records what the health check (or a failed request) found of `worker`'s engine.
    /// Up makes its ranks candidates; down takes them out, keeping the router's view of
    /// its cache (an engine that timed out may come back with its cache whole; one whose
    /// process is gone is [`RouterState::mark_engine_gone`]). Whether the health changed.
    pub fn set_engine_health(&mut self, worker: WorkerId, health: EngineHealth) -> bool {
        let Some(engine) = self.serving.engines.get(&worker) else {
            return false;
        };
        if engine.health == health {
            return false;
        }
        match &health {
            EngineHealth::Up => {
                tracing::info!(worker = worker.get(), "engine {worker} is up");
                for key in self.ranks_of(worker) {
                    self.serving.scheduler.add_worker(key);
                    self.serving.sync_load(key);
                }
            }
            EngineHealth::Down { reason } => {
                tracing::warn!(worker = worker.get(), "engine {worker} is down: {reason}");
                self.serving.scheduler.remove_workers_of(worker);
            }
            EngineHealth::Unknown => self.serving.scheduler.remove_workers_of(worker),
        }
        if let Some(engine) = self.serving.engines.get_mut(&worker) {
            engine.health = health;
        }
        self.touch(WorkerWithDpRank { worker, dp_rank: 0 });
        true
    }

    /// Forgets what every rank of `worker` held, keeping the rows and their counters
    /// (and their last event ids: the stream goes on where it was, or restarts, which
    /// its source detects and counts).
    fn clear_blocks_of(&mut self, worker: WorkerId) {
        for key in self.ranks_of(worker) {
            if !self.workers.contains_key(&key) {
                continue;
            }
            self.indexer.remove_rank(key);
            let entry = self.touch(key);
            entry.hashes = crate::service::translate::EngineHashes::default();
        }
    }

    /// Records the models `worker`'s engine serves (from its `/v1/models`): base models
    /// and LoRA adapters, each list cut at [`MODELS_MAX`].
    pub fn set_engine_models(
        &mut self,
        worker: WorkerId,
        models: Vec<String>,
        adapters: Vec<String>,
    ) {
        let Some(engine) = self.serving.engines.get_mut(&worker) else {
            return;
        };
        let (mut models, mut adapters) = (models, adapters);
        models.truncate(MODELS_MAX);
        adapters.truncate(MODELS_MAX.saturating_sub(models.len()));
        if engine.models == models && engine.adapters == adapters {
            return;
        }
        engine.models = models;
        engine.adapters = adapters;
        self.bump();
    }

    /// Whether `model` names a LoRA adapter of some engine (the request then hashes its
    /// blocks with the adapter's seed, as the engine does).
    pub fn is_adapter(&self, model: &str) -> bool {
        self.serving
            .engines
            .values()
            .any(|engine| engine.adapters.iter().any(|name| name == model))
    }

    /// Counts a request whose prompt could not be tokenized, for `reason`.
    pub fn note_untokenized(&mut self, reason: &'static str) {
        self.bump();
        *self.serving.untokenized.entry(reason).or_default() += 1;
    }

    /// Shows `counts` (a trace recorder's) in `/metrics`.
    pub fn set_trace_counts(&mut self, counts: Option<Arc<TraceCounts>>) {
        self.serving.trace_counts = counts;
    }

    /// Counts a request refused before any engine, for `reason`.
    pub fn refuse_request(&mut self, reason: &'static str) {
        self.bump();
        *self.serving.refused.entry(reason).or_default() += 1;
    }

    /// Chooses the engine for a prompt whose full blocks hash to `query` (with the
    /// request's adapter and salt), among the engines up that serve `model` (any, when
    /// `None` or when no engine has said what it serves) and are not in `exclude`
    /// (engines already tried); with `pinned`, that engine alone (Dynamo's
    /// `backend_instance_id`). The decision and every candidate weighed; changes only
    /// the scheduler's tie-breaking RNG.
    pub fn choose_engine(
        &mut self,
        query: &[LocalBlockHash],
        model: Option<&str>,
        exclude: &[WorkerId],
        pinned: Option<WorkerId>,
    ) -> Result<(Candidate, Vec<Candidate>), DispatchError> {
        if let Some(pinned) = pinned {
            match self.serving.engines.get(&pinned) {
                None => return Err(DispatchError::UnknownEngine(pinned.get())),
                Some(engine) if engine.health != EngineHealth::Up || exclude.contains(&pinned) => {
                    let why = match &engine.health {
                        EngineHealth::Down { reason } => reason.clone(),
                        EngineHealth::Up => "it failed this request".to_string(),
                        other => other.name().to_string(),
                    };
                    return Err(DispatchError::NoEngineUp(vec![(pinned.get(), why)]));
                }
                Some(_) => {}
            }
        }
        let serves = |engine: &Engine| {
            model.is_none_or(|model| {
                engine.models.is_empty()
                    || engine.models.iter().any(|name| name == model)
                    || engine.adapters.iter().any(|name| name == model)
            })
        };
        let eligible: Vec<WorkerId> = self
            .serving
            .engines
            .iter()
            .filter(|(worker, engine)| {
                engine.health == EngineHealth::Up
                    && !exclude.contains(worker)
                    && pinned.is_none_or(|pinned| **worker == pinned)
            })
            .map(|(worker, _)| *worker)
            .collect();
        if eligible.is_empty() {
            let down = self
                .serving
                .engines
                .iter()
                .filter(|(_, engine)| engine.health != EngineHealth::Up)
                .map(|(worker, engine)| {
                    let why = match &engine.health {
                        EngineHealth::Down { reason } => reason.clone(),
                        other => other.name().to_string(),
                    };
                    (worker.get(), why)
                })
                .collect();
            return Err(DispatchError::NoEngineUp(down));
        }
        let serving: Vec<WorkerId> = eligible
            .iter()
            .copied()
            .filter(|worker| self.serving.engines.get(worker).is_some_and(serves))
            .collect();
        if serving.is_empty() {
            return Err(DispatchError::UnknownModel(
                model.unwrap_or_default().to_string(),
            ));
        }
        // Ranks first seen in events after their engine came up become candidates now.
        for worker in &serving {
            for key in self.ranks_of(*worker) {
                if self.serving.scheduler.load(key).is_none() {
                    self.serving.scheduler.add_worker(key);
                    self.serving.sync_load(key);
                }
            }
        }
        let overlaps = self.indexer.find_matches(query, false).workers;
        // A shared store's blocks, credited beyond each engine's own overlap.
        let shared = self.shared_prefix(query);
        let candidates: Vec<Candidate> = self
            .serving
            .scheduler
            .candidates_shared(query.len(), &overlaps, shared)
            .into_iter()
            .filter(|candidate| serving.contains(&candidate.worker.worker))
            .collect();
        let decision = self
            .serving
            .scheduler
            .choose(&candidates)
            .ok_or_else(|| DispatchError::NoEngineUp(Vec::new()))?;
        let chosen = *candidates
            .iter()
            .find(|candidate| candidate.worker == decision.worker)
            .expect("the scheduler chooses among the candidates");
        Ok((chosen, candidates))
    }

    /// [`RouterState::choose_engine`], then the decision recorded in the route ring and
    /// the request, a prompt of `prompt_tokens` tokens, put in flight on the engine
    /// chosen.
    pub fn dispatch(
        &mut self,
        query: &[LocalBlockHash],
        prompt_tokens: u64,
        model: Option<&str>,
        exclude: &[WorkerId],
        pinned: Option<WorkerId>,
    ) -> Result<Dispatch, DispatchError> {
        if self.serving.inflight.len() >= self.serving.max_inflight {
            return Err(DispatchError::AtCapacity(self.serving.max_inflight));
        }
        let (chosen, candidates) = self.choose_engine(query, model, exclude, pinned)?;
        let key = chosen.worker;
        let block_size = self.block_size().unwrap_or(0);
        let prompt_blocks = blocks_of(prompt_tokens, block_size);
        let request = self.serving.next_request;
        self.serving.next_request += 1;
        let predicted = predicted_cached_tokens(chosen.overlap_blocks, prompt_tokens, block_size);
        self.serving.inflight.insert(
            request,
            InFlight {
                worker: key,
                prompt_tokens,
                generated: 0,
                blocks: prompt_blocks,
                predicted_cached_tokens: predicted,
            },
        );
        self.serving.sync_load(key);
        let ranked = self.ranks_of(key.worker).len() > 1 || key.dp_rank > 0;
        let engine = self
            .serving
            .engines
            .get_mut(&key.worker)
            .expect("a candidate is a known engine");
        engine.stats.dispatched += 1;
        engine.active_requests += 1;
        engine.active_blocks += prompt_blocks;
        let url = engine.url.clone();
        self.serving.totals.dispatched += 1;
        self.touch(WorkerWithDpRank {
            worker: key.worker,
            dp_rank: 0,
        });
        let route_seq = self.record_candidates(query.len(), key, &candidates);
        Ok(Dispatch {
            request,
            worker: key,
            url,
            ranked,
            overlap_blocks: chosen.overlap_blocks,
            route_seq,
        })
    }

    /// Records a decision among engines in the route ring, with each candidate's
    /// overlap and load (its active blocks). Its sequence number.
    pub fn record_candidates(
        &mut self,
        query_blocks: usize,
        winner: WorkerWithDpRank,
        candidates: &[Candidate],
    ) -> u64 {
        let candidates = candidates
            .iter()
            .map(|candidate| RouteCandidate {
                worker: candidate.worker.worker.get(),
                dp_rank: candidate.worker.dp_rank,
                overlap: TierCounts::from_array(candidate.overlap_by_tier.map(u64::from)),
                load: candidate.load.active_blocks,
                score: u64::from(candidate.overlap_blocks),
                shared: u64::from(candidate.shared_blocks),
            })
            .collect();
        self.bump();
        self.route_seq += 1;
        if self.routes.len() == super::ROUTE_RECORDS_KEPT {
            self.routes.pop_front();
        }
        self.routes.push_back(RouteRecord {
            seq: self.route_seq,
            query_blocks: query_blocks as u64,
            winner: Some(WorkerKey::from(winner)),
            candidates,
        });
        self.route_seq
    }

    /// `tokens` more output tokens of `request` arrived: its load grows by the blocks
    /// they fill.
    pub fn note_output(&mut self, request: u64, tokens: u64) {
        let block_size = self.block_size().unwrap_or(0);
        let Some(inflight) = self.serving.inflight.get_mut(&request) else {
            return;
        };
        inflight.generated += tokens;
        let blocks = blocks_of(inflight.prompt_tokens + inflight.generated, block_size);
        let grown = blocks.saturating_sub(inflight.blocks);
        if grown == 0 {
            return;
        }
        inflight.blocks = blocks;
        let key = inflight.worker;
        if let Some(engine) = self.serving.engines.get_mut(&key.worker) {
            engine.active_blocks += grown;
        }
        self.serving.sync_load(key);
        self.touch(WorkerWithDpRank {
            worker: key.worker,
            dp_rank: 0,
        });
    }

    /// `request` ended on its engine with `outcome`: it leaves the engine's load and
    /// its figures are counted. A request not in flight (finished already) is ignored.
    pub fn finish_request(&mut self, request: u64, outcome: &Outcome) {
        let Some(inflight) = self.serving.inflight.remove(&request) else {
            return;
        };
        let key = inflight.worker;
        if let Some(engine) = self.serving.engines.get_mut(&key.worker) {
            engine.active_requests = engine.active_requests.saturating_sub(1);
            engine.active_blocks = engine.active_blocks.saturating_sub(inflight.blocks);
            engine
                .stats
                .record(outcome, inflight.predicted_cached_tokens);
        }
        self.serving
            .totals
            .record(outcome, inflight.predicted_cached_tokens);
        self.serving.sync_load(key);
        self.touch(WorkerWithDpRank {
            worker: key.worker,
            dp_rank: 0,
        });
    }
}

mod expose;
#[cfg(test)]
mod tests;
