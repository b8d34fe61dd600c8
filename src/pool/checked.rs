//! What a pool remembers for a caller that scans its coldest blocks again and again: the
//! checked cold prefix of its eviction order (see `order.rs`), and the blocks that
//! recently left its registry.
//!
//! Owns: [`BlockPool::coldest_unchecked`], [`BlockPool::pin_all`],
//! [`BlockPool::forget_checked`], [`BlockPool::forget_checked_if_any`],
//! [`BlockPool::release_cold_checked`], [`BlockPool::removals`] and
//! [`BlockPool::removed_since`], and for checkers outside the pool
//! [`BlockPool::visit_registered`]. The manager's write-back
//! scan is the caller: a block it saw already copied to the tier below is not looked up
//! there again until that tier loses a block the scan had seen (issue 33).
//! Never: know what a check means: the caller checks, and says when a check went stale.

use super::{BlockChain, BlockIdentity, BlockPool, ImmutableBlock, SequenceHash};
use crate::sync::Arc;

/// How many removed hashes a pool remembers for [`BlockPool::removed_since`].
pub(super) const RECENT_REMOVALS: usize = 1024;

impl BlockPool {
    /// The blocks among the `limit` coldest cached ones that `check` refuses, in eviction
    /// order. The coldest blocks `check` accepted at earlier calls are not asked again,
    /// until they leave the cache or [`BlockPool::forget_checked`]. `check` runs under
    /// this pool's lock: it must not call into this pool.
    pub fn coldest_unchecked(
        &self,
        limit: usize,
        mut check: impl FnMut(&BlockIdentity) -> bool,
    ) -> Vec<BlockIdentity> {
        let mut inner = self.shared.inner.lock();
        let inner = &mut *inner;
        let slots = &inner.slots;
        let refused = inner
            .policy
            .coldest_unchecked(limit, |id| check(&slots[id.index()].identity));
        refused
            .iter()
            .map(|id| inner.slots[id.index()].identity)
            .collect()
    }

    /// References to the blocks registered under `hashes` (those it finds, in order),
    /// under one lock: the scan pins what it will copy, without counting lookup hits.
    pub fn pin_all(&self, hashes: impl IntoIterator<Item = SequenceHash>) -> Vec<ImmutableBlock> {
        let mut inner = self.shared.inner.lock();
        hashes
            .into_iter()
            .filter_map(|hash| inner.pin(hash))
            .map(|(id, identity)| ImmutableBlock::new(Arc::clone(&self.shared), id, identity))
            .collect()
    }

    /// Calls `visit` with the identity of every registered block, in no particular
    /// order: for checks that build sets (sort before anything observable depends on
    /// the order). `visit` runs under the pool's lock and must not call the pool.
    pub fn visit_registered(&self, mut visit: impl FnMut(&BlockIdentity)) {
        let inner = self.shared.inner.lock();
        for id in inner.registry.values() {
            visit(&inner.slots[id.index()].identity);
        }
    }

    /// Forgets every block [`BlockPool::coldest_unchecked`] was told was fine: what they
    /// were checked against changed.
    pub fn forget_checked(&self) {
        self.shared.inner.lock().policy.forget_checked();
    }

    /// Forgets the checked blocks, if any of `hashes` is one of them.
    pub fn forget_checked_if_any(&self, hashes: &[SequenceHash]) {
        let mut inner = self.shared.inner.lock();
        let stale = hashes.iter().any(|hash| {
            inner
                .registry
                .get(hash)
                .is_some_and(|id| inner.policy.is_checked(*id))
        });
        if stale {
            inner.policy.forget_checked();
        }
    }

    /// [`BlockPool::release_cold`], where the blocks `checked` accepts (a caller's check
    /// already passed, as [`BlockPool::coldest_unchecked`]'s would) join the checked ones
    /// if they become cached.
    pub fn release_cold_checked(
        &self,
        blocks: impl Into<BlockChain>,
        checked: impl Fn(&BlockIdentity) -> bool,
    ) {
        blocks.into().release_cold_checked(checked);
    }

    /// How many blocks ever left the registry (each with a `Removed` event).
    pub fn removals(&self) -> u64 {
        self.shared.inner.lock().removals
    }

    /// The hashes of the blocks that left the registry after the first `count` removals,
    /// oldest first; `None` if they are more than this pool remembers.
    pub fn removed_since(&self, count: u64) -> Option<Vec<SequenceHash>> {
        let inner = self.shared.inner.lock();
        let since = usize::try_from(inner.removals.checked_sub(count)?).ok()?;
        let recent = &inner.recent_removals;
        (since <= recent.len()).then(|| recent.range(recent.len() - since..).copied().collect())
    }
}

#[cfg(test)]
mod tests {
    use super::RECENT_REMOVALS;
    use crate::block::BlockIdentity;
    use crate::ids::LocalBlockHash;
    use crate::pool::{BlockChain, BlockPool, EvictionPolicyKind, PoolConfig};
    use crate::tier::Tier;

