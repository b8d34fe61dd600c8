//! Engine event sources: a ZMQ subscriber per engine feeding the router state (or a
//! relay) on a thread of its own.
//!
//! Owns: [`ZmqSource`] (the thread: subscriber items in, decoded events applied under the
//! state's lock, restarts and losses turned into state changes and counters, each
//! attributed to the source's worker as well as counted globally; or, for a shared
//! store's source, to the shared index: `EventTarget`),
//! [`BatchDecoder`] (how a payload becomes worker events: the vLLM / SGLang msgpack
//! decoder in `crate::wire`, or anything a test supplies) and [`EventNumbering`] (per
//! rank event ids for streams whose events carry none).
//! Each source is registered in the state (`/readyz` waits for its catch-up; its
//! connection events, from libzmq's monitor, are counted per endpoint).
//! No queue of its own between the socket and the index: one item at a time is received,
//! decoded and applied, so backpressure reaches libzmq's bounded receive queue (see
//! `crate::zmq::subscriber` for its drop policy and counters).
//! Never: decode msgpack itself, or block the state's lock on the network: a batch is
//! received and decoded first, then applied under the lock in one go.

use super::block_size::{BlockSizeMismatch, RouterBlockSize};
use super::http::{lock, SharedState};
use super::metrics::SourceLabels;
use super::state::shared::EventTarget;
use super::state::ConnectionEvent;
use crate::wire::normalize::{EngineNormalizer, NormalizerStats};
use crate::wire::{DecodeLimits, EngineDecoder, EngineEvent, RawBatch, UnknownEvents, WorkerEvent};
use crate::zmq::{SubscriberConfig, SubscriberItem, SubscriberStats, ZmqError, ZmqSubscriber};
use kvtwin::ids::WorkerId;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Why a batch was refused: its stable reason, and for `block_size_mismatch` the two
/// sizes (so `/v1/workers` and `/readyz` can say them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The stable reason (a `WireError::reason`, `block_size_mismatch`, ...).
    pub reason: &'static str,
    /// The sizes, when the batch announced another block size than the router's.
    pub block_size: Option<BlockSizeMismatch>,
}

impl From<&'static str> for Refusal {
    fn from(reason: &'static str) -> Self {
        Self {
            reason,
            block_size: None,
        }
    }
}

impl From<BlockSizeMismatch> for Refusal {
    fn from(mismatch: BlockSizeMismatch) -> Self {
        Self {
            reason: BLOCK_SIZE_MISMATCH,
            block_size: Some(mismatch),
        }
    }
}

/// The reason of a batch refused for its block size.
pub const BLOCK_SIZE_MISMATCH: &str = "block_size_mismatch";

/// Turns one batch's payload into worker events of `worker`.
pub trait BatchDecoder: Send + 'static {
    /// The events of `batch`, in order, or why the batch is refused. Events left out of
    /// an accepted batch (an unknown type or medium) are reported by pushing their
    /// reasons onto `skipped`.
    fn decode(
        &mut self,
        worker: WorkerId,
        batch: &RawBatch,
        skipped: &mut Vec<&'static str>,
    ) -> Result<Vec<WorkerEvent>, Refusal>;

    /// The engine restarted: forget what its earlier run announced (salted chains,
    /// KV cache groups).
    fn restarted(&mut self) {}

    /// What the decoder tracks per engine (salted blocks), if anything.
    fn stats(&self) -> NormalizerStats {
        NormalizerStats::default()
    }
}

impl<F> BatchDecoder for F
where
    F: FnMut(WorkerId, &RawBatch) -> Result<Vec<WorkerEvent>, &'static str> + Send + 'static,
{
    fn decode(
        &mut self,
        worker: WorkerId,
        batch: &RawBatch,
        _skipped: &mut Vec<&'static str>,
    ) -> Result<Vec<WorkerEvent>, Refusal> {
        self(worker, batch).map_err(Refusal::from)
    }
}

