//! The relay: one engine's ZMQ KV events onto NATS as Dynamo `RouterEvent`s, like
//! Dynamo's own relay.
//!
//! Owns: [`RelayConfig`], [`NatsFormat`], [`RelayStats`], [`run_relay`] and
//! [`run_relay_reporting`] (the same, its stats published after every step). A thread
//! runs the ZMQ subscriber (gaps filled by replay, restarts detected) and decodes each
//! batch into `RouterEvent`s with the engine's block hashes and computed token hashes
//! (through one `EngineNormalizer`: LoRA and cache salt seeds, the salt carried along a
//! chain, KV cache groups left out and counted, as Dynamo's router does),
//! numbered per data-parallel rank; it hands them over a bounded channel to the async
//! side, which publishes them (one JSON event per message, or Dynamo 1.6 envelopes of up
//! to 128). An engine restart becomes a `Cleared` event for each rank the relay has
//! seen, so every router downstream forgets that worker's old blocks.
//! Stopping (the `shutdown` future resolving): the ZMQ thread stops reading, everything
//! already handed over is published (JetStream: each message waits for its ack), for at
//! most [`RelayConfig::drain_timeout`]; what is still queued then is counted in
//! [`RelayStats::abandoned_events`], so a caller can tell a clean stop (every decoded
//! event acknowledged) from a lossy one. The whole relay runs inside a `relay` span
//! (worker id, ZMQ endpoint, subject), its ZMQ thread too. The ZMQ socket's connects and
//! disconnects (libzmq's monitor) are counted and warned about, rate-limited. The stats
//! render as OpenMetrics ([`RelayStats::render_metrics`], served by [`serve_metrics`])
//! for `kvtwin relay --metrics-listen`.
//! Never: translate hashes (routers do, per worker), or drop a decoded event silently: a
//! publish that fails is counted, and the relay carries on with the next.

use super::metrics::Exposition;
use super::warn::WarnLimiter;
use crate::nats::{NatsError, NatsPublisher, PublisherConfig as NatsPublisherConfig};
use crate::wire::normalize::EngineNormalizer;
use crate::wire::{
    DecodeLimits, DropCounters, EngineDecoder, Envelope, RouterEvent, UnknownEvents,
};
use crate::zmq::{SubscriberConfig, SubscriberItem, SubscriberStats, ZmqError, ZmqSubscriber};
use bytes::Bytes;
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
    /// How long a stop may spend publishing what was queued (and waiting for its acks)
    /// before giving up on the rest ([`DRAIN_TIMEOUT`] by default).
    pub drain_timeout: Duration,
}

/// How long a stopping relay publishes what it had queued, by default: 10 s, inside the
/// 30 s Kubernetes gives a pod between SIGTERM and SIGKILL.
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

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
    /// Events decoded but still queued when the stop's drain time ran out: never
    /// published, so lost to the subscribers.
    pub abandoned_events: u64,
    /// Connections of the ZMQ socket made again after the first.
    pub zmq_reconnects: u64,
    /// Connections of the ZMQ socket lost.
    pub zmq_disconnects: u64,
    /// Times the NATS connection came back after being lost.
    pub nats_reconnects: u64,
    /// Salted blocks forgotten past the tracker's bound (later blocks of those chains are
    /// published unsalted: misses downstream, never merges).
    pub salt_evictions: u64,
}

impl RelayStats {
    /// Events decoded that did not reach NATS (publishes that failed, in messages, and
    /// events abandoned at the stop): 0 means everything decoded was acknowledged.
    pub fn unacknowledged(&self) -> u64 {
        self.publish_failures + self.abandoned_events
    }

