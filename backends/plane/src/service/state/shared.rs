//! The shared tier's side of the router state: what a shared block store (`kvtwin
//! store`, G4: one store every engine reads through its connector) holds, learned from
//! the store's own KV events, and the credit the scheduler gives a prompt's blocks found
//! there.
//!
//! Owns: [`SharedIndex`] (inside [`RouterState`], under its one lock: a `KvIndexer` and
//! the engine-hash translation of its own, fed only by sources whose [`EventTarget`] is
//! `Shared`, with its counters), the `RouterState` methods those sources call (the
//! `*_to` ones, which send a `Workers` source's calls where they always went) and
//! [`RouterState::shared_prefix`], the [`SharedPrefix`] the front door's scheduler
//! credits (`Scheduler::candidates_shared`: blocks beyond each engine's own overlap, at
//! `--shared-credit`, Dynamo's `shared_cache_multiplier`, 0.5 by default).
//! Invariant: the store is never a worker: it has no row in `/v1/workers`, is never a
//! route candidate, and nothing it sends is counted on an engine's row.
//! Never: route to the store, or weigh its blocks without a shared source (the credit
//! is then 0 and every decision is what it was).

use super::{RouterState, SWEEP_SLACK};
use crate::service::block_size::BlockSizeMismatch;
use crate::service::source::BLOCK_SIZE_MISMATCH;
use crate::service::translate::EngineHashes;
use crate::wire::WorkerEvent;
use kvtwin::ids::{LocalBlockHash, WorkerId, WorkerWithDpRank};
use kvtwin::router::indexer::{IndexBudget, KvIndexer};
use kvtwin::router::scheduler::SharedPrefix;
use std::collections::BTreeMap;

/// Dynamo's `shared_cache_multiplier` when its shared cache is on: a block found only
/// in the shared tier saves half its prefill (the simulator's default too).
pub const DEFAULT_SHARED_CREDIT: f64 = 0.5;

/// The worker id a shared store's events carry unless it was told another (`kvtwin
/// store --events-worker-id`), and the one its ZMQ events (which carry none) are
/// indexed under: the bytes of `kvtwinG4` read big-endian (7743504665528911668).
pub const DEFAULT_STORE_WORKER_ID: u64 = u64::from_be_bytes(*b"kvtwinG4");

/// Where a source's events go.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum EventTarget {
    /// An engine's (or a worker's): indexed as that worker, routed to.
    #[default]
    Workers,
    /// A shared store's: kept in the shared index, credited, never routed to.
    Shared,
}

/// What the router knows of the shared tier; see the module documentation.
#[derive(Debug)]
pub struct SharedIndex {
    indexer: KvIndexer,
    /// Per publishing store (worker id): its block ids to kvtwin's hashes.
    hashes: BTreeMap<WorkerId, EngineHashes>,
    /// The fraction of a block's prefill a hit there saves.
    credit: f64,
    /// Whether a shared source was configured.
    enabled: bool,
    /// What its sources did.
    pub counts: SharedCounts,
}

/// The shared sources' counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SharedCounts {
    /// Events received.
    pub events: u64,
    /// Events applied whole.
    pub applied: u64,
    /// Messages, batches or events refused, by reason.
    pub dropped: BTreeMap<&'static str, u64>,
    /// Gaps in a store's ZMQ sequence.
    pub gaps: u64,
    /// Batches lost for good.
    pub lost_batches: u64,
    /// Restarts of a store (its sequence went back): its blocks were cleared.
    pub restarts: u64,
    /// Reconnects of a NATS source.
    pub reconnects: u64,
}

impl SharedIndex {
    /// No shared tier (nothing credited) until [`RouterState::enable_shared`].
    pub(super) fn new(budget: IndexBudget) -> Self {
        Self {
            indexer: KvIndexer::with_budget(budget),
            hashes: BTreeMap::new(),
            credit: 0.0,
            enabled: false,
            counts: SharedCounts::default(),
        }
    }

    /// Whether a shared source was configured.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The credit of a block found only there.
    pub fn credit(&self) -> f64 {
        self.credit
    }

