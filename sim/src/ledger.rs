//! What the simulator keeps of each worker's KV events for the end-of-run rebuild check
//! ([`crate::checkers::rebuild_matches_pools`]): whether the events alone describe the
//! pools.
//!
//! Until a worker's stream first clears (a snapshot starts with `Cleared`), the pools
//! must be exactly what its events stored and did not remove, so a fingerprint of that
//! multiset per tier is enough: a count and a wrapping sum of each hash mixed to 64
//! bits. Applying an event is arithmetic on two words, where the hash sets of a
//! [`RegistryReplica`] cost a cache-missing probe per block (about 5 % of `kvtwin bench
//! sim` on the Mooncake trace). From the first `Cleared` on, the ledger is a
//! [`RegistryReplica`] started there: a snapshot leaves out blocks no prefix lookup can
//! reach, and only the sets can tell those from blocks wrongly missing. A replica
//! started at a `Cleared` holds what one kept from the start would, since `Cleared`
//! empties it.
//!
//! Owns: [`EventLedger`]. Never: reads the pools (the checker compares), or reports an
//! inconsistent event as it comes (the end-of-run check does).

use kvtwin::events::{KvCacheEvent, KvCacheEventData, RegistryReplica};
use kvtwin::ids::SequenceHash;
use kvtwin::tier::Tier;

/// A worker's events, kept for the rebuild check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventLedger {
    /// No `Cleared` yet: per tier, the count and the sum of [`mix`]ed hashes of the
    /// blocks stored and not removed.
    Fingerprint([TierFingerprint; Tier::ALL.len()]),
    /// Since the first `Cleared`: the registry rebuilt from the events.
    Replica(RegistryReplica),
}

/// One tier's multiset of hashes, as a count and a sum (both wrapping).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierFingerprint {
    /// Blocks stored less blocks removed.
    pub count: u64,
    /// The sum of their [`mix`]ed hashes.
    pub sum: u64,
}

impl TierFingerprint {
    /// Adds one block.
    pub fn add(&mut self, hash: SequenceHash) {
        self.count = self.count.wrapping_add(1);
        self.sum = self.sum.wrapping_add(mix(hash));
    }

    /// Takes one block away.
    pub fn remove(&mut self, hash: SequenceHash) {
        self.count = self.count.wrapping_sub(1);
        self.sum = self.sum.wrapping_sub(mix(hash));
    }
}

/// A hash spread over 64 bits (splitmix64's finalizer), so that sums of different sets
/// differ unless chosen to collide; the engine's hashes are already uniform, the mix
/// keeps the fingerprint sound for any hash.
pub fn mix(hash: SequenceHash) -> u64 {
    let mut z = hash.get();
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Default for EventLedger {
    fn default() -> Self {
        Self::new()
    }
}

impl EventLedger {
    /// A ledger of a worker that has published nothing.
    pub fn new() -> Self {
        Self::Fingerprint([TierFingerprint::default(); Tier::ALL.len()])
    }

    /// Applies one event (an inconsistent one shows at the end-of-run check).
    pub fn apply(&mut self, event: &KvCacheEvent) {
        match (&mut *self, &event.data) {
            (Self::Fingerprint(tiers), KvCacheEventData::Stored { blocks, tier, .. }) => {
                let tier = &mut tiers[tier.index()];
                for block in blocks {
                    tier.add(block.block_hash);
                }
            }
            (Self::Fingerprint(tiers), KvCacheEventData::Removed { block_hashes, tier }) => {
                let tier = &mut tiers[tier.index()];
                for &hash in block_hashes {
                    tier.remove(hash);
                }
            }
            (Self::Fingerprint(_), KvCacheEventData::Cleared) => {
                // What the `Cleared` leaves: an empty replica. Its event-id gaps are
                // never read (the simulator never read the sets' either).
                *self = Self::Replica(RegistryReplica::new());
            }
            (Self::Replica(replica), _) => {
                let _ = replica.apply(event);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvtwin::events::StoredBlock;
    use kvtwin::ids::LocalBlockHash;

    fn event(data: KvCacheEventData) -> KvCacheEvent {
        KvCacheEvent {
            event_id: 0,
            dp_rank: 0,
            data,
        }
    }

    fn stored(hashes: &[u64], tier: Tier) -> KvCacheEvent {
        event(KvCacheEventData::Stored {
            parent_hash: None,
            blocks: hashes
                .iter()
                .map(|&h| StoredBlock {
                    block_hash: SequenceHash::new(h),
                    tokens_hash: LocalBlockHash::new(h),
                })
                .collect(),
            tier,
        })
    }

    fn removed(hashes: &[u64], tier: Tier) -> KvCacheEvent {
        event(KvCacheEventData::Removed {
            block_hashes: hashes.iter().map(|&h| SequenceHash::new(h)).collect(),
            tier,
        })
    }

    fn fingerprint(hashes: &[u64]) -> TierFingerprint {
        let mut tier = TierFingerprint::default();
        for &h in hashes {
            tier.add(SequenceHash::new(h));
        }
        tier
    }

    #[test]
    fn the_fingerprint_is_the_multiset_stored_and_not_removed_whatever_the_order() {
        let mut ledger = EventLedger::new();
        ledger.apply(&stored(&[1, 2, 3], Tier::Device));
        ledger.apply(&stored(&[7], Tier::Host));
        ledger.apply(&removed(&[2], Tier::Device));
        ledger.apply(&stored(&[4], Tier::Device));
        let EventLedger::Fingerprint(tiers) = &ledger else {
            panic!("no Cleared yet: {ledger:?}");
        };
        assert_eq!(tiers[Tier::Device.index()], fingerprint(&[4, 3, 1]));
        assert_eq!(tiers[Tier::Host.index()], fingerprint(&[7]));
        assert_eq!(tiers[Tier::Disk.index()], TierFingerprint::default());
        // Another set of the same size differs, and so does a block stored twice.
        assert_ne!(tiers[Tier::Device.index()], fingerprint(&[4, 3, 2]));
        assert_ne!(tiers[Tier::Device.index()], fingerprint(&[4, 3, 1, 1]));
    }

    #[test]
    fn a_cleared_turns_the_ledger_into_a_replica_of_what_follows() {
        let mut ledger = EventLedger::new();
        ledger.apply(&stored(&[1, 2], Tier::Device));
        ledger.apply(&event(KvCacheEventData::Cleared));
        ledger.apply(&stored(&[5, 6], Tier::Device));
        // A block the snapshot left out goes: the replica counts it and keeps the rest.
        ledger.apply(&removed(&[2, 6], Tier::Device));
        let EventLedger::Replica(replica) = &ledger else {
            panic!("a Cleared came: {ledger:?}");
        };
        assert_eq!(
            replica.hashes(Tier::Device).into_iter().collect::<Vec<_>>(),
            [SequenceHash::new(5)]
        );
        assert_eq!(replica.count(Tier::Host), 0);
    }
}
