//! The report of a run: what users compare across versions, so its fields and their
//! order are part of the interface (the JSON is byte for byte the same for the same
//! scenario and seed; `tests/common` keeps the digests).
//!
//! Owns: [`Report`] and its sections, its JSON and its human summary, and [`Tally`], the
//! cluster's counters and latency samples that become it.
//! Never: check the cluster (it reports what [`crate::checkers`] found).

use super::Cluster;
use crate::autoscale::AutoscaleReport;
use crate::checkers;
use crate::hardware::LinkUsage;
use crate::mooncake::{TraceInput, TraceMismatch};
use crate::scenario::Routing;
use crate::shared::SharedTierReport;
use kvtwin::stats::Latencies;
use serde::Serialize;
use std::fmt;
use std::time::Duration;

/// What the run counted so far, for its report.
#[derive(Default)]
pub(super) struct Tally {
    pub(super) events: EventCounts,
    pub(super) sources: BlockSources,
    pub(super) ttft: Latencies,
    pub(super) e2e: Latencies,
    pub(super) tpot: Latencies,
    pub(super) queueing: Latencies,
    pub(super) preemptions: u64,
    /// Output tokens of completed requests.
    pub(super) output_tokens: u64,
    pub(super) completed: u64,
    /// Requests larger than the device tier.
    pub(super) too_large: u64,
    pub(super) output_blocks_cached: u64,
    pub(super) think_blocks_cooled: u64,
    /// Times a request waited for device blocks.
    pub(super) waits: u64,
    pub(super) passes: u64,
    /// Things the cluster was woken up for (the simulator's own work).
    pub(super) engine_events: u64,
}

/// Where the prompt blocks of the served requests came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct BlockSources {
    /// Full prompt blocks of served requests.
    pub total: u64,
    /// Already on device.
    pub device: u64,
    /// Onboarded from host.
    pub host: u64,
    /// Onboarded from disk.
    pub disk: u64,
    /// Onboarded from remote.
    pub remote: u64,
    /// Read from the shared tier (left out of the JSON when none were, as without one).
    #[serde(skip_serializing_if = "is_zero")]
    pub shared: u64,
    /// Computed (prefilled).
    pub computed: u64,
    /// Prompt tokens of served requests.
    pub prompt_tokens: u64,
    /// Of those, tokens in cached blocks: min(cached blocks × block tokens, prompt
    /// tokens) per request (the Mooncake reference's `hit_tokens`).
    pub hit_tokens: u64,
}

impl BlockSources {
    /// Fraction of prompt blocks not computed (0 before any): the report's `hit_ratio`,
    /// and a driver's mid-run from [`super::ClusterSnapshot::blocks`].
    pub fn hit_ratio(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            1.0 - self.computed as f64 / self.total as f64
        }
    }

    /// Fraction of prompt tokens in cached blocks (0 before any): the report's
    /// `hit_token_ratio`.
    pub fn hit_token_ratio(&self) -> f64 {
        if self.prompt_tokens == 0 {
            0.0
        } else {
            self.hit_tokens as f64 / self.prompt_tokens as f64
        }
    }
}

/// Latency statistics in milliseconds (predictions of the model).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct Percentiles {
    /// Mean.
    pub mean_ms: f64,
    /// Median.
    pub p50_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Maximum.
    pub max_ms: f64,
}

impl Percentiles {
    pub(crate) fn of(mut samples: Latencies) -> Self {
        Self::of_samples(&mut samples)
    }

    /// The statistics of `samples` (sorted in place, which changes nothing else).
    pub(super) fn of_samples(samples: &mut Latencies) -> Self {
        let summary = samples.summary();
        let ms = |span: Duration| span.as_nanos() as f64 / 1e6;
        Self {
            mean_ms: summary.mean_ns / 1e6,
            p50_ms: ms(summary.p50),
            p90_ms: ms(summary.p90),
            p99_ms: ms(summary.p99),
            max_ms: ms(summary.max),
        }
    }
}

/// One kind of link's traffic, summed over the nodes.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LinkReport {
    /// The link.
    pub link: &'static str,
    /// Bytes carried.
    pub bytes: u64,
    /// Transfers carried.
    pub transfers: u64,
    /// Busy time over simulated time, averaged over the nodes.
    pub utilisation: f64,
}

