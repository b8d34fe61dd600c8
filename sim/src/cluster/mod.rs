//! The simulated cluster: workers serving a workload, the router in the loop, the
//! simulated event plane, faults and disaggregation, as one steppable state machine
//! ([`Cluster`]); and [`simulate`], which runs one to the end and reports.
//!
//! Owns: the run loop and the dispatch of what the queue wakes the cluster for
//! (`Wakeup`), the driver's commands (add a worker, to a [`Pool`] when disaggregated,
//! remove one, inject a fault), and the grouping of the cluster's state, one piece per
//! file:
//! - `worker`: a worker and the life of a request on it (routing, lookup and
//!   onboarding, prefill admission, waiting for blocks, finishing), and the worker's
//!   side of the one manager drain loop (`kvtwin::manager::settle`), through which its
//!   outputs and events go;
//! - `batching`: continuous batching: a forward pass per worker with chunked prefill
//!   under the token budget, decode steps (planned together while nothing can see them),
//!   generated blocks cached, preemption;
//! - `plane`: the simulated event plane between the workers and the router: delay,
//!   loss, heartbeats and snapshots;
//! - `faults`: the fault timeline (crashes, slow links, lossy or slow plane, router
//!   restarts, failed SSDs) and the recovery from it;
//! - `disagg`: separate prefill and decode pools and the KV handoff over the fabric;
//! - `report`: the report of a run; `snapshot`: the cheap view of a running cluster;
//!   `observe`: what a live driver may ask it to keep (routing decisions explained,
//!   fault notes, recent latencies).
//!
//! The end-of-run checks (the router's view against the pools, the registry rebuilt from
//! the events against the pools) are not here: they live in [`crate::checkers`], outside
//! the system they check.
//!
//! Sans-IO, like the `Manager`: the driver asks for [`Cluster::next_deadline`], moves
//! the cluster with [`Cluster::step`] or [`Cluster::advance_to`], looks at it with
//! [`Cluster::snapshot`], and may command it between steps. Pausing changes nothing: a
//! run advanced in any number of pieces reports exactly what one uninterrupted run does.
//! A command takes effect at [`Cluster::now`]; decode plans in flight past a worker killed
//! or a fault injected are cut there first, so the run is the one an engine
//! going one pass at a time would have (see `PassInFlight`).
//!
//! Requests arrive at their times and the router in the loop picks each one's worker
//! ([`crate::scenario::Routing`]): the KV router scores the workers from the events they
//! published, or round-robin ignores them. On its worker a request is looked up (device
//! hits, lower-tier hits onboarded over the modelled links), its remaining blocks are
//! allocated and prefilled, registered (and offloaded per the tier policies), decoded,
//! and released. A request that finds no free device blocks waits on its worker and is
//! retried, first come first served, when another finishes there. At one instant, work
//! in the workers finishes before new requests arrive. Latencies are predictions of the
//! model.
//!
//! Invariant: a scenario, its requests and the driver's commands (with their times) fully
//! determine a run.
//! Never: read a clock, iterate an unordered map, or check itself (the checkers do).

mod batching;
mod disagg;
mod faults;
mod observe;
mod plane;
mod report;
mod shared;
mod snapshot;
mod worker;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_disagg;
#[cfg(test)]
mod tests_scaling;
#[cfg(test)]
mod tests_shared;

pub use disagg::Pool;
pub use observe::{FaultNote, Finished, Observation, RouteRecord};
pub use report::{
    BlockSources, DisaggregationReport, EventCounts, FaultReport, Latency, LinkReport,
    OutputBlocksReport, Percentiles, Report, RoutingReport,
};
pub use snapshot::{
    ClusterSnapshot, LatencySnapshot, LinkSnapshot, RouterSnapshot, TierBlocks, WorkerRates,
    WorkerSnapshot, WorkerStatus, WorkerView,
};

