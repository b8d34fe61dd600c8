//! The twin of an engine cluster in time: N vLLM engines ([`VllmScheduler`]) behind
//! the choice the router service's front door makes, each step priced by a compute
//! model (the engine's own measured profile, `kvtwin profile --engine`), requests
//! arriving when a trace says.
//!
//! Owns: [`TwinCluster`] (the engines, the router's block index and scheduler, the
//! clock), [`TwinRequest`] (one arrival), [`TwinServed`] (what the twin says of it) and
//! [`TwinRun`]. The choice follows `RouterState::choose_engine` and `dispatch`
//! (backends/plane/src/service/state/serving.rs) exactly: the engines' events in a
//! [`KvIndexer`], the candidates in worker order, the scheduler's cost and its seeded
//! tie-break, a request's load its prompt blocks rounded up, held from its dispatch
//! to its last token. An engine schedules a step as soon as the last one ends and it
//! has work (vLLM's busy loop, `EngineCore.step`); a step's outputs (sampled tokens,
//! finished requests, KV events) land when it ends, its duration
//! [`ComputeModel::pass`] of what it scheduled, times a factor drawn (one seeded ChaCha
//! stream for the cluster, one draw a step, in the order steps start) from how the
//! engine's single steps strayed from its profile's figures when a profile measured it
//! (`TableModel::step_spread`). Without that spread the twin is a lockstep machine: two
//! closed-loop clients whose answers end in one step send again at one instant and stay
//! in phase for the whole run, where the real engines' step-to-step jitter pulls them
//! apart and mixes prefills into others' decodes. A request's time to first token runs
//! from its arrival to the end of the step that samples its first token. Routed on
//! arrival, it reaches its engine's queue a request overhead later (the profile's
//! `request_overhead_ms`: HTTP, router, tokenizer and the queues between vLLM's
//! processes, time its engine does not step for); a profile without one has that time
//! inside its prefill times instead, and requests reach their engine on arrival. A
//! request routed to an engine that is stepping takes the overhead the profile measured
//! beside as many requests as that engine holds (`BesideDecode::overhead_ms`, else
//! `request_overhead_busy_ms`) where it is more (vLLM's API server sharing the CPU with
//! the pass and streaming the others' answers), and the step in flight then takes the profile's `arrival_stretch_ms` longer
//! (the CPU the way in took from it). A pass may stall beyond its figure as often as
//! the profile's `stalls` say.
//! Never: read a clock (time is the trace's and the model's), talk to an engine, or
//! iterate anything unordered.

use super::cache::VllmCacheConfig;
use super::connector::{ConnectorTiers, Loaded, TwinStore};
use super::request::VllmRequest;
use super::scheduler::{StepOutcome, VllmScheduler, VllmSchedulerConfig};
use crate::compute::{ComputeModel, Pass};
use kvtwin::block::BlockIdentity;
use kvtwin::events::KvCacheEvent;
use kvtwin::ids::LocalBlockHash;
use kvtwin::ids::{RequestId, WorkerId, WorkerWithDpRank};
use kvtwin::router::indexer::KvIndexer;
use kvtwin::router::scheduler::{Scheduler, SchedulerConfig};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

/// What the twin cluster is built with.
#[derive(Clone, Debug, PartialEq)]
pub struct TwinClusterConfig {
    /// The engines, by the worker ids the router knows them by, in that order.
    pub workers: Vec<WorkerId>,
    /// Each engine's scheduler.
    pub scheduler: VllmSchedulerConfig,
    /// Each engine's KV cache.
    pub cache: VllmCacheConfig,
    /// kvtwin's connector in front of each engine, with these tiers of its own (host
    /// memory at least one block); `None`: the engines' own caches only.
    pub connector: Option<ConnectorTiers>,
    /// The router's cost weights, temperature and seed (`kvtwin router`'s
    /// `--overlap-weight`, `--request-load-weight`, `--router-temperature`; seed 0).
    pub routing: SchedulerConfig,
    /// What a step takes.
    pub compute: ComputeModel,
    /// An engine's own measured table where it has one (`kvtwin profile --engine`'s
    /// `compute-engines.ron`: engines that look alike need not run alike); the others
    /// take `compute`.
    pub engine_compute: BTreeMap<WorkerId, ComputeModel>,
    /// Seeds the draws of step times from the profile's spread (unused without one).
    pub seed: u64,
}

