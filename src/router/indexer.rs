//! The block index: for every block hash, the workers (and tiers) that hold it.
//!
//! Owns: [`KvIndexer`], [`OverlapScores`], [`ApplyEventError`] and [`IndexerStats`].
//!
//! Design: a block's hash is the sequence hash of its token-hash chain (DESIGN.md,
//! Dynamo's scheme), so one block hash names a whole prefix. The index is one flat map
//! `block hash → (tokens hash, parent, holders)` plus, per worker, the set of hashes it
//! holds (for `Cleared` and `remove_worker`). A query chains the sequence hashes of its
//! token hashes as it goes and looks each one up: no tree to walk and no per-node
//! allocation. `Stored` events are checked to chain (`block_hash == chain(parent,
//! tokens_hash)`), so a stored block is found by exactly the queries it is a prefix of.
//!
//! Semantics (Dynamo's `find_matches`): a worker's score is the number of leading query
//! blocks it holds, in any tier; per tier, how many of those are best (fastest) held
//! there. Malformed or inconsistent events are counted by kind and handled as documented
//! on [`KvIndexer::apply`]; they never touch other workers' state.
//! Never: panic on input, or let hash-map order leak into results (they are sorted).

use crate::events::{KvCacheEvent, KvCacheEventData, StoredBlock};
use crate::ids::{LocalBlockHash, SequenceHash, WorkerId};
use crate::tier::Tier;
use crate::tokens::chain_sequence_hash;
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::hash_map::Entry;
use std::collections::BTreeMap;

/// One worker as the indexer knows it: engine worker id and data-parallel rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WorkerKey {
    /// The worker.
    pub worker: WorkerId,
    /// Its data-parallel rank.
    pub dp_rank: u32,
}

/// Dense index of a worker inside the indexer.
type Slot = u32;

/// A worker holding a block, with the tiers (bit per `Tier::index`) it holds it in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Holder {
    slot: Slot,
    tiers: u8,
}

/// The holders of one block. Most blocks have one holder, which fits inline.
// The box keeps this enum (and so every map entry) at 16 bytes instead of 32: the extra
// indirection is paid only by blocks that several workers share.
#[allow(clippy::box_collection)]
#[derive(Clone, Debug)]
enum Holders {
    One(Holder),
    Many(Box<Vec<Holder>>),
}

impl Holders {
    fn as_slice(&self) -> &[Holder] {
        match self {
            Holders::One(holder) => std::slice::from_ref(holder),
            Holders::Many(holders) => holders,
        }
    }

    fn find_mut(&mut self, slot: Slot) -> Option<&mut Holder> {
        match self {
            Holders::One(holder) => (holder.slot == slot).then_some(holder),
            Holders::Many(holders) => holders.iter_mut().find(|h| h.slot == slot),
        }
    }

    fn push(&mut self, holder: Holder) {
        match self {
            Holders::One(first) => *self = Holders::Many(Box::new(vec![*first, holder])),
            Holders::Many(holders) => holders.push(holder),
        }
    }

    /// Removes `slot`; returns whether no holder is left.
    fn remove(&mut self, slot: Slot) -> bool {
        match self {
            Holders::One(holder) => holder.slot == slot,
            Holders::Many(holders) => {
                holders.retain(|h| h.slot != slot);
                if let [only] = holders.as_slice() {
                    *self = Holders::One(*only);
                }
                false
            }
        }
    }

    fn heap_bytes(&self) -> usize {
        match self {
            Holders::One(_) => 0,
            Holders::Many(holders) => {
                std::mem::size_of::<Vec<Holder>>()
                    + holders.capacity() * std::mem::size_of::<Holder>()
            }
        }
    }
}

/// What the index keeps per block.
#[derive(Clone, Debug)]
struct Block {
    tokens_hash: LocalBlockHash,
    // The parent's hash; a root block stores its own hash (it cannot be its own parent:
    // the chain check would need a fixpoint of xxh3).
    parent: SequenceHash,
    holders: Holders,
}

impl Block {
    fn parent(&self, own: SequenceHash) -> Option<SequenceHash> {
        (self.parent != own).then_some(self.parent)
    }
}

#[derive(Debug, Default)]
struct WorkerState {
    key: Option<WorkerKey>,
    held: FxHashSet<SequenceHash>,
    last_event_id: Option<u64>,
}