use crate::compute::UnknownProfile;
use crate::queue::EventQueue;
use crate::scenario::{Fault, Routing, Scenario};
use crate::shared::SharedStore;
use crate::workload::Request;
use disagg::Disagg;
use faults::Faults;
use kvtwin::events::KvCacheEvent;
use kvtwin::ids::WorkerWithDpRank;
use kvtwin::ids::{Timestamp, WorkerId};
use kvtwin::manager::ManagerConfigError;
use kvtwin::router::scheduler::SchedulerConfig;
use kvtwin::router::{Router, WorkerMode};
use kvtwin::tier::Tier;
use plane::Plane;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use report::Tally;
use std::collections::BTreeSet;
use std::time::Duration;
use worker::{Requests, Worker, WorkerShape};

/// Workers are indexed by their `WorkerId` (worker `w` of the cluster is
/// `WorkerId::new(w)`): a `w: usize` below is that index, the id as a position.
///
/// A worker's incarnation: it changes when the worker crashes, so that what its former
/// self scheduled (passes, transfer deadlines, events in the plane) is recognised and
/// dropped.
type Epoch = u32;

/// What the cluster's queue wakes it up for.
#[derive(Debug)]
enum Wakeup {
    Arrival(usize),
    /// A worker's transfer deadline.
    Poll(usize, Epoch),
    /// The worker's forward pass in flight is done.
    PassDone(usize, Epoch),
    /// An event of the worker reaches the router.
    /// Boxed: the queue moves its entries as it sifts, and most are small.
    Deliver(usize, Epoch, Box<KvCacheEvent>),
    /// Every worker tells the router its latest event id.
    Heartbeat,
    /// A worker's heartbeat reaches the router: the id of its latest event then.
    HeartbeatArrives(usize, Epoch, Option<u64>),
    /// Fault `i` of the timeline begins.
    FaultStarts(usize),
    /// Fault `i` of the timeline ends.
    FaultEnds(usize),
    /// A crashed worker is back, empty.
    Restart(usize),
    /// The router looks at whether it should ask worker `w` for a snapshot (after
    /// delivering an event, which may happen while the worker is publishing).
    ResyncCheck(usize, Epoch),
    /// A deadline of the cluster's fabric (disaggregation): a handoff frame lands, or
    /// the rates change.
    Fabric,
    /// A deadline of the shared tier's links: a read or a write lands, or the rates
    /// change.
    Shared,
}

/// The router in the loop and what it was told.
struct RouterSide {
    mode: Routing,
    router: Router,
    /// Its configuration, seeded from the run's seed (a restarted router starts anew).
    scheduler: SchedulerConfig,
    /// Overlap (blocks) the router saw on the workers it chose, summed.
    overlap_blocks: u64,
}

/// A simulated cluster in the middle of a run (see the module docs).
pub struct Cluster<'a> {
    now: Timestamp,
    /// The time the driver advanced to: its commands take effect then.
    horizon: Timestamp,
    queue: EventQueue<Wakeup>,
    /// The requests still to arrive, in arrival order, and the next of them.
    arrivals: Box<dyn Iterator<Item = Request> + 'a>,
    next_request: Option<Request>,
    requests: Requests,
    workers: Vec<Worker>,
    shape: WorkerShape,
    route: RouterSide,
    plane: Plane,
    faults: Faults,
    /// The prefill and decode pools and the handoffs between them; `None` when every
    /// worker is aggregated.
    disagg: Option<Disagg>,
    /// The shared tier (inert at capacity 0, the default), and when it wakes the
    /// cluster next.
    shared: SharedStore<shared::SharedRead>,
    shared_poll_at: BTreeSet<Timestamp>,
    tally: Tally,
    /// Workers an event touched besides the one it returns (a handoff reaches a decode
    /// worker, or lets a prefill worker's blocks go): settled and given a pass after it.
    also_touched: BTreeSet<usize>,
    /// Workers draining: no new requests; removed once idle.
    draining: BTreeSet<usize>,
    scenario: String,
    seed: u64,
    /// Whether nothing is left to do.
    done: bool,
    /// What the driver asked to keep as the run goes ([`Cluster::observe`]); `None`, as
    /// by default, keeps nothing.
    observer: Option<Box<observe::Observer>>,
}

