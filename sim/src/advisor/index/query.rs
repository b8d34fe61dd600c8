//! What the index answers: occupancy per worker rank and tier, the hot and cold sets,
//! and the promotions and demotions they suggest.
//!
//! The rules, each in one place:
//! - **hot**: the blocks (and root prefixes) accessed most, ties to the most recently
//!   accessed, then the smaller hash;
//! - **cold**: held blocks not accessed for longest (never accessed: since first seen),
//!   ties to the smaller hash;
//! - **promotion**: a block accessed at least `hot_accesses_min` times that no rank holds
//!   on a device, but some tier below holds (a rank's host or disk, or only the shared
//!   store): one tier up from the fastest one holding it (`Remote → Disk → Host →
//!   Device`), for the rank that accessed it last;
//! - **demotion**: a device or host copy of a block idle for at least `cold_idle_min`:
//!   one tier down (`Device → Host → Disk`), the idlest first.
//!
//! Owns: [`QueryOptions`] and the views ([`OccupancyRow`], [`TierTotal`], [`BlockView`],
//! [`PrefixView`], [`Promotion`], [`Demotion`]).
//! Never: changes the index, or orders anything by a hash map (every list is sorted on
//! a total key).

use super::{BlockEntry, BlockIndex};
use crate::advisor::distance::DistanceReport;
use kvtwin::ids::SequenceHash;
use kvtwin::tier::Tier;
use serde::Serialize;
use std::cmp::Reverse;

/// How long the lists are and where hot and cold begin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueryOptions {
    /// Entries per list.
    pub top: usize,
    /// Accesses that make a block a candidate for promotion.
    pub hot_accesses_min: u64,
    /// Idle time (in the caller's units of `now`) that makes a copy a candidate for
    /// demotion.
    pub cold_idle_min: u64,
}

impl Default for QueryOptions {
    /// Ten of each, promoted from 2 accesses, demoted from any idleness.
    fn default() -> Self {
        Self {
            top: 10,
            hot_accesses_min: 2,
            cold_idle_min: 0,
        }
    }
}

/// Blocks one worker rank holds in one tier.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct OccupancyRow {
    /// The worker.
    pub worker_id: u64,
    /// Its data-parallel rank.
    pub dp_rank: u32,
    /// `device`, `host`, `disk` or `remote`.
    pub tier: &'static str,
    /// Blocks held.
    pub blocks: u64,
    /// `blocks` × the block's bytes.
    pub bytes: u64,
}

/// One tier across ranks.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TierTotal {
    /// The tier.
    pub tier: &'static str,
    /// Copies held (a block two ranks hold counts twice).
    pub blocks: u64,
    /// Distinct blocks held.
    pub distinct_blocks: u64,
    /// `blocks` × the block's bytes.
    pub bytes: u64,
}

/// A rank holding a block in a tier.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct HolderView {
    /// The worker.
    pub worker_id: u64,
    /// Its rank.
    pub dp_rank: u32,
    /// The tier.
    pub tier: &'static str,
}

/// One block as the lists show it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BlockView {
    /// Its sequence hash.
    pub block: u64,
    /// Its parent's, if any.
    pub parent: Option<u64>,
    /// Its root prefix.
    pub root: u64,
    /// Accesses.
    pub accesses: u64,
    /// Stores naming it (accesses, copies and duplicates).
    pub stores: u64,
    /// When last accessed (none: never).
    pub last_access_at: Option<u64>,
    /// `now` less its last access (or its first sighting).
    pub idle: u64,
    /// Who holds it where.
    pub holders: Vec<HolderView>,
}

/// One root prefix as the hot list shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PrefixView {
    /// Its root block's sequence hash.
    pub root: u64,
    /// Blocks of it tracked.
    pub blocks: u64,
    /// `blocks` × the block's bytes.
    pub bytes: u64,
    /// Accesses of its blocks.
    pub accesses: u64,
    /// When last accessed.
    pub last_access_at: Option<u64>,
}

