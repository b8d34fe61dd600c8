//! A kvtwin worker's KV events as a vLLM engine publishes them, so any consumer of vLLM
//! events (kvtwin's router, Dynamo's relay, a vLLM-aware router) can follow a kvtwin
//! worker, real backend or simulator.
//!
//! Owns: [`WorkerPublisher`] (a `ZmqPublisher` with its replay socket, the wire format,
//! and the batch building) and [`PublishError`]. A manager's `KvCacheEvent`s carry
//! kvtwin's sequence hashes and token hashes but not tokens, and vLLM's `BlockStored`
//! carries the tokens (consumers hash them themselves), so the driver, which holds each
//! sequence's tokens, hands them in through a lookup by sequence hash.
//! Never: invent tokens. A stored block whose tokens the lookup does not know fails
//! the batch with [`PublishError::MissingTokens`], before anything is sent.

use crate::wire::{BlockRemoved, BlockStored, EncodeOptions, EngineBatch, EngineEvent};
use crate::zmq::{PublisherConfig, ZmqError, ZmqPublisher};
use kvtwin::events::{KvCacheEvent, KvCacheEventData};
use kvtwin::ids::SequenceHash;

/// Publishing could not go on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PublishError {
    /// The socket.
    #[error(transparent)]
    Zmq(#[from] ZmqError),
    /// The lookup had no tokens for a stored block (or not one block's worth).
    #[error("no tokens for stored block {0:?}")]
    MissingTokens(SequenceHash),
}

/// A kvtwin worker's event stream in vLLM's format; see the module documentation.
#[derive(Debug)]
pub struct WorkerPublisher {
    publisher: ZmqPublisher,
    options: EncodeOptions,
    block_size: u32,
}

impl WorkerPublisher {
    /// Binds the PUB and replay sockets of `config`; batches are written as `options`
    /// says (e.g. `EngineFormat::Vllm0_33.options()`), blocks of `block_size` tokens.
    pub fn bind(
        config: &PublisherConfig,
        options: EncodeOptions,
        block_size: u32,
    ) -> Result<Self, PublishError> {
        Ok(Self {
            publisher: ZmqPublisher::bind(config)?,
            options,
            block_size,
        })
    }

    /// The underlying publisher (its endpoints and counters).
    pub fn publisher(&self) -> &ZmqPublisher {
        &self.publisher
    }

    /// Publishes `events` (in order, one batch per data-parallel rank run) stamped `ts`
    /// (seconds: the wall clock for a real worker, simulated time for the simulator).
    /// `tokens` appends a stored block's tokens to its buffer and says whether it knew
    /// them. Returns the sequence numbers of the batches sent.
    pub fn publish(
        &mut self,
        events: &[KvCacheEvent],
        ts: f64,
        mut tokens: impl FnMut(SequenceHash, &mut Vec<u32>) -> bool,
    ) -> Result<Vec<u64>, PublishError> {
        // Build every batch first: a missing token fails before anything is sent.
        let mut batches: Vec<(u32, Vec<EngineEvent>)> = Vec::new();
        for event in events {
            let wire = self.wire_event(event, &mut tokens)?;
            match batches.last_mut() {
                Some((rank, run)) if *rank == event.dp_rank => run.push(wire),
                _ => batches.push((event.dp_rank, vec![wire])),
            }
        }
        let mut sent = Vec::with_capacity(batches.len());
        for (rank, run) in batches {
            let batch = EngineBatch::new(self.publisher.next_seq(), ts, run, Some(rank));
            sent.push(self.publisher.publish(&batch.to_payload(&self.options))?);
        }
        Ok(sent)
    }

    fn wire_event(
        &self,
        event: &KvCacheEvent,
        tokens: &mut impl FnMut(SequenceHash, &mut Vec<u32>) -> bool,
    ) -> Result<EngineEvent, PublishError> {
        Ok(match &event.data {
            KvCacheEventData::Stored {
                parent_hash,
                blocks,
                tier,
            } => {
                let mut token_ids = Vec::with_capacity(blocks.len() * self.block_size as usize);
                for block in blocks {
                    let before = token_ids.len();
                    let known = tokens(block.block_hash, &mut token_ids);
                    if !known || token_ids.len() - before != self.block_size as usize {
                        return Err(PublishError::MissingTokens(block.block_hash));
                    }
                }
                EngineEvent::BlockStored(BlockStored {
                    block_hashes: blocks.iter().map(|b| b.block_hash.get()).collect(),
                    parent_block_hash: parent_hash.map(SequenceHash::get),
                    token_ids,
                    block_size: self.block_size,
                    medium: Some(*tier),
                    ..BlockStored::default()
                })
            }
            KvCacheEventData::Removed { block_hashes, tier } => {
                EngineEvent::BlockRemoved(BlockRemoved {
                    block_hashes: block_hashes.iter().map(|h| h.get()).collect(),
                    medium: Some(*tier),
                    group_idx: None,
                    kv_cache_spec_kind: None,
                })
            }
            KvCacheEventData::Cleared => EngineEvent::AllBlocksCleared,
        })
    }
}
