//! The publishing ends of the store's events: vLLM's KV event batches on a ZMQ PUB socket
//! (with its replay ROUTER: the plane's `ZmqPublisher`), and Dynamo's `RouterEvent` JSON
//! on a NATS subject (the plane's `NatsPublisher`), medium `EXTERNAL` / tier `external`.
//!
//! Owns: [`start_zmq`] (a thread draining the ZMQ transport's queue into batches, one
//! block size a batch so a router refuses only batches of sizes it does not use) and
//! [`run_nats`] (a task doing the same onto NATS, one `RouterEvent` a run, numbered from
//! 0 with the store's worker id). Block hashes are kvtwin's sequence hashes (the keys'),
//! tokens hashes the xxh3 of each block's tokens with the default seed.
//! Never: wait on the store (they only drain their queues), retry a failed publish
//! (counted; a router that misses a ZMQ batch asks the replay socket for it), or log
//! more than one warning per transport per `WARN_INTERVAL`.

use super::{runs, EventReceiver, Run, StoreEvent, MAX_BATCH_EVENTS};
use kvtwin::events::{KvCacheEvent, KvCacheEventData, StoredBlock};
use kvtwin::ids::{SequenceHash, WorkerId};
use kvtwin::tier::Tier;
use kvtwin::tokens::{compute_local_hashes, HashSeed, DEFAULT_HASH_SEED};
use kvtwin_plane::nats::NatsPublisher;
use kvtwin_plane::service::warn::WarnLimiter;
use kvtwin_plane::wire::engine::EngineFormat;
use kvtwin_plane::wire::{BlockRemoved, BlockStored, EngineBatch, EngineEvent, RouterEvent};
use kvtwin_plane::zmq::{ZmqError, ZmqPublisher};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// The next events of `receiver`'s queue: waits for one, then takes what else is
/// there, up to [`MAX_BATCH_EVENTS`].
fn more(receiver: &mut EventReceiver, first: Arc<StoreEvent>) -> Vec<Arc<StoreEvent>> {
    let mut events = vec![first];
    while events.len() < MAX_BATCH_EVENTS {
        match receiver.queue.try_recv() {
            Ok(event) => events.push(event),
            Err(_) => break,
        }
    }
    events
}

/// `run` as vLLM writes it.
fn engine_event(run: Run) -> EngineEvent {
    match run {
        Run::Stored {
            hashes,
            parent,
            tokens,
            block_size,
        } => EngineEvent::BlockStored(BlockStored {
            block_hashes: hashes.iter().map(|h| h.get()).collect(),
            parent_block_hash: parent.map(SequenceHash::get),
            token_ids: tokens,
            block_size,
            medium: Some(Tier::Remote),
            ..BlockStored::default()
        }),
        Run::Removed(hashes) => EngineEvent::BlockRemoved(BlockRemoved {
            block_hashes: hashes.iter().map(|h| h.get()).collect(),
            medium: Some(Tier::Remote),
            ..BlockRemoved::default()
        }),
    }
}

/// Seconds since the Unix epoch, as vLLM stamps its batches.
fn now_seconds() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |since| since.as_secs_f64())
}

/// Publishes `receiver`'s events on `publisher` (bound by the caller, so its endpoints
/// are known and a bad one fails the start) from a thread of its own, until every sender
/// is gone.
pub fn start_zmq(
    mut publisher: ZmqPublisher,
    mut receiver: EventReceiver,
) -> Result<JoinHandle<()>, ZmqError> {
    let options = EngineFormat::Vllm0_33.options();
    std::thread::Builder::new()
        .name("kvtwin-store-events-zmq".into())
        .spawn(move || {
            let mut warnings = WarnLimiter::default();
            while let Some(first) = receiver.queue.blocking_recv() {
                let events = more(&mut receiver, first);
                // One block size a batch: a router refuses a batch of another size whole.
                let mut batches: Vec<(Option<u32>, Vec<EngineEvent>, usize)> = Vec::new();
                for run in runs(&events) {
                    let size = run.block_size();
                    let blocks = match &run {
                        Run::Stored { hashes, .. } | Run::Removed(hashes) => hashes.len(),
                    };
                    match batches.last_mut() {
                        Some((batch_size, batch, count))
                            if size.is_none() || batch_size.is_none() || *batch_size == size =>
                        {
                            *batch_size = batch_size.or(size);
                            batch.push(engine_event(run));
                            *count += blocks;
                        }
                        _ => batches.push((size, vec![engine_event(run)], blocks)),
                    }
                }
                for (_, batch, count) in batches {
                    let batch = EngineBatch::new(publisher.next_seq(), now_seconds(), batch, Some(0));
                    let counters = &receiver.counters;
                    match publisher.publish(&batch.to_payload(&options)) {
                        Ok(_) => counters.published.fetch_add(count as u64, Ordering::Relaxed),
                        Err(error) => {
                            if let Some(held_back) = warnings.admit("zmq_publish", Instant::now()) {
                                tracing::warn!(%error, held_back, "kvtwin store: a KV event batch was not published");
                            }
                            counters.errors.fetch_add(1, Ordering::Relaxed)
                        }
                    };
                }
            }
        })
        .map_err(ZmqError::Spawn)
}

