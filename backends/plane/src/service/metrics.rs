//! The router service's counters and their exposition through `prometheus-client`.
//!
//! Owns: [`Metrics`] (events applied, dropped by reason, stream gaps, replays, lost
//! batches, publisher restarts, route decisions and their hit blocks, an apply-latency
//! histogram), [`Histogram`], the typed label sets ([`WorkerLabels`], [`ReasonLabels`],
//! [`TierLabels`], [`SourceLabels`]) and [`Exposition`], which writes families in the
//! order they are added. Drop reasons are the stable labels of the errors that caused
//! them (`WireError::reason`, `FrameError::reason`, `TranslateError::reason`, the
//! indexer's refusals), kept in a `BTreeMap`.
//!
//! Why families are built at scrape time instead of kept as live `prometheus-client`
//! metrics: the counts already live in the router state under its one lock (every update
//! is there anyway), and `prometheus_client::metrics::family::Family` keeps label sets in
//! a hash map, so its text would come out in a different order on every run. Here each
//! scrape takes the counts under the lock, in key order, and `prometheus-client` writes
//! the OpenMetrics text (names, types, `_total` suffixes, label escaping, `# EOF`).
//! Never: read a clock (callers time and record), or hold a lock (it lives inside the
//! router state's).

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::time::Duration;

/// The `Content-Type` of [`Exposition::finish`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Upper bounds of the apply-latency buckets, in seconds.
pub const APPLY_LATENCY_BUCKETS_S: &[f64] = &[
    1e-6, 2.5e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3, 2.5e-2,
];

/// vLLM's time-to-first-token buckets, in seconds (`vllm:time_to_first_token_seconds`,
/// vllm/v1/metrics/loggers.py), so a dashboard built for vLLM reads the router's alike.
pub const TTFT_BUCKETS_S: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];

/// vLLM's inter-token-latency buckets, in seconds (`vllm:inter_token_latency_seconds`).
pub const ITL_BUCKETS_S: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];

/// vLLM's end-to-end request latency buckets, in seconds
/// (`vllm:e2e_request_latency_seconds`).
pub const E2E_BUCKETS_S: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// A Prometheus-style histogram of durations over fixed bucket bounds.
#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    /// Upper bounds of the buckets, seconds, ascending.
    bounds: &'static [f64],
    /// Observations at or under each bound (not cumulative), one per bound.
    buckets: Vec<u64>,
    /// Observations above the last bound.
    over: u64,
    count: u64,
    sum_s: f64,
}

impl Default for Histogram {
    /// Over [`APPLY_LATENCY_BUCKETS_S`].
    fn default() -> Self {
        Self::new(APPLY_LATENCY_BUCKETS_S)
    }
}

impl Histogram {
    /// No observations yet, over `bounds` (seconds, ascending).
    pub fn new(bounds: &'static [f64]) -> Self {
        debug_assert!(bounds.windows(2).all(|pair| pair[0] < pair[1]));
        Self {
            bounds,
            buckets: vec![0; bounds.len()],
            over: 0,
            count: 0,
            sum_s: 0.0,
        }
    }

