//! The autoscaled run: a [`Cluster`] advanced interval by interval, a planner asked at
//! the end of each, and its wishes carried out within the bounds.
//!
//! Owns: [`Autoscaled`] (steppable: each step is an interval's end or a worker done
//! loading), the pools' membership as the planner sees it (serving, loading, draining),
//! the bounds and hysteresis every planner is held to, the arrivals and finished
//! requests of each interval, and the accounting behind [`AutoscaleReport`]: GPU time,
//! SLO attainment, decisions and flips, caches lost.
//! Invariant: the planner's view comes only from what a live planner could see (the
//! arrivals of the interval, the requests that finished in it, the workers' queues and
//! caches); the cluster's run is changed only through its commands (`add_worker`,
//! `remove_worker`), at the times they are made, so the same scenario and seed give the
//! same timeline.
//! Never: look inside the cluster's state, or read a clock.

use super::planner::{
    planner_of, IntervalLatency, IntervalObservation, Planner, PoolKind, PoolObservation, Target,
    WorkerLoad,
};
use super::report::{AutoscaleReport, Decision, IntervalSample};
use super::spec::{AutoscaleSpec, ScaleDown};
use crate::cluster::{
    Cluster, CommandError, Finished, Latency, Observation, Pool, Removal, Report, SimError,
    WorkerSnapshot, WorkerStatus,
};
use crate::scenario::Scenario;
use crate::workload::Request;
use kvtwin::ids::{Timestamp, WorkerId};
use kvtwin::stats::Latencies;
use kvtwin::tier::Tier;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Duration;

/// Finished requests kept between two intervals' ends; more in one interval are
/// dropped (and counted) rather than held without bound.
const FINISHED_LOG: usize = 1 << 20;

/// Arrivals per interval (count, prompt tokens, output tokens), filled as the cluster
/// pulls requests from the stream (at most one ahead of the clock).
#[derive(Default)]
struct ArrivalLog {
    interval_ns: u64,
    buckets: BTreeMap<u64, (u64, u64, u64)>,
}

impl ArrivalLog {
    fn record(&mut self, request: &Request) {
        // Interval k ends at (k + 1) × interval: it holds arrivals in (k·I, (k + 1)·I],
        // which is what advancing the cluster to its end has let in.
        let bucket = request.arrival.as_nanos().saturating_sub(1) / self.interval_ns.max(1);
        let entry = self.buckets.entry(bucket).or_default();
        entry.0 += 1;
        entry.1 += request.input_tokens;
        entry.2 += request.output_tokens;
    }

    /// Interval `k`'s arrivals, forgetting it and every earlier one.
    fn take(&mut self, k: u64) -> (u64, u64, u64) {
        let later = self.buckets.split_off(&(k + 1));
        let taken = self.buckets.remove(&k).unwrap_or_default();
        self.buckets = later;
        taken
    }
}

/// One pool as the planner manages it.
struct PoolState {
    kind: PoolKind,
    /// Workers serving (or down, coming back), oldest first.
    serving: Vec<WorkerId>,
    /// When each ordered worker is done loading, oldest order first.
    loading: Vec<Timestamp>,
    /// Workers draining, and their cached blocks when last seen.
    draining: BTreeMap<WorkerId, u64>,
    /// Worker-nanoseconds paid for.
    paid_ns: f64,
    peak: usize,
    /// Whether the pool's last change grew it.
    last_grew: Option<bool>,
    /// Sizes wanted by the intervals in a row that wanted it smaller (hysteresis).
    smaller_wishes: Vec<usize>,
}

impl PoolState {
    fn size(&self) -> usize {
        self.serving.len() + self.loading.len()
    }

    fn paid(&self) -> usize {
        self.size() + self.draining.len()
    }
}

/// What one [`Autoscaled::step`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// An interval ended and the planner was asked; whether a pool changed.
    Interval {
        /// Whether any pool's size changed.
        scaled: bool,
    },
    /// Workers done loading joined their pools.
    Joined,
}

