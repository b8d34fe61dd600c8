//! The storage advisor's index of the event plane (seed 000, "A conceptual design of a
//! storage advisor"): fed every worker's `KvCacheEvent`s, it keeps per block its
//! sequence hash, its parent and the root prefix it belongs to (the first block of its
//! chain, or the earliest ancestor the index knows), its size, where it is (which worker
//! ranks hold it in which tiers, `Remote` being the shared store), and how often it was
//! stored and accessed and when last; per worker rank and tier what is held; per root
//! prefix its blocks and accesses; and the reuse distances of the accesses.
//!
//! What counts, per block `b` named by a `Stored` of rank `r` in tier `t`:
//! - a **duplicate** when `r` already holds `b` in `t` (counted, nothing else changes);
//! - an **access** when `r` holds `b` in no tier and, for `t = Remote`, no other rank
//!   holds it either: a rank that did not have the block needed it (computed it, or
//!   fetched it from another rank or the shared store), and a shared store taking a
//!   block no engine is seen holding is the evidence of an engine having computed it;
//! - a **copy** otherwise: `r` moving a block between its own tiers (offload, onboard)
//!   or the store taking one an engine holds. A rank's hit in its own lower tier is a
//!   copy too: the events cannot tell it from a write-through.
//!
//! An access of a block accessed before is a **reuse**: a re-store after its removal,
//! or another rank's store of it. Its reuse distance is counted in distinct blocks
//! (accessed since its previous access, itself included), as `kvtwin cache --curve`
//! counts it (`super::distance`), and in the curve's order: the distances of one
//! event's accesses are taken at its lookup, before any of them is touched, and the
//! blocks are then touched from the last to the first, so a block's distance is the
//! smallest LRU tier, in blocks, that would still hold it.
//!
//! Time is what the caller passes with each event (`now`: an event count, a timestamp
//! field), only compared and subtracted; the index never reads a clock.
//!
//! Bounds, each from [`IndexBounds`], each overflow counted in [`IndexCounters`]:
//! blocks (`blocks_max`; past it the least recently seen block held nowhere is forgotten
//! first, then the least recently seen held one: `blocks_forgotten`,
//! `held_blocks_forgotten`; a forgotten block's next access is a first one again),
//! worker ranks (`ranks_max`; events of more are refused: `refused_events`), root prefixes
//! (`prefixes_max`; past it the least recently touched is forgotten:
//! `prefixes_forgotten`), recent reuse distances (`recent_distances_max`, a ring).
//! Holders per block are at most the ranks times the four tiers.
//!
//! Owns: [`BlockIndex`], [`IndexBounds`], [`IndexCounters`], [`IndexAnomaly`]; the
//! queries and recommendations are in [`query`].
//! Never: reads a clock, a file or a socket; iterates a hash map (every map is a
//! `BTreeMap`, so what it reports is the same on every machine); panics on what an event
//! says (an inconsistent event is counted and returned as an [`IndexAnomaly`], the rest of
//! it applied).

pub mod query;

use super::distance::{DistanceStats, StackClock};
use kvtwin::events::{KvCacheEvent, KvCacheEventData, StoredBlock};
use kvtwin::ids::{SequenceHash, WorkerId, WorkerWithDpRank};
use kvtwin::tier::Tier;
use serde::Serialize;
use smallvec::SmallVec;
use std::collections::{BTreeMap, BTreeSet};

/// The index's bounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexBounds {
    /// Blocks tracked (held or remembered for their history).
    pub blocks_max: usize,
    /// Worker ranks (worker id, data-parallel rank) tracked.
    pub ranks_max: usize,
    /// Root prefixes tracked.
    pub prefixes_max: usize,
    /// Reuse distances kept for the percentiles.
    pub recent_distances_max: usize,
}

impl Default for IndexBounds {
    /// About a million blocks (a few hundred bytes each with their map entries, so some
    /// hundreds of MiB at the bound), 4,096 ranks, 65,536 prefixes and distances.
    fn default() -> Self {
        Self {
            blocks_max: 1 << 20,
            ranks_max: 4096,
            prefixes_max: 1 << 16,
            recent_distances_max: 1 << 16,
        }
    }
}

