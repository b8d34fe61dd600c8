//! What an autoscaled run adds to its report: GPU-hours, SLO attainment, the scaling
//! timeline and its flip-flops, the caches lost to scaling, and the load and replicas
//! of every interval.
//!
//! Owns: [`AutoscaleReport`], [`Decision`], [`IntervalSample`], and their text form.
//! Never: measure anything (the driver fills them in).

use super::planner::PoolKind;
use serde::Serialize;
use std::fmt;

/// One decision that changed a pool's size.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Decision {
    /// When, seconds from the start.
    pub at_s: f64,
    /// Which pool.
    pub pool: PoolKind,
    /// Its size before (serving plus loading).
    pub from: usize,
    /// Its size after.
    pub to: usize,
    /// Why: the planner's reason, and the bound or damping that changed its wish.
    pub reason: String,
}

/// One interval's load and pools, at its end.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct IntervalSample {
    /// End of the interval, seconds from the start.
    pub at_s: f64,
    /// Requests per second that arrived in it.
    pub request_rate: f64,
    /// Requests that finished in it.
    pub finished: u64,
    /// Share of those within the SLO (1 when none finished).
    pub attainment: f64,
    /// 90th percentile TTFT of those, milliseconds.
    pub ttft_p90_ms: f64,
    /// 90th percentile ITL of those, milliseconds.
    pub itl_p90_ms: f64,
    /// Workers serving, per pool (in the report's `pools` order), after the decision.
    pub serving: Vec<usize>,
    /// Workers loading, per pool, after the decision.
    pub loading: Vec<usize>,
    /// Workers draining, per pool.
    pub draining: Vec<usize>,
    /// Requests queued per serving worker, per pool.
    pub queued_per_worker: Vec<f64>,
    /// Mean share of device KV blocks in use, per pool.
    pub kv_usage: Vec<f64>,
}

/// The autoscaling side of a run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AutoscaleReport {
    /// The planner (and its predictor).
    pub planner: String,
    /// Seconds between decisions.
    pub interval_s: f64,
    /// The pools, in the order of every per-pool list below.
    pub pools: Vec<PoolKind>,
    /// GPUs of one worker.
    pub gpus_per_replica: u32,
    /// GPU-hours paid: every worker from the decision that ordered it (loading
    /// included) until it left (draining included; a drained worker's leaving is seen
    /// at the end of the interval in which it happened).
    pub gpu_hours: f64,
    /// Workers paid for on average over the run, per pool.
    pub mean_replicas: Vec<f64>,
    /// Most workers serving at once, per pool.
    pub peak_replicas: Vec<usize>,
    /// Share of the finished requests within both the TTFT and the ITL target.
    pub slo_attainment: f64,
    /// Share within the TTFT target.
    pub ttft_attainment: f64,
    /// Share within the ITL target (requests of one token count as within).
    pub itl_attainment: f64,
    /// Minutes of the intervals in which fewer than the SLO's share of the requests
    /// finishing were within it.
    pub minutes_in_violation: f64,
    /// Decisions that grew a pool.
    pub scale_ups: u64,
    /// Decisions that shrank one.
    pub scale_downs: u64,
    /// Decisions that went the other way from the pool's previous decision.
    pub direction_flips: u64,
    /// Workers that joined empty (every worker added starts cold).
    pub cold_starts: u64,
    /// Blocks cached on workers when they left, lost with them (device, host, disk).
    pub cached_blocks_lost: u64,
    /// Finished requests the planner did not see (its bounded log overflowed).
    pub finished_unobserved: u64,
    /// Scale commands the cluster refused (a bug if ever above 0).
    pub commands_refused: u64,
    /// Every decision that changed a pool, in time order.
    pub timeline: Vec<Decision>,
    /// Every interval's load and pools.
    pub intervals: Vec<IntervalSample>,
}

impl fmt::Display for AutoscaleReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pools: Vec<String> = self
            .pools
            .iter()
            .enumerate()
            .map(|(i, pool)| {
                format!(
                    "{pool} mean {:.2}, peak {}",
                    self.mean_replicas.get(i).copied().unwrap_or(0.0),
                    self.peak_replicas.get(i).copied().unwrap_or(0)
                )
            })
            .collect();
        writeln!(
            f,
            "autoscale: planner {} every {} s; {:.2} GPU-hours at {} GPU(s) per worker ({})",
            self.planner,
            self.interval_s,
            self.gpu_hours,
            self.gpus_per_replica,
            pools.join("; ")
        )?;
        writeln!(
            f,
            "  SLO attainment {:.2}% (TTFT {:.2}%, ITL {:.2}%), {:.1} minutes in violation",
            100.0 * self.slo_attainment,
            100.0 * self.ttft_attainment,
            100.0 * self.itl_attainment,
            self.minutes_in_violation
        )?;
        writeln!(
            f,
            "  {} scale-ups, {} scale-downs, {} direction flips; {} cold starts, {} cached blocks lost",
            self.scale_ups,
            self.scale_downs,
            self.direction_flips,
            self.cold_starts,
            self.cached_blocks_lost
        )?;
        if self.commands_refused > 0 {
            writeln!(
                f,
                "  {} scale commands refused by the cluster",
                self.commands_refused
            )?;
        }
        if self.finished_unobserved > 0 {
            writeln!(
                f,
                "  {} finished requests not seen by the planner (its log overflowed)",
                self.finished_unobserved
            )?;
        }
        const SHOWN: usize = 8;
        for decision in self.timeline.iter().take(SHOWN) {
            writeln!(
                f,
                "  {:>9.0} s  {} {} -> {}: {}",
                decision.at_s, decision.pool, decision.from, decision.to, decision.reason
            )?;
        }
        if self.timeline.len() > SHOWN {
            writeln!(
                f,
                "  ... {} more decisions (the JSON report has them all)",
                self.timeline.len() - SHOWN
            )?;
        }
        Ok(())
    }
}