/// A run with a planner in the loop (see the module docs).
pub struct Autoscaled<'a> {
    cluster: Cluster<'a>,
    spec: AutoscaleSpec,
    planner: Box<dyn Planner>,
    gpus_per_replica: u32,
    arrivals: Rc<RefCell<ArrivalLog>>,
    pools: Vec<PoolState>,
    interval: Duration,
    next_tick: Timestamp,
    ticks: u64,
    accounted_to: Timestamp,
    finished: u64,
    within_ttft: u64,
    within_itl: u64,
    within_both: u64,
    violation_s: f64,
    timeline: Vec<Decision>,
    scale_ups: u64,
    scale_downs: u64,
    flips: u64,
    cold_starts: u64,
    cached_lost: u64,
    intervals: Vec<IntervalSample>,
    /// Commands the cluster refused (none should be).
    refused: u64,
    over: bool,
}

impl<'a> Autoscaled<'a> {
    /// The cluster of `scenario` at time zero with `requests` to arrive (in arrival
    /// order) and the planner of its `autoscale` section (the static one without).
    pub fn new<I>(scenario: &Scenario, requests: I) -> Result<Self, SimError>
    where
        I: IntoIterator<Item = Request>,
        I::IntoIter: 'a,
    {
        let spec = scenario.autoscale.clone().unwrap_or_else(|| AutoscaleSpec {
            planner: super::spec::PlannerSpec::Static,
            ..AutoscaleSpec::default()
        });
        let interval = Duration::from_secs_f64(spec.interval_s).max(Duration::from_nanos(1));
        let arrivals = Rc::new(RefCell::new(ArrivalLog {
            interval_ns: interval.as_nanos() as u64,
            ..ArrivalLog::default()
        }));
        let log = Rc::clone(&arrivals);
        let requests = requests
            .into_iter()
            .inspect(move |request| log.borrow_mut().record(request));
        let mut cluster = Cluster::new(scenario, requests)?;
        cluster.observe(Observation {
            finished: FINISHED_LOG,
            ..Observation::default()
        });
        let workers = scenario.cluster.workers.max(1);
        let pool = |kind, ids: std::ops::Range<usize>| PoolState {
            kind,
            serving: ids.map(|w| WorkerId::new(w as u64)).collect(),
            loading: Vec::new(),
            draining: BTreeMap::new(),
            paid_ns: 0.0,
            peak: 0,
            last_grew: None,
            smaller_wishes: Vec::new(),
        };
        let mut pools = match scenario.cluster.disaggregation {
            Some(d) => vec![
                pool(PoolKind::Prefill, 0..d.prefill_workers),
                pool(PoolKind::Decode, d.prefill_workers..workers),
            ],
            None => vec![pool(PoolKind::Aggregated, 0..workers)],
        };
        for pool in &mut pools {
            pool.peak = pool.serving.len();
        }
        let planner = planner_of(&spec.planner, scenario, spec.slo)
            .map_err(|error| SimError::Planner(error.to_string()))?;
        let gpus_per_replica = match spec.gpus_per_replica {
            Some(gpus) => gpus,
            None => super::profile::gpus_per_replica(scenario)
                .map_err(|error| SimError::Planner(error.to_string()))?,
        };
        Ok(Self {
            cluster,
            planner,
            gpus_per_replica,
            spec,
            arrivals,
            pools,
            interval,
            next_tick: Timestamp::ZERO.saturating_add(interval),
            ticks: 0,
            accounted_to: Timestamp::ZERO,
            finished: 0,
            within_ttft: 0,
            within_itl: 0,
            within_both: 0,
            violation_s: 0.0,
            timeline: Vec::new(),
            scale_ups: 0,
            scale_downs: 0,
            flips: 0,
            cold_starts: 0,
            cached_lost: 0,
            intervals: Vec::new(),
            refused: 0,
            over: false,
        })
    }

