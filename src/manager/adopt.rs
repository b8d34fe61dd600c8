//! Adopting blocks a lower tier's storage already holds: a disk tier whose file outlived
//! the process that wrote it, reopened with the index of what each slot holds.
//!
//! Owns: [`Manager::adopt`] and [`AdoptError`].
//! Never: read the bytes (whoever keeps the index vouches for them, and every read is
//! checked anyway), adopt into the device tier (its blocks are computed or onboarded),
//! or leave an orphan (a block whose parent no tier holds is not adopted).

use super::Manager;
use crate::block::BlockIdentity;
use crate::hardware::Hardware;
use crate::ids::{BlockId, SequenceHash, Timestamp};
use crate::pool::AllocError;
use crate::tier::Tier;
use std::collections::BTreeSet;

/// Why blocks could not be adopted; nothing was.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AdoptError {
    /// The tier is the device tier, or not one of the manager's.
    #[error("blocks are adopted into a lower tier the manager has, not {0}")]
    NotALowerTier(Tier),
    /// A block's slot is taken (adopted twice, in use, or beyond the tier's capacity).
    #[error(transparent)]
    Slot(#[from] AllocError),
}

/// What [`Manager::adopt`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Adopted {
    /// Blocks registered in the tier.
    pub blocks: usize,
    /// Blocks left out: their parent is in no tier and not adopted (an index that lost
    /// a parent's entry), or their hash was given twice.
    pub orphans: usize,
}

impl<H: Hardware> Manager<H> {
    /// Registers `blocks` (each a slot of `tier` and the identity of the block its
    /// storage holds) in `tier`, as cached blocks (found by lookups, evictable), with a
    /// `Stored` event each. Blocks are taken parent first (by position) and let go as one
    /// chain, so the deepest are evicted first. A block whose parent is held nowhere is
    /// left out, and its slot stays free.
    pub fn adopt(
        &mut self,
        tier: Tier,
        blocks: &[(BlockId, BlockIdentity)],
        now: Timestamp,
    ) -> Result<Adopted, AdoptError> {
        self.tick(now);
        let pool = match self.pools.get(tier.index()) {
            Some(Some(pool)) if tier != Tier::Device => pool.clone(),
            _ => return Err(AdoptError::NotALowerTier(tier)),
        };
        let mut order: Vec<&(BlockId, BlockIdentity)> = blocks.iter().collect();
        order.sort_by_key(|(_, identity)| identity.position);
        let mut kept: Vec<(BlockId, BlockIdentity)> = Vec::with_capacity(order.len());
        let mut adopted: BTreeSet<SequenceHash> = BTreeSet::new();
        for &(id, identity) in order {
            let parent_held = identity
                .parent
                .is_none_or(|parent| adopted.contains(&parent) || self.holds_anywhere(parent));
            if parent_held && adopted.insert(identity.sequence_hash) {
                kept.push((id, identity));
            }
        }
        let ids: Vec<BlockId> = kept.iter().map(|(id, _)| *id).collect();
        let slots = pool.allocate_ids(&ids)?;
        let complete = slots
            .into_iter()
            .zip(&kept)
            .map(|(slot, (_, identity))| slot.apply_identity(*identity))
            .collect();
        // One block at a time into the chain: the blocks need not be one sequence.
        let registered = pool.register_chain(complete);
        pool.release(registered);
        Ok(Adopted {
            blocks: kept.len(),
            orphans: blocks.len() - kept.len(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::KvCacheEventData;
    use crate::ids::{LocalBlockHash, WorkerId};
    use crate::manager::{ManagerConfig, OffloadPolicy, OnboardPolicy, TierConfig};
    use crate::pool::EvictionPolicyKind;
    use crate::testing::{TestHardware, TransferTiming};

    fn manager() -> Manager<TestHardware> {
        let tier = |tier, capacity_blocks| TierConfig {
            tier,
            capacity_blocks,
            eviction: EvictionPolicyKind::Lru,
            offload: OffloadPolicy::None,
        };
        let config = ManagerConfig {
            worker_id: WorkerId::new(1),
            dp_rank: 0,
            block_size_tokens: 16,
            bytes_per_block: 1024,
            tiers: vec![tier(Tier::Device, 4), tier(Tier::Disk, 8)],
            onboard: OnboardPolicy::Always,
            max_inflight_transfers: 8,
        };
        Manager::new(TestHardware::new(TransferTiming::Instant), config).unwrap()
    }

    fn chain(seed: u64, n: u64) -> Vec<BlockIdentity> {
        let locals: Vec<LocalBlockHash> = (0..n).map(|i| LocalBlockHash::new(seed + i)).collect();
        BlockIdentity::chain(&locals)
    }

    #[test]
    fn a_reopened_tiers_blocks_are_found_where_they_lie_and_orphans_are_left_out() {
        let mut m = manager();
        let kept = chain(100, 3);
        let orphan = chain(200, 2)[1];
        // Children before parents, as an index may list them.
        let blocks = [
            (BlockId::new(7), kept[2]),
            (BlockId::new(1), orphan),
            (BlockId::new(5), kept[0]),
            (BlockId::new(2), kept[1]),
        ];
        let adopted = m.adopt(Tier::Disk, &blocks, Timestamp::ZERO).unwrap();
        assert_eq!(
            adopted,
            Adopted {
                blocks: 3,
                orphans: 1
            }
        );
        let disk = m.pool(Tier::Disk).unwrap();
        let counts = disk.check_invariants();
        assert_eq!((counts.cached, counts.free), (3, 5));
        for (id, identity) in [(5, kept[0]), (2, kept[1]), (7, kept[2])] {
            let block = disk.get(identity.sequence_hash).unwrap();
            assert_eq!(block.block_id(), BlockId::new(id));
        }
        let stored: Vec<SequenceHash> = m
            .take_events()
            .into_iter()
            .flat_map(|event| match event.data {
                KvCacheEventData::Stored { blocks, tier, .. } => {
                    assert_eq!(tier, Tier::Disk);
                    blocks.into_iter().map(|b| b.block_hash).collect::<Vec<_>>()
                }
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            stored,
            kept.iter().map(|i| i.sequence_hash).collect::<Vec<_>>()
        );
        let plan = m.lookup(
            &kept.iter().map(|i| i.sequence_hash).collect::<Vec<_>>(),
            Timestamp::ZERO,
        );
        assert_eq!(plan.onboard_count(Tier::Disk), 3);
    }

    #[test]
    fn a_taken_slot_or_the_device_tier_adopts_nothing() {
        let mut m = manager();
        let blocks = chain(300, 2);
        m.adopt(Tier::Disk, &[(BlockId::new(3), blocks[0])], Timestamp::ZERO)
            .unwrap();
        let taken = [
            (BlockId::new(3), blocks[1]),
            (BlockId::new(4), chain(400, 1)[0]),
        ];
        assert!(matches!(
            m.adopt(Tier::Disk, &taken, Timestamp::ZERO),
            Err(AdoptError::Slot(AllocError::NotFree { .. }))
        ));
        assert_eq!(m.pool(Tier::Disk).unwrap().check_invariants().cached, 1);
        assert_eq!(
            m.adopt(Tier::Device, &[], Timestamp::ZERO),
            Err(AdoptError::NotALowerTier(Tier::Device))
        );
        assert_eq!(
            m.adopt(Tier::Host, &[], Timestamp::ZERO),
            Err(AdoptError::NotALowerTier(Tier::Host))
        );
    }
}
