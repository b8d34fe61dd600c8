//! The live advisor: the index ([`super::index`]) and the window of accesses
//! ([`super::sizing`]) fed the same events, and the report a caller asks for whenever it
//! likes: occupancy, reuse distance, the hot and cold sets, promotions, demotions and tier
//! sizes, and (at sizes the caller names) the same rows `kvtwin advisor --replay` prints
//! for the window.
//!
//! The sizing replays the window many times (see `super::sizing`), so a caller that must
//! keep taking events meanwhile takes the report in two steps: [`Advisor::report_index`]
//! at once, and [`Sizing::of`] a copy of the window, wherever it likes; [`Advisor::report`]
//! is both at once.
//!
//! Owns: [`Advisor`], [`AdvisorConfig`], [`ReportOptions`], [`AdvisorReport`],
//! [`Sizing`].
//! Never: reads a clock (the caller's `now` is the time), a file or a socket.

use super::distance::DistanceReport;
use super::index::query::{
    BlockView, Demotion, OccupancyRow, PrefixView, Promotion, QueryOptions, TierTotal,
};
use super::index::{BlockIndex, IndexAnomaly, IndexBounds, IndexCounters};
use super::policy::Policy;
use super::sizing::{tier_sizes, AccessWindow, TierSize, WindowStats};
use super::{replay, Access, ReplayRow};
use kvtwin::events::KvCacheEvent;
use kvtwin::ids::WorkerId;
use serde::Serialize;

/// How big the advisor may grow and how long a block is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AdvisorConfig {
    /// The index's bounds.
    pub bounds: IndexBounds,
    /// Block references the sizing window holds.
    pub window_blocks_max: usize,
    /// Bytes of one block (0: sizes in blocks only).
    pub block_bytes: u64,
}

impl Default for AdvisorConfig {
    /// The index's default bounds, a window of 262,144 block references, no bytes.
    fn default() -> Self {
        Self {
            bounds: IndexBounds::default(),
            window_blocks_max: 1 << 18,
            block_bytes: 0,
        }
    }
}

/// What a report holds.
#[derive(Clone, Debug, PartialEq)]
pub struct ReportOptions {
    /// Lists' lengths and the hot and cold thresholds.
    pub query: QueryOptions,
    /// Policies to size the tier under.
    pub policies: Vec<Policy>,
    /// Fractions of the asymptotic hit ratio to size for.
    pub fractions: Vec<f64>,
    /// Sizes, blocks, at which to replay the window as `--replay` does (none: no rows).
    pub capacities: Vec<usize>,
}

impl Default for ReportOptions {
    /// Default lists, every policy, 90 % and 95 %, no replay rows.
    fn default() -> Self {
        Self {
            query: QueryOptions::default(),
            policies: Policy::ALL.to_vec(),
            fractions: vec![0.9, 0.95],
            capacities: Vec::new(),
        }
    }
}

/// One report.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AdvisorReport {
    /// The caller's time of the report.
    pub now: u64,
    /// The index's counters.
    pub counters: IndexCounters,
    /// Blocks, root prefixes and worker ranks tracked.
    pub blocks_tracked: usize,
    /// See `blocks_tracked`.
    pub prefixes_tracked: usize,
    /// See `blocks_tracked`.
    pub ranks_tracked: usize,
    /// Bytes of one block.
    pub block_bytes: u64,
    /// Per worker rank and tier.
    pub occupancy: Vec<OccupancyRow>,
    /// Per tier.
    pub tiers: Vec<TierTotal>,
    /// Reuse distances (distinct blocks).
    pub reuse_distance: DistanceReport,
    /// Blocks accessed most.
    pub hot_blocks: Vec<BlockView>,
    /// Root prefixes accessed most.
    pub hot_prefixes: Vec<PrefixView>,
    /// Held blocks idle longest.
    pub cold_blocks: Vec<BlockView>,
    /// Hot blocks to move up.
    pub promotions: Vec<Promotion>,
    /// Cold copies to move down.
    pub demotions: Vec<Demotion>,
    /// The sizing window.
    pub window: WindowStats,
    /// Per policy, the sizes reaching the fractions asked.
    pub tier_sizes: Vec<TierSize>,
    /// The window replayed at the sizes asked, per policy then size.
    pub replay: Vec<ReplayRow>,
}

/// The index and the window, fed together.
#[derive(Clone, Debug)]
pub struct Advisor {
    index: BlockIndex,
    window: AccessWindow,
}

impl Advisor {
    /// An empty advisor.
    pub fn new(config: AdvisorConfig) -> Self {
        Self {
            index: BlockIndex::new(config.bounds, config.block_bytes),
            window: AccessWindow::new(config.window_blocks_max),
        }
    }

    /// Applies `event` of `worker` at `now` to the index and, unless the index refused
    /// it, appends its access (a `Stored`'s blocks) to the window; the index's anomaly,
    /// if any (see `BlockIndex::handle_event`).
    pub fn handle_event(
        &mut self,
        worker: WorkerId,
        event: &KvCacheEvent,
        now: u64,
    ) -> Result<(), IndexAnomaly> {
        let result = self.index.handle_event(worker, event, now);
        if !matches!(result, Err(IndexAnomaly::RanksMax { .. })) {
            if let Some(access) = Access::of_event(worker, event) {
                self.window.push(access);
            }
        }
        result
    }

