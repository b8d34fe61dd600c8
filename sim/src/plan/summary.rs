//! The summary of one run: the figures sweeps write and the planner judges.
//!
//! Owns: [`RunSummary`] (a line of a sweep file, without its overrides and seed; with
//! [`AutoscaleSummary`] for a run with a planner), the
//! SLO metric names ([`METRICS`], [`RunSummary::metric`]) and the CDF points kept per
//! run ([`CDF_PERCENTS`]).
//! Never: decide what is good: the planner compares metrics with an SLO.

use crate::cluster::{Percentiles, Report};
use serde::{Deserialize, Serialize};

/// Percent points at which each run keeps its TTFT and TPOT CDF (nearest rank; 0 is the
/// minimum, 100 the maximum).
pub const CDF_PERCENTS: [f64; 22] = [
    0.0, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0, 35.0, 40.0, 45.0, 50.0, 55.0, 60.0, 65.0, 70.0, 75.0,
    80.0, 85.0, 90.0, 95.0, 99.0, 100.0,
];

/// Where the prompt blocks of one run came from, as fractions of all prompt blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TierHits {
    /// Already on a device.
    pub device: f64,
    /// Onboarded from host DRAM.
    pub host: f64,
    /// Onboarded from disk.
    pub disk: f64,
    /// Onboarded from remote storage.
    pub remote: f64,
    /// Read from the cluster's shared tier (left out of the JSON when none were, as in
    /// rows written before it existed).
    #[serde(default, skip_serializing_if = "is_nothing")]
    pub shared: f64,
}

fn is_nothing(share: &f64) -> bool {
    *share == 0.0
}

/// What one run did, in the figures planning needs. Field order is the JSON's.
/// (`Default` is a run of nothing, for tests and tables.)
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RunSummary {
    /// Workers in the cluster.
    pub workers: usize,
    /// Requests that arrived.
    pub requests: u64,
    /// Requests served to the end.
    pub completed: u64,
    /// Requests larger than a worker's device tier (never servable).
    pub rejected_too_large: u64,
    /// Fraction of prompt blocks not computed.
    pub hit_ratio: f64,
    /// Fraction of prompt tokens in cached blocks.
    pub hit_token_ratio: f64,
    /// The hits by the tier they came from.
    pub hit_ratio_by_tier: TierHits,
    /// Time to first token.
    pub ttft: Percentiles,
    /// Time per output token after the first.
    pub tpot: Percentiles,
    /// Arrival to last token.
    pub end_to_end: Percentiles,
    /// Arrival to the first pass that took the request.
    pub queueing: Percentiles,
    /// TTFT at each of [`CDF_PERCENTS`], milliseconds.
    pub ttft_cdf_ms: Vec<f64>,
    /// TPOT at each of [`CDF_PERCENTS`], milliseconds.
    pub tpot_cdf_ms: Vec<f64>,
    /// Output tokens of completed requests per simulated second, whole cluster.
    pub output_tokens_per_s: f64,
    /// Simulated time at the end.
    pub simulated_s: f64,
    /// Times a request waited for device blocks.
    pub waits_for_blocks: u64,
    /// Requests taken off the device to make room.
    pub preemptions: u64,
    /// What the planner did, for a scenario with an `autoscale` section (sweeps over
    /// planners compare these); absent otherwise, and then left out of the JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscale: Option<AutoscaleSummary>,
}

/// The autoscaling figures of one run ([`crate::autoscale::AutoscaleReport`]'s
/// headline).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AutoscaleSummary {
    /// The planner.
    pub planner: String,
    /// GPU-hours paid.
    pub gpu_hours: f64,
    /// Share of the finished requests within the SLO.
    pub slo_attainment: f64,
    /// Minutes of intervals below the SLO's share.
    pub minutes_in_violation: f64,
    /// Decisions against the pool's previous direction.
    pub direction_flips: u64,
    /// Workers paid for on average, per pool.
    pub mean_replicas: Vec<f64>,
}

