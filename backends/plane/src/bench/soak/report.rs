//! What a soak found: the counts, the kills, RSS per process and the verdicts, as one
//! JSON line and as a table.
//!
//! Owns: [`SoakReport`], [`Verdict`], [`ProcessRss`], `KillRecord` and `judge_rss`.
//! Never: decide whether to exit non-zero (the command line does, from
//! [`SoakReport::passed`]).

use super::schedule::{Target, Windows};
use super::{Chaos, SoakConfig};
use serde_json::{json, Value};
use std::time::Duration;

/// One check and its outcome.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// `state`, `acknowledged` or `rss`.
    pub name: &'static str,
    /// Whether it held.
    pub passed: bool,
    /// What was compared.
    pub detail: String,
}

/// One process's memory over the run (its last life: the one alive at the end).
#[derive(Clone, Debug, PartialEq)]
pub struct ProcessRss {
    /// `nats-server`, `relay-N`, `router` or `soak`.
    pub process: String,
    /// Times it was started (1 + restarts).
    pub lives: u32,
    /// Mean RSS over the window after its last life's warm-up, KiB.
    pub after_warm_up_kib: Option<u64>,
    /// Mean RSS over the run's last window, KiB.
    pub last_window_kib: Option<u64>,
    /// Highest RSS sampled in its last life, KiB.
    pub peak_kib: u64,
    /// The highest last-window / after-warm-up ratio that passes ([`RssBound`]); `None`
    /// for the soak process itself (reported, not judged).
    pub bound: Option<f64>,
}

impl ProcessRss {
    /// Last window over after warm-up, when both were sampled.
    pub fn ratio(&self) -> Option<f64> {
        match (self.after_warm_up_kib, self.last_window_kib) {
            (Some(warm), Some(last)) if warm > 0 => Some(last as f64 / warm as f64),
            _ => None,
        }
    }

    /// Whether it is judged at all.
    pub fn judged(&self) -> bool {
        self.bound.is_some()
    }

    /// Within its bound above its after-warm-up figure (or not judged).
    pub fn passed(&self) -> bool {
        match self.bound {
            None => true,
            Some(bound) => self.ratio().is_some_and(|ratio| ratio <= bound),
        }
    }
}

/// One `kill -9` carried out.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct KillRecord {
    pub(super) target: Target,
    /// When it was killed, from the start of publishing.
    pub(super) at: Duration,
    /// From the kill until every engine's events reached the router again.
    pub(super) recovered_after: Duration,
}

/// What the soak measured; see the module documentation of `bench::soak`.
#[derive(Clone, Debug, PartialEq)]
pub struct SoakReport {
    /// What ran.
    pub config: SoakConfig,
    /// How long the engines published.
    pub elapsed: Duration,
    /// From the engines' stop until the router matched them.
    pub drain: Duration,
    /// Engine batches, events and blocks (stored plus removed) published.
    pub batches_sent: u64,
    /// Events published by the engines.
    pub events_sent: u64,
    /// Blocks in them.
    pub blocks_sent: u64,
    /// Events the relays had a JetStream ack for, every relay process summed.
    pub events_acked: u64,
    /// NATS publishes that failed after every retry.
    pub publish_failures: u64,
    /// Engine batches the relays could not get (live or by replay).
    pub relay_lost_batches: u64,
    /// Messages and events in the JetStream stream at the end.
    pub stream_messages: u64,
    /// Events in them.
    pub stream_events: u64,
    /// Events the router (its last life) received and applied.
    pub router_events_received: u64,
    /// Of those, applied whole.
    pub router_events_applied: u64,
    /// Batches the engines' replay sockets sent (to relays catching up).
    pub zmq_replayed_batches: u64,
    /// Stream messages a restarted router replayed (the stream's size at each restart).
    pub jetstream_replayed_messages: u64,
    /// NATS reconnects: relays (every process summed) and router (every life summed).
    pub relay_reconnects: u64,
    /// Router reconnects.
    pub router_reconnects: u64,
    pub(super) kills: Vec<KillRecord>,
    /// Per process, its memory.
    pub rss: Vec<ProcessRss>,
    /// The checks.
    pub verdicts: Vec<Verdict>,
}

impl SoakReport {
    /// Whether every verdict held.
    pub fn passed(&self) -> bool {
        self.verdicts.iter().all(|verdict| verdict.passed)
    }

    /// The kills carried out.
    pub fn kill_count(&self) -> usize {
        self.kills.len()
    }

    /// Restarts of `process` (its lives less one).
    fn restarts(&self, process: &str) -> u32 {
        self.rss
            .iter()
            .filter(|rss| {
                rss.process == process || (process == "relay" && rss.process.starts_with("relay-"))
            })
            .map(|rss| rss.lives.saturating_sub(1))
            .sum()
    }