/// Events the workers emitted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct EventCounts {
    /// Events.
    pub events: u64,
    /// Blocks in `Stored` events.
    pub stored_blocks: u64,
    /// Blocks in `Removed` events.
    pub removed_blocks: u64,
    /// Whether replaying each worker's events rebuilt every tier's registry: no block
    /// the pools lack, and every block a prefix lookup can reach (exactly the pools'
    /// blocks, unless a snapshot left out some that none can reach).
    pub rebuild_matches_pools: bool,
}

/// What the router did.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RoutingReport {
    /// `kv` or `round_robin`.
    pub mode: &'static str,
    /// Requests sent to each worker.
    pub requests_per_worker: Vec<u64>,
    /// Mean overlap (blocks, any tier) the router saw on the worker it chose (KV routing).
    pub mean_overlap_blocks: f64,
    /// Events the router applied.
    pub events_applied: u64,
    /// Events the router refused (counted by kind in its indexer).
    pub events_rejected: u64,
    /// Events lost on the event plane.
    pub events_dropped: u64,
    /// Whether, at the end, the router's view of every worker is that worker's pools.
    pub view_matches_pools: bool,
}

/// What the fault timeline did, and how the cluster recovered.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct FaultReport {
    /// Faults that began.
    pub applied: u64,
    /// Requests started again after their worker crashed.
    pub requests_retried: u64,
    /// Snapshots workers sent the router (after a gap, a heartbeat showing it behind,
    /// or a router restart).
    pub snapshots: u64,
    /// Requests still waiting for a worker at the end (none came back).
    pub requests_unserved: u64,
    /// Blocks lost with a failed SSD (each announced to the router as removed).
    pub disk_blocks_lost: u64,
    /// Transfers to or from a disk that were in flight when it failed.
    pub disk_transfers_failed: u64,
}

/// What the prefill and decode pools did, and the KV handoffs between them.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DisaggregationReport {
    /// Workers in the prefill pool (the first ones), or, when the driver added or
    /// removed workers, every worker the pool ever had (see `prefill_pool`).
    pub prefill_workers: usize,
    /// Workers in the decode pool (the rest), or every worker it ever had.
    pub decode_workers: usize,
    /// Blocks in one MRDN frame at most.
    pub frame_blocks: usize,
    /// Handoffs whose last frame landed.
    pub handoffs: u64,
    /// MRDN frames sent (those of aborted handoffs included).
    pub frames: u64,
    /// Bytes of the frames sent (whole, aborted ones too), MRDN headers included.
    pub bytes: u64,
    /// Of those, MRDN headers.
    pub header_bytes: u64,
    /// First frame sent to last frame landed, per handoff.
    pub handoff_latency: Percentiles,
    /// End of the prefill to the first frame sent, per handoff: the wait for blocks on
    /// the decode worker.
    pub handoff_wait: Percentiles,
    /// Handoffs that found no free device blocks on their decode worker and waited.
    pub waits_for_decode_blocks: u64,
    /// Requests each prefill worker handed off, aborted handoffs included (index:
    /// worker; with workers added or removed, the prefill pool's workers ever, in worker
    /// order, as `prefill_pool` lists them).
    pub handed_off_per_prefill_worker: Vec<u64>,
    /// Handoffs each decode worker received (index: worker less `prefill_workers`; with
    /// workers added or removed, the decode pool's workers ever, as `decode_pool` lists
    /// them).
    pub received_per_decode_worker: Vec<u64>,
    /// The prefill pool's workers ever (removed ones too), in worker order; `None`, and
    /// absent from the JSON, unless the driver added or removed a worker (the pool is
    /// then the first `prefill_workers`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prefill_pool: Option<Vec<usize>>,
    /// The decode pool's workers ever, likewise; `None` without commands (the rest).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decode_pool: Option<Vec<usize>>,
    /// Requests done on their prefill worker (nothing left to hand off: one output
    /// token, or a retried request whose new prefill produced its last).
    pub finished_at_prefill: u64,
    /// Handoffs aborted because their prefill or decode worker crashed (their requests
    /// are prefilled again).
    pub handoffs_aborted: u64,
    /// Of their frames, those in flight on the fabric when aborted (they never land).
    pub frames_aborted: u64,
    /// The fabric's links: the prefill nodes' NICs out, the decode nodes' NICs in (each
    /// summed over its pool, utilisation averaged over the pool's workers ever), and the
    /// switch if modelled.
    pub links: Vec<LinkReport>,
}