    /// The stats as OpenMetrics text (`kvtwin relay --metrics-listen`): one
    /// `kvtwin_relay_*_total` counter per field, each labelled with the engine's
    /// `worker_id`, drops by `reason` too.
    pub fn render_metrics(&self, worker: WorkerId) -> String {
        let label = || WorkerIdLabels {
            worker_id: worker.get(),
        };
        let mut out = Exposition::new();
        let counters: [(&'static str, &'static str, u64); 12] = [
            (
                "kvtwin_relay_batches_total",
                "Engine batches decoded.",
                self.batches,
            ),
            (
                "kvtwin_relay_events_total",
                "Events published (acknowledged, on JetStream).",
                self.events,
            ),
            (
                "kvtwin_relay_blocks_total",
                "Blocks in the events published.",
                self.blocks,
            ),
            (
                "kvtwin_relay_messages_total",
                "NATS messages published.",
                self.messages,
            ),
            (
                "kvtwin_relay_publish_failures_total",
                "NATS messages given up on after every attempt (their events are lost).",
                self.publish_failures,
            ),
            (
                "kvtwin_relay_engine_restarts_total",
                "Engine restarts seen (published as Cleared per rank).",
                self.restarts,
            ),
            (
                "kvtwin_relay_lost_batches_total",
                "Engine batches neither the stream nor replay supplied.",
                self.lost_batches,
            ),
            (
                "kvtwin_relay_abandoned_events_total",
                "Events still queued when the stop's drain ran out.",
                self.abandoned_events,
            ),
            (
                "kvtwin_relay_zmq_reconnects_total",
                "ZMQ connections made again after the first.",
                self.zmq_reconnects,
            ),
            (
                "kvtwin_relay_zmq_disconnects_total",
                "ZMQ connections lost.",
                self.zmq_disconnects,
            ),
            (
                "kvtwin_relay_nats_reconnects_total",
                "NATS connections made again after one was lost.",
                self.nats_reconnects,
            ),
            (
                "kvtwin_relay_salt_evictions_total",
                "Salted blocks forgotten past the tracker's bound.",
                self.salt_evictions,
            ),
        ];
        for (name, help, value) in counters {
            out.counters(name, help, vec![(label(), value)]);
        }
        let dropped = self
            .dropped
            .iter()
            .map(|(&reason, &count)| {
                let labels = WorkerReasonLabels {
                    worker_id: worker.get(),
                    reason,
                };
                (labels, count)
            })
            .collect();
        out.counters(
            "kvtwin_relay_dropped_total",
            "Batches or events refused, by reason.",
            dropped,
        );
        out.finish()
    }
}

/// Serves `GET /metrics` (the latest stats from `stats`, as
/// [`RelayStats::render_metrics`]) and `GET /healthz` on `listener`, open to anyone who
/// reaches it (counters only), until `shutdown` resolves.
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    stats: tokio::sync::watch::Receiver<RelayStats>,
    worker: WorkerId,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    use axum::http::header;
    use axum::routing::get;
    let metrics = move || {
        let text = stats.borrow().render_metrics(worker);
        async move { ([(header::CONTENT_TYPE, super::metrics::CONTENT_TYPE)], text) }
    };
    let app = axum::Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }));
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await
}

/// `worker_id` alone (a relay serves one engine).
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct WorkerIdLabels {
    worker_id: u64,
}

/// `worker_id` and a drop `reason`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, prometheus_client::encoding::EncodeLabelSet)]
struct WorkerReasonLabels {
    worker_id: u64,
    reason: &'static str,
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
    /// Salted blocks the normaliser's tracker evicted past its bound.
    SaltEvictions(u64),
    /// The ZMQ socket's connection counts moved: (reconnects, disconnects) more.
    Connection(u64, u64),
}

impl Hop {
    /// Events it carries (what abandoning it loses).
    fn events(&self) -> u64 {
        match self {
            Hop::Events(events) | Hop::Restarted(events) => events.len() as u64,
            _ => 0,
        }
    }
}

/// The connection hop for the counts between `seen` and `stats`, if they moved; warns
/// (rate-limited) about losses and reconnects.
fn connection_hop(
    seen: &mut SubscriberStats,
    stats: &SubscriberStats,
    warnings: &mut WarnLimiter,
) -> Option<Hop> {
    if (stats.connects, stats.disconnects) == (seen.connects, seen.disconnects) {
        return None;
    }
    // Every connect after the first is a reconnect.
    let connects = stats.connects - seen.connects;
    let reconnects = if seen.connects == 0 {
        connects.saturating_sub(1)
    } else {
        connects
    };
    let disconnects = stats.disconnects - seen.disconnects;
    let now = std::time::Instant::now();
    if disconnects > 0 {
        if let Some(held_back) = warnings.admit("disconnect", now) {
            tracing::warn!(held_back, "the engine's ZMQ connection was lost");
        }
    }
    if reconnects > 0 {
        if let Some(held_back) = warnings.admit("reconnect", now) {
            tracing::warn!(held_back, "reconnected to the engine's ZMQ socket");
        }
    }
    seen.connects = stats.connects;
    seen.disconnects = stats.disconnects;
    Some(Hop::Connection(reconnects, disconnects))
}