    /// The report as one JSON object.
    pub fn to_json(&self) -> Value {
        let seconds = |d: Duration| (d.as_secs_f64() * 1000.0).round() / 1000.0;
        json!({
            "bench": "soak",
            "seconds": seconds(self.config.duration),
            "engines": self.config.engines,
            "rate_blocks_per_s": self.config.rate_blocks_per_s,
            "capacity_blocks": self.config.capacity_blocks,
            "seed": self.config.seed,
            "chaos": self.config.chaos == Chaos::On,
            "passed": self.passed(),
            "events": {
                "sent": self.events_sent,
                "acked": self.events_acked,
                "in_stream": self.stream_events,
                "received": self.router_events_received,
                "applied": self.router_events_applied,
            },
            "batches_sent": self.batches_sent,
            "blocks_sent": self.blocks_sent,
            "stream_messages": self.stream_messages,
            "replayed": {
                "zmq_batches": self.zmq_replayed_batches,
                "jetstream_messages": self.jetstream_replayed_messages,
            },
            "publish_failures": self.publish_failures,
            "relay_lost_batches": self.relay_lost_batches,
            "reconnects": { "relays": self.relay_reconnects, "router": self.router_reconnects },
            "kills": self.kills.iter().map(|kill| json!({
                "target": kill.target.to_string(),
                "at_s": seconds(kill.at),
                "recovered_after_s": seconds(kill.recovered_after),
            })).collect::<Vec<_>>(),
            "restarts": {
                "nats-server": self.restarts("nats-server"),
                "relays": self.restarts("relay"),
                "router": self.restarts("router"),
            },
            "drain_s": seconds(self.drain),
            "rss": self.rss.iter().map(|rss| json!({
                "process": rss.process,
                "lives": rss.lives,
                "after_warm_up_kib": rss.after_warm_up_kib,
                "last_window_kib": rss.last_window_kib,
                "peak_kib": rss.peak_kib,
                "ratio": rss.ratio().map(|r| (r * 1000.0).round() / 1000.0),
                "judged": rss.judged(),
                "bound": rss.bound,
            })).collect::<Vec<_>>(),
            "verdicts": self.verdicts.iter().map(|v| (v.name.to_string(), json!({
                "passed": v.passed,
                "detail": v.detail,
            }))).collect::<serde_json::Map<_, _>>(),
        })
    }
}

impl std::fmt::Display for SoakReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "soak: {:.0} s, {} engines, {} blocks/s, seed {}, chaos {}",
            self.config.duration.as_secs_f64(),
            self.config.engines,
            self.config.rate_blocks_per_s,
            self.config.seed,
            if self.config.chaos == Chaos::On {
                "on"
            } else {
                "off"
            }
        )?;
        writeln!(
            f,
            "events: sent {}, acked {}, in stream {}, router received {} (applied {})",
            self.events_sent,
            self.events_acked,
            self.stream_events,
            self.router_events_received,
            self.router_events_applied
        )?;
        writeln!(
            f,
            "replayed: {} ZMQ batches, {} JetStream messages; reconnects: relays {}, router {}; drain {:.1} s",
            self.zmq_replayed_batches,
            self.jetstream_replayed_messages,
            self.relay_reconnects,
            self.router_reconnects,
            self.drain.as_secs_f64()
        )?;
        for kill in &self.kills {
            writeln!(
                f,
                "kill -9 {:<12} at {:>6.1} s, recovered after {:.1} s",
                kill.target.to_string(),
                kill.at.as_secs_f64(),
                kill.recovered_after.as_secs_f64()
            )?;
        }
        writeln!(
            f,
            "{:<12} {:>5} {:>14} {:>14} {:>10} {:>7}",
            "process", "lives", "warm-up KiB", "last KiB", "peak KiB", "ratio"
        )?;
        let kib = |v: Option<u64>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
        for rss in &self.rss {
            writeln!(
                f,
                "{:<12} {:>5} {:>14} {:>14} {:>10} {:>7}{}",
                rss.process,
                rss.lives,
                kib(rss.after_warm_up_kib),
                kib(rss.last_window_kib),
                rss.peak_kib,
                rss.ratio()
                    .map_or_else(|| "-".to_string(), |r| format!("{r:.3}")),
                match rss.bound {
                    Some(bound) => format!(" (bound {bound:.2})"),
                    None => " (not judged)".to_string(),
                }
            )?;
        }
        for verdict in &self.verdicts {
            writeln!(
                f,
                "{} {}: {}",
                if verdict.passed { "PASS" } else { "FAIL" },
                verdict.name,
                verdict.detail
            )?;
        }
        Ok(())
    }
}

/// One life of a process: when it started and its RSS samples (time from the start of
/// publishing, KiB).
#[derive(Clone, Debug, Default)]
pub(super) struct Life {
    pub(super) started: Duration,
    pub(super) samples: Vec<(Duration, u64)>,
}

