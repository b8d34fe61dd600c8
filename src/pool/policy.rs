//! Eviction policies: the order in which a pool gives up cached blocks.
//!
//! Owns: the [`EvictionPolicy`] trait and its two implementations, [`LruPolicy`] and the
//! phase-aware [`PriorityPolicy`], plus [`EvictionPolicyKind`] to choose one in config.
//! A policy only orders *cached* blocks (registered, refcount 0); the pool tells it when a
//! block becomes cached (`insert`) or is taken back (`remove`), and asks it for victims.
//! Every operation is O(1) (index-linked lists), because prefix hits on cached blocks sit
//! on the lookup hot path.
//!
//! "Leaves first": among blocks cached at the same moment, the pool inserts a chain leaf
//! first (`BlockPool::release` does it), so a leaf is always colder than its parent.
//! Never: decide *whether* a block is evictable (the pool does), or read a clock.

use super::list::IndexLists;
use crate::ids::BlockId;
use crate::phase::Phase;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::ops::ControlFlow;

/// Where a block enters the eviction order.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Placement {
    /// As the most recently used block: evicted last.
    Hot,
    /// As the coldest block of its class: evicted next (a block already copied to a lower
    /// tier, say).
    Cold,
}

/// An eviction order over cached blocks.
pub trait EvictionPolicy: Send + fmt::Debug {
    /// The policy's name in reports.
    fn name(&self) -> &'static str;
    /// `block` became cached with `phase`.
    fn insert(&mut self, block: BlockId, phase: Phase, placement: Placement);
    /// `block` stopped being cached (a prefix hit took it, or it was invalidated); false
    /// if the policy did not hold it.
    fn remove(&mut self, block: BlockId) -> bool;
    /// The cached `block` was re-tagged with `phase`. A policy that orders by phase moves
    /// it to the hot end of its new class; one that ignores phases leaves it in place.
    fn reclassify(&mut self, block: BlockId, phase: Phase);
    /// Takes the block to evict next.
    fn pop_victim(&mut self) -> Option<BlockId>;
    /// Number of cached blocks held.
    fn len(&self) -> usize;
    /// Whether no cached block is held.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Calls `visit` on cached blocks in the order they would be evicted, until it
    /// returns `ControlFlow::Break`.
    fn visit_coldest(&self, visit: &mut dyn FnMut(BlockId) -> ControlFlow<()>);

    /// Appends up to `limit` blocks to `out` in the order they would be evicted.
    fn coldest(&self, limit: usize, out: &mut Vec<BlockId>) {
        if limit == 0 {
            return;
        }
        let mut left = limit;
        self.visit_coldest(&mut |id| {
            out.push(id);
            left -= 1;
            if left == 0 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        });
    }
}

/// Which policy a pool uses.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default, Serialize, Deserialize)]
pub enum EvictionPolicyKind {
    /// Least recently used first, leaves first.
    #[default]
    Lru,
    /// Phase classes coldest first (finished reasoning, then active reasoning, then
    /// prompt and output), LRU within a class.
    Priority,
}

/// The built-in policies behind one enum: the pool calls its policy on every lookup hit and
/// release, and a `match` the compiler can inline is measurably cheaper there than a
/// virtual call.
#[derive(Debug, Clone)]
pub(crate) enum BuiltinPolicy {
    Lru(LruPolicy),
    Priority(PriorityPolicy),
}

impl BuiltinPolicy {
    pub(crate) fn new(kind: EvictionPolicyKind, capacity: usize) -> Self {
        match kind {
            EvictionPolicyKind::Lru => BuiltinPolicy::Lru(LruPolicy::new(capacity)),
            EvictionPolicyKind::Priority => BuiltinPolicy::Priority(PriorityPolicy::new(capacity)),
        }
    }
}

impl BuiltinPolicy {
    /// The coldest cached block, if any.
    #[inline]
    pub(crate) fn coldest_block(&self) -> Option<BlockId> {
        let lists = self.lists();
        (0..lists.list_count())
            .find_map(|list| lists.front(list))
            .map(BlockId::new)
    }

    /// The cached block evicted right after `block` (which must be cached), if any: the
    /// next one in its class, or the coldest of the next class that has any.
    #[inline]
    pub(crate) fn hotter(&self, block: BlockId) -> Option<BlockId> {
        let lists = self.lists();
        if let Some(next) = lists.next_of(block.get()) {
            return Some(BlockId::new(next));
        }
        let list = lists.list_of(block.get())?;
        (list + 1..lists.list_count())
            .find_map(|list| lists.front(list))
            .map(BlockId::new)
    }

