//! The index's memory budget: caps on blocks, and which blocks leave when a cap is hit.
//!
//! Owns: [`IndexBudget`], [`WorkerIndexStats`], and the bookkeeping behind eviction
//! (`Recency`: per worker a queue of leaf candidates, the index's clock, and a bounded
//! memory of what was evicted).
//!
//! Policy: routing is a hint, so the router may forget what a worker holds; an evicted
//! entry costs a cache miss, never a wrong answer. When a store leaves a worker above
//! `max_blocks_per_worker`, that worker's least recently stored or matched *leaves* go
//! (blocks it holds with no child it holds), a run's tail first: what it keeps stays
//! prefix-closed, so a later `Stored` under a surviving parent still chains. When the
//! index holds more than `max_blocks` distinct blocks, the worker holding the most loses
//! its leaves the same way: a flooding worker cannot push everyone else's view out.
//!
//! Recency is kept per run (one stamp for all holders; a store or a match stamps the
//! run and its whole path, since both used the prefix), and each worker's candidates
//! sit in a queue in the order they became leaves. Eviction pops the front; a candidate
//! whose run was stamped since it was queued goes to the back with the new stamp (a
//! second chance, CLOCK-style: approximately least recently used, in O(1) amortised per
//! block). Candidates that are no longer leaves of that worker are dropped when popped;
//! should the queue run dry while the worker is still over its cap, it is rebuilt from a
//! scan of the tree (sorted, so the order never depends on a hash map).
//!
//! An event about a block the index evicted is not an error: a removal of it is counted
//! as `evicted_removals`, a store under it as `stored_under_evicted` (skipped, and its
//! blocks count as evicted too). That needs the evicted hashes, so each worker remembers
//! its last `evicted_remembered_per_worker`; an event about one evicted earlier is
//! counted as unknown, as before budgets.
//!
//! Never: evict without a cap set (an unbounded index behaves exactly as before and
//! keeps no recency), evict a block a worker still holds a child of, or let a queue grow
//! past twice the blocks its worker holds (it is compacted).

use super::tree::{HolderChange, NodeId, ROOT};
use super::walk::Walk;
use super::Slot;
use crate::events::StoredBlock;
use crate::ids::{LocalBlockHash, SequenceHash, WorkerWithDpRank};
use rustc_hash::FxHashSet;
use std::collections::VecDeque;

/// Caps on what the index holds; `None` is no cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexBudget {
    /// Distinct blocks in the index, all workers together.
    pub max_blocks: Option<usize>,
    /// Blocks one worker rank holds, in any tier.
    pub max_blocks_per_worker: Option<usize>,
    /// Evicted block hashes each worker rank remembers, to tell an event about an evicted
    /// block from one about a block never stored.
    pub evicted_remembered_per_worker: usize,
}

impl IndexBudget {
    /// No caps: the index grows with what it is told.
    pub const UNBOUNDED: IndexBudget = IndexBudget {
        max_blocks: None,
        max_blocks_per_worker: None,
        evicted_remembered_per_worker: 4096,
    };

    /// Whether any cap is set.
    pub fn is_bounded(&self) -> bool {
        self.max_blocks.is_some() || self.max_blocks_per_worker.is_some()
    }
}

impl Default for IndexBudget {
    fn default() -> Self {
        Self::UNBOUNDED
    }
}

/// What the index did with one worker rank's blocks since it last started from empty.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct WorkerIndexStats {
    /// Blocks it holds in the index now, in any tier.
    pub blocks: u64,
    /// Blocks evicted from its view by the budget.
    pub evicted_blocks: u64,
    /// Removed blocks it no longer held because the budget had evicted them.
    pub evicted_removals: u64,
    /// `Stored` events skipped because their parent had been evicted.
    pub stored_under_evicted: u64,
}

/// A FIFO set of evicted hashes, at most `limit` long.
#[derive(Debug, Default)]
pub(super) struct EvictedMemory {
    order: VecDeque<SequenceHash>,
    set: FxHashSet<SequenceHash>,
}