/// An event the indexer could not apply as it stands; what it did apply is documented
/// per kind on [`KvIndexer::apply`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ApplyEventError {
    /// A `Stored` whose parent the worker does not hold: the whole event is skipped.
    #[error("stored under parent {parent:?}, which the worker does not hold")]
    ParentBlockNotFound {
        /// The missing parent.
        parent: SequenceHash,
    },
    /// A stored block whose hash is not the chain of its parent and tokens hash: it and
    /// the rest of the event are skipped (earlier blocks of the event are kept).
    #[error("block {block:?} does not chain from its parent and tokens hash")]
    ChainMismatch {
        /// The offending block.
        block: SequenceHash,
    },
    /// A `Removed` naming blocks the worker does not hold in that tier (the others of the
    /// event are removed).
    #[error("{count} removed blocks were not held")]
    BlockNotFound {
        /// How many.
        count: usize,
    },
}

/// Counters of what the indexer was fed, by outcome.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IndexerStats {
    /// Events applied fully.
    pub applied: u64,
    /// `Stored` events skipped for an unknown parent.
    pub parent_not_found: u64,
    /// Stored blocks whose hash did not chain.
    pub chain_mismatches: u64,
    /// Removed blocks that were not held.
    pub unknown_removals: u64,
    /// Stored blocks the worker already held in that tier (no change).
    pub duplicate_stores: u64,
    /// Events whose id did not follow the worker's previous one (lost or reordered).
    pub event_id_gaps: u64,
}

/// One worker's overlap with a query.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkerOverlap {
    /// The worker.
    pub worker: WorkerKey,
    /// Leading query blocks it holds, in any tier.
    pub blocks: u32,
    /// Of those, how many are held best (fastest) in each tier, by `Tier::index`.
    pub by_tier: [u32; 4],
}

/// The answer to a query: every worker holding at least the first block, sorted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OverlapScores {
    /// Per-worker overlaps, sorted by `worker`; workers that match nothing are absent.
    pub workers: Vec<WorkerOverlap>,
}

impl OverlapScores {
    /// The score of `worker` (0 if absent).
    pub fn score(&self, worker: WorkerKey) -> u32 {
        self.workers
            .iter()
            .find(|w| w.worker == worker)
            .map_or(0, |w| w.blocks)
    }

    /// The best score.
    pub fn max(&self) -> u32 {
        self.workers.iter().map(|w| w.blocks).max().unwrap_or(0)
    }
}

#[derive(Clone, Copy, Debug)]
struct Candidate {
    slot: Slot,
    blocks: u32,
    by_tier: [u32; 4],
}

/// Buffers reused between queries.
#[derive(Debug, Default)]
pub struct MatchScratch {
    active: Vec<Candidate>,
    done: Vec<WorkerOverlap>,
}

/// The block index of a cluster, fed by every worker's events.
#[derive(Debug, Default)]
pub struct KvIndexer {
    blocks: FxHashMap<SequenceHash, Block>,
    slots: Vec<WorkerState>,
    by_key: BTreeMap<WorkerKey, Slot>,
    free_slots: Vec<Slot>,
    stats: IndexerStats,
    pairs: usize,
}

fn tier_bit(tier: Tier) -> u8 {
    1 << tier.index()
}

fn fastest(tiers: u8) -> usize {
    (tiers.trailing_zeros() as usize).min(3)
}

impl KvIndexer {
    /// An empty index.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counters by outcome.
    pub fn stats(&self) -> IndexerStats {
        self.stats
    }

    /// (block, worker) pairs held.
    pub fn pairs(&self) -> usize {
        self.pairs
    }

    /// Distinct blocks held by anyone.
    pub fn distinct_blocks(&self) -> usize {
        self.blocks.len()
    }

    /// Heap bytes of the index (tables at their capacity, holder lists, per-worker sets).
    pub fn heap_bytes(&self) -> usize {
        let entry = std::mem::size_of::<(SequenceHash, Block)>() + 1;
        let set_entry = std::mem::size_of::<SequenceHash>() + 1;
        let holders: usize = self.blocks.values().map(|b| b.holders.heap_bytes()).sum();
        let sets: usize = self
            .slots
            .iter()
            .map(|s| s.held.capacity() * set_entry)
            .sum();
        self.blocks.capacity() * entry
            + holders
            + sets
            + self.slots.capacity() * std::mem::size_of::<WorkerState>()
    }

    fn slot_of(&mut self, key: WorkerKey) -> Slot {
        if let Some(&slot) = self.by_key.get(&key) {
            return slot;
        }
        let slot = match self.free_slots.pop() {
            Some(slot) => slot,
            None => {
                self.slots.push(WorkerState::default());
                (self.slots.len() - 1) as Slot
            }
        };
        self.slots[slot as usize].key = Some(key);
        self.by_key.insert(key, slot);
        slot
    }

