//! The relay: one engine's ZMQ KV events onto NATS as Dynamo `RouterEvent`s, like
//! Dynamo's own relay.
//!
//! Owns: [`RelayConfig`], [`NatsFormat`], [`RelayStats`], [`run_relay`] and
//! [`run_relay_reporting`] (the same, its stats published after every step). A thread
//! runs the ZMQ subscriber (gaps filled by replay, restarts detected) and decodes each
//! batch into `RouterEvent`s with the engine's block hashes and computed token hashes,
//! numbered per data-parallel rank; it hands them over a bounded channel to the async
//! side, which publishes them (one JSON event per message, or Dynamo 1.6 envelopes of up
//! to 128). An engine restart becomes a `Cleared` event for each rank the relay has
//! seen, so every router downstream forgets that worker's old blocks.
//! Never: translate hashes (routers do, per worker), or drop a decoded event silently: a
//! publish that fails is counted, and the relay carries on with the next.

use crate::nats::{NatsError, NatsPublisher, PublisherConfig as NatsPublisherConfig};
use crate::wire::{
    DecodeLimits, DropCounters, EngineDecoder, Envelope, RouterEvent, UnknownEvents,
};
use crate::zmq::{SubscriberConfig, SubscriberItem, ZmqError, ZmqSubscriber};
use bytes::Bytes;
use kvtwin::events::{KvCacheEvent, KvCacheEventData};
use kvtwin::ids::WorkerId;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// How events go onto NATS.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NatsFormat {
    /// One `RouterEvent` per message, as JSON (Dynamo before 1.6).
    #[default]
    Json,
    /// Dynamo 1.6's msgpack envelope, up to 128 events per message.
    Envelope {
        /// The envelope's `publisher_id`.
        publisher_id: u64,
    },
}

/// How to relay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RelayConfig {
    /// The engine's worker id in the events.
    pub worker: WorkerId,
    /// The engine's ZMQ stream (and replay socket).
    pub zmq: SubscriberConfig,
    /// Where to publish.
    pub nats: NatsPublisherConfig,
    /// How.
    pub format: NatsFormat,
    /// Bounds on what a batch may hold.
    pub limits: DecodeLimits,
    /// Tries per NATS message before it counts as a failure: a server restarting is a
    /// few failed tries (each waits out the publish timeout, then a quarter second), not
    /// lost events. The engine's batches queue meanwhile.
    pub publish_attempts: u32,
}

/// What a relay did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RelayStats {
    /// Engine batches decoded.
    pub batches: u64,
    /// Events published.
    pub events: u64,
    /// Blocks in those events.
    pub blocks: u64,
    /// NATS messages published.
    pub messages: u64,
    /// Publishes that failed (their events are lost to the subscribers).
    pub publish_failures: u64,
    /// Engine restarts (each published as `Cleared` per rank).
    pub restarts: u64,
    /// Engine batches neither the stream nor replay supplied.
    pub lost_batches: u64,
    /// Batches or events refused, by reason.
    pub dropped: BTreeMap<&'static str, u64>,
    /// Times the NATS connection came back after being lost.
    pub reconnects: u64,
}

