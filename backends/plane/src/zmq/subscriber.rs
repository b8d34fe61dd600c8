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
//! reverse) is passed on once (told from a restarted engine's batch by its payload hash).
//! When the live stream is quiet for `idle_probe`, the subscriber asks the replay socket
//! for what follows the last batch it saw: batches published before it joined, or lost
//! at the end of a burst, arrive without waiting for a later one to reveal the gap, and an
//! engine that restarted meanwhile (it no longer has that batch) is reported.
//! Queues, each bounded (drop policy in brackets): libzmq's receive queue on the SUB
//! socket, `receive_hwm_batches` messages of at most `max_message_bytes` each [libzmq
//! drops the newest; they show up as sequence gaps, filled by replay or reported
//! `Lost`]; the replay DEALER's queue and one replay's batches, `replay_batches_max`
//! [later batches of that replay are dropped, counted in `replay_dropped`, and reported
//! `Lost` when they were needed]; `ready`, which holds at most one replay's batches plus
//! one live item.
//! Connections: both sockets reconnect inside libzmq with a backoff ([`RECONNECT_IVL`]
//! doubling to [`RECONNECT_IVL_MAX`], plus libzmq's jitter); the live socket's monitor
//! (an inproc PAIR) is drained on every `next`, and its connects, disconnects and connect
//! retries are counted in [`SubscriberStats`].
//! Never: decode payloads, or wait longer than the caller's timeout on the live stream
//! (a replay waits at most `replay_timeout`).

use super::{decode_live, decode_replay, socket_error, ZmqError};
use crate::wire::frames::{FrameError, RawBatch, END_OF_REPLAY};
use std::collections::{BTreeMap, VecDeque};
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
    /// After this long without a live batch, ask the replay socket for anything newer
    /// than the last batch seen (from 0 before the first): batches published before the
    /// subscription reached the engine, or lost at the end of a burst, are otherwise only
    /// noticed when a later one arrives. `None`: never.
    pub idle_probe: Option<Duration>,
    /// Messages larger than this disconnect the publisher (libzmq's `ZMQ_MAXMSGSIZE`);
    /// `None`: no limit.
    pub max_message_bytes: Option<u64>,
    /// Batches libzmq queues for this subscriber (`ZMQ_RCVHWM`; past it the newest are
    /// dropped and show up as gaps).
    pub receive_hwm_batches: i32,
    /// Batches one replay may bring (past them, dropped and counted).
    pub replay_batches_max: usize,
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
            idle_probe: Some(Duration::from_millis(500)),
            max_message_bytes: Some(64 << 20),
            receive_hwm_batches: 100_000,
            replay_batches_max: 65_536,
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
    /// Replayed batches dropped past `replay_batches_max`.
    pub replay_dropped: u64,
    /// Connections of the live socket made (libzmq's monitor; the first included).
    pub connects: u64,
    /// Connections of the live socket lost.
    pub disconnects: u64,
    /// Connect attempts of the live socket that failed and were retried.
    pub connect_retries: u64,
}

/// libzmq's first reconnect interval: the default, stated so the backoff below has a base.
pub const RECONNECT_IVL: Duration = Duration::from_millis(100);

/// libzmq's longest reconnect interval. With it set, libzmq doubles the interval after
/// each failed attempt up to this (unset, the default, it retries every
/// `RECONNECT_IVL` forever), and adds a random part of up to one `RECONNECT_IVL` to
/// each wait, so engines restarted together are not all reconnected to at once.
pub const RECONNECT_IVL_MAX: Duration = Duration::from_secs(5);

/// Where a subscriber's monitor publishes its live socket's connection events (an
/// inproc endpoint of the subscriber's own context, so one name serves every subscriber).
const MONITOR_ENDPOINT: &str = "inproc://kvtwin-subscriber-monitor";

