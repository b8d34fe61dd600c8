//! The store's KV events: which blocks it holds, told to routers so they can credit the
//! shared tier (medium `EXTERNAL` in vLLM's format, tier `external` in Dynamo's).
//!
//! A value is a block when it is a `KVB2` frame (`kvtwin::block_frame`, what kvtwin's
//! connector writes): its block hash, parent and tokens come from the frame, checked
//! against its BLAKE3. [`StoreEvent::Stored`] when a block first enters the store (any
//! tier), [`StoreEvent::Removed`] when its last copy leaves (evicted past the lowest
//! tier, deleted, flushed, overwritten by something that is not that block, or found
//! corrupt). Moves between the store's own tiers are not removals. Any other value
//! (LMCache's, a `KVB1` frame, a frame without tokens) is stored as always and announces
//! nothing; it is counted (`non_block_values`). Two keys holding the same block (two
//! namespaces, one prompt) announce it once and remove it with the last.
//!
//! Owns: [`StoreEvents`] (one bounded queue per transport, filled by the store under its
//! lock with `try_send`, so publishing never waits on the request path; what a full queue
//! drops is counted per transport), [`EventCounters`], the grouping of consecutive
//! events into wire events ([`runs`]) and, in [`publish`], the transports' ends.
//! Never: block a store operation, decode another client's values beyond the tag check,
//! or hash anything but a frame's tokens.

pub mod publish;

use kvtwin::block_frame::FrameIdentity;
use kvtwin::ids::SequenceHash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;

/// Events a transport's queue holds by default before it drops the newest.
pub const DEFAULT_QUEUE_EVENTS: usize = 65_536;

/// Events published in one batch at most (one ZMQ message; NATS messages are one
/// `RouterEvent` each, grouped as the ZMQ batch is).
pub const MAX_BATCH_EVENTS: usize = 1024;

/// The worker id the store's events carry unless told otherwise: the bytes of
/// `kvtwinG4` read big-endian (7743504665528911668), far from the small ids engines are
/// given; the router indexes a store's ZMQ events under the same id.
pub const DEFAULT_WORKER_ID: u64 = kvtwin_plane::service::state::shared::DEFAULT_STORE_WORKER_ID;

/// One change of what the store holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreEvent {
    /// A block entered the store.
    Stored(FrameIdentity),
    /// A block's last copy left the store.
    Removed(SequenceHash),
}

/// What the events did, since the store started.
#[derive(Debug, Default)]
pub struct EventCounters {
    /// Blocks announced as stored.
    pub stored: AtomicU64,
    /// Blocks announced as removed.
    pub removed: AtomicU64,
    /// Values stored that are not block frames (announced nothing).
    pub non_block_values: AtomicU64,
}

/// One transport's counters.
#[derive(Debug, Default)]
pub struct TransportCounters {
    /// Events dropped because its queue was full.
    pub dropped: AtomicU64,
    /// Events it published.
    pub published: AtomicU64,
    /// Publishes that failed (their events are lost).
    pub errors: AtomicU64,
}

/// One transport: its name (`zmq`, `nats`), queue and counters.
#[derive(Debug)]
struct Transport {
    name: &'static str,
    queue: mpsc::Sender<Arc<StoreEvent>>,
    counters: Arc<TransportCounters>,
}

/// Where the store's events go; see the module documentation.
#[derive(Debug, Default)]
pub struct StoreEvents {
    transports: Vec<Transport>,
    /// What was announced and what was not.
    pub counters: EventCounters,
}

/// The receiving end of one transport's queue, for its publisher.
#[derive(Debug)]
pub struct EventReceiver {
    /// The queue.
    pub queue: mpsc::Receiver<Arc<StoreEvent>>,
    /// The transport's counters (published, errors; drops are the sender's).
    pub counters: Arc<TransportCounters>,
}

impl StoreEvents {
    /// No transport yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a transport named `name` whose queue holds `capacity` events; its
    /// publisher takes the receiver (see [`publish`]).
    pub fn add_transport(&mut self, name: &'static str, capacity: usize) -> EventReceiver {
        let (queue, receiver) = mpsc::channel(capacity.max(1));
        let counters = Arc::new(TransportCounters::default());
        self.transports.push(Transport {
            name,
            queue,
            counters: counters.clone(),
        });
        EventReceiver {
            queue: receiver,
            counters,
        }
    }