/// vLLM / SGLang batches into worker events: the one decoding path of every ZMQ source
/// (`EngineDecoder` as a `BatchDecoder` is this with no block size). With a
/// `block_size` (a router hashing queries in blocks of that many tokens, fixed or still
/// to be learned from the first `BlockStored`), a batch storing blocks of another size is
/// refused (`block_size_mismatch`, with both sizes), since its token hashes could never
/// match a query. Its [`EngineNormalizer`] hashes blocks as Dynamo does (LoRA, cache
/// salt carried along chains, multimodal keys) and leaves out events of KV cache groups
/// the index does not keep (pushed onto `skipped` with their reason).
#[derive(Clone, Debug)]
pub struct VllmDecoder {
    /// The payload decoder (limits, unknown-event policy).
    pub engine: EngineDecoder,
    /// The router's block size (shared with its state), if batches must match it.
    pub block_size: Option<RouterBlockSize>,
    /// This engine's stream state.
    pub normalizer: EngineNormalizer,
}

impl VllmDecoder {
    /// A decoder with `engine`'s limits, checking `block_size` if given, with a
    /// normaliser of the default bounds.
    pub fn new(engine: EngineDecoder, block_size: Option<RouterBlockSize>) -> Self {
        Self {
            engine,
            block_size,
            normalizer: EngineNormalizer::default(),
        }
    }
}

impl BatchDecoder for VllmDecoder {
    fn decode(
        &mut self,
        worker: WorkerId,
        batch: &RawBatch,
        skipped: &mut Vec<&'static str>,
    ) -> Result<Vec<WorkerEvent>, Refusal> {
        let decoded = self
            .engine
            .decode_payload(batch.seq, &batch.payload)
            .map_err(|error| error.reason())?;
        if let Some(router) = &self.block_size {
            for event in &decoded.events {
                if let EngineEvent::BlockStored(stored) = event {
                    router.admit(stored.block_size)?;
                }
            }
        }
        skipped.extend(decoded.skipped.iter().map(|event| event.error.reason()));
        let mut events = Vec::with_capacity(decoded.events.len());
        self.normalizer
            .worker_events(&decoded, worker, &mut events, skipped)
            .map_err(|error| error.reason())?;
        Ok(events)
    }

    fn restarted(&mut self) {
        self.normalizer.restarted();
    }

    fn stats(&self) -> NormalizerStats {
        self.normalizer.stats()
    }
}

/// vLLM / SGLang batches for `ZmqSource`, whatever their block size: a
/// [`VllmDecoder`] without one (a router checks it by giving one).
impl BatchDecoder for EngineDecoder {
    fn decode(
        &mut self,
        worker: WorkerId,
        batch: &RawBatch,
        skipped: &mut Vec<&'static str>,
    ) -> Result<Vec<WorkerEvent>, Refusal> {
        // Stateless: no salt is carried from one batch to the next (use a VllmDecoder).
        VllmDecoder::new(*self, None).decode(worker, batch, skipped)
    }
}

/// A router's receive queue per engine, in batches: past it libzmq drops the newest,
/// which the router counts as gaps and lost batches.
pub const ENGINE_RECEIVE_HWM_BATCHES: i32 = 4096;

/// The largest engine batch a router takes (vLLM batches are KiBs).
pub const ENGINE_MAX_MESSAGE_BYTES: u64 = 4 << 20;

/// Subscribes a router to one vLLM / SGLang engine's events at `endpoint` (and its
/// `replay` socket), as `worker`, checking (or, without a configured size, learning)
/// the state's block size on every batch: the one way `kvtwin router --zmq`, its admin
/// API and a dashboard's replica start an engine's source. Stopped when dropped.
pub fn start_vllm_source(
    worker: WorkerId,
    endpoint: &str,
    replay: Option<&str>,
    state: &SharedState,
) -> Result<ZmqSource, ZmqError> {
    start_vllm_source_to(EventTarget::Workers, worker, endpoint, replay, state)
}

