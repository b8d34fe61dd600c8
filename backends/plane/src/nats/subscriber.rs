//! The consuming side: payloads from one subject, live (core NATS) or from a JetStream
//! stream (durable and resumable, or replayed from the start).
//!
//! Owns: [`NatsSubscriber`] (a client and one of: a core subscription, a durable pull
//! consumer's message stream with the last message handed out but not yet acknowledged,
//! or an ordered consumer's stream), [`ConsumeMode`], [`SubscriberConfig`],
//! [`NatsMessage`] and [`SubscriberStats`].
//! Invariants: JetStream messages are handed out in increasing stream sequence, never the
//! same sequence twice in one run (redeliveries are counted and dropped); a durable
//! consumer acknowledges a message only when the caller asks for the next one (or
//! closes), so an acknowledged message is one the caller has finished with.
//! Never: decode a payload, or end a subscription because the server went away (the client
//! reconnects and the subscription, pull requests included, continues).

use super::{
    connect, ensure_stream, jetstream_context, ConnectConfig, ConnectionCounters, ConnectionStats,
    NatsError, DEFAULT_STREAM_MAX_BYTES,
};
use async_nats::jetstream::{
    self,
    consumer::{pull, AckPolicy, DeliverPolicy},
    context::ConsumerInfoErrorKind,
};
use bytes::Bytes;
use futures::StreamExt;
use std::sync::Arc;
use std::time::Duration;

/// Where messages come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConsumeMode {
    /// A core subscription: only what is published while subscribed (and connected), no
    /// sequence numbers.
    Core,
    /// A durable JetStream pull consumer named `name` on `stream`: the first run delivers
    /// the whole stream (`DeliverPolicy::All`), a later run with the same name resumes
    /// after the last message an earlier run finished with. One subscriber per name at a
    /// time: a run that finds messages delivered but not acknowledged (its predecessor
    /// stopped without [`NatsSubscriber::close`], or had prefetched them) recreates the
    /// consumer at the first unacknowledged one, so nothing is skipped and order holds.
    Durable {
        /// The stream's name.
        stream: String,
        /// The consumer's durable name (no `.`, `*`, `>` or whitespace).
        name: String,
    },
    /// The whole stream from its first message, then live, through an ordered ephemeral
    /// consumer (nothing acknowledged, nothing remembered): how a restarted router
    /// rebuilds its state from the event stream alone.
    Replay {
        /// The stream's name.
        stream: String,
    },
}

/// How to subscribe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubscriberConfig {
    /// The server and timeouts.
    pub connect: ConnectConfig,
    /// The subject (a stream's consumer filters on it).
    pub subject: String,
    /// Core, durable or replay.
    pub mode: ConsumeMode,
    /// Byte bound of the stream if this subscriber creates it (it does when it starts
    /// before any publisher); `None`: unbounded.
    pub stream_max_bytes: Option<u64>,
    /// Messages a durable consumer asks for per pull: the bound on what is fetched but not
    /// yet handed out.
    pub pull_batch: usize,
    /// Lifetime of a pull request; the server sends heartbeats every half of it, so a dead
    /// server is noticed within about this long.
    pub pull_expires: Duration,
    /// How long the server waits for a durable consumer's ack before delivering the message
    /// again (after a lost ack).
    pub ack_wait: Duration,
}

impl SubscriberConfig {
    /// Subscribes to `subject` on the server at `url`, with [`ConnectConfig::new`]'s
    /// timeouts, pulls of 128 messages expiring after 4 s, a 30 s ack wait, and a stream
    /// bound of [`DEFAULT_STREAM_MAX_BYTES`].
    pub fn new(url: &str, subject: &str, mode: ConsumeMode) -> Self {
        Self {
            connect: ConnectConfig::new(url),
            subject: subject.to_string(),
            mode,
            stream_max_bytes: Some(DEFAULT_STREAM_MAX_BYTES),
            pull_batch: 128,
            pull_expires: Duration::from_secs(4),
            ack_wait: Duration::from_secs(30),
        }
    }
}

/// One message handed out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NatsMessage {
    /// The subject it was published on.
    pub subject: String,
    /// Its stream sequence (JetStream), `None` for core NATS.
    pub sequence: Option<u64>,
    /// Messages the consumer still has to deliver after this one, as the server counted
    /// when it sent it (JetStream): `Some(0)` means a replay has caught up.
    pub pending: Option<u64>,
    /// The payload, as published.
    pub payload: Bytes,
}