    /// The cached block evicted right before `block` (which must be cached), if any.
    #[inline]
    pub(crate) fn colder(&self, block: BlockId) -> Option<BlockId> {
        let lists = self.lists();
        if let Some(prev) = lists.prev_of(block.get()) {
            return Some(BlockId::new(prev));
        }
        let list = lists.list_of(block.get())?;
        (0..list)
            .rev()
            .find_map(|list| lists.back(list))
            .map(BlockId::new)
    }

    #[inline]
    fn lists(&self) -> &IndexLists {
        match self {
            BuiltinPolicy::Lru(policy) => &policy.lists,
            BuiltinPolicy::Priority(policy) => &policy.lists,
        }
    }
}

macro_rules! dispatch {
    ($self:ident, $policy:ident => $call:expr) => {
        match $self {
            BuiltinPolicy::Lru($policy) => $call,
            BuiltinPolicy::Priority($policy) => $call,
        }
    };
}

impl EvictionPolicy for BuiltinPolicy {
    fn name(&self) -> &'static str {
        dispatch!(self, p => p.name())
    }
    #[inline]
    fn insert(&mut self, block: BlockId, phase: Phase, placement: Placement) {
        dispatch!(self, p => p.insert(block, phase, placement))
    }
    #[inline]
    fn remove(&mut self, block: BlockId) -> bool {
        dispatch!(self, p => p.remove(block))
    }
    fn reclassify(&mut self, block: BlockId, phase: Phase) {
        dispatch!(self, p => p.reclassify(block, phase))
    }
    #[inline]
    fn pop_victim(&mut self) -> Option<BlockId> {
        dispatch!(self, p => p.pop_victim())
    }
    #[inline]
    fn len(&self) -> usize {
        dispatch!(self, p => p.len())
    }
    fn visit_coldest(&self, visit: &mut dyn FnMut(BlockId) -> ControlFlow<()>) {
        dispatch!(self, p => p.visit_coldest(visit))
    }
}

/// Least recently used first; phases are ignored.
#[derive(Debug, Clone)]
pub struct LruPolicy {
    lists: IndexLists,
}

impl LruPolicy {
    /// An empty policy for blocks `0..capacity`.
    pub fn new(capacity: usize) -> Self {
        Self {
            lists: IndexLists::new(capacity, 1),
        }
    }
}

impl EvictionPolicy for LruPolicy {
    fn name(&self) -> &'static str {
        "lru"
    }

    #[inline]
    fn insert(&mut self, block: BlockId, _phase: Phase, placement: Placement) {
        match placement {
            Placement::Hot => self.lists.push_back(0, block.get()),
            Placement::Cold => self.lists.push_front(0, block.get()),
        }
    }

    #[inline]
    fn remove(&mut self, block: BlockId) -> bool {
        self.lists.remove(block.get())
    }

    fn reclassify(&mut self, _block: BlockId, _phase: Phase) {}

    #[inline]
    fn pop_victim(&mut self) -> Option<BlockId> {
        self.lists.pop_front(0).map(BlockId::new)
    }

    fn len(&self) -> usize {
        self.lists.len(0)
    }

    fn visit_coldest(&self, visit: &mut dyn FnMut(BlockId) -> ControlFlow<()>) {
        for node in self.lists.iter(0) {
            if visit(BlockId::new(node)).is_break() {
                return;
            }
        }
    }
}

/// Phase-aware: every `ThinkComplete` block goes before any `ThinkActive` block, which
/// goes before any `OutputCritical` block; LRU within a phase (seed 004: finished
/// reasoning is known cold).
#[derive(Debug, Clone)]
pub struct PriorityPolicy {
    lists: IndexLists,
}

impl PriorityPolicy {
    /// An empty policy for blocks `0..capacity`.
    pub fn new(capacity: usize) -> Self {
        Self {
            lists: IndexLists::new(capacity, Phase::COLDEST_FIRST.len()),
        }
    }
}

