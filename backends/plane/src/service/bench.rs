//! `kvtwin bench relay`: the event plane under load on loopback, engine to router.
//!
//! Owns: [`RelayBenchConfig`], [`run_relay_bench`] and its [`RelayBenchReport`]. The
//! pipeline is the one a deployment runs: N synthetic engines (a thread each, a
//! [`ZmqPublisher`] each, vLLM batches encoded before the clock starts) → one relay per
//! engine ([`run_relay`], ZMQ → NATS) → its own `nats-server` ([`NatsServer`]) → a router
//! ([`NatsSource`] applying to a [`RouterState`]). Relays and router each run on a tokio
//! runtime of their own, so the CPU each takes can be told apart.
//!
//! What is measured, and how:
//! - *Block events* are blocks stored plus blocks removed, counted when the router has
//!   applied them; throughput is those over the wall time from the first publish to the
//!   last apply.
//! - *Added latency* is per engine batch: from the engine thread's clock just before the
//!   publish to the router's clock right after the batch's last event is applied (a
//!   [`RouterState::set_apply_observer`] hook; both clocks are this process's
//!   `Instant`). The relay numbers events per rank from 0 in publish order, so the
//!   batch an event belongs to is known from its id.
//! - [`Pace::Window`] publishes as fast as the pipeline takes, each engine keeping at
//!   most `batches` published but not yet applied (no layer overflows, so nothing is
//!   lost): its latency is mostly that window's queueing. [`Pace::Rate`] publishes at a
//!   fixed rate, evenly spaced: below saturation its latency is the pipeline's own.
//! - Where the CPU goes: per thread group (engines, ZMQ I/O, relay decode threads, relay
//!   and router runtimes) and the nats-server process, from `/proc` over the measured
//!   interval (Linux; empty elsewhere), and the single-threaded cost per block of each
//!   stage (engine decode, conversion, NATS encoding, router decode, apply) timed on one
//!   engine's batches before the run.
//!
//! The engines' batch streams repeat: each engine pre-encodes `cycle_batches` batches and
//! an `AllBlocksCleared`, and publishes them round and round, so the router's view stays
//! exact (every cycle starts from an empty cache on both sides) with bounded memory.
//! Never: be used as a correctness test (the event plane tests are), or run outside a
//! benchmark (it starts its own NATS server and spins up threads for every engine).

use super::http::{lock, SharedState};
use super::nats_source::{decode_message, NatsSource, NatsSourceConfig, NatsSourceStats};
use super::relay::{run_relay, NatsFormat, RelayConfig, RelayError, RelayStats};
use super::state::RouterState;
use super::synthetic::{SyntheticConfig, SyntheticEngine};
use crate::nats::{
    ConsumeMode, NatsError, NatsMode, NatsServer, PublisherConfig as NatsPublisherConfig,
    SubscriberConfig as NatsSubscriberConfig,
};
use crate::wire::EngineEvent;
use crate::wire::{
    DecodeLimits, EngineBatch, EngineDecoder, EngineFormat, Envelope, KvEvent, RouterEvent,
    UnknownEvents,
};
use crate::zmq::{PublisherConfig, SubscriberConfig, ZmqError, ZmqPublisher};
use kvtwin::ids::WorkerId;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// The subject the bench publishes on.
const SUBJECT: &str = "kvtwin.bench.kv_events";

/// The JetStream stream when [`Transport::JetStream`] is chosen.
const STREAM: &str = "kvtwin-bench-kv-events";

/// How fast the engines publish.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pace {
    /// As fast as the pipeline takes them, each engine keeping at most `batches`
    /// published but not yet applied by the router.
    Window {
        /// Batches in flight per engine.
        batches: usize,
    },
    /// This many blocks per second across all engines, each engine's batches evenly
    /// spaced (by their blocks) on an absolute schedule.
    Rate {
        /// Blocks per second, all engines together.
        blocks_per_s: u64,
    },
}

/// How the relays hand events to the router.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// Core NATS: fire and forget.
    Core,
    /// A JetStream stream: each publish waits for the server's ack; the router replays
    /// the stream (what `kvtwin router --jetstream` does).
    JetStream,
}

