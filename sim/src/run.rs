//! One simulated worker serving a workload, and the report of the run.
//!
//! Owns: the run loop ([`simulate`]) and [`Report`]. Requests arrive at their times; each
//! is looked up (device hits, lower-tier hits onboarded over the modelled links), its
//! remaining blocks are allocated and prefilled, registered (and offloaded per the tier
//! policies), decoded, and released. A request that finds no free device blocks waits
//! and is retried, first come first served, when another finishes. Every event the
//! manager emits is replayed into a registry replica, and the run checks at the end that
//! it matches the pools: the router's view can be rebuilt from events alone.
//!
//! Compute is continuously batched: one forward pass at a time holds every decoding
//! sequence (one token each) and prefill chunks of the oldest prompts up to the token
//! budget ([`crate::scenario::Batching`]); the compute model times the pass, and first
//! tokens land when its prefill part ends. Generated tokens take device blocks as they
//! go; when none is free, the newest running request is preempted (recompute: its blocks
//! go back, and it prefills its prompt and the tokens generated so far again when a
//! request finishes). At one instant, work in the worker finishes before new requests
//! arrive. Latencies are predictions of the model.
//! Never: read a clock or iterate an unordered map.

use crate::compute::{ComputeModel, Pass, UnknownProfile};
use crate::engine::EventQueue;
use crate::hardware::{LinkUsage, SimHardware};
use crate::scenario::{Batching, Scenario};
use crate::workload::Request;
use kvtwin::block::Reset;
use kvtwin::events::{KvCacheEventData, RegistryReplica};
use kvtwin::hardware::Hardware;
use kvtwin::ids::{RequestId, SequenceHash, Timestamp};
use kvtwin::manager::{Manager, ManagerConfigError, ManagerOutput};
use kvtwin::pool::{BlockChain, ImmutableBlock, MutableBlock};
use kvtwin::tier::Tier;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;

#[derive(Debug)]
enum Event {
    Arrival(usize),
    Poll,
    /// The forward pass in flight is done.
    PassDone,
}

#[derive(Debug)]
enum State {
    Onboarding {
        held: BlockChain,
        device_hits: usize,
        onboard_tiers: Vec<Tier>,
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
    /// Computed (prefilled).
    pub computed: u64,
    /// Prompt tokens of served requests.
    pub prompt_tokens: u64,
    /// Of those, tokens in cached blocks: min(cached blocks × block tokens, prompt
    /// tokens) per request (the Mooncake reference's `hit_tokens`).
    pub hit_tokens: u64,
}

/// Latency percentiles in milliseconds (predictions of the model).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Percentiles {
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
    fn of(mut samples_ns: Vec<u64>) -> Self {
        samples_ns.sort_unstable();
        let at = |q: f64| -> f64 {
            if samples_ns.is_empty() {
                return 0.0;
            }
            let rank = ((q * samples_ns.len() as f64).ceil() as usize).clamp(1, samples_ns.len());
            samples_ns[rank - 1] as f64 / 1e6
        };
        Self {
            p50_ms: at(0.50),
            p90_ms: at(0.90),
            p99_ms: at(0.99),
            max_ms: at(1.0),
        }
    }
}

/// One link's traffic.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LinkReport {
    /// The link.
    pub link: &'static str,
    /// Bytes carried.
    pub bytes: u64,
    /// Transfers carried.
    pub transfers: u64,
    /// Busy time over simulated time.
    pub utilisation: f64,
}

/// Events the worker emitted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct EventCounts {
    /// Events.
    pub events: u64,
    /// Blocks in `Stored` events.
    pub stored_blocks: u64,
    /// Blocks in `Removed` events.
    pub removed_blocks: u64,
    /// Whether replaying them rebuilt every tier's registry exactly.
    pub rebuild_matches_pools: bool,
}

