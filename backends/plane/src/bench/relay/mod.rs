//! `kvtwin bench relay`: the event plane under load on loopback, engine to router.
//!
//! Owns: [`RelayBenchConfig`] (with [`Pace`] and [`Transport`]), [`run_relay_bench`]
//! (`run.rs`: the pipeline and the timing loop), its [`RelayBenchReport`] (`report.rs`:
//! the JSON line and the table), the engines' pre-encoded streams and the stage costs
//! (`stream.rs`), and the CPU accounting per thread group (`cpu.rs`). The
//! pipeline is the one a deployment runs: N synthetic engines (a thread each, a
//! `ZmqPublisher` each, vLLM batches encoded before the clock starts) → one relay per
//! engine (`run_relay`, ZMQ → NATS) → its own `nats-server` (`NatsServer`) → a router
//! (`NatsSource` applying to a `RouterState`). Relays and router each run on a tokio
//! runtime of their own, so the CPU each takes can be told apart.
//!
//! What is measured, and how:
//! - *Block events* are blocks stored plus blocks removed, counted when the router has
//!   applied them; throughput is those over the wall time from the first publish to the
//!   last apply.
//! - *Added latency* is per engine batch: from the engine thread's clock just before the
//!   publish to the router's clock right after the batch's last event is applied (a
//!   `RouterState::set_apply_observer` hook; both clocks are this process's
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

//! Built with feature `testing`: it starts its own `nats-server` through the harness.

mod cpu;
mod report;
mod run;
mod stream;

pub use report::RelayBenchReport;
pub use run::run_relay_bench;

use crate::nats::NatsError;
use crate::service::relay::{NatsFormat, RelayError};
use crate::service::synthetic::SyntheticConfig;
use crate::wire::EngineFormat;
use crate::zmq::ZmqError;
use std::time::Duration;

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

/// Single-threaded cost per block of each stage, on one engine's batches.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StageCosts {
    /// Blocks (stored plus removed) in the batches timed.
    pub blocks: u64,
    /// Each stage's name and nanoseconds per block.
    pub ns_per_block: Vec<(&'static str, f64)>,
}
