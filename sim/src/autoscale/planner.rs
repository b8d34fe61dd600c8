//! The planner interface and the built-in planners.
//!
//! Owns: [`IntervalObservation`] (what a live planner sees at the end of an interval:
//! the request rate, mean input and output lengths, TTFT and ITL percentiles of the
//! requests that finished, and per pool and per worker the queue and the KV cache's
//! fill), [`Target`] (a pool's wanted size, the fractional need behind it, and why),
//! the [`Planner`] trait, and the built-ins: [`StaticPlanner`], [`ThroughputPlanner`]
//! (Dynamo's throughput-based SLA planner) and [`LoadPlanner`] (one step per interval
//! from queue and KV pressure); [`planner_of`] builds one from a scenario's section.
//! Never: touch the cluster, or enforce bounds and hysteresis: the driver does, so no
//! planner can leave them.

use super::predict::Forecaster;
use super::spec::{Capacity, PlannerSpec, Predictor};
use serde::Serialize;
use std::fmt;

/// Which pool a worker serves in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub enum PoolKind {
    /// Every worker of an aggregated cluster: prefill and decode alike.
    Aggregated,
    /// The prefill pool of a disaggregated cluster.
    Prefill,
    /// The decode pool of a disaggregated cluster.
    Decode,
}

impl fmt::Display for PoolKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PoolKind::Aggregated => "workers",
            PoolKind::Prefill => "prefill",
            PoolKind::Decode => "decode",
        })
    }
}

/// One serving worker's load at the end of an interval.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WorkerLoad {
    /// The worker (its id in the cluster).
    pub worker: u64,
    /// Requests waiting for a pass or for device blocks.
    pub queued: usize,
    /// Requests running (prefilling, decoding, in a handoff).
    pub running: usize,
    /// Share of its device KV blocks in use.
    pub kv_usage: f64,
}

/// One pool at the end of an interval.
#[derive(Clone, Debug, PartialEq)]
pub struct PoolObservation {
    /// Which pool.
    pub kind: PoolKind,
    /// Workers serving (not loading, not draining).
    pub replicas: usize,
    /// Workers ordered and still loading.
    pub loading: usize,
    /// Each serving worker, by id.
    pub workers: Vec<WorkerLoad>,
}

impl PoolObservation {
    /// Requests queued per serving worker.
    pub fn queued_per_worker(&self) -> f64 {
        let queued: usize = self.workers.iter().map(|w| w.queued).sum();
        queued as f64 / self.workers.len().max(1) as f64
    }

    /// Mean share of device KV blocks in use over the serving workers.
    pub fn kv_usage(&self) -> f64 {
        let sum: f64 = self.workers.iter().map(|w| w.kv_usage).sum();
        sum / self.workers.len().max(1) as f64
    }
}

/// Latency percentiles of the requests that finished in an interval, milliseconds (0
/// when none did).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct IntervalLatency {
    /// Median.
    pub p50_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
}

/// What a planner sees at the end of an interval.
#[derive(Clone, Debug, PartialEq)]
pub struct IntervalObservation {
    /// End of the interval, seconds from the start.
    pub at_s: f64,
    /// Its length, seconds.
    pub interval_s: f64,
    /// Requests that arrived in it.
    pub requests: u64,
    /// Their mean prompt length, tokens (0 when none arrived).
    pub mean_isl: f64,
    /// Their mean output length, tokens.
    pub mean_osl: f64,
    /// Requests that finished in it.
    pub finished: u64,
    /// Their time to first token.
    pub ttft: IntervalLatency,
    /// Their inter-token latency (time per output token after the first).
    pub itl: IntervalLatency,
    /// The pools (one when aggregated; prefill then decode when not).
    pub pools: Vec<PoolObservation>,
}

impl IntervalObservation {
    /// Requests per second that arrived in the interval.
    pub fn request_rate(&self) -> f64 {
        self.requests as f64 / self.interval_s.max(f64::MIN_POSITIVE)
    }
}

/// A planner's wish for one pool.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    /// The pool.
    pub pool: PoolKind,
    /// Workers it should have (serving plus loading).
    pub replicas: usize,
    /// The need behind it, in replicas, before rounding up, where the planner
    /// measures one (the hysteresis' headroom applies to it).
    pub needed: Option<f64>,
    /// Why, in words.
    pub reason: String,
}

/// Decides, every interval, how many workers each pool should have.
pub trait Planner {
    /// Its name in reports.
    fn name(&self) -> String;
    /// The wanted size of each pool after `observation`; a pool left out keeps its size.
    fn decide(&mut self, observation: &IntervalObservation) -> Vec<Target>;
}

/// The planner a scenario's section names.
pub fn planner_of(spec: &PlannerSpec) -> Box<dyn Planner> {
    match spec {
        PlannerSpec::Static => Box::new(StaticPlanner),
        PlannerSpec::Throughput {
            predictor,
            capacity,
        } => Box::new(ThroughputPlanner::new(*predictor, *capacity)),
        PlannerSpec::Load {
            queue_up,
            queue_down,
            kv_up,
            kv_down,
        } => Box::new(LoadPlanner {
            queue_up: *queue_up,
            queue_down: *queue_down,
            kv_up: *kv_up,
            kv_down: *kv_down,
        }),
    }
}