/// How much a process's RSS may grow from after warm-up to the last window.
pub(super) struct RssBound;

impl RssBound {
    /// kvtwin's own processes (router, relays): 10 %, the bound; their state is
    /// bounded by the engines' caches, so growth past noise is a leak.
    pub(super) const KVTWIN: f64 = 1.10;
    /// The nats-server: 2x. It is a Go program (GOGC=100 lets its heap reach twice the
    /// live data before a collection, and freed pages go back to the OS slowly), and its
    /// JetStream stream grows through the run by design (the router's rebuild after a
    /// kill replays it from the start): measured at 100 blocks/s, its RSS rose in steps
    /// of 4-8 MiB (23.5 -> 31.1 MiB over 5 minutes) with nothing leaking. A bound of 2x
    /// still catches a server that grows without limit.
    pub(super) const NATS_SERVER: f64 = 2.0;

    /// The bound of `process` (`None`: not judged).
    pub(super) fn of(process: &str) -> Option<f64> {
        match process {
            "soak" => None,
            "nats-server" => Some(Self::NATS_SERVER),
            _ => Some(Self::KVTWIN),
        }
    }
}

/// A process's RSS figures from its lives (the last one is judged, against `bound`).
pub(super) fn judge_rss(
    process: &str,
    lives: &[Life],
    windows: &Windows,
    bound: Option<f64>,
) -> ProcessRss {
    let last = lives.last().cloned().unwrap_or_default();
    let mean = |from: Duration, to: Duration| -> Option<u64> {
        let picked: Vec<u64> = last
            .samples
            .iter()
            .filter(|(at, _)| *at >= from && *at <= to)
            .map(|(_, kib)| *kib)
            .collect();
        (!picked.is_empty()).then(|| picked.iter().sum::<u64>() / picked.len() as u64)
    };
    let (from, to) = windows.after_warm_up(last.started);
    ProcessRss {
        process: process.to_string(),
        lives: lives.len() as u32,
        after_warm_up_kib: mean(from, to),
        last_window_kib: mean(windows.last_start(), windows.duration),
        peak_kib: last.samples.iter().map(|(_, kib)| *kib).max().unwrap_or(0),
        bound,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn life(started: u64, samples: &[(u64, u64)]) -> Life {
        Life {
            started: Duration::from_secs(started),
            samples: samples
                .iter()
                .map(|&(at, kib)| (Duration::from_secs(at), kib))
                .collect(),
        }
    }

    #[test]
    fn rss_is_judged_on_the_last_life_growth_only() {
        let windows = Windows::of(Duration::from_secs(20));
        // Warm-up window [5, 7], last window [15, 20].
        let steady = life(0, &[(1, 10), (5, 100), (6, 100), (16, 105), (19, 109)]);
        let rss = judge_rss("router", &[steady], &windows, RssBound::of("router"));
        assert_eq!(
            (rss.after_warm_up_kib, rss.last_window_kib),
            (Some(100), Some(107))
        );
        assert!(rss.passed());
        let leak = life(0, &[(5, 100), (7, 100), (16, 150), (20, 170)]);
        assert!(!judge_rss(
            "router",
            std::slice::from_ref(&leak),
            &windows,
            RssBound::of("router")
        )
        .passed());
        // The soak process is reported, not judged.
        assert!(judge_rss(
            "soak",
            std::slice::from_ref(&leak),
            &windows,
            RssBound::of("soak")
        )
        .passed());
        // The nats-server may double (Go's heap), not more.
        let doubled = life(0, &[(5, 100), (7, 100), (16, 190), (20, 200)]);
        assert!(judge_rss(
            "nats-server",
            &[doubled],
            &windows,
            RssBound::of("nats-server")
        )
        .passed());
        let runaway = life(0, &[(5, 100), (7, 100), (16, 250), (20, 300)]);
        assert!(!judge_rss(
            "nats-server",
            &[runaway],
            &windows,
            RssBound::of("nats-server")
        )
        .passed());
        // What fails the router passes the nats-server.
        assert!(judge_rss(
            "nats-server",
            &[leak],
            &windows,
            RssBound::of("nats-server")
        )
        .passed());
        // A drop passes; a restarted life is judged from its own warm-up ([15, 17]).
        let first = life(0, &[(5, 500)]);
        let second = life(12, &[(13, 50), (15, 80), (17, 82), (20, 60)]);
        let rss = judge_rss(
            "relay-1",
            &[first, second],
            &windows,
            RssBound::of("relay-1"),
        );
        assert_eq!(rss.lives, 2);
        assert_eq!(rss.after_warm_up_kib, Some(81));
        assert_eq!(rss.peak_kib, 82);
        assert!(rss.passed());
        // Nothing sampled: cannot pass.
        assert!(!judge_rss("router", &[life(0, &[])], &windows, RssBound::of("router")).passed());
    }
}