/// What to run.
#[derive(Clone, Debug, PartialEq)]
pub struct RelayBenchConfig {
    /// Engines (each with its own relay), worker ids 1..=N.
    pub engines: usize,
    /// How long the engines publish.
    pub duration: Duration,
    /// Each engine's stream; engine `i` is seeded `seed + i` (prompts are shared).
    pub synthetic: SyntheticConfig,
    /// The engines' wire format.
    pub engine_format: EngineFormat,
    /// JSON (one event per message) or Dynamo 1.6 envelopes (one per engine batch, up to
    /// 128 events); an envelope's publisher id is set to its engine's worker id.
    pub nats_format: NatsFormat,
    /// Core NATS or JetStream.
    pub transport: Transport,
    /// Window or fixed rate.
    pub pace: Pace,
    /// Batches each engine pre-encodes before its stream repeats.
    pub cycle_batches: usize,
    /// How long to wait after publishing stops for the router to apply everything.
    pub drain_timeout: Duration,
}

impl RelayBenchConfig {
    /// Two engines for five seconds, vLLM 0.33 batches of 16 requests (prompts of up to
    /// 32 blocks, up to 8 blocks of their own, 16-token blocks, 4,096 blocks cached),
    /// envelopes over core NATS, 64 batches in flight per engine, 2,000-batch cycles.
    pub fn new() -> Self {
        Self {
            engines: 2,
            duration: Duration::from_secs(5),
            synthetic: SyntheticConfig {
                requests_per_batch: 16,
                prompts: 8,
                prompt_blocks: 32,
                own_blocks: 8,
                capacity_blocks: 4096,
                ..SyntheticConfig::small(1)
            },
            engine_format: EngineFormat::Vllm0_33,
            nats_format: NatsFormat::Envelope { publisher_id: 0 },
            transport: Transport::Core,
            pace: Pace::Window { batches: 64 },
            cycle_batches: 2000,
            drain_timeout: Duration::from_secs(30),
        }
    }
}

impl Default for RelayBenchConfig {
    fn default() -> Self {
        Self::new()
    }
}

/// The bench could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RelayBenchError {
    /// The NATS server could not be started (or is not installed), or a client failed.
    #[error("NATS: {0}")]
    Nats(#[from] NatsError),
    /// An engine's publisher could not bind or send.
    #[error(transparent)]
    Zmq(#[from] ZmqError),
    /// A relay failed.
    #[error("relay: {0}")]
    Relay(#[from] RelayError),
    /// A runtime or thread could not be started.
    #[error("could not start {what}: {source}")]
    Spawn {
        /// What.
        what: &'static str,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The first batch of every engine did not reach the router in time: the pipeline
    /// is not connected.
    #[error(
        "warm-up: the router applied {applied} of {engines} engines' first batches in {waited:?}"
    )]
    WarmUp {
        /// Engines whose first batch arrived.
        applied: usize,
        /// Engines.
        engines: usize,
        /// How long it waited.
        waited: Duration,
    },
    /// A configuration that cannot run (no engines, an empty window, a zero rate).
    #[error("invalid configuration: {0}")]
    Config(&'static str),
}

/// Percentiles of the added latency, over engine batches.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LatencySummary {
    /// Batches measured.
    pub samples: u64,
    /// Median.
    pub p50: Duration,
    /// 90th percentile.
    pub p90: Duration,
    /// 99th percentile.
    pub p99: Duration,
    /// 99.9th percentile.
    pub p999: Duration,
    /// Worst.
    pub max: Duration,
}

impl LatencySummary {
    fn of(mut samples: Vec<Duration>) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        samples.sort_unstable();
        let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
        Self {
            samples: samples.len() as u64,
            p50: at(0.5),
            p90: at(0.9),
            p99: at(0.99),
            p999: at(0.999),
            max: samples[samples.len() - 1],
        }
    }
}

/// Single-threaded cost per block of each stage, on one engine's batches.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StageCosts {
    /// Blocks (stored plus removed) in the batches timed.
    pub blocks: u64,
    /// Each stage's name and nanoseconds per block.
    pub ns_per_block: Vec<(&'static str, f64)>,
}

