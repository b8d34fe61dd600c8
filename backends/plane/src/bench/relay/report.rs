//! The relay bench's report: what a run measured, as one JSON line and as a table.
//!
//! Owns: [`RelayBenchReport`], its JSON field names (stable: scripts compare them) and
//! its table. Never: measure anything (`run.rs` does).

use super::{Pace, RelayBenchConfig, StageCosts, Transport};
use crate::service::nats_source::NatsSourceStats;
use crate::service::relay::{NatsFormat, RelayStats};
use kvtwin::stats::LatencySummary;
use serde_json::{json, Value};
use std::time::Duration;

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
