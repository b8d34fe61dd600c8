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
use super::profile::{self, DecodeProfile, PrefillProfile, ProfileError};
use super::spec::{Capacity, PlannerSpec, Predictor, SloTargets};
use crate::scenario::Scenario;
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
    /// Mean.
    pub mean_ms: f64,
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

/// The planner a scenario's section names, for `scenario`'s workers (a profiled
/// capacity is measured on one of them now) and `slo`.
pub fn planner_of(
    spec: &PlannerSpec,
    scenario: &Scenario,
    slo: SloTargets,
) -> Result<Box<dyn Planner>, ProfileError> {
    Ok(match spec {
        PlannerSpec::Static => Box::new(StaticPlanner),
        PlannerSpec::Throughput {
            predictor,
            capacity,
        } => {
            let rates = match *capacity {
                Capacity::Given {
                    prefill_tokens_per_s,
                    decode_tokens_per_s,
                } => Rates::Given {
                    prefill_tokens_per_s,
                    decode_tokens_per_s,
                },
                Capacity::Profiled { correction } => {
                    let (isls, contexts, usages) = profile::default_grid(scenario);
                    Rates::Profiled(Box::new(Profiled {
                        prefill: profile::profile_prefill(scenario, &isls)?,
                        decode: profile::profile_decode(scenario, &contexts, &usages)?,
                        gpus: f64::from(profile::gpus_per_replica(scenario)?),
                        itl_target_ms: slo.itl_ms,
                        correction,
                    }))
                }
            };
            Box::new(ThroughputPlanner::new(*predictor, rates))
        }
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
    })
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
    rates: Rates,
    requests: Forecaster,
    isl: Forecaster,
    osl: Forecaster,
}

/// One replica's capacity, as a throughput-based planner reads it.
pub enum Rates {
    /// Fixed rates, tokens per second.
    Given {
        /// Prompt tokens prefilled per second.
        prefill_tokens_per_s: f64,
        /// Output tokens generated per second.
        decode_tokens_per_s: f64,
    },
    /// Dynamo's interpolation tables, measured on one replica.
    Profiled(Box<Profiled>),
}

/// Profiled capacity and how Dynamo's planner reads it.
pub struct Profiled {
    /// Prefill: TTFT and throughput per GPU by input length.
    pub prefill: PrefillProfile,
    /// Decode: ITL and throughput per GPU by KV usage and context length.
    pub decode: DecodeProfile,
    /// GPUs of one replica.
    pub gpus: f64,
    /// The ITL the decode pool is sized for, milliseconds.
    pub itl_target_ms: f64,
    /// Whether the observed latencies correct the tables (Dynamo's correction factors).
    pub correction: bool,
}

impl Profiled {
    /// Replicas of each pool that `requests` of `isl` and `osl` tokens per `interval`
    /// seconds need, corrected by what the interval just observed; and the factors.
    fn needs(
        &self,
        requests: f64,
        isl: f64,
        osl: f64,
        interval: f64,
        observed: &IntervalObservation,
    ) -> (f64, f64, String) {
        let finite = |x: f64| x.is_finite() && x > 0.0;
        // Prefix hits make prefill cheaper than the tables (measured on an empty
        // cache): a TTFT below theirs scales the demand down; queueing (above) does not
        // scale it up, as in Dynamo.
        let expected_ttft = self.prefill.ttft_ms_at(observed.mean_isl);
        let p_correction = if self.correction && observed.finished > 0 && finite(expected_ttft) {
            (observed.ttft.mean_ms / expected_ttft).min(1.0)
        } else {
            1.0
        };
        let prefill_per_replica = self.prefill.thpt_per_gpu_at(isl) * self.gpus;
        let prefill = requests * isl / interval * p_correction / prefill_per_replica;
        // Decode: an ITL above the tables' at the observed load means the replicas do
        // worse than profiled; aim the tables at a target tighter by as much.
        let kv_usage = observed
            .pools
            .iter()
            .filter(|p| p.kind != PoolKind::Prefill)
            .map(PoolObservation::kv_usage)
            .next()
            .unwrap_or(0.0);
        let context = observed.mean_isl + observed.mean_osl / 2.0;
        let expected_itl = self.decode.itl_ms_at(kv_usage, context);
        let d_correction = if self.correction
            && observed.finished > 0
            && finite(expected_itl)
            && finite(observed.itl.mean_ms)
        {
            observed.itl.mean_ms / expected_itl
        } else {
            1.0
        };
        let decode_per_replica = self
            .decode
            .best_thpt_per_gpu(self.itl_target_ms / d_correction, isl + osl / 2.0)
            * self.gpus;
        let decode = requests * osl / interval / decode_per_replica;
        let guard = |need: f64| if need.is_finite() { need.max(0.0) } else { 0.0 };
        (
            guard(prefill),
            guard(decode),
            format!(
                "; {prefill_per_replica:.0} prompt and {decode_per_replica:.0} output tokens/s \
                 per replica, corrections {p_correction:.2} and {d_correction:.2}"
            ),
        )
    }
}

impl ThroughputPlanner {
    /// A planner predicting with `predictor`, for replicas of `rates`.
    pub fn new(predictor: Predictor, rates: Rates) -> Self {
        Self {
            predictor,
            rates,
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
        let (prefill, decode, how) = match &self.rates {
            Rates::Given {
                prefill_tokens_per_s: p,
                decode_tokens_per_s: d,
            } => (
                prefill_tokens_per_s / p,
                output_tokens_per_s / d,
                String::new(),
            ),
            Rates::Profiled(profiled) => profiled.needs(requests, isl, osl, interval, observation),
        };
        let why = |need: f64| {
            format!(
                "predicted {requests:.0} requests (isl {isl:.0}, osl {osl:.0}): \
                 {prefill_tokens_per_s:.0} prompt and {output_tokens_per_s:.0} output \
                 tokens/s, {need:.2} replicas{how}"
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
