//! A worker's KV events as the router service takes them: one worker rank's event with
//! each stored block's tokens hash computed, still in its engine's own block hashes (the
//! stage between an engine batch and a `KvCacheEvent`; see the crate documentation).
//!
//! Owns: [`WorkerEvent`] and [`WorkerEventData`]. Produced from an engine batch
//! (`EngineBatch::worker_events`, the engine's `EngineEvent`s attributed to a worker) or
//! from a Dynamo `RouterEvent` (`RouterEvent::to_worker_event`: the same content, typed so
//! that an engine's opaque hashes are never mistaken for kvtwin's `SequenceHash`es), both
//! in `super::convert`.
//! Never: hold kvtwin's chained hashes (`service::translate` turns these events into
//! `KvCacheEvent`s, per worker) or number events (the source does).

use kvtwin::ids::{LocalBlockHash, WorkerId};
use kvtwin::tier::Tier;

/// What happened, in the engine's hashes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WorkerEventData {
    /// Blocks stored in `tier`, parent first.
    Stored {
        /// The engine hash of the block before the first (none: the sequence's start).
        parent: Option<u64>,
        /// Each block's engine hash and the hash of its tokens.
        blocks: Vec<(u64, LocalBlockHash)>,
        /// Where.
        tier: Tier,
    },
    /// Blocks gone from `tier`.
    Removed {
        /// Their engine hashes.
        hashes: Vec<u64>,
        /// Where from.
        tier: Tier,
    },
    /// Everything the worker held is gone.
    Cleared,
}

/// One KV event of one worker rank, in its engine's hashes, tokens hashes computed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerEvent {
    /// The worker.
    pub worker: WorkerId,
    /// Its data-parallel rank.
    pub dp_rank: u32,
    /// Per-rank event number (a gap means lost events).
    pub event_id: u64,
    /// What happened.
    pub data: WorkerEventData,
}

/// A `Stored` of worker `worker` (rank 0) whose blocks are (engine hash, tokens hash)
/// pairs: the fixture the service's unit tests share.
#[cfg(test)]
pub(crate) fn stored_event(
    worker: u64,
    event_id: u64,
    parent: Option<u64>,
    blocks: &[(u64, u64)],
    tier: Tier,
) -> WorkerEvent {
    WorkerEvent {
        worker: WorkerId::new(worker),
        dp_rank: 0,
        event_id,
        data: WorkerEventData::Stored {
            parent,
            blocks: blocks
                .iter()
                .map(|&(engine, tokens)| (engine, LocalBlockHash::new(tokens)))
                .collect(),
            tier,
        },
    }
}
