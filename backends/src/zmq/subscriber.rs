//! The consuming side of an engine's KV event stream: live batches in sequence order,
//! gaps filled from the engine's replay socket, restarts detected.
//!
//! Owns: [`ZmqSubscriber`] (a SUB socket, an optional DEALER for replay, the next
//! sequence number it expects, and the items it has decided but not yet handed out),
//! [`SubscriberItem`], [`CatchUp`] and [`SubscriberStats`].
//!
//! The sequence rules (WIRE.md): a batch with the expected number is passed on; a jump
//! ahead is a gap, filled by asking the replay socket for everything from the first
//! missing number (what replay cannot supply is reported as [`SubscriberItem::Lost`]);
//! a number going back is the engine restarting ([`SubscriberItem::Restarted`]: the
//! consumer clears that worker), after which the new run's first batches are fetched the
//! same way if they were missed. A replayed batch the live stream also delivers (or the
//! reverse) is passed on once.
//! Never: decode payloads, or wait longer than the caller's timeout on the live stream
//! (a replay waits at most `replay_timeout`).

use super::END_OF_REPLAY;
use super::{decode_live, decode_replay, socket_error, FrameError, RawBatch, ZmqError};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// What to do about batches published before the subscriber's first one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CatchUp {
    /// Fetch them from the replay socket (from sequence 0): a router must see every block
    /// the engine still holds.
    #[default]
    FromStart,
    /// Start at the first batch received.
    FromFirstReceived,
}

/// How to subscribe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SubscriberConfig {
    /// The engine's live stream. With a `*` in it (`tcp://*:5557`) the subscriber binds
    /// and the engine connects; otherwise it connects (WIRE.md).
    pub endpoint: String,
    /// The engine's replay ROUTER, if it has one (always connected to).
    pub replay_endpoint: Option<String>,
    /// Topic prefix to subscribe to (`""`: all).
    pub topic: String,
    /// What to do about batches published before the first one received.
    pub catch_up: CatchUp,
    /// How long one replay may take in all.
    pub replay_timeout: Duration,
    /// Messages larger than this disconnect the publisher (libzmq's `ZMQ_MAXMSGSIZE`);
    /// `None`: no limit.
    pub max_message_bytes: Option<u64>,
}

impl SubscriberConfig {
    /// A subscriber to `endpoint` with replay from `replay_endpoint`, all topics.
    pub fn new(endpoint: &str, replay_endpoint: Option<&str>) -> Self {
        Self {
            endpoint: endpoint.to_string(),
            replay_endpoint: replay_endpoint.map(str::to_string),
            topic: String::new(),
            catch_up: CatchUp::default(),
            replay_timeout: Duration::from_secs(2),
            max_message_bytes: Some(64 << 20),
        }
    }
}

/// What the subscriber hands out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SubscriberItem {
    /// The next batch, in sequence order.
    Batch(RawBatch),
    /// The publisher restarted (its sequence went back): forget what it published before.
    Restarted {
        /// The first sequence number seen from the new run.
        seq: u64,
    },
    /// Batches `first..=last` were missed and replay could not supply them.
    Lost {
        /// First lost sequence number.
        first: u64,
        /// Last lost sequence number.
        last: u64,
    },
    /// A message whose frames are not a batch (skipped; the stream goes on).
    Malformed(FrameError),
}

/// What a subscriber has seen.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SubscriberStats {
    /// Batches received live.
    pub live: u64,
    /// Batches received through replay and passed on.
    pub replayed: u64,
    /// Gaps in the live sequence.
    pub gaps: u64,
    /// Replay requests sent.
    pub replay_requests: u64,
    /// Replays that timed out or failed.
    pub replay_failures: u64,
    /// Batches neither the live stream nor replay supplied.
    pub lost: u64,
    /// Publisher restarts.
    pub restarts: u64,
    /// Batches seen twice (live and replayed), passed on once.
    pub duplicates: u64,
    /// Messages with bad frames.
    pub malformed: u64,
}

/// An engine KV event subscriber; see the module documentation.
pub struct ZmqSubscriber {
    context: zmq::Context,
    socket: zmq::Socket,
    config: SubscriberConfig,
    replay: Option<zmq::Socket>,
    /// The sequence number the next live batch should have; `None` before the first.
    expected: Option<u64>,
    ready: VecDeque<SubscriberItem>,
    stats: SubscriberStats,
}

