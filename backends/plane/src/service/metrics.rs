//! The router service's counters and their Prometheus text.
//!
//! Owns: [`Metrics`] (events applied, dropped by reason, stream gaps, replays, lost
//! batches, publisher restarts, source reconnects, route decisions and their hit blocks,
//! an apply-latency histogram) and [`Histogram`]. Drop
//! reasons are the stable labels of the errors that caused them (`WireError::reason`,
//! `FrameError::reason`, `TranslateError::reason`, the indexer's refusals), kept in a
//! `BTreeMap` so the text comes out in the same order every time.
//! Never: read a clock (callers time and record), or hold a lock (it lives inside the
//! router state's).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Duration;

/// Upper bounds of the apply-latency buckets, in seconds.
const LATENCY_BUCKETS_S: [f64; 12] = [
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3, 2.5e-2,
];

/// A Prometheus-style histogram of durations.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Histogram {
    /// Observations at or under each bound of `LATENCY_BUCKETS_S` (not cumulative).
    buckets: [u64; 12],
    /// Observations above the last bound.
    over: u64,
    count: u64,
    sum_s: f64,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&mut self, value: Duration) {
        let seconds = value.as_secs_f64();
        match LATENCY_BUCKETS_S.iter().position(|bound| seconds <= *bound) {
            Some(index) => self.buckets[index] += 1,
            None => self.over += 1,
        }
        self.count += 1;
        self.sum_s += seconds;
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Sum of the observations, seconds.
    pub fn sum_seconds(&self) -> f64 {
        self.sum_s
    }

    /// An upper estimate of the `q` quantile (0 to 1), seconds: the bound of the first
    /// bucket where the cumulative count reaches `q` of all observations; infinity when
    /// that is above the last bound (25 ms), `None` with no observations.
    pub fn quantile_seconds(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let wanted = (q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64;
        let mut cumulative = 0;
        for (bound, count) in LATENCY_BUCKETS_S.iter().zip(self.buckets) {
            cumulative += count;
            if cumulative >= wanted.max(1) {
                return Some(*bound);
            }
        }
        Some(f64::INFINITY)
    }

    fn render(&self, name: &str, out: &mut String) {
        let mut cumulative = 0;
        for (bound, count) in LATENCY_BUCKETS_S.iter().zip(self.buckets) {
            cumulative += count;
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound:e}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum {}", self.sum_s);
        let _ = writeln!(out, "{name}_count {}", self.count);
    }
}

/// What the router service has done; see the module documentation.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Metrics {
    /// Events applied to the index.
    pub events_applied: u64,
    /// Events handed to the state by the sources (applied or refused): with nothing
    /// refused before decoding, every event a source carried.
    pub events_received: u64,
    /// Batches (messages) received from sources.
    pub batches: u64,
    /// Gaps in a source's sequence.
    pub gaps: u64,
    /// Batches recovered through replay.
    pub replayed: u64,
    /// Batches neither the stream nor replay supplied.
    pub lost_batches: u64,
    /// Publisher (engine) restarts: the worker was cleared.
    pub restarts: u64,
    /// Reconnects of the sources' connections (NATS).
    pub reconnects: u64,
    /// Route decisions recorded.
    pub routes: u64,
    /// Full blocks in the queries of those.
    pub route_query_blocks: u64,
    /// Of those, blocks the chosen worker already held (its overlap): hit ratio is this
    /// over `route_query_blocks`.
    pub route_hit_blocks: u64,
    dropped: BTreeMap<&'static str, u64>,
    /// Time to apply one batch of events to the index.
    pub apply_latency: Histogram,
}

impl Metrics {
    /// Counts one thing dropped for `reason`.
    pub fn drop_one(&mut self, reason: &'static str) {
        *self.dropped.entry(reason).or_default() += 1;
    }