/// What a subscriber has done.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SubscriberStats {
    /// Messages handed out.
    pub received: u64,
    /// Payload bytes of those.
    pub received_bytes: u64,
    /// JetStream redeliveries of a sequence already handed out, dropped.
    pub duplicates: u64,
    /// JetStream messages without a parsable ack subject (no sequence), dropped.
    pub malformed: u64,
    /// Acknowledgements that could not be sent (the message will come back and be dropped
    /// as a duplicate, or be redelivered to the next run).
    pub acks_failed: u64,
    /// Pull requests that went unanswered past their heartbeat, or found JetStream not
    /// ready (around a server restart); the pull is issued again.
    pub pull_interruptions: u64,
    /// The connection's events.
    pub connection: ConnectionStats,
}

/// The subscription behind a subscriber.
enum Source {
    Core(async_nats::Subscriber),
    Durable {
        /// For reading its state (boxed: it is large and only `close` uses it).
        consumer: Box<jetstream::consumer::PullConsumer>,
        messages: pull::Stream,
        /// The last message handed out, acknowledged when the next is asked for.
        unacked: Option<jetstream::Message>,
    },
    Replay(pull::Ordered),
}

impl std::fmt::Debug for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Source::Core(_) => "Core",
            Source::Durable { .. } => "Durable",
            Source::Replay(_) => "Replay",
        })
    }
}

/// Receives payloads from one subject. `next` is cancel safe: dropping its future (a
/// `select!` or a timeout) loses no message.
#[derive(Debug)]
pub struct NatsSubscriber {
    client: async_nats::Client,
    source: Source,
    config: SubscriberConfig,
    connection: Arc<ConnectionCounters>,
    /// The highest stream sequence handed out (0: none yet).
    last_sequence: u64,
    stats: SubscriberStats,
    initial_pending: Option<u64>,
}

impl NatsSubscriber {
    /// Connects and subscribes. JetStream modes create the stream when missing (so a
    /// subscriber may start before its publisher); it must store the subject. A core
    /// subscription is in place at the server when this returns (it waits for the
    /// server to answer a flush), so whatever is published from then on reaches it.
    pub async fn connect(config: SubscriberConfig) -> Result<Self, NatsError> {
        let (client, connection) = connect(&config.connect).await?;
        let mut initial_pending = None;
        let source = match &config.mode {
            ConsumeMode::Core => Source::Core(
                client
                    .subscribe(config.subject.clone())
                    .await
                    .map_err(|source| NatsError::Subscribe {
                        subject: config.subject.clone(),
                        source,
                    })?,
            ),
            ConsumeMode::Durable { stream, name } => {
                let (consumer, messages) = durable(&client, &config, stream, name).await?;
                Source::Durable {
                    consumer: Box::new(consumer),
                    messages,
                    unacked: None,
                }
            }
            ConsumeMode::Replay { stream } => {
                let (messages, pending) = replay(&client, &config, stream).await?;
                initial_pending = Some(pending);
                Source::Replay(messages)
            }
        };
        let subscriber = Self {
            client,
            source,
            config,
            connection,
            last_sequence: 0,
            stats: SubscriberStats::default(),
            initial_pending,
        };
        if matches!(subscriber.source, Source::Core(_)) {
            // `subscribe` returns once SUB is queued, not processed: a message another
            // connection publishes meanwhile would miss it (a TLS test lost its only
            // message that way in CI).
            subscriber.flush().await?;
        }
        Ok(subscriber)
    }

    /// In [`ConsumeMode::Replay`], the messages the stream held for the subject when the
    /// consumer was made (what a replay must deliver before it has caught up; each
    /// message's `pending` then says how many are left); `None` in other modes.
    pub fn initial_pending(&self) -> Option<u64> {
        self.initial_pending
    }