/// Blocks filled by generated tokens, cached like prompt blocks
/// ([`crate::scenario::WorkerSpec::cache_output_blocks`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct OutputBlocksReport {
    /// Generated blocks registered (a recomputed one counts again).
    pub cached: u64,
    /// Reasoning blocks tagged `ThinkComplete` at their request's ExitThink point
    /// (those still on the device then).
    pub reasoning_cooled: u64,
}

/// What a run did.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    /// Scenario name.
    pub scenario: String,
    /// The seed.
    pub seed: u64,
    /// Workers in the cluster.
    pub workers: usize,
    /// Requests in the workload.
    pub requests: u64,
    /// Requests served to the end.
    pub completed: u64,
    /// Requests larger than the device tier (never servable).
    pub rejected_too_large: u64,
    /// Times a request waited for device blocks.
    pub waits_for_blocks: u64,
    /// Where prompt blocks came from.
    pub blocks: BlockSources,
    /// Fraction of prompt blocks not computed.
    pub hit_ratio: f64,
    /// Fraction of prompt tokens in cached blocks.
    pub hit_token_ratio: f64,
    /// Time to first token.
    pub ttft: Percentiles,
    /// Arrival to last token.
    pub end_to_end: Percentiles,
    /// Time per output token after the first, per request with two or more.
    pub tpot: Percentiles,
    /// Arrival to the first pass that takes the request: waiting for device blocks, an
    /// onboarding transfer, or room in a pass.
    pub queueing: Percentiles,
    /// Output tokens of completed requests per simulated second.
    pub output_tokens_per_s: f64,
    /// Lower-tier hits recomputed because that was predicted faster.
    pub recomputed_hit_blocks: u64,
    /// Blocks copied down, per destination tier (device, host, disk, remote).
    pub offloaded_blocks: [u64; 4],
    /// Offloads skipped for lack of room.
    pub offload_skipped_blocks: u64,
    /// Transfers submitted.
    pub transfers: u64,
    /// Traffic per kind of link.
    pub links: Vec<LinkReport>,
    /// Events emitted.
    pub events: EventCounts,
    /// Routing.
    pub routing: RoutingReport,
    /// Faults and recovery.
    pub faults: FaultReport,
    /// Prefill and decode pools and the handoffs between them; absent when every worker
    /// is aggregated (and then left out of the JSON, which is as before).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disaggregation: Option<DisaggregationReport>,
    /// Blocks of generated tokens cached; absent unless the worker caches them (and then
    /// left out of the JSON).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_blocks: Option<OutputBlocksReport>,
    /// What the planner did and what it cost; absent unless the scenario has an
    /// `autoscale` section (and then left out of the JSON).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub autoscale: Option<AutoscaleReport>,
    /// The shared tier: what it held, served and cost in traffic, and the hit ratios it
    /// gave; absent without one (capacity 0, and then left out of the JSON).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shared_tier: Option<SharedTierReport>,
    /// What the trace's row check found (rows, rows changed and how); absent for a
    /// synthetic workload (and then left out of the JSON). The simulator never sees the
    /// file: whoever read it sets this.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trace: Option<TraceInput>,
    /// Simulated time at the end.
    pub simulated_s: f64,
    /// Forward passes run.
    pub passes: u64,
    /// Requests taken off the device to make room (recompute preemption).
    pub preemptions: u64,
    /// Things the simulator's event queue woke the cluster for (arrivals, passes,
    /// transfer deadlines, deliveries): the simulator's own work, for `kvtwin bench sim`.
    /// (The name predates kvtwin's rule that "engine" means vLLM or SGLang; it stays, as
    /// users compare reports by their fields.)
    pub engine_events: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// `n` of `total` (0 of nothing).
fn ratio(n: u64, total: u64) -> f64 {
    if total == 0 {
        0.0
    } else {
        n as f64 / total as f64
    }
}

