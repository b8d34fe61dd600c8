//! The router service's state: kvtwin's indexer fed by engine events, per-worker views,
//! and the answers the HTTP API gives.
//!
//! Owns: [`RouterState`] (the `KvIndexer`, each worker rank's [`EngineHashes`] and last
//! event id, the [`Metrics`], an optional [`ApplyObserver`]), [`RouteAnswer`] and
//! [`WorkerSummary`]. Everything is
//! synchronous and deterministic for a given event order: the service wraps it in one
//! lock; tests drive it directly to compare a networked run with an in-process replay.
//! Never: touch a socket, or decide what a malformed message is (sources decode and call
//! [`RouterState::drop_one`] with the decoder's reason).

use super::metrics::{Gauge, Metrics};
use super::translate::EngineHashes;
use crate::wire::WorkerEvent;
use kvtwin::ids::WorkerWithDpRank;
use kvtwin::ids::{LocalBlockHash, WorkerId};
use kvtwin::router::indexer::{ApplyEventError, KvIndexer, WorkerOverlap};
use kvtwin::tier::Tier;
use kvtwin::tokens::{compute_local_hashes, HashSeed, DEFAULT_HASH_SEED};
use std::collections::BTreeMap;
use std::time::Instant;

/// Called with each event the state applied whole, right after it is applied (under the
/// state's lock, on the source's thread): how a benchmark learns when an event published
/// at one end reached the index at the other. Keep it short; it runs on the apply path.
pub type ApplyObserver = Box<dyn FnMut(&WorkerEvent) + Send>;

/// One worker rank as the router sees it.
#[derive(Debug, Default)]
struct WorkerEntry {
    hashes: EngineHashes,
    last_event_id: Option<u64>,
}

/// What `/v1/workers` reports for one worker rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerSummary {
    /// The worker and rank.
    pub key: WorkerWithDpRank,
    /// Blocks held per tier, by `Tier::index`.
    pub blocks: [u64; 4],
    /// The last event id applied.
    pub last_event_id: Option<u64>,
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
    workers: BTreeMap<WorkerWithDpRank, WorkerEntry>,
    block_size: usize,
    seed: HashSeed,
    metrics: Metrics,
    observer: Option<ApplyObserver>,
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
            .finish()
    }
}

impl RouterState {
    /// An empty router hashing queries' tokens in blocks of `block_size` (the engines'
    /// block size) with kvtwin's default seed.
    pub fn new(block_size: usize) -> Self {
        Self {
            indexer: KvIndexer::new(),
            workers: BTreeMap::new(),
            block_size,
            seed: HashSeed::new(DEFAULT_HASH_SEED),
            metrics: Metrics::default(),
            observer: None,
        }
    }

    /// Sets (or, with `None`, removes) the observer called after each event applied
    /// whole (not for refused or partly refused ones); returns the one it replaces.
    /// Unset, it costs one branch per event.
    pub fn set_apply_observer(&mut self, observer: Option<ApplyObserver>) -> Option<ApplyObserver> {
        std::mem::replace(&mut self.observer, observer)
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The index.
    pub fn indexer(&self) -> &KvIndexer {
        &self.indexer
    }

    /// The counters.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The counters, for sources to add what they saw (gaps, replays, restarts).
    pub fn metrics_mut(&mut self) -> &mut Metrics {
        &mut self.metrics
    }

    /// Counts one message, batch or event refused for `reason`.
    pub fn drop_one(&mut self, reason: &'static str) {
        self.metrics.drop_one(reason);
    }

    /// Applies a batch of events in order, timing it. An event that cannot be translated
    /// is dropped whole; one the index takes only in part (a refused stored block and the
    /// rest of its chain) keeps what was taken. Each is counted by reason; the batch goes
    /// on either way. Returns how many were applied whole.
    pub fn apply_batch(&mut self, events: &[WorkerEvent]) -> usize {
        let start = Instant::now();
        let mut applied = 0;
        for event in events {
            if self.apply(event).is_ok() {
                applied += 1;
            }
        }
        self.metrics.batches += 1;
        self.metrics.apply_latency.observe(start.elapsed());
        applied
    }

    /// Applies one event; `Err` with the reason it was (partly) refused, also counted.
    pub fn apply(&mut self, event: &WorkerEvent) -> Result<(), &'static str> {
        let key = WorkerWithDpRank {
            worker: event.worker,
            dp_rank: event.dp_rank,
        };
        let entry = self.workers.entry(key).or_default();
        let translated = match entry.hashes.translate(event) {
            Ok(translated) => translated,
            Err(error) => {
                self.metrics.drop_one(error.reason());
                return Err(error.reason());
            }
        };
        entry.last_event_id = Some(event.event_id);
        match self.indexer.apply(event.worker, &translated) {
            Ok(()) => {
                self.metrics.events_applied += 1;
                if let Some(observer) = &mut self.observer {
                    observer(event);
                }
                Ok(())
            }
            Err(error) => {
                let reason = apply_reason(&error);
                self.metrics.drop_one(reason);
                Err(reason)
            }
        }
    }