/// What a run measured.
#[derive(Clone, Debug, PartialEq)]
pub struct RelayBenchReport {
    /// The configuration it ran.
    pub config: RelayBenchConfig,
    /// First publish to last apply.
    pub elapsed: Duration,
    /// Engine batches published (after the warm-up batch).
    pub batches: u64,
    /// Engine events in them.
    pub events: u64,
    /// Blocks in them (stored plus removed).
    pub blocks: u64,
    /// Batches whose every event the router applied.
    pub batches_applied: u64,
    /// Blocks of those.
    pub blocks_applied: u64,
    /// NATS messages the relays published.
    pub nats_messages: u64,
    /// Bytes of the engines' payloads (ZMQ).
    pub engine_bytes: u64,
    /// Publish to applied, per batch.
    pub latency: LatencySummary,
    /// With [`Pace::Rate`]: how far behind its schedule an engine published at worst.
    pub behind_schedule_max: Duration,
    /// With [`Pace::Rate`]: from when each batch was due to applied, which adds the
    /// engines' own lateness (a busy machine wakes their threads late) to `latency`.
    pub latency_from_due: Option<LatencySummary>,
    /// Events the router refused, all reasons.
    pub router_dropped: u64,
    /// What the relays did, summed.
    pub relay: RelayStats,
    /// What the router's NATS source did.
    pub source: NatsSourceStats,
    /// CPU time over the measured interval: thread groups of this process, and
    /// `nats-server`.
    pub cpu: Vec<(String, Duration)>,
    /// The stages' single-threaded costs.
    pub stages: StageCosts,
}

impl RelayBenchReport {
    /// Block events applied per second of `elapsed`.
    pub fn block_events_per_s(&self) -> f64 {
        self.blocks_applied as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// NATS messages per second of `elapsed`.
    pub fn messages_per_s(&self) -> f64 {
        self.nats_messages as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// The report as one JSON object.
    pub fn to_json(&self) -> Value {
        let micros = |d: Duration| (d.as_secs_f64() * 1e7).round() / 10.0;
        let (pace, window, rate) = match self.config.pace {
            Pace::Window { batches } => ("window", Some(batches), None),
            Pace::Rate { blocks_per_s } => ("rate", None, Some(blocks_per_s)),
        };
        let synthetic = &self.config.synthetic;
        let cpu: serde_json::Map<String, Value> = self
            .cpu
            .iter()
            .map(|(group, time)| {
                let seconds = (time.as_secs_f64() * 1000.0).round() / 1000.0;
                (group.clone(), json!(seconds))
            })
            .collect();
        let stages: serde_json::Map<String, Value> = self
            .stages
            .ns_per_block
            .iter()
            .map(|(stage, ns)| ((*stage).to_string(), json!((ns * 10.0).round() / 10.0)))
            .collect();
        json!({
            "bench": "relay",
            "engines": self.config.engines,
            "seconds": self.config.duration.as_secs_f64(),
            "format": match self.config.nats_format {
                NatsFormat::Json => "json",
                NatsFormat::Envelope { .. } => "envelope",
            },
            "transport": match self.config.transport {
                Transport::Core => "core",
                Transport::JetStream => "jetstream",
            },
            "pace": pace,
            "window_batches": window,
            "rate_blocks_per_s": rate,
            "requests_per_batch": synthetic.requests_per_batch,
            "own_blocks": synthetic.own_blocks,
            "prompt_blocks": synthetic.prompt_blocks,
            "block_size": synthetic.block_size,
            "elapsed_s": self.elapsed.as_secs_f64(),
            "batches": self.batches,
            "events": self.events,
            "blocks": self.blocks,
            "batches_applied": self.batches_applied,
            "blocks_applied": self.blocks_applied,
            "blocks_per_event": self.blocks as f64 / self.events.max(1) as f64,
            "block_events_per_s": self.block_events_per_s().round(),
            "engine_batches_per_s": (self.batches_applied as f64
                / self.elapsed.as_secs_f64().max(1e-9)).round(),
            "nats_messages": self.nats_messages,
            "nats_messages_per_s": self.messages_per_s().round(),
            "engine_mib_per_s": self.engine_bytes as f64 / (1 << 20) as f64
                / self.elapsed.as_secs_f64().max(1e-9),
            "latency_samples": self.latency.samples,
            "latency_p50_us": micros(self.latency.p50),
            "latency_p90_us": micros(self.latency.p90),
            "latency_p99_us": micros(self.latency.p99),
            "latency_p999_us": micros(self.latency.p999),
            "latency_max_us": micros(self.latency.max),
            "behind_schedule_max_us": micros(self.behind_schedule_max),
            "latency_from_due_p50_us": self.latency_from_due.map(|l| micros(l.p50)),
            "latency_from_due_p99_us": self.latency_from_due.map(|l| micros(l.p99)),
            "router_dropped": self.router_dropped,
            "relay_publish_failures": self.relay.publish_failures,
            "relay_lost_batches": self.relay.lost_batches,
            "cpu_s": cpu,
            "stage_ns_per_block": stages,
        })
    }
}

impl std::fmt::Display for RelayBenchReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let json = self.to_json();
        writeln!(
            f,
            "event plane: {} engines → relays → nats-server ({}, {}) → router, {}",
            self.config.engines,
            json["transport"].as_str().unwrap_or_default(),
            json["format"].as_str().unwrap_or_default(),
            match self.config.pace {
                Pace::Window { batches } => format!("{batches} batches in flight per engine"),
                Pace::Rate { blocks_per_s } => format!("paced at {blocks_per_s} blocks/s"),
            }
        )?;
        let row = |f: &mut std::fmt::Formatter<'_>, name: &str, value: String| {
            writeln!(f, "  {name:<34} {value}")
        };
        row(
            f,
            "elapsed (first publish → last apply)",
            format!("{:.3} s", self.elapsed.as_secs_f64()),
        )?;
        row(
            f,
            "block events applied / published",
            format!("{} / {}", self.blocks_applied, self.blocks),
        )?;
        row(
            f,
            "block events per second",
            format!("{:.0}", self.block_events_per_s()),
        )?;
        row(
            f,
            "engine batches per second",
            format!(
                "{:.0}",
                self.batches_applied as f64 / self.elapsed.as_secs_f64().max(1e-9)
            ),
        )?;
        row(
            f,
            "NATS messages per second",
            format!("{:.0}", self.messages_per_s()),
        )?;
        row(
            f,
            "blocks per event / per batch",
            format!(
                "{:.2} / {:.1}",
                self.blocks as f64 / self.events.max(1) as f64,
                self.blocks as f64 / self.batches.max(1) as f64
            ),
        )?;
        row(
            f,
            "added latency p50 / p99 / p99.9 / max",
            format!(
                "{:.3} / {:.3} / {:.3} / {:.3} ms ({} batches)",
                ms(self.latency.p50),
                ms(self.latency.p99),
                ms(self.latency.p999),
                ms(self.latency.max),
                self.latency.samples
            ),
        )?;
        if let Some(from_due) = self.latency_from_due {
            row(
                f,
                "from when due: p50 / p99 / max",
                format!(
                    "{:.3} / {:.3} / {:.3} ms (engines at worst {:.3} ms late)",
                    ms(from_due.p50),
                    ms(from_due.p99),
                    ms(from_due.max),
                    ms(self.behind_schedule_max)
                ),
            )?;
        }
        row(
            f,
            "refused / publish failures / lost",
            format!(
                "{} / {} / {}",
                self.router_dropped, self.relay.publish_failures, self.relay.lost_batches
            ),
        )?;
        if !self.cpu.is_empty() {
            let total: Duration = self.cpu.iter().map(|(_, time)| *time).sum();
            let parts: Vec<String> = self
                .cpu
                .iter()
                .map(|(group, time)| format!("{group} {:.2}", time.as_secs_f64()))
                .collect();
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            row(
                f,
                "CPU s",
                format!(
                    "{:.2} of {:.2} ({cores} cores): {}",
                    total.as_secs_f64(),
                    self.elapsed.as_secs_f64() * cores as f64,
                    parts.join(", ")
                ),
            )?;
        }
        let stages: Vec<String> = self
            .stages
            .ns_per_block
            .iter()
            .map(|(stage, ns)| format!("{stage} {ns:.0}"))
            .collect();
        row(f, "stage ns per block (1 thread)", stages.join(", "))
    }
}