impl Report {
    /// The report as one line of JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|error| format!("{{\"error\":\"{error}\"}}"))
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = &self.blocks;
        let pct = |n: u64| {
            if b.total == 0 {
                0.0
            } else {
                100.0 * n as f64 / b.total as f64
            }
        };
        writeln!(
            f,
            "scenario {} (seed {}), {} worker(s), {:.1} s simulated, {} forward passes",
            self.scenario, self.seed, self.workers, self.simulated_s, self.passes
        )?;
        writeln!(
            f,
            "requests  {} arrived, {} completed, {} too large for the device, {} waits for blocks, {} preemptions",
            self.requests,
            self.completed,
            self.rejected_too_large,
            self.waits_for_blocks,
            self.preemptions
        )?;
        writeln!(
            f,
            "blocks    {} prompt blocks: device {:.1}%, host {:.1}%, disk {:.1}%, remote {:.1}%, computed {:.1}%",
            b.total,
            pct(b.device),
            pct(b.host),
            pct(b.disk),
            pct(b.remote),
            pct(b.computed)
        )?;
        writeln!(
            f,
            "          hit ratio {:.4} of blocks, {:.4} of tokens; {} lower-tier hits recomputed (cheaper)",
            self.hit_ratio, self.hit_token_ratio, self.recomputed_hit_blocks
        )?;
        writeln!(
            f,
            "offload   host {} / disk {} / remote {} blocks, {} skipped; {} transfers",
            self.offloaded_blocks[1],
            self.offloaded_blocks[2],
            self.offloaded_blocks[3],
            self.offload_skipped_blocks,
            self.transfers
        )?;
        for link in self.links.iter().filter(|l| l.transfers > 0) {
            writeln!(
                f,
                "link      {:<10} {:>10.1} MiB  {:>6} transfers  {:>5.1}% busy",
                link.link,
                link.bytes as f64 / 1048576.0,
                link.transfers,
                link.utilisation * 100.0
            )?;
        }
        writeln!(
            f,
            "latency   TTFT mean {:.1} ms, p50 {:.1} ms, p99 {:.1} ms; TPOT mean {:.2} ms, p99 {:.2} ms; end-to-end p50 {:.1} ms, p99 {:.1} ms (model predictions)",
            self.ttft.mean_ms,
            self.ttft.p50_ms,
            self.ttft.p99_ms,
            self.tpot.mean_ms,
            self.tpot.p99_ms,
            self.end_to_end.p50_ms,
            self.end_to_end.p99_ms
        )?;
        writeln!(
            f,
            "queueing  arrival to first pass: mean {:.1} ms, p50 {:.1} ms, p99 {:.1} ms",
            self.queueing.mean_ms, self.queueing.p50_ms, self.queueing.p99_ms
        )?;
        if let Some(trace) = &self.trace {
            writeln!(
                f,
                "trace     {} rows checked at {} tokens a block: {} with tokens past their hash_ids, {} with hash_ids past their tokens ({})",
                trace.rows,
                trace.block_tokens,
                trace.tokens_past_hash_ids,
                trace.hash_ids_past_tokens,
                match trace.mismatch {
                    TraceMismatch::Error => "none accepted",
                    TraceMismatch::Clamp => "clamped",
                    TraceMismatch::Extend => "extended",
                }
            )?;
        }
        if let Some(shared) = &self.shared_tier {
            writeln!(
                f,
                "shared    {} of {} blocks held ({}): {:.1}% of prompt blocks read from it ({:.1}% written by another worker), a read p50 {:.1} ms, p99 {:.1} ms; {} blocks written, {} evicted; {:.1} GB read, {:.1} GB written",
                shared.held_blocks,
                shared.capacity_blocks,
                shared.policy,
                shared.hit_ratio * 100.0,
                shared.cross_worker_hit_ratio * 100.0,
                shared.read_time.p50_ms,
                shared.read_time.p99_ms,
                shared.written_blocks,
                shared.evicted_blocks,
                shared.read_bytes as f64 / 1e9,
                shared.written_bytes as f64 / 1e9
            )?;
        }
        writeln!(f, "output    {:.0} tokens/s", self.output_tokens_per_s)?;
        if let Some(outputs) = &self.output_blocks {
            writeln!(
                f,
                "          {} generated blocks cached, {} reasoning blocks cooled at ExitThink",
                outputs.cached, outputs.reasoning_cooled
            )?;
        }
        let r = &self.routing;
        // Disaggregated, the router sends requests to the prefill pool only.
        let routable: Vec<u64> = match &self.disaggregation {
            Some(DisaggregationReport {
                prefill_pool: Some(pool),
                ..
            }) => pool
                .iter()
                .filter_map(|w| r.requests_per_worker.get(*w).copied())
                .collect(),
            Some(d) => {
                r.requests_per_worker[..d.prefill_workers.min(r.requests_per_worker.len())].to_vec()
            }
            None => r.requests_per_worker.clone(),
        };
        let (least, most) = (
            routable.iter().min().copied().unwrap_or(0),
            routable.iter().max().copied().unwrap_or(0),
        );
        writeln!(
            f,
            "routing   {}: {}–{} requests per worker, mean overlap {:.2} blocks; router applied {} events, refused {}, {} lost; router view matches pools: {}",
            r.mode,
            least,
            most,
            r.mean_overlap_blocks,
            r.events_applied,
            r.events_rejected,
            r.events_dropped,
            r.view_matches_pools
        )?;
        if self.faults.applied > 0 {
            write!(
                f,
                "faults    {} applied; {} requests retried, {} snapshots sent to the router, {} requests unserved",
                self.faults.applied,
                self.faults.requests_retried,
                self.faults.snapshots,
                self.faults.requests_unserved
            )?;
            if self.faults.disk_blocks_lost > 0 || self.faults.disk_transfers_failed > 0 {
                write!(
                    f,
                    "; SSD failures lost {} disk blocks and failed {} transfers",
                    self.faults.disk_blocks_lost, self.faults.disk_transfers_failed
                )?;
            }
            writeln!(f)?;
        }
        if let Some(d) = &self.disaggregation {
            writeln!(
                f,
                "disagg    {} prefill + {} decode workers: {} handoffs in {} MRDN frames (up to {} blocks), {:.1} GiB over the fabric; {} waited for decode blocks",
                d.prefill_workers,
                d.decode_workers,
                d.handoffs,
                d.frames,
                d.frame_blocks,
                d.bytes as f64 / 1073741824.0,
                d.waits_for_decode_blocks
            )?;
            writeln!(
                f,
                "handoff   first frame to last landed: mean {:.2} ms, p50 {:.2} ms, p99 {:.2} ms; wait for decode blocks p99 {:.2} ms (model predictions)",
                d.handoff_latency.mean_ms,
                d.handoff_latency.p50_ms,
                d.handoff_latency.p99_ms,
                d.handoff_wait.p99_ms
            )?;
            if d.handoffs_aborted > 0 {
                writeln!(
                    f,
                    "          {} handoffs aborted by crashes ({} frames in flight stopped)",
                    d.handoffs_aborted, d.frames_aborted
                )?;
            }
            for link in &d.links {
                writeln!(
                    f,
                    "fabric    {:<10} {:>10.1} MiB  {:>6} transfers  {:>5.1}% busy",
                    link.link,
                    link.bytes as f64 / 1048576.0,
                    link.transfers,
                    link.utilisation * 100.0
                )?;
            }
        }
        write!(
            f,
            "events    {} events, {} blocks stored, {} removed; rebuilt registry matches pools: {}",
            self.events.events,
            self.events.stored_blocks,
            self.events.removed_blocks,
            self.events.rebuild_matches_pools
        )?;
        if let Some(autoscale) = &self.autoscale {
            write!(f, "\n{}", autoscale.to_string().trim_end())?;
        }
        Ok(())
    }
}