/// What a run did.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    /// Scenario name.
    pub scenario: String,
    /// The seed.
    pub seed: u64,
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
    /// Traffic per link.
    pub links: Vec<LinkReport>,
    /// Events emitted.
    pub events: EventCounts,
    /// Simulated time at the end.
    pub simulated_s: f64,
    /// Forward passes run.
    pub passes: u64,
    /// Requests taken off the device to make room (recompute preemption).
    pub preemptions: u64,
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
            "scenario {} (seed {}), {:.1} s simulated, {} forward passes",
            self.scenario, self.seed, self.simulated_s, self.passes
        )?;
        writeln!(
            f,
            "requests  {} arrived, {} completed, {} too large for the device, {} waits for blocks",
            self.requests, self.completed, self.rejected_too_large, self.waits_for_blocks
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
            "latency   TTFT p50 {:.1} ms, p99 {:.1} ms; TPOT p50 {:.2} ms, p99 {:.2} ms; end-to-end p50 {:.1} ms, p99 {:.1} ms (model predictions)",
            self.ttft.p50_ms,
            self.ttft.p99_ms,
            self.tpot.p50_ms,
            self.tpot.p99_ms,
            self.end_to_end.p50_ms,
            self.end_to_end.p99_ms
        )?;
        writeln!(f, "output    {:.0} tokens/s", self.output_tokens_per_s)?;
        write!(
            f,
            "events    {} events, {} blocks stored, {} removed; rebuilt registry matches pools: {}",
            self.events.events,
            self.events.stored_blocks,
            self.events.removed_blocks,
            self.events.rebuild_matches_pools
        )
    }
}

struct Sim<'a> {
    requests: &'a [Request],
    manager: Manager<SimHardware>,
    queue: EventQueue<Event>,
    states: BTreeMap<usize, State>,
    waiting: VecDeque<usize>,
    poll_at: BTreeSet<Timestamp>,
    replica: RegistryReplica,
    events: EventCounts,
    sources: BlockSources,
    ttft_ns: Vec<u64>,
    e2e_ns: Vec<u64>,
    tpot_ns: Vec<u64>,
    /// Per request: output tokens generated so far (kept across preemptions), whether
    /// its first token and its prompt blocks have been counted.
    generated: Vec<u64>,
    first_token_done: Vec<bool>,
    counted: Vec<bool>,
    preemptions: u64,
    /// When each request's first token landed.
    first_token_at: Vec<Timestamp>,
    output_tokens: u64,
    completed: u64,
    too_large: u64,
    waits: u64,
    block_size: u64,
    compute: ComputeModel,
    device_capacity_tokens: u64,
    batching: Batching,
    /// Requests whose prefill is not done, oldest first.
    prefill_queue: VecDeque<usize>,
    pass: Option<PassInFlight>,
    passes: u64,
    now: Timestamp,
}

/// The forward pass running now.
#[derive(Debug)]
struct PassInFlight {
    /// Requests in it, with the tokens each processes.
    members: Vec<(usize, u64)>,
    /// When its prefill part ends.
    first_token_at: Timestamp,
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
}

