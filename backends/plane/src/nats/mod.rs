//! NATS transport for the event plane (WIRE.md, "Dynamo RouterEvent" and "NATS server").
//!
//! Owns: [`NatsPublisher`] (payloads onto one subject, core NATS or JetStream with a
//! stream it creates or reuses and an ack per publish), [`NatsSubscriber`] (a core
//! subscription, a durable JetStream consumer that resumes where its last run stopped,
//! or an ordered replay of the whole stream from its first message), the connection
//! settings they share ([`ConnectConfig`]) and [`NatsError`]; with feature `testing`,
//! `NatsServer`, a `nats-server` child process for tests and benches.
//! Payloads are opaque bytes: a codec (`crate::wire`) turns them into events, so the
//! transport never depends on Dynamo's or an engine's encoding; `events.rs` adds the
//! typed shortcut for Dynamo's JSON `RouterEvent` ([`RouterEventMessage`]).
//! Invariants: a JetStream subscriber hands messages out in stream order, each at most
//! once per subscriber run; a durable consumer's acknowledgements only ever cover messages
//! already handed out, so a run started after [`NatsSubscriber::close`] resumes exactly
//! after its predecessor's last message, and one started after a crash gets again, in
//! order, what was not acknowledged (see [`ConsumeMode::Durable`]).
//! Never: decode a payload in the transport itself (only the typed shortcut calls
//! `crate::wire`), panic on what a server sends (everything from the network is a
//! `Result`), or wait on the network without a bound (connects, API requests and
//! publishes have timeouts; `next` waits as long as its caller lets it).
//!
//! Reconnection is async-nats's: a client reconnects on its own when the server comes
//! back, re-sends its core subscriptions and re-issues its pull requests; the counters in
//! [`ConnectionStats`] make those events visible.

mod auth;
mod events;
mod publisher;
#[cfg(feature = "testing")]
mod server;
#[cfg(feature = "testing")]
pub(crate) use server::log_tail;
mod subscriber;

pub use auth::{read_secret, NatsAuth, Secret};
pub use events::RouterEventMessage;
pub use publisher::{NatsPublisher, PublisherConfig, PublisherStats};
#[cfg(feature = "testing")]
pub use server::{NatsServer, NATS_SERVER_ENV};
pub use subscriber::{ConsumeMode, NatsMessage, NatsSubscriber, SubscriberConfig, SubscriberStats};

use async_nats::jetstream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The bound a JetStream stream is created with when neither side says otherwise: past it
/// the oldest messages are discarded, so a replay from the start then begins later.
pub const DEFAULT_STREAM_MAX_BYTES: u64 = 1 << 30;

/// Where published payloads go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NatsMode {
    /// Core NATS: fire and forget, delivered only to subscribers connected at the time.
    Core,
    /// JetStream: stored in `stream` (created with the subject when missing) and
    /// acknowledged by the server, so a subscriber started later still gets them.
    JetStream {
        /// The stream's name (no `.`, `*`, `>` or whitespace).
        stream: String,
    },
}

/// How to reach the server and how patient to be with it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectConfig {
    /// Server URL, e.g. `nats://127.0.0.1:4222`.
    pub url: String,
    /// The client name the server shows in its monitoring.
    pub name: Option<String>,
    /// Bound on the first connection (and on each reconnect attempt).
    pub connect_timeout: Duration,
    /// Bound on a JetStream API request, a publish acknowledgement, or a publish waiting
    /// for room in the outgoing queue.
    pub request_timeout: Duration,
    /// Longest pause between two reconnect attempts (they start immediately and back off
    /// exponentially up to this).
    pub reconnect_delay_max: Duration,
    /// Bound on the client's outgoing queue (commands); a full queue makes publishes wait,
    /// at most `request_timeout`.
    pub client_capacity: usize,
    /// Bound on each subscription's incoming queue; past it the client drops messages and
    /// counts a slow consumer ([`ConnectionStats::slow_consumer`]).
    pub subscription_capacity: usize,
    /// Credentials and TLS (none by default).
    pub auth: NatsAuth,
}

impl ConnectConfig {
    /// Defaults for `url`: 2 s to connect, 5 s per request, reconnects backing off to 1 s.
    pub fn new(url: &str) -> Self {
        Self {
            url: url.to_string(),
            name: None,
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(5),
            reconnect_delay_max: Duration::from_secs(1),
            client_capacity: 2048,
            subscription_capacity: 64 * 1024,
            auth: NatsAuth::default(),
        }
    }
}