/// One of the run's latencies, for [`Cluster::latency_quantiles`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Latency {
    /// Time to first token.
    Ttft,
    /// Time per output token after the first.
    Tpot,
    /// Arrival to last token.
    EndToEnd,
}

impl Cluster<'_> {
    /// The nearest-rank quantiles `qs` (each in 0 < q ≤ 1) of one latency so far, in
    /// milliseconds (all 0 before any sample): the points of its CDF, for plots and
    /// sweep files. Sorting the samples changes nothing observable.
    pub fn latency_quantiles(&mut self, latency: Latency, qs: &[f64]) -> Vec<f64> {
        let samples = match latency {
            Latency::Ttft => &mut self.tally.ttft,
            Latency::Tpot => &mut self.tally.tpot,
            Latency::EndToEnd => &mut self.tally.e2e,
        };
        qs.iter()
            .map(|q| samples.quantile(*q) as f64 / 1e6)
            .collect()
    }

    /// The report of the run so far (all of it, once [`Cluster::step`] returned
    /// `false`), with the end-of-run checks of [`crate::checkers`].
    pub fn into_report(self) -> Report {
        let simulated_ns = self.now.as_nanos().max(1);
        // A snapshot leaves out the blocks no prefix lookup can reach (see
        // `Manager::publish_snapshot`): after one, only those may be missing.
        let (rebuild_matches_pools, view_matches_pools) = checkers::end_of_run_checks(&self);
        let mut stats = self.workers[0].manager.stats();
        for worker in &self.workers[1..] {
            let more = worker.manager.stats();
            stats.recomputed_hit_blocks += more.recomputed_hit_blocks;
            for (sum, add) in stats.offloaded_blocks.iter_mut().zip(more.offloaded_blocks) {
                *sum += add;
            }
            stats.offload_skipped_blocks += more.offload_skipped_blocks;
            stats.transfers_submitted += more.transfers_submitted;
        }
        // Links by kind, summed over the nodes (each worker is a node of `hardware`).
        let mut usage: Vec<(&'static str, LinkUsage)> = Vec::new();
        for worker in &self.workers {
            for (index, (link, add)) in worker
                .manager
                .hardware()
                .link_usage()
                .into_iter()
                .enumerate()
            {
                if usage.len() <= index {
                    usage.push((link.name(), LinkUsage::default()));
                }
                let sum = &mut usage[index].1;
                sum.bytes += add.bytes;
                sum.busy_ns += add.busy_ns;
                sum.transfers += add.transfers;
            }
        }
        let nodes = self.workers.len() as f64;
        let links = usage
            .into_iter()
            .map(|(link, usage)| LinkReport {
                link,
                bytes: usage.bytes,
                transfers: usage.transfers,
                utilisation: usage.busy_ns as f64 / simulated_ns as f64 / nodes,
            })
            .collect();
        let sources = self.tally.sources;
        let (hit_ratio, hit_token_ratio) = (sources.hit_ratio(), sources.hit_token_ratio());
        let disaggregation = self.disagg.as_ref().map(|d| d.report(simulated_ns));
        let counters = self.router_counters();
        let routing = RoutingReport {
            mode: match self.route.mode {
                Routing::Kv => "kv",
                Routing::RoundRobin => "round_robin",
            },
            requests_per_worker: self.workers.iter().map(|w| w.routed).collect(),
            mean_overlap_blocks: counters.mean_overlap_blocks,
            events_applied: counters.events_applied,
            events_rejected: counters.events_rejected,
            events_dropped: counters.events_dropped,
            view_matches_pools,
        };
        Report {
            hit_token_ratio,
            scenario: self.scenario.clone(),
            seed: self.seed,
            workers: self.workers.len(),
            requests: self.requests.arrived,
            completed: self.tally.completed,
            rejected_too_large: self.tally.too_large,
            waits_for_blocks: self.tally.waits,
            blocks: sources,
            hit_ratio,
            ttft: Percentiles::of(self.tally.ttft),
            end_to_end: Percentiles::of(self.tally.e2e),
            tpot: Percentiles::of(self.tally.tpot),
            queueing: Percentiles::of(self.tally.queueing),
            output_tokens_per_s: self.tally.output_tokens as f64 / (simulated_ns as f64 / 1e9),
            recomputed_hit_blocks: stats.recomputed_hit_blocks,
            offloaded_blocks: stats.offloaded_blocks,
            offload_skipped_blocks: stats.offload_skipped_blocks,
            transfers: stats.transfers_submitted,
            links,
            events: EventCounts {
                rebuild_matches_pools,
                ..self.tally.events
            },
            routing,
            faults: FaultReport {
                applied: self.faults.applied,
                requests_retried: self.faults.requests_retried,
                snapshots: self.plane.snapshots,
                // Parked for a prefill worker, or prefilled and waiting for a decode one.
                requests_unserved: (self.requests.parked.len()
                    + self.disagg.as_ref().map_or(0, |d| d.unassigned.len()))
                    as u64,
                disk_blocks_lost: self.faults.disk_blocks_lost,
                disk_transfers_failed: self.faults.disk_transfers_failed,
            },
            disaggregation,
            output_blocks: self
                .shape
                .cache_output_blocks
                .then_some(OutputBlocksReport {
                    cached: self.tally.output_blocks_cached,
                    reasoning_cooled: self.tally.think_blocks_cooled,
                }),
            shared_tier: self.shared.report().map(|shared| SharedTierReport {
                hit_ratio: ratio(shared.read_blocks, sources.total),
                cross_worker_hit_ratio: ratio(shared.cross_worker_blocks, sources.total),
                ..shared
            }),
            autoscale: None,
            trace: None,
            simulated_s: simulated_ns as f64 / 1e9,
            passes: self.tally.passes,
            preemptions: self.tally.preemptions,
            engine_events: self.tally.engine_events,
        }
    }
}