impl EvictedMemory {
    pub(super) fn remember(&mut self, hash: SequenceHash, limit: usize) {
        if limit == 0 || !self.set.insert(hash) {
            return;
        }
        self.order.push_back(hash);
        while self.order.len() > limit {
            if let Some(oldest) = self.order.pop_front() {
                self.set.remove(&oldest);
            }
        }
    }

    pub(super) fn contains(&self, hash: SequenceHash) -> bool {
        self.set.contains(&hash)
    }

    fn heap_bytes(&self) -> usize {
        self.order.capacity() * std::mem::size_of::<SequenceHash>()
            + self.set.capacity() * (std::mem::size_of::<SequenceHash>() + 1)
    }
}

/// A worker's leaf candidate: the stamp it was queued with and the block.
pub(super) type Candidate = (u64, SequenceHash);

/// Recency and eviction state, present only under a budget.
#[derive(Debug, Default)]
pub(super) struct Recency {
    /// The index's clock: one tick per store or match.
    pub(super) clock: u64,
    /// Per worker slot, leaf candidates in the order they were queued.
    pub(super) queues: Vec<VecDeque<Candidate>>,
    /// Per worker slot, the hashes evicted most recently.
    pub(super) evicted: Vec<EvictedMemory>,
}

impl Recency {
    pub(super) fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The queue of `slot`, created if new.
    pub(super) fn queue(&mut self, slot: u32) -> &mut VecDeque<Candidate> {
        let slot = slot as usize;
        if self.queues.len() <= slot {
            self.queues.resize_with(slot + 1, VecDeque::new);
        }
        &mut self.queues[slot]
    }

    /// The evicted memory of `slot`, created if new.
    pub(super) fn evicted(&mut self, slot: u32) -> &mut EvictedMemory {
        let slot = slot as usize;
        if self.evicted.len() <= slot {
            self.evicted.resize_with(slot + 1, EvictedMemory::default);
        }
        &mut self.evicted[slot]
    }

    /// Whether `slot` evicted `hash` (and still remembers it).
    pub(super) fn was_evicted(&self, slot: u32, hash: SequenceHash) -> bool {
        self.evicted
            .get(slot as usize)
            .is_some_and(|memory| memory.contains(hash))
    }

    /// Forgets everything about `slot` (cleared, or its worker left).
    pub(super) fn forget(&mut self, slot: u32) {
        if let Some(queue) = self.queues.get_mut(slot as usize) {
            *queue = VecDeque::new();
        }
        if let Some(memory) = self.evicted.get_mut(slot as usize) {
            *memory = EvictedMemory::default();
        }
    }

    pub(super) fn heap_bytes(&self) -> usize {
        self.queues
            .iter()
            .map(|q| q.capacity() * std::mem::size_of::<Candidate>())
            .sum::<usize>()
            + self
                .evicted
                .iter()
                .map(EvictedMemory::heap_bytes)
                .sum::<usize>()
            + self.queues.capacity() * std::mem::size_of::<VecDeque<Candidate>>()
            + self.evicted.capacity() * std::mem::size_of::<EvictedMemory>()
    }
}

impl super::KvIndexer {
    /// An empty index held to `budget`.
    pub fn with_budget(budget: IndexBudget) -> Self {
        let mut index = Self {
            budget,
            ..Self::default()
        };
        if budget.is_bounded() {
            index.tree.track_recency();
            index.recency = Some(Box::default());
        }
        index
    }

    /// The caps this index keeps to.
    pub fn budget(&self) -> IndexBudget {
        self.budget
    }

    /// What the index holds and evicted for `worker` (zeros if unknown).
    pub fn worker_stats(&self, worker: WorkerWithDpRank) -> WorkerIndexStats {
        let Some(&slot) = self.by_key.get(&worker) else {
            return WorkerIndexStats::default();
        };
        WorkerIndexStats {
            blocks: self.tree.held(slot) as u64,
            ..self.slots[slot as usize].index
        }
    }