    /// Distinct blocks the shared tier holds, as its events said.
    pub fn blocks(&self) -> usize {
        self.indexer.distinct_blocks()
    }

    /// The index.
    pub fn indexer(&self) -> &KvIndexer {
        &self.indexer
    }

    fn drop_one(&mut self, reason: &'static str) {
        *self.counts.dropped.entry(reason).or_default() += 1;
    }

    /// Applies one store event: translated with that store's hashes, then indexed.
    fn apply(&mut self, event: &WorkerEvent) -> Result<(), &'static str> {
        let key = WorkerWithDpRank {
            worker: event.worker,
            dp_rank: event.dp_rank,
        };
        let hashes = self.hashes.entry(event.worker).or_default();
        let translated = hashes.translate(event).map_err(|error| error.reason())?;
        let result = self.indexer.apply(event.worker, &translated);
        let indexed = self.indexer.worker_stats(key).blocks as usize;
        if hashes.len() > 2 * indexed + SWEEP_SLACK {
            let indexer = &self.indexer;
            hashes.sweep_step(|hash| indexer.holds(key, hash));
        }
        result.map_err(|error| super::apply_reason(&error))
    }
}

impl RouterState {
    /// Turns the shared tier on: its sources' blocks are credited at `credit` (clamped
    /// to [0, 1]).
    pub fn enable_shared(&mut self, credit: f64) {
        self.shared.enabled = true;
        self.shared.credit = credit.clamp(0.0, 1.0);
        self.bump();
    }

    /// The shared tier's index and counters.
    pub fn shared(&self) -> &SharedIndex {
        &self.shared
    }

    /// What the shared tier holds of a prompt whose full blocks hash to `query`: its
    /// leading blocks there and their credit (nothing without a shared source).
    pub fn shared_prefix(&self, query: &[LocalBlockHash]) -> SharedPrefix {
        if !self.shared.enabled || query.is_empty() {
            return SharedPrefix::default();
        }
        let blocks = self
            .shared
            .indexer
            .find_matches(query, false)
            .workers
            .iter()
            .map(|overlap| overlap.blocks)
            .max()
            .unwrap_or(0);
        SharedPrefix {
            blocks,
            credit: self.shared.credit,
        }
    }

    /// Applies a batch of events to `target`'s index (see [`RouterState::apply_batch`]);
    /// how many were applied whole.
    pub fn apply_batch_to(&mut self, target: EventTarget, events: &[WorkerEvent]) -> usize {
        if target == EventTarget::Workers {
            return self.apply_batch(events);
        }
        self.shared.counts.events += events.len() as u64;
        let mut applied = 0;
        for event in events {
            match self.shared.apply(event) {
                Ok(()) => applied += 1,
                Err(reason) => self.shared.drop_one(reason),
            }
        }
        self.shared.counts.applied += applied as u64;
        self.bump();
        applied
    }

    /// [`RouterState::drop_for`] for `target` (a store's drops are the shared index's).
    pub fn drop_for_to(&mut self, target: EventTarget, worker: WorkerId, reason: &'static str) {
        match target {
            EventTarget::Workers => self.drop_for(worker, reason),
            EventTarget::Shared => self.shared.drop_one(reason),
        }
    }

    /// [`RouterState::drop_one`] for `target`.
    pub fn drop_one_to(&mut self, target: EventTarget, reason: &'static str) {
        match target {
            EventTarget::Workers => self.drop_one(reason),
            EventTarget::Shared => self.shared.drop_one(reason),
        }
    }

    /// [`RouterState::refuse_block_size`] for `target`.
    pub fn refuse_block_size_to(
        &mut self,
        target: EventTarget,
        worker: WorkerId,
        mismatch: BlockSizeMismatch,
    ) {
        match target {
            EventTarget::Workers => self.refuse_block_size(worker, mismatch),
            EventTarget::Shared => self.shared.drop_one(BLOCK_SIZE_MISMATCH),
        }
    }

    /// [`RouterState::note_gaps`] for `target`.
    pub fn note_gaps_to(&mut self, target: EventTarget, worker: WorkerId, gaps: u64) {
        match target {
            EventTarget::Workers => self.note_gaps(worker, gaps),
            EventTarget::Shared => self.shared.counts.gaps += gaps,
        }
    }