/// What the index has seen and done.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct IndexCounters {
    /// Events handed in (refused ones included).
    pub events: u64,
    /// `Stored` events applied.
    pub stored_events: u64,
    /// `Removed` events applied.
    pub removed_events: u64,
    /// `Cleared` events applied.
    pub cleared_events: u64,
    /// Blocks named by `Stored` events.
    pub stored_blocks: u64,
    /// Accesses (see the module documentation): first accesses plus reuses.
    pub accesses: u64,
    /// Accesses of blocks not accessed before (or forgotten since).
    pub first_accesses: u64,
    /// Accesses of blocks accessed before.
    pub reuses: u64,
    /// Stores that moved or copied a block a rank (or an engine) already held.
    pub copies: u64,
    /// Stores of a block the rank already held in that tier.
    pub duplicate_stores: u64,
    /// Blocks removed from a rank's tier.
    pub removed_blocks: u64,
    /// Removals of a block the rank did not hold in that tier.
    pub unknown_removals: u64,
    /// Blocks a `Cleared` removed.
    pub cleared_blocks: u64,
    /// Events whose id was not the next one of their rank.
    pub event_id_gaps: u64,
    /// Events refused: their rank was one more than `ranks_max`.
    pub refused_events: u64,
    /// Blocks forgotten past `blocks_max`.
    pub blocks_forgotten: u64,
    /// Of them, blocks some rank still held (their holdings are no longer counted).
    pub held_blocks_forgotten: u64,
    /// Root prefixes forgotten past `prefixes_max`.
    pub prefixes_forgotten: u64,
}

/// An event the index could not apply as it stands (the rest of it was applied).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IndexAnomaly {
    /// A new worker rank past `ranks_max`: the event was refused.
    #[error("worker {worker} rank {dp_rank}: more than {ranks_max} ranks; event refused")]
    RanksMax {
        /// The worker.
        worker: WorkerId,
        /// Its rank.
        dp_rank: u32,
        /// The bound.
        ranks_max: usize,
    },
    /// The event id was not the rank's next: events were lost or reordered.
    #[error("event id gap: expected {expected}, got {got}")]
    EventIdGap {
        /// The id expected.
        expected: u64,
        /// The id received.
        got: u64,
    },
    /// A `Stored` named a block the rank already held in that tier.
    #[error("block {block} stored twice in tier {tier}")]
    DuplicateStore {
        /// The block.
        block: SequenceHash,
        /// The tier.
        tier: Tier,
    },
    /// A `Removed` named a block the rank did not hold in that tier.
    #[error("block {block} removed from tier {tier}, where it was not held")]
    UnknownRemoval {
        /// The block.
        block: SequenceHash,
        /// The tier.
        tier: Tier,
    },
}

impl IndexAnomaly {
    /// A stable label for counters and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            IndexAnomaly::RanksMax { .. } => "ranks_max",
            IndexAnomaly::EventIdGap { .. } => "event_id_gap",
            IndexAnomaly::DuplicateStore { .. } => "duplicate_store",
            IndexAnomaly::UnknownRemoval { .. } => "unknown_removal",
        }
    }
}

/// A rank holding a block in a tier.
type Holder = (WorkerWithDpRank, Tier);

/// One block's record.
#[derive(Clone, Debug)]
struct BlockEntry {
    parent: Option<SequenceHash>,
    root: SequenceHash,
    /// Sorted, each once.
    holders: SmallVec<[Holder; 2]>,
    stores: u64,
    accesses: u64,
    first_seen_at: u64,
    last_access_at: Option<u64>,
    last_accessor: Option<WorkerWithDpRank>,
    /// Its stamp on the stack clock (its latest access).
    access_stamp: Option<u64>,
    /// Its key in `by_seen`.
    seen_key: (bool, u64),
}

impl BlockEntry {
    /// When it was last accessed, or first seen if never.
    fn last_active_at(&self) -> u64 {
        self.last_access_at.unwrap_or(self.first_seen_at)
    }
}

/// One worker rank's record.
#[derive(Clone, Debug, Default)]
struct RankEntry {
    /// Blocks held, per tier (`Tier::index`).
    held: [BTreeSet<SequenceHash>; 4],
    next_event_id: Option<u64>,
}

