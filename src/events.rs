//! KV cache events: what a worker tells the router about its blocks.
//!
//! Owns: [`KvCacheEvent`] and its payload (Dynamo's `KvCacheEvent`: `Stored`, `Removed`,
//! `Cleared`, plus the tier), the [`EventSink`] / [`EventSource`] traits of the event plane,
//! and [`RegistryReplica`], the minimal consumer that rebuilds per-tier registries from a
//! stream (used to check the invariant that events alone rebuild router state).
//! Never: hold a transport. Pools and the manager queue events in an outbox; drivers drain
//! it and hand batches to a sink.

use crate::ids::{LocalBlockHash, SequenceHash};
use crate::tier::Tier;
use rustc_hash::FxHashSet;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;

/// One block of a `Stored` event.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct StoredBlock {
    /// The block's sequence hash (the registry key).
    pub block_hash: SequenceHash,
    /// The hash of the block's tokens alone (what the router matches queries on).
    pub tokens_hash: LocalBlockHash,
}

/// What happened to a worker's cache.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub enum KvCacheEventData {
    /// Blocks became findable in `tier`; `blocks` form a chain, the first one's parent is
    /// `parent_hash` (none for a chain starting at the first block of a sequence).
    Stored {
        /// The sequence hash of the block before `blocks[0]`.
        parent_hash: Option<SequenceHash>,
        /// The stored blocks, parent first.
        blocks: Vec<StoredBlock>,
        /// Where they are stored.
        tier: Tier,
    },
    /// Blocks stopped being findable in `tier` (evicted or invalidated).
    Removed {
        /// The removed blocks.
        block_hashes: Vec<SequenceHash>,
        /// Where they were stored.
        tier: Tier,
    },
    /// Every block of the worker, in every tier, is gone.
    Cleared,
}

/// One event, numbered per worker.
#[derive(Clone, PartialEq, Eq, Debug, Serialize, Deserialize)]
pub struct KvCacheEvent {
    /// Monotonic per worker, starting at 0 and increasing by one per event, so consumers
    /// can detect gaps.
    pub event_id: u64,
    /// Data-parallel rank of the engine that emitted it.
    pub dp_rank: u32,
    /// What happened.
    pub data: KvCacheEventData,
}

/// Where a driver hands drained events (in-process bus, ZMQ, NATS).
pub trait EventSink {
    /// The sink's error (a full bounded queue, a closed transport).
    type Error: std::error::Error;

    /// Publishes `events` in order.
    fn publish(&mut self, events: &[KvCacheEvent]) -> Result<(), Self::Error>;
}

/// Where a consumer reads events from.
pub trait EventSource {
    /// The source's error.
    type Error: std::error::Error;

    /// The next event, if one is ready.
    fn try_next(&mut self) -> Result<Option<KvCacheEvent>, Self::Error>;
}

/// Per-tier sets of registered hashes rebuilt from events alone.
///
/// The simplest consumer of the event stream: the proptest models use it to check that
/// what the pools emitted describes exactly what they hold. The simulator keeps one per
/// worker and applies every event to it, so the sets are hash sets (a sorted set cost a
/// tenth of a simulation in comparisons); their order is never seen: [`Self::hashes`]
/// sorts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegistryReplica {
    tiers: [FxHashSet<SequenceHash>; 4],
    next_event_id: u64,
}

/// Why [`RegistryReplica::apply`] could not apply an event as it stands.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReplicaError {
    /// The event id is not the next one expected: events were lost or reordered.
    #[error("event id gap: expected {expected}, got {got}")]
    EventIdGap {
        /// The id the replica expected.
        expected: u64,
        /// The id it got.
        got: u64,
    },
    /// A `Stored` named a block the tier already held.
    #[error("block {hash:?} stored twice in tier {tier}")]
    DuplicateStore {
        /// The block.
        hash: SequenceHash,
        /// The tier.
        tier: Tier,
    },
    /// A `Removed` named a block the tier did not hold.
    #[error("block {hash:?} removed from tier {tier} but never stored there")]
    UnknownRemoval {
        /// The block.
        hash: SequenceHash,
        /// The tier.
        tier: Tier,
    },
}

