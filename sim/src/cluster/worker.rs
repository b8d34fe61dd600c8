//! A worker and the life of a request on it.
//!
//! Owns: [`Worker`] (its manager on its own node, its requests and their [`State`]s, the
//! router's side of its event stream), [`Requests`] (the requests in flight, by arrival
//! number), [`WorkerShape`] (what every worker is built from), and the request's path:
//! routing on arrival, lookup (device hits, lower-tier hits onboarded over the modelled
//! links), admission to prefill or to the worker's queue when no device block is free
//! (first come first served, retried when another request finishes there), the end of
//! a request (its latencies), and [`Cluster::settle`], the one manager drain loop: a
//! worker's finished transfers, its outputs, its KV events (into its event ledger
//! and the event plane), its next deadline.
//! Never: decide what goes in a forward pass (`batching`), or deliver events (`plane`).

use super::batching::PassInFlight;
use super::observe::Finished;
use super::{Cluster, Epoch, Pool, RouteRecord, SimError, Wakeup};
use crate::compute::ComputeModel;
use crate::hardware::HardwareProfile;
use crate::hardware::SimHardware;
use crate::ledger::EventLedger;
use crate::scenario::{Batching, Routing, Scenario};
use crate::workload::Request;
use kvtwin::block::{BlockIdentity, Reset};
use kvtwin::events::{KvCacheEvent, KvCacheEventData};
use kvtwin::hardware::Hardware;
use kvtwin::ids::WorkerWithDpRank;
use kvtwin::ids::{LocalBlockHash, RequestId, SequenceHash, Timestamp, WorkerId};
use kvtwin::manager::ManagerConfig;
use kvtwin::manager::{settle, Driver, Manager, ManagerOutput};
use kvtwin::pool::{BlockChain, ImmutableBlock, MutableBlock};
use kvtwin::tier::Tier;
use rustc_hash::FxHashMap;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

#[derive(Debug)]
pub(super) enum State {
    Onboarding {
        held: BlockChain,
        device_hits: usize,
        onboard_tiers: Vec<Tier>,
    },
    /// Reading the blocks that continue its prefix from the shared tier into the first
    /// `blocks` of `computing` (see `shared`), in the prefill queue but skipped by
    /// passes; then it prefills the rest.
    Fetching {
        held: BlockChain,
        computing: Vec<MutableBlock<Reset>>,
        blocks: usize,
    },
    /// Waiting for, or part way through, its prefill.
    Prefilling {
        held: BlockChain,
        computing: Vec<MutableBlock<Reset>>,
        /// Prompt tokens still to prefill.
        remaining: u64,
        /// Tokens in the KV cache so far (prefix hits and prefilled chunks).
        cached: u64,
    },
    /// Generating, one token per pass.
    Decoding {
        held: BlockChain,
        /// Blocks for generated tokens (never registered: nobody shares them).
        extra: Vec<MutableBlock<Reset>>,
        /// Tokens in its KV cache.
        context: u64,
    },
    /// Prefilled on a prefill worker, which holds its blocks until the handoff to the
    /// decode pool lands.
    Sending {
        held: BlockChain,
        /// A partial last block that is not cached.
        own: Vec<MutableBlock<Reset>>,
    },
    /// On a decode worker: blocks for its prompt, which the handoff's frames fill.
    Receiving { blocks: Vec<MutableBlock<Reset>> },
}