    /// Forgets everything `worker` (every rank) held: its engine restarted.
    pub fn restart_worker(&mut self, worker: WorkerId) {
        let range = WorkerWithDpRank { worker, dp_rank: 0 }..=WorkerWithDpRank {
            worker,
            dp_rank: u32::MAX,
        };
        let ranks: Vec<u32> = self
            .workers
            .range(range)
            .map(|(key, _)| key.dp_rank)
            .collect();
        self.restart_ranks(worker, &ranks);
    }

    /// Forgets what `ranks` of `worker` held: the engine process serving those
    /// data-parallel ranks restarted (vLLM runs one publisher per rank, so one rank's
    /// restart says nothing about the others).
    pub fn restart_ranks(&mut self, worker: WorkerId, ranks: &[u32]) {
        for &dp_rank in ranks {
            let key = WorkerWithDpRank { worker, dp_rank };
            self.workers.remove(&key);
            self.indexer.remove_rank(key);
        }
        self.metrics.restarts += 1;
    }

    /// The token hashes of `tokens`' full blocks, as the engines' events carry them.
    pub fn hash_tokens(&self, tokens: &[u32]) -> Vec<LocalBlockHash> {
        compute_local_hashes(tokens, self.block_size, self.seed)
    }

    /// Which worker rank to send a request with these block hashes to, and every
    /// worker's overlap.
    pub fn route(&self, query: &[LocalBlockHash]) -> RouteAnswer {
        let overlaps = self.indexer.find_matches(query, false).workers;
        let cached = |key: &WorkerWithDpRank| -> u64 {
            self.workers
                .get(key)
                .map_or(0, |entry| entry.hashes.counts().iter().sum())
        };
        let best = overlaps
            .iter()
            .filter(|overlap| overlap.blocks > 0)
            .max_by(|a, b| {
                (a.blocks, a.by_tier[Tier::Device.index()])
                    .cmp(&(b.blocks, b.by_tier[Tier::Device.index()]))
                    .then_with(|| cached(&b.worker).cmp(&cached(&a.worker)))
                    .then_with(|| b.worker.cmp(&a.worker))
            })
            .map(|overlap| overlap.worker);
        // Nothing cached anywhere: the known worker with the fewest cached blocks.
        let worker = best.or_else(|| {
            self.workers
                .keys()
                .min_by(|a, b| cached(a).cmp(&cached(b)).then_with(|| a.cmp(b)))
                .copied()
        });
        RouteAnswer {
            worker,
            overlaps,
            query_blocks: query.len(),
        }
    }

    /// Every worker rank known, in key order.
    pub fn workers(&self) -> Vec<WorkerSummary> {
        self.workers
            .iter()
            .map(|(key, entry)| WorkerSummary {
                key: *key,
                blocks: entry.hashes.counts(),
                last_event_id: entry.last_event_id,
            })
            .collect()
    }