/// One request as it reaches the router.
#[derive(Clone, Debug, PartialEq)]
pub struct TwinRequest {
    /// When it arrives, since the run began.
    pub arrival: Duration,
    /// Identities of the full blocks of its prompt and outputs, first first.
    pub blocks: Vec<BlockIdentity>,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Output tokens it generates.
    pub output_tokens: u64,
}

impl TwinRequest {
    /// The `index`th request: a prompt of `prompt_tokens` whose full blocks are
    /// `prompt_blocks` (first first; more are ignored), generating `output_tokens`. The
    /// blocks its outputs fill (and the prompt's partial block, which they complete) get
    /// identities of their own, made from `index`: no other request repeats them, as no
    /// later prompt repeats an answer in the traffic the twin replays.
    pub fn new(
        index: usize,
        arrival: Duration,
        prompt_blocks: &[BlockIdentity],
        prompt_tokens: u64,
        output_tokens: u64,
        block_size: u64,
    ) -> Self {
        let block_size = block_size.max(1);
        let full = usize::try_from(prompt_tokens / block_size)
            .unwrap_or(usize::MAX)
            .min(prompt_blocks.len());
        let total =
            usize::try_from((prompt_tokens + output_tokens) / block_size).unwrap_or(usize::MAX);
        let mut blocks = prompt_blocks[..full].to_vec();
        // Outputs' local hashes: above 2⁶³ (a trace's ids are below 2⁵³), unique per
        // request and block.
        for block in full..total.max(full) {
            let local =
                LocalBlockHash::new((1 << 63) | ((index as u64) << 20) | (block as u64 & 0xF_FFFF));
            let next = BlockIdentity::chained(blocks.last(), local);
            blocks.push(next);
        }
        Self {
            arrival,
            blocks,
            prompt_tokens,
            output_tokens,
        }
    }

    /// The `index`th request of a Mooncake-format trace row at the engines' block size:
    /// one hash id per block of the prompt (the last one partial when the prompt does
    /// not end on a block; equal ids mean equal prefixes), the full blocks' ids taken as
    /// local hashes and chained; see [`Self::new`] for the rest.
    pub fn from_hash_ids(
        index: usize,
        arrival: Duration,
        hash_ids: &[u64],
        prompt_tokens: u64,
        output_tokens: u64,
        block_size: u64,
    ) -> Self {
        let full = usize::try_from(prompt_tokens / block_size.max(1))
            .unwrap_or(usize::MAX)
            .min(hash_ids.len());
        let locals: Vec<LocalBlockHash> = hash_ids[..full]
            .iter()
            .map(|&id| LocalBlockHash::new(id))
            .collect();
        Self::new(
            index,
            arrival,
            &BlockIdentity::chain(&locals),
            prompt_tokens,
            output_tokens,
            block_size,
        )
    }

    /// The local hashes of its prompt's full blocks: the router's query.
    fn query(&self, block_size: u64) -> Vec<LocalBlockHash> {
        let full = usize::try_from(self.prompt_tokens / block_size.max(1)).unwrap_or(usize::MAX);
        self.blocks
            .iter()
            .take(full)
            .map(|identity| identity.local_hash)
            .collect()
    }
}

/// When the twin's requests arrive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TwinArrivals {
    /// Each at its own `arrival`: an open loop (a trace's times, Poisson arrivals).
    Open,
    /// `clients` closed-loop clients: the first `clients` requests at their own
    /// `arrival`, then each next one (in the order given) `think` after an earlier one
    /// ends, as a client sends its next request once its answer is in. A closed loop
    /// replayed at the real run's times would be a different load: a twin slower than
    /// the engines would pile the requests up, one faster would leave gaps.
    Closed {
        /// Requests in flight at most.
        clients: usize,
        /// From an answer's last token to the next request's arrival.
        think: Duration,
    },
}

