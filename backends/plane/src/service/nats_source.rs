//! Router events from NATS into the router state: what `kvtwin router --nats` runs.
//!
//! Owns: [`NatsSourceConfig`], [`run_nats_source`] and [`NatsSource`] (the same in two
//! steps: subscribe, then apply). Each message is a Dynamo
//! `RouterEvent` as JSON or a Dynamo 1.6 msgpack envelope of several (told apart by the
//! first byte: JSON objects start with `{`, msgpack maps never do); its events are
//! translated and applied under the state's lock in one go. With JetStream
//! ([`ConsumeMode::Replay`]) a router that starts (or restarts) rebuilds its whole state
//! from the stream before following it live.
//! A reconnect of the NATS client (seen when the next message arrives) is counted once
//! globally and on every worker this source has carried events for (at most
//! [`WORKERS_TRACKED_MAX`] of them; workers beyond that are not attributed reconnects).
//! Queues: async-nats's subscription queue, `ConnectConfig::subscription_capacity`
//! messages [past it the client drops the newest and reports a slow consumer, counted
//! here as `nats_slow_consumer` drops]; nothing else between the socket and the index
//! (one message at a time is decoded and applied).
//! Never: stop on a bad message (it is counted by reason and skipped), or hold the
//! state's lock while waiting on the network.

use super::http::{lock, SharedState};
use super::metrics::SourceLabels;
use super::state::shared::EventTarget;
use crate::nats::{ConsumeMode, NatsError, NatsSubscriber, SubscriberConfig};
use crate::wire::WorkerEvent;
use crate::wire::{DecodeLimits, Envelope, RouterEvent};
use kvtwin::ids::WorkerId;
use std::collections::BTreeSet;
use std::future::Future;

/// Workers a source remembers carrying, to attribute its reconnects to them.
pub const WORKERS_TRACKED_MAX: usize = 4096;

/// How to consume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NatsSourceConfig {
    /// The subscription (core, or JetStream replay to rebuild after a restart).
    pub subscriber: SubscriberConfig,
    /// Bounds on one message.
    pub limits: DecodeLimits,
}

/// What a NATS source did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NatsSourceStats {
    /// Messages received.
    pub messages: u64,
    /// Events decoded (and handed to the state).
    pub events: u64,
    /// Messages refused.
    pub refused: u64,
}

/// The events of one message, or the reason it is refused.
pub fn decode_message(
    payload: &[u8],
    limits: &DecodeLimits,
) -> Result<Vec<WorkerEvent>, &'static str> {
    if payload.first() == Some(&b'{') {
        let event = RouterEvent::from_json(payload, limits).map_err(|error| error.reason())?;
        Ok(vec![event.into_worker_event()])
    } else {
        let envelope = Envelope::decode(payload, limits).map_err(|error| error.reason())?;
        Ok(envelope
            .events
            .into_iter()
            .map(RouterEvent::into_worker_event)
            .collect())
    }
}

/// Subscribes and applies events to `state` until `shutdown` resolves (or the
/// subscription ends); what it did.
pub async fn run_nats_source(
    config: NatsSourceConfig,
    state: SharedState,
    shutdown: impl Future<Output = ()>,
) -> Result<NatsSourceStats, NatsError> {
    NatsSource::connect(config)
        .await?
        .run(state, shutdown)
        .await
}

/// A source connected and subscribed but not yet applying: [`run_nats_source`] in two
/// steps, for a caller that must know the subscription is in place before anything is
/// published (core NATS delivers only what is published after the server has it).
#[derive(Debug)]
pub struct NatsSource {
    subscriber: NatsSubscriber,
    limits: DecodeLimits,
    durable: bool,
    labels: SourceLabels,
}

/// `url` without the user and password it may carry (`nats://user:pass@host` →
/// `nats://host`): what labels and logs show.
pub fn redact_url(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let host = match rest[..authority_end].rfind('@') {
        Some(at) => &rest[at + 1..],
        None => rest,
    };
    if scheme.is_empty() {
        host.to_string()
    } else {
        format!("{scheme}://{host}")
    }
}

impl NatsSource {
    /// Connects and subscribes.
    pub async fn connect(config: NatsSourceConfig) -> Result<Self, NatsError> {
        let durable = matches!(config.subscriber.mode, ConsumeMode::Durable { .. });
        let labels = SourceLabels {
            transport: "nats",
            endpoint: format!(
                "{} {}",
                redact_url(&config.subscriber.connect.url),
                config.subscriber.subject
            ),
        };
        let subscriber = NatsSubscriber::connect(config.subscriber).await?;
        Ok(Self {
            subscriber,
            limits: config.limits,
            durable,
            labels,
        })
    }

