//! From one wire form to another: what a relay and a router do with decoded events.
//!
//! Owns: engine batch → the router service's [`WorkerEvent`]s
//! ([`EngineBatch::worker_events`]) and → Dynamo [`RouterEvent`]s
//! ([`EngineBatch::router_events`], the ZMQ → NATS relay), `RouterEvent` → `WorkerEvent`
//! (a router fed from NATS) and → the indexer's own input ([`RouterEvent::indexer_input`],
//! for publishers whose block hashes are kvtwin's chained ones), and
//! [`EngineDecoder::decode_raw`] (a transported batch straight to worker events).
//!
//! The tokens hash of each stored block is computed here from the event's token ids
//! (xxh3 under `HashSeed::for_request`: 1337, mixed with the event's LoRA adapter and the
//! request's cache salt as Dynamo mixes them, DESIGN.md), one block's slice at a time,
//! without allocating unless the block has extra keys (multimodal hashes appended as
//! Dynamo appends them; keys nobody interprets mixed in: `super::extra_keys`). Per engine
//! state (the salt along a chain, learned KV cache groups) is `super::normalize`'s.
//! Never: translate engine hashes into kvtwin's (`service::translate` does, per worker),
//! number events on its own (callers hand in the next event id), or apply anything.

use super::dynamo::RouterEvent;
use super::engine::{BlockStored, EngineBatch, EngineDecoder};
use super::extra_keys::BlockExtras;
use super::frames::RawBatch;
use super::normalize::{EngineNormalizer, Normalized};
use super::worker::{WorkerEvent, WorkerEventData};
use super::{DropCounters, WireError};
use kvtwin::events::{KvCacheEvent, KvCacheEventData, StoredBlock};
use kvtwin::ids::{LocalBlockHash, SequenceHash, WorkerId};
use kvtwin::tokens::{compute_local_hash, HashSeed};
use xxhash_rust::xxh3::Xxh3;

/// Refused when the token ids are not `block_size` per block.
pub(crate) fn check_fits(stored: &BlockStored) -> Result<(), WireError> {
    let blocks = stored.block_hashes.len();
    let block_size = stored.block_size as usize;
    let fits = (block_size > 0 || blocks == 0)
        && blocks.checked_mul(block_size) == Some(stored.token_ids.len());
    if !fits {
        return Err(WireError::TokenCountMismatch {
            blocks,
            block_size: stored.block_size,
            tokens: stored.token_ids.len(),
        });
    }
    Ok(())
}

/// Each stored block's engine hash with the hash of its tokens, in order: seeded with
/// the event's LoRA adapter and `salt` as Dynamo seeds them
/// (`HashSeed::for_request`), extended with the block's multimodal and uninterpreted
/// `extra_keys` (`BlockExtras`; the first block of a request does not count `salt`
/// among them). Refused when the token ids are not `block_size` per block.
pub(crate) fn stored_blocks_seeded<'a>(
    stored: &'a BlockStored,
    salt: Option<&'a str>,
) -> Result<impl Iterator<Item = (u64, LocalBlockHash)> + 'a, WireError> {
    check_fits(stored)?;
    let lora = stored.lora_name.as_deref();
    let seed = HashSeed::for_request(lora, salt);
    let block_size = stored.block_size as usize;
    // max(1): `chunks_exact` needs a non-zero size; with no blocks there are no tokens.
    let chunks = stored.token_ids.chunks_exact(block_size.max(1));
    let starts_request = stored.parent_block_hash.is_none();
    Ok(stored
        .block_hashes
        .iter()
        .zip(chunks)
        .enumerate()
        .map(move |(index, (hash, tokens))| {
            let keys = stored
                .extra_keys
                .as_ref()
                .and_then(|blocks| blocks.get(index))
                .and_then(Option::as_ref);
            let local = match keys {
                None => compute_local_hash(tokens, seed),
                Some(keys) => {
                    let salt_here = salt.filter(|_| index == 0 && starts_request);
                    let extras = BlockExtras::of(keys, lora, salt_here);
                    hash_with_extras(tokens, seed, &extras)
                }
            };
            (*hash, local)
        }))
}

