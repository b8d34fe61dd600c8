//! The router service's state: kvtwin's indexer fed by engine events, per-worker views,
//! and the answers the HTTP API gives.
//!
//! Owns: [`RouterState`] (the `KvIndexer`, each worker rank's [`EngineHashes`], last
//! event id and [`WorkerIntegrity`], the [`Metrics`], an optional [`ApplyObserver`]),
//! [`RouteAnswer`], [`WorkerSummary`], the change sequence readers follow and the ring of
//! recent [`RouteRecord`]s; a shared store's blocks in an index of their own
//! ([`shared::SharedIndex`], credited, never a worker). Everything is
//! synchronous and deterministic for a given event order: the service wraps it in one
//! lock; tests drive it directly to compare a networked run with an in-process replay.
//!
//! Invariants:
//! - every mutation bumps [`RouterState::change_seq`]; a worker rank's row remembers the
//!   sequence of its last change, and a removed row's key is kept with the sequence of its
//!   removal (at most [`REMOVALS_KEPT`] of them; a reader older than the oldest pruned one
//!   must start over from a full snapshot, see [`RouterState::removed_since`]);
//! - a global counter and the per-rank counters a source attributes to it move together
//!   (the `note_*` and `drop_for` methods), so a rank's counts sum to at most the global;
//! - a publisher restart clears a rank's blocks but keeps its row and its integrity
//!   counters (`restarts` + 1), so readers can show that it restarted;
//! - bounded ([`RouterLimits`]): the index keeps its [`IndexBudget`], each rank's engine
//!   hash map is swept of evicted blocks once it passes twice the rank's indexed blocks
//!   (plus [`SWEEP_SLACK`]) and its entries count against the same caps (past
//!   `max_blocks_per_worker` for a rank or `max_blocks` for all, a sixteenth of the cap
//!   is evicted, counted in `engine_hash_evictions`), at most `max_worker_ranks` rows
//!   exist (events of further
//!   ranks are dropped as `too_many_worker_ranks`): nothing here grows with the input
//!   beyond those bounds and the fixed-size rings.
//!
//! Never: touch a socket, or decide what a malformed message is (sources decode and call
//! [`RouterState::drop_one`] or [`RouterState::drop_for`] with the decoder's reason).

use super::block_size::RouterBlockSize;
use super::metrics::{Metrics, SourceLabels};
use super::stream::{RouteCandidate, RouteRecord, TierCounts, WorkerKey};
use super::translate::EngineHashes;
use super::warn::WarnLimiter;
use crate::wire::normalize::GroupReason;
use crate::wire::WorkerEvent;
use kvtwin::ids::WorkerWithDpRank;
use kvtwin::ids::{LocalBlockHash, WorkerId};
use kvtwin::router::indexer::{ApplyEventError, IndexBudget, KvIndexer, WorkerOverlap};
use kvtwin::tier::Tier;
use kvtwin::tokens::{HashSeed, DEFAULT_HASH_SEED};
use shared::SharedIndex;
use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;

/// Route decisions kept for readers ([`RouterState::routes_since`]); older ones are
/// dropped (readers learn how many they missed).
pub const ROUTE_RECORDS_KEPT: usize = 256;

/// Removed worker ranks remembered for readers; beyond this the oldest removal is
/// pruned and readers that had not seen it get a full snapshot instead.
pub const REMOVALS_KEPT: usize = 1024;

/// Engine hashes a rank may keep beyond twice its indexed blocks before they are swept
/// (a sweep costs a pass over a shard of its map, so it waits for that much to gain;
/// each event over the bound sweeps the next shard).
pub const SWEEP_SLACK: usize = 1024;

/// Worker ranks known at most, unless [`RouterLimits`] says otherwise.
pub const DEFAULT_MAX_WORKER_RANKS: usize = 65_536;

/// What bounds the router state's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouterLimits {
    /// The index's caps.
    pub budget: IndexBudget,
    /// Blocks each worker rank declared it can hold (all tiers), if known: a rank that
    /// reports holding more is flagged `over_declared`.
    pub worker_capacity_blocks: Option<u64>,
    /// Worker ranks known at most; events of further ranks are dropped.
    pub max_worker_ranks: usize,
}

impl Default for RouterLimits {
    /// No index caps, no declared capacity, [`DEFAULT_MAX_WORKER_RANKS`].
    fn default() -> Self {
        Self {
            budget: IndexBudget::UNBOUNDED,
            worker_capacity_blocks: None,
            max_worker_ranks: DEFAULT_MAX_WORKER_RANKS,
        }
    }
}

/// What the budget did to one worker rank, over its whole life (restarts included).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerEvictions {
    /// Blocks evicted from the router's view of it.
    pub evicted_blocks: u64,
    /// Removals of blocks the router had evicted (no error).
    pub evicted_removals: u64,
    /// Stores skipped because the router had evicted their parent (no error).
    pub stored_under_evicted: u64,
    /// Engine-hash entries evicted to hold the rank's map within the caps (a block
    /// republished under fresh engine hashes is one indexed block but many entries).
    pub engine_hash_evictions: u64,
}