    fn pool(capacity: usize) -> BlockPool {
        BlockPool::new(PoolConfig {
            tier: Tier::Device,
            capacity_blocks: capacity,
            block_size_tokens: 4,
            eviction: EvictionPolicyKind::Lru,
        })
        .unwrap()
    }

    /// A chain of `n` blocks starting at local hash `first`, registered and held.
    fn held(pool: &BlockPool, first: u64, n: u64) -> (Vec<BlockIdentity>, BlockChain) {
        let locals: Vec<LocalBlockHash> = (first..first + n).map(LocalBlockHash::new).collect();
        let identities = BlockIdentity::chain(&locals);
        let complete = pool
            .allocate(identities.len())
            .unwrap()
            .into_iter()
            .zip(&identities)
            .map(|(block, identity)| block.apply_identity(*identity))
            .collect();
        (identities, pool.register_chain(complete))
    }

    #[test]
    fn removals_are_remembered_up_to_a_bound() {
        let pool = pool(2);
        assert_eq!((pool.removals(), pool.removed_since(0)), (0, Some(vec![])));
        assert_eq!(pool.removed_since(1), None);
        let (first, chain) = held(&pool, 0, 2);
        pool.release(chain);
        let (_, chain) = held(&pool, 100, 2);
        pool.release(chain);
        // The second chain took the first one's blocks, leaf first.
        assert_eq!(pool.removals(), 2);
        let removed = pool.removed_since(0).unwrap();
        assert_eq!(
            removed,
            vec![first[1].sequence_hash, first[0].sequence_hash]
        );
        assert_eq!(pool.removed_since(1).unwrap(), removed[1..]);
        for round in 0..RECENT_REMOVALS as u64 {
            let (_, chain) = held(&pool, 1000 + 2 * round, 2);
            pool.release(chain);
        }
        let removals = pool.removals();
        assert_eq!(removals, 2 + 2 * RECENT_REMOVALS as u64);
        assert_eq!(
            pool.removed_since(removals - RECENT_REMOVALS as u64)
                .map(|r| r.len()),
            Some(RECENT_REMOVALS)
        );
        assert_eq!(
            pool.removed_since(removals - RECENT_REMOVALS as u64 - 1),
            None
        );
    }

    #[test]
    fn pin_all_references_what_it_finds_in_order_without_counting_hits() {
        let pool = pool(8);
        let (identities, chain) = held(&pool, 0, 3);
        pool.release(chain);
        let hashes = [2, 0].map(|i| identities[i].sequence_hash);
        let missing = crate::ids::SequenceHash::new(7);
        let pinned = pool.pin_all([hashes[0], missing, hashes[1]]);
        let found: Vec<_> = pinned.iter().map(|b| b.sequence_hash()).collect();
        assert_eq!(found, hashes);
        let counts = pool.counts();
        assert_eq!((counts.active, counts.cached), (2, 1));
        assert_eq!(pool.stats().hits_cached_blocks, 0, "a pin is no lookup hit");
        drop(pinned);
        assert_eq!(pool.counts().cached, 3);
    }

    #[test]
    fn checked_blocks_are_skipped_until_one_of_them_goes_stale() {
        let pool = pool(8);
        let (identities, chain) = held(&pool, 0, 4);
        pool.release(chain);
        let hash = |i: usize| identities[i].sequence_hash;
        let mut asked = 0;
        let refused = pool.coldest_unchecked(4, |_| {
            asked += 1;
            true
        });
        assert_eq!((refused.len(), asked), (0, 4));
        assert!(pool.coldest_unchecked(4, |_| unreachable!()).is_empty());
        // A hash this pool does not check changes nothing; one it checks forgets them.
        pool.forget_checked_if_any(&[crate::ids::SequenceHash::new(7)]);
        assert!(pool.coldest_unchecked(4, |_| unreachable!()).is_empty());
        pool.forget_checked_if_any(&[hash(2)]);
        let refused = pool.coldest_unchecked(4, |identity| identity.sequence_hash != hash(3));
        assert_eq!(refused, vec![identities[3]]);
        // Blocks released cold and checked join the checked blocks at the cold end;
        // one released cold unchecked forgets them.
        let (more, chain) = held(&pool, 50, 2);
        pool.release_cold_checked(chain, |_| true);
        let refused = pool.coldest_unchecked(6, |identity| identity.sequence_hash != hash(3));
        assert_eq!(refused, vec![identities[3]]);
        let taken = pool.match_prefix(&[more[0].sequence_hash]);
        pool.release_cold_checked(taken, |_| false);
        let mut asked = Vec::new();
        pool.coldest_unchecked(2, |identity| {
            asked.push(identity.sequence_hash);
            true
        });
        assert_eq!(asked, vec![more[0].sequence_hash, more[1].sequence_hash]);
    }
}