    /// Marks the blocks a query matches as just used, so a budget evicts them last. A
    /// no-op without a budget (the index then keeps no recency).
    pub fn touch(&mut self, query: &[LocalBlockHash]) {
        let Some(recency) = self.recency.as_mut() else {
            return;
        };
        let stamp = recency.tick();
        // The walk a query takes ([`super::KvIndexer::find_matches_with`]'s): its last
        // run is the deepest the query used.
        if let Some(id) = Walk::new(&self.tree, query).last().map(|step| step.id) {
            self.tree.stamp_path(id, stamp);
        }
    }

    /// Whether the budget evicted `hash` from `slot` (and remembers it).
    pub(super) fn was_evicted(&self, slot: Slot, hash: SequenceHash) -> bool {
        self.recency
            .as_ref()
            .is_some_and(|recency| recency.was_evicted(slot, hash))
    }

    /// A `Stored` under a parent the budget evicted: skipped, counted, and its blocks
    /// remembered as evicted too (events about them are explained the same way).
    pub(super) fn skip_under_evicted(&mut self, slot: Slot, blocks: &[StoredBlock]) {
        self.stats.stored_under_evicted += 1;
        self.slots[slot as usize].index.stored_under_evicted += 1;
        let limit = self.budget.evicted_remembered_per_worker;
        if let Some(recency) = self.recency.as_mut() {
            for block in blocks {
                recency.evicted(slot).remember(block.block_hash, limit);
            }
        }
    }

    /// A removal of `hash`, which `slot` does not hold: whether the budget explains it
    /// (then counted as such, not as an unknown removal).
    pub(super) fn removal_of_evicted(&mut self, slot: Slot, hash: SequenceHash) -> bool {
        let Some(recency) = self.recency.as_mut() else {
            return false;
        };
        // Not forgotten once explained: the block may have been evicted from several
        // tiers at once, each with its own removal to come.
        if !recency.was_evicted(slot, hash) {
            return false;
        }
        self.stats.evicted_removals += 1;
        self.slots[slot as usize].index.evicted_removals += 1;
        true
    }

    /// Queues `hash` (stamped `stamp`) as a leaf candidate of `slot`.
    pub(super) fn queue_candidate(&mut self, slot: Slot, stamp: u64, hash: SequenceHash) {
        if let Some(recency) = self.recency.as_mut() {
            recency.queue(slot).push_back((stamp, hash));
        }
    }

    /// After a store of `slot`: stamps the path to the deepest block of `blocks` it now
    /// holds, queues that block as a leaf candidate, and enforces the caps.
    pub(super) fn after_store(&mut self, slot: Slot, blocks: &[StoredBlock]) {
        let Some(recency) = self.recency.as_mut() else {
            return;
        };
        let stamp = recency.tick();
        let deepest = blocks.iter().rev().find_map(|block| {
            let (id, _) = self.tree.locate(block.block_hash)?;
            self.tree
                .node(id)
                .holder(slot)
                .map(|_| (id, block.block_hash))
        });
        if let Some((id, hash)) = deepest {
            self.tree.stamp_path(id, stamp);
            self.queue_candidate(slot, stamp, hash);
        }
        self.enforce_budget(slot);
        self.compact_queue(slot);
    }

    /// Evicts until `slot` is within the per-worker cap and the index within the global
    /// one (from the worker holding the most, lowest slot on ties).
    fn enforce_budget(&mut self, slot: Slot) {
        if let Some(cap) = self.budget.max_blocks_per_worker {
            let held = self.tree.held(slot);
            if held > cap {
                self.evict(slot, held - cap);
            }
        }
        let Some(cap) = self.budget.max_blocks else {
            return;
        };
        while self.tree.distinct_blocks() > cap {
            let excess = self.tree.distinct_blocks() - cap;
            let victim = (0..self.slots.len() as Slot)
                .filter(|s| self.slots[*s as usize].key.is_some())
                .max_by_key(|s| (self.tree.held(*s), std::cmp::Reverse(*s)));
            let Some(victim) = victim else { break };
            let held = self.tree.held(victim);
            // Evicting shared blocks frees no block, only pairs: each round takes at
            // least one pair, so the loop ends.
            if held == 0 || self.evict(victim, excess.min(held)) == 0 {
                break;
            }
        }
    }