/// Keeps every pool as it is.
pub struct StaticPlanner;

impl Planner for StaticPlanner {
    fn name(&self) -> String {
        "static".to_string()
    }

    fn decide(&mut self, _: &IntervalObservation) -> Vec<Target> {
        Vec::new()
    }
}

/// Dynamo's throughput-based planner: it predicts the next interval's request count
/// and mean input and output lengths, turns them into prefill tokens and output tokens
/// per second, and sizes each pool at `ceil(demand ÷ one replica's capacity)`.
pub struct ThroughputPlanner {
    predictor: Predictor,
    capacity: Capacity,
    requests: Forecaster,
    isl: Forecaster,
    osl: Forecaster,
}

impl ThroughputPlanner {
    /// A planner predicting with `predictor`, for replicas of `capacity`.
    pub fn new(predictor: Predictor, capacity: Capacity) -> Self {
        Self {
            predictor,
            capacity,
            requests: Forecaster::new(predictor),
            isl: Forecaster::new(predictor),
            osl: Forecaster::new(predictor),
        }
    }
}

impl Planner for ThroughputPlanner {
    fn name(&self) -> String {
        let predictor = match self.predictor {
            Predictor::Constant => "constant".to_string(),
            Predictor::MovingAverage { window } => format!("moving-average({window})"),
            Predictor::HoltWinters { season, .. } if season > 1 => {
                format!("holt-winters(season {season})")
            }
            Predictor::HoltWinters { .. } => "holt".to_string(),
        };
        format!("throughput/{predictor}")
    }

    fn decide(&mut self, observation: &IntervalObservation) -> Vec<Target> {
        self.requests.observe(observation.requests as f64);
        // Lengths are only known from intervals that had requests; an idle interval
        // says nothing about them.
        if observation.requests > 0 {
            self.isl.observe(observation.mean_isl);
            self.osl.observe(observation.mean_osl);
        }
        let interval = observation.interval_s.max(f64::MIN_POSITIVE);
        let (requests, isl, osl) = (
            self.requests.predict(),
            self.isl.predict(),
            self.osl.predict(),
        );
        let prefill_tokens_per_s = requests * isl / interval;
        let output_tokens_per_s = requests * osl / interval;
        let prefill = prefill_tokens_per_s / self.capacity.prefill_tokens_per_s;
        let decode = output_tokens_per_s / self.capacity.decode_tokens_per_s;
        let why = |need: f64| {
            format!(
                "predicted {requests:.0} requests (isl {isl:.0}, osl {osl:.0}): \
                 {prefill_tokens_per_s:.0} prompt and {output_tokens_per_s:.0} output \
                 tokens/s, {need:.2} replicas"
            )
        };
        let target = |pool, need: f64| Target {
            pool,
            replicas: need.ceil() as usize,
            needed: Some(need),
            reason: why(need),
        };
        observation
            .pools
            .iter()
            .map(|pool| match pool.kind {
                PoolKind::Aggregated => target(pool.kind, prefill + decode),
                PoolKind::Prefill => target(pool.kind, prefill),
                PoolKind::Decode => target(pool.kind, decode),
            })
            .collect()
    }
}

/// One replica up when a pool is under pressure (prefill: its queue; decode: its KV
/// cache; aggregated: either), one down when it is idle on both counts, else none.
pub struct LoadPlanner {
    /// Queued requests per worker above which a pool grows.
    pub queue_up: f64,
    /// ... below which it may shrink.
    pub queue_down: f64,
    /// KV usage above which a pool grows.
    pub kv_up: f64,
    /// ... below which it may shrink.
    pub kv_down: f64,
}

impl Planner for LoadPlanner {
    fn name(&self) -> String {
        "load".to_string()
    }

    fn decide(&mut self, observation: &IntervalObservation) -> Vec<Target> {
        observation
            .pools
            .iter()
            .map(|pool| {
                let (queue, kv) = (pool.queued_per_worker(), pool.kv_usage());
                let (watch_queue, watch_kv) = match pool.kind {
                    PoolKind::Aggregated => (true, true),
                    PoolKind::Prefill => (true, false),
                    PoolKind::Decode => (false, true),
                };
                let size = pool.replicas + pool.loading;
                let pressed =
                    (watch_queue && queue > self.queue_up) || (watch_kv && kv > self.kv_up);
                let idle =
                    (!watch_queue || queue < self.queue_down) && (!watch_kv || kv < self.kv_down);
                // While workers load, what they will take is not seen yet: no step up.
                let (replicas, what) = if pressed && pool.loading == 0 {
                    (size + 1, "under pressure")
                } else if idle && !pressed {
                    (size.saturating_sub(1), "idle")
                } else {
                    (size, "steady")
                };
                Target {
                    pool: pool.kind,
                    replicas,
                    needed: None,
                    reason: format!(
                        "{what}: {queue:.1} queued per worker, KV {:.0}% used",
                        kv * 100.0
                    ),
                }
            })
            .collect()
    }
}