    /// Dropped things by reason, in reason order.
    pub fn dropped(&self) -> &BTreeMap<&'static str, u64> {
        &self.dropped
    }

    /// Everything dropped, all reasons.
    pub fn dropped_total(&self) -> u64 {
        self.dropped.values().sum()
    }

    /// The Prometheus text exposition, with `gauges` (name, help, labelled values)
    /// appended: the state's sizes, which the metrics do not hold.
    pub fn render(&self, gauges: &[Gauge]) -> String {
        self.render_with(&[], gauges)
    }

    /// [`Metrics::render`] with `counters` too: labelled counters kept elsewhere (per
    /// worker rank), written with `# TYPE .. counter`.
    pub fn render_with(&self, counters: &[Gauge], gauges: &[Gauge]) -> String {
        let mut out = String::new();
        let counter = |out: &mut String, name: &str, help: &str, value: u64| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} counter");
            let _ = writeln!(out, "{name} {value}");
        };
        counter(
            &mut out,
            "kvtwin_router_events_applied_total",
            "KV events applied to the index.",
            self.events_applied,
        );
        counter(
            &mut out,
            "kvtwin_router_events_received_total",
            "KV events handed to the index by the sources, applied or refused.",
            self.events_received,
        );
        counter(
            &mut out,
            "kvtwin_router_batches_total",
            "Event batches received from the sources.",
            self.batches,
        );
        let _ = writeln!(
            out,
            "# HELP kvtwin_router_events_dropped_total Messages, batches or events refused, by reason."
        );
        let _ = writeln!(out, "# TYPE kvtwin_router_events_dropped_total counter");
        for (reason, count) in &self.dropped {
            let _ = writeln!(
                out,
                "kvtwin_router_events_dropped_total{{reason=\"{reason}\"}} {count}"
            );
        }
        counter(
            &mut out,
            "kvtwin_router_sequence_gaps_total",
            "Gaps in a source's sequence numbers.",
            self.gaps,
        );
        counter(
            &mut out,
            "kvtwin_router_replayed_batches_total",
            "Batches recovered through replay.",
            self.replayed,
        );
        counter(
            &mut out,
            "kvtwin_router_lost_batches_total",
            "Batches neither the stream nor replay supplied.",
            self.lost_batches,
        );
        counter(
            &mut out,
            "kvtwin_router_restarts_total",
            "Engine restarts (sequence went back); the worker was cleared.",
            self.restarts,
        );
        counter(
            &mut out,
            "kvtwin_router_source_reconnects_total",
            "Reconnects of the event sources' connections.",
            self.reconnects,
        );
        counter(
            &mut out,
            "kvtwin_router_routes_total",
            "Route decisions answered.",
            self.routes,
        );
        counter(
            &mut out,
            "kvtwin_router_route_query_blocks_total",
            "Full blocks in the routed queries.",
            self.route_query_blocks,
        );
        counter(
            &mut out,
            "kvtwin_router_route_hit_blocks_total",
            "Query blocks the chosen worker already held.",
            self.route_hit_blocks,
        );
        let name = "kvtwin_router_apply_seconds";
        let _ = writeln!(out, "# HELP {name} Time to apply one batch of events.");
        let _ = writeln!(out, "# TYPE {name} histogram");
        self.apply_latency.render(name, &mut out);
        let typed = counters
            .iter()
            .map(|c| (c, "counter"))
            .chain(gauges.iter().map(|g| (g, "gauge")));
        for (gauge, kind) in typed {
            let _ = writeln!(out, "# HELP {} {}", gauge.name, gauge.help);
            let _ = writeln!(out, "# TYPE {} {kind}", gauge.name);
            for (labels, value) in &gauge.values {
                if labels.is_empty() {
                    let _ = writeln!(out, "{} {value}", gauge.name);
                } else {
                    let _ = writeln!(out, "{}{{{labels}}} {value}", gauge.name);
                }
            }
        }
        out
    }
}

/// A gauge (or, for [`Metrics::render_with`], a counter): values with their label text
/// (`tier="device"`).
#[derive(Clone, Debug, PartialEq)]
pub struct Gauge {
    /// Metric name.
    pub name: &'static str,
    /// Help text.
    pub help: &'static str,
    /// (labels, value) pairs; empty labels for an unlabelled value.
    pub values: Vec<(String, u64)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_is_prometheus_exposition_with_cumulative_buckets() {
        let mut metrics = Metrics {
            events_applied: 3,
            ..Metrics::default()
        };
        metrics.drop_one("malformed_msgpack");
        metrics.drop_one("malformed_msgpack");
        metrics.drop_one("unknown_medium");
        metrics.apply_latency.observe(Duration::from_nanos(800));
        metrics.apply_latency.observe(Duration::from_micros(30));
        metrics.apply_latency.observe(Duration::from_secs(1));
        let text = metrics.render(&[Gauge {
            name: "kvtwin_router_workers",
            help: "Worker ranks known.",
            values: vec![(String::new(), 2)],
        }]);
        assert!(text.contains("kvtwin_router_events_applied_total 3\n"));
        assert!(
            text.contains("kvtwin_router_events_dropped_total{reason=\"malformed_msgpack\"} 2\n")
        );
        assert!(text.contains("kvtwin_router_events_dropped_total{reason=\"unknown_medium\"} 1\n"));
        assert!(text.contains("kvtwin_router_apply_seconds_bucket{le=\"1e-6\"} 1\n"));
        assert!(text.contains("kvtwin_router_apply_seconds_bucket{le=\"5e-5\"} 2\n"));
        assert!(text.contains("kvtwin_router_apply_seconds_bucket{le=\"+Inf\"} 3\n"));
        assert!(text.contains("kvtwin_router_apply_seconds_count 3\n"));
        assert!(text.contains("# TYPE kvtwin_router_workers gauge\nkvtwin_router_workers 2\n"));
        assert_eq!(metrics.dropped_total(), 3);
    }

    #[test]
    fn the_quantile_is_the_bound_where_the_cumulative_count_reaches_it() {
        let mut histogram = Histogram::default();
        assert_eq!(histogram.quantile_seconds(0.99), None);
        for _ in 0..99 {
            histogram.observe(Duration::from_nanos(500));
        }
        histogram.observe(Duration::from_micros(40));
        assert_eq!(histogram.quantile_seconds(0.99), Some(1e-6));
        assert_eq!(histogram.quantile_seconds(1.0), Some(5e-5));
        histogram.observe(Duration::from_secs(1));
        histogram.observe(Duration::from_secs(1));
        assert_eq!(histogram.quantile_seconds(0.99), Some(f64::INFINITY));
    }
}