/// One worker: its manager on its own node, and the requests it runs.
pub(super) struct Worker {
    pub(super) key: WorkerWithDpRank,
    pub(super) manager: Manager<SimHardware>,
    pub(super) states: BTreeMap<usize, State>,
    /// Requests waiting for device blocks, first come first served.
    pub(super) waiting: VecDeque<usize>,
    pub(super) poll_at: BTreeSet<Timestamp>,
    pub(super) ledger: EventLedger,
    /// Requests whose prefill is not done, oldest first.
    pub(super) prefill_queue: VecDeque<usize>,
    pub(super) pass: Option<PassInFlight>,
    /// The members buffer of the last pass, kept for the next.
    pub(super) spare_members: Vec<(usize, u64)>,
    pub(super) routed: u64,
    /// Whether it is serving (not crashed).
    pub(super) up: bool,
    pub(super) epoch: Epoch,
    /// Each link's speed factor from the faults under way (index: `Link::ALL`).
    pub(super) link_speed: [f64; 6],
    /// The router's side of this worker's event stream: the last id it applied,
    /// whether it saw ids go missing since its last snapshot request, and until when
    /// it waits for a snapshot it asked for.
    pub(super) last_applied: Option<u64>,
    pub(super) gap_seen: bool,
    pub(super) quiet_until: Timestamp,
    /// Snapshots asked for since the router was last in line with this worker.
    pub(super) failed_snapshots: u32,
    /// SSD failures of this worker under way (its disk is down while any is).
    pub(super) disk_failures: u32,
    /// Whether it left the cluster ([`super::Cluster::remove_worker`]): it never comes
    /// back.
    pub(super) removed: bool,
    /// Requests it finished, output tokens it generated, and KV events it published
    /// (for snapshots).
    pub(super) completed: u64,
    pub(super) output_tokens: u64,
    pub(super) events_published: u64,
}

/// The requests of the run as a whole: those in flight and those no worker took.
#[derive(Default)]
pub(super) struct Requests {
    /// Requests in flight by arrival number (looked up, never iterated).
    pub(super) live: FxHashMap<usize, Live>,
    /// Requests arrived so far (the next one's number).
    pub(super) arrived: u64,
    /// Requests that found no worker up, first come first served.
    pub(super) parked: VecDeque<usize>,
    /// When the next request arrives, if one does: decode plans stop there (see
    /// `PassInFlight`).
    pub(super) next_arrival: Option<Timestamp>,
}

/// What every worker is made of (they are identical), and what the run derives from it.
pub(super) struct WorkerShape {
    /// Tokens per block.
    pub(super) block_size: u64,
    pub(super) cache_partial_blocks: bool,
    /// Whether full blocks of generated tokens are registered
    /// ([`crate::scenario::WorkerSpec`]).
    pub(super) cache_output_blocks: bool,
    pub(super) device_capacity_blocks: u64,
    pub(super) device_capacity_tokens: u64,
    pub(super) compute: ComputeModel,
    pub(super) batching: Batching,
    /// To build a worker (at the start, after a crash, or added mid-run).
    pub(super) worker_config: ManagerConfig,
    pub(super) hardware_profile: HardwareProfile,
}

impl WorkerShape {
    pub(super) fn new(scenario: &Scenario) -> Result<Self, SimError> {
        let worker_config = scenario.worker.manager_config();
        let compute = scenario.hardware.compute_model()?;
        let device_capacity_blocks: u64 = worker_config
            .tiers
            .iter()
            .filter(|t| t.tier == Tier::Device)
            .map(|t| t.capacity_blocks as u64)
            .sum();
        let block_size = worker_config.block_size_tokens as u64;
        Ok(Self {
            block_size,
            cache_partial_blocks: scenario.worker.cache_partial_blocks,
            cache_output_blocks: scenario.worker.cache_output_blocks,
            device_capacity_blocks,
            device_capacity_tokens: device_capacity_blocks * block_size,
            compute,
            batching: scenario.worker.batching,
            worker_config,
            hardware_profile: scenario.hardware.clone(),
        })
    }

    /// A fresh worker `index` (its id too) on a node of its own, its clock at `now`.
    pub(super) fn new_worker(&self, index: usize, now: Timestamp) -> Result<Worker, SimError> {
        let mut config = self.worker_config.clone();
        config.worker_id = WorkerId::new(index as u64);
        let key = WorkerWithDpRank {
            worker: config.worker_id,
            dp_rank: config.dp_rank,
        };
        let hardware = SimHardware::new(self.hardware_profile.clone(), config.block_size_tokens);
        hardware.clock().set(now);
        Ok(Worker {
            key,
            manager: Manager::new(hardware, config)?,
            states: BTreeMap::new(),
            waiting: VecDeque::new(),
            poll_at: BTreeSet::new(),
            ledger: EventLedger::new(),
            prefill_queue: VecDeque::new(),
            pass: None,
            spare_members: Vec::new(),
            routed: 0,
            up: true,
            epoch: 0,
            link_speed: [1.0; 6],
            last_applied: None,
            gap_seen: false,
            quiet_until: Timestamp::ZERO,
            failed_snapshots: 0,
            disk_failures: 0,
            removed: false,
            completed: 0,
            output_tokens: 0,
            events_published: 0,
        })
    }
}

