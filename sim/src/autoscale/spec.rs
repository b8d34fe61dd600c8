//! The scenario's `autoscale` section: which planner, how often it runs, the replica
//! bounds, how workers come and go, and the SLO its run is judged by.
//!
//! Owns: [`AutoscaleSpec`] and its parts, their defaults, and [`AutoscaleSpec::check`]
//! (every field in its range, the starting pools within the bounds).
//! Never: run or decide anything (`planner`, `driver`).

use serde::{Deserialize, Serialize};

/// A planner that adds and removes workers as the run goes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AutoscaleSpec {
    /// What decides the replica counts.
    pub planner: PlannerSpec,
    /// Seconds between two decisions (Dynamo: 180 s for its throughput-based planner,
    /// 5 s for the load-based one).
    pub interval_s: f64,
    /// Fewest workers of each pool (of the cluster when aggregated).
    pub min_replicas: usize,
    /// Most workers of each pool, those still loading and those draining excluded.
    pub max_replicas: usize,
    /// Seconds from a decision to add a worker until it serves (the model's load time);
    /// its GPUs are paid for from the decision.
    pub scale_up_delay_s: f64,
    /// How a worker leaves.
    pub scale_down: ScaleDown,
    /// Damping against flip-flops; absent, every decision is followed as it comes.
    pub hysteresis: Option<Hysteresis>,
    /// The targets the run is judged by (and the throughput planner plans for).
    pub slo: SloTargets,
    /// GPUs of one worker, for GPU-hours; absent, the compute model's (the roofline's
    /// tensor-parallel GPU count, 1 for the others).
    pub gpus_per_replica: Option<u32>,
}

impl Default for AutoscaleSpec {
    /// Dynamo's throughput-based defaults: a constant predictor every 180 s on
    /// profiled capacity with correction, one to eight replicas a pool, workers
    /// drained.
    fn default() -> Self {
        Self {
            planner: PlannerSpec::default(),
            interval_s: 180.0,
            min_replicas: 1,
            max_replicas: 8,
            scale_up_delay_s: 0.0,
            scale_down: ScaleDown::Drain,
            hysteresis: None,
            slo: SloTargets::default(),
            gpus_per_replica: None,
        }
    }
}

/// The latency targets of a run: a request is within its SLO when both hold.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SloTargets {
    /// Time to first token, milliseconds.
    pub ttft_ms: f64,
    /// Inter-token latency (time per output token after the first), milliseconds.
    pub itl_ms: f64,
    /// An interval is "in violation" when fewer of the requests that finished in it
    /// than this share were within the SLO.
    pub attainment: f64,
}

impl Default for SloTargets {
    /// Dynamo's planner examples: 200 ms TTFT, 20 ms ITL; 90 % per interval.
    fn default() -> Self {
        Self {
            ttft_ms: 200.0,
            itl_ms: 20.0,
            attainment: 0.9,
        }
    }
}

/// How a worker leaves the cluster.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum ScaleDown {
    /// It takes no new requests, finishes what it has, then leaves (its GPUs are paid
    /// for until then).
    #[default]
    Drain,
    /// It stops at once; its requests start again elsewhere.
    Kill,
}

/// Damping: a worker is taken away only when the demand has stayed clearly below the
/// pool's size for a while.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Hysteresis {
    /// A pool of `n` shrinks only to what the demand needs with this share of headroom
    /// (`needed × (1 + headroom) ≤ n − 1`), so demand wavering around a replica
    /// boundary does not move it.
    pub headroom: f64,
    /// ... and only after this many intervals in a row that each wanted it smaller
    /// (to the largest of their counts).
    pub down_intervals: usize,
}

impl Default for Hysteresis {
    /// 20 % headroom, three intervals.
    fn default() -> Self {
        Self {
            headroom: 0.2,
            down_intervals: 3,
        }
    }
}