/// Runs `requests` through one worker configured by `scenario`.
pub fn simulate(scenario: &Scenario, requests: &[Request]) -> Result<Report, SimError> {
    let config = scenario.worker.manager_config();
    let compute = scenario.hardware.compute_model()?;
    let device_capacity_tokens = config
        .tiers
        .iter()
        .filter(|t| t.tier == Tier::Device)
        .map(|t| (t.capacity_blocks * config.block_size_tokens) as u64)
        .sum();
    let hardware = SimHardware::new(scenario.hardware.clone(), config.block_size_tokens);
    let block_size = config.block_size_tokens as u64;
    let mut sim = Sim {
        requests,
        manager: Manager::new(hardware, config)?,
        queue: EventQueue::new(),
        states: BTreeMap::new(),
        waiting: VecDeque::new(),
        poll_at: BTreeSet::new(),
        replica: RegistryReplica::new(),
        events: EventCounts::default(),
        sources: BlockSources::default(),
        ttft_ns: Vec::new(),
        e2e_ns: Vec::new(),
        tpot_ns: Vec::new(),
        generated: vec![0; requests.len()],
        first_token_done: vec![false; requests.len()],
        counted: vec![false; requests.len()],
        preemptions: 0,
        first_token_at: vec![Timestamp::ZERO; requests.len()],
        output_tokens: 0,
        completed: 0,
        too_large: 0,
        waits: 0,
        block_size,
        compute,
        device_capacity_tokens,
        batching: scenario.worker.batching,
        prefill_queue: VecDeque::new(),
        pass: None,
        passes: 0,
        now: Timestamp::ZERO,
    };
    // Arrivals in time order (ties in request order). At one instant, work already in
    // the worker (passes, transfers) finishes before new requests arrive, so a worker
    // infinitely fast serves requests one at a time, as a cache replay does.
    let mut arrivals: Vec<usize> = (0..requests.len()).collect();
    arrivals.sort_by_key(|i| (requests[*i].arrival, *i));
    let mut arrivals = arrivals.into_iter().peekable();
    loop {
        let internal = sim.queue.peek_time();
        let arrival = arrivals.peek().map(|i| requests[*i].arrival);
        let (at, event) = match (internal, arrival) {
            (Some(t), Some(a)) if a < t => (a, Event::Arrival(arrivals.next().unwrap_or(0))),
            (None, Some(a)) => (a, Event::Arrival(arrivals.next().unwrap_or(0))),
            _ => match sim.queue.pop() {
                Some(next) => next,
                None if !sim.waiting.is_empty() && sim.states.is_empty() => {
                    // Nothing runs that would retry the queue (only after a preemption):
                    // retry it now, once; if nothing starts, the rest cannot be served.
                    let waiting = sim.waiting.len();
                    sim.retry_waiting();
                    sim.settle();
                    sim.start_pass();
                    if sim.waiting.len() == waiting && sim.states.is_empty() {
                        break;
                    }
                    continue;
                }
                None => break,
            },
        };
        sim.now = at;
        sim.manager.hardware().clock().set(at);
        match event {
            Event::Arrival(i) => sim.arrive(i),
            Event::Poll => {
                sim.poll_at.remove(&at);
            }
            Event::PassDone => sim.pass_done(),
        }
        sim.settle();
        sim.start_pass();
    }
    Ok(sim.report(scenario))
}