/// Connection events counted since the client was created.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConnectionStats {
    /// Times the connection came up after being lost.
    pub reconnected: u64,
    /// Times the connection was lost.
    pub disconnected: u64,
    /// Times a subscription's queue overflowed and the client dropped messages.
    pub slow_consumer: u64,
    /// Errors the server reported (permissions, protocol).
    pub server_errors: u64,
}

/// The counters behind [`ConnectionStats`], written by the client's event callback.
#[derive(Debug, Default)]
struct ConnectionCounters {
    connected: AtomicU64,
    disconnected: AtomicU64,
    slow_consumer: AtomicU64,
    server_errors: AtomicU64,
}

impl ConnectionCounters {
    fn snapshot(&self) -> ConnectionStats {
        ConnectionStats {
            // The callback also fires for the first connection, which is no reconnect (it
            // may arrive after `connect` returns: until then this stays 0 by saturation).
            reconnected: self.connected.load(Ordering::Relaxed).saturating_sub(1),
            disconnected: self.disconnected.load(Ordering::Relaxed),
            slow_consumer: self.slow_consumer.load(Ordering::Relaxed),
            server_errors: self.server_errors.load(Ordering::Relaxed),
        }
    }
}

/// Everything that can go wrong in this module (the `nats-server` harness's own errors
/// only with feature `testing`).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NatsError {
    #[cfg(feature = "testing")]
    /// No `nats-server` binary where `NatsServer::find_binary` looks.
    #[error("nats-server not found (searched {searched:?}; install it or set {NATS_SERVER_ENV})")]
    ServerNotFound {
        /// The places searched, in order.
        searched: Vec<std::path::PathBuf>,
    },
    #[cfg(feature = "testing")]
    /// The server's store directory, log file or port could not be set up.
    #[error("nats-server setup ({what}): {source}")]
    ServerSetup {
        /// What was being set up.
        what: &'static str,
        /// The I/O error.
        source: std::io::Error,
    },
    #[cfg(feature = "testing")]
    /// The server process could not be started or signalled.
    #[error("nats-server {op} failed: {source}")]
    ServerProcess {
        /// `spawn`, `signal` or `wait`.
        op: &'static str,
        /// The I/O error.
        source: std::io::Error,
    },
    #[cfg(feature = "testing")]
    /// The server exited before it was ready.
    #[error("nats-server exited before it was ready ({status}); log: {log}")]
    ServerExited {
        /// Its exit status.
        status: std::process::ExitStatus,
        /// The end of its log.
        log: String,
    },
    #[cfg(feature = "testing")]
    /// The server did not become ready in time.
    #[error("nats-server not ready on port {port} after {waited:?}; log: {log}")]
    ServerNotReady {
        /// The port it should listen on.
        port: u16,
        /// How long we waited.
        waited: Duration,
        /// The end of its log.
        log: String,
    },
    /// Credentials or TLS settings that cannot be used (a file missing, empty or not
    /// what it should hold; two kinds of credentials at once).
    #[error("NATS {what}: {reason}")]
    Auth {
        /// What is wrong: the setting, and the file it names.
        what: String,
        /// Why.
        reason: String,
    },
    /// The client could not connect.
    #[error("connect to {url}: {source}")]
    Connect {
        /// The server URL.
        url: String,
        /// async-nats's error.
        source: async_nats::ConnectError,
    },
    /// The stream could not be created or looked up.
    #[error("JetStream stream {stream}: {source}")]
    Stream {
        /// The stream's name.
        stream: String,
        /// async-nats's error.
        source: jetstream::context::CreateStreamError,
    },
    /// The stream exists but does not store the subject, so publishes to it would not be
    /// stored (and would fail with "no responders").
    #[error("JetStream stream {stream} stores {subjects:?}, not {subject}")]
    SubjectNotInStream {
        /// The stream's name.
        stream: String,
        /// The subject asked for.
        subject: String,
        /// The subjects the stream stores.
        subjects: Vec<String>,
    },
    /// A consumer's state could not be read.
    #[error("JetStream consumer {consumer} on {stream}: info: {source}")]
    ConsumerInfo {
        /// The stream's name.
        stream: String,
        /// The consumer's name.
        consumer: String,
        /// async-nats's error.
        source: jetstream::context::ConsumerInfoError,
    },
    /// A consumer could not be created, looked up or deleted.
    #[error("JetStream consumer {consumer} on {stream}: {source}")]
    Consumer {
        /// The stream's name.
        stream: String,
        /// The consumer's name.
        consumer: String,
        /// async-nats's error.
        source: jetstream::stream::ConsumerError,
    },
    /// A consumer's message stream could not be started.
    #[error("JetStream consumer {consumer} on {stream}: messages: {source}")]
    ConsumerStream {
        /// The stream's name.
        stream: String,
        /// The consumer's name.
        consumer: String,
        /// async-nats's error.
        source: jetstream::consumer::StreamError,
    },
    /// A core publish could not be queued.
    #[error("publish to {subject}: {source}")]
    Publish {
        /// The subject.
        subject: String,
        /// async-nats's error.
        source: async_nats::PublishError,
    },
    /// A JetStream publish was not stored (no stream, a server error, or no ack).
    #[error("JetStream publish to {subject}: {source}")]
    JetStreamPublish {
        /// The subject.
        subject: String,
        /// async-nats's error.
        source: jetstream::context::PublishError,
    },
    /// A core subscription could not be made.
    #[error("subscribe to {subject}: {source}")]
    Subscribe {
        /// The subject.
        subject: String,
        /// async-nats's error.
        source: async_nats::SubscribeError,
    },
    /// A durable consumer's message stream failed in a way that retrying does not fix
    /// (the consumer was deleted, is push based, or refused the pull request).
    #[error("JetStream messages: {0}")]
    Messages(#[source] jetstream::consumer::pull::MessagesError),
    /// A replay's ordered consumer failed in a way it could not recover from.
    #[error("JetStream replay: {0}")]
    Replay(#[source] jetstream::consumer::pull::OrderedError),
    /// A flush (round trip to the server) failed.
    #[error("flush: {0}")]
    Flush(#[source] async_nats::client::FlushError),
    /// An acknowledgement could not be sent or confirmed.
    #[error("ack of stream sequence {sequence}: {source}")]
    Ack {
        /// The message's stream sequence.
        sequence: u64,
        /// async-nats's error.
        source: async_nats::Error,
    },
    /// An operation ran out of time (the server is down or overloaded).
    #[error("{op} timed out after {after:?}")]
    Timeout {
        /// What was being done.
        op: &'static str,
        /// The bound it hit.
        after: Duration,
    },
    /// The subscription ended (the client was closed).
    #[error("subscription closed")]
    Closed,
}

impl NatsError {
    /// A stable label for counters and metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            #[cfg(feature = "testing")]
            NatsError::ServerNotFound { .. } => "server_not_found",
            #[cfg(feature = "testing")]
            NatsError::ServerSetup { .. } => "server_setup",
            #[cfg(feature = "testing")]
            NatsError::ServerProcess { .. } => "server_process",
            #[cfg(feature = "testing")]
            NatsError::ServerExited { .. } => "server_exited",
            #[cfg(feature = "testing")]
            NatsError::ServerNotReady { .. } => "server_not_ready",
            NatsError::Auth { .. } => "auth",
            NatsError::Connect { .. } => "connect",
            NatsError::Stream { .. } => "stream",
            NatsError::SubjectNotInStream { .. } => "subject_not_in_stream",
            NatsError::ConsumerInfo { .. } => "consumer_info",
            NatsError::Consumer { .. } => "consumer",
            NatsError::ConsumerStream { .. } => "consumer_stream",
            NatsError::Publish { .. } => "publish",
            NatsError::JetStreamPublish { .. } => "jetstream_publish",
            NatsError::Subscribe { .. } => "subscribe",
            NatsError::Messages(_) => "messages",
            NatsError::Replay(_) => "replay",
            NatsError::Flush(_) => "flush",
            NatsError::Ack { .. } => "ack",
            NatsError::Timeout { .. } => "timeout",
            NatsError::Closed => "closed",
        }
    }
}