/// What the twin says of one request.
#[derive(Clone, Debug, PartialEq)]
pub struct TwinServed {
    /// The engine the router chose.
    pub worker: WorkerId,
    /// Prompt tokens the engine found cached (its usage's `cached_tokens`).
    pub cached_tokens: u64,
    /// The router's overlap with the request on that engine, in blocks.
    pub overlap_blocks: u32,
    /// Arrival to the first output token.
    pub ttft: Duration,
    /// Arrival to the start of the step that first computed it: its way in (the
    /// request overhead) and its wait for the engine's step in flight. What is left of
    /// `ttft` is the steps that prefilled it, vLLM's `request_prefill_time`.
    pub scheduled: Duration,
    /// Mean gap between its output tokens (`None` with fewer than two).
    pub itl: Option<Duration>,
    /// Arrival to the last output token.
    pub e2e: Duration,
    /// Times it was preempted (and recomputed).
    pub preemptions: u32,
    /// Of `cached_tokens`, those the connector's store held beyond the engine's own hit.
    pub external_tokens: u64,
    /// Blocks the connector loaded for it, by tier.
    pub loaded: Loaded,
}

/// A whole run of the twin.
#[derive(Clone, Debug, PartialEq)]
pub struct TwinRun {
    /// Per request, in the order given; `None` for one the twin could never schedule
    /// (longer than an engine's cache).
    pub served: Vec<Option<TwinServed>>,
    /// Steps the engines ran, together.
    pub steps: u64,
    /// From the first arrival to the last token.
    pub makespan: Duration,
}

impl TwinRun {
    /// Requests each engine served, by worker id.
    pub fn requests_per_worker(&self) -> BTreeMap<WorkerId, u64> {
        let mut counts = BTreeMap::new();
        for served in self.served.iter().flatten() {
            *counts.entry(served.worker).or_default() += 1;
        }
        counts
    }
}

/// One engine of the twin: its scheduler, and the step in flight (its outputs land at
/// `ends_at`).
struct TwinEngine {
    key: WorkerWithDpRank,
    /// What its steps take: its own table, or the cluster's.
    compute: ComputeModel,
    scheduler: VllmScheduler,
    /// The step under way: when it started, when it ends, what it does.
    in_flight: Option<(u64, u64, StepOutcome)>,
    next_event_id: u64,
}

/// Per request while it is served.
#[derive(Clone, Copy, Default)]
struct Progress {
    arrived_ns: u64,
    overlap_blocks: u32,
    load_blocks: u64,
    /// When the first step that computed it started.
    scheduled_ns: Option<u64>,
    first_token_ns: Option<u64>,
    last_token_ns: u64,
    tokens: u64,
}

/// The twin cluster; see the module documentation.
pub struct TwinCluster {
    config: TwinClusterConfig,
    engines: Vec<TwinEngine>,
    indexer: KvIndexer,
    router: Scheduler,
    steps: u64,
    /// Draws each step's factor; see the module documentation.
    step_draws: ChaCha8Rng,
}

impl TwinCluster {
    /// Idle engines with empty caches, every one routable.
    pub fn new(config: TwinClusterConfig) -> Self {
        let mut router = Scheduler::new(config.routing);
        let step_draws = ChaCha8Rng::seed_from_u64(config.seed);
        let engines = config
            .workers
            .iter()
            .map(|&worker| {
                let key = WorkerWithDpRank { worker, dp_rank: 0 };
                router.add_worker(key);
                TwinEngine {
                    key,
                    compute: config
                        .engine_compute
                        .get(&worker)
                        .unwrap_or(&config.compute)
                        .clone(),
                    scheduler: match config.connector {
                        None => VllmScheduler::new(config.scheduler, config.cache),
                        Some(tiers) => VllmScheduler::with_connector(
                            config.scheduler,
                            config.cache,
                            TwinStore::new(tiers, config.cache.block_size as usize)
                                .expect("a connector with host memory makes a store"),
                        ),
                    },
                    in_flight: None,
                    next_event_id: 0,
                }
            })
            .collect();
        Self {
            config,
            engines,
            indexer: KvIndexer::new(),
            router,
            steps: 0,
            step_draws,
        }
    }