/// [`start_vllm_source`] into `target`'s index: `kvtwin router --shared-events` follows
/// a shared store's events this way (as `worker`, the store's id in its index).
pub fn start_vllm_source_to(
    target: EventTarget,
    worker: WorkerId,
    endpoint: &str,
    replay: Option<&str>,
    state: &SharedState,
) -> Result<ZmqSource, ZmqError> {
    let config = SubscriberConfig {
        receive_hwm_batches: ENGINE_RECEIVE_HWM_BATCHES,
        max_message_bytes: Some(ENGINE_MAX_MESSAGE_BYTES),
        ..SubscriberConfig::new(endpoint, replay)
    };
    let block_size = lock(state).block_size_setting();
    let decoder = VllmDecoder::new(
        EngineDecoder::new(DecodeLimits::default(), UnknownEvents::Skip),
        Some(block_size),
    );
    ZmqSource::start_to(target, worker, config, decoder, state.clone())
}

/// Event ids per data-parallel rank, for streams (vLLM's) whose events are not numbered:
/// 0, 1, 2, ... per rank, from the last restart.
#[derive(Clone, Debug, Default)]
pub struct EventNumbering {
    next: BTreeMap<u32, u64>,
}

impl EventNumbering {
    /// Numbers `events` in order, continuing each rank's count.
    pub fn number(&mut self, events: &mut [WorkerEvent]) {
        for event in events {
            let next = self.next.entry(event.dp_rank).or_default();
            event.event_id = *next;
            *next += 1;
        }
    }

    /// The ranks numbered since the last reset.
    pub fn ranks(&self) -> Vec<u32> {
        self.next.keys().copied().collect()
    }

    /// Starts every rank again from 0 (the engine restarted).
    pub fn reset(&mut self) {
        self.next.clear();
    }
}

/// A thread feeding one engine's events into the router state.
#[derive(Debug)]
pub struct ZmqSource {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<SubscriberStats>>,
}

impl ZmqSource {
    /// How long the thread waits on the socket before looking at the stop flag.
    const POLL: Duration = Duration::from_millis(50);

    /// Subscribes to `config` for `worker` and starts applying its events to `state`.
    /// The source is registered in the state before this returns (so `/readyz` waits
    /// for its catch-up from the start), and its thread runs inside a `zmq_source` span
    /// carrying `worker_id` and `endpoint`, so every log line says which engine it is
    /// about.
    pub fn start(
        worker: WorkerId,
        config: SubscriberConfig,
        decoder: impl BatchDecoder,
        state: SharedState,
    ) -> Result<Self, ZmqError> {
        Self::start_to(EventTarget::Workers, worker, config, decoder, state)
    }

