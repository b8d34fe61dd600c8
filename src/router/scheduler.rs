//! The scheduler: which worker a request goes to.
//!
//! Owns: [`Scheduler`], its [`SchedulerConfig`], [`WorkerLoad`] and the [`Candidate`]s it
//! weighs. The cost of sending a request of `n` full blocks to worker `w` is
//!
//! ```text
//! cost(w) = prefill_weight × (n − Σ_tier credit[tier] × overlap[w][tier])
//!         + block_load_weight × active_blocks(w)
//!         + request_load_weight × active_requests(w)
//! ```
//!
//! where `overlap[w][tier]` counts the request's leading blocks that `w` holds best in
//! `tier` (from the indexer) and `credit` is how much of a block's prefill a hit in that
//! tier saves (device 1.0, host 0.75, disk 0.25, remote 0.0 by default: a lower-tier hit
//! still costs its transfer). The first term is the prefill work left; the others are the
//! decode load already on the worker, which is what spreads traffic that shares one
//! prefix instead of piling it on the worker that cached it first.
//!
//! A cluster with a shared tier (G4: one store every worker reads) adds a credit for the
//! request's leading blocks the store holds beyond what `w` holds itself, the same for
//! every worker, `shared_credit × max(0, shared_prefix − overlap[w])`: Dynamo's
//! `shared_cache_multiplier` (0.5 when its shared cache is on), except that Dynamo counts
//! the shared blocks beyond the device overlap and this counts those beyond the
//! worker's overlap in any tier, so a block is credited once.
//!
//! With temperature 0 the cheapest worker wins; ties are broken by the seeded RNG. With
//! temperature `t > 0` the worker is sampled with probability ∝ exp(−ĉ(w) / t), where
//! ĉ = (cost − min) / (max − min) normalises the costs to [0, 1]. One seed gives one
//! sequence of choices.
//! Never: read a clock or an unseeded RNG; iterate workers in anything but key order.

use super::indexer::WorkerOverlap;
use crate::ids::WorkerWithDpRank;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Weights of the cost formula (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SchedulerConfig {
    /// Fraction of a block's prefill saved by a hit in each tier (device, host, disk,
    /// remote).
    pub credit: [f64; 4],
    /// Weight of the blocks left to prefill.
    pub prefill_weight: f64,
    /// Weight of each block already active on the worker.
    pub block_load_weight: f64,
    /// Weight of each request already active on the worker.
    pub request_load_weight: f64,
    /// 0 picks the cheapest; above 0 samples a softmax over normalised costs.
    pub temperature: f64,
    /// Seed of the tie-breaking and sampling RNG.
    pub seed: u64,
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            credit: [1.0, 0.75, 0.25, 0.0],
            prefill_weight: 1.0,
            block_load_weight: 1.0,
            request_load_weight: 0.0,
            temperature: 0.0,
            seed: 0,
        }
    }
}

/// What is running on a worker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerLoad {
    /// Blocks of the requests running there.
    pub active_blocks: u64,
    /// Requests running there.
    pub active_requests: u64,
}

/// A routing decision.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Decision {
    /// The chosen worker.
    pub worker: WorkerWithDpRank,
    /// Its cost.
    pub cost: f64,
    /// Its overlap with the request, in blocks (any tier).
    pub overlap_blocks: u32,
}

/// One eligible worker as the scheduler weighed it for one request.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    /// The worker.
    pub worker: WorkerWithDpRank,
    /// Its overlap with the request, in blocks, by tier (device, host, disk, remote).
    pub overlap_by_tier: [u32; 4],
    /// Its overlap with the request, in blocks (any tier).
    pub overlap_blocks: u32,
    /// Its load when the request came.
    pub load: WorkerLoad,
    /// Of the request's leading blocks the shared tier holds, those beyond its own
    /// overlap (credited at [`SharedPrefix::credit`]); 0 without a shared tier.
    pub shared_blocks: u32,
    /// Its cost (see the module docs); the cheapest wins at temperature 0.
    pub cost: f64,
}

/// What the shared tier holds of a request, as the router weighs it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SharedPrefix {
    /// The request's leading blocks the shared tier holds.
    pub blocks: u32,
    /// Fraction of a block's prefill a shared-tier hit saves (see the module docs).
    pub credit: f64,
}