impl std::fmt::Debug for ZmqSubscriber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZmqSubscriber")
            .field("config", &self.config)
            .field("expected", &self.expected)
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl ZmqSubscriber {
    /// Opens the SUB socket (and the replay DEALER). Connecting never fails for a
    /// publisher that is not there yet: libzmq connects when it appears.
    pub fn new(config: SubscriberConfig) -> Result<Self, ZmqError> {
        let context = zmq::Context::new();
        let endpoint = &config.endpoint;
        let socket = context
            .socket(zmq::SUB)
            .map_err(socket_error("socket", endpoint))?;
        socket
            .set_linger(0)
            .map_err(socket_error("set_linger", endpoint))?;
        if let Some(limit) = config.max_message_bytes {
            socket
                .set_maxmsgsize(i64::try_from(limit).unwrap_or(i64::MAX))
                .map_err(socket_error("set_maxmsgsize", endpoint))?;
        }
        // Batches queue here while the consumer works: a deep queue, not drops.
        socket
            .set_rcvhwm(100_000)
            .map_err(socket_error("set_rcvhwm", endpoint))?;
        socket
            .set_subscribe(config.topic.as_bytes())
            .map_err(socket_error("subscribe", endpoint))?;
        if endpoint.contains('*') {
            super::bind_with_retry(&socket, endpoint)?;
        } else {
            socket
                .connect(endpoint)
                .map_err(socket_error("connect", endpoint))?;
        }
        let mut subscriber = Self {
            context,
            socket,
            config,
            replay: None,
            expected: None,
            ready: VecDeque::new(),
            stats: SubscriberStats::default(),
        };
        subscriber.replay = subscriber.open_replay()?;
        Ok(subscriber)
    }

    fn open_replay(&self) -> Result<Option<zmq::Socket>, ZmqError> {
        let Some(endpoint) = &self.config.replay_endpoint else {
            return Ok(None);
        };
        let dealer = self
            .context
            .socket(zmq::DEALER)
            .map_err(socket_error("socket", endpoint))?;
        dealer
            .set_linger(0)
            .map_err(socket_error("set_linger", endpoint))?;
        dealer
            .set_rcvhwm(0)
            .map_err(socket_error("set_rcvhwm", endpoint))?;
        dealer
            .connect(endpoint)
            .map_err(socket_error("connect", endpoint))?;
        Ok(Some(dealer))
    }

    /// What it has seen so far.
    pub fn stats(&self) -> SubscriberStats {
        self.stats
    }

    /// The sequence number the next live batch should have (`None` before the first).
    pub fn expected_seq(&self) -> Option<u64> {
        self.expected
    }

    /// The next item, waiting up to `timeout` for the live stream; `None` if nothing
    /// came. A gap is filled (within `replay_timeout`) before this returns.
    pub fn next(&mut self, timeout: Duration) -> Result<Option<SubscriberItem>, ZmqError> {
        if let Some(item) = self.ready.pop_front() {
            return Ok(Some(item));
        }
        let millis = i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX);
        let readable = self
            .socket
            .poll(zmq::POLLIN, millis)
            .map_err(socket_error("poll", &self.config.endpoint))?;
        if readable == 0 {
            return Ok(None);
        }
        let frames = match self.socket.recv_multipart(zmq::DONTWAIT) {
            Ok(frames) => frames,
            Err(zmq::Error::EAGAIN) => return Ok(None),
            Err(source) => return Err(socket_error("recv", &self.config.endpoint)(source)),
        };
        match decode_live(frames) {
            Ok(batch) => {
                self.stats.live += 1;
                self.accept(batch);
            }
            Err(error) => {
                self.stats.malformed += 1;
                self.ready.push_back(SubscriberItem::Malformed(error));
            }
        }
        Ok(self.ready.pop_front())
    }

    /// Applies the sequence rules to a live batch.
    fn accept(&mut self, batch: RawBatch) {
        let seq = batch.seq;
        match self.expected {
            Some(expected) if seq == expected => {}
            Some(expected) if seq > expected => {
                self.stats.gaps += 1;
                self.fill(expected, seq);
            }
            Some(_) => {
                self.stats.restarts += 1;
                self.ready.push_back(SubscriberItem::Restarted { seq });
                if seq > 0 {
                    self.fill(0, seq);
                }
            }
            None => {
                if seq > 0 && self.config.catch_up == CatchUp::FromStart {
                    self.fill(0, seq);
                }
            }
        }
        self.expected = Some(seq + 1);
        self.ready.push_back(SubscriberItem::Batch(batch));
    }

    /// Fetches batches `from..until` from the replay socket and queues them in order;
    /// what it cannot get is queued as lost.
    fn fill(&mut self, from: u64, until: u64) {
        let mut next = from;
        match self.replay_range(from, until) {
            Ok(batches) => {
                for batch in batches {
                    if batch.seq < next {
                        self.stats.duplicates += 1;
                        continue;
                    }
                    if batch.seq > next {
                        self.lose(next, batch.seq - 1);
                    }
                    next = batch.seq + 1;
                    self.stats.replayed += 1;
                    self.ready.push_back(SubscriberItem::Batch(batch));
                }
            }
            Err(()) => self.stats.replay_failures += 1,
        }
        if next < until {
            self.lose(next, until - 1);
        }
    }

    fn lose(&mut self, first: u64, last: u64) {
        self.stats.lost += last - first + 1;
        self.ready.push_back(SubscriberItem::Lost { first, last });
    }

    /// The replayed batches with `from <= seq < until`, in order; `Err` when there is no
    /// replay socket or it did not finish in time (the socket is then replaced, so late
    /// replies of this request cannot be taken for the next one's).
    fn replay_range(&mut self, from: u64, until: u64) -> Result<Vec<RawBatch>, ()> {
        let Some(dealer) = self.replay.take() else {
            return Err(());
        };
        self.stats.replay_requests += 1;
        let request: [&[u8]; 2] = [b"", &from.to_be_bytes()];
        if dealer.send_multipart(request, 0).is_err() {
            self.replay = self.open_replay().ok().flatten();
            return Err(());
        }
        let deadline = Instant::now() + self.config.replay_timeout;
        let mut batches = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let millis = i64::try_from(left.as_millis()).unwrap_or(i64::MAX);
            let ready = matches!(dealer.poll(zmq::POLLIN, millis), Ok(n) if n > 0);
            if !ready {
                // Timed out: a fresh socket, so this request's late replies are dropped.
                self.replay = self.open_replay().ok().flatten();
                return Err(());
            }
            let Ok(frames) = dealer.recv_multipart(zmq::DONTWAIT) else {
                continue;
            };
            match decode_replay(frames) {
                Ok(batch) if batch.seq == END_OF_REPLAY => break,
                Ok(batch) if (from..until).contains(&batch.seq) => batches.push(batch),
                // Batches at or after `until` come on the live stream too.
                Ok(_) => {}
                Err(_) => self.stats.malformed += 1,
            }
        }
        self.replay = Some(dealer);
        batches.sort_by_key(|batch| batch.seq);
        Ok(batches)
    }
}