/// Called with each event the state applied whole, right after it is applied (under the
/// state's lock, on the source's thread): how a benchmark learns when an event published
/// at one end reached the index at the other. Keep it short; it runs on the apply path.
pub type ApplyObserver = Box<dyn FnMut(&WorkerEvent) + Send>;

/// What one worker rank's event stream looked like: counts that survive a publisher
/// restart. Each counts occurrences, not the ids or batches inside them, except
/// `lost_batches`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerIntegrity {
    /// Events applied whole.
    pub events: u64,
    /// Gaps: an event id above the last one + 1, or a gap in the source's own sequence
    /// (a ZMQ stream's batch numbers) attributed to this rank. Occurrences, not the
    /// number of ids missing.
    pub gaps: u64,
    /// Events whose id was at or below the last one (applied anyway).
    pub out_of_order: u64,
    /// Reconnects of the source carrying this rank (NATS; a ZMQ socket reconnects
    /// inside libzmq without telling).
    pub reconnects: u64,
    /// Batches refused because their blocks had another size than the router's.
    pub block_size_mismatches: u64,
    /// Batches neither the stream nor replay supplied.
    pub lost_batches: u64,
    /// Publisher restarts that cleared this rank.
    pub restarts: u64,
    /// Messages, batches or events of this rank refused, every reason
    /// (`block_size_mismatches` and `group_filtered` included).
    pub dropped: u64,
    /// Events of a KV cache group the index does not keep (hybrid models: not full
    /// attention), left out as Dynamo leaves them out (`GroupReason`).
    pub group_filtered: u64,
    /// Salted blocks its source's tracker evicted past its bound (a later miss on that
    /// chain, never a wrong merge: `wire::salts`).
    pub salt_evictions: u64,
}

/// One worker rank as the router sees it.
#[derive(Debug, Default)]
struct WorkerEntry {
    hashes: EngineHashes,
    last_event_id: Option<u64>,
    integrity: WorkerIntegrity,
    /// `RouterState::change_seq` at this row's last change.
    changed_seq: u64,
    /// Eviction counts of the rank's earlier runs (the index's reset at a restart), and
    /// what the state itself saw (stores under swept parents).
    evictions_before: WorkerEvictions,
    /// The block size of its last batch refused for it, until one of its events is
    /// applied: while set, the worker is not usable (`/readyz`, `/v1/workers`).
    refused_block_size: Option<u32>,
}

/// What `/v1/workers` reports for one worker rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerSummary {
    /// The worker and rank.
    pub key: WorkerWithDpRank,
    /// Blocks held per tier, by `Tier::index`.
    pub blocks: [u64; 4],
    /// The highest event id seen since the rank's last restart.
    pub last_event_id: Option<u64>,
    /// Its stream's integrity counters.
    pub integrity: WorkerIntegrity,
    /// [`RouterState::change_seq`] at the row's last change.
    pub changed_seq: u64,
    /// Blocks the index holds for it now (all tiers; at most `blocks` summed, fewer
    /// once the budget evicted some).
    pub indexed_blocks: u64,
    /// What the budget evicted.
    pub evictions: WorkerEvictions,
    /// Whether it reports holding more blocks than declared; `None` when no capacity
    /// was declared.
    pub over_declared: Option<bool>,
    /// The [`block_digest`](super::translate::block_digest) of the blocks it holds, as
    /// engine hashes and tiers (of those tracked: a budget sweep drops evicted ones).
    pub block_digest: u64,
    /// The block size its events announce when the router refuses it (another size than
    /// the router's), until one of its events is applied; `None` while it is usable.
    pub refused_block_size: Option<u32>,
}

/// What `/v1/route` answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RouteAnswer {
    /// The chosen worker rank: the longest overlap, then the most of it on device, then
    /// the fewest cached blocks, then the lowest key; `None` when no worker is known.
    pub worker: Option<WorkerWithDpRank>,
    /// Every worker rank with an overlap, sorted by key.
    pub overlaps: Vec<WorkerOverlap>,
    /// Full blocks in the query.
    pub query_blocks: usize,
    /// Its leading blocks the shared tier holds; `None` without a shared source.
    pub shared_blocks: Option<u32>,
}

/// An event the index did not take whole; see [`RouterState::apply`].
fn apply_reason(error: &ApplyEventError) -> &'static str {
    match error {
        ApplyEventError::ParentBlockNotFound { .. } => "parent_not_found",
        ApplyEventError::ChainMismatch { .. } => "chain_mismatch",
        ApplyEventError::BlockNotFound { .. } => "block_not_found",
        ApplyEventError::TooManyWorkers => "too_many_workers",
        _ => "index_refused",
    }
}

