//! The KV-aware router's state: which worker holds which blocks, in which tier.
//!
//! Owns: [`indexer::KvIndexer`] (fed by `KvCacheEvent`s, answers prefix-overlap queries),
//! [`approx::PredictedCache`] (predicted caches of workers that publish no events),
//! [`scheduler::Scheduler`] (turns overlaps and load into a worker choice) and
//! [`workload`] (the `kv-router-workload` format shared with peer-bench, and its
//! checksum). The indexer's state is a function of the events it was fed, and `dump`
//! turns it back into events that rebuild it.
//! Never: I/O, clocks or threads; drivers feed events and time queries.

pub mod approx;
pub mod indexer;
pub mod scheduler;
pub mod workload;

#[cfg(test)]
mod test_support {
    //! Helpers shared by the router's unit tests.
    use crate::ids::WorkerWithDpRank;
    use crate::ids::{LocalBlockHash, WorkerId};

    /// Worker `worker` at dp rank 0.
    pub(crate) fn key(worker: u64) -> WorkerWithDpRank {
        WorkerWithDpRank {
            worker: WorkerId::new(worker),
            dp_rank: 0,
        }
    }

    /// A query of these token hashes.
    pub(crate) fn query(locals: &[u64]) -> Vec<LocalBlockHash> {
        locals.iter().map(|l| LocalBlockHash::new(*l)).collect()
    }
}

use crate::events::KvCacheEvent;
use crate::ids::WorkerWithDpRank;
use crate::ids::{LocalBlockHash, Timestamp, WorkerId};
use approx::PredictedCache;
use indexer::{ApplyEventError, KvIndexer, MatchScratch, WorkerOverlap};
use scheduler::{Candidate, Decision, Scheduler, SchedulerConfig, SharedPrefix};
use std::collections::BTreeMap;
use std::time::Duration;

/// How the router learns a worker's cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerMode {
    /// From the worker's KV events.
    Events,
    /// Predicted from the router's own decisions (the worker publishes no events).
    Approximate {
        /// How long a routed request's blocks are assumed cached.
        ttl: Duration,
        /// How many blocks the worker is assumed to hold at most.
        capacity_blocks: usize,
    },
}

/// The router: the block index, predictions for workers without events, and the
/// scheduler that turns both into a choice.
#[derive(Debug)]
pub struct Router {
    indexer: KvIndexer,
    predicted: BTreeMap<WorkerWithDpRank, PredictedCache>,
    scheduler: Scheduler,
    scratch: MatchScratch,
}

impl Router {
    /// A router with no workers.
    pub fn new(config: SchedulerConfig) -> Self {
        Self {
            indexer: KvIndexer::new(),
            predicted: BTreeMap::new(),
            scheduler: Scheduler::new(config),
            scratch: MatchScratch::default(),
        }
    }

    /// Makes `worker` routable, its cache learnt as `mode` says.
    pub fn add_worker(&mut self, worker: WorkerWithDpRank, mode: WorkerMode) {
        self.scheduler.add_worker(worker);
        if let WorkerMode::Approximate {
            ttl,
            capacity_blocks,
        } = mode
        {
            self.predicted
                .insert(worker, PredictedCache::new(ttl, capacity_blocks));
        }
    }

    /// Forgets `worker` (every dp rank): index, prediction and load.
    pub fn remove_worker(&mut self, worker: WorkerId) {
        self.indexer.remove_worker(worker);
        self.predicted.retain(|key, _| key.worker != worker);
        self.scheduler.remove_workers_of(worker);
    }

    /// Routes nothing more to `worker` (a worker draining before it leaves), keeping
    /// its blocks in the index, still fed by its events, until [`Self::remove_worker`].
    pub fn stop_routing(&mut self, worker: WorkerWithDpRank) {
        self.predicted.remove(&worker);
        self.scheduler.remove_worker(worker);
    }

    /// Applies a KV event of `worker` to the index.
    pub fn apply(&mut self, worker: WorkerId, event: &KvCacheEvent) -> Result<(), ApplyEventError> {
        self.indexer.apply(worker, event)
    }

