//! What a driver sees of a running cluster: a cheap [`ClusterSnapshot`] between steps,
//! and the read-only [`WorkerView`]s the checkers use.
//!
//! Owns: the snapshot types and their making. Counters in a snapshot are cumulative from
//! the start of the run (or of the worker); a rate is the difference between two
//! snapshots over the simulated time between them ([`WorkerSnapshot::rates_since`]).
//! Link utilisation is busy time over simulated time so far.
//! Never: change the cluster (sorting latency samples in place is the one exception, and
//! it changes nothing observable: order does not matter to them).

use super::worker::Worker;
use super::{BlockSources, Cluster, Percentiles, Pool};
use crate::hardware::SimHardware;
use crate::ledger::EventLedger;
use kvtwin::ids::WorkerWithDpRank;
use kvtwin::ids::{Timestamp, WorkerId};
use kvtwin::manager::Manager;
use kvtwin::router::Router;
use kvtwin::tier::Tier;
use std::time::Duration;

/// Where a worker stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WorkerStatus {
    /// Serving, and routed to.
    Serving,
    /// Serving what it has, routed nothing more ([`super::Removal::Drain`]).
    Draining,
    /// Crashed; it comes back empty.
    Down,
    /// Left the cluster for good.
    Removed,
}

/// Blocks of one tier of a worker.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TierBlocks {
    /// The tier's capacity.
    pub capacity: usize,
    /// Held by requests (or transfers).
    pub active: usize,
    /// Registered and held by nobody: reusable, evictable.
    pub cached: usize,
}

/// One worker, at the time of the snapshot.
#[derive(Clone, Debug, PartialEq)]
pub struct WorkerSnapshot {
    /// Its id.
    pub id: WorkerId,
    /// Where it stands.
    pub status: WorkerStatus,
    /// Its pool in a disaggregated cluster; `None` in an aggregated one.
    pub pool: Option<Pool>,
    /// Blocks per tier (index: `Tier::index`); `None` for a tier it does not have (or
    /// whose SSD is down).
    pub blocks: [Option<TierBlocks>; 4],
    /// Requests waiting for device blocks, or for a prefill pass to take them (a
    /// prompt between two chunks included).
    pub queued: usize,
    /// The other requests on it (onboarding, prefilling in the pass in flight,
    /// decoding, or in a handoff): `queued + running` is every request it holds.
    pub running: usize,
    /// Requests the router sent it.
    pub routed: u64,
    /// Requests it finished.
    pub completed: u64,
    /// Output tokens of the requests it finished.
    pub output_tokens: u64,
    /// KV events it published.
    pub events_published: u64,
}

/// A worker's rates between two snapshots.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct WorkerRates {
    /// Requests routed to it per second.
    pub routed_per_s: f64,
    /// Requests finished per second.
    pub completed_per_s: f64,
    /// Output tokens (of finished requests) per second.
    pub output_tokens_per_s: f64,
    /// KV events published per second.
    pub events_per_s: f64,
}

impl WorkerSnapshot {
    /// Its rates since `earlier` (the same worker), over `elapsed` simulated time; zero
    /// when no time passed.
    pub fn rates_since(&self, earlier: &WorkerSnapshot, elapsed: Duration) -> WorkerRates {
        let seconds = elapsed.as_secs_f64();
        if seconds <= 0.0 {
            return WorkerRates::default();
        }
        let rate = |now: u64, then: u64| now.saturating_sub(then) as f64 / seconds;
        WorkerRates {
            routed_per_s: rate(self.routed, earlier.routed),
            completed_per_s: rate(self.completed, earlier.completed),
            output_tokens_per_s: rate(self.output_tokens, earlier.output_tokens),
            events_per_s: rate(self.events_published, earlier.events_published),
        }
    }
}

/// One link of one node (a worker's PCIe, NVMe, NIC; or a fabric link).
#[derive(Clone, Debug, PartialEq)]
pub struct LinkSnapshot {
    /// The node's worker; `None` for the switch between the nodes.
    pub worker: Option<WorkerId>,
    /// The link's name (as in the report).
    pub link: &'static str,
    /// Bytes carried so far.
    pub bytes: u64,
    /// Transfers carried so far.
    pub transfers: u64,
    /// Busy time over simulated time so far.
    pub utilisation: f64,
}

