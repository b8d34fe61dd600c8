//! The live advisor's inputs: a task per NATS subject and a thread per engine's ZMQ
//! stream, each turning what arrives into Dynamo `RouterEvent`s (the form `--record`
//! writes and `--replay` reads) handed over one bounded channel.
//!
//! NATS: each message is one RouterEvent as JSON or a Dynamo 1.6 msgpack envelope of
//! several (told apart by the first byte, as `kvtwin router --nats` does), decoded by
//! `kvtwin_plane::wire`. ZMQ: the plane's `ZmqSubscriber` (gaps filled from the engine's
//! replay socket, restarts detected) and its decoder, normalised and numbered per rank as
//! `kvtwin relay` publishes them (the engine's block hashes, tokens hashes computed); a
//! restarted engine becomes a `Cleared` per rank it had published.
//! Queues (each bounded): async-nats's subscription queue (past it the client drops and
//! reports a slow consumer), libzmq's receive queue (past it batches show up as gaps,
//! then replayed or counted lost), and the channel to the advisor ([`CHANNEL_BOUND`]
//! messages: a full one makes the sources wait, pushing back onto those queues).
//! Never: apply an event (the advisor's loop does), or stop on a bad message (it is
//! counted by its reason and skipped).

use crate::args::zmq::ZmqSourceArg;
use anyhow::{Context, Result};
use kvtwin::ids::WorkerId;
use kvtwin_plane::nats::{ConsumeMode, NatsAuth, NatsError, NatsSubscriber, SubscriberConfig};
use kvtwin_plane::service::nats_source::redact_url;
use kvtwin_plane::service::source::{ENGINE_MAX_MESSAGE_BYTES, ENGINE_RECEIVE_HWM_BATCHES};
use kvtwin_plane::wire::normalize::EngineNormalizer;
use kvtwin_plane::wire::{DecodeLimits, EngineDecoder, Envelope, RouterEvent, UnknownEvents};
use kvtwin_plane::zmq::{SubscriberConfig as ZmqSubscriberConfig, SubscriberItem, ZmqSubscriber};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// Messages between the sources and the advisor's loop.
pub(super) const CHANNEL_BOUND: usize = 1024;

/// What a source hands the advisor.
#[derive(Debug)]
pub(super) enum Input {
    /// Events received (a message, a batch, or a restart's `Cleared`s).
    Events {
        /// The source's index.
        source: usize,
        /// Its events, in order.
        events: Vec<RouterEvent>,
    },
    /// Messages, batches or events refused, by reason.
    Dropped {
        /// The source's index.
        source: usize,
        /// The stable reason (`bad_json`, `malformed_msgpack`, `unknown_medium`...).
        reason: &'static str,
        /// How many.
        count: u64,
    },
    /// Engine batches neither the live stream nor replay supplied.
    Lost {
        /// The source's index.
        source: usize,
        /// How many.
        batches: u64,
    },
    /// The source stopped for good.
    Failed {
        /// The source's index.
        source: usize,
        /// Why.
        error: String,
    },
}

/// What feeds the advisor: the ZMQ threads (stopped and joined when dropped) and the
/// NATS tasks (stopped through the watch).
pub(super) struct Sources {
    /// One label per source, by index.
    pub(super) labels: Vec<String>,
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    nats_stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Sources {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.nats_stop.send(true);
        for task in &self.tasks {
            task.abort();
        }
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Where to listen.
pub(super) struct SourceSpecs<'a> {
    /// The NATS server, if any.
    pub(super) nats: Option<&'a str>,
    /// Its subjects.
    pub(super) subjects: Vec<String>,
    /// Its credentials.
    pub(super) auth: NatsAuth,
    /// The engines' streams.
    pub(super) zmq: Vec<ZmqSourceArg>,
}

/// Connects every source (NATS subscriptions in place on the server before this
/// returns, so nothing published afterwards is missed) and starts them.
pub(super) async fn start(specs: SourceSpecs<'_>, sender: mpsc::Sender<Input>) -> Result<Sources> {
    let (nats_stop, _) = watch::channel(false);
    let mut sources = Sources {
        labels: Vec::new(),
        stop: Arc::new(AtomicBool::new(false)),
        threads: Vec::new(),
        nats_stop,
        tasks: Vec::new(),
    };
    if let Some(url) = specs.nats {
        for subject in &specs.subjects {
            let mut config = SubscriberConfig::new(url, subject, ConsumeMode::Core);
            config.connect.auth = specs.auth.clone();
            config.connect.name = Some("kvtwin-advisor".to_string());
            let subscriber = NatsSubscriber::connect(config)
                .await
                .with_context(|| format!("subscribing to {subject} on {}", redact_url(url)))?;
            subscriber
                .flush()
                .await
                .with_context(|| format!("subscribing to {subject} on {}", redact_url(url)))?;
            let index = sources.labels.len();
            sources
                .labels
                .push(format!("nats {} {subject}", redact_url(url)));
            sources.tasks.push(tokio::spawn(nats_source(
                index,
                subscriber,
                sender.clone(),
                sources.nats_stop.subscribe(),
            )));
        }
    }
    for spec in &specs.zmq {
        let config = ZmqSubscriberConfig {
            receive_hwm_batches: ENGINE_RECEIVE_HWM_BATCHES,
            max_message_bytes: Some(ENGINE_MAX_MESSAGE_BYTES),
            ..ZmqSubscriberConfig::new(&spec.endpoint, spec.replay.as_deref())
        };
        let subscriber = ZmqSubscriber::new(config)
            .with_context(|| format!("subscribing to {}", spec.endpoint))?;
        let index = sources.labels.len();
        sources
            .labels
            .push(format!("zmq {} worker {}", spec.endpoint, spec.worker));
        let worker = WorkerId::new(spec.worker);
        let (sender, stop) = (sender.clone(), sources.stop.clone());
        let thread = std::thread::Builder::new()
            .name(format!("kvtwin-advisor-zmq-{worker}"))
            .spawn(move || zmq_source(index, worker, subscriber, &sender, &stop))
            .context("starting a ZMQ source's thread")?;
        sources.threads.push(thread);
    }
    Ok(sources)
}

/// One message's events, or the reason it is refused.
pub(super) fn decode_nats(
    payload: &[u8],
    limits: &DecodeLimits,
) -> Result<Vec<RouterEvent>, &'static str> {
    if payload.first() == Some(&b'{') {
        let event = RouterEvent::from_json(payload, limits).map_err(|error| error.reason())?;
        Ok(vec![event])
    } else {
        let envelope = Envelope::decode(payload, limits).map_err(|error| error.reason())?;
        Ok(envelope.events)
    }
}