    /// Applies one event of `worker`.
    ///
    /// - `Stored`: if the parent is given and the worker does not hold it, nothing is
    ///   applied (`ParentBlockNotFound`, as Dynamo does). Otherwise blocks are added in
    ///   order until one does not chain from the previous (`ChainMismatch`: it and the rest
    ///   are skipped). Storing a block again in the same tier changes nothing.
    /// - `Removed`: every named block the worker holds in that tier leaves that tier; the
    ///   others are counted (`BlockNotFound`).
    /// - `Cleared`: the worker holds nothing afterwards, in any tier.
    ///
    /// An event id that does not follow the worker's previous one is counted as a gap;
    /// the event is still applied.
    pub fn apply(&mut self, worker: WorkerId, event: &KvCacheEvent) -> Result<(), ApplyEventError> {
        let slot = self.slot_of(WorkerKey {
            worker,
            dp_rank: event.dp_rank,
        });
        let state = &mut self.slots[slot as usize];
        if state
            .last_event_id
            .is_some_and(|last| event.event_id != last.wrapping_add(1))
        {
            self.stats.event_id_gaps += 1;
        }
        state.last_event_id = Some(event.event_id);
        let result = match &event.data {
            KvCacheEventData::Stored {
                parent_hash,
                blocks,
                tier,
            } => self.store(slot, *parent_hash, blocks, *tier),
            KvCacheEventData::Removed { block_hashes, tier } => {
                self.remove(slot, block_hashes, *tier)
            }
            KvCacheEventData::Cleared => {
                self.clear(slot);
                Ok(())
            }
        };
        if result.is_ok() {
            self.stats.applied += 1;
        }
        result
    }

    fn store(
        &mut self,
        slot: Slot,
        parent: Option<SequenceHash>,
        blocks: &[StoredBlock],
        tier: Tier,
    ) -> Result<(), ApplyEventError> {
        if let Some(parent) = parent {
            if !self.slots[slot as usize].held.contains(&parent) {
                self.stats.parent_not_found += 1;
                return Err(ApplyEventError::ParentBlockNotFound { parent });
            }
        }
        let bit = tier_bit(tier);
        let mut previous = parent;
        for block in blocks {
            let hash = block.block_hash;
            if chain_sequence_hash(previous, block.tokens_hash) != hash {
                self.stats.chain_mismatches += 1;
                return Err(ApplyEventError::ChainMismatch { block: hash });
            }
            let parent_field = previous.unwrap_or(hash);
            previous = Some(hash);
            let added = match self.blocks.entry(hash) {
                Entry::Vacant(vacant) => {
                    let holders = Holders::One(Holder { slot, tiers: bit });
                    vacant.insert(Block {
                        tokens_hash: block.tokens_hash,
                        parent: parent_field,
                        holders,
                    });
                    true
                }
                Entry::Occupied(mut occupied) => match occupied.get_mut().holders.find_mut(slot) {
                    Some(holder) if holder.tiers & bit != 0 => {
                        self.stats.duplicate_stores += 1;
                        false
                    }
                    Some(holder) => {
                        holder.tiers |= bit;
                        false
                    }
                    None => {
                        occupied.get_mut().holders.push(Holder { slot, tiers: bit });
                        true
                    }
                },
            };
            if added {
                self.slots[slot as usize].held.insert(hash);
                self.pairs += 1;
            }
        }
        Ok(())
    }

    fn remove(
        &mut self,
        slot: Slot,
        hashes: &[SequenceHash],
        tier: Tier,
    ) -> Result<(), ApplyEventError> {
        let bit = tier_bit(tier);
        let mut missing = 0;
        for hash in hashes {
            let Some(block) = self.blocks.get_mut(hash) else {
                missing += 1;
                continue;
            };
            let Some(holder) = block.holders.find_mut(slot).filter(|h| h.tiers & bit != 0) else {
                missing += 1;
                continue;
            };
            holder.tiers &= !bit;
            if holder.tiers == 0 {
                if block.holders.remove(slot) {
                    self.blocks.remove(hash);
                }
                self.slots[slot as usize].held.remove(hash);
                self.pairs -= 1;
            }
        }
        if missing > 0 {
            self.stats.unknown_removals += missing as u64;
            return Err(ApplyEventError::BlockNotFound { count: missing });
        }
        Ok(())
    }

    fn clear(&mut self, slot: Slot) {
        let held = std::mem::take(&mut self.slots[slot as usize].held);
        for hash in &held {
            if let Some(block) = self.blocks.get_mut(hash) {
                if block.holders.remove(slot) {
                    self.blocks.remove(hash);
                }
            }
        }
        self.pairs -= held.len();
    }

    /// Forgets `worker` (every dp rank): its blocks and its event-id history.
    pub fn remove_worker(&mut self, worker: WorkerId) {
        let range = WorkerKey { worker, dp_rank: 0 }..=WorkerKey {
            worker,
            dp_rank: u32::MAX,
        };
        let keys: Vec<WorkerKey> = self.by_key.range(range).map(|(key, _)| *key).collect();
        for key in keys {
            if let Some(slot) = self.by_key.remove(&key) {
                self.clear(slot);
                self.slots[slot as usize] = WorkerState::default();
                self.free_slots.push(slot);
            }
        }
    }