/// A request between its arrival and its end, and what the run keeps about it. Only
/// these are held: memory follows the requests in flight, not the length of the trace.
pub(super) struct Live {
    pub(super) request: Request,
    /// Output tokens generated so far (kept across preemptions).
    pub(super) generated: u64,
    /// When its first token landed.
    pub(super) first_token_at: Option<Timestamp>,
    /// Whether its prompt blocks have been counted in the sources.
    pub(super) counted: bool,
    /// When a pass first took it (its queueing time is counted then).
    pub(super) scheduled_at: Option<Timestamp>,
    /// Identities of the blocks its generated tokens fill, as far as computed (kept
    /// across preemptions, so a recomputed block is registered under the same hash).
    pub(super) output_identities: Vec<BlockIdentity>,
    /// Its registered reasoning blocks, in order (see `Request::think_tokens`).
    pub(super) think_blocks: Vec<SequenceHash>,
    /// Whether it has passed its ExitThink point (its reasoning blocks are cold).
    pub(super) thinking_done: bool,
}

/// The prompt blocks of `request` that can be cached: all of them, or only the full ones
/// when partial blocks are not cached ([`crate::scenario::WorkerSpec`]).
pub(super) fn cacheable_blocks(
    request: &Request,
    block_size: u64,
    cache_partial_blocks: bool,
) -> usize {
    if cache_partial_blocks {
        request.blocks.len()
    } else {
        request
            .blocks
            .len()
            .min((request.input_tokens / block_size) as usize)
    }
}

/// The request of `live` waiting for its prefill, `held` the blocks it has (hits, and
/// reads of the shared tier) and `computing` those its prefill fills: what is left to
/// prefill is its prompt past `held`, and after a preemption the tokens it generated so
/// far too (they are recomputed).
pub(super) fn prefilling(
    live: &Live,
    held: BlockChain,
    computing: Vec<MutableBlock<Reset>>,
    block_size: u64,
) -> State {
    let request = &live.request;
    let cached = (held.len() as u64 * block_size).min(request.input_tokens);
    let remaining = (request.input_tokens + live.generated)
        .saturating_sub(cached)
        .max(1);
    State::Prefilling {
        held,
        computing,
        remaining,
        cached,
    }
}