    /// Chooses a worker for a request whose full blocks have these token hashes, and
    /// records the choice (load; the prediction of an approximate worker).
    pub fn route(&mut self, query: &[LocalBlockHash], now: Timestamp) -> Option<Decision> {
        self.route_with(query, now, None, SharedPrefix::default())
    }

    /// [`Self::route`] in a cluster with a shared tier that holds `shared` of the
    /// request (the scheduler's module docs say how it is credited); `explain`, when
    /// given, is set as [`Self::route_explained`] sets it.
    pub fn route_shared(
        &mut self,
        query: &[LocalBlockHash],
        now: Timestamp,
        shared: SharedPrefix,
        explain: Option<&mut Vec<Candidate>>,
    ) -> Option<Decision> {
        self.route_with(query, now, explain, shared)
    }

    /// [`Self::route`], and why: `explain` is set to every eligible worker as the
    /// scheduler weighed it (predicted overlaps included), in worker order. The choice,
    /// and every later one, is the one [`Self::route`] would have made.
    pub fn route_explained(
        &mut self,
        query: &[LocalBlockHash],
        now: Timestamp,
        explain: &mut Vec<Candidate>,
    ) -> Option<Decision> {
        self.route_with(query, now, Some(explain), SharedPrefix::default())
    }

    /// The one path of [`Self::route`] and [`Self::route_explained`].
    fn route_with(
        &mut self,
        query: &[LocalBlockHash],
        now: Timestamp,
        explain: Option<&mut Vec<Candidate>>,
        shared: SharedPrefix,
    ) -> Option<Decision> {
        let mut overlaps: Vec<WorkerOverlap> = self
            .indexer
            .find_matches_with(query, false, &mut self.scratch)
            .to_vec();
        for (worker, cache) in &self.predicted {
            let blocks = cache.overlap(query, now);
            if blocks > 0 {
                overlaps.push(WorkerOverlap {
                    worker: *worker,
                    blocks,
                    by_tier: [blocks, 0, 0, 0],
                });
            }
        }
        overlaps.sort_by_key(|o| o.worker);
        let candidates = self
            .scheduler
            .candidates_shared(query.len(), &overlaps, shared);
        let decision = self.scheduler.choose(&candidates);
        if let Some(explain) = explain {
            *explain = candidates;
        }
        let decision = decision?;
        if let Some(cache) = self.predicted.get_mut(&decision.worker) {
            cache.record_routed(query, now);
        }
        self.scheduler
            .record_start(decision.worker, query.len() as u64);
        Some(decision)
    }

    /// A request of `blocks` blocks finished on `worker`.
    pub fn finish(&mut self, worker: WorkerWithDpRank, blocks: u64) {
        self.scheduler.record_finish(worker, blocks);
    }

    /// The block index.
    pub fn indexer(&self) -> &KvIndexer {
        &self.indexer
    }

    /// The scheduler.
    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::{key, query};
    use super::*;

    #[test]
    fn approximate_workers_keep_affinity_until_the_prediction_expires() {
        let mut router = Router::new(SchedulerConfig {
            seed: 3,
            ..SchedulerConfig::default()
        });
        let mode = WorkerMode::Approximate {
            ttl: Duration::from_secs(1),
            capacity_blocks: 64,
        };
        for worker in 0..4 {
            router.add_worker(key(worker), mode);
        }
        let prompt = query(&[1, 2, 3, 4]);
        let first = router.route(&prompt, Timestamp::ZERO).unwrap();
        router.finish(first.worker, 4);
        let again = router
            .route(&prompt, Timestamp::from_nanos(500_000_000))
            .unwrap();
        assert_eq!(
            again.worker, first.worker,
            "the predicted cache attracts the same prefix"
        );
        assert_eq!(again.overlap_blocks, 4);
        router.finish(again.worker, 4);
        let late = router
            .route(&prompt, Timestamp::from_nanos(3_000_000_000))
            .unwrap();
        assert_eq!(late.overlap_blocks, 0, "the prediction expired");
    }