/// One engine's pre-encoded stream.
struct Stream {
    payloads: Vec<Vec<u8>>,
    /// Per batch of the cycle: blocks, and the id of its last event counted from the
    /// cycle's start.
    blocks: Vec<u64>,
    last_event: Vec<u64>,
    events_per_cycle: u64,
}

impl Stream {
    fn generate(config: &RelayBenchConfig, engine: usize) -> Self {
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
            vec![KvEvent::AllBlocksCleared],
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

    fn len(&self) -> u64 {
        self.payloads.len() as u64
    }

    /// The id the relay gives the last event of global batch `k`.
    fn last_event_id(&self, k: u64) -> u64 {
        (k / self.len()) * self.events_per_cycle + self.last_event[(k % self.len()) as usize]
    }

    fn events_of(&self, k: u64) -> u64 {
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
struct Track {
    stream: Arc<Stream>,
    /// Global batches fully applied.
    applied: AtomicU64,
    /// The engine's thread, woken when `applied` moves (it parks while its window is
    /// full: polling would take CPU from the pipeline it measures).
    engine: OnceLock<std::thread::Thread>,
    /// When each global batch was fully applied, nanoseconds since the bench's epoch.
    applied_at: Mutex<Vec<u64>>,
}

/// The observer: per engine, the next global batch to complete. It reads the clock only
/// when a batch completes, not per event.
fn observer(tracks: Arc<Vec<Track>>, epoch: Instant) -> super::state::ApplyObserver {
    let mut next = vec![0u64; tracks.len()];
    Box::new(move |event: &EngineEvent| {
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
struct Published {
    /// Global batches published, warm-up included.
    batches: u64,
    /// When each was published, nanoseconds since the epoch.
    at: Vec<u64>,
    /// With [`Pace::Rate`], when each was due, nanoseconds since the epoch.
    due: Vec<u64>,
    behind_max: Duration,
    bytes: u64,
    /// The thread's CPU time over the run.
    cpu: Duration,
}

/// CPU time of the calling thread (zero where the clock is not available).
fn thread_cpu_time() -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid timespec for the call to write.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) } != 0 {
        return Duration::ZERO;
    }
    Duration::new(now.tv_sec as u64, now.tv_nsec as u32)
}

/// The kernel's id of the calling thread (what `/proc/self/task` lists).
fn thread_id() -> u64 {
    // SAFETY: gettid takes no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as u64 }
}

/// Times each stage single-threaded on `stream`'s first cycle.
fn stage_costs(config: &RelayBenchConfig, stream: &Stream) -> StageCosts {
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
    let decoded: Vec<Vec<EngineEvent>> = messages
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

/// CPU time per thread of this process (by id, with its name) and of `pid`s.
#[derive(Clone, Debug, Default)]
struct CpuSnapshot {
    threads: BTreeMap<u64, (String, Duration)>,
    processes: BTreeMap<u32, Duration>,
}

/// utime + stime of a `/proc/.../stat` line, and the name in parentheses.
fn parse_stat(text: &str, tick: Duration) -> Option<(String, Duration)> {
    let open = text.find('(')?;
    let close = text.rfind(')')?;
    let name = text.get(open + 1..close)?.to_string();
    // After ")": state is field 3; utime and stime are fields 14 and 15.
    let fields: Vec<&str> = text.get(close + 2..)?.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some((name, tick * u32::try_from(utime + stime).ok()?))
}

impl CpuSnapshot {
    fn take(pids: &[u32]) -> Self {
        // SAFETY: sysconf only reads a configuration value.
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        let tick = Duration::from_secs(1) / u32::try_from(ticks.max(1)).unwrap_or(100);
        let mut snapshot = Self::default();
        if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
            for task in tasks.flatten() {
                let Some(tid) = task.file_name().to_str().and_then(|s| s.parse().ok()) else {
                    continue;
                };
                if let Some(entry) = std::fs::read_to_string(task.path().join("stat"))
                    .ok()
                    .and_then(|text| parse_stat(&text, tick))
                {
                    snapshot.threads.insert(tid, entry);
                }
            }
        }
        for &pid in pids {
            if let Some((_, time)) = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|text| parse_stat(&text, tick))
            {
                snapshot.processes.insert(pid, time);
            }
        }
        snapshot
    }

    /// CPU used since `before` by thread group (`label` of a thread's id and name) and
    /// process, with `extra` added, largest first.
    fn since(
        &self,
        before: &CpuSnapshot,
        label: impl Fn(u64, &str) -> String,
        process_names: &[(u32, &str)],
        extra: &[(&str, Duration)],
    ) -> Vec<(String, Duration)> {
        let mut groups: BTreeMap<String, Duration> = BTreeMap::new();
        for (tid, (name, time)) in &self.threads {
            let earlier = before.threads.get(tid).map_or(Duration::ZERO, |(_, t)| *t);
            *groups.entry(label(*tid, name)).or_default() += time.saturating_sub(earlier);
        }
        for &(pid, name) in process_names {
            if let (Some(now), Some(earlier)) =
                (self.processes.get(&pid), before.processes.get(&pid))
            {
                *groups.entry(name.to_string()).or_default() += now.saturating_sub(*earlier);
            }
        }
        for &(name, time) in extra {
            *groups.entry(name.to_string()).or_default() += time;
        }
        let mut groups: Vec<(String, Duration)> = groups
            .into_iter()
            .filter(|(_, time)| !time.is_zero())
            .collect();
        groups.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        groups
    }
}

/// The runtime worker threads by kernel id, so that the CPU of a runtime's own threads
/// is told from that of the ZMQ I/O threads its tasks started (which inherit its name).
type RuntimeThreads = Arc<Mutex<BTreeMap<u64, &'static str>>>;

/// A runtime of one worker thread named `name`.
fn runtime(
    name: &'static str,
    threads: &RuntimeThreads,
) -> Result<tokio::runtime::Runtime, RelayBenchError> {
    let threads = threads.clone();
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name(name)
        .on_thread_start(move || {
            threads
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(thread_id(), name);
        })
        .enable_all()
        .build()
        .map_err(|source| RelayBenchError::Spawn { what: name, source })
}

/// Sleeps until `deadline` (a no-op once it has passed).
fn sleep_until(deadline: Instant) {
    let now = Instant::now();
    if deadline > now {
        std::thread::sleep(deadline - now);
    }
}

/// Runs the bench; see the module documentation.
pub fn run_relay_bench(config: &RelayBenchConfig) -> Result<RelayBenchReport, RelayBenchError> {
    if config.engines == 0 {
        return Err(RelayBenchError::Config("at least one engine"));
    }
    match config.pace {
        Pace::Window { batches: 0 } => {
            return Err(RelayBenchError::Config("a window of 0 batches"))
        }
        Pace::Rate { blocks_per_s: 0 } => {
            return Err(RelayBenchError::Config("a rate of 0 blocks/s"))
        }
        _ => {}
    }
    let server = NatsServer::start()?;
    let epoch = Instant::now();

    // Everything an engine publishes is encoded now, before any clock runs.
    let streams: Vec<Arc<Stream>> = (0..config.engines)
        .map(|engine| Arc::new(Stream::generate(config, engine)))
        .collect();
    let stages = stage_costs(config, &streams[0]);

    let tracks: Arc<Vec<Track>> = Arc::new(
        streams
            .iter()
            .map(|stream| Track {
                stream: stream.clone(),
                applied: AtomicU64::new(0),
                engine: OnceLock::new(),
                applied_at: Mutex::new(Vec::new()),
            })
            .collect(),
    );
    let mut state = RouterState::new(config.synthetic.block_size as usize);
    state.set_apply_observer(Some(observer(tracks.clone(), epoch)));
    let state: SharedState = Arc::new(Mutex::new(state));

    let (nats_mode, consume_mode) = match config.transport {
        Transport::Core => (NatsMode::Core, ConsumeMode::Core),
        Transport::JetStream => (
            NatsMode::JetStream {
                stream: STREAM.to_string(),
            },
            ConsumeMode::Replay {
                stream: STREAM.to_string(),
            },
        ),
    };
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let shutdown = |mut stopped: tokio::sync::watch::Receiver<bool>| async move {
        let _ = stopped.wait_for(|stop| *stop).await;
    };

    // The router: subscribed before anything is published.
    let runtime_threads = RuntimeThreads::default();
    let router_rt = runtime("router-rt", &runtime_threads)?;
    let source = router_rt.block_on(NatsSource::connect(NatsSourceConfig {
        subscriber: NatsSubscriberConfig::new(&server.url(), SUBJECT, consume_mode),
        limits: DecodeLimits::default(),
    }))?;
    router_rt.block_on(source.flush())?;
    let router = router_rt.spawn(source.run(state.clone(), shutdown(stopped.clone())));

    // One publisher and one relay per engine.
    let relay_rt = runtime("relay-rt", &runtime_threads)?;
    let mut publishers = Vec::with_capacity(config.engines);
    let mut relays = Vec::with_capacity(config.engines);
    for engine in 0..config.engines {
        let publisher = ZmqPublisher::bind(&PublisherConfig::new(
            "tcp://127.0.0.1:*",
            Some("tcp://127.0.0.1:*"),
        ))?;
        let worker = WorkerId::new(engine as u64 + 1);
        let relay = RelayConfig {
            worker,
            zmq: SubscriberConfig::new(publisher.endpoint(), publisher.replay_endpoint()),
            nats: NatsPublisherConfig::new(&server.url(), SUBJECT, nats_mode.clone()),
            format: match config.nats_format {
                NatsFormat::Json => NatsFormat::Json,
                NatsFormat::Envelope { .. } => NatsFormat::Envelope {
                    publisher_id: worker.get(),
                },
            },
            limits: DecodeLimits::default(),
            publish_attempts: 1,
        };
        relays.push(relay_rt.spawn(run_relay(relay, shutdown(stopped.clone()))));
        publishers.push(publisher);
    }

    // Warm-up: every engine's first batch end to end, which also proves every link is
    // up (a relay that joined late gets it from the replay socket).
    for (publisher, stream) in publishers.iter_mut().zip(&streams) {
        publisher.publish(&stream.payloads[0])?;
    }
    let warm_up = Duration::from_secs(10);
    let started = Instant::now();
    loop {
        let applied = tracks
            .iter()
            .filter(|track| track.applied.load(Ordering::Acquire) >= 1)
            .count();
        if applied == config.engines {
            break;
        }
        if started.elapsed() > warm_up {
            let _ = stop.send(true);
            return Err(RelayBenchError::WarmUp {
                applied,
                engines: config.engines,
                waited: warm_up,
            });
        }
        std::thread::sleep(Duration::from_millis(2));
    }

    // The run: every engine starts at the same instant.
    let barrier = Arc::new(Barrier::new(config.engines + 1));
    let mut engines = Vec::with_capacity(config.engines);
    for (index, mut publisher) in publishers.into_iter().enumerate() {
        let stream = streams[index].clone();
        let tracks = tracks.clone();
        let barrier = barrier.clone();
        let pace = config.pace;
        let engines_n = config.engines as f64;
        let duration = config.duration;
        let thread = std::thread::Builder::new()
            .name(format!("engine-{index}"))
            .spawn(move || {
                let track = &tracks[index];
                let _ = track.engine.set(std::thread::current());
                let mut published = Published {
                    batches: 1,
                    at: vec![0],
                    ..Published::default()
                };
                barrier.wait();
                let cpu_start = thread_cpu_time();
                let start = Instant::now();
                let end = start + duration;
                let mut scheduled_blocks = 0u64;
                loop {
                    let now = Instant::now();
                    if now >= end {
                        break;
                    }
                    let k = published.batches;
                    match pace {
                        Pace::Window { batches } => {
                            while k - track.applied.load(Ordering::Acquire) > batches as u64 {
                                // Unparked by the observer; the timeout is a backstop.
                                std::thread::park_timeout(Duration::from_millis(1));
                            }
                        }
                        Pace::Rate { blocks_per_s } => {
                            let per_engine = blocks_per_s as f64 / engines_n;
                            let due = start
                                + Duration::from_secs_f64(scheduled_blocks as f64 / per_engine);
                            sleep_until(due);
                            published.behind_max = published
                                .behind_max
                                .max(Instant::now().saturating_duration_since(due));
                            published
                                .due
                                .push(due.duration_since(epoch).as_nanos() as u64);
                            scheduled_blocks += stream.blocks[(k % stream.len()) as usize];
                        }
                    }
                    let payload = &stream.payloads[(k % stream.len()) as usize];
                    published.at.push(epoch.elapsed().as_nanos() as u64);
                    if let Err(error) = publisher.publish(payload) {
                        published.cpu = thread_cpu_time().saturating_sub(cpu_start);
                        return (published, publisher, Some(error));
                    }
                    published.bytes += payload.len() as u64;
                    published.batches += 1;
                }
                // The publisher lives until the router has everything (its replay socket
                // may still be asked).
                published.cpu = thread_cpu_time().saturating_sub(cpu_start);
                (published, publisher, None)
            })
            .map_err(|source| RelayBenchError::Spawn {
                what: "an engine thread",
                source,
            })?;
        engines.push(thread);
    }
    let pids: Vec<u32> = server.pid().into_iter().collect();
    let cpu_before = CpuSnapshot::take(&pids);
    barrier.wait();
    let mut published = Vec::with_capacity(config.engines);
    let mut keep_alive = Vec::with_capacity(config.engines);
    let mut publish_error = None;
    for thread in engines {
        let (done, publisher, error) = match thread.join() {
            Ok(joined) => joined,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        published.push(done);
        keep_alive.push(publisher);
        publish_error = publish_error.or(error);
    }
    if let Some(error) = publish_error {
        let _ = stop.send(true);
        return Err(error.into());
    }

    // Drain: wait until the router has applied every batch published.
    let drain_start = Instant::now();
    while drain_start.elapsed() < config.drain_timeout
        && tracks
            .iter()
            .zip(&published)
            .any(|(track, done)| track.applied.load(Ordering::Acquire) < done.batches)
    {
        std::thread::sleep(Duration::from_millis(1));
    }
    let main_thread = u64::from(std::process::id());
    let main_name = cpu_before
        .threads
        .get(&main_thread)
        .map(|(name, _)| name.clone())
        .unwrap_or_default();
    let workers = runtime_threads
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let engines_cpu: Duration = published.iter().map(|done| done.cpu).sum();
    let label = |tid: u64, name: &str| -> String {
        if tid == main_thread {
            "main".to_string()
        } else if let Some(runtime) = workers.get(&tid) {
            (*runtime).to_string()
        } else if name == main_name {
            // The engines' publishers were bound on the main thread.
            "engine-zmq-io".to_string()
        } else if name == "relay-rt" {
            // The relays create their subscribers on their runtime.
            "relay-zmq-io".to_string()
        } else {
            name.trim_end_matches(|c: char| c.is_ascii_digit())
                .trim_end_matches(['-', '/'])
                .to_string()
        }
    };
    let cpu = CpuSnapshot::take(&pids).since(
        &cpu_before,
        label,
        &[(pids.first().copied().unwrap_or(0), "nats-server")],
        &[("engines", engines_cpu)],
    );

    let _ = stop.send(true);
    let mut relay = RelayStats::default();
    for task in relays {
        if let Ok(Ok(stats)) = relay_rt.block_on(task) {
            relay.batches += stats.batches;
            relay.events += stats.events;
            relay.blocks += stats.blocks;
            relay.messages += stats.messages;
            relay.publish_failures += stats.publish_failures;
            relay.restarts += stats.restarts;
            relay.lost_batches += stats.lost_batches;
            for (reason, count) in stats.dropped {
                *relay.dropped.entry(reason).or_default() += count;
            }
        }
    }
    let source = router_rt
        .block_on(router)
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    drop(keep_alive);

    // Figures, warm-up batch left out.
    let mut latencies = Vec::new();
    let mut from_due = Vec::new();
    let (mut batches, mut events, mut blocks, mut batches_applied, mut blocks_applied) =
        (0, 0, 0, 0, 0);
    let (mut first_publish, mut last_apply) = (u64::MAX, 0u64);
    let mut behind_schedule_max = Duration::ZERO;
    let mut engine_bytes = 0;
    for ((track, done), stream) in tracks.iter().zip(&published).zip(&streams) {
        let applied_at = track
            .applied_at
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        behind_schedule_max = behind_schedule_max.max(done.behind_max);
        engine_bytes += done.bytes;
        for k in 1..done.batches {
            let blocks_k = stream.blocks[(k % stream.len()) as usize];
            batches += 1;
            events += stream.events_of(k);
            blocks += blocks_k;
            first_publish = first_publish.min(done.at[k as usize]);
            if let Some(&applied) = applied_at.get(k as usize) {
                batches_applied += 1;
                blocks_applied += blocks_k;
                last_apply = last_apply.max(applied);
                latencies.push(Duration::from_nanos(
                    applied.saturating_sub(done.at[k as usize]),
                ));
                // `due` has no entry for the warm-up batch.
                if let Some(&due) = done.due.get(k as usize - 1) {
                    from_due.push(Duration::from_nanos(applied.saturating_sub(due)));
                }
            }
        }
    }
    let router_dropped = lock(&state).metrics().dropped_total();
    Ok(RelayBenchReport {
        config: config.clone(),
        elapsed: Duration::from_nanos(last_apply.saturating_sub(first_publish)),
        batches,
        events,
        blocks,
        batches_applied,
        blocks_applied,
        nats_messages: relay.messages,
        engine_bytes,
        latency: LatencySummary::of(latencies),
        behind_schedule_max,
        latency_from_due: match config.pace {
            Pace::Rate { .. } => Some(LatencySummary::of(from_due)),
            Pace::Window { .. } => None,
        },
        router_dropped,
        relay,
        source,
        cpu,
        stages,
    })
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

    #[test]
    fn percentiles_are_taken_from_the_sorted_samples() {
        let summary = LatencySummary::of((1..=1000).rev().map(Duration::from_micros).collect());
        assert_eq!(summary.samples, 1000);
        assert_eq!(summary.p50, Duration::from_micros(501));
        assert_eq!(summary.p99, Duration::from_micros(990));
        assert_eq!(summary.max, Duration::from_micros(1000));
        assert_eq!(LatencySummary::of(Vec::new()), LatencySummary::default());
    }

    #[test]
    fn proc_stat_lines_give_the_name_and_cpu_time() {
        let line = "4242 (relay (rt) 1) S 1 2 3 4 5 6 7 8 9 10 150 50 0 0 20 0 1 0 100 0 0";
        assert_eq!(
            parse_stat(line, Duration::from_millis(10)),
            Some(("relay (rt) 1".to_string(), Duration::from_secs(2)))
        );
        assert_eq!(parse_stat("garbage", Duration::from_millis(10)), None);
    }
}