/// A relay could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RelayError {
    /// The ZMQ side.
    #[error(transparent)]
    Zmq(#[from] ZmqError),
    /// The NATS side.
    #[error(transparent)]
    Nats(#[from] NatsError),
    /// The decoding thread could not be started.
    #[error("could not start the relay thread: {0}")]
    Spawn(#[source] std::io::Error),
}

/// What the ZMQ thread hands the publisher.
enum Hop {
    Events(Vec<RouterEvent>),
    /// The engine restarted: a `Cleared` for each rank it had published.
    Restarted(Vec<RouterEvent>),
    Lost(u64),
    Dropped(&'static str, u64),
}

/// Runs the relay until `shutdown` resolves; what it did.
pub async fn run_relay(
    config: RelayConfig,
    shutdown: impl Future<Output = ()>,
) -> Result<RelayStats, RelayError> {
    run_relay_reporting(config, shutdown, None).await
}

/// [`run_relay`], with its stats sent to `progress` after each batch, restart, loss or
/// drop is handled: a watcher (`kvtwin relay --stats-every-ms`) sees what was published
/// and acknowledged so far, even if the process is later killed without a last word.
pub async fn run_relay_reporting(
    config: RelayConfig,
    shutdown: impl Future<Output = ()>,
    progress: Option<tokio::sync::watch::Sender<RelayStats>>,
) -> Result<RelayStats, RelayError> {
    let publisher = NatsPublisher::connect(config.nats.clone()).await?;
    let mut subscriber = ZmqSubscriber::new(config.zmq.clone())?;
    // A bounded hand-over: when NATS is slow, the ZMQ thread waits and the engine's
    // batches queue in the SUB socket (and, past it, are recovered by replay).
    let (sender, mut receiver) = mpsc::channel::<Hop>(1024);
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = stop.clone();
    let worker = config.worker;
    let limits = config.limits;
    let thread = std::thread::Builder::new()
        .name(format!("kvtwin-relay-{worker}"))
        .spawn(move || {
            let decoder = EngineDecoder::new(limits, UnknownEvents::Skip);
            let mut next_ids: BTreeMap<u32, u64> = BTreeMap::new();
            while !stopping.load(Ordering::Relaxed) {
                let hop = match subscriber.next(Duration::from_millis(50)) {
                    Ok(Some(SubscriberItem::Batch(batch))) => {
                        match decoder.decode_payload(batch.seq, &batch.payload) {
                            Ok(decoded) => {
                                let mut skipped = DropCounters::new();
                                for event in &decoded.skipped {
                                    skipped.record(&event.error);
                                }
                                for (reason, count) in skipped.iter() {
                                    let _ = sender.blocking_send(Hop::Dropped(reason, count));
                                }
                                let next =
                                    next_ids.entry(decoded.dp_rank.unwrap_or(0)).or_default();
                                let mut events = Vec::with_capacity(decoded.events.len());
                                match decoded.router_events(worker, next, &mut events) {
                                    Ok(()) => Hop::Events(events),
                                    Err(error) => Hop::Dropped(error.reason(), 1),
                                }
                            }
                            Err(error) => Hop::Dropped(error.reason(), 1),
                        }
                    }
                    Ok(Some(SubscriberItem::Restarted { .. })) => {
                        // Every rank seen starts over: tell the routers to forget it,
                        // numbered after that rank's last event.
                        let cleared = next_ids
                            .iter_mut()
                            .map(|(&dp_rank, next)| {
                                let event_id = *next;
                                *next += 1;
                                RouterEvent {
                                    worker_id: worker,
                                    event: KvCacheEvent {
                                        event_id,
                                        dp_rank,
                                        data: KvCacheEventData::Cleared,
                                    },
                                }
                            })
                            .collect();
                        Hop::Restarted(cleared)
                    }
                    Ok(Some(SubscriberItem::Lost { first, last })) => Hop::Lost(last - first + 1),
                    Ok(Some(SubscriberItem::Malformed(error))) => Hop::Dropped(error.reason(), 1),
                    Ok(None) => continue,
                    Err(_) => break,
                };
                if sender.blocking_send(hop).is_err() {
                    break;
                }
            }
        })
        .map_err(RelayError::Spawn)?;

    let mut stats = RelayStats::default();
    let mut envelope_sequence = 0u64;
    tokio::pin!(shutdown);
    loop {
        let hop = tokio::select! {
            hop = receiver.recv() => hop,
            () = &mut shutdown => None,
        };
        let Some(hop) = hop else { break };
        let events = match hop {
            Hop::Events(events) => {
                stats.batches += 1;
                Some(events)
            }
            Hop::Restarted(cleared) => {
                stats.restarts += 1;
                Some(cleared)
            }
            Hop::Lost(batches) => {
                stats.lost_batches += batches;
                None
            }
            Hop::Dropped(reason, count) => {
                *stats.dropped.entry(reason).or_default() += count;
                None
            }
        };
        if let Some(events) = events {
            publish(
                &publisher,
                &config,
                &events,
                &mut envelope_sequence,
                &mut stats,
            )
            .await;
        }
        stats.reconnects = publisher.stats().connection.reconnected;
        if let Some(progress) = &progress {
            progress.send_replace(stats.clone());
        }
    }
    stop.store(true, Ordering::Relaxed);
    // Unblocks a thread waiting to hand over, so it sees the stop flag.
    drop(receiver);
    let _ = thread.join();
    let _ = publisher.flush().await;
    stats.reconnects = publisher.stats().connection.reconnected;
    if let Some(progress) = &progress {
        progress.send_replace(stats.clone());
    }
    Ok(stats)
}

/// Publishes `payload`, trying up to `attempts` times; whether it went out.
async fn publish_with_retry(publisher: &NatsPublisher, payload: Bytes, attempts: u32) -> bool {
    for attempt in 1..=attempts.max(1) {
        if publisher.publish(payload.clone()).await.is_ok() {
            return true;
        }
        if attempt < attempts {
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    false
}

async fn publish(
    publisher: &NatsPublisher,
    config: &RelayConfig,
    events: &[RouterEvent],
    envelope_sequence: &mut u64,
    stats: &mut RelayStats,
) {
    let attempts = config.publish_attempts;
    match config.format {
        NatsFormat::Json => {
            for event in events {
                stats.messages += 1;
                match publish_with_retry(publisher, event.to_json().into(), attempts).await {
                    true => {
                        stats.events += 1;
                        stats.blocks += event.block_count() as u64;
                    }
                    false => stats.publish_failures += 1,
                }
            }
        }
        NatsFormat::Envelope { publisher_id } => {
            for chunk in events.chunks(Envelope::MAX_EVENTS) {
                let mut bytes = Vec::new();
                // Encoded from the slice: no copy of the events first.
                Envelope::encode_events(
                    publisher_id,
                    *envelope_sequence,
                    unix_millis(),
                    Envelope::TOPIC,
                    chunk,
                    &mut bytes,
                );
                *envelope_sequence += 1;
                stats.messages += 1;
                match publish_with_retry(publisher, bytes.into(), attempts).await {
                    true => {
                        stats.events += chunk.len() as u64;
                        stats.blocks += chunk.iter().map(|e| e.block_count() as u64).sum::<u64>();
                    }
                    false => stats.publish_failures += 1,
                }
            }
        }
    }
}

/// Now, in milliseconds since the Unix epoch (the envelope's `published_at`; 0 if the
/// system clock is before 1970). A relay is a live service: its stamps are wall-clock.
fn unix_millis() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| {
            u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
        })
}