    /// Queues `event` on every transport, never waiting: a full queue drops it, counted.
    pub fn emit(&self, event: StoreEvent) {
        match &event {
            StoreEvent::Stored(_) => &self.counters.stored,
            StoreEvent::Removed(_) => &self.counters.removed,
        }
        .fetch_add(1, Ordering::Relaxed);
        let event = Arc::new(event);
        for transport in &self.transports {
            if transport.queue.try_send(event.clone()).is_err() {
                transport.counters.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Queues `event` on every transport, waiting for room: for a store announcing what
    /// it found at start, before it serves anyone.
    pub async fn emit_waiting(&self, event: StoreEvent) {
        match &event {
            StoreEvent::Stored(_) => &self.counters.stored,
            StoreEvent::Removed(_) => &self.counters.removed,
        }
        .fetch_add(1, Ordering::Relaxed);
        let event = Arc::new(event);
        for transport in &self.transports {
            if transport.queue.send(event.clone()).await.is_err() {
                transport.counters.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Each transport's name and counters, in the order they were added.
    pub fn transports(&self) -> impl Iterator<Item = (&'static str, &TransportCounters)> {
        self.transports
            .iter()
            .map(|transport| (transport.name, &*transport.counters))
    }

    /// A value that is not a block was stored.
    pub fn note_non_block(&self) {
        self.counters
            .non_block_values
            .fetch_add(1, Ordering::Relaxed);
    }
}

/// Consecutive events as one wire event each: a chain of stored blocks of one size
/// (each the parent of the next), or removed blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Run {
    /// Blocks stored, parent first.
    Stored {
        /// Their hashes.
        hashes: Vec<SequenceHash>,
        /// The first one's parent.
        parent: Option<SequenceHash>,
        /// Their tokens, concatenated.
        tokens: Vec<u32>,
        /// Tokens per block.
        block_size: u32,
    },
    /// Blocks removed.
    Removed(Vec<SequenceHash>),
}

impl Run {
    /// Tokens per block of a stored run; none for removals.
    pub fn block_size(&self) -> Option<u32> {
        match self {
            Run::Stored { block_size, .. } => Some(*block_size),
            Run::Removed(_) => None,
        }
    }
}

/// `events` grouped into runs, in order.
pub fn runs(events: &[Arc<StoreEvent>]) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    for event in events {
        match (&**event, runs.last_mut()) {
            (
                StoreEvent::Stored(block),
                Some(Run::Stored {
                    hashes,
                    tokens,
                    block_size,
                    ..
                }),
            ) if block.parent == hashes.last().copied()
                && block.tokens.len() == *block_size as usize =>
            {
                hashes.push(block.hash);
                tokens.extend_from_slice(&block.tokens);
            }
            (StoreEvent::Stored(block), _) => runs.push(Run::Stored {
                hashes: vec![block.hash],
                parent: block.parent,
                tokens: block.tokens.clone(),
                block_size: u32::try_from(block.tokens.len()).unwrap_or(u32::MAX),
            }),
            (StoreEvent::Removed(hash), Some(Run::Removed(hashes))) => hashes.push(*hash),
            (StoreEvent::Removed(hash), _) => runs.push(Run::Removed(vec![*hash])),
        }
    }
    runs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(hash: u64, parent: Option<u64>, size: usize) -> Arc<StoreEvent> {
        Arc::new(StoreEvent::Stored(FrameIdentity {
            hash: SequenceHash::new(hash),
            parent: parent.map(SequenceHash::new),
            tokens: vec![hash as u32; size],
        }))
    }

    fn removed(hash: u64) -> Arc<StoreEvent> {
        Arc::new(StoreEvent::Removed(SequenceHash::new(hash)))
    }

    #[test]
    fn the_default_worker_id_is_the_documented_one() {
        assert_eq!(DEFAULT_WORKER_ID, 7_743_504_665_528_911_668);
    }

    #[test]
    fn chains_of_one_size_and_removals_group_and_nothing_else_does() {
        let events = [
            stored(1, None, 2),
            stored(2, Some(1), 2),
            stored(9, Some(5), 2),  // not a child of 2
            stored(10, Some(9), 4), // another size
            removed(1),
            removed(2),
            stored(3, Some(2), 2),
        ];
        let runs = runs(&events);
        let shape: Vec<(Option<u32>, usize)> = runs
            .iter()
            .map(|run| match run {
                Run::Stored { hashes, .. } => (run.block_size(), hashes.len()),
                Run::Removed(hashes) => (None, hashes.len()),
            })
            .collect();
        assert_eq!(
            shape,
            [
                (Some(2), 2),
                (Some(2), 1),
                (Some(4), 1),
                (None, 2),
                (Some(2), 1)
            ]
        );
        assert_eq!(
            runs[0],
            Run::Stored {
                hashes: vec![SequenceHash::new(1), SequenceHash::new(2)],
                parent: None,
                tokens: vec![1, 1, 2, 2],
                block_size: 2,
            }
        );
    }

    #[tokio::test]
    async fn a_full_queue_drops_and_counts_without_waiting() {
        let mut events = StoreEvents::new();
        let mut receiver = events.add_transport("zmq", 2);
        for hash in 0..5 {
            events.emit(StoreEvent::Removed(SequenceHash::new(hash)));
        }
        let (name, counters) = events.transports().next().unwrap();
        assert_eq!(name, "zmq");
        assert_eq!(counters.dropped.load(Ordering::Relaxed), 3);
        assert_eq!(events.counters.removed.load(Ordering::Relaxed), 5);
        assert_eq!(*receiver.queue.recv().await.unwrap(), *removed(0));
    }
}