    /// Serves `requests` (in order of arrival; ties keep their order) to the end, arriving
    /// as `arrivals` says.
    pub fn serve(mut self, requests: &[TwinRequest], arrivals: TwinArrivals) -> TwinRun {
        let block_size = self.config.cache.block_size.max(1);
        let capacity_tokens = u64::from(self.config.cache.num_gpu_blocks) * block_size;
        let mut progress: Vec<Option<Progress>> = vec![None; requests.len()];
        let mut served: Vec<Option<TwinServed>> = vec![None; requests.len()];
        let mut next_arrival = 0;
        // Closed loop: when the requests after the first `clients` may come, in order.
        let mut released: VecDeque<u64> = VecDeque::new();
        let first_ns = requests.first().map_or(0, |r| nanos(r.arrival));
        let mut now = first_ns;
        // Requests routed and on their way to their engine: (when they reach it, the
        // engine, the request), in that order (ties in the order they were routed).
        let mut on_the_way: VecDeque<(u64, usize, usize)> = VecDeque::new();
        loop {
            let step_end = self
                .engines
                .iter()
                .enumerate()
                .filter_map(|(i, e)| e.in_flight.as_ref().map(|(_, at, _)| (*at, i)))
                .min();
            let arrival = match arrivals {
                _ if next_arrival >= requests.len() => None,
                TwinArrivals::Closed { clients, .. } if next_arrival >= clients.max(1) => {
                    released.front().map(|&at| at.max(now))
                }
                _ => Some(nanos(requests[next_arrival].arrival).max(now)),
            };
            // A step's outputs land, then requests reach their engines, then new ones
            // arrive, at the same instant.
            if let Some(&(at, engine, index)) = on_the_way.front() {
                if step_end.is_none_or(|(end, _)| at < end) && arrival.is_none_or(|a| at <= a) {
                    now = at;
                    on_the_way.pop_front();
                    self.deliver(engine, index, &requests[index], now, capacity_tokens);
                    continue;
                }
            }
            let step_first = match (step_end, arrival) {
                (Some((at, _)), Some(a)) => at <= a,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                // Nothing on the way either: it would have been delivered above.
                (None, None) => break,
            };
            if let (true, Some((at, engine))) = (step_first, step_end) {
                now = at;
                let finished = self.land(engine, now, &mut progress, &mut served);
                if let TwinArrivals::Closed { think, .. } = arrivals {
                    released.extend((0..finished).map(|_| now + nanos(think)));
                }
                self.start_step(engine, now, capacity_tokens);
            } else if let Some(at) = arrival {
                now = at;
                if matches!(arrivals, TwinArrivals::Closed { clients, .. } if next_arrival >= clients.max(1))
                {
                    released.pop_front();
                }
                let index = next_arrival;
                next_arrival += 1;
                let (engine, routed) = self.dispatch(&requests[index], block_size, now);
                progress[index] = Some(routed);
                // An engine stepping for others when the request comes slows its way in:
                // vLLM's API server and engine core share the CPU with the pass.
                let twin = &self.engines[engine];
                let delay = nanos(if twin.in_flight.is_some() {
                    let held = twin.scheduler.num_unfinished().max(1) as u64;
                    twin.compute.request_overhead_beside(held)
                } else {
                    twin.compute.request_overhead()
                });
                let stretch = nanos(twin.compute.arrival_stretch());
                // And slows that step: the way in runs on the pass's CPU.
                if let Some((_, ends, _)) = &mut self.engines[engine].in_flight {
                    *ends += stretch;
                }
                if delay == 0 {
                    self.deliver(engine, index, &requests[index], now, capacity_tokens);
                } else {
                    let at = now + delay;
                    let place = on_the_way.partition_point(|&(due, _, _)| due <= at);
                    on_the_way.insert(place, (at, engine, index));
                }
            }
        }
        TwinRun {
            served,
            steps: self.steps,
            makespan: Duration::from_nanos(now.saturating_sub(first_ns)),
        }
    }

    /// The router's choice for `request`, arriving at `now` (`choose_engine`, then
    /// `dispatch`'s load): the engine, and the request's progress from here.
    fn dispatch(&mut self, request: &TwinRequest, block_size: u64, now: u64) -> (usize, Progress) {
        let query = request.query(block_size);
        let overlaps = self.indexer.find_matches(&query, false).workers;
        let candidates = self.router.candidates(query.len(), &overlaps);
        let decision = self
            .router
            .choose(&candidates)
            .expect("every engine of the twin is routable");
        let load_blocks = request.prompt_tokens.div_ceil(block_size);
        self.router.record_start(decision.worker, load_blocks);
        let engine = self
            .engines
            .iter()
            .position(|e| e.key == decision.worker)
            .expect("the router chooses among the engines");
        let progress = Progress {
            arrived_ns: now,
            overlap_blocks: decision.overlap_blocks,
            load_blocks,
            ..Progress::default()
        };
        (engine, progress)
    }

