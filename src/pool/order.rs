//! A pool's eviction order with a remembered *checked cold prefix*.
//!
//! Owns: [`EvictionOrder`], the pool's [`BuiltinPolicy`] plus the coldest cached blocks a
//! caller has already checked (the manager's write-back scan checks whether the lower
//! tier holds a copy). The checked blocks are always exactly the first ones of the
//! eviction order: taking a block out of the order (a hit, an eviction) unmarks it and
//! keeps the others a prefix; a block placed anywhere but the hot end of an LRU order,
//! or re-tagged by a phase-aware one, could land inside the prefix, so it forgets them
//! all. A scan that starts after the prefix sees exactly what a scan from the coldest
//! block would, without repeating the checks (issue 33: the write-back scan rechecked
//! the same hundred blocks at every settle).
//! Never: decide what a check means, or when a check goes stale: the caller forgets the
//! prefix (`forget_checked`) when what it checked against changed.

use super::policy::{BuiltinPolicy, EvictionPolicy, Placement};
use crate::ids::BlockId;
use crate::phase::Phase;
use std::ops::ControlFlow;

#[derive(Debug)]
pub(crate) struct EvictionOrder {
    policy: BuiltinPolicy,
    /// Per block: whether it is in the checked prefix.
    checked: Vec<bool>,
    /// How many blocks the checked prefix holds.
    prefix: usize,
    /// The hottest block of the checked prefix (`None` exactly when it is empty): a scan
    /// starts right after it instead of walking the prefix again.
    prefix_end: Option<BlockId>,
}

impl EvictionOrder {
    pub(crate) fn new(policy: BuiltinPolicy, capacity: usize) -> Self {
        Self {
            policy,
            checked: vec![false; capacity],
            prefix: 0,
            prefix_end: None,
        }
    }

    /// `block` became cached (see [`EvictionPolicy::insert`]).
    #[inline]
    pub(crate) fn insert(&mut self, block: BlockId, phase: Phase, placement: Placement) {
        let after_the_prefix =
            matches!(self.policy, BuiltinPolicy::Lru(_)) && placement == Placement::Hot;
        if !after_the_prefix {
            self.forget_checked();
        }
        self.policy.insert(block, phase, placement);
    }

    /// `block` stopped being cached; false if the order did not hold it.
    #[inline]
    pub(crate) fn remove(&mut self, block: BlockId) -> bool {
        if self.prefix_end == Some(block) {
            // The prefix's next colder block (checked too, or none) ends it now.
            self.prefix_end = self.policy.colder(block);
        }
        let held = self.policy.remove(block);
        if held {
            self.uncheck(block);
        }
        held
    }

    /// `block` became cached, placed cold, and passed the caller's check already: it
    /// joins the checked prefix, which it now starts.
    pub(crate) fn insert_cold_checked(&mut self, block: BlockId, phase: Phase) {
        if !matches!(self.policy, BuiltinPolicy::Lru(_)) {
            self.insert(block, phase, Placement::Cold);
            return;
        }
        self.policy.insert(block, phase, Placement::Cold);
        self.checked[block.index()] = true;
        self.prefix += 1;
        self.prefix_end.get_or_insert(block);
    }

    /// Whether `block` is in the checked prefix.
    pub(crate) fn is_checked(&self, block: BlockId) -> bool {
        self.checked[block.index()]
    }

    /// The cached `block` was re-tagged (see [`EvictionPolicy::reclassify`]).
    pub(crate) fn reclassify(&mut self, block: BlockId, phase: Phase) {
        if matches!(self.policy, BuiltinPolicy::Priority(_)) {
            self.forget_checked();
        }
        self.policy.reclassify(block, phase);
    }

    /// Takes the block to evict next.
    #[inline]
    pub(crate) fn pop_victim(&mut self) -> Option<BlockId> {
        let victim = self.policy.pop_victim()?;
        self.uncheck(victim);
        Some(victim)
    }