/// The router in the loop and the event plane feeding it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RouterSnapshot {
    /// Requests routed.
    pub routed: u64,
    /// Mean overlap (blocks) on the chosen worker.
    pub mean_overlap_blocks: f64,
    /// Events it applied, refused, and that were lost on the plane.
    pub events_applied: u64,
    /// Events it refused.
    pub events_rejected: u64,
    /// Events lost on the plane.
    pub events_dropped: u64,
    /// Snapshots workers sent it.
    pub snapshots: u64,
    /// Requests waiting for a worker to be up.
    pub parked: usize,
}

/// Latencies of the requests so far (predictions of the model).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LatencySnapshot {
    /// Time to first token.
    pub ttft: Percentiles,
    /// Time per output token after the first.
    pub tpot: Percentiles,
    /// Arrival to last token.
    pub end_to_end: Percentiles,
    /// Arrival to the first pass that took the request.
    pub queueing: Percentiles,
}

/// The cluster between two steps.
#[derive(Clone, Debug, PartialEq)]
pub struct ClusterSnapshot {
    /// Simulated time.
    pub at: Timestamp,
    /// Requests arrived, finished, in flight, and too large for any worker.
    pub requests_arrived: u64,
    /// Requests finished.
    pub requests_completed: u64,
    /// Requests in flight.
    pub requests_in_flight: usize,
    /// Requests refused (larger than a worker's device tier).
    pub requests_rejected: u64,
    /// Forward passes run, and requests preempted.
    pub passes: u64,
    /// Requests preempted.
    pub preemptions: u64,
    /// Faults that began.
    pub faults_applied: u64,
    /// Where the prompt blocks of the requests so far came from
    /// ([`BlockSources::hit_ratio`] is the report's `hit_ratio`, mid-run).
    pub blocks: BlockSources,
    /// Every worker, by id.
    pub workers: Vec<WorkerSnapshot>,
    /// Every worker's links, then the fabric's (disaggregated).
    pub links: Vec<LinkSnapshot>,
    /// The router.
    pub router: RouterSnapshot,
    /// Latencies so far.
    pub latency: LatencySnapshot,
}

/// A worker as the checkers see it.
pub struct WorkerView<'c> {
    /// Its id and rank, as the router knows it.
    pub key: WorkerWithDpRank,
    /// Whether it is serving (the router should then know it; otherwise not).
    pub serving: bool,
    /// Its manager.
    pub manager: &'c Manager<SimHardware>,
    /// Its events, as the rebuild check keeps them.
    pub ledger: &'c EventLedger,
}

/// Requests of `worker`'s prefill queue (each also in its states) that the pass in
/// flight is prefilling: running, not queued.
fn in_pass(worker: &Worker) -> usize {
    worker.pass.as_ref().map_or(0, |pass| {
        worker
            .prefill_queue
            .iter()
            .filter(|i| pass.members.iter().any(|(m, _)| m == *i))
            .count()
    })
}