/// An engine KV event subscriber; see the module documentation.
pub struct ZmqSubscriber {
    context: zmq::Context,
    socket: zmq::Socket,
    /// The PAIR end of the live socket's monitor (`None` if libzmq refused one).
    monitor: Option<zmq::Socket>,
    /// The initial catch-up is done (see [`ZmqSubscriber::caught_up`]).
    caught_up: bool,
    config: SubscriberConfig,
    replay: Option<zmq::Socket>,
    /// The sequence number the next live batch should have; `None` before the first.
    expected: Option<u64>,
    ready: VecDeque<SubscriberItem>,
    stats: SubscriberStats,
    /// When a live batch last arrived (or the subscriber started, or last probed).
    last_heard: Instant,
    /// The sequence number and payload hash of the last batch handed out.
    last_batch: Option<(u64, u64)>,
    /// The batches the last replay supplied, by sequence number, with a hash of their
    /// payload: a live batch that repeats one (it was in flight while the replay was
    /// answered) is a duplicate, one that differs is a restarted engine's.
    replayed: BTreeMap<u64, u64>,
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
        // Batches queue here while the consumer works, up to the configured bound.
        socket
            .set_rcvhwm(config.receive_hwm_batches)
            .map_err(socket_error("set_rcvhwm", endpoint))?;
        socket
            .set_subscribe(config.topic.as_bytes())
            .map_err(socket_error("subscribe", endpoint))?;
        set_reconnect_backoff(&socket, endpoint)?;
        let monitor = open_monitor(&context, &socket);
        if endpoint.contains('*') {
            super::bind_with_retry(&socket, endpoint)?;
        } else {
            socket
                .connect(endpoint)
                .map_err(socket_error("connect", endpoint))?;
        }
        // Nothing to catch up from without a replay socket, or when told not to.
        let caught_up =
            config.replay_endpoint.is_none() || config.catch_up == CatchUp::FromFirstReceived;
        let mut subscriber = Self {
            context,
            socket,
            monitor,
            caught_up,
            config,
            replay: None,
            expected: None,
            ready: VecDeque::new(),
            stats: SubscriberStats::default(),
            last_heard: Instant::now(),
            last_batch: None,
            replayed: BTreeMap::new(),
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
            .set_rcvhwm(i32::try_from(self.config.replay_batches_max).unwrap_or(i32::MAX))
            .map_err(socket_error("set_rcvhwm", endpoint))?;
        set_reconnect_backoff(&dealer, endpoint)?;
        dealer
            .connect(endpoint)
            .map_err(socket_error("connect", endpoint))?;
        Ok(Some(dealer))
    }

    /// Whether the initial catch-up is done: at once without a replay socket (or with
    /// `CatchUp::FromFirstReceived`); otherwise once the first replay from the start has
    /// been tried, whatever it gave (an engine that is not up yet must not keep its
    /// router unready; what it missed is recovered when it appears), or the first live
    /// batch has been taken (which replays what came before it).
    pub fn caught_up(&self) -> bool {
        self.caught_up
    }