    /// Records one observation.
    pub fn observe(&mut self, value: Duration) {
        let seconds = value.as_secs_f64();
        match self.bounds.iter().position(|bound| seconds <= *bound) {
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
    /// that is above the last bound, `None` with no observations.
    pub fn quantile_seconds(&self, q: f64) -> Option<f64> {
        if self.count == 0 {
            return None;
        }
        let wanted = (q.clamp(0.0, 1.0) * self.count as f64).ceil() as u64;
        let mut cumulative = 0;
        for (bound, count) in self.bounds.iter().zip(&self.buckets) {
            cumulative += count;
            if cumulative >= wanted.max(1) {
                return Some(*bound);
            }
        }
        Some(f64::INFINITY)
    }

    /// (upper bound, observations in that bucket alone), the last bound `f64::MAX`
    /// (written `+Inf`): what `prometheus-client` makes cumulative.
    fn buckets(&self) -> Vec<(f64, u64)> {
        self.bounds
            .iter()
            .copied()
            .zip(self.buckets.iter().copied())
            .chain([(f64::MAX, self.over)])
            .collect()
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
    /// Reconnects of the sources' connections, all sources (per source: the state's
    /// source table).
    pub reconnects: u64,
    /// Salted blocks the sources' trackers evicted past their bound.
    pub salt_evictions: u64,
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

    /// Adds this struct's families to `out`, in a fixed order. Names follow Prometheus'
    /// conventions and, where the concept is the same, Dynamo's and vLLM's (README's
    /// metrics table).
    pub fn expose(&self, out: &mut Exposition) {
        out.counter(
            "kvtwin_router_kv_cache_events_applied_total",
            "KV events applied to the index (Dynamo: kv_cache_events_applied).",
            self.events_applied,
        );
        out.counter(
            "kvtwin_router_events_received_total",
            "KV events handed to the index by the sources, applied or refused.",
            self.events_received,
        );
        out.counter(
            "kvtwin_router_batches_total",
            "Event batches received from the sources.",
            self.batches,
        );
        out.counters(
            "kvtwin_router_events_dropped_total",
            "Messages, batches or events refused, by reason.",
            self.dropped
                .iter()
                .map(|(reason, count)| (ReasonLabels { reason }, *count))
                .collect(),
        );
        out.counter(
            "kvtwin_router_sequence_gaps_total",
            "Gaps in a source's sequence numbers.",
            self.gaps,
        );
        out.counter(
            "kvtwin_router_replayed_batches_total",
            "Batches recovered through replay.",
            self.replayed,
        );
        out.counter(
            "kvtwin_router_lost_batches_total",
            "Batches neither the stream nor replay supplied.",
            self.lost_batches,
        );
        out.counter(
            "kvtwin_router_engine_restarts_total",
            "Engine restarts (sequence went back); the worker was cleared.",
            self.restarts,
        );
        out.counter(
            "kvtwin_router_salt_evictions_total",
            "Salted blocks forgotten past a source's tracker bound (later misses on their chains).",
            self.salt_evictions,
        );
        out.counter(
            "kvtwin_router_requests_total",
            "Route decisions answered (Dynamo: router_requests_total).",
            self.routes,
        );
        out.counter(
            "kvtwin_router_prefix_cache_queries_blocks_total",
            "Full blocks in the routed queries (vLLM: prefix_cache_queries, in tokens).",
            self.route_query_blocks,
        );
        out.counter(
            "kvtwin_router_prefix_cache_hits_blocks_total",
            "Query blocks the chosen worker already held (vLLM: prefix_cache_hits, in tokens).",
            self.route_hit_blocks,
        );
        out.histogram(
            "kvtwin_router_apply_duration_seconds",
            "Time to apply one batch of events to the index.",
            &self.apply_latency,
        );
    }
}

/// A worker rank's labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkerLabels {
    /// The worker id.
    pub worker_id: u64,
    /// Its data-parallel rank.
    pub dp_rank: u32,
}

/// Why something was dropped.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    /// The stable reason (`malformed_msgpack`, `bad_json`, ...).
    pub reason: &'static str,
}

/// A storage tier.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TierLabels {
    /// `device`, `host`, `disk` or `remote`.
    pub tier: &'static str,
}

/// One event source's connection.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct SourceLabels {
    /// `zmq` or `nats`.
    pub transport: &'static str,
    /// The endpoint (a ZMQ endpoint, or the NATS server URL and subject).
    pub endpoint: String,
}

/// What `prometheus-client` needs of a label set here.
pub trait Labels: EncodeLabelSet + std::fmt::Debug + Send + Sync + 'static {}

impl<T: EncodeLabelSet + std::fmt::Debug + Send + Sync + 'static> Labels for T {}

