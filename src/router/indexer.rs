//! The block index: for every block hash, the workers (and tiers) that hold it.
//!
//! Owns: [`KvIndexer`], [`OverlapScores`], [`ApplyEventError`] and [`IndexerStats`];
//! the memory budget ([`IndexBudget`], eviction) is in [`budget`].
//!
//! Design: a block's hash is the sequence hash of its token-hash chain (DESIGN.md,
//! Dynamo's scheme), so one block hash names a whole prefix. The index is a compressed
//! radix tree over token hashes ([`tree`]): a node is a run of blocks with no branch and
//! one set of holders, so a query compares token hashes in a contiguous array and pays a
//! lookup only at branch points and holder changes, and computes no hash at all. One map
//! `block hash → (run, depth)` serves removals and parents. `Stored` events are checked
//! to chain (`block_hash == chain(parent, tokens_hash)`), so a stored block sits where
//! exactly the queries it is a prefix of find it, and equal paths mean equal hashes.
//!
//! Semantics (Dynamo's `find_matches`): a worker's score is the number of leading query
//! blocks it holds, in any tier; per tier, how many of those are best (fastest) held
//! there. Malformed or inconsistent events are counted by kind and handled as documented
//! on [`KvIndexer::apply`]; they never touch other workers' state.
//! Never: panic on input, or let hash-map order leak into results (they are sorted).

use crate::events::{KvCacheEvent, KvCacheEventData, StoredBlock};
use crate::ids::{LocalBlockHash, SequenceHash, WorkerId, WorkerWithDpRank};
use crate::tier::Tier;
use crate::tokens::chain_sequence_hash;
use budget::Recency;
pub use budget::{IndexBudget, WorkerIndexStats};
use std::collections::BTreeMap;
use tree::{BlockTree, Holder, HolderChange, NodeBlock, NodeId, ROOT};
use walk::Walk;

mod budget;
mod tree;
mod walk;

/// Dense index of a worker inside the indexer.
type Slot = u32;

#[derive(Debug, Default)]
struct WorkerState {
    key: Option<WorkerWithDpRank>,
    last_event_id: Option<u64>,
    /// Its eviction counters (`blocks` unused: the tree counts what it holds).
    index: WorkerIndexStats,
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
    /// More worker ranks than the index can name (2^28): the event is not applied.
    #[error("too many worker ranks for the index")]
    TooManyWorkers,
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
    /// Blocks evicted from a worker's view by the budget (never without one).
    pub evicted_blocks: u64,
    /// Removed blocks not held because the budget had evicted them (not counted in
    /// `unknown_removals`).
    pub evicted_removals: u64,
    /// `Stored` events skipped because the budget had evicted their parent (not counted
    /// in `parent_not_found`).
    pub stored_under_evicted: u64,
}

impl IndexerStats {
    /// Blocks and events refused as malformed or inconsistent (unknown parents, chain
    /// mismatches, removals of blocks not held): zero on a well-formed stream.
    pub fn rejections(&self) -> u64 {
        self.parent_not_found + self.chain_mismatches + self.unknown_removals
    }
}

/// One worker's overlap with a query.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkerOverlap {
    /// The worker.
    pub worker: WorkerWithDpRank,
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
    pub fn score(&self, worker: WorkerWithDpRank) -> u32 {
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
    /// With at most [`RANKED_SLOTS`] slots: the (blocks, by_tier) values candidates
    /// dropped with (all the slots a run drops share one), and each worker's, by its
    /// rank in key order.
    groups: Vec<(u32, [u32; 4])>,
    group_of_rank: Vec<u8>,
}

/// Where a query's dropped candidates go: by rank (a bit set and a group each) when the
/// slots are few enough, else into `done`, sorted at the end.
struct Dropped<'s> {
    ranked: Option<Ranked<'s>>,
    done: &'s mut Vec<WorkerOverlap>,
}

/// A query's dropped candidates by the rank of their key.
struct Ranked<'s> {
    groups: &'s mut Vec<(u32, [u32; 4])>,
    group_of_rank: &'s mut [u8],
    /// Bit `r`: the worker of rank `r` dropped, with `groups[group_of_rank[r]]`.
    present: u64,
}

/// Up to this many worker slots, a query's overlaps come out in key order from a bit
/// set (no sort: sorting a dozen overlaps cost as much as the walk itself).
const RANKED_SLOTS: usize = 64;