    #[test]
    fn removed_workers_are_no_longer_routed_to() {
        let mut router = Router::new(SchedulerConfig::default());
        router.add_worker(key(0), WorkerMode::Events);
        router.add_worker(
            key(1),
            WorkerMode::Approximate {
                ttl: Duration::from_secs(1),
                capacity_blocks: 8,
            },
        );
        router.remove_worker(WorkerId::new(1));
        for _ in 0..8 {
            assert_eq!(
                router.route(&query(&[1]), Timestamp::ZERO).unwrap().worker,
                key(0)
            );
        }
    }

    #[test]
    fn a_worker_stopped_from_routing_keeps_its_index_but_gets_no_request() {
        use crate::block::BlockIdentity;
        use crate::events::{KvCacheEventData, StoredBlock};
        use crate::tier::Tier;
        let mut router = Router::new(SchedulerConfig::default());
        router.add_worker(key(0), WorkerMode::Events);
        router.add_worker(key(1), WorkerMode::Events);
        let chain = BlockIdentity::chain(&query(&[1, 2, 3]));
        let stored =
            |event_id, parent: Option<&BlockIdentity>, blocks: &[BlockIdentity]| KvCacheEvent {
                event_id,
                dp_rank: 0,
                data: KvCacheEventData::Stored {
                    parent_hash: parent.map(|p| p.sequence_hash),
                    blocks: blocks
                        .iter()
                        .map(|b| StoredBlock {
                            block_hash: b.sequence_hash,
                            tokens_hash: b.local_hash,
                        })
                        .collect(),
                    tier: Tier::Device,
                },
            };
        router
            .apply(WorkerId::new(1), &stored(0, None, &chain[..2]))
            .unwrap();
        let prompt = query(&[1, 2, 3]);
        let decision = router.route(&prompt, Timestamp::ZERO).unwrap();
        assert_eq!((decision.worker, decision.overlap_blocks), (key(1), 2));
        router.finish(decision.worker, 3);
        router.stop_routing(key(1));
        for _ in 0..4 {
            let decision = router.route(&prompt, Timestamp::ZERO).unwrap();
            assert_eq!(decision.worker, key(0), "a draining worker is not chosen");
            router.finish(decision.worker, 3);
        }
        // Its index is kept, and its events still apply, until it is removed.
        assert_eq!(router.indexer().blocks_of(key(1)).len(), 2);
        router
            .apply(WorkerId::new(1), &stored(1, Some(&chain[1]), &chain[2..]))
            .unwrap();
        assert_eq!(router.indexer().blocks_of(key(1)).len(), 3);
        let decision = router.route(&prompt, Timestamp::ZERO).unwrap();
        assert_eq!(
            decision.worker,
            key(0),
            "still not chosen, with all 3 blocks"
        );
        router.remove_worker(WorkerId::new(1));
        assert!(router.indexer().blocks_of(key(1)).is_empty());
    }

    #[test]
    fn route_explained_chooses_as_route_does_and_shows_every_candidate() {
        let config = SchedulerConfig {
            seed: 5,
            temperature: 0.5,
            ..SchedulerConfig::default()
        };
        let mode = WorkerMode::Approximate {
            ttl: Duration::from_secs(10),
            capacity_blocks: 64,
        };
        let (mut plain, mut explained) = (Router::new(config), Router::new(config));
        for worker in 0..3 {
            plain.add_worker(key(worker), mode);
            explained.add_worker(key(worker), mode);
        }
        let mut candidates = Vec::new();
        for n in 0..40u64 {
            let prompt = query(&[1, 2, 3, 100 + n % 5]);
            let now = Timestamp::from_nanos(n * 1_000_000);
            let a = plain.route(&prompt, now).unwrap();
            let b = explained
                .route_explained(&prompt, now, &mut candidates)
                .unwrap();
            assert_eq!(a, b, "request {n}");
            assert_eq!(
                candidates.iter().map(|c| c.worker).collect::<Vec<_>>(),
                [key(0), key(1), key(2)]
            );
            let chosen = candidates.iter().find(|c| c.worker == b.worker).unwrap();
            assert_eq!(chosen.decision(), b);
            assert_eq!(chosen.overlap_by_tier[0], chosen.overlap_blocks);
        }
        assert!(
            candidates.iter().any(|c| c.overlap_blocks > 0),
            "predicted overlaps are shown"
        );
    }
}