impl RegistryReplica {
    /// An empty replica expecting event id 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies one event. An inconsistent event is reported; the rest of it is still
    /// applied so the replica stays as close to the source as the stream allows.
    pub fn apply(&mut self, event: &KvCacheEvent) -> Result<(), ReplicaError> {
        let mut first_error = None;
        if event.event_id != self.next_event_id {
            first_error = Some(ReplicaError::EventIdGap {
                expected: self.next_event_id,
                got: event.event_id,
            });
        }
        self.next_event_id = event.event_id.wrapping_add(1);
        match &event.data {
            KvCacheEventData::Stored { blocks, tier, .. } => {
                for block in blocks {
                    if !self.tiers[tier.index()].insert(block.block_hash) {
                        first_error.get_or_insert(ReplicaError::DuplicateStore {
                            hash: block.block_hash,
                            tier: *tier,
                        });
                    }
                }
            }
            KvCacheEventData::Removed { block_hashes, tier } => {
                for hash in block_hashes {
                    if !self.tiers[tier.index()].remove(hash) {
                        first_error.get_or_insert(ReplicaError::UnknownRemoval {
                            hash: *hash,
                            tier: *tier,
                        });
                    }
                }
            }
            KvCacheEventData::Cleared => self.tiers.iter_mut().for_each(FxHashSet::clear),
        }
        first_error.map_or(Ok(()), Err)
    }

    /// The hashes `tier` holds, sorted.
    pub fn hashes(&self, tier: Tier) -> BTreeSet<SequenceHash> {
        self.tiers[tier.index()].iter().copied().collect()
    }

    /// Whether `tier` holds `hash`.
    pub fn contains(&self, tier: Tier, hash: SequenceHash) -> bool {
        self.tiers[tier.index()].contains(&hash)
    }

    /// How many hashes `tier` holds.
    pub fn count(&self, tier: Tier) -> usize {
        self.tiers[tier.index()].len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(id: u64, hashes: &[u64], tier: Tier) -> KvCacheEvent {
        KvCacheEvent {
            event_id: id,
            dp_rank: 0,
            data: KvCacheEventData::Stored {
                parent_hash: None,
                blocks: hashes
                    .iter()
                    .map(|&h| StoredBlock {
                        block_hash: SequenceHash::new(h),
                        tokens_hash: LocalBlockHash::new(h),
                    })
                    .collect(),
                tier,
            },
        }
    }

    #[test]
    fn replica_tracks_stores_removals_and_clears_per_tier() {
        let mut replica = RegistryReplica::new();
        replica.apply(&stored(0, &[1, 2], Tier::Device)).unwrap();
        replica.apply(&stored(1, &[2], Tier::Host)).unwrap();
        let removed = KvCacheEvent {
            event_id: 2,
            dp_rank: 0,
            data: KvCacheEventData::Removed {
                block_hashes: vec![SequenceHash::new(1)],
                tier: Tier::Device,
            },
        };
        replica.apply(&removed).unwrap();
        let device: Vec<u64> = replica
            .hashes(Tier::Device)
            .iter()
            .map(|h| h.get())
            .collect();
        assert_eq!(device, vec![2]);
        assert_eq!(replica.hashes(Tier::Host).len(), 1);
        let cleared = KvCacheEvent {
            event_id: 3,
            dp_rank: 0,
            data: KvCacheEventData::Cleared,
        };
        replica.apply(&cleared).unwrap();
        assert!(replica.hashes(Tier::Device).is_empty() && replica.hashes(Tier::Host).is_empty());
    }

    #[test]
    fn replica_reports_gaps_duplicates_and_unknown_removals() {
        let mut replica = RegistryReplica::new();
        assert_eq!(
            replica.apply(&stored(5, &[1], Tier::Device)),
            Err(ReplicaError::EventIdGap {
                expected: 0,
                got: 5
            })
        );
        assert!(matches!(
            replica.apply(&stored(6, &[1], Tier::Device)),
            Err(ReplicaError::DuplicateStore { .. })
        ));
        let removed = KvCacheEvent {
            event_id: 7,
            dp_rank: 0,
            data: KvCacheEventData::Removed {
                block_hashes: vec![SequenceHash::new(9)],
                tier: Tier::Disk,
            },
        };
        assert!(matches!(
            replica.apply(&removed),
            Err(ReplicaError::UnknownRemoval { .. })
        ));
    }
}
