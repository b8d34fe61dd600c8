//! Pareto fronts and the rows the planner prints.
//!
//! Owns: [`front`] (the points no other beats on both axes), [`Row`] (one run in the
//! terms of AIConfigurator's tables, where they exist, plus kvtwin's cache and cost
//! columns) and [`Row::of`].
//! Never: format or print: the command line does.

use super::space::{PlanPoint, Points};
use super::summary::RunSummary;
use kvtwin::tier::Tier;
use serde::Serialize;

/// Whether larger or smaller is better on an axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Better {
    /// Smaller is better (cost, latency).
    Lower,
    /// Larger is better (throughput).
    Higher,
}

/// The indices of `points` (x, y) on the Pareto front: no other point is at least as good
/// on both axes and better on one. Sorted by x; non-finite points never make it.
pub fn front(points: &[(f64, f64)], x: Better, y: Better) -> Vec<usize> {
    let better = |a: f64, b: f64, how: Better| match how {
        Better::Lower => a < b,
        Better::Higher => a > b,
    };
    let at_least = |a: f64, b: f64, how: Better| a == b || better(a, b, how);
    let mut on: Vec<usize> = (0..points.len())
        .filter(|&i| {
            let (xi, yi) = points[i];
            xi.is_finite()
                && yi.is_finite()
                && !points.iter().enumerate().any(|(j, &(xj, yj))| {
                    j != i
                        && xj.is_finite()
                        && yj.is_finite()
                        && at_least(xj, xi, x)
                        && at_least(yj, yi, y)
                        && (better(xj, xi, x) || better(yj, yi, y) || j < i)
                })
        })
        .collect();
    on.sort_by(|a, b| points[*a].0.total_cmp(&points[*b].0).then(a.cmp(b)));
    on
}

/// One run as a row of the planner's tables. The names AIConfigurator uses are kept
/// (`tokens/s/gpu`, `tokens/s/user`, `TTFT`, `TPOT`, `replicas`, `workers`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    /// The point's index in the space.
    pub point: usize,
    /// The category's label (GPU profile and the other non-monotone choices).
    pub config: String,
    /// Output tokens per second per GPU.
    #[serde(rename = "tokens/s/gpu")]
    pub tokens_per_s_per_gpu: f64,
    /// Output tokens per second one user sees while decoding (1000 / mean TPOT).
    #[serde(rename = "tokens/s/user")]
    pub tokens_per_s_per_user: f64,
    /// TTFT at the SLO's statistic (p99 when the SLO bounds none), milliseconds.
    #[serde(rename = "TTFT")]
    pub ttft_ms: f64,
    /// TPOT at the SLO's statistic (p99 when the SLO bounds none), milliseconds.
    #[serde(rename = "TPOT")]
    pub tpot_ms: f64,
    /// Model replicas (workers).
    pub replicas: usize,
    /// GPUs per replica (tensor parallel).
    #[serde(rename = "gpus/replica")]
    pub gpus_per_replica: u32,
    /// Workers: the count, or prefill + decode (`"2P+6D"`) when disaggregated.
    pub workers: String,
    /// Device blocks per worker.
    pub device_blocks: usize,
    /// Host DRAM per worker, GB.
    pub host_gb: f64,
    /// SSD per worker, GB.
    pub disk_gb: f64,
    /// The cluster's shared tier, GB (0: none).
    pub shared_gb: f64,
    /// Prompt blocks found on the device.
    pub hit_device: f64,
    /// Prompt blocks onboarded from host DRAM.
    pub hit_host: f64,
    /// Prompt blocks onboarded from disk.
    pub hit_disk: f64,
    /// Prompt blocks read from the shared tier.
    pub hit_shared: f64,
    /// US dollars per hour.
    pub usd_per_hour: f64,
    /// US dollars per million output tokens at the run's throughput.
    pub usd_per_mtok: f64,
    /// Whether the run meets the SLO.
    pub meets_slo: bool,
}

impl Row {
    /// The row of point `index` with its run's `summary`; `ttft` and `tpot` name the
    /// statistics shown (metrics of [`RunSummary::metric`]).
    pub fn of(
        points: &Points,
        index: usize,
        summary: &RunSummary,
        meets_slo: bool,
        ttft: &str,
        tpot: &str,
    ) -> Self {
        let point: &PlanPoint = &points.points[index];
        let shape = &point.shape;
        let gpus = shape.gpus().max(1) as f64;
        let per_user = if summary.tpot.mean_ms > 0.0 {
            1000.0 / summary.tpot.mean_ms
        } else {
            0.0
        };
        let mtok_per_hour = summary.output_tokens_per_s * 3600.0 / 1e6;
        Self {
            point: index,
            config: points.categories[point.category].clone(),
            tokens_per_s_per_gpu: summary.output_tokens_per_s / gpus,
            tokens_per_s_per_user: per_user,
            ttft_ms: summary.metric(ttft).unwrap_or(summary.ttft.p99_ms),
            tpot_ms: summary.metric(tpot).unwrap_or(summary.tpot.p99_ms),
            replicas: shape.workers,
            gpus_per_replica: shape.gpu.count,
            workers: if shape.prefill_workers > 0 {
                format!(
                    "{}P+{}D",
                    shape.prefill_workers,
                    shape.workers.saturating_sub(shape.prefill_workers)
                )
            } else {
                shape.workers.to_string()
            },
            device_blocks: shape.blocks[Tier::Device.index()],
            host_gb: shape.gb(Tier::Host),
            disk_gb: shape.gb(Tier::Disk),
            shared_gb: shape.shared_gb(),
            hit_device: summary.hit_ratio_by_tier.device,
            hit_host: summary.hit_ratio_by_tier.host,
            hit_disk: summary.hit_ratio_by_tier.disk,
            hit_shared: summary.hit_ratio_by_tier.shared,
            usd_per_hour: point.usd_per_hour,
            usd_per_mtok: if mtok_per_hour > 0.0 {
                point.usd_per_hour / mtok_per_hour
            } else {
                f64::INFINITY
            },
            meets_slo,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_front_keeps_what_nothing_beats() {
        let points = [
            (1.0, 5.0),
            (2.0, 3.0),
            (3.0, 4.0),
            (4.0, 1.0),
            (2.0, 3.0),
            (f64::NAN, 0.0),
        ];
        assert_eq!(front(&points, Better::Lower, Better::Lower), vec![0, 1, 3]);
        assert_eq!(
            front(&points, Better::Higher, Better::Higher),
            vec![0, 2, 3]
        );
        assert!(front(&[], Better::Lower, Better::Lower).is_empty());
    }
}