/// The metrics an SLO may bound (each an upper bound, in milliseconds).
pub const METRICS: [&str; 16] = [
    "ttft_mean_ms",
    "ttft_p50_ms",
    "ttft_p90_ms",
    "ttft_p99_ms",
    "tpot_mean_ms",
    "tpot_p50_ms",
    "tpot_p90_ms",
    "tpot_p99_ms",
    "e2e_mean_ms",
    "e2e_p50_ms",
    "e2e_p90_ms",
    "e2e_p99_ms",
    "queueing_mean_ms",
    "queueing_p50_ms",
    "queueing_p90_ms",
    "queueing_p99_ms",
];

impl RunSummary {
    /// The summary of `report`, with the CDF points `ttft_cdf_ms` and `tpot_cdf_ms` (at
    /// [`CDF_PERCENTS`]) taken from the cluster before it reported.
    pub fn of(report: &Report, ttft_cdf_ms: Vec<f64>, tpot_cdf_ms: Vec<f64>) -> Self {
        let b = &report.blocks;
        let share = |n: u64| {
            if b.total == 0 {
                0.0
            } else {
                n as f64 / b.total as f64
            }
        };
        Self {
            workers: report.workers,
            requests: report.requests,
            completed: report.completed,
            rejected_too_large: report.rejected_too_large,
            hit_ratio: report.hit_ratio,
            hit_token_ratio: report.hit_token_ratio,
            hit_ratio_by_tier: TierHits {
                device: share(b.device),
                host: share(b.host),
                disk: share(b.disk),
                remote: share(b.remote),
                shared: share(b.shared),
            },
            ttft: report.ttft,
            tpot: report.tpot,
            end_to_end: report.end_to_end,
            queueing: report.queueing,
            ttft_cdf_ms,
            tpot_cdf_ms,
            output_tokens_per_s: report.output_tokens_per_s,
            simulated_s: report.simulated_s,
            waits_for_blocks: report.waits_for_blocks,
            preemptions: report.preemptions,
            autoscale: report.autoscale.as_ref().map(|a| AutoscaleSummary {
                planner: a.planner.clone(),
                gpu_hours: a.gpu_hours,
                slo_attainment: a.slo_attainment,
                minutes_in_violation: a.minutes_in_violation,
                direction_flips: a.direction_flips,
                mean_replicas: a.mean_replicas.clone(),
            }),
        }
    }

    /// The metric named `name` (one of [`METRICS`]), or `None` for a name there is not.
    pub fn metric(&self, name: &str) -> Option<f64> {
        let (latency, stat) = name.strip_suffix("_ms")?.rsplit_once('_')?;
        let percentiles = match latency {
            "ttft" => &self.ttft,
            "tpot" => &self.tpot,
            "e2e" => &self.end_to_end,
            "queueing" => &self.queueing,
            _ => return None,
        };
        Some(match stat {
            "mean" => percentiles.mean_ms,
            "p50" => percentiles.p50_ms,
            "p90" => percentiles.p90_ms,
            "p99" => percentiles.p99_ms,
            _ => return None,
        })
    }

    /// Requests neither served nor refused as too large: a run that leaves some
    /// unserved has no tail latency worth the name.
    pub fn unserved(&self) -> u64 {
        self.requests
            .saturating_sub(self.completed)
            .saturating_sub(self.rejected_too_large)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_listed_metric_resolves_and_others_do_not() {
        let mut summary = RunSummary {
            requests: 3,
            completed: 2,
            ..RunSummary::default()
        };
        summary.ttft.p99_ms = 7.0;
        summary.queueing.mean_ms = 3.0;
        for name in METRICS {
            assert!(summary.metric(name).is_some(), "{name}");
        }
        assert_eq!(summary.metric("ttft_p99_ms"), Some(7.0));
        assert_eq!(summary.metric("queueing_mean_ms"), Some(3.0));
        for bad in ["ttft_p95_ms", "ttft_p99", "itl_p99_ms", "", "p99_ms"] {
            assert_eq!(summary.metric(bad), None, "{bad}");
        }
        assert_eq!(summary.unserved(), 1);
    }
}