impl Sim<'_> {
    fn hashes(&self, i: usize) -> Vec<SequenceHash> {
        self.requests[i]
            .blocks
            .iter()
            .map(|b| b.sequence_hash)
            .collect()
    }

    fn arrive(&mut self, i: usize) {
        let request = &self.requests[i];
        // Prompt and output together must fit the device, or no preemption can help.
        let blocks_needed =
            (request.input_tokens + request.output_tokens).div_ceil(self.block_size);
        if blocks_needed > self.manager.device().capacity() as u64 {
            self.too_large += 1;
            return;
        }
        let hashes = self.hashes(i);
        let mut plan = self.manager.lookup(&hashes, self.now);
        let device_hits = plan.device_blocks().len();
        let onboard_tiers: Vec<Tier> = plan
            .onboard_blocks()
            .iter()
            .map(ImmutableBlock::tier)
            .collect();
        if !onboard_tiers.is_empty()
            && self
                .manager
                .start_onboard(RequestId::new(i as u64), &mut plan, self.now)
                .is_ok()
        {
            let held = plan.into_device_blocks();
            self.states.insert(
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
        self.start_prefill(i, held, device_hits, [0; 4]);
    }

    fn start_prefill(
        &mut self,
        i: usize,
        held: BlockChain,
        device_hits: usize,
        onboarded: [usize; 4],
    ) {
        let request = &self.requests[i];
        let need = request.blocks.len() - held.len();
        match self.manager.allocate(need, self.now) {
            Ok(computing) => {
                // A preempted request starting again is not a new request to count.
                if !self.counted[i] {
                    self.counted[i] = true;
                    let sources = &mut self.sources;
                    sources.total += request.blocks.len() as u64;
                    sources.device += device_hits as u64;
                    sources.host += onboarded[Tier::Host.index()] as u64;
                    sources.disk += onboarded[Tier::Disk.index()] as u64;
                    sources.remote += onboarded[Tier::Remote.index()] as u64;
                    sources.computed += need as u64;
                    sources.prompt_tokens += request.input_tokens;
                    sources.hit_tokens +=
                        (held.len() as u64 * self.block_size).min(request.input_tokens);
                }
                // After a preemption the tokens generated so far are recomputed too.
                let cached = (held.len() as u64 * self.block_size).min(request.input_tokens);
                let remaining = (request.input_tokens + self.generated[i])
                    .saturating_sub(cached)
                    .max(1);
                self.states.insert(
                    i,
                    State::Prefilling {
                        held,
                        computing,
                        remaining,
                        cached,
                    },
                );
                self.prefill_queue.push_back(i);
            }
            Err(_) => {
                self.manager.device().release(held);
                self.waits += 1;
                self.waiting.push_back(i);
            }
        }
    }

    /// Starts the next forward pass if none is running and there is work: every
    /// decoding sequence generates one token, and prefill chunks fill the rest of the
    /// token budget, oldest request first (chunked prefill), up to `max_seqs` sequences.
    fn start_pass(&mut self) {
        if self.pass.is_some() {
            return;
        }
        let batching = self.batching;
        let mut pass = Pass::default();
        let mut members: Vec<(usize, u64)> = Vec::new();
        for (i, state) in &self.states {
            if let State::Decoding { context, .. } = state {
                if members.len() >= batching.max_seqs {
                    break;
                }
                pass.decodes += 1;
                pass.decode_context += context;
                members.push((*i, 1));
            }
        }
        let mut budget = (batching.max_batch_tokens as u64).saturating_sub(pass.decodes);
        for i in &self.prefill_queue {
            if budget == 0 || members.len() >= batching.max_seqs {
                break;
            }
            let Some(State::Prefilling {
                remaining, cached, ..
            }) = self.states.get(i)
            else {
                continue;
            };
            let chunk = if batching.chunked_prefill {
                (*remaining).min(budget)
            } else if *remaining <= budget || pass.prefills.is_empty() {
                // Unchunked: a prompt goes whole (alone if it exceeds the budget).
                *remaining
            } else {
                break;
            };
            pass.prefills.push((chunk, *cached));
            members.push((*i, chunk));
            budget = budget.saturating_sub(chunk);
        }
        if members.is_empty() {
            return;
        }
        let time = self.compute.pass(&pass, self.device_capacity_tokens);
        self.passes += 1;
        self.pass = Some(PassInFlight {
            members,
            first_token_at: self.now.saturating_add(time.prefill),
        });
        self.queue
            .push(self.now.saturating_add(time.total), Event::PassDone);
    }

    /// Applies the finished pass: prefill chunks advance (a finished prompt registers
    /// its blocks, and its first token counts from the end of the pass's prefill part),
    /// decoding sequences gain a token (a finished one releases its blocks).
    fn pass_done(&mut self) {
        let Some(pass) = self.pass.take() else {
            return;
        };
        let mut finished = false;
        for (i, tokens) in pass.members {
            // The common case in place: a decoding sequence that goes on and has room
            // for its next token, or gets a block for it without preempting anyone.
            if let Some(State::Decoding {
                held,
                extra,
                context,
            }) = self.states.get_mut(&i)
            {
                let generated = self.generated[i] + 1;
                if generated < self.requests[i].output_tokens {
                    let next = self.requests[i].input_tokens + generated;
                    let needed = if self.batching.decode_blocks {
                        (next + 1).div_ceil(self.block_size) as usize
                    } else {
                        0
                    };
                    let room = held.len() + extra.len() >= needed
                        || match self.manager.allocate(1, self.now) {
                            Ok(mut block) => {
                                extra.append(&mut block);
                                held.len() + extra.len() >= needed
                            }
                            Err(_) => false,
                        };
                    if room {
                        self.generated[i] = generated;
                        *context = next;
                        continue;
                    }
                }
            }
            match self.states.remove(&i) {
                Some(State::Prefilling {
                    held,
                    computing,
                    remaining,
                    cached,
                }) if remaining > tokens => {
                    self.states.insert(
                        i,
                        State::Prefilling {
                            held,
                            computing,
                            remaining: remaining - tokens,
                            cached: cached + tokens,
                        },
                    );
                }
                Some(State::Prefilling {
                    mut held,
                    computing,
                    ..
                }) => {
                    self.prefill_queue.retain(|queued| *queued != i);
                    let request = &self.requests[i];
                    let complete = computing
                        .into_iter()
                        .zip(&request.blocks[held.len()..])
                        .map(|(block, identity)| block.apply_identity(*identity))
                        .collect();
                    held.extend(self.manager.register(complete, self.now));
                    if !self.first_token_done[i] {
                        self.first_token_done[i] = true;
                        self.ttft_ns.push(
                            pass.first_token_at
                                .saturating_duration_since(request.arrival)
                                .as_nanos() as u64,
                        );
                        self.first_token_at[i] = pass.first_token_at;
                    }
                    // The prefill pass produces the next token.
                    self.generated[i] += 1;
                    finished |= self.decoded(i, held, Vec::new());
                }
                Some(State::Decoding { held, extra, .. }) => {
                    self.generated[i] += 1;
                    finished |= self.decoded(i, held, extra);
                }
                Some(other) => {
                    self.states.insert(i, other);
                }
                None => {}
            }
        }
        if finished {
            self.retry_waiting();
        }
    }

    /// Request `i` has one more token: done, or decoding on with a block for the next
    /// token if it needs one (preempting the newest running request when none is free).
    /// Returns whether it is done.
    fn decoded(&mut self, i: usize, held: BlockChain, mut extra: Vec<MutableBlock<Reset>>) -> bool {
        let request = &self.requests[i];
        let (input, output) = (request.input_tokens, request.output_tokens);
        if self.generated[i] >= output {
            drop(extra);
            self.finish(i, held);
            return true;
        }
        let context = input + self.generated[i];
        // Room for the next token: prompt and generated tokens so far, plus one.
        let needed = if self.batching.decode_blocks {
            (context + 1).div_ceil(self.block_size) as usize
        } else {
            0
        };
        while held.len() + extra.len() < needed {
            match self.manager.allocate(1, self.now) {
                Ok(mut block) => extra.append(&mut block),
                Err(_) => {
                    let newest = self
                        .states
                        .iter()
                        .rev()
                        .find(|(_, s)| {
                            matches!(s, State::Decoding { .. } | State::Prefilling { .. })
                        })
                        .map(|(j, _)| *j)
                        .filter(|j| *j > i);
                    match newest {
                        Some(j) => self.preempt(j),
                        None => {
                            // It is the newest itself: it steps back.
                            drop(extra);
                            self.manager.device().release(held);
                            self.preempted(i);
                            return false;
                        }
                    }
                }
            }
        }
        self.states.insert(
            i,
            State::Decoding {
                held,
                extra,
                context,
            },
        );
        false
    }

    /// Takes request `j` off the device (recompute preemption): its blocks go back and it
    /// waits at the head of the queue to prefill its prompt and generated tokens again.
    fn preempt(&mut self, j: usize) {
        match self.states.remove(&j) {
            Some(State::Decoding { held, extra, .. }) => {
                drop(extra);
                self.manager.device().release(held);
            }
            Some(State::Prefilling {
                held, computing, ..
            }) => {
                drop(computing);
                self.manager.device().release(held);
                self.prefill_queue.retain(|queued| *queued != j);
            }
            Some(other) => {
                self.states.insert(j, other);
                return;
            }
            None => return,
        }
        self.preempted(j);
    }

    fn preempted(&mut self, j: usize) {
        self.preemptions += 1;
        self.waiting.push_front(j);
    }

    fn finish(&mut self, i: usize, held: BlockChain) {
        self.manager.device().release(held);
        let request = &self.requests[i];
        self.e2e_ns.push(
            self.now
                .saturating_duration_since(request.arrival)
                .as_nanos() as u64,
        );
        if request.output_tokens > 1 {
            let decoding = self.now.saturating_duration_since(self.first_token_at[i]);
            self.tpot_ns
                .push(decoding.as_nanos() as u64 / (request.output_tokens - 1));
        }
        self.output_tokens += request.output_tokens;
        self.completed += 1;
    }

    /// First come, first served: retries waiting requests until one still does not fit.
    fn retry_waiting(&mut self) {
        while let Some(next) = self.waiting.pop_front() {
            let before = self.waiting.len();
            self.arrive(next);
            if self.waiting.len() > before {
                if let Some(again) = self.waiting.pop_back() {
                    self.waiting.push_front(again);
                }
                break;
            }
        }
    }

    /// Lets the manager act on finished transfers, routes its outputs, drains events and
    /// schedules the next transfer deadline.
    fn settle(&mut self) {
        loop {
            self.manager.handle_completions(self.now);
            let mut progressed = false;
            while let Some(output) = self.manager.poll_output() {
                progressed = true;
                if let ManagerOutput::OnboardComplete {
                    request, blocks, ..
                } = output
                {
                    let i = request.get() as usize;
                    if let Some(State::Onboarding {
                        mut held,
                        device_hits,
                        onboard_tiers,
                    }) = self.states.remove(&i)
                    {
                        // Only what arrived counts as onboarded; the rest is computed.
                        let mut onboard = [0usize; 4];
                        for tier in onboard_tiers.iter().take(blocks.len()) {
                            onboard[tier.index()] += 1;
                        }
                        held.extend(blocks);
                        self.start_prefill(i, held, device_hits, onboard);
                    }
                }
            }
            if !progressed {
                break;
            }
        }
        for event in self.manager.take_events() {
            self.events.events += 1;
            match &event.data {
                KvCacheEventData::Stored { blocks, .. } => {
                    self.events.stored_blocks += blocks.len() as u64
                }
                KvCacheEventData::Removed { block_hashes, .. } => {
                    self.events.removed_blocks += block_hashes.len() as u64
                }
                KvCacheEventData::Cleared => {}
            }
            // A gap or duplicate would make the rebuild differ, which the report shows.
            let _ = self.replica.apply(&event);
        }
        if let Some(deadline) = self.manager.poll_timeout() {
            if self.poll_at.insert(deadline) {
                self.queue.push(deadline.max(self.now), Event::Poll);
            }
        }
    }

    fn report(self, scenario: &Scenario) -> Report {
        let simulated_ns = self.now.as_nanos().max(1);
        let rebuild_matches_pools = Tier::ALL.iter().all(|tier| match self.manager.pool(*tier) {
            Some(pool) => {
                pool.snapshot()
                    .registered
                    .keys()
                    .copied()
                    .collect::<BTreeSet<_>>()
                    == *self.replica.hashes(*tier)
            }
            None => self.replica.hashes(*tier).is_empty(),
        });
        let stats = self.manager.stats();
        let links = self
            .manager
            .hardware()
            .link_usage()
            .into_iter()
            .map(
                |(
                    link,
                    LinkUsage {
                        bytes,
                        busy_ns,
                        transfers,
                    },
                )| LinkReport {
                    link: link.name(),
                    bytes,
                    transfers,
                    utilisation: busy_ns as f64 / simulated_ns as f64,
                },
            )
            .collect();
        let sources = self.sources;
        let hit_ratio = if sources.total == 0 {
            0.0
        } else {
            1.0 - sources.computed as f64 / sources.total as f64
        };
        let hit_token_ratio = if sources.prompt_tokens == 0 {
            0.0
        } else {
            sources.hit_tokens as f64 / sources.prompt_tokens as f64
        };
        Report {
            hit_token_ratio,
            scenario: scenario.name.clone(),
            seed: scenario.seed,
            requests: self.requests.len() as u64,
            completed: self.completed,
            rejected_too_large: self.too_large,
            waits_for_blocks: self.waits,
            blocks: sources,
            hit_ratio,
            ttft: Percentiles::of(self.ttft_ns),
            end_to_end: Percentiles::of(self.e2e_ns),
            tpot: Percentiles::of(self.tpot_ns),
            output_tokens_per_s: self.output_tokens as f64 / (simulated_ns as f64 / 1e9),
            recomputed_hit_blocks: stats.recomputed_hit_blocks,
            offloaded_blocks: stats.offloaded_blocks,
            offload_skipped_blocks: stats.offload_skipped_blocks,
            transfers: stats.transfers_submitted,
            links,
            events: EventCounts {
                rebuild_matches_pools,
                ..self.events
            },
            simulated_s: simulated_ns as f64 / 1e9,
            passes: self.passes,
            preemptions: self.preemptions,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scenario::WorkloadSpec;
    use kvtwin::block::BlockIdentity;
    use kvtwin::ids::LocalBlockHash;
    use std::path::Path;

    /// One worker, 16-token blocks, 100 tokens a pass, prefill 1 µs a token and a decode
    /// step 100 µs whatever the batch.
    fn scenario() -> Scenario {
        let text = r#"(
            name: "batching", seed: 1,
            hardware: (
                name: "h", pcie_bytes_per_s: 1000000000, pcie_latency_ns: 0,
                nvme_read_bytes_per_s: 1000000000, nvme_write_bytes_per_s: 1000000000,
                nvme_latency_ns: 0, nic_bytes_per_s: 1000000000, nic_latency_ns: 0,
                prefill_ns_per_token: 1000, decode_ns_per_token: 100000,
                max_inflight_transfers: 8,
            ),
            worker: (
                block_size_tokens: 16, bytes_per_block: 1024, onboard: CostAware,
                max_inflight_transfers: 8,
                tiers: [(tier: Device, capacity_blocks: 64)],
                batching: (max_seqs: 8, max_batch_tokens: 100, chunked_prefill: true),
            ),
            workload: MooncakeTrace(path: "unused.jsonl"),
        )"#;
        let scenario = Scenario::parse(text, Path::new("batching.ron")).unwrap();
        assert!(matches!(
            scenario.workload,
            WorkloadSpec::MooncakeTrace { .. }
        ));
        scenario
    }

    fn request(id: u64, first_local: u64, input_tokens: u64, output_tokens: u64) -> Request {
        let locals: Vec<LocalBlockHash> = (0..input_tokens / 16)
            .map(|b| LocalBlockHash::new(first_local + b))
            .collect();
        Request {
            id: RequestId::new(id),
            arrival: Timestamp::ZERO,
            blocks: BlockIdentity::chain(&locals),
            input_tokens,
            output_tokens,
        }
    }

    #[test]
    fn passes_batch_decodes_and_chunk_prefills_within_the_token_budget() {
        // A (150 prompt tokens, 3 out) and B (40 tokens, 2 out) arrive at 0.
        // Pass 1, 0–100 µs: A's first 100 tokens (B arrives while it runs).
        // Pass 2, 100–190 µs: A's last 50 and B's 40: both first tokens at 190 µs.
        // Pass 3, 190–290 µs: both decode; B is done. Pass 4, 290–390 µs: A is done.
        let requests = [request(0, 1000, 150, 3), request(1, 2000, 40, 2)];
        let report = simulate(&scenario(), &requests).unwrap();
        assert_eq!(report.completed, 2);
        assert_eq!((report.ttft.p50_ms, report.ttft.max_ms), (0.19, 0.19));
        assert_eq!(
            (report.end_to_end.p50_ms, report.end_to_end.max_ms),
            (0.29, 0.39)
        );
        assert_eq!(report.passes, 4);
        // Both decode one token per 100 µs pass after their first.
        assert_eq!((report.tpot.p50_ms, report.tpot.max_ms), (0.1, 0.1));
    }

    #[test]
    fn unchunked_prompts_go_whole_and_alone_when_over_budget() {
        let mut scenario = scenario();
        scenario.worker.batching.chunked_prefill = false;
        // Pass 1, 0–150 µs: A's 150 tokens alone (over the budget, so alone).
        // Pass 2, 150–290 µs: A decodes, B's 40 tokens prefill: B's first token at
        // 190 µs, the pass ends at 290 µs.
        let requests = [request(0, 1000, 150, 3), request(1, 2000, 40, 2)];
        let report = simulate(&scenario, &requests).unwrap();
        assert_eq!((report.ttft.p50_ms, report.ttft.max_ms), (0.15, 0.19));
        assert_eq!(report.completed, 2);
    }

    #[test]
    fn decoding_takes_blocks_and_preempts_the_newest_request_when_they_run_out() {
        // Six blocks of 16 tokens. A and B (32 prompt tokens, 40 out) each need 5 blocks
        // by their last token: together they do not fit, so B, the newer, steps back
        // once A needs its blocks, and finishes after A.
        let mut scenario = scenario();
        scenario.worker.tiers[0].capacity_blocks = 6;
        let requests = [request(0, 1000, 32, 40), request(1, 2000, 32, 40)];
        let report = simulate(&scenario, &requests).unwrap();
        assert_eq!(report.completed, 2);
        assert!(report.preemptions >= 1, "{report:?}");
        assert!(report.events.rebuild_matches_pools);
        // A request too big for the device even alone is rejected, not stuck.
        let report = simulate(&scenario, &[request(0, 1000, 32, 80)]).unwrap();
        assert_eq!((report.completed, report.rejected_too_large), (0, 1));
    }
}