/// A connected client and the counters its event callback feeds.
async fn connect(
    config: &ConnectConfig,
) -> Result<(async_nats::Client, Arc<ConnectionCounters>), NatsError> {
    let counters = Arc::new(ConnectionCounters::default());
    let events = Arc::clone(&counters);
    let delay_max = config.reconnect_delay_max;
    // Each client its own jitter stream, so that routers and relays cut off by one server
    // restart do not come back in step (the randomness is the OS's, through std's
    // per-process hash keys; nothing observable in a simulation depends on it).
    let jitter_seed = {
        use std::hash::{BuildHasher, Hasher};
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_usize(Arc::as_ptr(&counters) as usize);
        hasher.finish()
    };
    let mut options = async_nats::ConnectOptions::new()
        .connection_timeout(config.connect_timeout)
        .request_timeout(Some(config.request_timeout))
        .client_capacity(config.client_capacity)
        .subscription_capacity(config.subscription_capacity)
        // async-nats's own schedule backs off to 4 s; a router wants its events back
        // sooner after a server restart.
        .reconnect_delay_callback(move |attempts| reconnect_delay(attempts, delay_max, jitter_seed))
        .event_callback(move |event| {
            let counter = match event {
                async_nats::Event::Connected => Some(&events.connected),
                async_nats::Event::Disconnected => Some(&events.disconnected),
                async_nats::Event::SlowConsumer(_) => Some(&events.slow_consumer),
                async_nats::Event::ServerError(_) => Some(&events.server_errors),
                _ => None,
            };
            if let Some(counter) = counter {
                counter.fetch_add(1, Ordering::Relaxed);
            }
            async {}
        });
    if let Some(name) = &config.name {
        options = options.name(name);
    }
    let options = config.auth.apply(options).await?;
    let client = options
        .connect(config.url.as_str())
        .await
        .map_err(|source| NatsError::Connect {
            url: config.url.clone(),
            source,
        })?;
    Ok((client, counters))
}