    /// Waits (bounded by the request timeout) until the server has the subscription:
    /// from then on, everything published reaches this source.
    pub fn flush(&self) -> impl Future<Output = Result<(), NatsError>> + Send + 'static {
        self.subscriber.flush()
    }

    /// Applies events to `state` until `shutdown` resolves (or the subscription ends);
    /// what it did. The source is registered in `state` when this is called, before the
    /// future is first polled: a JetStream replay with messages to deliver keeps
    /// `/readyz` at 503 until the message that leaves none pending (or the stream had
    /// none). The future runs inside a `nats_source` span carrying the server (without
    /// credentials) and the subject.
    pub fn run(
        self,
        state: SharedState,
        shutdown: impl Future<Output = ()>,
    ) -> impl Future<Output = Result<NatsSourceStats, NatsError>> {
        self.run_to(EventTarget::Workers, state, shutdown)
    }

    /// [`NatsSource::run`], the events going to `target`'s index (a shared store's
    /// subject: the shared index).
    pub fn run_to(
        self,
        target: EventTarget,
        state: SharedState,
        shutdown: impl Future<Output = ()>,
    ) -> impl Future<Output = Result<NatsSourceStats, NatsError>> {
        let caught_up = self.subscriber.initial_pending().is_none_or(|n| n == 0);
        lock(&state).register_source(self.labels.clone(), caught_up);
        let span = tracing::info_span!(
            "nats_source",
            endpoint = %self.labels.endpoint,
        );
        tracing::Instrument::instrument(self.apply(target, state, shutdown, caught_up), span)
    }

    async fn apply(
        mut self,
        target: EventTarget,
        state: SharedState,
        shutdown: impl Future<Output = ()>,
        mut caught_up: bool,
    ) -> Result<NatsSourceStats, NatsError> {
        let mut stats = NatsSourceStats::default();
        let mut carried: BTreeSet<WorkerId> = BTreeSet::new();
        let mut reconnects_seen = self.subscriber.stats().connection.reconnected;
        let mut slow_seen = self.subscriber.stats().connection.slow_consumer;
        tokio::pin!(shutdown);
        loop {
            let message = tokio::select! {
                message = self.subscriber.next() => message,
                () = &mut shutdown => break,
            };
            let message = match message {
                Ok(message) => message,
                Err(NatsError::Closed) => break,
                // A transient failure (a pull interrupted by a server restart): the
                // subscriber picks up again on the next call.
                Err(_) => continue,
            };
            stats.messages += 1;
            let decoded = decode_message(&message.payload, &self.limits);
            if let Ok(events) = &decoded {
                for event in events {
                    if carried.len() < WORKERS_TRACKED_MAX {
                        carried.insert(event.worker);
                    }
                }
            }
            let connection = self.subscriber.stats().connection;
            let reconnects = connection.reconnected;
            let mut router = lock(&state);
            // Overflows of the client's queue: messages lost before they reached us
            // (occurrences; the client does not say how many messages each dropped).
            for _ in slow_seen..connection.slow_consumer {
                router.drop_one_to(target, "nats_slow_consumer");
            }
            slow_seen = connection.slow_consumer;
            if reconnects > reconnects_seen {
                let workers: Vec<WorkerId> = carried.iter().copied().collect();
                router.note_reconnects_to(target, &workers, reconnects - reconnects_seen);
                router.note_source_reconnects(&self.labels, reconnects - reconnects_seen);
                reconnects_seen = reconnects;
            }
            if !caught_up && message.pending == Some(0) {
                caught_up = true;
                router.note_caught_up(&self.labels);
            }
            match decoded {
                Ok(events) => {
                    stats.events += events.len() as u64;
                    router.apply_batch_to(target, &events);
                }
                Err(reason) => {
                    stats.refused += 1;
                    router.drop_one_to(target, reason);
                }
            }
        }
        if self.durable {
            let _ = self.subscriber.close().await;
        }
        Ok(stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn json_and_envelopes_are_told_apart_and_garbage_is_a_reason() {
        let limits = DecodeLimits::default();
        let json = br#"{"worker_id":3,"storage_tier":"host_pinned","event":{"event_id":1,"dp_rank":0,"data":{"removed":{"block_hashes":[5]}}}}"#;
        let events = decode_message(json, &limits).unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].worker.get(), 3);
        let envelope = Envelope {
            publisher_id: 1,
            sequence: 0,
            published_at_ms: 0,
            topic: Envelope::TOPIC.to_string(),
            events: vec![RouterEvent::from_json(json, &limits).unwrap(); 3],
        };
        assert_eq!(
            decode_message(&envelope.to_bytes(), &limits).unwrap().len(),
            3
        );
        assert!(decode_message(b"{nope", &limits).is_err());
        assert!(decode_message(b"", &limits).is_err());
    }

    #[test]
    fn urls_lose_their_credentials() {
        assert_eq!(redact_url("nats://u:p@h:4222"), "nats://h:4222");
        assert_eq!(redact_url("tls://token@h:4222/x"), "tls://h:4222/x");
        assert_eq!(redact_url("nats://h:4222"), "nats://h:4222");
        assert_eq!(redact_url("h:4222"), "h:4222");
    }

    proptest! {
        #[test]
        fn any_message_decodes_or_gives_a_reason(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode_message(&bytes, &DecodeLimits::default());
        }
    }
}