/// The router service's state; see the module documentation.
pub struct RouterState {
    indexer: KvIndexer,
    limits: RouterLimits,
    workers: BTreeMap<WorkerWithDpRank, WorkerEntry>,
    block_size: RouterBlockSize,
    seed: HashSeed,
    metrics: Metrics,
    observer: Option<ApplyObserver>,
    /// Bumped by every mutation.
    change_seq: u64,
    /// Removed rows: key → `change_seq` of the removal (a key seen again leaves).
    removed: BTreeMap<WorkerWithDpRank, u64>,
    /// The latest removal sequence pruned from `removed` (0: none pruned).
    removals_pruned_seq: u64,
    /// The last `ROUTE_RECORDS_KEPT` route decisions, oldest first.
    routes: VecDeque<RouteRecord>,
    /// Sequence of the last route recorded (0: none).
    route_seq: u64,
    /// Bounds the warnings of gaps, losses, reconnects, restarts, drops and evictions.
    warnings: WarnLimiter,
    /// The sources' connections and readiness.
    sources: SourceTable,
    /// The front door's engines, requests in flight and what was served.
    serving: Serving,
    /// Engine-hash entries of every rank together (what `max_blocks` caps along with
    /// the index).
    engine_entries: usize,
    /// The shared tier's blocks, from its store's events (never a worker).
    shared: SharedIndex,
}

impl std::fmt::Debug for RouterState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouterState")
            .field("indexer", &self.indexer)
            .field("workers", &self.workers)
            .field("block_size", &self.block_size)
            .field("seed", &self.seed)
            .field("metrics", &self.metrics)
            .field("observer", &self.observer.as_ref().map(|_| "set"))
            .field("change_seq", &self.change_seq)
            .field("removed", &self.removed.len())
            .field("routes", &self.routes.len())
            .field("route_seq", &self.route_seq)
            .field("serving", &self.serving)
            .field("shared", &self.shared)
            .finish()
    }
}

impl RouterState {
    /// An empty router hashing queries' tokens in blocks of `block_size` (the engines'
    /// block size) with kvtwin's default seed.
    pub fn new(block_size: usize) -> Self {
        Self::with_limits(block_size, RouterLimits::default())
    }

    /// [`RouterState::new`] held to `limits`.
    pub fn with_limits(block_size: usize, limits: RouterLimits) -> Self {
        let size = u32::try_from(block_size).unwrap_or(u32::MAX);
        Self::with_block_size(RouterBlockSize::fixed(size), limits)
    }

    /// An empty router held to `limits` whose block size is `block_size`: fixed, or
    /// learned from the first `BlockStored` its sources see ([`RouterBlockSize::learned`],
    /// shared with their decoders through [`RouterState::block_size_setting`]).
    pub fn with_block_size(block_size: RouterBlockSize, limits: RouterLimits) -> Self {
        Self {
            indexer: KvIndexer::with_budget(limits.budget),
            limits,
            workers: BTreeMap::new(),
            block_size,
            seed: HashSeed::new(DEFAULT_HASH_SEED),
            metrics: Metrics::default(),
            observer: None,
            change_seq: 0,
            removed: BTreeMap::new(),
            removals_pruned_seq: 0,
            routes: VecDeque::with_capacity(ROUTE_RECORDS_KEPT),
            route_seq: 0,
            warnings: WarnLimiter::default(),
            sources: SourceTable::default(),
            serving: Serving::default(),
            engine_entries: 0,
            shared: SharedIndex::new(limits.budget),
        }
    }

    /// Logs a warning of `kind` unless one was logged within [`super::warn::WARN_INTERVAL`]; a logged
    /// one says how many were held back.
    fn warn(&mut self, kind: &'static str, message: impl FnOnce() -> String) {
        if let Some(held_back) = self.warnings.admit(kind, Instant::now()) {
            tracing::warn!(kind, held_back, "{}", message());
        }
    }

    /// Sets (or, with `None`, removes) the observer called after each event applied
    /// whole (not for refused or partly refused ones); returns the one it replaces.
    /// Unset, it costs one branch per event.
    pub fn set_apply_observer(&mut self, observer: Option<ApplyObserver>) -> Option<ApplyObserver> {
        std::mem::replace(&mut self.observer, observer)
    }

    /// Tokens per block; `None` while it is still to be learned from the events.
    pub fn block_size(&self) -> Option<usize> {
        self.block_size.get().map(|size| size as usize)
    }

    /// The block size cell, shared: what a source's decoder checks batches against (and
    /// learns from).
    pub fn block_size_setting(&self) -> RouterBlockSize {
        self.block_size.clone()
    }

    /// The index.
    pub fn indexer(&self) -> &KvIndexer {
        &self.indexer
    }