/// `run` as Dynamo's routers receive it from `worker`, numbered `event_id`.
fn router_event(run: Run, worker: WorkerId, event_id: u64) -> RouterEvent {
    let data = match run {
        Run::Stored {
            hashes,
            parent,
            tokens,
            block_size,
        } => {
            let locals = compute_local_hashes(
                &tokens,
                block_size as usize,
                HashSeed::new(DEFAULT_HASH_SEED),
            );
            KvCacheEventData::Stored {
                parent_hash: parent,
                blocks: hashes
                    .into_iter()
                    .zip(locals)
                    .map(|(block_hash, tokens_hash)| StoredBlock {
                        block_hash,
                        tokens_hash,
                    })
                    .collect(),
                tier: Tier::Remote,
            }
        }
        Run::Removed(block_hashes) => KvCacheEventData::Removed {
            block_hashes,
            tier: Tier::Remote,
        },
    };
    RouterEvent {
        worker_id: worker,
        event: KvCacheEvent {
            event_id,
            dp_rank: 0,
            data,
        },
    }
}

/// Publishes `receiver`'s events on `publisher` as `worker`'s `RouterEvent`s (JSON, one
/// a message) until every sender is gone.
pub async fn run_nats(publisher: NatsPublisher, mut receiver: EventReceiver, worker: WorkerId) {
    let mut event_id = 0;
    let mut warnings = WarnLimiter::default();
    while let Some(first) = receiver.queue.recv().await {
        let events = more(&mut receiver, first);
        for run in runs(&events) {
            let blocks = match &run {
                Run::Stored { hashes, .. } | Run::Removed(hashes) => hashes.len(),
            };
            let json = router_event(run, worker, event_id).to_json();
            event_id += 1;
            let counters = &receiver.counters;
            match publisher.publish(json).await {
                Ok(_) => counters
                    .published
                    .fetch_add(blocks as u64, Ordering::Relaxed),
                Err(error) => {
                    if let Some(held_back) = warnings.admit("nats_publish", Instant::now()) {
                        tracing::warn!(%error, held_back, "kvtwin store: a KV event was not published on NATS");
                    }
                    counters.errors.fetch_add(1, Ordering::Relaxed)
                }
            };
        }
    }
    let _ = publisher.flush().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn router_events_carry_the_tokens_hash_of_each_block_and_the_external_tier() {
        let run = Run::Stored {
            hashes: vec![SequenceHash::new(7), SequenceHash::new(8)],
            parent: Some(SequenceHash::new(6)),
            tokens: vec![1, 2, 3, 4],
            block_size: 2,
        };
        let event = router_event(run, WorkerId::new(9), 3);
        let json = String::from_utf8(event.to_json()).unwrap();
        assert!(json.contains("\"storage_tier\":\"external\""), "{json}");
        let KvCacheEventData::Stored { blocks, .. } = event.event.data else {
            panic!("{json}");
        };
        let seed = HashSeed::new(DEFAULT_HASH_SEED);
        assert_eq!(
            blocks.iter().map(|b| b.tokens_hash).collect::<Vec<_>>(),
            compute_local_hashes(&[1, 2, 3, 4], 2, seed)
        );
        assert_eq!(event.event.event_id, 3);
    }
}