    /// Request `index` reaches `engine` at `now` (routed there a request overhead ago):
    /// it joins the scheduler's queue, and an idle engine steps at once.
    fn deliver(
        &mut self,
        engine: usize,
        index: usize,
        request: &TwinRequest,
        now: u64,
        capacity_tokens: u64,
    ) {
        self.engines[engine].scheduler.add_request(VllmRequest::new(
            RequestId::new(index as u64),
            request.blocks.clone(),
            request.prompt_tokens,
            request.output_tokens.max(1),
        ));
        if self.engines[engine].in_flight.is_none() {
            self.start_step(engine, now, capacity_tokens);
        }
    }

    /// Schedules `engine`'s next step at `now`, if it has one.
    fn start_step(&mut self, engine: usize, now: u64, capacity_tokens: u64) {
        let Some(outcome) = self.engines[engine].scheduler.step() else {
            return;
        };
        let mut pass = Pass::default();
        for scheduled in &outcome.scheduled {
            if scheduled.prefill {
                pass.prefills.push((scheduled.tokens, scheduled.context));
            } else {
                pass.decodes += 1;
                pass.decode_context += scheduled.context + scheduled.tokens;
            }
        }
        let compute = &self.engines[engine].compute;
        let mut took = compute.pass(&pass, capacity_tokens).total;
        if compute.steps_vary() {
            let u: f64 = self.step_draws.gen();
            took = took.mul_f64(compute.step_factor(u));
        }
        // Drawn apart from the spread, and only where the profile saw stalls, so that a
        // table without them replays as it did before they were measured.
        if compute.stalls_happen() {
            let u: f64 = self.step_draws.gen();
            took += compute.stall(u);
        }
        self.steps += 1;
        // At least a nanosecond: time moves on even under a profile that says 0.
        self.engines[engine].in_flight = Some((now, now + nanos(took).max(1), outcome));
    }

    /// The outputs of `engine`'s step, at `now`: tokens, finished requests (their load
    /// off the router), KV events into the router's index. How many requests finished.
    fn land(
        &mut self,
        engine: usize,
        now: u64,
        progress: &mut [Option<Progress>],
        served: &mut [Option<TwinServed>],
    ) -> usize {
        let Some((started, _, outcome)) = self.engines[engine].in_flight.take() else {
            return 0;
        };
        let index_of = |id: RequestId| usize::try_from(id.get()).unwrap_or(usize::MAX);
        for scheduled in &outcome.scheduled {
            if let Some(Some(p)) = progress.get_mut(index_of(scheduled.id)) {
                p.scheduled_ns.get_or_insert(started);
            }
        }
        for &id in &outcome.sampled {
            if let Some(Some(p)) = progress.get_mut(index_of(id)) {
                p.first_token_ns.get_or_insert(now);
                p.last_token_ns = now;
                p.tokens += 1;
            }
        }
        let key = self.engines[engine].key;
        for done in &outcome.finished {
            let index = index_of(done.id);
            let Some(Some(p)) = progress.get(index).copied() else {
                continue;
            };
            self.router.record_finish(key, p.load_blocks);
            let arrival = p.arrived_ns;
            let first = p.first_token_ns.unwrap_or(now);
            served[index] = Some(TwinServed {
                worker: key.worker,
                cached_tokens: done.cached_tokens,
                overlap_blocks: p.overlap_blocks,
                ttft: Duration::from_nanos(first.saturating_sub(arrival)),
                scheduled: Duration::from_nanos(
                    p.scheduled_ns.unwrap_or(first).saturating_sub(arrival),
                ),
                itl: (p.tokens >= 2)
                    .then(|| Duration::from_nanos((p.last_token_ns - first) / (p.tokens - 1))),
                e2e: Duration::from_nanos(now.saturating_sub(arrival)),
                preemptions: done.preemptions,
                external_tokens: done.external_tokens,
                loaded: done.loaded,
            });
        }
        let twin = &mut self.engines[engine];
        for data in outcome.events {
            let event = KvCacheEvent {
                event_id: twin.next_event_id,
                dp_rank: 0,
                data,
            };
            twin.next_event_id += 1;
            // The twin's own stream is gap-free and well formed; a refusal would be a
            // bug in the cache model, which its own tests catch.
            let _ = self.indexer.apply(key.worker, &event);
        }
        outcome.finished.len()
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}