/// One family's samples, as a `prometheus-client` collector writes them.
#[derive(Debug)]
enum Samples<L> {
    /// Unlabelled, one value.
    Counter(u64),
    Gauge(u64),
    Histogram {
        sum: f64,
        count: u64,
        buckets: Vec<(f64, u64)>,
    },
    /// Labelled values, in the order given.
    Counters(Vec<(L, u64)>),
    Gauges(Vec<(L, u64)>),
    /// Labelled histograms, in the order given.
    Histograms(Vec<LabelledHistogram<L>>),
}

/// One labelled histogram's samples: (labels, sum, count, buckets).
type LabelledHistogram<L> = (L, f64, u64, Vec<(f64, u64)>);

#[derive(Debug)]
struct Family<L> {
    /// The name as written in `# TYPE` (a counter's without `_total`, which the encoder
    /// appends to its samples).
    name: &'static str,
    help: &'static str,
    samples: Samples<L>,
}

impl<L: Labels> Collector for Family<L> {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let kind = match &self.samples {
            Samples::Counter(_) | Samples::Counters(_) => MetricType::Counter,
            Samples::Gauge(_) | Samples::Gauges(_) => MetricType::Gauge,
            Samples::Histogram { .. } | Samples::Histograms(_) => MetricType::Histogram,
        };
        let mut metric = encoder.encode_descriptor(self.name, self.help, None, kind)?;
        match &self.samples {
            Samples::Counter(value) => ConstCounter::new(*value).encode(metric),
            Samples::Gauge(value) => ConstGauge::new(*value).encode(metric),
            Samples::Histogram {
                sum,
                count,
                buckets,
            } => metric.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                *sum, *count, buckets, None,
            ),
            Samples::Counters(values) => {
                for (labels, value) in values {
                    ConstCounter::new(*value).encode(metric.encode_family(labels)?)?;
                }
                Ok(())
            }
            Samples::Gauges(values) => {
                for (labels, value) in values {
                    ConstGauge::new(*value).encode(metric.encode_family(labels)?)?;
                }
                Ok(())
            }
            Samples::Histograms(values) => {
                for (labels, sum, count, buckets) in values {
                    metric
                        .encode_family(labels)?
                        .encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                            *sum, *count, buckets, None,
                        )?;
                }
                Ok(())
            }
        }
    }
}

/// The OpenMetrics text of one scrape, families in the order they are added (a
/// `prometheus-client` registry of one collector per family).
#[derive(Debug, Default)]
pub struct Exposition {
    registry: Registry,
}