impl EvictionPolicy for PriorityPolicy {
    fn name(&self) -> &'static str {
        "priority"
    }

    #[inline]
    fn insert(&mut self, block: BlockId, phase: Phase, placement: Placement) {
        let list = phase.eviction_rank();
        match placement {
            Placement::Hot => self.lists.push_back(list, block.get()),
            Placement::Cold => self.lists.push_front(list, block.get()),
        }
    }

    #[inline]
    fn remove(&mut self, block: BlockId) -> bool {
        self.lists.remove(block.get())
    }

    fn reclassify(&mut self, block: BlockId, phase: Phase) {
        if self.lists.remove(block.get()) {
            self.lists.push_back(phase.eviction_rank(), block.get());
        }
    }

    #[inline]
    fn pop_victim(&mut self) -> Option<BlockId> {
        (0..Phase::COLDEST_FIRST.len())
            .find_map(|list| self.lists.pop_front(list))
            .map(BlockId::new)
    }

    fn len(&self) -> usize {
        (0..Phase::COLDEST_FIRST.len())
            .map(|list| self.lists.len(list))
            .sum()
    }

    fn visit_coldest(&self, visit: &mut dyn FnMut(BlockId) -> ControlFlow<()>) {
        for list in 0..Phase::COLDEST_FIRST.len() {
            for node in self.lists.iter(list) {
                if visit(BlockId::new(node)).is_break() {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn victims(policy: &mut dyn EvictionPolicy) -> Vec<u32> {
        std::iter::from_fn(|| policy.pop_victim())
            .map(BlockId::get)
            .collect()
    }

    #[test]
    fn lru_evicts_least_recently_inserted_first_and_cold_placement_first_of_all() {
        let mut lru = LruPolicy::new(8);
        for b in [3, 1, 2] {
            lru.insert(BlockId::new(b), Phase::OutputCritical, Placement::Hot);
        }
        lru.insert(BlockId::new(7), Phase::OutputCritical, Placement::Cold);
        assert!(lru.remove(BlockId::new(1)));
        let mut order = Vec::new();
        lru.coldest(10, &mut order);
        assert_eq!(
            order,
            vec![BlockId::new(7), BlockId::new(3), BlockId::new(2)]
        );
        assert_eq!(victims(&mut lru), vec![7, 3, 2]);
        assert!(lru.is_empty());
    }

    #[test]
    fn priority_evicts_finished_reasoning_before_anything_else() {
        let mut policy = PriorityPolicy::new(8);
        policy.insert(BlockId::new(0), Phase::OutputCritical, Placement::Hot);
        policy.insert(BlockId::new(1), Phase::ThinkActive, Placement::Hot);
        policy.insert(BlockId::new(2), Phase::ThinkComplete, Placement::Hot);
        policy.insert(BlockId::new(3), Phase::ThinkComplete, Placement::Hot);
        policy.insert(BlockId::new(4), Phase::OutputCritical, Placement::Cold);
        assert_eq!(policy.len(), 5);
        assert_eq!(victims(&mut policy), vec![2, 3, 1, 4, 0]);
    }

    /// The eviction order walked with `hotter` from the coldest block, and back with
    /// `colder` from the hottest.
    fn walked(policy: &BuiltinPolicy) -> (Vec<u32>, Vec<u32>) {
        let up: Vec<u32> = std::iter::successors(policy.coldest_block(), |b| policy.hotter(*b))
            .map(BlockId::get)
            .collect();
        let hottest = up.last().map(|b| BlockId::new(*b));
        let mut down: Vec<u32> = std::iter::successors(hottest, |b| policy.colder(*b))
            .map(BlockId::get)
            .collect();
        down.reverse();
        (up, down)
    }

    #[test]
    fn neighbour_steps_follow_the_eviction_order_across_classes() {
        for kind in [EvictionPolicyKind::Lru, EvictionPolicyKind::Priority] {
            let mut policy = BuiltinPolicy::new(kind, 12);
            assert_eq!(walked(&policy), (vec![], vec![]));
            // Classes left empty between filled ones, and a block placed cold.
            let phases = [
                (0, Phase::OutputCritical, Placement::Hot),
                (5, Phase::ThinkComplete, Placement::Hot),
                (9, Phase::OutputCritical, Placement::Hot),
                (2, Phase::ThinkComplete, Placement::Cold),
                (7, Phase::OutputCritical, Placement::Hot),
            ];
            for (block, phase, placement) in phases {
                policy.insert(BlockId::new(block), phase, placement);
            }
            assert!(policy.remove(BlockId::new(9)));
            let mut order = Vec::new();
            policy.coldest(12, &mut order);
            let order: Vec<u32> = order.into_iter().map(BlockId::get).collect();
            assert_eq!(walked(&policy), (order.clone(), order), "{kind:?}");
            assert_eq!(policy.hotter(BlockId::new(9)), None, "not cached");
        }
    }
}