impl Candidate {
    /// The decision that chooses this candidate.
    pub fn decision(&self) -> Decision {
        Decision {
            worker: self.worker,
            cost: self.cost,
            overlap_blocks: self.overlap_blocks,
        }
    }
}

/// Chooses workers; keeps the load it has been told about.
#[derive(Debug)]
pub struct Scheduler {
    config: SchedulerConfig,
    rng: ChaCha8Rng,
    loads: BTreeMap<WorkerWithDpRank, WorkerLoad>,
}

impl Scheduler {
    /// A scheduler with no workers.
    pub fn new(config: SchedulerConfig) -> Self {
        Self {
            rng: ChaCha8Rng::seed_from_u64(config.seed),
            config,
            loads: BTreeMap::new(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// Makes `worker` eligible (with no load).
    pub fn add_worker(&mut self, worker: WorkerWithDpRank) {
        self.loads.entry(worker).or_default();
    }

    /// Makes `worker` ineligible.
    pub fn remove_worker(&mut self, worker: WorkerWithDpRank) {
        self.loads.remove(&worker);
    }

    /// Makes every dp rank of `worker` ineligible.
    pub fn remove_workers_of(&mut self, worker: crate::ids::WorkerId) {
        self.loads.retain(|key, _| key.worker != worker);
    }

    /// Replaces what the scheduler knows of `worker`'s load (from metrics, say).
    pub fn set_load(&mut self, worker: WorkerWithDpRank, load: WorkerLoad) {
        self.loads.insert(worker, load);
    }

    /// The load of `worker`.
    pub fn load(&self, worker: WorkerWithDpRank) -> Option<WorkerLoad> {
        self.loads.get(&worker).copied()
    }

    /// A request of `blocks` blocks started on `worker`.
    pub fn record_start(&mut self, worker: WorkerWithDpRank, blocks: u64) {
        let load = self.loads.entry(worker).or_default();
        load.active_blocks += blocks;
        load.active_requests += 1;
    }

    /// A request of `blocks` blocks finished on `worker`.
    pub fn record_finish(&mut self, worker: WorkerWithDpRank, blocks: u64) {
        if let Some(load) = self.loads.get_mut(&worker) {
            load.active_blocks = load.active_blocks.saturating_sub(blocks);
            load.active_requests = load.active_requests.saturating_sub(1);
        }
    }

    /// The cost of sending a request of `query_blocks` blocks to a worker with `overlap`
    /// (none if it holds nothing of it) and `load`.
    pub fn cost(
        &self,
        query_blocks: usize,
        overlap: Option<&WorkerOverlap>,
        load: WorkerLoad,
    ) -> f64 {
        self.cost_shared(query_blocks, overlap, load, 0.0)
    }

    /// [`Self::cost`] with `shared` blocks' worth of prefill credited for the shared
    /// tier (blocks beyond the worker's overlap times the shared credit).
    fn cost_shared(
        &self,
        query_blocks: usize,
        overlap: Option<&WorkerOverlap>,
        load: WorkerLoad,
        shared: f64,
    ) -> f64 {
        let c = &self.config;
        let credit: f64 = overlap.map_or(0.0, |o| {
            o.by_tier
                .iter()
                .zip(c.credit)
                .map(|(n, k)| f64::from(*n) * k)
                .sum()
        });
        // Added only when there is one, so a cluster without a shared tier computes
        // exactly what it did before.
        let credit = if shared > 0.0 {
            credit + shared
        } else {
            credit
        };
        c.prefill_weight * (query_blocks as f64 - credit)
            + c.block_load_weight * load.active_blocks as f64
            + c.request_load_weight * load.active_requests as f64
    }

    /// Every eligible worker (in key order) with its overlap, load and cost for a request
    /// of `query_blocks` blocks, given the indexer's overlaps (sorted by worker, as the
    /// indexer returns them): what [`Self::select`] chooses among, and why it chose.
    pub fn candidates(&self, query_blocks: usize, overlaps: &[WorkerOverlap]) -> Vec<Candidate> {
        self.candidates_shared(query_blocks, overlaps, SharedPrefix::default())
    }

    /// [`Self::candidates`] in a cluster with a shared tier that holds `shared` of the
    /// request (see the module docs).
    pub fn candidates_shared(
        &self,
        query_blocks: usize,
        overlaps: &[WorkerOverlap],
        shared: SharedPrefix,
    ) -> Vec<Candidate> {
        self.loads
            .iter()
            .map(|(worker, load)| {
                let overlap = overlaps.iter().find(|o| o.worker == *worker);
                let overlap_blocks = overlap.map_or(0, |o| o.blocks);
                let shared_blocks = shared.blocks.saturating_sub(overlap_blocks);
                Candidate {
                    worker: *worker,
                    overlap_by_tier: overlap.map_or([0; 4], |o| o.by_tier),
                    overlap_blocks,
                    load: *load,
                    shared_blocks,
                    cost: self.cost_shared(
                        query_blocks,
                        overlap,
                        *load,
                        shared.credit * f64::from(shared_blocks),
                    ),
                }
            })
            .collect()
    }

    /// Chooses a worker among those added for a request of `query_blocks` blocks, given
    /// the indexer's overlaps (sorted by worker, as the indexer returns them). `None` when
    /// no worker is eligible.
    pub fn select(&mut self, query_blocks: usize, overlaps: &[WorkerOverlap]) -> Option<Decision> {
        let candidates = self.candidates(query_blocks, overlaps);
        self.choose(&candidates)
    }

    /// Chooses among `candidates` (from [`Self::candidates`], or a subset of them: a
    /// front door leaves out engines that do not serve the model asked for): the one
    /// draw of the RNG per decision that makes a seed give one sequence of choices.
    pub fn choose(&mut self, candidates: &[Candidate]) -> Option<Decision> {
        let min = candidates
            .iter()
            .map(|d| d.cost)
            .fold(f64::INFINITY, f64::min);
        let max = candidates
            .iter()
            .map(|d| d.cost)
            .fold(f64::NEG_INFINITY, f64::max);
        if candidates.is_empty() {
            return None;
        }
        if self.config.temperature <= 0.0 || max <= min {
            let cheapest: Vec<&Candidate> = candidates.iter().filter(|d| d.cost == min).collect();
            let pick = self.rng.gen_range(0..cheapest.len());
            return Some(cheapest[pick].decision());
        }
        let weights: Vec<f64> = candidates
            .iter()
            .map(|d| (-(d.cost - min) / (max - min) / self.config.temperature).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        let mut draw = self.rng.gen::<f64>() * total;
        for (candidate, weight) in candidates.iter().zip(&weights) {
            if draw < *weight {
                return Some(candidate.decision());
            }
            draw -= weight;
        }
        candidates.last().map(Candidate::decision)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::BlockIdentity;
    use crate::events::{KvCacheEvent, KvCacheEventData, StoredBlock};
    use crate::ids::{LocalBlockHash, WorkerId};
    use crate::router::indexer::KvIndexer;
    use crate::router::test_support::key;
    use crate::tier::Tier;

    fn overlap(worker: u64, by_tier: [u32; 4]) -> WorkerOverlap {
        WorkerOverlap {
            worker: key(worker),
            blocks: by_tier.iter().sum(),
            by_tier,
        }
    }

    fn scheduler(config: SchedulerConfig, workers: u64) -> Scheduler {
        let mut scheduler = Scheduler::new(config);
        (0..workers).for_each(|w| scheduler.add_worker(key(w)));
        scheduler
    }

    #[test]
    fn cost_credits_hits_by_tier_and_adds_load() {
        let s = scheduler(SchedulerConfig::default(), 1);
        let load = WorkerLoad {
            active_blocks: 3,
            active_requests: 1,
        };
        // 10 blocks, 4 on device (4.0), 2 on host (1.5), 2 on disk (0.5): 4 left + 3 load.
        let cost = s.cost(10, Some(&overlap(0, [4, 2, 2, 0])), load);
        assert!((cost - 7.0).abs() < 1e-9, "{cost}");
    }

    #[test]
    fn a_shared_prefix_is_credited_beyond_each_workers_own_overlap() {
        let s = scheduler(SchedulerConfig::default(), 3);
        let shared = SharedPrefix {
            blocks: 8,
            credit: 0.5,
        };
        // 10 blocks; the store holds the first 8. Worker 0 holds 4 on device and 2 on
        // host (5.5 credited), so 2 more from the store (1.0); worker 1 holds 9, past
        // the store's 8 (nothing from it); worker 2 holds nothing (8 × 0.5).
        let overlaps = [overlap(0, [4, 2, 0, 0]), overlap(1, [9, 0, 0, 0])];
        let candidates = s.candidates_shared(10, &overlaps, shared);
        let got: Vec<(u32, f64)> = candidates
            .iter()
            .map(|c| (c.shared_blocks, c.cost))
            .collect();
        assert_eq!(got, [(2, 3.5), (0, 1.0), (8, 6.0)]);
        // Without a store the costs are those of `candidates`.
        let plain: Vec<f64> = s.candidates(10, &overlaps).iter().map(|c| c.cost).collect();
        assert_eq!(plain, [4.5, 1.0, 10.0]);
    }

    #[test]
    fn temperature_zero_picks_the_cheapest_and_breaks_ties_by_seed() {
        let mut s = scheduler(SchedulerConfig::default(), 3);
        let decision = s.select(8, &[overlap(1, [5, 0, 0, 0])]).unwrap();
        assert_eq!(decision.worker, key(1));
        assert_eq!(decision.overlap_blocks, 5);
        let choices = |seed| {
            let mut s = scheduler(
                SchedulerConfig {
                    seed,
                    ..SchedulerConfig::default()
                },
                4,
            );
            (0..32)
                .map(|_| s.select(8, &[]).unwrap().worker.worker.get())
                .collect::<Vec<_>>()
        };
        assert_eq!(choices(1), choices(1), "same seed, same choices");
        assert_ne!(choices(1), choices(2));
        assert!(
            choices(1).iter().any(|w| *w != choices(1)[0]),
            "ties are spread"
        );
    }

    #[test]
    fn positive_temperature_samples_cheaper_workers_more_often() {
        let config = SchedulerConfig {
            temperature: 0.3,
            seed: 9,
            ..SchedulerConfig::default()
        };
        let mut s = scheduler(config, 2);
        let overlaps = [overlap(0, [8, 0, 0, 0])];
        let to_zero = (0..1000)
            .filter(|_| s.select(10, &overlaps).unwrap().worker == key(0))
            .count();
        // Normalised costs 0 and 1: p(0) = 1 / (1 + e^(-1/0.3)) ≈ 0.966.
        assert!((930..=995).contains(&to_zero), "{to_zero}");
    }

    #[test]
    fn the_load_term_spreads_requests_that_share_a_hot_prefix() {
        // As in the Mooncake conversation trace: every request starts with the same block,
        // which worker 0 cached first.
        let mut index = KvIndexer::new();
        let shared = BlockIdentity::chain(&[LocalBlockHash::new(1)]);
        let stored = KvCacheEventData::Stored {
            parent_hash: None,
            blocks: vec![StoredBlock {
                block_hash: shared[0].sequence_hash,
                tokens_hash: shared[0].local_hash,
            }],
            tier: Tier::Device,
        };
        index
            .apply(
                WorkerId::new(0),
                &KvCacheEvent {
                    event_id: 1,
                    dp_rank: 0,
                    data: stored,
                },
            )
            .unwrap();
        let route = |config: SchedulerConfig| {
            let mut s = scheduler(config, 4);
            let mut per_worker = [0u32; 4];
            for request in 0..40u64 {
                let query = [LocalBlockHash::new(1), LocalBlockHash::new(1000 + request)];
                let overlaps = index.find_matches(&query, false);
                let decision = s.select(20, &overlaps.workers).unwrap();
                s.record_start(decision.worker, 20);
                per_worker[decision.worker.worker.get() as usize] += 1;
            }
            per_worker
        };
        let overlap_only = SchedulerConfig {
            block_load_weight: 0.0,
            ..SchedulerConfig::default()
        };
        assert_eq!(
            route(overlap_only),
            [40, 0, 0, 0],
            "pure overlap routing makes a hot spot"
        );
        let spread = route(SchedulerConfig::default());
        assert!(spread.iter().all(|n| (8..=12).contains(n)), "{spread:?}");
    }
}