    /// Heap bytes of what grows with the blocks held: the index (`KvIndexer::heap_bytes`)
    /// and every rank's engine-hash map, as allocated. What `bytes_per_block` figures in
    /// BENCHMARKS.md divide by the blocks indexed.
    pub fn heap_bytes(&self) -> usize {
        self.indexer.heap_bytes()
            + self
                .workers
                .values()
                .map(|entry| entry.hashes.heap_bytes())
                .sum::<usize>()
    }

    /// The counters.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The counters, for what no `note_*` method covers; counts as a change for readers.
    /// Prefer the `note_*` methods, which keep the per-rank counters in step.
    pub fn metrics_mut(&mut self) -> &mut Metrics {
        self.bump();
        &mut self.metrics
    }

    /// The change sequence: bumped by every mutation, so a reader that saw this value
    /// and sees it again knows nothing changed.
    pub fn change_seq(&self) -> u64 {
        self.change_seq
    }

    fn bump(&mut self) -> u64 {
        self.change_seq += 1;
        self.change_seq
    }

    /// The row of `key`, created if new, marked changed now.
    fn touch(&mut self, key: WorkerWithDpRank) -> &mut WorkerEntry {
        let seq = self.bump();
        if !self.removed.is_empty() {
            self.removed.remove(&key);
        }
        let entry = self.workers.entry(key).or_default();
        entry.changed_seq = seq;
        entry
    }

    /// The rank a source that knows only the worker attributes what it saw to: the
    /// worker's lowest known rank, or rank 0 (then created). A ZMQ stream usually
    /// carries one rank, as vLLM runs one publisher per data-parallel rank.
    fn primary(&self, worker: WorkerId) -> WorkerWithDpRank {
        let first = WorkerWithDpRank { worker, dp_rank: 0 };
        let last = WorkerWithDpRank {
            worker,
            dp_rank: u32::MAX,
        };
        self.workers
            .range(first..=last)
            .next()
            .map_or(first, |(key, _)| *key)
    }

    /// Counts one message, batch or event refused for `reason`, from no known worker.
    pub fn drop_one(&mut self, reason: &'static str) {
        self.bump();
        self.metrics.drop_one(reason);
    }

    /// Counts one message, batch or event of `worker` refused for `reason`, globally
    /// and on the worker's (lowest known) rank; `block_size_mismatch` is also counted
    /// in the rank's `block_size_mismatches`.
    pub fn drop_for(&mut self, worker: WorkerId, reason: &'static str) {
        let group = GroupReason::is_group_reason(reason);
        if !group {
            // A hybrid model's other groups are left out by design: no warning.
            self.warn(reason, || {
                format!("worker {worker}: an event refused ({reason})")
            });
        }
        self.metrics.drop_one(reason);
        let key = self.primary(worker);
        let integrity = &mut self.touch(key).integrity;
        integrity.dropped += 1;
        integrity.group_filtered += u64::from(group);
        if reason == "block_size_mismatch" {
            integrity.block_size_mismatches += 1;
        }
    }

    /// Counts `evicted` salted blocks `worker`'s source tracker evicted (globally and on
    /// its rank).
    pub fn note_salt_evictions(&mut self, worker: WorkerId, evicted: u64) {
        if evicted == 0 {
            return;
        }
        self.warn("salt_eviction", || {
            format!("worker {worker}: {evicted} salted block(s) forgotten past the tracker's bound; later blocks of those chains will miss")
        });
        self.metrics.salt_evictions += evicted;
        let key = self.primary(worker);
        self.touch(key).integrity.salt_evictions += evicted;
    }

    /// Counts `gaps` gaps in `worker`'s source sequence (globally and on its rank).
    pub fn note_gaps(&mut self, worker: WorkerId, gaps: u64) {
        if gaps == 0 {
            return;
        }
        self.warn("sequence_gap", || {
            format!("worker {worker}: {gaps} gap(s) in its event stream's sequence")
        });
        self.metrics.gaps += gaps;
        let key = self.primary(worker);
        self.touch(key).integrity.gaps += gaps;
    }

    /// Counts `batches` recovered through replay (global only: nothing was lost).
    pub fn note_replayed(&mut self, batches: u64) {
        if batches == 0 {
            return;
        }
        self.bump();
        self.metrics.replayed += batches;
    }

    /// Counts `batches` of `worker`'s stream lost for good (globally and on its rank).
    pub fn note_lost(&mut self, worker: WorkerId, batches: u64) {
        self.warn("lost_batches", || {
            format!("worker {worker}: {batches} batch(es) lost (neither stream nor replay had them); its view may be stale")
        });
        self.metrics.lost_batches += batches;
        let key = self.primary(worker);
        self.touch(key).integrity.lost_batches += batches;
    }