    /// [`ZmqSource::start`], the events going to `target`'s index: an engine's to the
    /// workers', a shared store's to the shared index (its restarts, gaps and drops
    /// counted there, never on a worker's row).
    pub fn start_to(
        target: EventTarget,
        worker: WorkerId,
        config: SubscriberConfig,
        mut decoder: impl BatchDecoder,
        state: SharedState,
    ) -> Result<Self, ZmqError> {
        let labels = SourceLabels {
            transport: "zmq",
            endpoint: config.endpoint.clone(),
        };
        let span = tracing::info_span!(
            "zmq_source",
            worker_id = worker.get(),
            endpoint = %config.endpoint
        );
        let mut subscriber = ZmqSubscriber::new(config)?;
        lock(&state).register_source(labels.clone(), subscriber.caught_up());
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("kvtwin-zmq-{worker}"))
            .spawn(move || {
                let _entered = span.enter();
                let mut numbering = EventNumbering::default();
                let mut seen = SubscriberStats::default();
                let mut caught_up = subscriber.caught_up();
                let mut salt_evictions_seen = 0;
                while !stopping.load(Ordering::Relaxed) {
                    let next = subscriber.next(Self::POLL);
                    let stats = subscriber.stats();
                    if connection_changed(&seen, &stats) || caught_up != subscriber.caught_up() {
                        let mut router = lock(&state);
                        note_connection(&mut router, &labels, &seen, &stats);
                        if !caught_up && subscriber.caught_up() {
                            caught_up = true;
                            router.note_caught_up(&labels);
                        }
                        seen.connects = stats.connects;
                        seen.disconnects = stats.disconnects;
                        seen.connect_retries = stats.connect_retries;
                    }
                    let item = match next {
                        Ok(Some(item)) => item,
                        Ok(None) => continue,
                        // A socket error other than a timeout: the context is gone.
                        Err(_) => break,
                    };
                    // Decode outside the lock.
                    let mut skipped = Vec::new();
                    let decoded = match &item {
                        SubscriberItem::Batch(batch) => {
                            Some(decoder.decode(worker, batch, &mut skipped))
                        }
                        _ => None,
                    };
                    let stats = subscriber.stats();
                    let mut router = lock(&state);
                    router.note_gaps_to(target, worker, stats.gaps - seen.gaps);
                    router.note_replayed(stats.replayed - seen.replayed);
                    for _ in seen.replay_dropped..stats.replay_dropped {
                        router.drop_for_to(target, worker, "replay_overflow");
                    }
                    // The connection counts in it were handed over above.
                    seen = stats;
                    for reason in skipped {
                        router.drop_for_to(target, worker, reason);
                    }
                    let tracked = decoder.stats();
                    router.note_salt_evictions_to(
                        target,
                        worker,
                        tracked.salt_evictions - salt_evictions_seen,
                    );
                    salt_evictions_seen = tracked.salt_evictions;
                    match (item, decoded) {
                        (SubscriberItem::Batch(_), Some(Ok(mut events))) => {
                            numbering.number(&mut events);
                            router.apply_batch_to(target, &events);
                        }
                        (SubscriberItem::Batch(_), Some(Err(refusal))) => {
                            match refusal.block_size {
                                Some(mismatch) => {
                                    router.refuse_block_size_to(target, worker, mismatch)
                                }
                                None => router.drop_for_to(target, worker, refusal.reason),
                            }
                        }
                        (SubscriberItem::Restarted { .. }, _) => {
                            // Only the ranks this engine's stream carried.
                            router.restart_ranks_to(target, worker, &numbering.ranks());
                            numbering.reset();
                            decoder.restarted();
                            salt_evictions_seen = decoder.stats().salt_evictions;
                        }
                        (SubscriberItem::Lost { first, last }, _) => {
                            router.note_lost_to(target, worker, last - first + 1);
                        }
                        (SubscriberItem::Malformed(error), _) => {
                            router.drop_for_to(target, worker, error.reason());
                        }
                        _ => {}
                    }
                }
                subscriber.stats()
            })
            .map_err(ZmqError::Spawn)?;
        Ok(Self {
            stop,
            thread: Some(thread),
        })
    }

    /// Stops the thread; the subscriber's final counts.
    pub fn stop(mut self) -> SubscriberStats {
        self.halt()
    }

    fn halt(&mut self) -> SubscriberStats {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .and_then(|thread| thread.join().ok())
            .unwrap_or_default()
    }
}

/// Whether the subscriber's connection counts moved since `seen`.
fn connection_changed(seen: &SubscriberStats, stats: &SubscriberStats) -> bool {
    (stats.connects, stats.disconnects, stats.connect_retries)
        != (seen.connects, seen.disconnects, seen.connect_retries)
}