/// A block's tokens hash with its extra keys: xxh3-64 under `seed` of the tokens as u32
/// little-endian, then `extras`' suffix (Dynamo's multimodal layout: the sorted hashes as
/// u64 little-endian). Without extras, the plain tokens hash.
fn hash_with_extras(tokens: &[u32], seed: HashSeed, extras: &BlockExtras) -> LocalBlockHash {
    if extras.is_empty() {
        return compute_local_hash(tokens, seed);
    }
    let mut hasher = Xxh3::with_seed(seed.get());
    for token in tokens {
        hasher.update(&token.to_le_bytes());
    }
    hasher.update(&extras.suffix());
    LocalBlockHash::new(hasher.digest())
}

/// One normalised event as the router service applies it (`worker_events`' element).
fn worker_data(event: Normalized<'_>) -> WorkerEventData {
    match event {
        Normalized::Stored { stored, blocks } => WorkerEventData::Stored {
            parent: stored.parent_block_hash,
            blocks,
            tier: stored.tier(),
        },
        Normalized::Removed(removed) => WorkerEventData::Removed {
            hashes: removed.block_hashes.clone(),
            tier: removed.tier(),
        },
        Normalized::Cleared => WorkerEventData::Cleared,
    }
}

/// One normalised event as Dynamo's `RouterEvent` data carries it.
fn router_data(event: Normalized<'_>) -> KvCacheEventData {
    match event {
        Normalized::Stored { stored, blocks } => KvCacheEventData::Stored {
            parent_hash: stored.parent_block_hash.map(SequenceHash::new),
            blocks: blocks
                .into_iter()
                .map(|(hash, tokens_hash)| StoredBlock {
                    block_hash: SequenceHash::new(hash),
                    tokens_hash,
                })
                .collect(),
            tier: stored.tier(),
        },
        Normalized::Removed(removed) => KvCacheEventData::Removed {
            block_hashes: removed
                .block_hashes
                .iter()
                .map(|hash| SequenceHash::new(*hash))
                .collect(),
            tier: removed.tier(),
        },
        Normalized::Cleared => KvCacheEventData::Cleared,
    }
}

impl EngineNormalizer {
    /// Appends `batch`'s events of `worker`, as the router service applies them, to
    /// `out`: event ids 0 (the source numbers them per rank), rank 0 when the batch has
    /// none; events of a group the index does not keep are left out, their reasons
    /// pushed onto `filtered`. All or nothing: on an error `out` is left as it was.
    pub fn worker_events(
        &mut self,
        batch: &EngineBatch,
        worker: WorkerId,
        out: &mut Vec<WorkerEvent>,
        filtered: &mut Vec<&'static str>,
    ) -> Result<(), WireError> {
        let normalized = self.normalize(batch, filtered)?;
        let dp_rank = batch.dp_rank.unwrap_or(0);
        out.extend(normalized.into_iter().map(|event| WorkerEvent {
            worker,
            dp_rank,
            event_id: 0,
            data: worker_data(event),
        }));
        Ok(())
    }

    /// Appends `batch`'s events as Dynamo `RouterEvent`s of `worker` to `out`, what a
    /// relay publishes: event ids from `*next_event_id` on (advanced past them; the
    /// caller keeps one counter per rank), the engine's hashes as the block ids, tokens
    /// hashes computed as Dynamo's router computes them; filtered as
    /// [`EngineNormalizer::worker_events`]. All or nothing: on an error neither `out`
    /// nor the counter moves.
    pub fn router_events(
        &mut self,
        batch: &EngineBatch,
        worker: WorkerId,
        next_event_id: &mut u64,
        out: &mut Vec<RouterEvent>,
        filtered: &mut Vec<&'static str>,
    ) -> Result<(), WireError> {
        let normalized = self.normalize(batch, filtered)?;
        let dp_rank = batch.dp_rank.unwrap_or(0);
        out.reserve(normalized.len());
        for event in normalized {
            out.push(RouterEvent {
                worker_id: worker,
                event: KvCacheEvent {
                    event_id: *next_event_id,
                    dp_rank,
                    data: router_data(event),
                },
            });
            *next_event_id = next_event_id.wrapping_add(1);
        }
        Ok(())
    }
}

impl EngineBatch {
    /// [`EngineNormalizer::worker_events`] with a normaliser of its own: right for a
    /// batch alone (a salt carried by an earlier batch is not known, and events of a
    /// group left out are not counted). Sources keep one normaliser per engine.
    pub fn worker_events(
        &self,
        worker: WorkerId,
        out: &mut Vec<WorkerEvent>,
    ) -> Result<(), WireError> {
        EngineNormalizer::default().worker_events(self, worker, out, &mut Vec::new())
    }