/// One root prefix's record.
#[derive(Clone, Debug)]
struct PrefixEntry {
    blocks: u64,
    accesses: u64,
    last_access_at: Option<u64>,
    /// Its key in `prefix_by_tick`.
    tick: u64,
}

/// The advisor's index (see the module documentation).
#[derive(Clone, Debug)]
pub struct BlockIndex {
    bounds: IndexBounds,
    block_bytes: u64,
    blocks: BTreeMap<SequenceHash, BlockEntry>,
    /// Blocks by (held by anyone, last seen): the first is the one to forget.
    by_seen: BTreeMap<(bool, u64), SequenceHash>,
    ranks: BTreeMap<WorkerWithDpRank, RankEntry>,
    prefixes: BTreeMap<SequenceHash, PrefixEntry>,
    prefix_by_tick: BTreeMap<u64, SequenceHash>,
    clock: StackClock,
    distances: DistanceStats,
    /// Orders touches (not time: the caller's `now` is).
    tick: u64,
    counters: IndexCounters,
}

impl BlockIndex {
    /// An empty index within `bounds`, each block `block_bytes` long.
    pub fn new(bounds: IndexBounds, block_bytes: u64) -> Self {
        let bounds = IndexBounds {
            blocks_max: bounds.blocks_max.max(1),
            ranks_max: bounds.ranks_max.max(1),
            prefixes_max: bounds.prefixes_max.max(1),
            recent_distances_max: bounds.recent_distances_max.max(1),
        };
        Self {
            bounds,
            block_bytes,
            blocks: BTreeMap::new(),
            by_seen: BTreeMap::new(),
            ranks: BTreeMap::new(),
            prefixes: BTreeMap::new(),
            prefix_by_tick: BTreeMap::new(),
            clock: StackClock::new(bounds.blocks_max.max(1)),
            distances: DistanceStats::new(bounds.recent_distances_max),
            tick: 0,
            counters: IndexCounters::default(),
        }
    }

    /// Its bounds.
    pub fn bounds(&self) -> IndexBounds {
        self.bounds
    }

    /// Bytes of one block.
    pub fn block_bytes(&self) -> u64 {
        self.block_bytes
    }

    /// What it has counted.
    pub fn counters(&self) -> &IndexCounters {
        &self.counters
    }

    /// Blocks tracked.
    pub fn blocks_tracked(&self) -> usize {
        self.blocks.len()
    }

    /// Root prefixes tracked.
    pub fn prefixes_tracked(&self) -> usize {
        self.prefixes.len()
    }

    /// Worker ranks tracked.
    pub fn ranks_tracked(&self) -> usize {
        self.ranks.len()
    }

    /// Applies `event` of `worker` at time `now`. An inconsistent event is applied as far
    /// as it can be and its first anomaly returned (each is also counted); an event of a
    /// rank past `ranks_max` is refused whole.
    pub fn handle_event(
        &mut self,
        worker: WorkerId,
        event: &KvCacheEvent,
        now: u64,
    ) -> Result<(), IndexAnomaly> {
        self.counters.events += 1;
        let rank = WorkerWithDpRank {
            worker,
            dp_rank: event.dp_rank,
        };
        if !self.ranks.contains_key(&rank) && self.ranks.len() >= self.bounds.ranks_max {
            self.counters.refused_events += 1;
            return Err(IndexAnomaly::RanksMax {
                worker,
                dp_rank: event.dp_rank,
                ranks_max: self.bounds.ranks_max,
            });
        }
        let entry = self.ranks.entry(rank).or_default();
        let mut anomaly = None;
        if let Some(expected) = entry.next_event_id {
            if event.event_id != expected {
                self.counters.event_id_gaps += 1;
                anomaly = Some(IndexAnomaly::EventIdGap {
                    expected,
                    got: event.event_id,
                });
            }
        }
        entry.next_event_id = Some(event.event_id.wrapping_add(1));
        match &event.data {
            KvCacheEventData::Stored {
                parent_hash,
                blocks,
                tier,
            } => {
                self.counters.stored_events += 1;
                self.stored(rank, *parent_hash, blocks, *tier, now, &mut anomaly);
            }
            KvCacheEventData::Removed { block_hashes, tier } => {
                self.counters.removed_events += 1;
                for &block in block_hashes {
                    if self.remove_holder(block, (rank, *tier)) {
                        self.counters.removed_blocks += 1;
                    } else {
                        self.counters.unknown_removals += 1;
                        anomaly.get_or_insert(IndexAnomaly::UnknownRemoval { block, tier: *tier });
                    }
                }
            }
            KvCacheEventData::Cleared => {
                self.counters.cleared_events += 1;
                self.clear(rank);
            }
        }
        anomaly.map_or(Ok(()), Err)
    }