/// The live slots numbered in key order, kept while there are at most [`RANKED_SLOTS`].
#[derive(Debug, Default)]
struct Ranks {
    rank_of_slot: Vec<u8>,
    key_of_rank: Vec<WorkerWithDpRank>,
}

/// The block index of a cluster, fed by every worker's events.
#[derive(Debug, Default)]
pub struct KvIndexer {
    tree: BlockTree,
    slots: Vec<WorkerState>,
    by_key: BTreeMap<WorkerWithDpRank, Slot>,
    /// Valid while `slots.len() <= RANKED_SLOTS`.
    ranks: Ranks,
    free_slots: Vec<Slot>,
    stats: IndexerStats,
    budget: IndexBudget,
    /// Recency and eviction state: `Some` exactly when the budget sets a cap.
    recency: Option<Box<Recency>>,
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
        self.tree.pairs()
    }

    /// Distinct blocks in the index (held by someone, or on the path to such a block).
    pub fn distinct_blocks(&self) -> usize {
        self.tree.distinct_blocks()
    }

    /// Times the block-position table was rebuilt to shed the tombstones removals leave.
    pub fn position_rebuilds(&self) -> u64 {
        self.tree.location_rebuilds()
    }

    /// Runs (tree nodes) in the index: how compressed it is.
    pub fn runs(&self) -> usize {
        self.tree.live_nodes() - 1
    }

    /// Heap bytes of the index: the tree and its hash map at their capacity, and the
    /// worker table.
    pub fn heap_bytes(&self) -> usize {
        self.tree.heap_bytes()
            + self.recency_heap_bytes()
            + self.slots.capacity() * std::mem::size_of::<WorkerState>()
            + self.by_key.len() * (std::mem::size_of::<(WorkerWithDpRank, Slot)>() + 8)
            + self.ranks.rank_of_slot.capacity()
            + self.ranks.key_of_rank.capacity() * std::mem::size_of::<WorkerWithDpRank>()
    }

    fn slot_of(&mut self, key: WorkerWithDpRank) -> Result<Slot, ApplyEventError> {
        if let Some(&slot) = self.by_key.get(&key) {
            return Ok(slot);
        }
        let slot = match self.free_slots.pop() {
            Some(slot) => slot,
            None if self.slots.len() as u64 > u64::from(Holder::MAX_SLOT) => {
                return Err(ApplyEventError::TooManyWorkers);
            }
            None => {
                self.slots.push(WorkerState::default());
                (self.slots.len() - 1) as Slot
            }
        };
        self.slots[slot as usize].key = Some(key);
        self.by_key.insert(key, slot);
        self.rank_slots();
        Ok(slot)
    }

    /// Numbers the live slots in key order (after a key came or went; O(workers)).
    fn rank_slots(&mut self) {
        if self.slots.len() > RANKED_SLOTS {
            return;
        }
        let Ranks {
            rank_of_slot,
            key_of_rank,
        } = &mut self.ranks;
        rank_of_slot.resize(self.slots.len(), 0);
        key_of_rank.clear();
        for (rank, (key, slot)) in self.by_key.iter().enumerate() {
            rank_of_slot[*slot as usize] = rank as u8;
            key_of_rank.push(*key);
        }
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
        let slot = self.slot_of(WorkerWithDpRank {
            worker,
            dp_rank: event.dp_rank,
        })?;
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
            } => {
                let result = self.store(slot, *parent_hash, blocks, *tier);
                // A partly refused chain keeps (and counts) what it stored.
                self.after_store(slot, blocks);
                result
            }
            KvCacheEventData::Removed { block_hashes, tier } => {
                self.remove(slot, block_hashes, *tier)
            }
            KvCacheEventData::Cleared => {
                self.tree.remove_slot(slot);
                if let Some(recency) = self.recency.as_mut() {
                    recency.forget(slot);
                }
                Ok(())
            }
        };
        if result.is_ok() {
            self.stats.applied += 1;
        }
        result
    }

    /// Walks down the tree along the stored chain: blocks the tree has gain the holder
    /// one run at a time, and the first block it lacks starts (or extends) a run with the
    /// rest. The chain is verified as it goes, so equal token paths mean equal hashes.
    fn store(
        &mut self,
        slot: Slot,
        parent: Option<SequenceHash>,
        blocks: &[StoredBlock],
        tier: Tier,
    ) -> Result<(), ApplyEventError> {
        let bit = tier_bit(tier);
        // The block the next one hangs off: None is the root.
        let mut at: Option<(NodeId, usize)> = None;
        if let Some(parent) = parent {
            match self.tree.locate(parent) {
                Some(found) if self.tree.node(found.0).holder(slot).is_some() => at = Some(found),
                _ if self.was_evicted(slot, parent) => {
                    self.skip_under_evicted(slot, blocks);
                    return Ok(());
                }
                _ => {
                    self.stats.parent_not_found += 1;
                    return Err(ApplyEventError::ParentBlockNotFound { parent });
                }
            }
        }
        let mut previous = parent;
        let mut next = 0;
        while next < blocks.len() {
            // Where would blocks[next] be if the tree had it?
            let tokens_hash = blocks[next].tokens_hash;
            let existing = match at {
                None => self.tree.node(ROOT).child(tokens_hash).map(|c| (c, 0)),
                Some((id, offset)) => {
                    let node = self.tree.node(id);
                    if offset + 1 < node.len() {
                        (node.blocks.token(offset + 1) == tokens_hash).then_some((id, offset + 1))
                    } else {
                        node.child(tokens_hash).map(|c| (c, 0))
                    }
                }
            };
            let Some((id, start)) = existing else {
                return self.store_new(slot, bit, at, previous, &blocks[next..]);
            };
            // The longest stretch of blocks the event shares with this run.
            let node = self.tree.node(id);
            let (run_tokens, run_hashes) = (node.blocks.tokens(), node.blocks.hashes());
            let mut end = start;
            let mut mismatch = None;
            while next < blocks.len()
                && end < run_tokens.len()
                && run_tokens[end] == blocks[next].tokens_hash.get()
            {
                let block = &blocks[next];
                // The tree's block was verified when it came in: its hash is the chain
                // of the block above it (here `previous`, which the walk has checked all
                // the way down) and these tokens. So the event chains exactly when it
                // names the same hash, and an equality test saves hashing every block
                // that a worker stores again under a prefix the tree has.
                let chains = run_hashes[end] == block.block_hash.get();
                debug_assert_eq!(
                    chains,
                    chain_sequence_hash(previous, block.tokens_hash) == block.block_hash
                );
                if !chains {
                    mismatch = Some(block.block_hash);
                    break;
                }
                previous = Some(block.block_hash);
                end += 1;
                next += 1;
            }
            if end > start {
                self.add_holder(id, start, end, slot, bit);
            }
            if let Some(block) = mismatch {
                self.stats.chain_mismatches += 1;
                return Err(ApplyEventError::ChainMismatch { block });
            }
            if next == blocks.len() {
                // Nothing left to hang: the probe below would find a place for nothing.
                break;
            }
            // The re-tag may have split the run: find the last block where it now is.
            at = previous.and_then(|hash| self.tree.locate(hash));
        }
        Ok(())
    }

    /// Adds blocks the tree does not have, verifying the chain; stops at the first that
    /// does not chain.
    fn store_new(
        &mut self,
        slot: Slot,
        bit: u8,
        at: Option<(NodeId, usize)>,
        mut previous: Option<SequenceHash>,
        blocks: &[StoredBlock],
    ) -> Result<(), ApplyEventError> {
        // One pass: each block is verified as the tree takes it.
        let mut mismatch = None;
        let verified = blocks.iter().map_while(|block| {
            if chain_sequence_hash(previous, block.tokens_hash) != block.block_hash {
                mismatch = Some(block.block_hash);
                return None;
            }
            previous = Some(block.block_hash);
            Some(NodeBlock {
                tokens_hash: block.tokens_hash,
                block_hash: block.block_hash,
            })
        });
        let added = self
            .tree
            .append(at, Holder::new(slot, bit), verified, blocks.len());
        if mismatch.is_none() && added < blocks.len() {
            // The tree refused a verified block: its hash is already elsewhere.
            mismatch = Some(blocks[added].block_hash);
        }
        match mismatch {
            Some(block) => {
                self.stats.chain_mismatches += 1;
                Err(ApplyEventError::ChainMismatch { block })
            }
            None => Ok(()),
        }
    }

    /// `slot` gains tier `bit` on blocks `lo..hi` of run `id`.
    fn add_holder(&mut self, id: NodeId, lo: usize, hi: usize, slot: Slot, bit: u8) {
        let node = self.tree.node(id);
        let tiers = node.holder(slot).map_or(0, |h| h.tiers());
        if tiers & bit != 0 {
            self.stats.duplicate_stores += (hi - lo) as u64;
            return;
        }
        let change = HolderChange {
            slot,
            tiers: tiers | bit,
        };
        self.tree.retag(id, lo, hi, change);
    }

    fn remove(
        &mut self,
        slot: Slot,
        hashes: &[SequenceHash],
        tier: Tier,
    ) -> Result<(), ApplyEventError> {
        let bit = tier_bit(tier);
        let mut missing = 0;
        let mut next = 0;
        while next < hashes.len() {
            let hash = hashes[next];
            let found = self.tree.locate(hash);
            next += 1;
            let Some((id, offset)) = found else {
                if !self.removal_of_evicted(slot, hash) {
                    missing += 1;
                }
                continue;
            };
            let node = self.tree.node(id);
            let tiers = node.holder(slot).map_or(0, |h| h.tiers());
            if tiers & bit == 0 {
                // Held in other tiers only: still an evicted block, if it was evicted
                // and stored again since.
                if !self.removal_of_evicted(slot, hash) {
                    missing += 1;
                }
                continue;
            }
            // Removals list leaves first: take the neighbours in the same run at once,
            // recognised in the run itself (block hashes are unique), without a probe.
            let (mut lo, mut hi) = (offset, offset + 1);
            let run = node.blocks.hashes();
            while let Some(hash) = hashes.get(next) {
                if lo > 0 && run[lo - 1] == hash.get() {
                    lo -= 1;
                } else if run.get(hi) == Some(&hash.get()) {
                    hi += 1;
                } else {
                    break;
                }
                next += 1;
            }
            // Under a budget, the block above what the worker no longer holds may be a
            // new leaf of it: queue it (checked when popped).
            let candidate = (self.recency.is_some() && tiers & !bit == 0)
                .then(|| {
                    if lo > 0 {
                        Some(node.blocks.hash(lo - 1))
                    } else {
                        let parent = self.tree.node(node.parent);
                        (node.parent != ROOT).then(|| parent.blocks.hash(parent.len() - 1))
                    }
                })
                .flatten();
            // Under a budget, what the worker still holds below blocks it no longer holds
            // at all is dropped with them (`drop_orphans_below`): the view stays
            // prefix-closed.
            let orphans = (self.recency.is_some()
                && tiers & !bit == 0
                && (hi < node.len() || self.tree.has_child_held_by(id, slot)))
            .then(|| (node.blocks.hash(hi - 1), node.blocks.get_hash(hi)));
            let stamp = self.tree.stamp(id);
            let change = HolderChange {
                slot,
                tiers: tiers & !bit,
            };
            self.tree.retag(id, lo, hi, change);
            if let Some(hash) = candidate {
                self.queue_candidate(slot, stamp, hash);
            }
            if let Some((last_removed, next_in_run)) = orphans {
                self.drop_orphans_below(slot, last_removed, next_in_run);
            }
        }
        if missing > 0 {
            self.stats.unknown_removals += missing as u64;
            return Err(ApplyEventError::BlockNotFound { count: missing });
        }
        Ok(())
    }

    /// Every block `worker` holds, with the tiers it holds it in (bit `Tier::index`): the
    /// router's view of one worker, to compare with the worker's own pools. O(index).
    pub fn blocks_of(&self, worker: WorkerWithDpRank) -> BTreeMap<SequenceHash, u8> {
        let mut out = BTreeMap::new();
        let Some(&slot) = self.by_key.get(&worker) else {
            return out;
        };
        for node in self.tree.live() {
            if let Some(holder) = node.holder(slot) {
                out.extend(node.blocks.hashes_of(..).map(|b| (b, holder.tiers())));
            }
        }
        out
    }

    /// [`KvIndexer::blocks_of`] for every worker at once, in one walk of the tree (a check
    /// of every worker's view would otherwise walk the whole tree once per worker): each
    /// worker's blocks sorted by hash, with their tiers.
    pub fn blocks_by_worker(&self) -> BTreeMap<WorkerWithDpRank, Vec<(SequenceHash, u8)>> {
        let mut by_slot: BTreeMap<Slot, Vec<(SequenceHash, u8)>> = BTreeMap::new();
        for node in self.tree.live() {
            for holder in node.holders.iter() {
                let blocks = by_slot.entry(holder.slot()).or_default();
                blocks.extend(node.blocks.hashes_of(..).map(|b| (b, holder.tiers())));
            }
        }
        self.by_key
            .iter()
            .map(|(key, slot)| {
                let mut blocks = by_slot.remove(slot).unwrap_or_default();
                blocks.sort_unstable();
                (*key, blocks)
            })
            .collect()
    }

    /// Forgets `worker` (every dp rank): its blocks and its event-id history.
    pub fn remove_worker(&mut self, worker: WorkerId) {
        let range = WorkerWithDpRank { worker, dp_rank: 0 }..=WorkerWithDpRank {
            worker,
            dp_rank: u32::MAX,
        };
        let keys: Vec<WorkerWithDpRank> = self.by_key.range(range).map(|(key, _)| *key).collect();
        for key in keys {
            self.remove_rank(key);
        }
    }

    /// Forgets one rank of a worker: its blocks and its event-id history (the engine
    /// serving that rank restarted; the worker's other ranks are untouched).
    pub fn remove_rank(&mut self, key: WorkerWithDpRank) {
        if let Some(slot) = self.by_key.remove(&key) {
            self.tree.remove_slot(slot);
            if let Some(recency) = self.recency.as_mut() {
                recency.forget(slot);
            }
            self.slots[slot as usize] = WorkerState::default();
            self.free_slots.push(slot);
            self.rank_slots();
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
    ///
    /// The walk goes run by run: compare the run's token hashes with the query's, credit
    /// the matched length to every candidate still in the run's holders, drop the others
    /// with their score so far, and follow the child that starts with the next query
    /// block.
    pub fn find_matches_with<'s>(
        &self,
        query: &[LocalBlockHash],
        early_exit: bool,
        scratch: &'s mut MatchScratch,
    ) -> &'s [WorkerOverlap] {
        let MatchScratch {
            active,
            done,
            groups,
            group_of_rank,
        } = scratch;
        active.clear();
        let ranked = self.slots.len() <= RANKED_SLOTS;
        if !ranked {
            done.clear();
        }
        let mut out = Dropped {
            ranked: ranked.then(|| {
                groups.clear();
                group_of_rank.resize(RANKED_SLOTS, 0);
                Ranked {
                    groups,
                    group_of_rank,
                    present: 0,
                }
            }),
            done,
        };
        // Candidates live in a bit mask while every run's holders fit one (`HolderMask`):
        // all of them then share `depth` and `by_tier`, and a dropped one keeps the
        // values of the moment it dropped. The first run that does not fit moves them to
        // the `active` list, which works for any holders.
        let mut in_mask = true;
        let mut mask = 0u64;
        let mut depth = 0u32;
        let mut by_tier = [0u32; 4];
        for step in Walk::new(&self.tree, query) {
            let node = step.node;
            let matched = step.matched as u32;
            if in_mask && node.mask.exact {
                if step.start == 0 {
                    mask = node.mask.slots;
                }
                self.emit_mask(mask & !node.mask.slots, depth, by_tier, &mut out);
                mask &= node.mask.slots;
                depth += matched;
                by_tier[fastest(node.mask.tiers)] += matched;
            } else {
                if in_mask {
                    in_mask = false;
                    if step.start == 0 {
                        active.extend(node.holders.iter().map(|h| Candidate {
                            slot: h.slot(),
                            blocks: 0,
                            by_tier: [0; 4],
                        }));
                    } else {
                        while mask != 0 {
                            let slot = mask.trailing_zeros();
                            mask &= mask - 1;
                            active.push(Candidate {
                                slot,
                                blocks: depth,
                                by_tier,
                            });
                        }
                    }
                }
                // Both lists are sorted by slot: one merge pass.
                let holders = &node.holders;
                let mut h = 0;
                let mut index = 0;
                while index < active.len() {
                    let slot = active[index].slot;
                    while h < holders.len() && holders[h].slot() < slot {
                        h += 1;
                    }
                    if h < holders.len() && holders[h].slot() == slot {
                        let candidate = &mut active[index];
                        candidate.blocks += matched;
                        candidate.by_tier[fastest(holders[h].tiers())] += matched;
                        index += 1;
                    } else {
                        let dropped = active.remove(index);
                        self.emit(dropped, &mut out);
                    }
                }
            }
            let left = if in_mask {
                mask.count_ones() as usize
            } else {
                active.len()
            };
            if left == 0 || (early_exit && left <= 1) {
                break;
            }
        }
        if in_mask {
            self.emit_mask(mask, depth, by_tier, &mut out);
        }
        for candidate in active.drain(..) {
            self.emit(candidate, &mut out);
        }
        let Dropped { ranked, done } = out;
        match ranked {
            Some(Ranked {
                groups,
                group_of_rank,
                present,
            }) => {
                // The last query's answer is overwritten field by field, and grown (by
                // copies of a first overlap) only when this one is longer. Pushing built
                // each overlap on the stack and copied it in with a 16-byte load across
                // the edge of the smaller stores just before it, which the CPU cannot
                // forward: a stall on every overlap, half of this function's samples on
                // peer-bench's synthetic file.
                let answers = present.count_ones() as usize;
                done.truncate(answers);
                if done.len() < answers {
                    let first = WorkerOverlap {
                        worker: self.ranks.key_of_rank[present.trailing_zeros() as usize],
                        blocks: 0,
                        by_tier: [0; 4],
                    };
                    done.resize(answers, first);
                }
                let mut left = present;
                for overlap in done.iter_mut() {
                    let rank = left.trailing_zeros() as usize;
                    left &= left - 1;
                    let group = &groups[group_of_rank[rank] as usize];
                    overlap.worker = self.ranks.key_of_rank[rank];
                    overlap.blocks = group.0;
                    overlap.by_tier = group.1;
                }
            }
            None => done.sort_unstable_by_key(|w| w.worker),
        }
        done
    }

    /// Records every slot of `mask` as matching `depth` blocks, `by_tier` of them.
    fn emit_mask(&self, mut mask: u64, depth: u32, by_tier: [u32; 4], out: &mut Dropped<'_>) {
        if mask == 0 {
            return;
        }
        let Some(ranked) = &mut out.ranked else {
            while mask != 0 {
                let slot = mask.trailing_zeros();
                mask &= mask - 1;
                out.done.push(self.overlap(Candidate {
                    slot,
                    blocks: depth,
                    by_tier,
                }));
            }
            return;
        };
        // Every slot of one run's drop shares one group (at most one per slot in all).
        let group = ranked.groups.len() as u8;
        ranked.groups.push((depth, by_tier));
        while mask != 0 {
            let slot = mask.trailing_zeros();
            mask &= mask - 1;
            let rank = self.ranks.rank_of_slot[slot as usize];
            ranked.group_of_rank[rank as usize] = group;
            ranked.present |= 1 << rank;
        }
    }

    /// Records a candidate's final overlap: by rank when the slots are few enough, else
    /// as an overlap to sort at the end.
    fn emit(&self, candidate: Candidate, out: &mut Dropped<'_>) {
        match &mut out.ranked {
            Some(ranked) => {
                let rank = self.ranks.rank_of_slot[candidate.slot as usize];
                ranked.group_of_rank[rank as usize] = ranked.groups.len() as u8;
                ranked.groups.push((candidate.blocks, candidate.by_tier));
                ranked.present |= 1 << rank;
            }
            None => out.done.push(self.overlap(candidate)),
        }
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
    /// `Stored` per run and tier, every parent before its children (children in tokens
    /// hash order), numbered from 0. A run the worker holds without holding its parent
    /// is left out: no query can reach it, so the rebuilt index gives the same answers.
    pub fn dump(&self) -> Vec<(WorkerWithDpRank, KvCacheEvent)> {
        let mut out = Vec::new();
        for (key, slot) in &self.by_key {
            let mut event_id = 0;
            // Depth-first, children in reverse order on the stack so they pop in order.
            let mut stack: Vec<NodeId> = self
                .tree
                .node(ROOT)
                .sorted_children()
                .into_iter()
                .rev()
                .map(|(_, id)| id)
                .collect();
            while let Some(id) = stack.pop() {
                let node = self.tree.node(id);
                let Some(holder) = node.holder(*slot) else {
                    continue;
                };
                let parent = (node.parent != ROOT).then(|| {
                    let parent = self.tree.node(node.parent);
                    parent.blocks.hash(parent.len() - 1)
                });
                for tier in Tier::ALL
                    .into_iter()
                    .filter(|t| holder.tiers() & tier_bit(*t) != 0)
                {
                    let blocks = node
                        .blocks
                        .iter()
                        .map(|b| StoredBlock {
                            block_hash: b.block_hash,
                            tokens_hash: b.tokens_hash,
                        })
                        .collect();
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
                stack.extend(node.sorted_children().into_iter().rev().map(|(_, id)| id));
            }
        }
        out
    }

    #[cfg(test)]
    fn check_invariants(&self) {
        self.tree.check_invariants();
    }
}

#[cfg(test)]
mod budget_tests;
#[cfg(test)]
mod tests;