    /// [`EngineNormalizer::router_events`] with a normaliser of its own, as
    /// [`EngineBatch::worker_events`].
    pub fn router_events(
        &self,
        worker: WorkerId,
        next_event_id: &mut u64,
        out: &mut Vec<RouterEvent>,
    ) -> Result<(), WireError> {
        EngineNormalizer::default().router_events(self, worker, next_event_id, out, &mut Vec::new())
    }
}

impl RouterEvent {
    /// The event as the router service applies it: block ids as opaque engine hashes,
    /// translated per worker into kvtwin's chained hashes by `EngineHashes`. Right for
    /// any publisher, the relay of a vLLM engine included.
    pub fn to_worker_event(&self) -> WorkerEvent {
        self.clone().into_worker_event()
    }

    /// [`RouterEvent::to_worker_event`] by value: the block lists are converted where
    /// they lie (a block and its pair have one size), so the router's decode of an
    /// envelope allocates each list once.
    pub fn into_worker_event(self) -> WorkerEvent {
        let data = match self.event.data {
            KvCacheEventData::Stored {
                parent_hash,
                blocks,
                tier,
            } => WorkerEventData::Stored {
                parent: parent_hash.map(SequenceHash::get),
                blocks: blocks
                    .into_iter()
                    .map(|block| (block.block_hash.get(), block.tokens_hash))
                    .collect(),
                tier,
            },
            KvCacheEventData::Removed { block_hashes, tier } => WorkerEventData::Removed {
                hashes: block_hashes.into_iter().map(SequenceHash::get).collect(),
                tier,
            },
            KvCacheEventData::Cleared => WorkerEventData::Cleared,
        };
        WorkerEvent {
            worker: self.worker_id,
            dp_rank: self.event.dp_rank,
            event_id: self.event.event_id,
            data,
        }
    }

    /// The arguments of `KvIndexer::apply`, for a publisher whose block hashes already
    /// are kvtwin's chained sequence hashes (a kvtwin worker; Dynamo's own KVBM). The
    /// indexer verifies the chain, so an engine's opaque hashes fed this way are refused
    /// as `ChainMismatch`, never indexed wrongly: those go through
    /// [`RouterEvent::to_worker_event`].
    pub fn indexer_input(&self) -> (WorkerId, &KvCacheEvent) {
        (self.worker_id, &self.event)
    }
}

impl From<&RouterEvent> for WorkerEvent {
    fn from(event: &RouterEvent) -> Self {
        event.to_worker_event()
    }
}