    /// The next message, waiting as long as it takes (across server restarts). A durable
    /// consumer first acknowledges the message handed out before. Errors are what retrying
    /// cannot fix: the subscription closed, or the consumer was deleted.
    pub async fn next(&mut self) -> Result<NatsMessage, NatsError> {
        loop {
            let message = match &mut self.source {
                Source::Core(subscriber) => {
                    let message = subscriber.next().await.ok_or(NatsError::Closed)?;
                    return Ok(self.hand_out(
                        message.subject.to_string(),
                        None,
                        None,
                        message.payload,
                    ));
                }
                Source::Durable {
                    messages, unacked, ..
                } => {
                    if let Some(done) = unacked.as_ref() {
                        // Kept until sent: a cancelled `next` acknowledges it next time.
                        if done.ack().await.is_err() {
                            self.stats.acks_failed += 1;
                        }
                        *unacked = None;
                    }
                    match messages.next().await.ok_or(NatsError::Closed)? {
                        Ok(message) => message,
                        Err(error) => match error.kind() {
                            pull::MessagesErrorKind::MissingHeartbeat
                            | pull::MessagesErrorKind::NoResponders => {
                                self.stats.pull_interruptions += 1;
                                continue;
                            }
                            _ => return Err(NatsError::Messages(error)),
                        },
                    }
                }
                Source::Replay(messages) => {
                    // async-nats 0.51's ordered consumer, on a first missed heartbeat, returns
                    // Pending without arranging to be woken, so a server restart would stall
                    // it until something else polled it. Polling again every heartbeat lets
                    // it see the second miss and recreate itself (dropping a `next` future
                    // loses nothing: its state is in the stream).
                    let tick = (self.config.pull_expires / 2).max(Duration::from_millis(100));
                    let Ok(item) = tokio::time::timeout(tick, messages.next()).await else {
                        continue;
                    };
                    match item.ok_or(NatsError::Closed)? {
                        Ok(message) => message,
                        Err(error) => match error.kind() {
                            pull::OrderedErrorKind::MissingHeartbeat => {
                                self.stats.pull_interruptions += 1;
                                continue;
                            }
                            _ => return Err(NatsError::Replay(error)),
                        },
                    }
                }
            };
            let Ok(info) = message.info() else {
                self.stats.malformed += 1;
                self.ack_dropped(&message).await;
                continue;
            };
            let (sequence, pending) = (info.stream_sequence, info.pending);
            if sequence <= self.last_sequence {
                self.stats.duplicates += 1;
                self.ack_dropped(&message).await;
                continue;
            }
            self.last_sequence = sequence;
            let handed = self.hand_out(
                message.subject.to_string(),
                Some(sequence),
                Some(pending),
                message.payload.clone(),
            );
            if let Source::Durable { unacked, .. } = &mut self.source {
                *unacked = Some(message);
            }
            return Ok(handed);
        }
    }

    /// [`next`](Self::next) bounded by `timeout`: `Ok(None)` when nothing came in time.
    pub async fn recv_timeout(
        &mut self,
        timeout: Duration,
    ) -> Result<Option<NatsMessage>, NatsError> {
        match tokio::time::timeout(timeout, self.next()).await {
            Ok(result) => result.map(Some),
            Err(_) => Ok(None),
        }
    }