    /// Counts the live socket's connection events the monitor has queued.
    fn drain_monitor(&mut self) {
        let Some(monitor) = &self.monitor else {
            return;
        };
        // Bounded by the monitor's own queue (libzmq's default high-water mark).
        while let Ok(frames) = monitor.recv_multipart(zmq::DONTWAIT) {
            let Some(event) = frames.first().and_then(|frame| frame.get(..2)) else {
                continue;
            };
            let event = u16::from_le_bytes([event[0], event[1]]);
            if event == zmq::SocketEvent::CONNECTED.to_raw() {
                self.stats.connects += 1;
            } else if event == zmq::SocketEvent::DISCONNECTED.to_raw() {
                self.stats.disconnects += 1;
            } else if event == zmq::SocketEvent::CONNECT_RETRIED.to_raw() {
                self.stats.connect_retries += 1;
            }
        }
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
        self.drain_monitor();
        if let Some(item) = self.ready.pop_front() {
            return Ok(Some(item));
        }
        let millis = i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX);
        let readable = self
            .socket
            .poll(zmq::POLLIN, millis)
            .map_err(socket_error("poll", &self.config.endpoint))?;
        if readable == 0 {
            self.probe_if_idle();
            return Ok(self.ready.pop_front());
        }
        let frames = match self.socket.recv_multipart(zmq::DONTWAIT) {
            Ok(frames) => frames,
            Err(zmq::Error::EAGAIN) => return Ok(None),
            Err(source) => return Err(socket_error("recv", &self.config.endpoint)(source)),
        };
        match decode_live(frames) {
            Ok(batch) => {
                self.stats.live += 1;
                self.last_heard = Instant::now();
                self.accept(batch);
                self.caught_up = true;
            }
            Err(error) => {
                self.stats.malformed += 1;
                self.ready.push_back(SubscriberItem::Malformed(error));
            }
        }
        Ok(self.ready.pop_front())
    }

    /// Asks the replay socket for anything after the last batch seen, when the live
    /// stream has been quiet for `idle_probe`.
    fn probe_if_idle(&mut self) {
        let Some(idle) = self.config.idle_probe else {
            return;
        };
        if self.replay.is_none() || self.last_heard.elapsed() < idle {
            return;
        }
        self.last_heard = Instant::now();
        let Some((seq, hash)) = self.last_batch else {
            if self.config.catch_up == CatchUp::FromStart {
                if let Some(last) = self.fill(0, None) {
                    self.expected = Some(last + 1);
                }
            }
            self.caught_up = true;
            return;
        };
        // Ask from the last batch seen: an engine that still has it, with the same
        // payload, is the same run; one that has not (or has another batch under that
        // number) restarted while the live stream was quiet to us.
        self.stats.replay_requests += 1;
        let Ok(mut batches) = self.replay_range(seq, u64::MAX) else {
            self.stats.replay_failures += 1;
            return;
        };
        let same_run = batches
            .first()
            .is_some_and(|first| first.seq == seq && payload_hash(&first.payload) == hash);
        let last = if same_run {
            batches.remove(0);
            self.queue_replayed(seq + 1, None, batches)
        } else {
            self.stats.restarts += 1;
            self.ready.push_back(SubscriberItem::Restarted { seq: 0 });
            self.last_batch = None;
            // The new run numbers from 0. Left at the old run's next number, its first
            // live batch (an idle engine's, published after this probe) would go back
            // again and count the same restart twice.
            self.expected = Some(0);
            self.fill(0, None)
        };
        if let Some(last) = last {
            self.expected = Some(last + 1);
        }
    }

    /// Applies the sequence rules to a live batch.
    fn accept(&mut self, batch: RawBatch) {
        let seq = batch.seq;
        if self.expected.is_some_and(|expected| seq < expected)
            && self.replayed.get(&seq) == Some(&payload_hash(&batch.payload))
        {
            // Replay already handed this one out.
            self.stats.duplicates += 1;
            return;
        }
        match self.expected {
            Some(expected) if seq == expected => {}
            Some(expected) if seq > expected => {
                self.stats.gaps += 1;
                self.fill(expected, Some(seq));
            }
            Some(_) => {
                self.stats.restarts += 1;
                self.ready.push_back(SubscriberItem::Restarted { seq });
                if seq > 0 {
                    self.fill(0, Some(seq));
                }
            }
            None => {
                if seq > 0 && self.config.catch_up == CatchUp::FromStart {
                    self.fill(0, Some(seq));
                }
            }
        }
        self.expected = Some(seq + 1);
        self.last_batch = Some((seq, payload_hash(&batch.payload)));
        self.ready.push_back(SubscriberItem::Batch(batch));
    }

    /// Fetches batches `from..until` from the replay socket and queues them in order;
    /// what it cannot get is queued as lost. With no `until` (a probe), everything from
    /// `from` that the engine has, and nothing missing at the end is a loss (it may not
    /// have been published yet). Returns the last sequence number queued.
    fn fill(&mut self, from: u64, until: Option<u64>) -> Option<u64> {
        if self.replay.is_none() {
            return self.queue_replayed(from, until, Vec::new());
        }
        self.stats.replay_requests += 1;
        let batches = match self.replay_range(from, until.unwrap_or(u64::MAX)) {
            Ok(batches) => batches,
            Err(()) => {
                self.stats.replay_failures += 1;
                Vec::new()
            }
        };
        self.queue_replayed(from, until, batches)
    }

    /// Queues replayed `batches` (sorted) as the ones from `from` on; see [`Self::fill`].
    fn queue_replayed(
        &mut self,
        from: u64,
        until: Option<u64>,
        batches: Vec<RawBatch>,
    ) -> Option<u64> {
        let mut next = from;
        let mut last = None;
        self.replayed.clear();
        for batch in batches {
            let hash = payload_hash(&batch.payload);
            self.replayed.insert(batch.seq, hash);
            if batch.seq < next {
                self.stats.duplicates += 1;
                continue;
            }
            if batch.seq > next {
                self.lose(next, batch.seq - 1);
            }
            next = batch.seq + 1;
            last = Some(batch.seq);
            self.last_batch = Some((batch.seq, hash));
            self.stats.replayed += 1;
            self.ready.push_back(SubscriberItem::Batch(batch));
        }
        if let Some(until) = until.filter(|until| next < *until) {
            self.lose(next, until - 1);
        }
        last
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
                Ok(batch) if (from..until).contains(&batch.seq) => {
                    if batches.len() < self.config.replay_batches_max {
                        batches.push(batch);
                    } else {
                        self.stats.replay_dropped += 1;
                    }
                }
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

/// A hash of a payload, to tell a replayed batch seen again from a new one.
fn payload_hash(payload: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(payload)
}

/// Gives `socket` libzmq's reconnect backoff ([`RECONNECT_IVL`] doubling up to
/// [`RECONNECT_IVL_MAX`], with libzmq's jitter).
fn set_reconnect_backoff(socket: &zmq::Socket, endpoint: &str) -> Result<(), ZmqError> {
    let millis = |d: Duration| i32::try_from(d.as_millis()).unwrap_or(i32::MAX);
    socket
        .set_reconnect_ivl(millis(RECONNECT_IVL))
        .map_err(socket_error("set_reconnect_ivl", endpoint))?;
    socket
        .set_reconnect_ivl_max(millis(RECONNECT_IVL_MAX))
        .map_err(socket_error("set_reconnect_ivl_max", endpoint))
}

/// A monitor of `socket`'s connects, disconnects and connect retries, read through a
/// PAIR socket; `None` if libzmq refuses (the counts then stay 0, nothing else changes).
fn open_monitor(context: &zmq::Context, socket: &zmq::Socket) -> Option<zmq::Socket> {
    let events = zmq::SocketEvent::CONNECTED.to_raw()
        | zmq::SocketEvent::DISCONNECTED.to_raw()
        | zmq::SocketEvent::CONNECT_RETRIED.to_raw();
    socket.monitor(MONITOR_ENDPOINT, i32::from(events)).ok()?;
    let pair = context.socket(zmq::PAIR).ok()?;
    pair.set_linger(0).ok()?;
    pair.connect(MONITOR_ENDPOINT).ok()?;
    Some(pair)
}
