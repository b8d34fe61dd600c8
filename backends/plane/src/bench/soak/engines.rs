//! The soak's engines: one thread per synthetic engine, publishing its batches over ZMQ
//! at a paced rate until told to stop.
//!
//! Owns: `Engines` (the threads, their stop flag and live counters) and `Stopped` (what
//! each engine ends with: its cache's digest and size, and its publisher, kept open so
//! relays can still replay from it).
//! Never: encode ahead of time or publish faster than the rate (the soak is about
//! stability, not throughput), or read anything but the monotonic clock (for pacing).

use crate::service::synthetic::{SyntheticConfig, SyntheticEngine};
use crate::wire::EngineFormat;
use crate::zmq::{PublisherConfig, ZmqError, ZmqPublisher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What one engine has published so far, readable while it runs.
#[derive(Debug, Default)]
pub(super) struct Sent {
    pub(super) batches: AtomicU64,
    pub(super) events: AtomicU64,
    pub(super) blocks: AtomicU64,
}

/// An engine after its thread stopped.
pub(super) struct Stopped {
    /// The [`block_digest`](crate::service::translate::block_digest) of its cache.
    pub(super) digest: u64,
    /// Blocks in its cache.
    pub(super) cached_blocks: u64,
    /// Kept open: a relay restarted late still replays from it.
    pub(super) publisher: ZmqPublisher,
    /// A publish that failed, if one did (the thread stopped there).
    pub(super) error: Option<ZmqError>,
}

/// The running engines.
pub(super) struct Engines {
    /// Each engine's PUB and replay endpoints.
    pub(super) endpoints: Vec<(String, String)>,
    pub(super) sent: Vec<Arc<Sent>>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<(SyntheticEngine, ZmqPublisher, Option<ZmqError>)>>,
}

impl Engines {
    /// Binds each engine's publisher on loopback and starts its thread; engine `i`
    /// (worker `i + 1`) is seeded `seed + i` and publishes `rate / engines` blocks a
    /// second.
    pub(super) fn start(
        engines: usize,
        rate_blocks_per_s: u64,
        capacity_blocks: usize,
        seed: u64,
    ) -> Result<Self, super::SoakError> {
        let stop = Arc::new(AtomicBool::new(false));
        let per_engine = rate_blocks_per_s as f64 / engines as f64;
        let mut started = Self {
            endpoints: Vec::with_capacity(engines),
            sent: Vec::with_capacity(engines),
            stop: stop.clone(),
            threads: Vec::with_capacity(engines),
        };
        for index in 0..engines {
            let publisher = ZmqPublisher::bind(&PublisherConfig::new(
                "tcp://127.0.0.1:*",
                Some("tcp://127.0.0.1:*"),
            ))?;
            started.endpoints.push((
                publisher.endpoint().to_string(),
                publisher.replay_endpoint().unwrap_or_default().to_string(),
            ));
            let config = SyntheticConfig {
                capacity_blocks,
                ..SyntheticConfig::small(seed.wrapping_add(index as u64))
            };
            let sent = Arc::new(Sent::default());
            started.sent.push(sent.clone());
            let stop = stop.clone();
            let thread = std::thread::Builder::new()
                .name(format!("soak-engine-{}", index + 1))
                .spawn(move || publish_paced(config, publisher, per_engine, &sent, &stop))
                .map_err(|source| super::SoakError::Io {
                    what: "start an engine thread".to_string(),
                    source,
                })?;
            started.threads.push(thread);
        }
        Ok(started)
    }

    /// Stops every engine and waits for its thread; what each ends with, in engine
    /// order.
    pub(super) fn stop(mut self) -> Vec<Stopped> {
        self.stop.store(true, Ordering::Release);
        self.threads
            .drain(..)
            .map(|thread| {
                let (engine, publisher, error) = match thread.join() {
                    Ok(joined) => joined,
                    Err(panic) => std::panic::resume_unwind(panic),
                };
                Stopped {
                    digest: engine.block_digest(),
                    cached_blocks: engine.cached_blocks() as u64,
                    publisher,
                    error,
                }
            })
            .collect()
    }
}

impl Drop for Engines {
    fn drop(&mut self) {
        // An early return of the soak: the threads end at their next step.
        self.stop.store(true, Ordering::Release);
    }
}

/// One engine's loop: the next batch, published when its blocks are due on an absolute
/// schedule (a late batch does not push the later ones back), until `stop`.
fn publish_paced(
    config: SyntheticConfig,
    mut publisher: ZmqPublisher,
    blocks_per_s: f64,
    sent: &Sent,
    stop: &AtomicBool,
) -> (SyntheticEngine, ZmqPublisher, Option<ZmqError>) {
    let mut engine = SyntheticEngine::new(config);
    let options = EngineFormat::Vllm0_33.options();
    let start = Instant::now();
    let mut due_blocks = 0.0f64;
    while !stop.load(Ordering::Acquire) {
        // A batch is only generated when it is about to be published: the engine's
        // state is then exactly what was published once the thread stops.
        let due = start + Duration::from_secs_f64(due_blocks / blocks_per_s.max(1e-9));
        let now = Instant::now();
        if due > now {
            // Short naps, so a stop is seen within 50 ms.
            std::thread::sleep((due - now).min(Duration::from_millis(50)));
            continue;
        }
        let batch = engine.next_batch();
        if batch.events.is_empty() {
            continue;
        }
        let blocks = batch.block_count() as u64;
        if let Err(error) = publisher.publish(&batch.to_payload(&options)) {
            return (engine, publisher, Some(error));
        }
        sent.batches.fetch_add(1, Ordering::Relaxed);
        sent.events
            .fetch_add(batch.events.len() as u64, Ordering::Relaxed);
        sent.blocks.fetch_add(blocks, Ordering::Relaxed);
        // Paced by blocks stored: removals come with them once the cache is full.
        due_blocks += batch
            .events
            .iter()
            .map(|event| match event {
                crate::wire::EngineEvent::BlockStored(stored) => stored.block_hashes.len(),
                _ => 0,
            })
            .sum::<usize>() as f64;
    }
    (engine, publisher, None)
}
