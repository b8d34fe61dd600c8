//! The engines' side of the relay bench: each engine's pre-encoded stream, what the
//! router side records of it, and the single-threaded cost of each stage.
//!
//! Owns: `Stream` (a cycle of encoded batches and where each batch's events end),
//! `Track` and the apply observer (per engine: batches fully applied, and when),
//! `Published` (what an engine thread did) and `stage_costs`.
//! Never: publish or time the pipeline (`run.rs` does).

use super::{RelayBenchConfig, StageCosts};
use crate::service::nats_source::decode_message;
use crate::service::relay::NatsFormat;
use crate::service::state::{ApplyObserver, RouterState};
use crate::service::synthetic::{SyntheticConfig, SyntheticEngine};
use crate::wire::{
    DecodeLimits, EngineBatch, EngineDecoder, EngineEvent, Envelope, RouterEvent, UnknownEvents,
    WorkerEvent,
};
use kvtwin::ids::WorkerId;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// One engine's pre-encoded stream.
pub(super) struct Stream {
    pub(super) payloads: Vec<Vec<u8>>,
    /// Per batch of the cycle: blocks, and the id of its last event counted from the
    /// cycle's start.
    pub(super) blocks: Vec<u64>,
    pub(super) last_event: Vec<u64>,
    pub(super) events_per_cycle: u64,
}

impl Stream {
    pub(super) fn generate(config: &RelayBenchConfig, engine: usize) -> Self {
        let mut synthetic = SyntheticEngine::new(SyntheticConfig {
            seed: config.synthetic.seed.wrapping_add(engine as u64),
            ..config.synthetic
        });
        let options = config.engine_format.options();
        let mut batches: Vec<EngineBatch> = Vec::with_capacity(config.cycle_batches + 1);
        while batches.len() < config.cycle_batches.max(1) {
            let batch = synthetic.next_batch();
            // An engine step with nothing to say is not published (the relay would
            // publish nothing for it either).
            if !batch.events.is_empty() {
                batches.push(batch);
            }
        }
        // The cycle ends with the cache empty on both sides, so it can repeat.
        batches.push(EngineBatch::new(
            0,
            0.0,
            vec![EngineEvent::AllBlocksCleared],
            config.synthetic.dp_rank,
        ));
        let mut stream = Self {
            payloads: Vec::with_capacity(batches.len()),
            blocks: Vec::with_capacity(batches.len()),
            last_event: Vec::with_capacity(batches.len()),
            events_per_cycle: 0,
        };
        for batch in &batches {
            stream.payloads.push(batch.to_payload(&options));
            stream.blocks.push(batch.block_count() as u64);
            stream.events_per_cycle += batch.events.len() as u64;
            stream.last_event.push(stream.events_per_cycle - 1);
        }
        stream
    }

    pub(super) fn len(&self) -> u64 {
        self.payloads.len() as u64
    }

    /// The id the relay gives the last event of global batch `k`.
    pub(super) fn last_event_id(&self, k: u64) -> u64 {
        (k / self.len()) * self.events_per_cycle + self.last_event[(k % self.len()) as usize]
    }

    pub(super) fn events_of(&self, k: u64) -> u64 {
        let index = (k % self.len()) as usize;
        let first = if index == 0 {
            0
        } else {
            self.last_event[index - 1] + 1
        };
        self.last_event[index] + 1 - first
    }
}

/// What the router side knows of one engine, written by the apply observer.
pub(super) struct Track {
    pub(super) stream: Arc<Stream>,
    /// Global batches fully applied.
    pub(super) applied: AtomicU64,
    /// The engine's thread, woken when `applied` moves (it parks while its window is
    /// full: polling would take CPU from the pipeline it measures).
    pub(super) engine: OnceLock<std::thread::Thread>,
    /// When each global batch was fully applied, nanoseconds since the bench's epoch.
    pub(super) applied_at: Mutex<Vec<u64>>,
}

/// The observer: per engine, the next global batch to complete. It reads the clock only
/// when a batch completes, not per event.
pub(super) fn observer(tracks: Arc<Vec<Track>>, epoch: Instant) -> ApplyObserver {
    let mut next = vec![0u64; tracks.len()];
    Box::new(move |event: &WorkerEvent| {
        let Some(index) = (event.worker.get() as usize).checked_sub(1) else {
            return;
        };
        let Some(track) = tracks.get(index) else {
            return;
        };
        let mut k = next[index];
        if event.event_id < track.stream.last_event_id(k) {
            return;
        }
        let now = epoch.elapsed().as_nanos() as u64;
        let mut applied_at = track
            .applied_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        while event.event_id >= track.stream.last_event_id(k) {
            applied_at.push(now);
            k += 1;
        }
        drop(applied_at);
        next[index] = k;
        track.applied.store(k, Ordering::Release);
        if let Some(engine) = track.engine.get() {
            engine.unpark();
        }
    })
}