    /// Cached blocks held.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.policy.len()
    }

    /// Appends up to `limit` blocks to `out` in the order they would be evicted.
    pub(crate) fn coldest(&self, limit: usize, out: &mut Vec<BlockId>) {
        self.policy.coldest(limit, out);
    }

    /// The blocks among the `limit` coldest that are not in the checked prefix, in
    /// eviction order, each given to `check` (except the prefix's, checked before):
    /// those it accepts right after the prefix join it, those it refuses are returned
    /// (and so are those it accepts after a refusal: the prefix stays a prefix).
    pub(crate) fn coldest_unchecked(
        &mut self,
        limit: usize,
        mut check: impl FnMut(BlockId) -> bool,
    ) -> Vec<BlockId> {
        let mut out = Vec::new();
        if limit <= self.prefix {
            return out;
        }
        // Every block after the prefix is unchecked: the scan starts there.
        let mut next = match self.prefix_end {
            Some(end) => self.policy.hotter(end),
            None => self.policy.coldest_block(),
        };
        let (mut seen, mut extending) = (self.prefix, true);
        while let Some(block) = next {
            if seen == limit {
                break;
            }
            seen += 1;
            debug_assert!(!self.checked[block.index()], "checked after the prefix");
            if check(block) {
                if extending {
                    self.checked[block.index()] = true;
                    self.prefix += 1;
                    self.prefix_end = Some(block);
                }
            } else {
                extending = false;
                out.push(block);
            }
            next = self.policy.hotter(block);
        }
        out
    }

    /// Forgets the checked prefix: what its blocks were checked against changed.
    pub(crate) fn forget_checked(&mut self) {
        if self.prefix == 0 {
            return;
        }
        let mut left = self.prefix;
        let checked = &mut self.checked;
        self.policy.visit_coldest(&mut |block| {
            checked[block.index()] = false;
            left -= 1;
            if left == 0 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        });
        self.prefix = 0;
        self.prefix_end = None;
    }

    #[inline]
    fn uncheck(&mut self, block: BlockId) {
        if std::mem::take(&mut self.checked[block.index()]) {
            self.prefix -= 1;
            if self.prefix == 0 {
                self.prefix_end = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::EvictionPolicyKind;

    fn order(kind: EvictionPolicyKind, blocks: &[u32]) -> EvictionOrder {
        let mut order = EvictionOrder::new(BuiltinPolicy::new(kind, 16), 16);
        for &b in blocks {
            order.insert(BlockId::new(b), Phase::OutputCritical, Placement::Hot);
        }
        order
    }

    fn ids(blocks: &[u32]) -> Vec<BlockId> {
        blocks.iter().copied().map(BlockId::new).collect()
    }

    #[test]
    fn a_checked_prefix_is_not_checked_again_and_stays_a_prefix() {
        let mut order = order(EvictionPolicyKind::Lru, &[0, 1, 2, 3, 4, 5]);
        let mut asked = Vec::new();
        // 2 is refused: 0 and 1 join the prefix, 3 is accepted but after a refusal.
        let refused = order.coldest_unchecked(4, |b| {
            asked.push(b.get());
            b.get() != 2
        });
        assert_eq!(
            (refused, asked, order.prefix),
            (ids(&[2]), vec![0, 1, 2, 3], 2)
        );
        // The prefix is skipped: only what lies after it is asked.
        let mut asked = Vec::new();
        order.coldest_unchecked(4, |b| {
            asked.push(b.get());
            true
        });
        assert_eq!((asked, order.prefix), (vec![2, 3], 4));
        assert!(order.coldest_unchecked(3, |_| unreachable!()).is_empty());
        // A hit in the prefix and an eviction leave the rest a prefix.
        assert!(order.remove(BlockId::new(1)));
        assert_eq!(order.pop_victim(), Some(BlockId::new(0)));
        assert_eq!(order.prefix, 2);
        let mut asked = Vec::new();
        order.coldest_unchecked(4, |b| {
            asked.push(b.get());
            false
        });
        assert_eq!(asked, vec![4, 5]);
        // Hot insertions go after it; a cold one forgets it.
        order.insert(BlockId::new(9), Phase::OutputCritical, Placement::Hot);
        assert_eq!(order.prefix, 2);
        order.insert(BlockId::new(8), Phase::OutputCritical, Placement::Cold);
        assert_eq!(order.prefix, 0);
        assert!(order.checked.iter().all(|c| !c));
    }

    #[test]
    fn a_phase_aware_order_forgets_its_prefix_when_blocks_may_land_inside_it() {
        let mut order = order(EvictionPolicyKind::Priority, &[0, 1, 2]);
        order.coldest_unchecked(2, |_| true);
        assert_eq!(order.prefix, 2);
        // A finished reasoning block goes before every output block.
        order.insert(BlockId::new(5), Phase::ThinkComplete, Placement::Hot);
        assert_eq!(order.prefix, 0);
        order.coldest_unchecked(2, |_| true);
        order.reclassify(BlockId::new(2), Phase::ThinkComplete);
        assert_eq!(order.prefix, 0);
        let mut visited = Vec::new();
        order.coldest(8, &mut visited);
        assert_eq!(visited, ids(&[5, 2, 0, 1]));
    }

    #[test]
    fn what_is_returned_is_what_a_full_scan_refuses() {
        // Against a scan that checks everything every time, over a mix of operations.
        let mut order = order(EvictionPolicyKind::Lru, &[]);
        let accepted = |b: BlockId| !b.get().is_multiple_of(3);
        let mut next = 0u32;
        let mut held: Vec<u32> = Vec::new();
        for step in 0..400u32 {
            match step % 5 {
                0 | 1 if held.len() < 16 => {
                    let free = (0..16).find(|b| !held.contains(b)).unwrap();
                    order.insert(BlockId::new(free), Phase::OutputCritical, Placement::Hot);
                    held.push(free);
                }
                2 if !held.is_empty() => {
                    let b = held.remove((next as usize) % held.len());
                    assert!(order.remove(BlockId::new(b)));
                }
                3 => {
                    if let Some(v) = order.pop_victim() {
                        held.retain(|b| *b != v.get());
                    }
                }
                _ => {}
            }
            next = next.wrapping_mul(31).wrapping_add(7);
            let limit = (next % 12) as usize;
            let mut all = Vec::new();
            order.coldest(limit, &mut all);
            let expected: Vec<BlockId> = all.into_iter().filter(|b| !accepted(*b)).collect();
            assert_eq!(
                order.coldest_unchecked(limit, accepted),
                expected,
                "step {step}"
            );
        }
    }

    /// The checked blocks are the first `prefix` of the eviction order and the last of
    /// them is `prefix_end`.
    fn assert_prefix_invariant(order: &EvictionOrder) {
        let mut all = Vec::new();
        order.coldest(usize::MAX, &mut all);
        let checked: Vec<bool> = all.iter().map(|b| order.is_checked(*b)).collect();
        let prefix = checked.iter().take_while(|c| **c).count();
        assert_eq!(prefix, order.prefix);
        assert!(
            checked[prefix..].iter().all(|c| !c),
            "checked after the prefix"
        );
        assert_eq!(order.prefix_end, prefix.checked_sub(1).map(|i| all[i]));
        let held = order.checked.iter().filter(|c| **c).count();
        assert_eq!(held, prefix, "a block checked outside the order");
    }

    #[derive(Clone, Debug)]
    enum Op {
        Insert(u32, u8, bool),
        InsertColdChecked(u32),
        Remove(u32),
        Pop,
        Reclassify(u32, u8),
        Scan(usize, u32),
        Forget,
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (0..16u32, 0..3u8, any::<bool>()).prop_map(|(b, p, hot)| Op::Insert(b, p, hot)),
            1 => (0..16u32).prop_map(Op::InsertColdChecked),
            2 => (0..16u32).prop_map(Op::Remove),
            1 => Just(Op::Pop),
            1 => (0..16u32, 0..3u8).prop_map(|(b, p)| Op::Reclassify(b, p)),
            3 => (0..20usize, 1..4u32).prop_map(|(limit, modulus)| Op::Scan(limit, modulus)),
            1 => Just(Op::Forget),
        ]
    }

    proptest::proptest! {
        /// Whatever happens to the order, a scan from after the prefix returns what a
        /// full scan of the coldest blocks refuses, and the prefix stays a prefix.
        #[test]
        fn a_scan_after_the_prefix_agrees_with_a_full_scan(
            priority in proptest::bool::ANY,
            ops in proptest::collection::vec(op(), 1..120),
        ) {
            let kind = if priority { EvictionPolicyKind::Priority } else { EvictionPolicyKind::Lru };
            let mut order = order(kind, &[]);
            let phase = |p: u8| [Phase::OutputCritical, Phase::ThinkActive, Phase::ThinkComplete][p as usize];
            let mut cached = [false; 16];
            for op in ops {
                match op {
                    Op::Insert(b, p, hot) if !cached[b as usize] => {
                        let placement = if hot { Placement::Hot } else { Placement::Cold };
                        order.insert(BlockId::new(b), phase(p), placement);
                        cached[b as usize] = true;
                    }
                    Op::InsertColdChecked(b) if !cached[b as usize] => {
                        order.insert_cold_checked(BlockId::new(b), Phase::OutputCritical);
                        cached[b as usize] = true;
                    }
                    Op::Remove(b) => {
                        assert_eq!(order.remove(BlockId::new(b)), cached[b as usize]);
                        cached[b as usize] = false;
                    }
                    Op::Pop => {
                        if let Some(victim) = order.pop_victim() {
                            cached[victim.index()] = false;
                        }
                    }
                    Op::Reclassify(b, p) if cached[b as usize] => {
                        order.reclassify(BlockId::new(b), phase(p));
                    }
                    Op::Scan(limit, modulus) => {
                        let accepted = |b: BlockId| !b.get().is_multiple_of(modulus + 1);
                        let mut all = Vec::new();
                        order.coldest(limit, &mut all);
                        // Blocks checked before were accepted then: a scan refuses
                        // only among the blocks after the prefix.
                        let expected: Vec<BlockId> = all
                            .into_iter()
                            .filter(|b| !order.is_checked(*b) && !accepted(*b))
                            .collect();
                        assert_eq!(order.coldest_unchecked(limit, accepted), expected);
                    }
                    Op::Forget => order.forget_checked(),
                    _ => {}
                }
                assert_prefix_invariant(&order);
            }
        }
    }
}
