//! The storage advisor's pure part: a shared tier's what-ifs from a recorded event
//! stream. Every `Stored` event is an engine storing blocks it had to compute (a miss of
//! its own cache): a shared tier beside the engines would have been asked for them, and
//! would have served the leading run it held. Replaying the stream through a tier of a
//! given size under a policy ([`policy`]) says how many of those blocks it would have
//! served, how many of them another worker had stored (the cross-worker hits a shared
//! tier exists for), and the bytes it would have read, written and dropped.
//!
//! The access of one event follows `crate::cache`'s replay: its blocks are looked up
//! first (the leading run held is the hit), then used from the last to the first (held
//! ones as hits, others offered to the tier). With LRU, a stream whose events are whole
//! requests from their first block is exactly `kvtwin cache --curve`'s reference string,
//! and the hits agree at every size (the tests check it).
//!
//! The live advisor (`kvtwin advisor --nats/--zmq`) keeps, beside a window of these
//! accesses, an index of the event plane ([`index`]: per block its prefix, size,
//! holders and access counts; per worker rank and tier the occupancy; reuse distances
//! from [`distance`]) and reports from both ([`report`]): hot and cold sets, promotions,
//! demotions, and tier sizes from the window replayed here ([`sizing`]).
//!
//! Owns: [`Access`], [`replay`] and [`ReplayRow`]; [`policy`], [`distance`], [`index`],
//! [`sizing`] and [`report`] below. Never: reads files or sockets (the command line
//! decodes events), reads a clock, or iterates a hash map.

pub mod distance;
pub mod index;
pub mod policy;
pub mod report;
pub mod sizing;

use kvtwin::events::{KvCacheEvent, KvCacheEventData};
use kvtwin::ids::{SequenceHash, WorkerId};
use policy::{Policy, TierCache};
use rustc_hash::FxHashMap;
use serde::Serialize;

/// One worker's blocks asked of the shared tier, first block first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Access {
    /// Who asked.
    pub worker: WorkerId,
    /// The blocks, a chain, first block first.
    pub blocks: Vec<SequenceHash>,
}

impl Access {
    /// The access of one event: a `Stored` event's blocks; nothing for the others.
    pub fn of_event(worker: WorkerId, event: &KvCacheEvent) -> Option<Access> {
        match &event.data {
            KvCacheEventData::Stored { blocks, .. } if !blocks.is_empty() => Some(Access {
                worker,
                blocks: blocks.iter().map(|b| b.block_hash).collect(),
            }),
            _ => None,
        }
    }
}

/// One policy at one size over a whole stream.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ReplayRow {
    /// The policy.
    pub policy: &'static str,
    /// The tier's size, blocks.
    pub capacity_blocks: usize,
    /// Blocks asked of the tier.
    pub lookup_blocks: u64,
    /// Of them, served (each access's leading run held).
    pub hit_blocks: u64,
    /// Of the hits, blocks another worker had put there.
    pub cross_worker_hit_blocks: u64,
    /// `hit_blocks / lookup_blocks`.
    pub hit_ratio: f64,
    /// Blocks written into the tier.
    pub inserted_blocks: u64,
    /// Blocks it dropped for room.
    pub evicted_blocks: u64,
    /// Bytes read out of it (hits), written into it and dropped, at `block_bytes`.
    pub read_bytes: u64,
    /// See `read_bytes`.
    pub written_bytes: u64,
    /// See `read_bytes`.
    pub evicted_bytes: u64,
}

/// `accesses` through a tier of `capacity_blocks` under `policy`, each block
/// `block_bytes` long.
pub fn replay(
    accesses: &[Access],
    policy: Policy,
    capacity_blocks: usize,
    block_bytes: u64,
) -> ReplayRow {
    let mut tier: Box<dyn TierCache> = policy.cache(capacity_blocks);
    // Who put each held block there: looked up, never iterated.
    let mut owner: FxHashMap<SequenceHash, WorkerId> = FxHashMap::default();
    let (mut lookups, mut hits, mut cross, mut inserted, mut evicted) = (0u64, 0, 0, 0, 0);
    for access in accesses {
        lookups += access.blocks.len() as u64;
        for block in &access.blocks {
            if !tier.contains(*block) {
                break;
            }
            hits += 1;
            if owner.get(block).is_some_and(|w| *w != access.worker) {
                cross += 1;
            }
        }
        for block in access.blocks.iter().rev() {
            if tier.contains(*block) {
                tier.hit(*block);
            } else {
                let out = tier.insert(*block);
                evicted += out.len() as u64;
                for gone in out {
                    owner.remove(&gone);
                }
                if tier.contains(*block) {
                    inserted += 1;
                    owner.insert(*block, access.worker);
                }
            }
        }
    }
    ReplayRow {
        policy: policy.name(),
        capacity_blocks,
        lookup_blocks: lookups,
        hit_blocks: hits,
        cross_worker_hit_blocks: cross,
        hit_ratio: if lookups == 0 {
            0.0
        } else {
            hits as f64 / lookups as f64
        },
        inserted_blocks: inserted,
        evicted_blocks: evicted,
        read_bytes: hits * block_bytes,
        written_bytes: inserted * block_bytes,
        evicted_bytes: evicted * block_bytes,
    }
}

#[cfg(test)]
mod tests;
