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
//! The compute model here is linear per token; latencies are predictions of the model.
//! Never: read a clock or iterate an unordered map.

use crate::compute::{ComputeModel, UnknownProfile};
use crate::engine::EventQueue;
use crate::hardware::{LinkUsage, SimHardware};
use crate::scenario::Scenario;
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
use std::time::Duration;

#[derive(Debug)]
enum Event {
    Arrival(usize),
    Poll,
    PrefillDone(usize),
    DecodeDone(usize),
}

#[derive(Debug)]
enum State {
    Onboarding {
        held: BlockChain,
        device_hits: usize,
        onboard_tiers: Vec<Tier>,
    },
    Prefilling {
        held: BlockChain,
        computing: Vec<MutableBlock<Reset>>,
    },
    Decoding {
        held: BlockChain,
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
    /// Time to first token.
    pub ttft: Percentiles,
    /// Arrival to last token.
    pub end_to_end: Percentiles,
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
            "scenario {} (seed {}), {:.1} s simulated",
            self.scenario, self.seed, self.simulated_s
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
            "          hit ratio {:.4}; {} lower-tier hits recomputed (cheaper)",
            self.hit_ratio, self.recomputed_hit_blocks
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
            "latency   TTFT p50 {:.1} ms, p99 {:.1} ms; end-to-end p50 {:.1} ms, p99 {:.1} ms (model predictions)",
            self.ttft.p50_ms, self.ttft.p99_ms, self.end_to_end.p50_ms, self.end_to_end.p99_ms
        )?;
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
    completed: u64,
    too_large: u64,
    waits: u64,
    block_size: u64,
    compute: ComputeModel,
    device_capacity_tokens: u64,
    now: Timestamp,
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
        completed: 0,
        too_large: 0,
        waits: 0,
        block_size,
        compute,
        device_capacity_tokens,
        now: Timestamp::ZERO,
    };
    for (index, request) in requests.iter().enumerate() {
        sim.queue.push(request.arrival, Event::Arrival(index));
    }
    while let Some((at, event)) = sim.queue.pop() {
        sim.now = at;
        sim.manager.hardware().clock().set(at);
        match event {
            Event::Arrival(i) => sim.arrive(i),
            Event::Poll => {
                sim.poll_at.remove(&at);
            }
            Event::PrefillDone(i) => sim.prefill_done(i),
            Event::DecodeDone(i) => sim.decode_done(i),
        }
        sim.settle();
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
        if request.blocks.len() > self.manager.device().capacity() {
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
                let sources = &mut self.sources;
                sources.total += request.blocks.len() as u64;
                sources.device += device_hits as u64;
                sources.host += onboarded[Tier::Host.index()] as u64;
                sources.disk += onboarded[Tier::Disk.index()] as u64;
                sources.remote += onboarded[Tier::Remote.index()] as u64;
                sources.computed += need as u64;
                let cached_tokens = held.len() as u64 * self.block_size;
                let prefill_tokens = request.input_tokens.saturating_sub(cached_tokens).max(1);
                // One request per pass until the worker batches (the scheduler is next).
                let span = self.compute.prefill(prefill_tokens, cached_tokens);
                self.queue
                    .push(self.now.saturating_add(span), Event::PrefillDone(i));
                self.states.insert(i, State::Prefilling { held, computing });
            }
            Err(_) => {
                self.manager.device().release(held);
                self.waits += 1;
                self.waiting.push_back(i);
            }
        }
    }

    fn prefill_done(&mut self, i: usize) {
        let Some(State::Prefilling {
            mut held,
            computing,
        }) = self.states.remove(&i)
        else {
            return;
        };
        let request = &self.requests[i];
        let complete = computing
            .into_iter()
            .zip(&request.blocks[held.len()..])
            .map(|(block, identity)| block.apply_identity(*identity))
            .collect();
        held.extend(self.manager.register(complete, self.now));
        self.ttft_ns.push(
            self.now
                .saturating_duration_since(request.arrival)
                .as_nanos() as u64,
        );
        // Each output token is one decode step of this sequence alone, over its context.
        let capacity_tokens = self.device_capacity_tokens;
        let span: Duration = (0..request.output_tokens)
            .map(|step| {
                self.compute
                    .decode_step(1, request.input_tokens + step, capacity_tokens)
            })
            .sum();
        self.queue
            .push(self.now.saturating_add(span), Event::DecodeDone(i));
        self.states.insert(i, State::Decoding { held });
    }

    fn decode_done(&mut self, i: usize) {
        let Some(State::Decoding { held }) = self.states.remove(&i) else {
            return;
        };
        self.manager.device().release(held);
        self.e2e_ns.push(
            self.now
                .saturating_duration_since(self.requests[i].arrival)
                .as_nanos() as u64,
        );
        self.completed += 1;
        // First come, first served: stop at the first request that still does not fit.
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
        Report {
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
        }
    }
}