    /// Whether `hash` is a leaf of `slot`: held, last of its run, no held child run.
    fn leaf_of(&self, slot: Slot, hash: SequenceHash) -> Option<(NodeId, usize)> {
        let (id, offset) = self.tree.locate(hash)?;
        let node = self.tree.node(id);
        let leaf = node.holder(slot).is_some()
            && offset + 1 == node.len()
            && !self.tree.has_child_held_by(id, slot);
        leaf.then_some((id, offset))
    }

    /// Every leaf of `slot`, oldest stamp first (hash on ties): O(runs), for a queue
    /// that ran dry.
    fn scan_leaves(&self, slot: Slot) -> Vec<Candidate> {
        let mut leaves: Vec<Candidate> = self
            .tree
            .live_ids()
            .filter(|(id, node)| {
                *id != ROOT
                    && node.holder(slot).is_some()
                    && !self.tree.has_child_held_by(*id, slot)
            })
            .map(|(id, node)| (self.tree.stamp(id), node.blocks.hash(node.len() - 1)))
            .collect();
        leaves.sort_unstable_by_key(|(stamp, hash)| (*stamp, hash.get()));
        leaves
    }

    /// Evicts up to `need` blocks of `slot`, least recently used leaves first; how many.
    fn evict(&mut self, slot: Slot, need: usize) -> usize {
        if self.recency.is_none() {
            return 0;
        }
        let limit = self.budget.evicted_remembered_per_worker;
        let mut evicted = 0;
        let mut rebuilt = false;
        while evicted < need {
            let popped = self
                .recency
                .as_mut()
                .and_then(|recency| recency.queue(slot).pop_front());
            let Some((stamp, hash)) = popped else {
                // Every leaf is queued after a rebuild, and evicting one queues the
                // next: a second dry queue means nothing is left to evict.
                if rebuilt {
                    break;
                }
                rebuilt = true;
                let leaves = self.scan_leaves(slot);
                if leaves.is_empty() {
                    break;
                }
                if let Some(recency) = self.recency.as_mut() {
                    recency.queue(slot).extend(leaves);
                }
                continue;
            };
            let Some((id, _)) = self.leaf_of(slot, hash) else {
                continue;
            };
            let run_stamp = self.tree.stamp(id);
            if run_stamp > stamp {
                // Used since it was queued: a second chance at the back.
                self.queue_candidate(slot, run_stamp, hash);
                continue;
            }
            let node = self.tree.node(id);
            let len = node.len();
            let k = (need - evicted).min(len);
            let gone: Vec<SequenceHash> = node.blocks.hashes_of(len - k..len).collect();
            // The block that becomes the leaf: the run's new end, or the parent run's
            // last block if the worker holds it (checked for other children when popped).
            let next = if k < len {
                Some(node.blocks.hash(len - k - 1))
            } else {
                let parent = self.tree.node(node.parent);
                (node.parent != ROOT && parent.holder(slot).is_some())
                    .then(|| parent.blocks.hash(parent.len() - 1))
            };
            self.tree
                .retag(id, len - k, len, HolderChange { slot, tiers: 0 });
            evicted += k;
            if let Some(recency) = self.recency.as_mut() {
                for hash in gone {
                    recency.evicted(slot).remember(hash, limit);
                }
                if let Some(next) = next {
                    // As old as the leaf it replaces: next in line.
                    recency.queue(slot).push_front((stamp, next));
                }
            }
        }
        self.stats.evicted_blocks += evicted as u64;
        self.slots[slot as usize].index.evicted_blocks += evicted as u64;
        evicted
    }