    /// Counts `count` reconnects of a source carrying `workers`: once globally, and on
    /// each worker's (lowest known) rank.
    pub fn note_reconnects(&mut self, workers: &[WorkerId], count: u64) {
        if count == 0 {
            return;
        }
        self.bump();
        self.warn("reconnect", || {
            format!(
                "the event source reconnected {count} time(s) ({} worker(s))",
                workers.len()
            )
        });
        self.metrics.reconnects += count;
        for &worker in workers {
            let key = self.primary(worker);
            self.touch(key).integrity.reconnects += count;
        }
    }

    /// Registers an event source: counted in `/metrics` from now on, and `/readyz`
    /// waits for it unless `caught_up`.
    pub fn register_source(&mut self, source: SourceLabels, caught_up: bool) {
        self.bump();
        self.sources.register(source, caught_up);
    }

    /// Forgets an event source (its engine was removed): `/readyz` no longer waits for
    /// it and `/metrics` no longer lists it.
    pub fn unregister_source(&mut self, source: &SourceLabels) {
        if self.sources.unregister(source) {
            self.bump();
        }
    }

    /// `source` finished its initial replay or catch-up.
    pub fn note_caught_up(&mut self, source: &SourceLabels) {
        if self.sources.caught_up(source) {
            self.bump();
            tracing::info!(
                transport = source.transport,
                endpoint = %source.endpoint,
                "caught up"
            );
        }
    }

    /// Records what happened to `source`'s connection; a reconnect is counted globally
    /// too and warned about (rate-limited). Per-worker attribution is the caller's
    /// ([`RouterState::note_reconnects`]).
    pub fn note_connection(&mut self, source: &SourceLabels, event: ConnectionEvent) {
        self.bump();
        if self.sources.connection(source, event) {
            self.metrics.reconnects += 1;
            self.warn("reconnect", || {
                format!("{} {}: reconnected", source.transport, source.endpoint)
            });
        } else if event == ConnectionEvent::Disconnected {
            self.warn("disconnect", || {
                format!("{} {}: disconnected", source.transport, source.endpoint)
            });
        }
    }

    /// `count` reconnects of `source` reported as a count (NATS), without the global
    /// count [`RouterState::note_reconnects`] keeps.
    pub fn note_source_reconnects(&mut self, source: &SourceLabels, count: u64) {
        self.sources.reconnected(source, count);
    }

    /// The sources and their status.
    pub fn sources(&self) -> &SourceTable {
        &self.sources
    }

    /// `Ok` once every source registered has caught up, the block size is known and,
    /// when workers are known, one of them is usable, and, when the router fronts
    /// engines, one of them is up; otherwise why not (see `state/usable.rs` and
    /// `state/serving.rs`).
    pub fn readiness(&self) -> Result<(), String> {
        self.sources.readiness()?;
        self.usable()?;
        self.serving.readiness()
    }

    /// Applies a batch of events in order, timing it. An event that cannot be translated
    /// is dropped whole; one the index takes only in part (a refused stored block and the
    /// rest of its chain) keeps what was taken. Each is counted by reason; the batch goes
    /// on either way. Returns how many were applied whole.
    pub fn apply_batch(&mut self, events: &[WorkerEvent]) -> usize {
        let start = Instant::now();
        let evicted_before = self.indexer.stats().evicted_blocks;
        let mut applied = 0;
        self.metrics.events_received += events.len() as u64;
        for event in events {
            if self.apply(event).is_ok() {
                applied += 1;
            }
        }
        let evicted = self.indexer.stats().evicted_blocks - evicted_before;
        if evicted > 0 {
            let blocks = self.indexer.distinct_blocks();
            self.warn("eviction", || {
                format!("the index budget evicted {evicted} block(s) ({blocks} held)")
            });
        }
        self.bump();
        self.metrics.batches += 1;
        self.metrics.apply_latency.observe(start.elapsed());
        applied
    }