/// Runs the relay until `shutdown` resolves, then drains what it had queued (see the
/// module documentation); what it did.
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
    let span = tracing::info_span!(
        "relay",
        worker_id = config.worker.get(),
        endpoint = %config.zmq.endpoint,
        subject = %config.nats.subject,
    );
    tracing::Instrument::instrument(relay(config, shutdown, span.clone(), progress), span).await
}

async fn relay(
    config: RelayConfig,
    shutdown: impl Future<Output = ()>,
    span: tracing::Span,
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
            let _entered = span.enter();
            let decoder = EngineDecoder::new(limits, UnknownEvents::Skip);
            // Salts carried along chains and KV cache groups, per engine, so the tokens
            // hashes published are the ones Dynamo's router computes.
            let mut normalizer = EngineNormalizer::default();
            let mut salt_evictions_seen = 0;
            let mut next_ids: BTreeMap<u32, u64> = BTreeMap::new();
            let mut seen = SubscriberStats::default();
            let mut warnings = WarnLimiter::default();
            while !stopping.load(Ordering::Relaxed) {
                let next = subscriber.next(Duration::from_millis(50));
                if let Some(hop) = connection_hop(&mut seen, &subscriber.stats(), &mut warnings) {
                    if sender.blocking_send(hop).is_err() {
                        break;
                    }
                }
                let hop = match next {
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
                                let mut filtered = Vec::new();
                                let result = normalizer.router_events(
                                    &decoded,
                                    worker,
                                    next,
                                    &mut events,
                                    &mut filtered,
                                );
                                for reason in filtered {
                                    let _ = sender.blocking_send(Hop::Dropped(reason, 1));
                                }
                                let evictions = normalizer.stats().salt_evictions;
                                if evictions > salt_evictions_seen {
                                    let more = evictions - salt_evictions_seen;
                                    salt_evictions_seen = evictions;
                                    let _ = sender.blocking_send(Hop::SaltEvictions(more));
                                }
                                match result {
                                    Ok(()) => Hop::Events(events),
                                    Err(error) => Hop::Dropped(error.reason(), 1),
                                }
                            }
                            Err(error) => Hop::Dropped(error.reason(), 1),
                        }
                    }
                    Ok(Some(SubscriberItem::Restarted { .. })) => {
                        normalizer.restarted();
                        salt_evictions_seen = normalizer.stats().salt_evictions;
                        // Every rank seen starts over: tell the routers to forget it.
                        Hop::Restarted(RouterEvent::cleared_ranks(worker, &mut next_ids))
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
    // Until the stop: hops as they come. From the stop: the thread is told to stop
    // reading, and what it handed over (until it drops its sender) is still published,
    // until the drain deadline.
    let mut deadline: Option<tokio::time::Instant> = None;
    loop {
        let hop = match deadline {
            None => tokio::select! {
                hop = receiver.recv() => hop,
                () = &mut shutdown => {
                    deadline = Some(begin_stop(&stop, &config, receiver.len()));
                    continue;
                }
            },
            Some(at) => match tokio::time::timeout_at(at, receiver.recv()).await {
                Ok(hop) => hop,
                Err(_) => break,
            },
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
            Hop::SaltEvictions(count) => {
                stats.salt_evictions += count;
                None
            }
            Hop::Connection(reconnects, disconnects) => {
                stats.zmq_reconnects += reconnects;
                stats.zmq_disconnects += disconnects;
                None
            }
        };
        if let Some(events) = events {
            let events_before = stats.events;
            let published_in_time = {
                let publishing = publish(
                    &publisher,
                    &config,
                    &events,
                    &mut envelope_sequence,
                    &mut stats,
                );
                tokio::pin!(publishing);
                // A publish to a server that stopped answering retries for minutes: the
                // stop is watched during it too, and from then on the drain bounds it.
                let mut finished = false;
                if deadline.is_none() {
                    tokio::select! {
                        () = &mut publishing => finished = true,
                        () = &mut shutdown => {
                            deadline = Some(begin_stop(&stop, &config, receiver.len()));
                        }
                    }
                }
                match deadline {
                    Some(at) if !finished => {
                        tokio::time::timeout_at(at, &mut publishing).await.is_ok()
                    }
                    _ => true,
                }
            };
            if !published_in_time {
                // Cut off mid-batch: what it had not seen acknowledged is lost (a message
                // whose ack was still on its way is counted lost too).
                let published = stats.events - events_before;
                stats.abandoned_events += events.len() as u64 - published;
                break;
            }
        }
        stats.nats_reconnects = publisher.stats().connection.reconnected;
        if let Some(progress) = &progress {
            progress.send_replace(stats.clone());
        }
    }
    stop.store(true, Ordering::Relaxed);
    // What is left queued was never published. Closing first lets a thread blocked on a
    // full channel see the stop flag.
    receiver.close();
    while let Ok(hop) = receiver.try_recv() {
        stats.abandoned_events += hop.events();
    }
    let _ = thread.join();
    while let Ok(hop) = receiver.try_recv() {
        stats.abandoned_events += hop.events();
    }
    // Bounded as the drain is: a server that stopped answering (not one that closed the
    // connection) would otherwise hold the stop forever.
    let flush_until =
        deadline.unwrap_or_else(|| tokio::time::Instant::now() + config.drain_timeout);
    let _ = tokio::time::timeout_at(flush_until, publisher.flush()).await;
    stats.nats_reconnects = publisher.stats().connection.reconnected;
    if let Some(progress) = &progress {
        progress.send_replace(stats.clone());
    }
    if deadline.is_some() {
        tracing::info!(
            events = stats.events,
            abandoned_events = stats.abandoned_events,
            publish_failures = stats.publish_failures,
            "stopped"
        );
    }
    Ok(stats)
}