    /// Per-worker overlap of a query given as token hashes, one per full block. With
    /// `early_exit`, the walk stops once at most one worker still matches (its score is
    /// then a lower bound); otherwise every score is exact.
    pub fn find_matches(&self, query: &[LocalBlockHash], early_exit: bool) -> OverlapScores {
        let workers = self
            .find_matches_with(query, early_exit, &mut MatchScratch::default())
            .to_vec();
        OverlapScores { workers }
    }

    /// [`KvIndexer::find_matches`] into `scratch`, which keeps its buffers between
    /// queries: the hot path allocates nothing. The overlaps are sorted by worker.
    pub fn find_matches_with<'s>(
        &self,
        query: &[LocalBlockHash],
        early_exit: bool,
        scratch: &'s mut MatchScratch,
    ) -> &'s [WorkerOverlap] {
        let MatchScratch { active, done } = scratch;
        active.clear();
        done.clear();
        let mut previous = None;
        for (position, tokens_hash) in query.iter().enumerate() {
            let hash = chain_sequence_hash(previous, *tokens_hash);
            previous = Some(hash);
            let holders = self
                .blocks
                .get(&hash)
                .map_or(&[][..], |b| b.holders.as_slice());
            if position == 0 {
                active.extend(holders.iter().map(|h| Candidate {
                    slot: h.slot,
                    blocks: 0,
                    by_tier: [0; 4],
                }));
            }
            let mut index = 0;
            while index < active.len() {
                let candidate = &mut active[index];
                match holders.iter().find(|h| h.slot == candidate.slot) {
                    Some(holder) => {
                        candidate.blocks += 1;
                        candidate.by_tier[fastest(holder.tiers)] += 1;
                        index += 1;
                    }
                    None => {
                        let out = active.swap_remove(index);
                        done.push(self.overlap(out));
                    }
                }
            }
            if active.is_empty() || (early_exit && active.len() <= 1) {
                break;
            }
        }
        done.extend(active.drain(..).map(|candidate| self.overlap(candidate)));
        done.sort_unstable_by_key(|w| w.worker);
        done
    }

    fn overlap(&self, candidate: Candidate) -> WorkerOverlap {
        let worker = self.slots[candidate.slot as usize]
            .key
            .expect("a holder's slot names a worker");
        WorkerOverlap {
            worker,
            blocks: candidate.blocks,
            by_tier: candidate.by_tier,
        }
    }

    /// The index as events that rebuild it on an empty indexer: per worker (sorted), one
    /// `Stored` per block and tier, every parent before its children, numbered from 0.
    /// A block the worker holds without its parent is left out: no query can reach it,
    /// so the rebuilt index gives the same answers.
    pub fn dump(&self) -> Vec<(WorkerKey, KvCacheEvent)> {
        let mut out = Vec::new();
        for (key, slot) in &self.by_key {
            let held = &self.slots[*slot as usize].held;
            let mut ordered: Vec<(u32, SequenceHash)> =
                held.iter().map(|hash| (self.depth(*hash), *hash)).collect();
            ordered.sort_unstable();
            let mut emitted: FxHashSet<SequenceHash> = FxHashSet::default();
            let mut event_id = 0;
            for (_, hash) in ordered {
                let block = &self.blocks[&hash];
                let parent = block.parent(hash);
                if parent.is_some_and(|p| !emitted.contains(&p)) {
                    continue;
                }
                emitted.insert(hash);
                let tiers = block
                    .holders
                    .as_slice()
                    .iter()
                    .find(|h| h.slot == *slot)
                    .map_or(0, |h| h.tiers);
                for tier in Tier::ALL.into_iter().filter(|t| tiers & tier_bit(*t) != 0) {
                    let blocks = vec![StoredBlock {
                        block_hash: hash,
                        tokens_hash: block.tokens_hash,
                    }];
                    let data = KvCacheEventData::Stored {
                        parent_hash: parent,
                        blocks,
                        tier,
                    };
                    out.push((
                        *key,
                        KvCacheEvent {
                            event_id,
                            dp_rank: key.dp_rank,
                            data,
                        },
                    ));
                    event_id += 1;
                }
            }
        }
        out
    }

    /// Distance from the root along stored parents (a parent no longer indexed ends it).
    fn depth(&self, mut hash: SequenceHash) -> u32 {
        let mut depth = 0;
        while let Some(parent) = self.blocks.get(&hash).and_then(|b| b.parent(hash)) {
            depth += 1;
            hash = parent;
        }
        depth
    }
}

#[cfg(test)]
mod tests;