/// A scenario the simulator cannot run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// The worker configuration is not runnable.
    #[error("worker: {0}")]
    Config(#[from] ManagerConfigError),
    /// The hardware profile names a compute profile that is not built in.
    #[error("hardware.compute: {0}")]
    Compute(#[from] UnknownProfile),
    /// The autoscale section's planner could not be made (its capacity could not be
    /// profiled on this scenario's worker).
    #[error("autoscale.planner: {0}")]
    Planner(String),
    /// Disaggregation leaves the prefill or the decode pool without a worker.
    #[error(
        "cluster.disaggregation: {prefill_workers} prefill workers of {workers} leave a pool empty"
    )]
    EmptyPool {
        /// Prefill workers asked for.
        prefill_workers: usize,
        /// Workers in the cluster.
        workers: usize,
    },
    /// The scenario's workers are vLLM engines (`worker.engine: Vllm`): their twin runs
    /// it (`crate::vllm::run::simulate`), not kvtwin's worker.
    #[error("worker.engine: Vllm: the twin of vLLM engines runs this scenario (kvtwin run does), not kvtwin's worker")]
    VllmEngine,
}

/// A command the cluster cannot carry out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CommandError {
    /// The cluster has no such worker (or it was removed already).
    #[error("worker {0} is not a member of the cluster")]
    UnknownWorker(WorkerId),
    /// A disaggregated cluster's worker joins a pool: add it with
    /// [`Cluster::add_worker_to`], which names the pool.
    #[error("a disaggregated cluster adds a worker to a pool: use add_worker_to")]
    Disaggregated,
    /// Only a disaggregated cluster has pools ([`Cluster::add_worker_to`]); an
    /// aggregated one adds workers with [`Cluster::add_worker`].
    #[error("an aggregated cluster has no pools: use add_worker")]
    NotDisaggregated,
    /// The fault does not fit the cluster.
    #[error("fault: {0}")]
    Fault(&'static str),
}

/// How [`Cluster::remove_worker`] takes a worker out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Removal {
    /// The router sends it nothing more; it finishes what it runs and holds, then leaves
    /// (the router forgets it then). Disaggregated, a decode worker draining is given no
    /// new handoff, and a worker of either pool finishes the handoffs it is sending or
    /// receiving first (a prefill worker whose handoff waits for a decode worker waits
    /// with it).
    Drain,
    /// It stops at once, as a crash that never comes back: its requests start again on
    /// other workers (disaggregated, its handoffs are aborted and their requests
    /// prefilled again).
    Kill,
}

/// Runs `requests` through the cluster configured by `scenario`, in arrival order (ties
/// in the slice's order).
pub fn simulate(scenario: &Scenario, requests: &[Request]) -> Result<Report, SimError> {
    let mut order: Vec<usize> = (0..requests.len()).collect();
    order.sort_by_key(|i| (requests[*i].arrival, *i));
    simulate_stream(scenario, order.into_iter().map(|i| requests[i].clone()))
}

/// Runs a stream of requests, which must come in arrival order (a request dated before
/// the one ahead of it arrives with it), through the cluster configured by `scenario`.
/// The run holds only the requests in flight: with a trace read as it goes
/// ([`crate::workload::MooncakeTraceReader`]), memory does not grow with its length.
/// With an `autoscale` section, its planner runs in the loop
/// ([`crate::autoscale::Autoscaled`]).
pub fn simulate_stream<'a, I>(scenario: &Scenario, requests: I) -> Result<Report, SimError>
where
    I: IntoIterator<Item = Request>,
    I::IntoIter: 'a,
{
    if scenario.autoscale.is_some() {
        return Ok(crate::autoscale::Autoscaled::new(scenario, requests)?.run());
    }
    Ok(Cluster::new(scenario, requests)?.run())
}