    /// [`RouterState::note_lost`] for `target`.
    pub fn note_lost_to(&mut self, target: EventTarget, worker: WorkerId, batches: u64) {
        match target {
            EventTarget::Workers => self.note_lost(worker, batches),
            EventTarget::Shared => self.shared.counts.lost_batches += batches,
        }
    }

    /// [`RouterState::note_salt_evictions`] for `target` (a store's blocks carry no salt).
    pub fn note_salt_evictions_to(&mut self, target: EventTarget, worker: WorkerId, n: u64) {
        if target == EventTarget::Workers {
            self.note_salt_evictions(worker, n);
        }
    }

    /// [`RouterState::note_reconnects`] for `target`.
    pub fn note_reconnects_to(&mut self, target: EventTarget, workers: &[WorkerId], count: u64) {
        match target {
            EventTarget::Workers => self.note_reconnects(workers, count),
            EventTarget::Shared => self.shared.counts.reconnects += count,
        }
    }

    /// [`RouterState::restart_ranks`] for `target`: a store that restarted had its
    /// blocks cleared (it announces what it kept again).
    pub fn restart_ranks_to(&mut self, target: EventTarget, worker: WorkerId, ranks: &[u32]) {
        match target {
            EventTarget::Workers => self.restart_ranks(worker, ranks),
            EventTarget::Shared => {
                self.shared.indexer.remove_worker(worker);
                self.shared.hashes.remove(&worker);
                self.shared.counts.restarts += 1;
                self.bump();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::WorkerEventData;
    use kvtwin::tier::Tier;

    fn stored(parent: Option<u64>, blocks: &[(u64, u64)]) -> WorkerEvent {
        WorkerEvent {
            worker: WorkerId::new(DEFAULT_STORE_WORKER_ID),
            dp_rank: 0,
            event_id: 0,
            data: WorkerEventData::Stored {
                parent,
                blocks: blocks
                    .iter()
                    .map(|&(engine, local)| (engine, LocalBlockHash::new(local)))
                    .collect(),
                tier: Tier::Remote,
            },
        }
    }

    fn query(locals: &[u64]) -> Vec<LocalBlockHash> {
        locals.iter().map(|l| LocalBlockHash::new(*l)).collect()
    }

    #[test]
    fn a_stores_events_fill_the_shared_index_and_never_a_workers_row() {
        let mut router = RouterState::new(4);
        let store = WorkerId::new(DEFAULT_STORE_WORKER_ID);
        // Off: nothing is credited, whatever arrives.
        assert_eq!(router.shared_prefix(&query(&[10])), SharedPrefix::default());
        router.enable_shared(0.5);
        assert_eq!(
            router.apply_batch_to(EventTarget::Shared, &[stored(None, &[(1, 10), (2, 20)])]),
            1
        );
        assert_eq!(
            router.shared_prefix(&query(&[10, 20, 30])),
            SharedPrefix {
                blocks: 2,
                credit: 0.5
            }
        );
        assert!(router.workers().is_empty(), "the store has no row");
        // A parent the index never saw: refused, counted on the shared index.
        router.apply_batch_to(EventTarget::Shared, &[stored(Some(99), &[(3, 30)])]);
        router.note_gaps_to(EventTarget::Shared, store, 2);
        assert_eq!(router.shared().counts.dropped.values().sum::<u64>(), 1);
        assert_eq!(router.shared().counts.gaps, 2);
        assert_eq!(router.metrics().dropped_total(), 0);
        assert!(router.workers().is_empty());
        // The store restarted: what it held is cleared until it says it again.
        router.restart_ranks_to(EventTarget::Shared, store, &[0]);
        assert_eq!(router.shared().blocks(), 0);
        assert_eq!(router.shared_prefix(&query(&[10])).blocks, 0);
        assert_eq!(router.shared().counts.restarts, 1);
    }

    #[test]
    fn the_credit_is_a_fraction() {
        let mut router = RouterState::new(4);
        router.enable_shared(3.0);
        assert_eq!(router.shared().credit(), 1.0);
    }
}