/// A block to move up.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Promotion {
    /// Its sequence hash.
    pub block: u64,
    /// Its root prefix.
    pub root: u64,
    /// Accesses.
    pub accesses: u64,
    /// The rank to move it for (the last to access it).
    pub worker_id: u64,
    /// See `worker_id`.
    pub dp_rank: u32,
    /// The fastest tier holding it now.
    pub from: &'static str,
    /// One tier up.
    pub to: &'static str,
}

/// A copy to move down.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Demotion {
    /// Its sequence hash.
    pub block: u64,
    /// The rank holding the copy.
    pub worker_id: u64,
    /// See `worker_id`.
    pub dp_rank: u32,
    /// Where the copy is.
    pub from: &'static str,
    /// One tier down.
    pub to: &'static str,
    /// `now` less the block's last access.
    pub idle: u64,
}

/// The tier above `tier` (none above the device).
fn faster(tier: Tier) -> Option<Tier> {
    match tier {
        Tier::Device => None,
        Tier::Host => Some(Tier::Device),
        Tier::Disk => Some(Tier::Host),
        Tier::Remote => Some(Tier::Disk),
    }
}

/// The tier below `tier` within a rank (none below the disk: the shared store is not a
/// rank's to demote into).
fn slower(tier: Tier) -> Option<Tier> {
    match tier {
        Tier::Device => Some(Tier::Host),
        Tier::Host => Some(Tier::Disk),
        Tier::Disk | Tier::Remote => None,
    }
}

impl BlockIndex {
    /// Per worker rank and tier, the blocks held (ranks and tiers in order, empty ones
    /// left out).
    pub fn occupancy(&self) -> Vec<OccupancyRow> {
        let mut rows = Vec::new();
        for (rank, entry) in &self.ranks {
            for tier in Tier::ALL {
                let blocks = entry.held[tier.index()].len() as u64;
                if blocks > 0 {
                    rows.push(OccupancyRow {
                        worker_id: rank.worker.get(),
                        dp_rank: rank.dp_rank,
                        tier: tier.name(),
                        blocks,
                        bytes: blocks * self.block_bytes,
                    });
                }
            }
        }
        rows
    }

    /// Per tier, copies and distinct blocks held across ranks (every tier, in order).
    pub fn tier_totals(&self) -> Vec<TierTotal> {
        let mut copies = [0u64; 4];
        let mut distinct = [0u64; 4];
        for entry in self.blocks.values() {
            let mut seen = [false; 4];
            for (_, tier) in &entry.holders {
                copies[tier.index()] += 1;
                seen[tier.index()] = true;
            }
            for (count, seen) in distinct.iter_mut().zip(seen) {
                *count += u64::from(seen);
            }
        }
        Tier::ALL
            .into_iter()
            .map(|tier| TierTotal {
                tier: tier.name(),
                blocks: copies[tier.index()],
                distinct_blocks: distinct[tier.index()],
                bytes: copies[tier.index()] * self.block_bytes,
            })
            .collect()
    }

    fn view(&self, block: SequenceHash, entry: &BlockEntry, now: u64) -> BlockView {
        BlockView {
            block: block.get(),
            parent: entry.parent.map(SequenceHash::get),
            root: entry.root.get(),
            accesses: entry.accesses,
            stores: entry.stores,
            last_access_at: entry.last_access_at,
            idle: now.saturating_sub(entry.last_active_at()),
            holders: entry
                .holders
                .iter()
                .map(|(rank, tier)| HolderView {
                    worker_id: rank.worker.get(),
                    dp_rank: rank.dp_rank,
                    tier: tier.name(),
                })
                .collect(),
        }
    }