    fn stored(
        &mut self,
        rank: WorkerWithDpRank,
        parent_hash: Option<SequenceHash>,
        blocks: &[StoredBlock],
        tier: Tier,
        now: u64,
        anomaly: &mut Option<IndexAnomaly>,
    ) {
        // The chain's root: the parent's when the parent is known, the parent itself
        // when it is not (the earliest ancestor seen), the first block when it starts a
        // sequence.
        let root = match parent_hash {
            None => blocks.first().map(|b| b.block_hash),
            Some(parent) => Some(self.blocks.get(&parent).map_or(parent, |e| e.root)),
        };
        let mut parent = parent_hash;
        let mut accessed = Vec::new();
        for block in blocks {
            self.counters.stored_blocks += 1;
            let root = root.unwrap_or(block.block_hash);
            if self.store_one(block.block_hash, parent, root, (rank, tier), now, anomaly) {
                accessed.push(block.block_hash);
            }
            parent = Some(block.block_hash);
        }
        self.access(&accessed, rank, now);
    }

    /// One block of a `Stored`: tracked (room made), its holder added; whether the store
    /// is an access.
    fn store_one(
        &mut self,
        block: SequenceHash,
        parent: Option<SequenceHash>,
        root: SequenceHash,
        holder: Holder,
        now: u64,
        anomaly: &mut Option<IndexAnomaly>,
    ) -> bool {
        if !self.blocks.contains_key(&block) {
            self.make_room();
            self.tick += 1;
            self.by_seen.insert((false, self.tick), block);
            self.blocks.insert(
                block,
                BlockEntry {
                    parent,
                    root,
                    holders: SmallVec::new(),
                    stores: 0,
                    accesses: 0,
                    first_seen_at: now,
                    last_access_at: None,
                    last_accessor: None,
                    access_stamp: None,
                    seen_key: (false, self.tick),
                },
            );
            self.prefix_entry(root).blocks += 1;
        }
        let (rank, tier) = holder;
        let entry = self.blocks.get_mut(&block).expect("inserted above");
        entry.stores += 1;
        let access = match entry.holders.binary_search(&holder) {
            Ok(_) => {
                self.counters.duplicate_stores += 1;
                anomaly.get_or_insert(IndexAnomaly::DuplicateStore { block, tier });
                false
            }
            Err(at) => {
                let rank_holds = entry.holders.iter().any(|(r, _)| *r == rank);
                let others_hold = entry.holders.iter().any(|(r, _)| *r != rank);
                entry.holders.insert(at, holder);
                self.ranks.entry(rank).or_default().held[tier.index()].insert(block);
                let copy = rank_holds || (tier == Tier::Remote && others_hold);
                if copy {
                    self.counters.copies += 1;
                }
                !copy
            }
        };
        self.touch(block);
        access
    }

    /// One event's accesses by `rank` at `now`, chain order: distances at the lookup,
    /// then touches from the last to the first (see the module documentation). A block
    /// forgotten since its store (a bound smaller than the event) is left out.
    fn access(&mut self, blocks: &[SequenceHash], rank: WorkerWithDpRank, now: u64) {
        let distances: Vec<Option<u64>> = blocks
            .iter()
            .map(|block| {
                let stamp = self.blocks.get(block)?.access_stamp?;
                Some(self.clock.depth(stamp))
            })
            .collect();
        for block in blocks.iter().rev() {
            if self.clock.full() {
                let mut live: Vec<&mut u64> = self
                    .blocks
                    .values_mut()
                    .filter_map(|entry| entry.access_stamp.as_mut())
                    .collect();
                self.clock.compact(&mut live);
            }
            let Some(entry) = self.blocks.get_mut(block) else {
                continue;
            };
            let (stamp, _) = self.clock.access(entry.access_stamp);
            entry.access_stamp = Some(stamp);
            entry.accesses += 1;
            entry.last_access_at = Some(now);
            entry.last_accessor = Some(rank);
            let root = entry.root;
            let prefix = self.prefix_entry(root);
            prefix.accesses += 1;
            prefix.last_access_at = Some(now);
        }
        for (block, distance) in blocks.iter().zip(distances) {
            if !self.blocks.contains_key(block) {
                continue;
            }
            self.counters.accesses += 1;
            match distance {
                Some(distance) => {
                    self.counters.reuses += 1;
                    self.distances.record(distance);
                }
                None => self.counters.first_accesses += 1,
            }
        }
    }