    /// The Prometheus text: the counters and the state's sizes.
    pub fn render_metrics(&self) -> String {
        let mut per_tier = [0u64; 4];
        for entry in self.workers.values() {
            for (total, count) in per_tier.iter_mut().zip(entry.hashes.counts()) {
                *total += count;
            }
        }
        let gauges = [
            Gauge {
                name: "kvtwin_router_workers",
                help: "Worker ranks known.",
                values: vec![(String::new(), self.workers.len() as u64)],
            },
            Gauge {
                name: "kvtwin_router_blocks",
                help: "Blocks cached across workers, by tier.",
                values: Tier::ALL
                    .iter()
                    .map(|tier| (format!("tier=\"{tier}\""), per_tier[tier.index()]))
                    .collect(),
            },
            Gauge {
                name: "kvtwin_router_event_id_gaps",
                help: "Events whose id did not follow their worker rank's previous one.",
                values: vec![(String::new(), self.indexer.stats().event_id_gaps)],
            },
            Gauge {
                name: "kvtwin_router_index_pairs",
                help: "(worker, block) pairs in the index.",
                values: vec![(String::new(), self.indexer.pairs() as u64)],
            },
        ];
        self.metrics.render(&gauges)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(
        worker: u64,
        event_id: u64,
        parent: Option<u64>,
        blocks: &[(u64, u64)],
    ) -> WorkerEvent {
        crate::wire::worker::stored_event(worker, event_id, parent, blocks, Tier::Device)
    }

    #[test]
    fn routes_to_the_longest_overlap_whatever_the_engine_hashes() {
        let mut state = RouterState::new(4);
        // Worker 1 holds tokens-hashes 10, 20, 30; worker 2 holds 10, 20 under other
        // engine hashes.
        assert_eq!(
            state.apply_batch(&[
                stored(1, 0, None, &[(0x11, 10), (0x12, 20), (0x13, 30)]),
                stored(2, 0, None, &[(0x21, 10)]),
                stored(2, 1, Some(0x21), &[(0x22, 20)]),
            ]),
            3
        );
        let query: Vec<LocalBlockHash> = [10, 20, 30, 40].map(LocalBlockHash::new).to_vec();
        let answer = state.route(&query);
        assert_eq!(answer.worker.map(|w| w.worker), Some(WorkerId::new(1)));
        let scores: Vec<(u64, u32)> = answer
            .overlaps
            .iter()
            .map(|o| (o.worker.worker.get(), o.blocks))
            .collect();
        assert_eq!(scores, [(1, 3), (2, 2)]);
        // No overlap: the worker with the fewest cached blocks.
        let answer = state.route(&[LocalBlockHash::new(99)]);
        assert_eq!(answer.worker.map(|w| w.worker), Some(WorkerId::new(2)));
    }

    #[test]
    fn refused_events_are_counted_by_reason_and_the_rest_applied() {
        let mut state = RouterState::new(4);
        let applied = state.apply_batch(&[
            stored(1, 0, Some(0xdead), &[(0x1, 1)]),
            stored(1, 1, None, &[(0x2, 2)]),
        ]);
        assert_eq!(applied, 1);
        assert_eq!(state.metrics().dropped().get("unknown_parent"), Some(&1));
        assert_eq!(state.workers()[0].blocks, [1, 0, 0, 0]);
        assert_eq!(state.workers()[0].last_event_id, Some(1));
        state.restart_worker(WorkerId::new(1));
        assert!(state.workers().is_empty());
        assert_eq!(state.indexer().pairs(), 0);
        assert!(state
            .render_metrics()
            .contains("kvtwin_router_restarts_total 1\n"));
    }

    #[test]
    fn a_restarted_rank_is_cleared_and_the_other_ranks_kept() {
        let mut state = RouterState::new(4);
        let ranked = |dp_rank, engine| WorkerEvent {
            dp_rank,
            ..stored(1, 0, None, &[(engine, 10)])
        };
        state.apply_batch(&[ranked(0, 0xa), ranked(1, 0xb)]);
        assert_eq!(state.indexer().pairs(), 2);
        state.restart_ranks(WorkerId::new(1), &[1]);
        let keys: Vec<u32> = state.workers().iter().map(|w| w.key.dp_rank).collect();
        assert_eq!(keys, [0]);
        assert_eq!(state.indexer().pairs(), 1);
        // The new run's first event follows the clear without an id gap.
        state.apply_batch(&[ranked(1, 0xc)]);
        assert_eq!(state.indexer().stats().event_id_gaps, 0);
        assert_eq!(state.metrics().restarts, 1);
    }

    #[test]
    fn queries_of_tokens_hash_full_blocks_only() {
        let state = RouterState::new(4);
        assert_eq!(state.hash_tokens(&[1, 2, 3, 4, 5, 6]).len(), 1);
        assert_eq!(
            state.hash_tokens(&[1, 2, 3, 4]),
            compute_local_hashes(&[1, 2, 3, 4], 4, HashSeed::new(DEFAULT_HASH_SEED))
        );
    }

    #[test]
    fn the_apply_observer_sees_each_event_applied_whole_and_no_other() {
        let mut state = RouterState::new(4);
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let record = seen.clone();
        let previous = state.set_apply_observer(Some(Box::new(move |event: &WorkerEvent| {
            record.lock().unwrap().push(event.event_id);
        })));
        assert!(previous.is_none());
        state.apply_batch(&[
            stored(1, 0, None, &[(0x1, 1)]),
            stored(1, 1, Some(0xdead), &[(0x2, 2)]),
            stored(1, 2, Some(0x1), &[(0x3, 3)]),
        ]);
        assert_eq!(*seen.lock().unwrap(), [0, 2]);
        assert!(state.set_apply_observer(None).is_some());
        state.apply_batch(&[stored(1, 3, Some(0x3), &[(0x4, 4)])]);
        assert_eq!(seen.lock().unwrap().len(), 2);
    }
}