async fn nats_source(
    source: usize,
    mut subscriber: NatsSubscriber,
    sender: mpsc::Sender<Input>,
    mut stop: watch::Receiver<bool>,
) {
    let limits = DecodeLimits::default();
    loop {
        let message = tokio::select! {
            message = subscriber.next() => message,
            _ = stop.wait_for(|stop| *stop) => return,
        };
        let input = match message {
            Ok(message) => match decode_nats(&message.payload, &limits) {
                Ok(events) => Input::Events { source, events },
                Err(reason) => Input::Dropped {
                    source,
                    reason,
                    count: 1,
                },
            },
            Err(NatsError::Closed) => return,
            Err(error) => Input::Failed {
                source,
                error: error.to_string(),
            },
        };
        let failed = matches!(input, Input::Failed { .. });
        if sender.send(input).await.is_err() || failed {
            return;
        }
    }
}

/// The ZMQ thread: until `stop`, batches in, router events out.
fn zmq_source(
    source: usize,
    worker: WorkerId,
    mut subscriber: ZmqSubscriber,
    sender: &mpsc::Sender<Input>,
    stop: &AtomicBool,
) {
    let decoder = EngineDecoder::new(DecodeLimits::default(), UnknownEvents::Skip);
    let mut normalizer = EngineNormalizer::default();
    let mut next_ids: BTreeMap<u32, u64> = BTreeMap::new();
    let dropped = |reason: &'static str, count: u64| Input::Dropped {
        source,
        reason,
        count,
    };
    while !stop.load(Ordering::Relaxed) {
        let mut inputs = Vec::new();
        match subscriber.next(Duration::from_millis(50)) {
            Ok(Some(SubscriberItem::Batch(batch))) => {
                match decoder.decode_payload(batch.seq, &batch.payload) {
                    Ok(decoded) => {
                        for skipped in &decoded.skipped {
                            inputs.push(dropped(skipped.error.reason(), 1));
                        }
                        let next = next_ids.entry(decoded.dp_rank.unwrap_or(0)).or_default();
                        let (mut events, mut filtered) = (Vec::new(), Vec::new());
                        let result = normalizer.router_events(
                            &decoded,
                            worker,
                            next,
                            &mut events,
                            &mut filtered,
                        );
                        inputs.extend(filtered.into_iter().map(|reason| dropped(reason, 1)));
                        match result {
                            Ok(()) => inputs.push(Input::Events { source, events }),
                            Err(error) => inputs.push(dropped(error.reason(), 1)),
                        }
                    }
                    Err(error) => inputs.push(dropped(error.reason(), 1)),
                }
            }
            Ok(Some(SubscriberItem::Restarted { .. })) => {
                normalizer.restarted();
                // Every rank seen starts over: its blocks are gone.
                let events = RouterEvent::cleared_ranks(worker, &mut next_ids);
                inputs.push(Input::Events { source, events });
            }
            Ok(Some(SubscriberItem::Lost { first, last })) => inputs.push(Input::Lost {
                source,
                batches: last - first + 1,
            }),
            Ok(Some(SubscriberItem::Malformed(error))) => inputs.push(dropped(error.reason(), 1)),
            Ok(None) => {}
            Err(error) => {
                let _ = sender.blocking_send(Input::Failed {
                    source,
                    error: error.to_string(),
                });
                return;
            }
        }
        for input in inputs {
            if sender.blocking_send(input).is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvtwin::events::{KvCacheEvent, KvCacheEventData, StoredBlock};
    use kvtwin::ids::{LocalBlockHash, SequenceHash};
    use kvtwin::tier::Tier;

    #[test]
    fn nats_payloads_are_json_events_or_envelopes_and_anything_else_a_reason() {
        let event = RouterEvent {
            worker_id: WorkerId::new(4),
            event: KvCacheEvent {
                event_id: 1,
                dp_rank: 0,
                data: KvCacheEventData::Stored {
                    parent_hash: None,
                    blocks: vec![StoredBlock {
                        block_hash: SequenceHash::new(7),
                        tokens_hash: LocalBlockHash::new(8),
                    }],
                    tier: Tier::Host,
                },
            },
        };
        let limits = DecodeLimits::default();
        assert_eq!(decode_nats(&event.to_json(), &limits), Ok(vec![event]));
        assert!(decode_nats(b"{\"not\": 1}", &limits).is_err());
        assert!(decode_nats(b"\x93\xc1", &limits).is_err());
    }
}