    /// Applies one event; `Err` with the reason it was (partly) refused, also counted
    /// (globally and on the event's rank). Its id is checked against the rank's last
    /// one first: above last + 1 counts a gap, at or below counts out-of-order; either
    /// way the event is applied and the rank's last id is the highest seen.
    pub fn apply(&mut self, event: &WorkerEvent) -> Result<(), &'static str> {
        let key = WorkerWithDpRank {
            worker: event.worker,
            dp_rank: event.dp_rank,
        };
        if self.workers.len() >= self.limits.max_worker_ranks && !self.workers.contains_key(&key) {
            self.drop_one("too_many_worker_ranks");
            return Err("too_many_worker_ranks");
        }
        // `touch`, spelled out: the entry borrows `workers` alone, beside the index and
        // the metrics.
        let seq = self.bump();
        if !self.removed.is_empty() {
            self.removed.remove(&key);
        }
        let entry = self.workers.entry(key).or_default();
        entry.changed_seq = seq;
        let id = event.event_id;
        match entry.last_event_id {
            Some(last) if id <= last => entry.integrity.out_of_order += 1,
            Some(last) if id - last > 1 => entry.integrity.gaps += 1,
            _ => {}
        }
        entry.last_event_id = Some(entry.last_event_id.map_or(id, |last| last.max(id)));
        let entries_before = entry.hashes.len();
        let translated = match entry.hashes.translate(event) {
            Ok(translated) => translated,
            Err(error @ super::translate::TranslateError::EvictedParent(_)) => {
                // The budget's doing, not the worker's: counted apart from drops.
                entry.evictions_before.stored_under_evicted += 1;
                return Err(error.reason());
            }
            Err(error) => {
                entry.integrity.dropped += 1;
                self.metrics.drop_one(error.reason());
                return Err(error.reason());
            }
        };
        entry.refused_block_size = None;
        let result = self.indexer.apply(event.worker, &translated);
        if self.limits.budget.is_bounded() {
            let indexed = self.indexer.worker_stats(key).blocks as usize;
            if entry.hashes.len() > 2 * indexed + SWEEP_SLACK {
                let indexer = &self.indexer;
                entry.hashes.sweep_step(|hash| indexer.holds(key, hash));
            }
            // Entries count against the per-rank cap as blocks do: past it, a sixteenth
            // of the cap goes at once (so the cost of a pass is paid rarely).
            if let Some(cap) = self.limits.budget.max_blocks_per_worker {
                if entry.hashes.len() > cap {
                    entry.hashes.evict(entry.hashes.len() - cap + cap / 16);
                }
            }
        }
        self.engine_entries =
            (self.engine_entries + entry.hashes.len()).saturating_sub(entries_before);
        if let Some(cap) = self.limits.budget.max_blocks {
            if self.engine_entries > cap {
                self.evict_engine_entries(self.engine_entries - cap + cap / 16);
            }
        }
        let entry = self.workers.get_mut(&key).expect("the rank applied to");
        match result {
            Ok(()) => {
                entry.integrity.events += 1;
                self.metrics.events_applied += 1;
                if let Some(observer) = &mut self.observer {
                    observer(event);
                }
                Ok(())
            }
            Err(error) => {
                let reason = apply_reason(&error);
                entry.integrity.dropped += 1;
                self.metrics.drop_one(reason);
                Err(reason)
            }
        }
    }

    /// Clears everything `worker` (every rank) held: its engine restarted. See
    /// [`RouterState::restart_ranks`].
    pub fn restart_worker(&mut self, worker: WorkerId) {
        let ranks: Vec<u32> = self
            .rows_of(worker)
            .into_iter()
            .map(|key| key.dp_rank)
            .collect();
        self.restart_ranks(worker, &ranks);
    }

    /// The rows of every rank of `worker`, in rank order.
    fn rows_of(&self, worker: WorkerId) -> Vec<WorkerWithDpRank> {
        let range = WorkerWithDpRank { worker, dp_rank: 0 }..=WorkerWithDpRank {
            worker,
            dp_rank: u32::MAX,
        };
        self.workers.range(range).map(|(key, _)| *key).collect()
    }

    /// Clears what `ranks` of `worker` held: the engine process serving those
    /// data-parallel ranks restarted (vLLM runs one publisher per rank, so one rank's
    /// restart says nothing about the others). Each rank keeps its row and integrity
    /// counters, `restarts` + 1, with no last event id (the new run numbers from
    /// scratch); with no ranks, the worker's lowest known rank (or rank 0) counts the
    /// restart. The global `restarts` counts one per call.
    pub fn restart_ranks(&mut self, worker: WorkerId, ranks: &[u32]) {
        let keys: Vec<WorkerWithDpRank> = if ranks.is_empty() {
            vec![self.primary(worker)]
        } else {
            ranks
                .iter()
                .map(|&dp_rank| WorkerWithDpRank { worker, dp_rank })
                .collect()
        };
        for key in keys {
            let index = self.indexer.worker_stats(key);
            let entry = self.touch(key);
            let (entries, evicted_entries) = (entry.hashes.len(), entry.hashes.evicted_entries());
            entry.evictions_before.engine_hash_evictions += evicted_entries;
            entry.hashes = EngineHashes::default();
            entry.last_event_id = None;
            entry.refused_block_size = None;
            entry.integrity.restarts += 1;
            let before = &mut entry.evictions_before;
            before.evicted_blocks += index.evicted_blocks;
            before.evicted_removals += index.evicted_removals;
            before.stored_under_evicted += index.stored_under_evicted;
            self.indexer.remove_rank(key);
            self.engine_entries = self.engine_entries.saturating_sub(entries);
        }
        self.warn("engine_restart", || {
            format!("worker {worker}: its engine restarted (sequence went back); its blocks were cleared")
        });
        self.metrics.restarts += 1;
    }

    /// Forgets the row of `key` and what it held (a worker that left for good); readers
    /// learn of it through [`RouterState::removed_since`]. Whether it was known.
    pub fn forget_rank(&mut self, key: WorkerWithDpRank) -> bool {
        let Some(entry) = self.workers.remove(&key) else {
            return false;
        };
        self.engine_entries = self.engine_entries.saturating_sub(entry.hashes.len());
        self.indexer.remove_rank(key);
        let seq = self.bump();
        self.removed.insert(key, seq);
        if self.removed.len() > REMOVALS_KEPT {
            // Bounded: the oldest removal goes; readers behind it start over.
            let (oldest, oldest_seq) = self
                .removed
                .iter()
                .min_by_key(|(_, seq)| **seq)
                .map(|(key, seq)| (*key, *seq))
                .expect("more than REMOVALS_KEPT removals");
            self.removed.remove(&oldest);
            self.removals_pruned_seq = oldest_seq;
        }
        true
    }

    /// Evicts `n` engine-hash entries from the ranks holding the most, largest first:
    /// what holds all ranks' maps together within `max_blocks` (a scan of the rows, paid
    /// once per sixteenth of the cap evicted).
    fn evict_engine_entries(&mut self, mut n: usize) {
        let mut sizes: Vec<(usize, WorkerWithDpRank)> = self
            .workers
            .iter()
            .map(|(key, entry)| (entry.hashes.len(), *key))
            .collect();
        sizes.sort_unstable_by(|a, b| b.cmp(a));
        for (_, key) in sizes {
            if n == 0 {
                break;
            }
            let seq = self.bump();
            let Some(entry) = self.workers.get_mut(&key) else {
                continue;
            };
            entry.changed_seq = seq;
            let gone = entry.hashes.evict(n);
            n -= gone.min(n);
            self.engine_entries = self.engine_entries.saturating_sub(gone);
        }
    }

    /// Blocks `key` holds, all tiers: the load the route tie-break uses.
    fn cached(&self, key: &WorkerWithDpRank) -> u64 {
        self.workers
            .get(key)
            .map_or(0, |entry| entry.hashes.counts().iter().sum())
    }

    /// Marks the blocks `query` matches as just used, so the budget evicts them last
    /// (what a route does to the index; a no-op without a budget).
    pub fn touch_query(&mut self, query: &[LocalBlockHash]) {
        self.indexer.touch(query);
    }

    /// The limits this state keeps to.
    pub fn limits(&self) -> RouterLimits {
        self.limits
    }

    /// What the budget did to `key` over its life, and what the index holds for it.
    fn evictions(&self, key: WorkerWithDpRank, entry: &WorkerEntry) -> (u64, WorkerEvictions) {
        let index = self.indexer.worker_stats(key);
        let before = entry.evictions_before;
        (
            index.blocks,
            WorkerEvictions {
                evicted_blocks: before.evicted_blocks + index.evicted_blocks,
                evicted_removals: before.evicted_removals
                    + index.evicted_removals
                    + entry.hashes.evicted_removals(),
                stored_under_evicted: before.stored_under_evicted + index.stored_under_evicted,
                engine_hash_evictions: before.engine_hash_evictions
                    + entry.hashes.evicted_entries(),
            },
        )
    }

    /// Which worker rank to send a request with these block hashes to, and every
    /// worker's overlap. Changes nothing; see [`RouterState::record_route`].
    pub fn route(&self, query: &[LocalBlockHash]) -> RouteAnswer {
        let overlaps = self.indexer.find_matches(query, false).workers;
        let best = overlaps
            .iter()
            .filter(|overlap| overlap.blocks > 0)
            .max_by(|a, b| {
                (a.blocks, a.by_tier[Tier::Device.index()])
                    .cmp(&(b.blocks, b.by_tier[Tier::Device.index()]))
                    .then_with(|| self.cached(&b.worker).cmp(&self.cached(&a.worker)))
                    .then_with(|| b.worker.cmp(&a.worker))
            })
            .map(|overlap| overlap.worker);
        // Nothing cached anywhere: the known worker with the fewest cached blocks.
        let worker = best.or_else(|| {
            self.workers
                .keys()
                .min_by(|a, b| self.cached(a).cmp(&self.cached(b)).then_with(|| a.cmp(b)))
                .copied()
        });
        RouteAnswer {
            worker,
            overlaps,
            query_blocks: query.len(),
            shared_blocks: self
                .shared
                .enabled()
                .then(|| self.shared_prefix(query).blocks),
        }
    }

    /// Records `answer` (what [`RouterState::route`] gave) in the ring of recent
    /// decisions, with each candidate's overlap and load as they are now, and counts it
    /// (`routes`, `route_query_blocks`, `route_hit_blocks`: the winner's overlap). Its
    /// sequence number.
    pub fn record_route(&mut self, answer: &RouteAnswer) -> u64 {
        let shared = answer.shared_blocks.unwrap_or(0);
        let candidate = |overlap: &WorkerOverlap| RouteCandidate {
            worker: overlap.worker.worker.get(),
            dp_rank: overlap.worker.dp_rank,
            overlap: TierCounts::from_array(overlap.by_tier.map(u64::from)),
            load: self.cached(&overlap.worker),
            score: u64::from(overlap.blocks),
            shared: u64::from(shared.saturating_sub(overlap.blocks)),
        };
        let mut candidates: Vec<RouteCandidate> = answer
            .overlaps
            .iter()
            .filter(|overlap| overlap.blocks > 0)
            .map(candidate)
            .collect();
        let mut hit = 0;
        if let Some(winner) = answer.worker {
            if let Some(overlap) = answer.overlaps.iter().find(|o| o.worker == winner) {
                hit = u64::from(overlap.blocks);
            }
            if !candidates
                .iter()
                .any(|c| c.worker == winner.worker.get() && c.dp_rank == winner.dp_rank)
            {
                candidates.push(RouteCandidate {
                    worker: winner.worker.get(),
                    dp_rank: winner.dp_rank,
                    overlap: TierCounts::default(),
                    load: self.cached(&winner),
                    score: 0,
                    shared: u64::from(shared),
                });
                candidates.sort_by_key(|c| (c.worker, c.dp_rank));
            }
        }
        self.bump();
        self.route_seq += 1;
        let query_blocks = answer.query_blocks as u64;
        self.metrics.routes += 1;
        self.metrics.route_query_blocks += query_blocks;
        self.metrics.route_hit_blocks += hit;
        if self.routes.len() == ROUTE_RECORDS_KEPT {
            self.routes.pop_front();
        }
        self.routes.push_back(RouteRecord {
            seq: self.route_seq,
            query_blocks,
            winner: answer.worker.map(WorkerKey::from),
            candidates,
        });
        self.route_seq
    }

    /// Sequence of the last route recorded (0: none yet).
    pub fn route_seq(&self) -> u64 {
        self.route_seq
    }

    /// The route records after sequence `after` still kept, oldest first, and how many
    /// after it are no longer kept (the ring overran).
    pub fn routes_since(&self, after: u64) -> (Vec<RouteRecord>, u64) {
        let oldest = self.routes.front().map_or(self.route_seq + 1, |r| r.seq);
        let missed = oldest.saturating_sub(after + 1);
        let records = self
            .routes
            .iter()
            .filter(|record| record.seq > after)
            .cloned()
            .collect();
        (records, missed)
    }

    fn summary(&self, key: WorkerWithDpRank, entry: &WorkerEntry) -> WorkerSummary {
        let blocks = entry.hashes.counts();
        let (indexed_blocks, evictions) = self.evictions(key, entry);
        WorkerSummary {
            key,
            block_digest: entry.hashes.digest(),
            blocks,
            last_event_id: entry.last_event_id,
            integrity: entry.integrity,
            changed_seq: entry.changed_seq,
            indexed_blocks,
            evictions,
            over_declared: self
                .limits
                .worker_capacity_blocks
                .map(|capacity| blocks.iter().sum::<u64>() > capacity),
            refused_block_size: entry.refused_block_size,
        }
    }

    /// Every worker rank known, in key order.
    pub fn workers(&self) -> Vec<WorkerSummary> {
        self.workers
            .iter()
            .map(|(key, entry)| self.summary(*key, entry))
            .collect()
    }

    /// The worker ranks changed after change sequence `after`, in key order (a scan of
    /// every row).
    pub fn workers_changed_since(&self, after: u64) -> Vec<WorkerSummary> {
        self.workers
            .iter()
            .filter(|(_, entry)| entry.changed_seq > after)
            .map(|(key, entry)| self.summary(*key, entry))
            .collect()
    }

    /// The worker ranks removed after change sequence `after` and not known again, in
    /// key order; `None` when removals after `after` may have been pruned (the reader
    /// must take a full snapshot).
    pub fn removed_since(&self, after: u64) -> Option<Vec<WorkerWithDpRank>> {
        if after < self.removals_pruned_seq {
            return None;
        }
        Some(
            self.removed
                .iter()
                .filter(|(_, seq)| **seq > after)
                .map(|(key, _)| *key)
                .collect(),
        )
    }
}

mod expose;
mod hashing;
pub mod serving;
pub mod shared;
pub mod sources;
mod usable;

pub use hashing::HashRequestError;
pub use serving::{
    Dispatch, DispatchError, EngineHealth, EngineSummary, Outcome, Served, ServedStats, Serving,
    ServingConfig, DEFAULT_MAX_INFLIGHT,
};
pub use sources::{ConnectionEvent, SourceStatus, SourceTable};

#[cfg(test)]
mod tests;