    /// After a removal took `slot` off a block entirely (`last_removed`, followed in its
    /// run by `next_in_run`, if any): whatever `slot` still holds below it can no longer
    /// be matched (a query walks down from the root), so it leaves the view as evicted
    /// blocks (counted, remembered). Under a budget this happens when the index had
    /// evicted a block in every tier and the worker stored it again in one: its removal
    /// of that tier leaves the tiers the index forgot, and the worker still holds the
    /// blocks below. Dropping them keeps the view prefix-closed, at the price of misses
    /// only. Rare (a leaf-first removal never gets here), so it walks by hash.
    pub(super) fn drop_orphans_below(
        &mut self,
        slot: Slot,
        last_removed: SequenceHash,
        next_in_run: Option<SequenceHash>,
    ) {
        // Segments (first block's hash, blocks) the slot holds below, top-down.
        let mut segments: Vec<(SequenceHash, usize)> = Vec::new();
        let mut stack: Vec<(NodeId, usize)> = Vec::new();
        match next_in_run {
            Some(hash) => {
                if let Some((id, offset)) = self.tree.locate(hash) {
                    stack.push((id, offset));
                }
            }
            None => {
                if let Some((id, _)) = self.tree.locate(last_removed) {
                    let children = self.tree.node(id).sorted_children();
                    stack.extend(children.into_iter().map(|(_, child)| (child, 0)));
                }
            }
        }
        while let Some((id, from)) = stack.pop() {
            let node = self.tree.node(id);
            if node.holder(slot).is_none() {
                continue;
            }
            segments.push((node.blocks.hash(from), node.len() - from));
            stack.extend(
                node.sorted_children()
                    .into_iter()
                    .map(|(_, child)| (child, 0)),
            );
        }
        let limit = self.budget.evicted_remembered_per_worker;
        let mut dropped = 0;
        // Deepest first: each retag may split or merge runs, so every segment is found
        // again by its first block's hash.
        for (first, len) in segments.into_iter().rev() {
            let Some((id, offset)) = self.tree.locate(first) else {
                continue;
            };
            let node = self.tree.node(id);
            let hashes: Vec<SequenceHash> = node.blocks.hashes_of(offset..offset + len).collect();
            let change = HolderChange { slot, tiers: 0 };
            self.tree.retag(id, offset, offset + len, change);
            dropped += len;
            if let Some(recency) = self.recency.as_mut() {
                for hash in hashes {
                    recency.evicted(slot).remember(hash, limit);
                }
            }
        }
        self.stats.evicted_blocks += dropped as u64;
        self.slots[slot as usize].index.evicted_blocks += dropped as u64;
    }

    /// Drops stale and repeated candidates once the queue passes twice what its worker
    /// holds, keeping each leaf's latest entry in order: the queue stays O(blocks held).
    fn compact_queue(&mut self, slot: Slot) {
        let held = self.tree.held(slot);
        let Some(recency) = self.recency.as_mut() else {
            return;
        };
        let queue = std::mem::take(recency.queue(slot));
        if queue.len() <= 2 * held + 64 {
            *recency.queue(slot) = queue;
            return;
        }
        let mut seen = FxHashSet::default();
        let mut kept: Vec<Candidate> = queue
            .into_iter()
            .rev()
            .filter(|(_, hash)| seen.insert(*hash))
            .collect();
        kept.reverse();
        kept.retain(|(_, hash)| self.leaf_of(slot, *hash).is_some());
        if let Some(recency) = self.recency.as_mut() {
            *recency.queue(slot) = kept.into();
        }
    }

    pub(super) fn recency_heap_bytes(&self) -> usize {
        self.recency.as_ref().map_or(0, |recency| {
            std::mem::size_of::<Recency>() + recency.heap_bytes()
        })
    }
}

impl super::KvIndexer {
    /// Whether `worker` holds block `hash` (in any tier).
    pub fn holds(&self, worker: WorkerWithDpRank, hash: SequenceHash) -> bool {
        let Some(&slot) = self.by_key.get(&worker) else {
            return false;
        };
        self.tree
            .locate(hash)
            .is_some_and(|(id, _)| self.tree.node(id).holder(slot).is_some())
    }
}