impl Cluster<'_> {
    /// Numbers a new request and holds it while it is in flight.
    pub(super) fn admit_new(&mut self, request: Request) -> usize {
        let i = self.requests.arrived as usize;
        self.requests.arrived += 1;
        self.requests.live.insert(
            i,
            Live {
                request,
                generated: 0,
                first_token_at: None,
                counted: false,
                scheduled_at: None,
                output_identities: Vec::new(),
                think_blocks: Vec::new(),
                thinking_done: false,
            },
        );
        i
    }

    pub(super) fn request(&self, i: usize) -> &Request {
        &self.requests.live[&i].request
    }

    pub(super) fn set_clock(&self, w: usize) {
        self.workers[w].manager.hardware().clock().set(self.now);
    }

    pub(super) fn cacheable(&self, i: usize) -> usize {
        cacheable_blocks(
            self.request(i),
            self.shape.block_size,
            self.shape.cache_partial_blocks,
        )
    }

    /// The prompt blocks of request `i` a lookup may hit: the cacheable ones, less the
    /// last when that would leave no prompt token to compute (engines compute at least
    /// one token to produce the first output, as vLLM caps its hits).
    pub(super) fn hittable(&self, i: usize) -> usize {
        let request = self.request(i);
        if self.shape.cache_partial_blocks {
            return request.blocks.len();
        }
        self.cacheable(i)
            .min((request.input_tokens.saturating_sub(1) / self.shape.block_size) as usize)
    }

    pub(super) fn hashes(&self, i: usize) -> Vec<SequenceHash> {
        self.request(i).blocks[..self.hittable(i)]
            .iter()
            .map(|b| b.sequence_hash)
            .collect()
    }

    /// Routes request `i` and admits it on its worker; returns the worker, or `None` for
    /// a request no worker could ever serve.
    pub(super) fn arrive(&mut self, i: usize) -> Option<usize> {
        let request = self.request(i);
        // Prompt and output together must fit the device, or no preemption can help.
        let blocks_needed =
            (request.input_tokens + request.output_tokens).div_ceil(self.shape.block_size);
        if blocks_needed > self.shape.device_capacity_blocks {
            self.tally.too_large += 1;
            self.requests.live.remove(&i);
            return None;
        }
        let observing = self.observing_routes();
        let mut candidates = Vec::new();
        let w = match self.route.mode {
            Routing::RoundRobin => {
                // Every worker ever of the routable pool takes its turn, in worker order;
                // one that is down, draining or removed is skipped.
                let pool = self.disagg.as_ref().map(|d| d.members(Pool::Prefill));
                let n = pool.map_or(self.workers.len(), <[usize]>::len);
                let nth = |k: usize| pool.map_or(k, |pool| pool[k]);
                let accepting = |w: &usize| self.workers[*w].up && !self.draining.contains(w);
                match (0..n).map(|k| nth((i + k) % n)).find(accepting) {
                    Some(w) => w,
                    None => {
                        self.requests.parked.push_back(i);
                        return None;
                    }
                }
            }
            Routing::Kv => {
                let query: Vec<LocalBlockHash> = request.blocks[..self.hittable(i)]
                    .iter()
                    .map(|b| b.local_hash)
                    .collect();
                let shared = self.shared_prefix(i);
                let explain = observing.then_some(&mut candidates);
                let decision = self
                    .route
                    .router
                    .route_shared(&query, self.now, shared, explain);
                let Some(decision) = decision else {
                    // No worker is up: the request waits for one.
                    self.requests.parked.push_back(i);
                    return None;
                };
                self.route.overlap_blocks += u64::from(decision.overlap_blocks);
                decision.worker.worker.get() as usize
            }
        };
        if observing {
            let record = RouteRecord {
                at: self.now,
                request: i as u64,
                query_blocks: self.hittable(i),
                candidates,
                chosen: self.workers[w].key,
            };
            self.record_route(record);
        }
        self.workers[w].routed += 1;
        self.set_clock(w);
        self.admit(w, i);
        Some(w)
    }

    /// Looks request `i` up on worker `w` and starts onboarding or prefilling it; or, for
    /// a handoff waiting on decode worker `w`, tries again to take blocks for it.
    pub(super) fn admit(&mut self, w: usize, i: usize) {
        if self
            .disagg
            .as_ref()
            .and_then(|d| d.handoffs.get(&i))
            .is_some_and(|h| h.to == Some(w) && h.sent_at.is_none())
        {
            self.receive(w, i);
            return;
        }
        let hashes = self.hashes(i);
        let now = self.now;
        let manager = &mut self.workers[w].manager;
        let mut plan = manager.lookup(&hashes, now);
        let device_hits = plan.device_blocks().len();
        let onboard_tiers: Vec<Tier> = plan
            .onboard_blocks()
            .iter()
            .map(ImmutableBlock::tier)
            .collect();
        debug_assert!(
            !onboard_tiers.iter().any(|tier| manager.tier_is_down(*tier)),
            "worker {w} planned an onboarding from a failed tier"
        );
        if !onboard_tiers.is_empty()
            && manager
                .start_onboard(RequestId::new(i as u64), &mut plan, now)
                .is_ok()
        {
            let held = plan.into_device_blocks();
            self.workers[w].states.insert(
                i,
                State::Onboarding {
                    held,
                    device_hits,
                    onboard_tiers,
                },
            );
            return;
        }
        let held = plan.into_device_blocks();
        self.start_prefill(w, i, held, device_hits, [0; 4]);
    }

    pub(super) fn start_prefill(
        &mut self,
        w: usize,
        i: usize,
        held: BlockChain,
        device_hits: usize,
        onboarded: [usize; 4],
    ) {
        let need = self.request(i).blocks.len() - held.len();
        let worker = &mut self.workers[w];
        match worker.manager.allocate(need, self.now) {
            Ok(computing) => {
                let from = held.len();
                let shared = self.shared_hits(i, from);
                let live = self
                    .requests
                    .live
                    .get_mut(&i)
                    .expect("an admitted request is in flight");
                let request = &live.request;
                // A preempted request starting again is not a new request to count.
                if !live.counted {
                    live.counted = true;
                    let sources = &mut self.tally.sources;
                    sources.total += request.blocks.len() as u64;
                    sources.device += device_hits as u64;
                    sources.host += onboarded[Tier::Host.index()] as u64;
                    sources.disk += onboarded[Tier::Disk.index()] as u64;
                    sources.remote += onboarded[Tier::Remote.index()] as u64;
                    sources.shared += shared as u64;
                    sources.computed += (need - shared) as u64;
                    sources.prompt_tokens += request.input_tokens;
                    sources.hit_tokens += ((held.len() + shared) as u64 * self.shape.block_size)
                        .min(request.input_tokens);
                }
                if shared > 0 {
                    // It keeps its place in the prefill queue while it reads (passes
                    // skip it), as a vLLM request waiting for remote KV keeps its place
                    // in the waiting queue.
                    let worker = &mut self.workers[w];
                    worker.states.insert(
                        i,
                        State::Fetching {
                            held,
                            computing,
                            blocks: shared,
                        },
                    );
                    worker.prefill_queue.push_back(i);
                    self.start_shared_read(w, i, from, shared);
                    return;
                }
                let state = prefilling(live, held, computing, self.shape.block_size);
                let worker = &mut self.workers[w];
                worker.states.insert(i, state);
                worker.prefill_queue.push_back(i);
            }
            Err(_) => {
                worker.manager.device().release(held);
                self.tally.waits += 1;
                worker.waiting.push_back(i);
            }
        }
    }

    pub(super) fn finish(&mut self, w: usize, i: usize, held: BlockChain) {
        let routable = self.is_routable(w);
        let worker = &mut self.workers[w];
        worker.manager.device().release(held);
        // Done: the request leaves the run; only its latencies stay, in the statistics.
        let Some(Live {
            request,
            first_token_at,
            scheduled_at,
            ..
        }) = self.requests.live.remove(&i)
        else {
            return;
        };
        // Disaggregated, a decode worker is none of the router's business.
        if self.route.mode == Routing::Kv && routable {
            self.route
                .router
                .finish(worker.key, request.blocks.len() as u64);
        }
        if let Some(disagg) = self.disagg.as_mut().filter(|d| d.is_in(w, Pool::Prefill)) {
            disagg.finished_at_prefill += 1;
        }
        let since_arrival =
            |t: Timestamp| t.saturating_duration_since(request.arrival).as_nanos() as u64;
        let end_to_end = since_arrival(self.now);
        self.tally.e2e.push(end_to_end);
        let tpot = match (request.output_tokens > 1, first_token_at) {
            (true, Some(first)) => {
                let decoding = self.now.saturating_duration_since(first);
                Some(decoding.as_nanos() as u64 / (request.output_tokens - 1))
            }
            _ => None,
        };
        if let Some(tpot) = tpot {
            self.tally.tpot.push(tpot);
        }
        if self.observing_latencies() {
            self.record_finished(Finished {
                at: self.now,
                ttft: first_token_at.map(since_arrival),
                tpot,
                end_to_end,
                queueing: scheduled_at.map(since_arrival),
            });
        }
        self.tally.output_tokens += request.output_tokens;
        self.tally.completed += 1;
        let worker = &mut self.workers[w];
        worker.completed += 1;
        worker.output_tokens += request.output_tokens;
    }

    /// First come, first served: retries worker `w`'s waiting requests until one still
    /// does not fit.
    pub(super) fn retry_waiting(&mut self, w: usize) {
        while let Some(next) = self.workers[w].waiting.pop_front() {
            let before = self.workers[w].waiting.len();
            self.admit(w, next);
            let waiting = &mut self.workers[w].waiting;
            if waiting.len() > before {
                if let Some(again) = waiting.pop_back() {
                    waiting.push_front(again);
                }
                break;
            }
        }
    }

    /// Retries the queues of workers that have waiting requests and nothing running;
    /// returns whether any of them started something.
    pub(super) fn retry_idle_workers(&mut self) -> bool {
        let mut progressed = false;
        for w in 0..self.workers.len() {
            let worker = &self.workers[w];
            if worker.waiting.is_empty() || !worker.states.is_empty() {
                continue;
            }
            let waiting = worker.waiting.len();
            self.set_clock(w);
            self.retry_waiting(w);
            self.settle(w);
            self.start_pass(w);
            let worker = &self.workers[w];
            progressed |= worker.waiting.len() != waiting || !worker.states.is_empty();
        }
        progressed
    }

    /// Lets worker `w`'s manager act on finished transfers, routes its outputs, sends its
    /// events into the event plane and schedules its next transfer deadline (the one
    /// drain loop, [`kvtwin::manager::settle`]).
    pub(super) fn settle(&mut self, w: usize) {
        let now = self.now;
        let deadline = settle(&mut SettleWorker { cluster: self, w }, now);
        let worker = &mut self.workers[w];
        if let Some(deadline) = deadline {
            if worker.poll_at.insert(deadline) {
                self.queue
                    .push(deadline.max(self.now), Wakeup::Poll(w, worker.epoch));
            }
        }
    }

    /// An onboarding on worker `w` finished: its request goes on to prefill.
    fn handle_output(&mut self, w: usize, output: ManagerOutput) {
        let ManagerOutput::OnboardComplete {
            request, blocks, ..
        } = output
        else {
            return;
        };
        let i = request.get() as usize;
        if let Some(State::Onboarding {
            mut held,
            device_hits,
            onboard_tiers,
        }) = self.workers[w].states.remove(&i)
        {
            // Only what arrived counts as onboarded; the rest is computed.
            let mut onboard = [0usize; 4];
            for tier in onboard_tiers.iter().take(blocks.len()) {
                onboard[tier.index()] += 1;
            }
            held.extend(blocks);
            self.start_prefill(w, i, held, device_hits, onboard);
        }
    }

    /// Worker `w` published `event`: counted, kept in its event ledger, and
    /// sent into the event plane.
    fn handle_event(&mut self, w: usize, event: KvCacheEvent) {
        self.tally.events.events += 1;
        self.workers[w].events_published += 1;
        match &event.data {
            KvCacheEventData::Stored { blocks, .. } => {
                self.tally.events.stored_blocks += blocks.len() as u64
            }
            KvCacheEventData::Removed { block_hashes, .. } => {
                self.tally.events.removed_blocks += block_hashes.len() as u64
            }
            KvCacheEventData::Cleared => {}
        }
        self.write_to_shared(w, &event);
        // A gap or duplicate would make the rebuild differ, which the report shows.
        self.workers[w].ledger.apply(&event);
        self.publish(w, event);
    }

    /// Whether `epoch` is worker `w`'s current incarnation.
    pub(super) fn current(&self, w: usize, epoch: Epoch) -> bool {
        self.workers[w].epoch == epoch
    }

    /// Whether worker `w` is one the router may send requests to (while it is up and
    /// not draining): a prefill worker when disaggregated, any worker otherwise.
    pub(super) fn is_routable(&self, w: usize) -> bool {
        self.disagg
            .as_ref()
            .is_none_or(|d| d.is_in(w, Pool::Prefill))
    }

    pub(super) fn is_prefill_worker(&self, w: usize) -> bool {
        self.disagg
            .as_ref()
            .is_some_and(|d| d.is_in(w, Pool::Prefill))
    }

    /// Settles and starts a pass on every worker an event touched besides its own.
    pub(super) fn settle_also_touched(&mut self) {
        while let Some(w) = self.also_touched.pop_first() {
            self.settle(w);
            self.start_pass(w);
        }
    }

    /// Sends request `i` to a worker again (after a crash, or when one comes back).
    pub(super) fn reroute(&mut self, i: usize) {
        if let Some(w) = self.arrive(i) {
            self.settle(w);
            self.start_pass(w);
        }
    }
}

/// Worker `w` of the cluster, as the drain loop drives it.
struct SettleWorker<'c, 'a> {
    cluster: &'c mut Cluster<'a>,
    w: usize,
}

impl Driver for SettleWorker<'_, '_> {
    type Hardware = SimHardware;

    fn manager(&mut self) -> &mut Manager<SimHardware> {
        &mut self.cluster.workers[self.w].manager
    }

    fn on_output(&mut self, output: ManagerOutput) {
        self.cluster.handle_output(self.w, output);
    }

    fn on_event(&mut self, event: KvCacheEvent) {
        self.cluster.handle_event(self.w, event);
    }
}