    /// The cluster, between steps.
    pub fn cluster(&self) -> &Cluster<'a> {
        &self.cluster
    }

    /// The workers of each pool now: (pool, serving, loading, draining).
    pub fn pools(&self) -> Vec<(PoolKind, usize, usize, usize)> {
        self.pools
            .iter()
            .map(|p| (p.kind, p.serving.len(), p.loading.len(), p.draining.len()))
            .collect()
    }

    /// Runs to the next interval's end or the next worker done loading; `None`, doing
    /// nothing, once the run is over.
    pub fn step(&mut self) -> Option<Step> {
        if self.over {
            return None;
        }
        let ready = self
            .pools
            .iter()
            .filter_map(|p| p.loading.first().copied())
            .min();
        let at = ready.map_or(self.next_tick, |r| r.min(self.next_tick));
        self.cluster.advance_to(at);
        if self.cluster.is_done() {
            self.over = true;
            return None;
        }
        self.account(at);
        if ready.is_some_and(|r| r <= at) {
            self.join_loaded(at);
            if at < self.next_tick {
                return Some(Step::Joined);
            }
        }
        let scaled = self.interval_ends(at);
        Some(Step::Interval { scaled })
    }

    /// The run's latency quantiles so far ([`Cluster::latency_quantiles`]).
    pub fn latency_quantiles(&mut self, latency: Latency, qs: &[f64]) -> Vec<f64> {
        self.cluster.latency_quantiles(latency, qs)
    }

    /// Runs to the end and reports.
    pub fn run(mut self) -> Report {
        while self.step().is_some() {}
        self.into_report()
    }

    /// The report of a run that is over (or stopped early: the rest is not run).
    pub fn into_report(mut self) -> Report {
        let finished = self.cluster.drain_finished();
        self.judge(&finished);
        let unobserved = self.cluster.finished_dropped();
        let mut report = self.cluster.into_report();
        let end = Timestamp::from_nanos((report.simulated_s * 1e9) as u64).max(self.accounted_to);
        let dt = end.saturating_duration_since(self.accounted_to).as_nanos() as f64;
        for pool in &mut self.pools {
            pool.paid_ns += pool.paid() as f64 * dt;
        }
        let total_ns = end.as_nanos().max(1) as f64;
        let share = |n: u64| {
            if self.finished == 0 {
                1.0
            } else {
                n as f64 / self.finished as f64
            }
        };
        report.autoscale = Some(AutoscaleReport {
            planner: self.planner.name(),
            interval_s: self.spec.interval_s,
            pools: self.pools.iter().map(|p| p.kind).collect(),
            gpus_per_replica: self.gpus_per_replica,
            gpu_hours: self.pools.iter().map(|p| p.paid_ns).sum::<f64>()
                * f64::from(self.gpus_per_replica)
                / 3.6e12,
            mean_replicas: self.pools.iter().map(|p| p.paid_ns / total_ns).collect(),
            peak_replicas: self.pools.iter().map(|p| p.peak).collect(),
            slo_attainment: share(self.within_both),
            ttft_attainment: share(self.within_ttft),
            itl_attainment: share(self.within_itl),
            minutes_in_violation: self.violation_s / 60.0,
            scale_ups: self.scale_ups,
            scale_downs: self.scale_downs,
            direction_flips: self.flips,
            cold_starts: self.cold_starts,
            cached_blocks_lost: self.cached_lost,
            finished_unobserved: unobserved,
            commands_refused: self.refused,
            timeline: self.timeline,
            intervals: self.intervals,
        });
        report
    }

    /// Pays for every worker of every pool from the last accounting to `at`.
    fn account(&mut self, at: Timestamp) {
        let dt = at.saturating_duration_since(self.accounted_to).as_nanos() as f64;
        for pool in &mut self.pools {
            pool.paid_ns += pool.paid() as f64 * dt;
        }
        self.accounted_to = self.accounted_to.max(at);
    }

    /// Workers whose loading is done by `at` join their pools, empty.
    fn join_loaded(&mut self, at: Timestamp) {
        for p in 0..self.pools.len() {
            while self.pools[p].loading.first().is_some_and(|r| *r <= at) {
                self.pools[p].loading.remove(0);
                match add_worker(&mut self.cluster, self.pools[p].kind) {
                    Ok(id) => self.pools[p].serving.push(id),
                    // The cluster's shape was checked with the scenario: this is a bug,
                    // counted rather than fatal.
                    Err(_) => self.refused += 1,
                }
                let pool = &mut self.pools[p];
                pool.peak = pool.peak.max(pool.serving.len());
            }
        }
    }

    /// Counts `finished` against the SLO; returns the interval's latencies and
    /// attainment.
    fn judge(&mut self, finished: &[Finished]) -> (IntervalLatency, IntervalLatency, f64) {
        let slo = self.spec.slo;
        let (ttft_ns, itl_ns) = ((slo.ttft_ms * 1e6) as u64, (slo.itl_ms * 1e6) as u64);
        let (mut ttft, mut itl) = (Latencies::new(), Latencies::new());
        let mut within = 0u64;
        for f in finished {
            let ttft_ok = f.ttft.is_some_and(|ns| ns <= ttft_ns);
            let itl_ok = f.tpot.is_none_or(|ns| ns <= itl_ns);
            self.within_ttft += u64::from(ttft_ok);
            self.within_itl += u64::from(itl_ok);
            within += u64::from(ttft_ok && itl_ok);
            f.ttft.into_iter().for_each(|ns| ttft.push(ns));
            f.tpot.into_iter().for_each(|ns| itl.push(ns));
        }
        self.within_both += within;
        self.finished += finished.len() as u64;
        let attainment = if finished.is_empty() {
            1.0
        } else {
            within as f64 / finished.len() as f64
        };
        (percentiles(&mut ttft), percentiles(&mut itl), attainment)
    }

    /// The end of an interval: what it saw, the planner's wishes, and their carrying
    /// out. Returns whether a pool changed.
    fn interval_ends(&mut self, at: Timestamp) -> bool {
        let at_s = at.as_nanos() as f64 / 1e9;
        let finished = self.cluster.drain_finished();
        let (ttft, itl, attainment) = self.judge(&finished);
        if attainment < self.spec.slo.attainment {
            self.violation_s += self.interval.as_secs_f64();
        }
        let (requests, isl, osl) = self.arrivals.borrow_mut().take(self.ticks);
        let snapshots = self.cluster.worker_snapshots();
        self.forget_departed(&snapshots);
        let observation = IntervalObservation {
            at_s,
            interval_s: self.interval.as_secs_f64(),
            requests,
            mean_isl: isl as f64 / requests.max(1) as f64,
            mean_osl: osl as f64 / requests.max(1) as f64,
            finished: finished.len() as u64,
            ttft,
            itl,
            pools: self
                .pools
                .iter()
                .map(|p| observe_pool(p, &snapshots))
                .collect(),
        };
        let targets = self.planner.decide(&observation);
        let mut scaled = false;
        for target in targets {
            if let Some(p) = self.pools.iter().position(|p| p.kind == target.pool) {
                scaled |= self.carry_out(p, &target, at, &snapshots);
            }
        }
        self.intervals.push(IntervalSample {
            at_s,
            request_rate: observation.request_rate(),
            finished: observation.finished,
            attainment,
            ttft_p90_ms: ttft.p90_ms,
            itl_p90_ms: itl.p90_ms,
            serving: self.pools.iter().map(|p| p.serving.len()).collect(),
            loading: self.pools.iter().map(|p| p.loading.len()).collect(),
            draining: self.pools.iter().map(|p| p.draining.len()).collect(),
            queued_per_worker: observation
                .pools
                .iter()
                .map(PoolObservation::queued_per_worker)
                .collect(),
            kv_usage: observation
                .pools
                .iter()
                .map(PoolObservation::kv_usage)
                .collect(),
        });
        self.ticks += 1;
        self.next_tick = self.next_tick.saturating_add(self.interval);
        scaled
    }

    /// Draining workers that left are paid for no more; their caches left with them.
    fn forget_departed(&mut self, snapshots: &[WorkerSnapshot]) {
        for pool in &mut self.pools {
            let mut gone = Vec::new();
            for (id, cached) in pool.draining.iter_mut() {
                match snapshots.get(id.get() as usize) {
                    Some(s) if s.status != WorkerStatus::Removed => *cached = cached_blocks(s),
                    _ => gone.push(*id),
                }
            }
            for id in gone {
                self.cached_lost += pool.draining.remove(&id).unwrap_or(0);
            }
        }
    }

    /// Moves pool `p` towards `target`, within the bounds and the hysteresis; returns
    /// whether its size changed.
    fn carry_out(
        &mut self,
        p: usize,
        target: &Target,
        at: Timestamp,
        snapshots: &[WorkerSnapshot],
    ) -> bool {
        let (min, max) = (self.spec.min_replicas, self.spec.max_replicas);
        let size = self.pools[p].size();
        let mut want = target.replicas.clamp(min, max);
        let mut notes = Vec::new();
        if want != target.replicas {
            notes.push(format!("wanted {}, bounds {min}..={max}", target.replicas));
        }
        if let Some(h) = self.spec.hysteresis {
            let pool = &mut self.pools[p];
            if want < size {
                if let Some(needed) = target.needed {
                    let padded = ((needed * (1.0 + h.headroom)).ceil() as usize).clamp(min, max);
                    if padded > want {
                        notes.push(format!(
                            "{:.0}% headroom keeps {padded}",
                            h.headroom * 100.0
                        ));
                        want = padded;
                    }
                }
            }
            if want < size {
                pool.smaller_wishes.push(want);
                if pool.smaller_wishes.len() < h.down_intervals {
                    want = size;
                } else {
                    want = pool.smaller_wishes.iter().copied().max().unwrap_or(want);
                    notes.push(format!("smaller for {} intervals", h.down_intervals));
                    pool.smaller_wishes.clear();
                }
            } else {
                pool.smaller_wishes.clear();
            }
        }
        if want == size {
            return false;
        }
        let grew = want > size;
        let pool = &mut self.pools[p];
        if pool.last_grew.is_some_and(|last| last != grew) {
            self.flips += 1;
        }
        pool.last_grew = Some(grew);
        let mut reason = target.reason.clone();
        for note in notes {
            reason.push_str("; ");
            reason.push_str(&note);
        }
        self.timeline.push(Decision {
            at_s: at.as_nanos() as f64 / 1e9,
            pool: pool.kind,
            from: size,
            to: want,
            reason,
        });
        if grew {
            self.scale_ups += 1;
            self.cold_starts += (want - size) as u64;
            let ready = at.saturating_add(Duration::from_secs_f64(self.spec.scale_up_delay_s));
            pool.loading.extend(std::iter::repeat_n(ready, want - size));
            if self.spec.scale_up_delay_s == 0.0 {
                self.join_loaded(at);
            }
        } else {
            self.scale_downs += 1;
            for _ in want..size {
                // Newest first: a worker still loading is cancelled before one serves.
                if pool.loading.pop().is_some() {
                    continue;
                }
                let Some(id) = pool.serving.pop() else { break };
                let cached = snapshots.get(id.get() as usize).map_or(0, cached_blocks);
                let how = match self.spec.scale_down {
                    ScaleDown::Drain => Removal::Drain,
                    ScaleDown::Kill => Removal::Kill,
                };
                match self.cluster.remove_worker(id, how) {
                    Ok(()) if how == Removal::Drain => {
                        pool.draining.insert(id, cached);
                    }
                    Ok(()) => self.cached_lost += cached,
                    Err(_) => self.refused += 1,
                }
            }
            // A drained worker with nothing left is gone at once.
            let snapshots = self.cluster.worker_snapshots();
            self.forget_departed(&snapshots);
        }
        true
    }
}