/// The built-in planners.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum PlannerSpec {
    /// The pools keep the size they start with.
    Static,
    /// Dynamo's throughput-based planner: predicts the next interval's requests and
    /// their input and output lengths, and sets each pool to
    /// `ceil(predicted demand ÷ one replica's capacity at the SLO)`. Aggregated, one
    /// worker does both jobs, so the cluster gets the sum of the two needs.
    Throughput {
        /// How the next interval is predicted from the past ones.
        predictor: Predictor,
        /// One replica's capacity.
        capacity: Capacity,
    },
    /// A load-based planner: one replica up or down per interval, from the queue
    /// (prefill) and the KV cache's fill (decode).
    Load {
        /// Requests queued per worker of the pool above which it grows.
        queue_up: f64,
        /// Requests queued per worker below which it may shrink.
        queue_down: f64,
        /// Share of device KV blocks in use (mean over the pool) above which it grows.
        kv_up: f64,
        /// Share below which it may shrink.
        kv_down: f64,
    },
}

impl Default for PlannerSpec {
    fn default() -> Self {
        PlannerSpec::Throughput {
            predictor: Predictor::Constant,
            capacity: Capacity::default(),
        }
    }
}

/// One replica's capacity at the SLO, for the throughput-based planner.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Capacity {
    /// Fixed rates, whatever the lengths.
    Given {
        /// Prompt tokens one prefill worker prefills per second within the TTFT target.
        prefill_tokens_per_s: f64,
        /// Output tokens one decode worker generates per second within the ITL target.
        decode_tokens_per_s: f64,
    },
    /// Measured by the simulator on one worker of this scenario before the run
    /// ([`super::profile`], its default grid: the tables `kvtwin profile` writes), and
    /// read as Dynamo's planner reads them: prefill throughput per GPU at the predicted
    /// input length; decode throughput per GPU at the best KV load whose ITL meets the
    /// target, at the predicted context length.
    Profiled {
        /// Dynamo's correction factors: scale the prefill demand by the observed TTFT
        /// over the tables' (at most 1), and the ITL target by the tables' ITL over the
        /// observed one, so what the tables miss (queueing, cache hits) steers the plan.
        correction: bool,
    },
}

impl Default for Capacity {
    fn default() -> Self {
        Capacity::Profiled { correction: true }
    }
}

/// How a throughput-based planner predicts the next interval from the past ones
/// (deterministic: the same observations give the same predictions).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Predictor {
    /// The next interval is the last one (Dynamo's `constant`).
    Constant,
    /// The mean of the last `window` intervals.
    MovingAverage {
        /// Intervals averaged, at least 1.
        window: usize,
    },
    /// Holt-Winters exponential smoothing: a level, a trend and, with `season` above 1,
    /// an additive season of that many intervals (a day of 180 s intervals is 480).
    /// The stand-in for Dynamo's ARIMA / Prophet predictors.
    HoltWinters {
        /// Level smoothing, in (0, 1].
        alpha: f64,
        /// Trend smoothing, in [0, 1].
        beta: f64,
        /// Season smoothing, in [0, 1].
        gamma: f64,
        /// Intervals in a season; 0 or 1: no season.
        season: usize,
    },
}