/// Hands the connection events between `seen` and `stats` to the state: losses and
/// retries first, then connects (so a connect after a loss is a reconnect).
fn note_connection(
    router: &mut super::state::RouterState,
    labels: &SourceLabels,
    seen: &SubscriberStats,
    stats: &SubscriberStats,
) {
    for _ in seen.disconnects..stats.disconnects {
        router.note_connection(labels, ConnectionEvent::Disconnected);
    }
    for _ in seen.connect_retries..stats.connect_retries {
        router.note_connection(labels, ConnectionEvent::ConnectRetried);
    }
    for _ in seen.connects..stats.connects {
        router.note_connection(labels, ConnectionEvent::Connected);
    }
}

impl Drop for ZmqSource {
    fn drop(&mut self) {
        self.halt();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{BlockStored, EngineBatch, EngineFormat};

    fn batch(block_size: u32) -> RawBatch {
        let stored = BlockStored {
            block_hashes: vec![1, 2],
            token_ids: (0..2 * block_size).collect(),
            block_size,
            ..BlockStored::default()
        };
        let batch = EngineBatch::new(0, 0.0, vec![EngineEvent::BlockStored(stored)], Some(0));
        RawBatch {
            topic: Vec::new(),
            seq: 0,
            payload: batch.to_payload(&EngineFormat::Vllm0_33.options()),
            replayed: false,
        }
    }

    #[test]
    fn a_router_refuses_blocks_of_another_size() {
        let mut decoder =
            VllmDecoder::new(EngineDecoder::default(), Some(RouterBlockSize::fixed(16)));
        let mut skipped = Vec::new();
        let worker = WorkerId::new(1);
        assert_eq!(
            decoder
                .decode(worker, &batch(16), &mut skipped)
                .unwrap()
                .len(),
            1
        );
        assert_eq!(
            decoder.decode(worker, &batch(32), &mut skipped),
            Err(Refusal::from(BlockSizeMismatch {
                events: 32,
                router: 16
            }))
        );
        assert!(skipped.is_empty());
    }

    #[test]
    fn a_router_without_a_block_size_learns_the_first_one_and_holds_to_it() {
        let shared = RouterBlockSize::learned();
        let mut decoder = VllmDecoder::new(EngineDecoder::default(), Some(shared.clone()));
        let worker = WorkerId::new(1);
        let mut skipped = Vec::new();
        assert!(decoder.decode(worker, &batch(32), &mut skipped).is_ok());
        assert_eq!(shared.get(), Some(32));
        let refusal = decoder
            .decode(worker, &batch(16), &mut skipped)
            .unwrap_err();
        assert_eq!(refusal.reason, BLOCK_SIZE_MISMATCH);
        assert_eq!(
            refusal.block_size,
            Some(BlockSizeMismatch {
                events: 16,
                router: 32
            })
        );
    }

    #[test]
    fn the_engine_decoder_takes_any_block_size_and_reports_reasons() {
        let mut decoder = EngineDecoder::default();
        let raw = batch(32);
        let events = decoder
            .decode(WorkerId::new(3), &raw, &mut Vec::new())
            .unwrap();
        assert_eq!(events.len(), 1);
        let broken = RawBatch {
            payload: vec![0x93, 0xc1],
            ..raw
        };
        assert_eq!(
            decoder.decode(WorkerId::new(3), &broken, &mut Vec::new()),
            Err(Refusal::from("malformed_msgpack"))
        );
    }

    #[test]
    fn events_are_numbered_per_rank_and_restart_from_zero() {
        let event = |dp_rank| WorkerEvent {
            worker: WorkerId::new(1),
            dp_rank,
            event_id: 99,
            data: crate::wire::WorkerEventData::Cleared,
        };
        let mut numbering = EventNumbering::default();
        let mut events = vec![event(0), event(1), event(0)];
        numbering.number(&mut events);
        assert_eq!(
            events.iter().map(|e| e.event_id).collect::<Vec<_>>(),
            [0, 0, 1]
        );
        numbering.reset();
        let mut again = vec![event(0)];
        numbering.number(&mut again);
        assert_eq!(again[0].event_id, 0);
    }
}