impl Exposition {
    /// Nothing yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A counter's `# TYPE` name: `name` without its `_total` (which the encoder writes
    /// on the samples).
    fn counter_name(name: &'static str) -> &'static str {
        debug_assert!(name.ends_with("_total"), "counter {name} without _total");
        name.strip_suffix("_total").unwrap_or(name)
    }

    fn add<L: Labels>(&mut self, name: &'static str, help: &'static str, samples: Samples<L>) {
        self.registry.register_collector(Box::new(Family {
            name,
            help,
            samples,
        }));
    }

    /// An unlabelled counter; `name` ends in `_total`.
    pub fn counter(&mut self, name: &'static str, help: &'static str, value: u64) {
        let name = Self::counter_name(name);
        self.add::<WorkerLabels>(name, help, Samples::Counter(value));
    }

    /// A labelled counter family; `name` ends in `_total`. No samples: only its
    /// `# HELP` and `# TYPE`.
    pub fn counters<L: Labels>(
        &mut self,
        name: &'static str,
        help: &'static str,
        values: Vec<(L, u64)>,
    ) {
        let name = Self::counter_name(name);
        self.add(name, help, Samples::Counters(values));
    }

    /// An unlabelled gauge.
    pub fn gauge(&mut self, name: &'static str, help: &'static str, value: u64) {
        self.add::<WorkerLabels>(name, help, Samples::Gauge(value));
    }

    /// A labelled gauge family.
    pub fn gauges<L: Labels>(
        &mut self,
        name: &'static str,
        help: &'static str,
        values: Vec<(L, u64)>,
    ) {
        self.add(name, help, Samples::Gauges(values));
    }

    /// A histogram of seconds; `name` ends in `_seconds`.
    pub fn histogram(&mut self, name: &'static str, help: &'static str, histogram: &Histogram) {
        self.add::<WorkerLabels>(
            name,
            help,
            Samples::Histogram {
                sum: histogram.sum_s,
                count: histogram.count,
                buckets: histogram.buckets(),
            },
        );
    }

    /// A labelled family of histograms of seconds; `name` ends in `_seconds`.
    pub fn histograms<L: Labels>(
        &mut self,
        name: &'static str,
        help: &'static str,
        values: Vec<(L, &Histogram)>,
    ) {
        let samples = values
            .into_iter()
            .map(|(labels, histogram)| {
                (
                    labels,
                    histogram.sum_s,
                    histogram.count,
                    histogram.buckets(),
                )
            })
            .collect();
        self.add(name, help, Samples::Histograms(samples));
    }

    /// The text, ending in `# EOF`.
    pub fn finish(self) -> String {
        let mut text = String::new();
        // Writing into a String cannot fail, and every family's encoder only writes.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry);
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_is_openmetrics_with_cumulative_buckets_in_a_fixed_order() {
        let mut metrics = Metrics {
            events_applied: 3,
            ..Metrics::default()
        };
        metrics.drop_one("unknown_medium");
        metrics.drop_one("malformed_msgpack");
        metrics.drop_one("malformed_msgpack");
        metrics.apply_latency.observe(Duration::from_nanos(800));
        metrics.apply_latency.observe(Duration::from_micros(30));
        metrics.apply_latency.observe(Duration::from_secs(1));
        let mut out = Exposition::new();
        metrics.expose(&mut out);
        out.gauge("kvtwin_router_workers", "Worker ranks known.", 2);
        out.gauges(
            "kvtwin_router_worker_indexed_blocks",
            "Blocks.",
            vec![(
                WorkerLabels {
                    worker_id: 7,
                    dp_rank: 1,
                },
                5,
            )],
        );
        let text = out.finish();
        assert!(text.contains(
            "# TYPE kvtwin_router_kv_cache_events_applied counter\nkvtwin_router_kv_cache_events_applied_total 3\n"
        ), "{text}");
        // Reasons in their (BTreeMap) order, whatever order they were counted in.
        assert!(text.contains(
            "kvtwin_router_events_dropped_total{reason=\"malformed_msgpack\"} 2\nkvtwin_router_events_dropped_total{reason=\"unknown_medium\"} 1\n"
        ), "{text}");
        assert!(
            text.contains("kvtwin_router_apply_duration_seconds_bucket{le=\"0.000001\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("kvtwin_router_apply_duration_seconds_bucket{le=\"0.00005\"} 2\n"),
            "{text}"
        );
        assert!(
            text.contains("kvtwin_router_apply_duration_seconds_bucket{le=\"+Inf\"} 3\n"),
            "{text}"
        );
        assert!(
            text.contains("kvtwin_router_apply_duration_seconds_count 3\n"),
            "{text}"
        );
        assert!(text.contains("# TYPE kvtwin_router_workers gauge\nkvtwin_router_workers 2\n"));
        assert!(
            text.contains("kvtwin_router_worker_indexed_blocks{worker_id=\"7\",dp_rank=\"1\"} 5\n")
        );
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert_eq!(metrics.dropped_total(), 3);
        // The same counts give the same text.
        let mut again = Exposition::new();
        metrics.expose(&mut again);
        again.gauge("kvtwin_router_workers", "Worker ranks known.", 2);
        let mut first = Exposition::new();
        metrics.expose(&mut first);
        first.gauge("kvtwin_router_workers", "Worker ranks known.", 2);
        assert_eq!(first.finish(), again.finish());
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