impl EngineDecoder {
    /// Decodes one transported batch into the router service's events of `worker`,
    /// counting any event it left out (unknown type or medium) in `skipped`.
    pub fn decode_raw(
        &self,
        worker: WorkerId,
        batch: &RawBatch,
        skipped: &mut DropCounters,
    ) -> Result<Vec<WorkerEvent>, WireError> {
        let decoded = self.decode_payload(batch.seq, &batch.payload)?;
        for event in &decoded.skipped {
            skipped.record(&event.error);
        }
        let mut events = Vec::with_capacity(decoded.events.len());
        decoded.worker_events(worker, &mut events)?;
        Ok(events)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::engine::{BlockRemoved, EngineEvent};
    use kvtwin::tier::Tier;
    use kvtwin::tokens::compute_local_hashes;

    fn batch() -> EngineBatch {
        EngineBatch::new(
            4,
            1.5,
            vec![
                EngineEvent::BlockStored(BlockStored {
                    block_hashes: vec![0xa1, 0xa2],
                    parent_block_hash: None,
                    token_ids: (1..=8).collect(),
                    block_size: 4,
                    ..BlockStored::default()
                }),
                EngineEvent::BlockStored(BlockStored {
                    block_hashes: vec![0xa3],
                    parent_block_hash: Some(0xa2),
                    token_ids: (9..=12).collect(),
                    block_size: 4,
                    medium: Some(Tier::Host),
                    ..BlockStored::default()
                }),
                EngineEvent::BlockRemoved(BlockRemoved {
                    block_hashes: vec![0xa1],
                    ..BlockRemoved::default()
                }),
                EngineEvent::AllBlocksCleared,
            ],
            Some(2),
        )
    }

    #[test]
    fn worker_events_carry_the_tokens_hash_of_each_block() {
        let mut events = Vec::new();
        batch()
            .worker_events(WorkerId::new(9), &mut events)
            .unwrap();
        assert_eq!(events.len(), 4);
        // DESIGN.md's vector: [1..=12] in blocks of 4.
        let locals = compute_local_hashes(&(1..=12).collect::<Vec<_>>(), 4, HashSeed::default());
        assert_eq!(locals[0].get(), 14_643_705_804_678_351_452);
        assert_eq!(
            events[0].data,
            WorkerEventData::Stored {
                parent: None,
                blocks: vec![(0xa1, locals[0]), (0xa2, locals[1])],
                tier: Tier::Device
            }
        );
        assert!(matches!(
            &events[1].data,
            WorkerEventData::Stored { parent: Some(0xa2), blocks, tier: Tier::Host }
                if blocks == &[(0xa3, locals[2])]
        ));
        assert!(events
            .iter()
            .all(|e| e.dp_rank == 2 && e.worker == WorkerId::new(9)));
    }

    #[test]
    fn a_lora_adapter_seeds_the_tokens_hash() {
        let stored = BlockStored {
            block_hashes: vec![1],
            token_ids: (0..16).collect(),
            block_size: 16,
            lora_name: Some("myLora".into()),
            ..BlockStored::default()
        };
        let blocks: Vec<_> = stored_blocks_seeded(&stored, None).unwrap().collect();
        assert_eq!(blocks[0].1.get(), 4_658_809_429_412_599_326);
    }

    #[test]
    fn token_counts_that_do_not_fill_the_blocks_refuse_the_batch_whole() {
        let mut bad = batch();
        if let EngineEvent::BlockStored(stored) = &mut bad.events[1] {
            stored.token_ids.pop();
        }
        let mut events = vec![];
        let error = bad
            .worker_events(WorkerId::new(1), &mut events)
            .unwrap_err();
        assert_eq!(error.reason(), "token_count_mismatch");
        assert!(events.is_empty());
        let mut routed = vec![];
        let mut next = 5;
        assert!(bad
            .router_events(WorkerId::new(1), &mut next, &mut routed)
            .is_err());
        assert_eq!((routed.len(), next), (0, 5));
        let zero = BlockStored {
            block_hashes: vec![1],
            block_size: 0,
            ..BlockStored::default()
        };
        assert!(stored_blocks_seeded(&zero, None).is_err());
        let empty = BlockStored::default();
        assert_eq!(stored_blocks_seeded(&empty, None).unwrap().count(), 0);
    }

    #[test]
    fn relayed_router_events_come_back_as_the_same_worker_events() {
        let batch = batch();
        let mut routed = Vec::new();
        let mut next = 10;
        batch
            .router_events(WorkerId::new(9), &mut next, &mut routed)
            .unwrap();
        assert_eq!(next, 14);
        assert_eq!(
            routed.iter().map(|e| e.event.event_id).collect::<Vec<_>>(),
            [10, 11, 12, 13]
        );
        let mut direct = Vec::new();
        batch.worker_events(WorkerId::new(9), &mut direct).unwrap();
        for (router, mut worker_event) in routed.iter().zip(direct) {
            worker_event.event_id = router.event.event_id;
            assert_eq!(router.to_worker_event(), worker_event);
            assert_eq!(router.clone().into_worker_event(), worker_event);
            assert_eq!(WorkerEvent::from(router), worker_event);
        }
    }

    #[test]
    fn the_indexer_takes_router_events_with_kvtwin_hashes_directly() {
        use kvtwin::router::indexer::KvIndexer;
        use kvtwin::tokens::chain_sequence_hash;
        let local = LocalBlockHash::new(77);
        let event = RouterEvent {
            worker_id: WorkerId::new(1),
            event: KvCacheEvent {
                event_id: 0,
                dp_rank: 0,
                data: KvCacheEventData::Stored {
                    parent_hash: None,
                    blocks: vec![StoredBlock {
                        block_hash: chain_sequence_hash(None, local),
                        tokens_hash: local,
                    }],
                    tier: Tier::Device,
                },
            },
        };
        let mut indexer = KvIndexer::new();
        let (worker, kv) = event.indexer_input();
        indexer.apply(worker, kv).unwrap();
        assert_eq!(indexer.find_matches(&[local], false).max(), 1);
    }
}