impl Cluster<'_> {
    /// The router in the loop.
    pub fn router(&self) -> &Router {
        &self.route.router
    }

    /// Every worker, by id (those that left included).
    pub fn workers(&self) -> impl Iterator<Item = WorkerView<'_>> {
        self.workers.iter().map(|worker| WorkerView {
            key: worker.key,
            serving: worker.up,
            manager: &worker.manager,
            ledger: &worker.ledger,
        })
    }

    /// The workers serving in `pool` now (up, not draining, not removed), in worker
    /// order: `Some` pool of a disaggregated cluster, or with `None` every serving
    /// worker of an aggregated one (the other combinations have none). Cheap enough to
    /// ask at every step: one pass over the workers, nothing sorted.
    pub fn serving_in(&self, pool: Option<Pool>) -> Vec<WorkerId> {
        let in_pool = |w: usize| match (&self.disagg, pool) {
            (Some(disagg), Some(pool)) => disagg.is_in(w, pool),
            (None, None) => true,
            _ => false,
        };
        self.workers
            .iter()
            .enumerate()
            .filter(|(w, worker)| {
                worker.up && !worker.removed && !self.draining.contains(w) && in_pool(*w)
            })
            .map(|(_, worker)| worker.key.worker)
            .collect()
    }

    /// The router's counters so far (the report's routing section takes them too).
    pub(super) fn router_counters(&self) -> RouterSnapshot {
        let routed: u64 = self.workers.iter().map(|w| w.routed).sum();
        RouterSnapshot {
            routed,
            mean_overlap_blocks: if routed == 0 {
                0.0
            } else {
                self.route.overlap_blocks as f64 / routed as f64
            },
            events_applied: self.plane.delivered - self.plane.rejected,
            events_rejected: self.plane.rejected,
            events_dropped: self.plane.dropped,
            snapshots: self.plane.snapshots,
            parked: self.requests.parked.len(),
        }
    }

    /// Every worker now, by id: its status, blocks and load, without the latencies
    /// and links of a full [`snapshot`](Self::snapshot) (a planner looks at this every
    /// interval).
    pub fn worker_snapshots(&self) -> Vec<WorkerSnapshot> {
        self.workers
            .iter()
            .enumerate()
            .map(|(w, worker)| WorkerSnapshot {
                id: worker.key.worker,
                status: if worker.removed {
                    WorkerStatus::Removed
                } else if !worker.up {
                    WorkerStatus::Down
                } else if self.draining.contains(&w) {
                    WorkerStatus::Draining
                } else {
                    WorkerStatus::Serving
                },
                pool: self.disagg.as_ref().map(|d| d.pool_of[w]),
                blocks: Tier::ALL.map(|tier| {
                    worker.manager.pool(tier).map(|pool| {
                        let counts = pool.counts();
                        TierBlocks {
                            capacity: counts.capacity,
                            active: counts.active,
                            cached: counts.cached,
                        }
                    })
                }),
                queued: worker.waiting.len() + worker.prefill_queue.len() - in_pass(worker),
                running: worker.states.len() - (worker.prefill_queue.len() - in_pass(worker)),
                routed: worker.routed,
                completed: worker.completed,
                output_tokens: worker.output_tokens,
                events_published: worker.events_published,
            })
            .collect()
    }

    /// The cluster now. Cheap enough to take between any two steps: it walks the
    /// workers and their links, and sorts latency samples only where new ones came.
    pub fn snapshot(&mut self) -> ClusterSnapshot {
        let at = self.now();
        let elapsed_ns = self.now.as_nanos().max(1) as f64;
        let workers = self.worker_snapshots();
        let mut links: Vec<LinkSnapshot> = Vec::new();
        for worker in &self.workers {
            for (link, usage) in worker.manager.hardware().link_usage() {
                links.push(LinkSnapshot {
                    worker: Some(worker.key.worker),
                    link: link.name(),
                    bytes: usage.bytes,
                    transfers: usage.transfers,
                    utilisation: usage.busy_ns as f64 / elapsed_ns,
                });
            }
        }
        if let Some(disagg) = &self.disagg {
            links.extend(disagg.link_snapshots(elapsed_ns));
        }
        let router = self.router_counters();
        let tally = &mut self.tally;
        let latency = LatencySnapshot {
            ttft: Percentiles::of_samples(&mut tally.ttft),
            tpot: Percentiles::of_samples(&mut tally.tpot),
            end_to_end: Percentiles::of_samples(&mut tally.e2e),
            queueing: Percentiles::of_samples(&mut tally.queueing),
        };
        ClusterSnapshot {
            at,
            requests_arrived: self.requests.arrived,
            requests_completed: self.tally.completed,
            requests_in_flight: self.requests.live.len(),
            requests_rejected: self.tally.too_large,
            passes: self.tally.passes,
            preemptions: self.tally.preemptions,
            faults_applied: self.faults.applied,
            blocks: self.tally.sources,
            workers,
            links,
            router,
            latency,
        }
    }
}