    /// The index.
    pub fn index(&self) -> &BlockIndex {
        &self.index
    }

    /// The window's accesses, oldest first.
    pub fn window(&self) -> &[Access] {
        self.window.accesses()
    }

    /// The report at `now`.
    pub fn report(&self, now: u64, options: &ReportOptions) -> AdvisorReport {
        let mut report = self.report_index(now, options);
        Sizing::of(self.window(), options, self.index.block_bytes()).fill(&mut report);
        report
    }

    /// The report at `now` without its sizing (`tier_sizes` and `replay` empty).
    pub fn report_index(&self, now: u64, options: &ReportOptions) -> AdvisorReport {
        let index = &self.index;
        AdvisorReport {
            now,
            counters: index.counters().clone(),
            blocks_tracked: index.blocks_tracked(),
            prefixes_tracked: index.prefixes_tracked(),
            ranks_tracked: index.ranks_tracked(),
            block_bytes: index.block_bytes(),
            occupancy: index.occupancy(),
            tiers: index.tier_totals(),
            reuse_distance: index.reuse_distance(),
            hot_blocks: index.hot_blocks(now, options.query.top),
            hot_prefixes: index.hot_prefixes(options.query.top),
            cold_blocks: index.cold_blocks(now, options.query.top),
            promotions: index.promotions(&options.query),
            demotions: index.demotions(now, &options.query),
            window: self.window.stats(),
            tier_sizes: Vec::new(),
            replay: Vec::new(),
        }
    }
}

/// A report's sizing: the tier sizes and the replay rows of a window.
#[derive(Clone, Debug, PartialEq)]
pub struct Sizing {
    /// Per policy, the sizes reaching the fractions asked.
    pub tier_sizes: Vec<TierSize>,
    /// The window replayed at the sizes asked, per policy then size.
    pub replay: Vec<ReplayRow>,
}

impl Sizing {
    /// The sizing of `accesses` (a window, oldest first) as `options` ask, blocks
    /// `block_bytes` long.
    pub fn of(accesses: &[Access], options: &ReportOptions, block_bytes: u64) -> Sizing {
        Sizing {
            tier_sizes: tier_sizes(accesses, &options.policies, &options.fractions),
            replay: options
                .policies
                .iter()
                .flat_map(|&policy| {
                    options
                        .capacities
                        .iter()
                        .map(move |&capacity| replay(accesses, policy, capacity, block_bytes))
                })
                .collect(),
        }
    }

    /// Puts it into `report`.
    pub fn fill(self, report: &mut AdvisorReport) {
        report.tier_sizes = self.tier_sizes;
        report.replay = self.replay;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvtwin::events::{KvCacheEventData, StoredBlock};
    use kvtwin::ids::{LocalBlockHash, SequenceHash};
    use kvtwin::tier::Tier;

    fn event(event_id: u64, data: KvCacheEventData) -> KvCacheEvent {
        KvCacheEvent {
            event_id,
            dp_rank: 0,
            data,
        }
    }

    fn stored(blocks: &[u64]) -> KvCacheEventData {
        KvCacheEventData::Stored {
            parent_hash: None,
            blocks: blocks
                .iter()
                .map(|&b| StoredBlock {
                    block_hash: SequenceHash::new(b),
                    tokens_hash: LocalBlockHash::new(b),
                })
                .collect(),
            tier: Tier::Device,
        }
    }

    #[test]
    fn the_report_replays_the_window_as_the_offline_replay_does() {
        let mut advisor = Advisor::new(AdvisorConfig {
            block_bytes: 10,
            ..AdvisorConfig::default()
        });
        let mut accesses = Vec::new();
        for i in 0..40u64 {
            let worker = WorkerId::new(i % 3);
            let data = if i % 5 == 4 {
                KvCacheEventData::Cleared
            } else {
                stored(&[1, 2 + i % 4, 10 + i % 7])
            };
            let event = event(i / 3, data);
            accesses.extend(Access::of_event(worker, &event));
            let _ = advisor.handle_event(worker, &event, i);
        }
        assert_eq!(advisor.window(), accesses.as_slice());
        let options = ReportOptions {
            capacities: vec![2, 8],
            policies: vec![Policy::Lru, Policy::Arc],
            ..ReportOptions::default()
        };
        let report = advisor.report(40, &options);
        assert_eq!(
            report.replay,
            [
                replay(&accesses, Policy::Lru, 2, 10),
                replay(&accesses, Policy::Lru, 8, 10),
                replay(&accesses, Policy::Arc, 2, 10),
                replay(&accesses, Policy::Arc, 8, 10),
            ]
        );
        assert_eq!(report.tier_sizes.len(), 2);
        assert_eq!(report.window.accesses, 32);
        assert_eq!(report.counters.cleared_events, 8);
        // The same stream, the same report; in two steps too.
        assert_eq!(advisor.clone().report(40, &options), report);
        let mut parts = advisor.report_index(40, &options);
        assert!(parts.tier_sizes.is_empty() && parts.replay.is_empty());
        Sizing::of(advisor.window(), &options, 10).fill(&mut parts);
        assert_eq!(parts, report);
    }
}
