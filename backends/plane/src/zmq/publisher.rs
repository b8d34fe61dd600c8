//! The publishing side of an engine's KV event stream: what vLLM's `ZmqEventPublisher`
//! does, so a kvtwin worker (real backend or simulator) can feed any consumer of vLLM
//! events, kvtwin's own subscriber included.
//!
//! Owns: [`ZmqPublisher`] (a bound PUB socket sending `[topic, seq, payload]`, sequence
//! numbers from 0, and a ring of the last `buffer_batches` batches), the replay thread (a
//! bound ROUTER answering `[b"", start_seq]` with every buffered batch from `start_seq`
//! and an end marker) and [`PublisherStats`].
//! Never: encode events (callers hand it msgpack from `crate::wire`), or block a publish
//! on a slow subscriber (PUB drops at the high-water mark, as the engine's does; the
//! replay buffer is how a subscriber recovers).

use super::{bind_with_retry, socket_error, ZmqError};
use crate::wire::frames::{parse_sequence, ReplayLayout, END_OF_REPLAY};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

/// How to publish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublisherConfig {
    /// Where the PUB socket binds (`tcp://127.0.0.1:*` picks a free port).
    pub endpoint: String,
    /// Where the replay ROUTER binds, if replay is offered.
    pub replay_endpoint: Option<String>,
    /// The topic frame of every message.
    pub topic: String,
    /// Batches kept for replay (vLLM's `buffer_steps`, 10,000 by default).
    pub buffer_batches: usize,
    /// The replay reply's frames.
    pub replay_layout: ReplayLayout,
}

impl PublisherConfig {
    /// A publisher on `endpoint` with replay on `replay_endpoint`, vLLM's defaults.
    pub fn new(endpoint: &str, replay_endpoint: Option<&str>) -> Self {
        Self {
            endpoint: endpoint.to_string(),
            replay_endpoint: replay_endpoint.map(str::to_string),
            topic: String::new(),
            buffer_batches: 10_000,
            replay_layout: ReplayLayout::default(),
        }
    }
}

/// Whether a batch goes out on the live stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// Sent live and buffered for replay.
    Live,
    /// Buffered for replay only: the batch is lost on the wire as far as live
    /// subscribers can tell (fault injection: tests and benches of gap recovery).
    BufferOnly,
}

/// What a publisher did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PublisherStats {
    /// Batches published (live or buffer-only).
    pub batches: u64,
    /// Batches held back from the live stream on purpose.
    pub withheld: u64,
    /// Replay requests answered.
    pub replay_requests: u64,
    /// Batches sent in replay replies.
    pub replayed_batches: u64,
    /// Replay requests that were not `[b"", 8-byte seq]`, ignored.
    pub bad_replay_requests: u64,
}

type Ring = Mutex<VecDeque<(u64, Arc<[u8]>)>>;

#[derive(Default)]
struct ReplayCounters {
    requests: AtomicU64,
    batches: AtomicU64,
    bad: AtomicU64,
}

/// An engine-style KV event publisher; see the module documentation.
pub struct ZmqPublisher {
    socket: zmq::Socket,
    endpoint: String,
    replay_endpoint: Option<String>,
    topic: Vec<u8>,
    next_seq: u64,
    capacity: usize,
    ring: Arc<Ring>,
    counters: Arc<ReplayCounters>,
    withheld: u64,
    stop: Arc<AtomicBool>,
    replay_thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for ZmqPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZmqPublisher")
            .field("endpoint", &self.endpoint)
            .field("replay_endpoint", &self.replay_endpoint)
            .field("next_seq", &self.next_seq)
            .finish_non_exhaustive()
    }
}

impl ZmqPublisher {
    /// Binds the PUB socket and, when configured, the replay ROUTER (served by a thread
    /// of its own until the publisher drops).
    pub fn bind(config: &PublisherConfig) -> Result<Self, ZmqError> {
        let context = zmq::Context::new();
        let socket = context
            .socket(zmq::PUB)
            .map_err(socket_error("socket", &config.endpoint))?;
        // Pending messages get a moment to leave when the publisher drops, not forever.
        socket
            .set_linger(200)
            .map_err(socket_error("set_linger", &config.endpoint))?;
        let endpoint = bind_with_retry(&socket, &config.endpoint)?;
        let ring: Arc<Ring> = Arc::new(Mutex::new(VecDeque::new()));
        let counters = Arc::new(ReplayCounters::default());
        let stop = Arc::new(AtomicBool::new(false));
        let mut replay_endpoint = None;
        let mut replay_thread = None;
        if let Some(wanted) = &config.replay_endpoint {
            let router = context
                .socket(zmq::ROUTER)
                .map_err(socket_error("socket", wanted))?;
            router
                .set_linger(0)
                .map_err(socket_error("set_linger", wanted))?;
            // A ROUTER drops what exceeds its high-water mark: a replay of the whole
            // buffer (10,000 batches by default) must not be cut at 1,000.
            router
                .set_sndhwm(0)
                .map_err(socket_error("set_sndhwm", wanted))?;
            replay_endpoint = Some(bind_with_retry(&router, wanted)?);
            let server = ReplayServer {
                router,
                ring: ring.clone(),
                counters: counters.clone(),
                stop: stop.clone(),
                topic: config.topic.as_bytes().to_vec(),
                layout: config.replay_layout,
            };
            replay_thread = Some(
                std::thread::Builder::new()
                    .name("kvtwin-zmq-replay".into())
                    .spawn(move || server.run())
                    .map_err(ZmqError::Spawn)?,
            );
        }
        Ok(Self {
            socket,
            endpoint,
            replay_endpoint,
            topic: config.topic.as_bytes().to_vec(),
            next_seq: 0,
            capacity: config.buffer_batches.max(1),
            ring,
            counters,
            withheld: 0,
            stop,
            replay_thread,
        })
    }

