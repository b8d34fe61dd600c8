//! The publishing side: opaque payloads onto one subject, core NATS or JetStream.
//!
//! Owns: [`NatsPublisher`] (a client, the subject, the mode, and its counters),
//! [`PublisherConfig`] and [`PublisherStats`].
//! In JetStream mode the stream is created at connect when missing (bound to the subject,
//! file storage, oldest discarded past its byte bound) and every publish waits for the
//! server's ack, so `Ok` means stored. In core mode `Ok` means queued on the connection.
//! Never: encode or batch events (the caller hands finished payloads), retry a publish
//! (a retry after a lost ack could store a payload twice; the caller decides), or wait
//! longer than the configured request timeout.

use super::{
    connect, ensure_stream, jetstream_context, ConnectConfig, ConnectionCounters, ConnectionStats,
    NatsError, NatsMode, DEFAULT_STREAM_MAX_BYTES,
};
use async_nats::jetstream;
use bytes::Bytes;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// How to publish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublisherConfig {
    /// The server and timeouts.
    pub connect: ConnectConfig,
    /// The subject every payload goes to, e.g. Dynamo's
    /// `namespace.{ns}.component.{component}.kv_events`.
    pub subject: String,
    /// Core NATS or JetStream.
    pub mode: NatsMode,
    /// Byte bound of the stream if this publisher creates it (`None`: unbounded). An
    /// existing stream keeps its own limits.
    pub stream_max_bytes: Option<u64>,
}

impl PublisherConfig {
    /// Publishes to `subject` on the server at `url`, with [`ConnectConfig::new`]'s
    /// timeouts and a stream bound of [`DEFAULT_STREAM_MAX_BYTES`].
    pub fn new(url: &str, subject: &str, mode: NatsMode) -> Self {
        Self {
            connect: ConnectConfig::new(url),
            subject: subject.to_string(),
            mode,
            stream_max_bytes: Some(DEFAULT_STREAM_MAX_BYTES),
        }
    }
}

/// What a publisher has done.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PublisherStats {
    /// Payloads queued (core) or stored and acknowledged (JetStream).
    pub published: u64,
    /// Payload bytes of those.
    pub published_bytes: u64,
    /// Publishes that returned an error (including timeouts).
    pub failed: u64,
    /// JetStream acks that said the payload was a duplicate (not stored again).
    pub duplicates: u64,
    /// The connection's events.
    pub connection: ConnectionStats,
}

/// Where payloads go once connected.
#[derive(Debug)]
enum Target {
    Core,
    JetStream(Box<jetstream::Context>),
}

/// Publishes payloads on one subject. `publish` takes `&self`, so one publisher can be
/// shared between tasks (behind an `Arc`).
#[derive(Debug)]
pub struct NatsPublisher {
    client: async_nats::Client,
    target: Target,
    subject: String,
    config: PublisherConfig,
    connection: Arc<ConnectionCounters>,
    published: AtomicU64,
    published_bytes: AtomicU64,
    failed: AtomicU64,
    duplicates: AtomicU64,
}

impl NatsPublisher {
    /// Connects and, in JetStream mode, creates or looks up the stream, which must store
    /// the subject ([`NatsError::SubjectNotInStream`] otherwise).
    pub async fn connect(config: PublisherConfig) -> Result<Self, NatsError> {
        let (client, connection) = connect(&config.connect).await?;
        let target = match &config.mode {
            NatsMode::Core => Target::Core,
            NatsMode::JetStream { stream } => {
                let context = jetstream_context(client.clone(), config.connect.request_timeout);
                ensure_stream(&context, stream, &config.subject, config.stream_max_bytes).await?;
                Target::JetStream(Box::new(context))
            }
        };
        Ok(Self {
            client,
            target,
            subject: config.subject.clone(),
            config,
            connection,
            published: AtomicU64::new(0),
            published_bytes: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            duplicates: AtomicU64::new(0),
        })
    }

    /// Publishes one payload. Core: `Ok(None)` once queued on the connection (delivered to
    /// the subscribers connected when the server gets it). JetStream: `Ok(Some(sequence))`
    /// once the server has stored it, `sequence` being its stream sequence. Bounded by the
    /// request timeout; a JetStream timeout leaves it unknown whether the payload was
    /// stored.
    pub async fn publish(&self, payload: impl Into<Bytes>) -> Result<Option<u64>, NatsError> {
        let payload = payload.into();
        let len = payload.len() as u64;
        let timeout = self.config.connect.request_timeout;
        let result = match tokio::time::timeout(timeout, self.send(payload)).await {
            Ok(result) => result,
            Err(_) => Err(NatsError::Timeout {
                op: "publish",
                after: timeout,
            }),
        };
        match &result {
            Ok(_) => {
                self.published.fetch_add(1, Ordering::Relaxed);
                self.published_bytes.fetch_add(len, Ordering::Relaxed);
            }
            Err(_) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
            }
        }
        result
    }

    async fn send(&self, payload: Bytes) -> Result<Option<u64>, NatsError> {
        match &self.target {
            Target::Core => self
                .client
                .publish(self.subject.clone(), payload)
                .await
                .map(|()| None)
                .map_err(|source| NatsError::Publish {
                    subject: self.subject.clone(),
                    source,
                }),
            Target::JetStream(context) => {
                let error = |source| NatsError::JetStreamPublish {
                    subject: self.subject.clone(),
                    source,
                };
                let ack = context
                    .publish(self.subject.clone(), payload)
                    .await
                    .map_err(error)?
                    .await
                    .map_err(error)?;
                if ack.duplicate {
                    self.duplicates.fetch_add(1, Ordering::Relaxed);
                }
                Ok(Some(ack.sequence))
            }
        }
    }

    /// Waits (bounded by the request timeout) until the server has received everything
    /// published so far: after it, a core payload has reached every subscriber the server
    /// knew of.
    pub async fn flush(&self) -> Result<(), NatsError> {
        let timeout = self.config.connect.request_timeout;
        match tokio::time::timeout(timeout, self.client.flush()).await {
            Ok(result) => result.map_err(NatsError::Flush),
            Err(_) => Err(NatsError::Timeout {
                op: "flush",
                after: timeout,
            }),
        }
    }

    /// The subject payloads go to.
    pub fn subject(&self) -> &str {
        &self.subject
    }

    /// Core or JetStream (and which stream).
    pub fn mode(&self) -> &NatsMode {
        &self.config.mode
    }

    /// Whether the client is connected right now (it reconnects on its own).
    pub fn is_connected(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }

    /// The counters so far.
    pub fn stats(&self) -> PublisherStats {
        PublisherStats {
            published: self.published.load(Ordering::Relaxed),
            published_bytes: self.published_bytes.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
            duplicates: self.duplicates.load(Ordering::Relaxed),
            connection: self.connection.snapshot(),
        }
    }
}