impl AutoscaleSpec {
    /// What makes this section unrunnable, naming the field; `pools` are the starting
    /// sizes (prefill then decode, or the one aggregated pool).
    pub fn check(&self, pools: &[usize]) -> Result<(), String> {
        let positive = |field: &str, value: f64| {
            if value > 0.0 && value.is_finite() {
                Ok(())
            } else {
                Err(format!("{field}: {value} must be above 0"))
            }
        };
        let share = |field: &str, value: f64| {
            if (0.0..=1.0).contains(&value) {
                Ok(())
            } else {
                Err(format!("{field}: {value} must be within 0..=1"))
            }
        };
        positive("interval_s", self.interval_s)?;
        if !(self.scale_up_delay_s >= 0.0 && self.scale_up_delay_s.is_finite()) {
            return Err(format!(
                "scale_up_delay_s: {} must be 0 or more",
                self.scale_up_delay_s
            ));
        }
        if self.min_replicas == 0 || self.min_replicas > self.max_replicas {
            return Err(format!(
                "min_replicas ({}) must be at least 1 and at most max_replicas ({})",
                self.min_replicas, self.max_replicas
            ));
        }
        if let Some(n) = pools
            .iter()
            .find(|n| !(self.min_replicas..=self.max_replicas).contains(*n))
        {
            return Err(format!(
                "the cluster starts with {n} workers in a pool, outside \
                 min_replicas..=max_replicas ({}..={})",
                self.min_replicas, self.max_replicas
            ));
        }
        if self.gpus_per_replica == Some(0) {
            return Err("gpus_per_replica must be at least 1".to_string());
        }
        positive("slo.ttft_ms", self.slo.ttft_ms)?;
        positive("slo.itl_ms", self.slo.itl_ms)?;
        share("slo.attainment", self.slo.attainment)?;
        if let Some(h) = &self.hysteresis {
            if !(h.headroom >= 0.0 && h.headroom.is_finite()) {
                return Err(format!(
                    "hysteresis.headroom: {} must be 0 or more",
                    h.headroom
                ));
            }
            if h.down_intervals == 0 {
                return Err("hysteresis.down_intervals must be at least 1".to_string());
            }
        }
        match &self.planner {
            PlannerSpec::Static => {}
            PlannerSpec::Throughput {
                predictor,
                capacity,
            } => {
                if let Capacity::Given {
                    prefill_tokens_per_s,
                    decode_tokens_per_s,
                } = capacity
                {
                    positive(
                        "planner.capacity.prefill_tokens_per_s",
                        *prefill_tokens_per_s,
                    )?;
                    positive("planner.capacity.decode_tokens_per_s", *decode_tokens_per_s)?;
                }
                match *predictor {
                    Predictor::Constant => {}
                    Predictor::MovingAverage { window: 0 } => {
                        return Err("planner.predictor.window must be at least 1".to_string())
                    }
                    Predictor::MovingAverage { .. } => {}
                    Predictor::HoltWinters {
                        alpha, beta, gamma, ..
                    } => {
                        positive("planner.predictor.alpha", alpha)?;
                        share("planner.predictor.alpha", alpha)?;
                        share("planner.predictor.beta", beta)?;
                        share("planner.predictor.gamma", gamma)?;
                    }
                }
            }
            PlannerSpec::Load {
                queue_up,
                queue_down,
                kv_up,
                kv_down,
            } => {
                if !(*queue_down >= 0.0 && queue_down < queue_up && queue_up.is_finite()) {
                    return Err(format!(
                        "planner.queue_down ({queue_down}) must be 0 or more and below \
                         queue_up ({queue_up})"
                    ));
                }
                share("planner.kv_up", *kv_up)?;
                share("planner.kv_down", *kv_down)?;
                if kv_down >= kv_up {
                    return Err(format!(
                        "planner.kv_down ({kv_down}) must be below kv_up ({kv_up})"
                    ));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_check_and_bad_fields_are_named() {
        assert_eq!(AutoscaleSpec::default().check(&[1, 2]), Ok(()));
        let with = |f: fn(&mut AutoscaleSpec)| {
            let mut spec = AutoscaleSpec::default();
            f(&mut spec);
            spec.check(&[2]).unwrap_err()
        };
        assert!(with(|s| s.interval_s = 0.0).starts_with("interval_s"));
        assert!(with(|s| s.min_replicas = 9).starts_with("min_replicas"));
        assert!(with(|s| s.max_replicas = 1).contains("outside"));
        assert!(with(|s| s.slo.attainment = 2.0).starts_with("slo.attainment"));
        assert!(with(|s| s.hysteresis = Some(Hysteresis {
            headroom: 0.1,
            down_intervals: 0
        }))
        .starts_with("hysteresis.down_intervals"));
        assert!(with(|s| s.planner = PlannerSpec::Load {
            queue_up: 1.0,
            queue_down: 2.0,
            kv_up: 0.9,
            kv_down: 0.5
        })
        .contains("queue_down"));
        assert!(with(|s| s.planner = PlannerSpec::Throughput {
            predictor: Predictor::MovingAverage { window: 0 },
            capacity: Capacity::default()
        })
        .contains("window"));
    }
}