    /// Waits (bounded by the request timeout) until the server has processed everything
    /// this client sent, subscriptions included: after a reconnect, core messages
    /// published from then on reach this subscriber.
    ///
    /// The future holds a clone of the client, not `&self`: the replay consumer inside
    /// `self` is not `Sync`, so a future borrowing `self` could not be spawned on a
    /// multi-threaded runtime.
    pub fn flush(
        &self,
    ) -> impl std::future::Future<Output = Result<(), NatsError>> + Send + 'static {
        let timeout = self.config.connect.request_timeout;
        let client = self.client.clone();
        async move {
            match tokio::time::timeout(timeout, client.flush()).await {
                Ok(result) => result.map_err(NatsError::Flush),
                Err(_) => Err(NatsError::Timeout {
                    op: "flush",
                    after: timeout,
                }),
            }
        }
    }

    /// Ends the run cleanly: a durable consumer acknowledges the last message handed out
    /// and waits (bounded by the request timeout) until the server has applied every ack
    /// of this run, so the next run with the same name starts right after that message.
    /// (Dropping a subscriber instead may leave messages it handed out to be delivered
    /// again to the next run, in order.)
    pub async fn close(mut self) -> Result<(), NatsError> {
        let timeout = self.config.connect.request_timeout;
        let Source::Durable {
            consumer, unacked, ..
        } = &mut self.source
        else {
            return self.flush().await;
        };
        if let Some(done) = unacked.take() {
            if let Err(source) = done.ack().await {
                self.stats.acks_failed += 1;
                return Err(NatsError::Ack {
                    sequence: self.last_sequence,
                    source,
                });
            }
        }
        // The server applies acks in order but after it has answered a flush, so wait for
        // the consumer's ack floor (everything up to it acknowledged) to reach the last
        // message handed out.
        let started = std::time::Instant::now();
        loop {
            let info = consumer
                .get_info()
                .await
                .map_err(|source| NatsError::ConsumerInfo {
                    stream: consumer.cached_info().stream_name.clone(),
                    consumer: consumer.cached_info().name.clone(),
                    source,
                })?;
            if info.ack_floor.stream_sequence >= self.last_sequence {
                return Ok(());
            }
            if started.elapsed() > timeout {
                return Err(NatsError::Timeout {
                    op: "ack floor",
                    after: timeout,
                });
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Whether the client is connected right now (it reconnects on its own).
    pub fn is_connected(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }

    /// The subject subscribed to.
    pub fn subject(&self) -> &str {
        &self.config.subject
    }

    /// The mode subscribed with.
    pub fn mode(&self) -> &ConsumeMode {
        &self.config.mode
    }

    /// The counters so far.
    pub fn stats(&self) -> SubscriberStats {
        SubscriberStats {
            connection: self.connection.snapshot(),
            ..self.stats
        }
    }

    fn hand_out(
        &mut self,
        subject: String,
        sequence: Option<u64>,
        pending: Option<u64>,
        payload: Bytes,
    ) -> NatsMessage {
        self.stats.received += 1;
        self.stats.received_bytes += payload.len() as u64;
        NatsMessage {
            subject,
            sequence,
            pending,
            payload,
        }
    }

    /// Acknowledges a message that is not handed out (a durable consumer would otherwise
    /// deliver it again after the ack wait).
    async fn ack_dropped(&mut self, message: &jetstream::Message) {
        if matches!(self.source, Source::Durable { .. }) && message.ack().await.is_err() {
            self.stats.acks_failed += 1;
        }
    }
}

/// The durable consumer and its message stream, resuming after the last acknowledged
/// message.
async fn durable(
    client: &async_nats::Client,
    config: &SubscriberConfig,
    stream_name: &str,
    name: &str,
) -> Result<(jetstream::consumer::PullConsumer, pull::Stream), NatsError> {
    let context = jetstream_context(client.clone(), config.connect.request_timeout);
    let stream = ensure_stream(
        &context,
        stream_name,
        &config.subject,
        config.stream_max_bytes,
    )
    .await?;
    let consumer_error = |source| NatsError::Consumer {
        stream: stream_name.to_string(),
        consumer: name.to_string(),
        source,
    };
    let consumer_config = pull::Config {
        durable_name: Some(name.to_string()),
        deliver_policy: DeliverPolicy::All,
        ack_policy: AckPolicy::Explicit,
        ack_wait: config.ack_wait,
        filter_subject: config.subject.clone(),
        ..Default::default()
    };
    let consumer: jetstream::consumer::PullConsumer = match stream.consumer_info(name).await {
        // New, or left with nothing in flight: created as configured, or used as it is.
        Err(error) if error.kind() == ConsumerInfoErrorKind::NotFound => stream
            .create_consumer(consumer_config)
            .await
            .map_err(consumer_error)?,
        Ok(info) if info.num_ack_pending == 0 => stream
            .get_or_create_consumer(name, consumer_config)
            .await
            .map_err(consumer_error)?,
        Ok(info) => {
            // Delivered but unacknowledged messages would come back only after the ack
            // wait, behind newer ones. Since acks follow the order of delivery, the first
            // unacknowledged message is the one after the ack floor: start over there.
            stream.delete_consumer(name).await.map_err(consumer_error)?;
            stream
                .create_consumer(pull::Config {
                    deliver_policy: DeliverPolicy::ByStartSequence {
                        start_sequence: info.ack_floor.stream_sequence + 1,
                    },
                    ..consumer_config
                })
                .await
                .map_err(consumer_error)?
        }
        Err(source) => {
            return Err(NatsError::ConsumerInfo {
                stream: stream_name.to_string(),
                consumer: name.to_string(),
                source,
            })
        }
    };
    let messages = consumer
        .stream()
        .max_messages_per_batch(config.pull_batch)
        .expires(config.pull_expires)
        .heartbeat(config.pull_expires / 2)
        .messages()
        .await
        .map_err(|source| NatsError::ConsumerStream {
            stream: stream_name.to_string(),
            consumer: name.to_string(),
            source,
        })?;
    Ok((consumer, messages))
}

/// An ordered consumer over the whole stream from its first message, and the messages
/// it had to deliver when made.
async fn replay(
    client: &async_nats::Client,
    config: &SubscriberConfig,
    stream_name: &str,
) -> Result<(pull::Ordered, u64), NatsError> {
    const NAME: &str = "(ordered replay)";
    let context = jetstream_context(client.clone(), config.connect.request_timeout);
    let stream = ensure_stream(
        &context,
        stream_name,
        &config.subject,
        config.stream_max_bytes,
    )
    .await?;
    let consumer = stream
        .create_consumer(pull::OrderedConfig {
            filter_subject: config.subject.clone(),
            deliver_policy: DeliverPolicy::All,
            // Pull requests (and so heartbeats, and the recreation after a server restart
            // that missed ones trigger) are bounded by this.
            max_expires: config.pull_expires,
            ..Default::default()
        })
        .await
        .map_err(|source| NatsError::Consumer {
            stream: stream_name.to_string(),
            consumer: NAME.to_string(),
            source,
        })?;
    let pending = consumer.cached_info().num_pending;
    let messages = consumer
        .messages()
        .await
        .map_err(|source| NatsError::ConsumerStream {
            stream: stream_name.to_string(),
            consumer: NAME.to_string(),
            source,
        })?;
    Ok((messages, pending))
}