    /// The record of root `root`, made (room made first) when missing, and touched.
    fn prefix_entry(&mut self, root: SequenceHash) -> &mut PrefixEntry {
        self.tick += 1;
        let tick = self.tick;
        if let Some(old) = self.prefixes.get(&root).map(|p| p.tick) {
            self.prefix_by_tick.remove(&old);
        } else {
            while self.prefixes.len() >= self.bounds.prefixes_max {
                let Some((_, gone)) = self.prefix_by_tick.pop_first() else {
                    break;
                };
                self.prefixes.remove(&gone);
                self.counters.prefixes_forgotten += 1;
            }
        }
        self.prefix_by_tick.insert(tick, root);
        let entry = self.prefixes.entry(root).or_insert(PrefixEntry {
            blocks: 0,
            accesses: 0,
            last_access_at: None,
            tick,
        });
        entry.tick = tick;
        entry
    }

    /// Forgets blocks until one more fits.
    fn make_room(&mut self) {
        while self.blocks.len() >= self.bounds.blocks_max {
            let Some((_, block)) = self.by_seen.pop_first() else {
                break;
            };
            self.forget(block);
        }
    }

    /// Forgets `block` (already out of `by_seen`).
    fn forget(&mut self, block: SequenceHash) {
        let Some(entry) = self.blocks.remove(&block) else {
            return;
        };
        self.counters.blocks_forgotten += 1;
        if !entry.holders.is_empty() {
            self.counters.held_blocks_forgotten += 1;
        }
        for (rank, tier) in &entry.holders {
            if let Some(held) = self.ranks.get_mut(rank) {
                held.held[tier.index()].remove(&block);
            }
        }
        if let Some(stamp) = entry.access_stamp {
            self.clock.forget(stamp);
        }
        if let Some(prefix) = self.prefixes.get_mut(&entry.root) {
            prefix.blocks = prefix.blocks.saturating_sub(1);
        }
    }

    /// Moves `block` to the most recently seen end of `by_seen`.
    fn touch(&mut self, block: SequenceHash) {
        self.tick += 1;
        let Some(entry) = self.blocks.get_mut(&block) else {
            return;
        };
        self.by_seen.remove(&entry.seen_key);
        entry.seen_key = (!entry.holders.is_empty(), self.tick);
        self.by_seen.insert(entry.seen_key, block);
    }

    /// Takes `holder` off `block`; whether it held it.
    fn remove_holder(&mut self, block: SequenceHash, holder: Holder) -> bool {
        let Some(entry) = self.blocks.get_mut(&block) else {
            return false;
        };
        let Ok(at) = entry.holders.binary_search(&holder) else {
            return false;
        };
        entry.holders.remove(at);
        if let Some(rank) = self.ranks.get_mut(&holder.0) {
            rank.held[holder.1.index()].remove(&block);
        }
        self.touch(block);
        true
    }

    /// Everything `rank` held is gone.
    fn clear(&mut self, rank: WorkerWithDpRank) {
        let Some(entry) = self.ranks.get_mut(&rank) else {
            return;
        };
        let held = std::mem::take(&mut entry.held);
        for (tier, blocks) in Tier::ALL.into_iter().zip(held) {
            for block in blocks {
                self.counters.cleared_blocks += 1;
                if let Some(entry) = self.blocks.get_mut(&block) {
                    if let Ok(at) = entry.holders.binary_search(&(rank, tier)) {
                        entry.holders.remove(at);
                    }
                }
                self.touch(block);
            }
        }
    }
}

#[cfg(test)]
mod tests;