/// Reconnect attempt `attempts` waits 0, then about 2, 4, 8 ... ms, capped at `max`, with
/// "equal jitter": half the step, plus a share of the other half drawn from `seed` and
/// the attempt, so clients that lost one server spread their returns.
fn reconnect_delay(attempts: usize, max: Duration, seed: u64) -> Duration {
    let exponent = u32::try_from(attempts.saturating_sub(1))
        .unwrap_or(u32::MAX)
        .min(30);
    if attempts <= 1 {
        return Duration::ZERO;
    }
    let step = Duration::from_millis(1u64 << exponent).min(max);
    let half = step / 2;
    // SplitMix64 of the seed and the attempt: a fraction in [0, 1).
    let mut z = (seed ^ attempts as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    let fraction = ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64;
    half + (step - half).mul_f64(fraction)
}

/// A JetStream context whose requests and acks are bounded by `timeout`.
pub(crate) fn jetstream_context(
    client: async_nats::Client,
    timeout: Duration,
) -> jetstream::Context {
    jetstream::ContextBuilder::new()
        .timeout(timeout)
        .build(client)
}

/// The stream `name` storing `subject`: created (file storage, oldest discarded past
/// `max_bytes`) when missing, otherwise used as it is, provided it stores `subject`.
pub(crate) async fn ensure_stream(
    context: &jetstream::Context,
    name: &str,
    subject: &str,
    max_bytes: Option<u64>,
) -> Result<jetstream::stream::Stream, NatsError> {
    let config = jetstream::stream::Config {
        name: name.to_string(),
        subjects: vec![subject.to_string()],
        storage: jetstream::stream::StorageType::File,
        discard: jetstream::stream::DiscardPolicy::Old,
        max_bytes: max_bytes.map_or(-1, |bytes| i64::try_from(bytes).unwrap_or(i64::MAX)),
        ..Default::default()
    };
    let stream = context
        .get_or_create_stream(config)
        .await
        .map_err(|source| NatsError::Stream {
            stream: name.to_string(),
            source,
        })?;
    let subjects = &stream.cached_info().config.subjects;
    if !subjects
        .iter()
        .any(|pattern| subject_matches(pattern, subject))
    {
        return Err(NatsError::SubjectNotInStream {
            stream: name.to_string(),
            subject: subject.to_string(),
            subjects: subjects.clone(),
        });
    }
    Ok(stream)
}

/// Whether NATS subject `pattern` (tokens split on `.`, `*` one token, `>` one or more
/// trailing tokens) matches the literal `subject`.
fn subject_matches(pattern: &str, subject: &str) -> bool {
    let mut subject_tokens = subject.split('.');
    for token in pattern.split('.') {
        match (token, subject_tokens.next()) {
            (">", Some(_)) => return true,
            (_, None) => return false,
            ("*", Some(_)) => {}
            (literal, Some(actual)) if literal == actual => {}
            _ => return false,
        }
    }
    subject_tokens.next().is_none()
}

#[cfg(test)]
mod tests;