/// [`simulate_stream`], showing `observe` the cluster after every event (tests check
/// what must hold at every instant, not only at the end).
#[cfg(test)]
fn simulate_observed(
    scenario: &Scenario,
    requests: impl IntoIterator<Item = Request>,
    mut observe: impl FnMut(&Cluster<'_>),
) -> Result<Report, SimError> {
    let mut cluster = Cluster::new(scenario, requests)?;
    while cluster.step() {
        observe(&cluster);
    }
    Ok(cluster.into_report())
}

impl<'a> Cluster<'a> {
    /// The cluster `scenario` describes, at time zero, with `requests` to arrive (in
    /// arrival order: a request dated before the one ahead of it arrives with it) and
    /// the scenario's faults on its timeline.
    pub fn new<I>(scenario: &Scenario, requests: I) -> Result<Self, SimError>
    where
        I: IntoIterator<Item = Request>,
        I::IntoIter: 'a,
    {
        if !scenario.worker.engine.is_kvtwin() {
            return Err(SimError::VllmEngine);
        }
        let shape = WorkerShape::new(scenario)?;
        let base = &shape.worker_config;
        let spec = &scenario.cluster;
        let mut scheduler = spec.scheduler;
        scheduler.seed = stream_seed(scenario.seed ^ scheduler.seed, STREAM_SCHEDULER);
        let disagg = match spec.disaggregation {
            Some(d) if d.prefill_workers == 0 || d.prefill_workers >= spec.workers => {
                return Err(SimError::EmptyPool {
                    prefill_workers: d.prefill_workers,
                    workers: spec.workers,
                });
            }
            Some(d) => Some(Disagg::new(
                d,
                spec.workers,
                &scenario.hardware,
                base.bytes_per_block,
            )),
            None => None,
        };
        let routable = disagg
            .as_ref()
            .map_or(spec.workers.max(1), |d| d.prefill.len());
        let router = router_of(scheduler, routable);
        let mut workers = Vec::with_capacity(spec.workers);
        for index in 0..spec.workers.max(1) {
            workers.push(shape.new_worker(index, Timestamp::ZERO)?);
        }
        let mut arrivals: Box<dyn Iterator<Item = Request> + 'a> = Box::new(requests.into_iter());
        let next_request = arrivals.next();
        let mut cluster = Self {
            now: Timestamp::ZERO,
            horizon: Timestamp::ZERO,
            queue: EventQueue::new(),
            arrivals,
            next_request,
            requests: Requests::default(),
            workers,
            route: RouterSide {
                mode: spec.routing,
                router,
                scheduler,
                overlap_blocks: 0,
            },
            plane: Plane::new(
                spec.event_plane,
                ChaCha8Rng::seed_from_u64(stream_seed(scenario.seed, STREAM_EVENT_PLANE)),
            ),
            faults: Faults::new(scenario.faults.clone()),
            disagg,
            shared: SharedStore::new(
                &spec.shared_tier,
                base.bytes_per_block,
                scenario.hardware.nic_bytes_per_s,
            ),
            shared_poll_at: BTreeSet::new(),
            tally: Tally::default(),
            also_touched: BTreeSet::new(),
            draining: BTreeSet::new(),
            scenario: scenario.name.clone(),
            seed: scenario.seed,
            shape,
            done: false,
            observer: None,
        };
        for index in 0..cluster.faults.timeline.len() {
            let at = Timestamp::ZERO
                .saturating_add(Duration::from_millis(cluster.faults.timeline[index].at_ms));
            cluster.faults.disruptions.insert(at);
            cluster.queue.push(at, Wakeup::FaultStarts(index));
        }
        cluster.schedule_heartbeat();
        Ok(cluster)
    }

    /// Simulated time: that of the last step, or the time the driver advanced to if
    /// later.
    pub fn now(&self) -> Timestamp {
        self.now.max(self.horizon)
    }

    /// When the next step happens; `None` once the run is over (nothing scheduled,
    /// nothing to arrive, nothing waiting that could start).
    pub fn next_deadline(&self) -> Option<Timestamp> {
        if self.done {
            return None;
        }
        let arrival = self.next_request.as_ref().map(|r| r.arrival.max(self.now));
        // With nothing scheduled and nothing to arrive, one last retry of the requests
        // waiting on idle workers is due now.
        Some(match (self.queue.peek_time(), arrival) {
            (Some(t), Some(a)) => t.min(a),
            (Some(t), None) => t,
            (None, Some(a)) => a,
            (None, None) => self.now,
        })
    }

    /// Whether the run is over.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Takes the next step: one arrival, or one thing the queue woke the cluster for,
    /// and what follows from it at once. Returns `false`, doing nothing, once the run is
    /// over.
    pub fn step(&mut self) -> bool {
        loop {
            if self.done {
                return false;
            }
            let internal = self.queue.peek_time();
            let arrival = self.next_request.as_ref().map(|r| r.arrival.max(self.now));
            self.requests.next_arrival = arrival;
            // At one instant, work already in the workers (passes, transfers, event
            // deliveries) finishes before new requests arrive, so a worker infinitely
            // fast serves requests one at a time, as a cache replay does.
            let (at, wakeup) = match (internal, arrival) {
                (Some(t), Some(a)) if a < t => (a, None),
                (None, Some(a)) => (a, None),
                _ => match self.queue.pop() {
                    Some((at, wakeup)) => (at, Some(wakeup)),
                    None => {
                        // Nothing is scheduled: only requests waiting on idle workers
                        // are left (after a preemption). Retry them once; if nothing
                        // starts, the rest cannot be served.
                        if self.retry_idle_workers() {
                            self.settle_also_touched();
                            continue;
                        }
                        self.done = true;
                        return false;
                    }
                },
            };
            let wakeup = match wakeup {
                Some(wakeup) => wakeup,
                None => {
                    let request = self.next_request.take().expect("an arrival was peeked");
                    self.next_request = self.arrivals.next();
                    Wakeup::Arrival(self.admit_new(request))
                }
            };
            self.now = at;
            self.tally.engine_events += 1;
            self.dispatch(at, wakeup);
            self.retire_drained();
            return true;
        }
    }

    /// Takes every step due at or before `t`, then holds the clock at `t` for the
    /// driver's commands (see [`now`](Self::now)).
    pub fn advance_to(&mut self, t: Timestamp) {
        while self.next_deadline().is_some_and(|at| at <= t) {
            if !self.step() {
                break;
            }
        }
        self.horizon = self.horizon.max(t);
    }

    /// Runs to the end and reports.
    pub fn run(mut self) -> Report {
        while self.step() {}
        self.into_report()
    }

    fn dispatch(&mut self, at: Timestamp, wakeup: Wakeup) {
        let touched = match wakeup {
            Wakeup::Arrival(i) => self.arrive(i),
            Wakeup::Poll(w, epoch) if self.current(w, epoch) => {
                self.set_clock(w);
                self.workers[w].poll_at.remove(&at);
                Some(w)
            }
            // A pass cut short by a command was done with when it was cut.
            Wakeup::PassDone(w, epoch)
                if self.current(w, epoch)
                    && self.workers[w]
                        .pass
                        .as_ref()
                        .is_some_and(|pass| pass.ends_at == at) =>
            {
                self.set_clock(w);
                self.pass_done(w);
                Some(w)
            }
            Wakeup::Deliver(w, epoch, event) => {
                if self.current(w, epoch) {
                    self.deliver(w, &event);
                }
                None
            }
            Wakeup::Heartbeat => {
                self.heartbeat();
                None
            }
            Wakeup::HeartbeatArrives(w, epoch, latest) => {
                self.plane.heartbeats_in_flight -= 1;
                if self.current(w, epoch) {
                    self.heartbeat_arrives(w, latest);
                }
                None
            }
            Wakeup::FaultStarts(index) => {
                self.fault_starts(index);
                None
            }
            Wakeup::FaultEnds(index) => {
                self.fault_ends(index);
                None
            }
            Wakeup::Restart(w) => {
                self.restart(w);
                None
            }
            Wakeup::ResyncCheck(w, epoch) => {
                if self.current(w, epoch) {
                    self.resync_if_behind(w);
                }
                None
            }
            Wakeup::Fabric => {
                self.fabric_due();
                None
            }
            Wakeup::Shared => {
                self.shared_due();
                None
            }
            // Scheduled by a worker's former incarnation, or a pass cut short.
            Wakeup::Poll(..) | Wakeup::PassDone(..) => None,
        };
        if let Some(w) = touched {
            self.settle(w);
            self.start_pass(w);
        }
        self.settle_also_touched();
    }

    /// Commands take effect at the time the driver advanced to.
    fn catch_up_with_driver(&mut self) {
        self.now = self.now.max(self.horizon);
    }

    /// Adds an empty worker, on a node of its own, which the router then routes to;
    /// returns its id. Aggregated clusters only: a disaggregated one answers
    /// [`CommandError::Disaggregated`], its workers joining a pool through
    /// [`Cluster::add_worker_to`].
    pub fn add_worker(&mut self) -> Result<WorkerId, CommandError> {
        if self.disagg.is_some() {
            return Err(CommandError::Disaggregated);
        }
        self.catch_up_with_driver();
        let w = self.push_worker();
        self.route
            .router
            .add_worker(self.workers[w].key, WorkerMode::Events);
        // Requests that found no worker up go first.
        self.reroute_parked();
        self.done = false;
        Ok(self.workers[w].key.worker)
    }

    /// Adds an empty worker to `pool` of a disaggregated cluster, on a node of its own
    /// that the fabric grows by (the links already there keep their numbers); returns
    /// its id. A prefill worker is routed to from now on, and takes the requests that
    /// found no prefill worker up; a decode worker takes the handoffs that waited for a
    /// decode worker, in their order, and its share of those to come. Aggregated
    /// clusters answer [`CommandError::NotDisaggregated`].
    pub fn add_worker_to(&mut self, pool: Pool) -> Result<WorkerId, CommandError> {
        if self.disagg.is_none() {
            return Err(CommandError::NotDisaggregated);
        }
        self.catch_up_with_driver();
        // Decode plans in flight were made knowing the prefill workers there were (when
        // a handoff could land, see `PassInFlight`): cut them now, as for a kill.
        self.cut_plans_at(self.now);
        let w = self.push_worker();
        if let Some(disagg) = self.disagg.as_mut() {
            disagg.join(w, pool);
        }
        match pool {
            Pool::Prefill => {
                self.route
                    .router
                    .add_worker(self.workers[w].key, WorkerMode::Events);
                self.reroute_parked();
            }
            Pool::Decode => self.assign_waiting_handoffs(w),
        }
        self.settle_also_touched();
        self.done = false;
        Ok(self.workers[w].key.worker)
    }

    /// Appends an empty worker, up from now; returns its index.
    fn push_worker(&mut self) -> usize {
        let index = self.workers.len();
        let worker = self
            .shape
            .new_worker(index, self.now)
            .expect("the worker configuration was validated when the run began");
        self.workers.push(worker);
        self.note(|| format!("worker {index} added"));
        index
    }

    /// Sends the requests that found no worker up to the router again, in their order.
    fn reroute_parked(&mut self) {
        for i in std::mem::take(&mut self.requests.parked) {
            self.reroute(i);
        }
    }

    /// Takes worker `id` out of the cluster ([`Removal`]), of either pool when
    /// disaggregated. Removing a pool's last serving worker is allowed: requests then
    /// wait for a prefill worker (parked), or prefilled ones for a decode worker (in
    /// the handoff queue), as while every worker of the pool is down after a crash,
    /// until the driver adds one.
    pub fn remove_worker(&mut self, id: WorkerId, how: Removal) -> Result<(), CommandError> {
        let w = id.get() as usize;
        if self.workers.get(w).is_none_or(|worker| worker.removed) {
            return Err(CommandError::UnknownWorker(id));
        }
        self.catch_up_with_driver();
        if let Some(disagg) = self.disagg.as_mut() {
            disagg.scaled = true;
        }
        match how {
            Removal::Drain => {
                if self.workers[w].up {
                    self.note(|| format!("worker {w} draining"));
                    self.route.router.stop_routing(self.workers[w].key);
                    self.draining.insert(w);
                    self.retire_drained();
                } else {
                    // Down already: nothing to drain.
                    self.note(|| format!("worker {w} removed (it was down)"));
                    self.workers[w].removed = true;
                }
            }
            Removal::Kill => {
                self.note(|| format!("worker {w} killed"));
                self.workers[w].removed = true;
                self.draining.remove(&w);
                self.cut_plans_at(self.now);
                self.stop_worker(w, None);
                // Disaggregated, the handoffs aborted freed blocks at their other ends,
                // which go on at once, as after a crash.
                if self.disagg.is_some() {
                    self.settle_also_touched();
                }
            }
        }
        Ok(())
    }

    /// Puts `fault` on the timeline, at its `at_ms` or now if that is past.
    pub fn inject(&mut self, fault: Fault) -> Result<(), CommandError> {
        let has_disk = self
            .shape
            .worker_config
            .tiers
            .iter()
            .any(|t| t.tier == Tier::Disk);
        if let Some(reason) = fault.kind.problem(self.workers.len(), has_disk) {
            return Err(CommandError::Fault(reason));
        }
        self.catch_up_with_driver();
        let at = Timestamp::ZERO
            .saturating_add(Duration::from_millis(fault.at_ms))
            .max(self.now);
        let index = self.faults.timeline.len();
        self.note(|| {
            let at_ms = at.saturating_duration_since(Timestamp::ZERO).as_millis();
            format!(
                "fault injected, due at {at_ms} ms: {}",
                observe::fault_began(&fault.kind)
            )
        });
        self.faults.timeline.push(fault);
        self.faults.disruptions.insert(at);
        // Decode plans made before it must stop there too, as if it had been known.
        self.cut_plans_at(at);
        self.queue.push(at, Wakeup::FaultStarts(index));
        self.done = false;
        Ok(())
    }

    /// Removes the draining workers that have nothing left: no request, no pass, no
    /// transfer (disaggregated: no handoff sending or receiving either, which are
    /// requests it holds). The router forgets the worker's blocks with it
    /// (`Router::remove_worker` drops its index entries), which is what a `Cleared` event
    /// through the plane would do, without the plane's delay or loss: a worker gone
    /// never lingers in the router's view, as the checkers require.
    fn retire_drained(&mut self) {
        if self.draining.is_empty() {
            return;
        }
        let idle: Vec<usize> = self
            .draining
            .iter()
            .copied()
            .filter(|w| {
                let worker = &self.workers[*w];
                worker.states.is_empty()
                    && worker.waiting.is_empty()
                    && worker.pass.is_none()
                    && worker.poll_at.is_empty()
            })
            .collect();
        for w in idle {
            self.draining.remove(&w);
            let worker = &mut self.workers[w];
            worker.removed = true;
            worker.up = false;
            worker.epoch += 1;
            let id = worker.key.worker;
            self.route.router.remove_worker(id);
            self.note(|| format!("worker {w} drained and removed"));
        }
    }
}

/// A router that routes to workers `0..workers` (at dp rank 0), all learnt from their
/// events. (Disaggregated, only the prefill pool is routable; the decode workers' events
/// still reach its index.)
fn router_of(scheduler: SchedulerConfig, workers: usize) -> Router {
    let mut router = Router::new(scheduler);
    for w in 0..workers {
        router.add_worker(
            WorkerWithDpRank {
                worker: WorkerId::new(w as u64),
                dp_rank: 0,
            },
            WorkerMode::Events,
        );
    }
    router
}

/// The seed of one component's random stream, from the run's seed: components draw
/// independently, so adding draws to one never shifts another's (splitmix64 finaliser).
fn stream_seed(seed: u64, component: u64) -> u64 {
    let mut z = seed ^ component.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Random streams of a run.
const STREAM_SCHEDULER: u64 = 1;
const STREAM_EVENT_PLANE: u64 = 2;