/// What an engine thread did.
#[derive(Default)]
pub(super) struct Published {
    /// Global batches published, warm-up included.
    pub(super) batches: u64,
    /// When each was published, nanoseconds since the epoch.
    pub(super) at: Vec<u64>,
    /// With [`Pace::Rate`], when each was due, nanoseconds since the epoch.
    pub(super) due: Vec<u64>,
    pub(super) behind_max: Duration,
    pub(super) bytes: u64,
    /// The thread's CPU time over the run.
    pub(super) cpu: Duration,
}

/// Times each stage single-threaded on `stream`'s first cycle.
pub(super) fn stage_costs(config: &RelayBenchConfig, stream: &Stream) -> StageCosts {
    let limits = DecodeLimits::default();
    let decoder = EngineDecoder::new(limits, UnknownEvents::Skip);
    let worker = WorkerId::new(1);
    let blocks: u64 = stream.blocks.iter().sum();
    let per_block = |elapsed: Duration| elapsed.as_nanos() as f64 / blocks.max(1) as f64;
    let mut costs = Vec::new();

    let start = Instant::now();
    let batches: Vec<EngineBatch> = stream
        .payloads
        .iter()
        .enumerate()
        .filter_map(|(seq, payload)| decoder.decode_payload(seq as u64, payload).ok())
        .collect();
    costs.push(("engine_decode", per_block(start.elapsed())));

    let start = Instant::now();
    let mut next_id = 0;
    let router_events: Vec<Vec<RouterEvent>> = batches
        .iter()
        .map(|batch| {
            let mut out = Vec::with_capacity(batch.events.len());
            let _ = batch.router_events(worker, &mut next_id, &mut out);
            out
        })
        .collect();
    costs.push(("to_router_events", per_block(start.elapsed())));

    let start = Instant::now();
    let messages: Vec<Vec<u8>> = match config.nats_format {
        NatsFormat::Json => router_events
            .iter()
            .flatten()
            .map(RouterEvent::to_json)
            .collect(),
        NatsFormat::Envelope { .. } => router_events
            .iter()
            .enumerate()
            .flat_map(|(sequence, events)| {
                events.chunks(Envelope::MAX_EVENTS).map(move |chunk| {
                    let mut bytes = Vec::new();
                    Envelope::encode_events(
                        1,
                        sequence as u64,
                        0,
                        Envelope::TOPIC,
                        chunk,
                        &mut bytes,
                    );
                    bytes
                })
            })
            .collect(),
    };
    costs.push(("nats_encode", per_block(start.elapsed())));

    let start = Instant::now();
    let decoded: Vec<Vec<WorkerEvent>> = messages
        .iter()
        .filter_map(|message| decode_message(message, &limits).ok())
        .collect();
    costs.push(("router_decode", per_block(start.elapsed())));

    let mut state = RouterState::new(config.synthetic.block_size as usize);
    let start = Instant::now();
    for events in &decoded {
        state.apply_batch(events);
    }
    costs.push(("router_apply", per_block(start.elapsed())));
    StageCosts {
        blocks,
        ns_per_block: costs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_are_found_by_the_relays_event_ids_across_cycles() {
        let config = RelayBenchConfig {
            cycle_batches: 5,
            ..RelayBenchConfig::new()
        };
        let stream = Stream::generate(&config, 0);
        // Five batches and the AllBlocksCleared that ends the cycle.
        assert_eq!(stream.len(), 6);
        assert_eq!(stream.blocks[5], 0);
        assert_eq!(stream.events_of(5), 1);
        let mut next_id = 0;
        for k in 0..3 * stream.len() {
            assert_eq!(stream.last_event_id(k), next_id + stream.events_of(k) - 1);
            next_id += stream.events_of(k);
        }
        // The relay numbers the same events the same way.
        let decoder = EngineDecoder::new(DecodeLimits::default(), UnknownEvents::Skip);
        let mut relay_id = 0;
        for (k, payload) in stream.payloads.iter().enumerate() {
            let batch = decoder.decode_payload(k as u64, payload).unwrap();
            let mut events = Vec::new();
            batch
                .router_events(WorkerId::new(1), &mut relay_id, &mut events)
                .unwrap();
            assert_eq!(
                events.last().unwrap().event.event_id,
                stream.last_event_id(k as u64)
            );
        }
    }
}