/// Adds an empty worker to pool `kind`.
fn add_worker(cluster: &mut Cluster<'_>, kind: PoolKind) -> Result<WorkerId, CommandError> {
    match kind {
        PoolKind::Aggregated => cluster.add_worker(),
        PoolKind::Prefill => cluster.add_worker_to(Pool::Prefill),
        PoolKind::Decode => cluster.add_worker_to(Pool::Decode),
    }
}

/// Blocks cached (held by nobody) on a worker, over its device, host and disk tiers.
fn cached_blocks(snapshot: &WorkerSnapshot) -> u64 {
    [Tier::Device, Tier::Host, Tier::Disk]
        .iter()
        .filter_map(|tier| snapshot.blocks[tier.index()])
        .map(|blocks| blocks.cached as u64)
        .sum()
}

/// What the planner sees of pool `pool`.
fn observe_pool(pool: &PoolState, snapshots: &[WorkerSnapshot]) -> PoolObservation {
    let workers = pool
        .serving
        .iter()
        .filter_map(|id| snapshots.get(id.get() as usize))
        .filter(|s| s.status == WorkerStatus::Serving)
        .map(|s| {
            let device = s.blocks[Tier::Device.index()].unwrap_or_default();
            WorkerLoad {
                worker: s.id.get(),
                queued: s.queued,
                running: s.running,
                kv_usage: device.active as f64 / device.capacity.max(1) as f64,
            }
        })
        .collect();
    PoolObservation {
        kind: pool.kind,
        replicas: pool.serving.len(),
        loading: pool.loading.len(),
        workers,
    }
}

/// The median, 90th and 99th percentiles of `samples` (nanoseconds), in milliseconds.
fn percentiles(samples: &mut Latencies) -> IntervalLatency {
    if samples.is_empty() {
        return IntervalLatency::default();
    }
    let ms = |ns: u64| ns as f64 / 1e6;
    IntervalLatency {
        mean_ms: samples.mean() / 1e6,
        p50_ms: ms(samples.quantile(0.5)),
        p90_ms: ms(samples.quantile(0.9)),
        p99_ms: ms(samples.quantile(0.99)),
    }
}