/// Publishes `payload`, trying up to `attempts` times; whether it went out.
/// The stop begins: the reading thread is told, and the drain's deadline returned.
fn begin_stop(stop: &AtomicBool, config: &RelayConfig, queued: usize) -> tokio::time::Instant {
    stop.store(true, Ordering::Relaxed);
    tracing::info!(
        queued,
        drain_timeout_s = config.drain_timeout.as_secs_f64(),
        "stopping: publishing what is queued"
    );
    tokio::time::Instant::now() + config.drain_timeout
}

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

#[cfg(test)]
mod metrics_tests {
    use super::*;

    #[test]
    fn the_stats_render_as_labelled_counters_in_a_fixed_order() {
        let mut stats = RelayStats {
            batches: 3,
            events: 12,
            abandoned_events: 2,
            ..RelayStats::default()
        };
        stats.dropped.insert("bad_msgpack", 4);
        stats.dropped.insert("array_too_long", 1);
        let text = stats.render_metrics(WorkerId::new(7));
        assert!(
            text.contains("# TYPE kvtwin_relay_events counter"),
            "{text}"
        );
        assert!(
            text.contains("kvtwin_relay_events_total{worker_id=\"7\"} 12"),
            "{text}"
        );
        assert!(text.contains("kvtwin_relay_abandoned_events_total{worker_id=\"7\"} 2"));
        assert!(text.contains("kvtwin_relay_batches_total{worker_id=\"7\"} 3"));
        let array = text
            .find("kvtwin_relay_dropped_total{worker_id=\"7\",reason=\"array_too_long\"} 1")
            .expect(&text);
        let msgpack = text
            .find("kvtwin_relay_dropped_total{worker_id=\"7\",reason=\"bad_msgpack\"} 4")
            .expect(&text);
        assert!(array < msgpack, "reasons in key order");
        assert!(text.trim_end().ends_with("# EOF"));
        assert_eq!(text, stats.render_metrics(WorkerId::new(7)));
    }
}