    /// The `top` blocks accessed most.
    pub fn hot_blocks(&self, now: u64, top: usize) -> Vec<BlockView> {
        let mut hot: Vec<(&SequenceHash, &BlockEntry)> =
            self.blocks.iter().filter(|(_, e)| e.accesses > 0).collect();
        hot.sort_by_key(|(block, e)| (Reverse(e.accesses), Reverse(e.last_access_at), **block));
        hot.truncate(top);
        hot.into_iter()
            .map(|(block, entry)| self.view(*block, entry, now))
            .collect()
    }

    /// The `top` root prefixes accessed most.
    pub fn hot_prefixes(&self, top: usize) -> Vec<PrefixView> {
        let mut hot: Vec<_> = self
            .prefixes
            .iter()
            .filter(|(_, p)| p.accesses > 0)
            .collect();
        hot.sort_by_key(|(root, p)| (Reverse(p.accesses), Reverse(p.last_access_at), **root));
        hot.truncate(top);
        hot.into_iter()
            .map(|(root, p)| PrefixView {
                root: root.get(),
                blocks: p.blocks,
                bytes: p.blocks * self.block_bytes,
                accesses: p.accesses,
                last_access_at: p.last_access_at,
            })
            .collect()
    }

    /// The `top` held blocks idle longest.
    pub fn cold_blocks(&self, now: u64, top: usize) -> Vec<BlockView> {
        let mut cold: Vec<_> = self
            .blocks
            .iter()
            .filter(|(_, e)| !e.holders.is_empty())
            .collect();
        cold.sort_by_key(|(block, e)| (e.last_active_at(), **block));
        cold.truncate(top);
        cold.into_iter()
            .map(|(block, entry)| self.view(*block, entry, now))
            .collect()
    }

    /// Hot blocks no device holds, to move one tier up (see the module documentation).
    pub fn promotions(&self, options: &QueryOptions) -> Vec<Promotion> {
        let mut candidates: Vec<_> = self
            .blocks
            .iter()
            .filter(|(_, e)| e.accesses >= options.hot_accesses_min.max(1))
            .filter_map(|(block, e)| {
                // Holders are sorted by rank first: the fastest tier is their minimum.
                let fastest = e.holders.iter().map(|(_, tier)| *tier).min()?;
                let to = faster(fastest)?;
                let rank = e.last_accessor?;
                Some((block, e, fastest, to, rank))
            })
            .collect();
        candidates.sort_by_key(|(block, e, ..)| {
            (Reverse(e.accesses), Reverse(e.last_access_at), **block)
        });
        candidates.truncate(options.top);
        candidates
            .into_iter()
            .map(|(block, e, from, to, rank)| Promotion {
                block: block.get(),
                root: e.root.get(),
                accesses: e.accesses,
                worker_id: rank.worker.get(),
                dp_rank: rank.dp_rank,
                from: from.name(),
                to: to.name(),
            })
            .collect()
    }

    /// Device and host copies of blocks idle for `cold_idle_min` or more, to move one
    /// tier down, the idlest first.
    pub fn demotions(&self, now: u64, options: &QueryOptions) -> Vec<Demotion> {
        let mut candidates = Vec::new();
        for (block, e) in &self.blocks {
            let idle = now.saturating_sub(e.last_active_at());
            if idle < options.cold_idle_min {
                continue;
            }
            for (rank, tier) in &e.holders {
                if let (true, Some(to)) = (*tier <= Tier::Host, slower(*tier)) {
                    candidates.push((Reverse(idle), *block, *rank, *tier, to));
                }
            }
        }
        candidates.sort();
        candidates.truncate(options.top);
        candidates
            .into_iter()
            .map(|(Reverse(idle), block, rank, from, to)| Demotion {
                block: block.get(),
                worker_id: rank.worker.get(),
                dp_rank: rank.dp_rank,
                from: from.name(),
                to: to.name(),
                idle,
            })
            .collect()
    }

    /// The reuse distances so far.
    pub fn reuse_distance(&self) -> DistanceReport {
        self.distances.report()
    }
}