    /// The PUB socket's endpoint as bound (with the port a `*` resolved to).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The replay ROUTER's endpoint as bound, if any.
    pub fn replay_endpoint(&self) -> Option<&str> {
        self.replay_endpoint.as_deref()
    }

    /// The sequence number the next batch gets.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Publishes one msgpack batch live; its sequence number.
    pub fn publish(&mut self, payload: &[u8]) -> Result<u64, ZmqError> {
        self.publish_with(payload, Delivery::Live)
    }

    /// Publishes one batch, live or buffer-only; its sequence number.
    pub fn publish_with(&mut self, payload: &[u8], delivery: Delivery) -> Result<u64, ZmqError> {
        let seq = self.next_seq;
        self.next_seq += 1;
        {
            let mut ring = self.ring.lock().unwrap_or_else(PoisonError::into_inner);
            if ring.len() == self.capacity {
                ring.pop_front();
            }
            ring.push_back((seq, Arc::from(payload)));
        }
        match delivery {
            Delivery::Live => {
                let seq_frame = seq.to_be_bytes();
                let frames: [&[u8]; 3] = [&self.topic, &seq_frame, payload];
                self.socket
                    .send_multipart(frames, 0)
                    .map_err(socket_error("send", &self.endpoint))?;
            }
            Delivery::BufferOnly => self.withheld += 1,
        }
        Ok(seq)
    }

    /// What it has done so far.
    pub fn stats(&self) -> PublisherStats {
        PublisherStats {
            batches: self.next_seq,
            withheld: self.withheld,
            replay_requests: self.counters.requests.load(Ordering::Relaxed),
            replayed_batches: self.counters.batches.load(Ordering::Relaxed),
            bad_replay_requests: self.counters.bad.load(Ordering::Relaxed),
        }
    }
}

impl Drop for ZmqPublisher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.replay_thread.take() {
            let _ = thread.join();
        }
    }
}

/// The replay ROUTER and what it serves from.
struct ReplayServer {
    router: zmq::Socket,
    ring: Arc<Ring>,
    counters: Arc<ReplayCounters>,
    stop: Arc<AtomicBool>,
    topic: Vec<u8>,
    layout: ReplayLayout,
}

impl ReplayServer {
    /// How often the thread looks at the stop flag while idle.
    const POLL: Duration = Duration::from_millis(50);

    fn run(self) {
        while !self.stop.load(Ordering::Relaxed) {
            match self.router.poll(zmq::POLLIN, Self::POLL.as_millis() as i64) {
                Ok(n) if n > 0 => {}
                Ok(_) => continue,
                // A poll error on our own socket: the context is going away.
                Err(_) => return,
            }
            let Ok(frames) = self.router.recv_multipart(zmq::DONTWAIT) else {
                continue;
            };
            // `[identity, b"", start_seq]` (the DEALER's delimiter and request).
            let start = match frames.as_slice() {
                [_, delimiter, start] if delimiter.is_empty() => parse_sequence(start).ok(),
                _ => None,
            };
            let (Some(identity), Some(start)) = (frames.first(), start) else {
                self.counters.bad.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            self.counters.requests.fetch_add(1, Ordering::Relaxed);
            // Copy out what to send, so publishing never waits on a slow replay.
            let batches: Vec<(u64, Arc<[u8]>)> = self
                .ring
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .iter()
                .filter(|(seq, _)| *seq >= start)
                .cloned()
                .collect();
            for (seq, payload) in &batches {
                if self.reply(identity, *seq, payload).is_err() {
                    break;
                }
                self.counters.batches.fetch_add(1, Ordering::Relaxed);
            }
            let _ = self.reply(identity, END_OF_REPLAY, &[]);
        }
    }

    fn reply(&self, identity: &[u8], seq: u64, payload: &[u8]) -> Result<(), zmq::Error> {
        let seq = seq.to_be_bytes();
        match self.layout {
            ReplayLayout::WithTopic => {
                let frames: [&[u8]; 5] = [identity, b"", &self.topic, &seq, payload];
                self.router.send_multipart(frames, 0)
            }
            ReplayLayout::Legacy => {
                let frames: [&[u8]; 4] = [identity, b"", &seq, payload];
                self.router.send_multipart(frames, 0)
            }
        }
    }
}
