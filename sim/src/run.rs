//! A simulated cluster serving a workload, and the report of the run.
//!
//! Owns: the run loop ([`simulate`]) and [`Report`]. Requests arrive at their times and
//! the router in the loop picks each one's worker ([`crate::scenario::Routing`]): the KV
//! router scores the workers from the events they published, or round-robin ignores
//! them. On its worker a request is looked up (device hits, lower-tier hits onboarded
//! over the modelled links), its remaining blocks are allocated and prefilled,
//! registered (and offloaded per the tier policies), decoded, and released. A request
//! that finds no free device blocks waits on its worker and is retried, first come first
//! served, when another finishes there.
//!
//! Events: every worker's manager publishes into the simulated event plane, which
//! delivers to the router after a delay and may lose events (seeded). Each worker's
//! events are also replayed into a registry replica of its own. At the end the run
//! checks that the replicas match the pools, and that the router's view of every worker
//! matches that worker's pools (it cannot once events were lost: the report says so).
//! Both allow one difference: blocks no prefix lookup can reach (a block of their prefix
//! is in no tier, as after a failed SSD took it) may be missing once a snapshot left
//! them out.
//!
//! Faults come on a timeline ([`crate::scenario::FaultKind`]): a worker crashes (its
//! incarnation, the epoch, changes, so what its former self scheduled is dropped), a
//! link slows down, the event plane loses or delays events, the router restarts, or a
//! worker's SSD fails (its `SimHardware` fails the disk's transfers in flight and its
//! `Manager` forgets the disk tier until it comes back empty). Heartbeats and snapshots
//! bring the router back in line, and the report counts what recovery cost.
//!
//! Compute is continuously batched per worker: one forward pass at a time holds every
//! decoding sequence (one token each) and prefill chunks of the oldest prompts up to the
//! token budget ([`crate::scenario::Batching`]); the compute model times the pass, and
//! first tokens land when its prefill part ends. Generated tokens take device blocks as
//! they go; when none is free, the worker's newest running request is preempted
//! (recompute: its blocks go back, and it prefills its prompt and the tokens generated so
//! far again when a request finishes). At one instant, work in the workers finishes
//! before new requests arrive. Latencies are predictions of the model.
//!
//! Disaggregated ([`crate::scenario::Disaggregation`]): the first workers form the
//! prefill pool, the only one the router routes to, and the rest the decode pool. A
//! prefill worker prefills as above and the first token lands at the end of the pass's
//! prefill part (TTFT is measured there); then the KV handoff: the decode worker with
//! the fewest requests (the lowest index on a tie) takes device blocks for the prompt
//! (without free ones the handoff waits in its queue, first come first served), and the
//! prompt blocks cross the cluster's fabric ([`crate::fabric::ClusterFabric`]) as MRDN
//! frames, all sent at once, sharing the NICs and the switch with every other handoff.
//! When the last frame lands the prefill worker lets its blocks go (they stay cached
//! there) and the decode worker registers them (its prefix cache, its events) and
//! decodes; TPOT and end-to-end are measured there. A decode worker that preempts a
//! request recomputes it locally, as an aggregated worker does (its prompt blocks are
//! usually still cached there). A request of one output token is done on its prefill
//! worker.
//!
//! Crashes, disaggregated: a handoff is bound to the incarnations (epochs) of both its
//! ends, so a crash of either aborts it. Its frames in flight are aborted on the fabric
//! (they never land, and their share of the links goes back to the other transfers), the
//! end still up lets go of what it held for it (the prefill worker's blocks stay cached
//! there; the decode worker's reserved blocks go back to its pool), and the request goes
//! back to the router and is prefilled again, keeping the tokens it had generated (they
//! are recomputed with the prompt, and their KV travels with it in the next handoff). So
//! does every request the crashed worker was prefilling, decoding or holding in its
//! queue: a decode worker's KV is gone with it. Handoffs go only to decode workers that
//! are up; with none up they wait, their blocks held on the prefill worker, and go out
//! first come first served when one comes back (empty, under a new epoch). With no
//! prefill worker up, requests wait for one as they do aggregated.
//! Never: read a clock or iterate an unordered map.

use crate::compute::{ComputeModel, Pass, UnknownProfile};
use crate::engine::EventQueue;
use crate::fabric::{frame_bytes, frame_sizes, ClusterFabric, FabricLink};
use crate::hardware::{HardwareProfile, Link};
use crate::hardware::{LinkUsage, SimHardware};
use crate::scenario::{
    Batching, Disaggregation, EventPlaneSpec, Fault, FaultKind, Routing, Scenario,
};
use crate::workload::Request;
use kvtwin::block::{BlockIdentity, Reset};
use kvtwin::events::{KvCacheEvent, KvCacheEventData, RegistryReplica};
use kvtwin::hardware::Hardware;
use kvtwin::ids::{LocalBlockHash, RequestId, SequenceHash, Timestamp, WorkerId};
use kvtwin::manager::ManagerConfig;
use kvtwin::manager::{Manager, ManagerConfigError, ManagerOutput};
use kvtwin::phase::Phase;
use kvtwin::pool::{BlockChain, ImmutableBlock, MutableBlock};
use kvtwin::router::indexer::WorkerKey;
use kvtwin::router::scheduler::SchedulerConfig;
use kvtwin::router::{Router, WorkerMode};
use kvtwin::stats::Latencies;
use kvtwin::tier::Tier;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use rustc_hash::FxHashMap;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::time::Duration;

/// Index of a worker in the cluster (also its `WorkerId`).
type WorkerIndex = usize;

/// A worker's incarnation: it changes when the worker crashes, so that what its former
/// self scheduled (passes, transfer deadlines, events in the plane) is recognised and
/// dropped.
type Epoch = u32;

#[derive(Debug)]
enum Event {
    Arrival(usize),
    /// A worker's transfer deadline.
    Poll(WorkerIndex, Epoch),
    /// The worker's forward pass in flight is done.
    PassDone(WorkerIndex, Epoch),
    /// An event of the worker reaches the router.
    /// Boxed: the queue moves its entries as it sifts, and most are small.
    Deliver(WorkerIndex, Epoch, Box<KvCacheEvent>),
    /// Every worker tells the router its latest event id.
    Heartbeat,
    /// A worker's heartbeat reaches the router: the id of its latest event then.
    HeartbeatArrives(WorkerIndex, Epoch, Option<u64>),
    /// Fault `i` of the timeline begins.
    FaultStarts(usize),
    /// Fault `i` of the timeline ends.
    FaultEnds(usize),
    /// A crashed worker is back, empty.
    Restart(WorkerIndex),
    /// The router looks at whether it should ask worker `w` for a snapshot (after
    /// delivering an event, which may happen while the worker is publishing).
    ResyncCheck(WorkerIndex, Epoch),
    /// A deadline of the cluster's fabric (disaggregation): a handoff frame lands, or
    /// the rates change.
    Fabric,
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

/// Latency statistics in milliseconds (predictions of the model).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
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
    fn of(mut samples: Latencies) -> Self {
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
    /// Workers in the prefill pool (the first ones).
    pub prefill_workers: usize,
    /// Workers in the decode pool (the rest).
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
    /// worker).
    pub handed_off_per_prefill_worker: Vec<u64>,
    /// Handoffs each decode worker received (index: worker less `prefill_workers`).
    pub received_per_decode_worker: Vec<u64>,
    /// Requests done on their prefill worker (nothing left to hand off: one output
    /// token, or a retried request whose new prefill produced its last).
    pub finished_at_prefill: u64,
    /// Handoffs aborted because their prefill or decode worker crashed (their requests
    /// are prefilled again).
    pub handoffs_aborted: u64,
    /// Of their frames, those in flight on the fabric when aborted (they never land).
    pub frames_aborted: u64,
    /// The fabric's links: the prefill nodes' NICs out, the decode nodes' NICs in (each
    /// summed over its pool, utilisation averaged over it), and the switch if modelled.
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
    /// Simulated time at the end.
    pub simulated_s: f64,
    /// Forward passes run.
    pub passes: u64,
    /// Requests taken off the device to make room (recompute preemption).
    pub preemptions: u64,
    /// Events the engine processed (arrivals, passes, transfer deadlines, deliveries):
    /// the simulator's own work, for `kvtwin bench sim`.
    pub engine_events: u64,
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
        let pool = self
            .disaggregation
            .as_ref()
            .map_or(usize::MAX, |d| d.prefill_workers);
        let routable = &r.requests_per_worker[..pool.min(r.requests_per_worker.len())];
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
        )
    }
}

/// One worker: its manager on its own node, and the requests it runs.
struct Worker {
    key: WorkerKey,
    manager: Manager<SimHardware>,
    states: BTreeMap<usize, State>,
    /// Requests waiting for device blocks, first come first served.
    waiting: VecDeque<usize>,
    poll_at: BTreeSet<Timestamp>,
    replica: RegistryReplica,
    /// Requests whose prefill is not done, oldest first.
    prefill_queue: VecDeque<usize>,
    pass: Option<PassInFlight>,
    /// The members buffer of the last pass, kept for the next.
    spare_members: Vec<(usize, u64)>,
    routed: u64,
    /// Whether it is serving (not crashed).
    up: bool,
    epoch: Epoch,
    /// Each link's speed factor from the faults under way (index: `Link::ALL`).
    link_speed: [f64; 6],
    /// The router's side of this worker's event stream: the last id it applied,
    /// whether it saw ids go missing since its last snapshot request, and until when
    /// it waits for a snapshot it asked for.
    last_applied: Option<u64>,
    gap_seen: bool,
    quiet_until: Timestamp,
    /// Snapshots asked for since the router was last in line with this worker.
    failed_snapshots: u32,
    /// SSD failures of this worker under way (its disk is down while any is).
    disk_failures: u32,
}

/// A request between its arrival and its end, and what the run keeps about it. Only
/// these are held: memory follows the requests in flight, not the length of the trace.
struct Live {
    request: Request,
    /// Output tokens generated so far (kept across preemptions).
    generated: u64,
    /// When its first token landed.
    first_token_at: Option<Timestamp>,
    /// Whether its prompt blocks have been counted in the sources.
    counted: bool,
    /// Whether a pass has taken it yet (its queueing time is counted then).
    scheduled: bool,
    /// Identities of the blocks its generated tokens fill, as far as computed (kept
    /// across preemptions, so a recomputed block is registered under the same hash).
    output_identities: Vec<BlockIdentity>,
    /// Its registered reasoning blocks, in order (see `Request::think_tokens`).
    think_blocks: Vec<SequenceHash>,
    /// Whether it has passed its ExitThink point (its reasoning blocks are cold).
    thinking_done: bool,
}

struct Sim {
    /// Requests in flight by arrival number (looked up, never iterated).
    live: FxHashMap<usize, Live>,
    arrived: u64,
    workers: Vec<Worker>,
    queue: EventQueue<Event>,
    routing: Routing,
    router: Router,
    event_plane: EventPlaneSpec,
    /// The event plane's losses (its own stream of the run's seed).
    event_rng: ChaCha8Rng,
    events_delivered: u64,
    events_rejected: u64,
    events_dropped: u64,
    overlap_blocks: u64,
    events: EventCounts,
    sources: BlockSources,
    ttft: Latencies,
    e2e: Latencies,
    tpot: Latencies,
    queueing: Latencies,
    preemptions: u64,
    output_tokens: u64,
    completed: u64,
    too_large: u64,
    /// Whether full blocks of generated tokens are registered ([`crate::scenario::WorkerSpec`]).
    cache_output_blocks: bool,
    output_blocks_cached: u64,
    think_blocks_cooled: u64,
    waits: u64,
    block_size: u64,
    cache_partial_blocks: bool,
    device_capacity_blocks: u64,
    compute: ComputeModel,
    device_capacity_tokens: u64,
    batching: Batching,
    passes: u64,
    engine_events: u64,
    /// When the next request arrives, if one does: decode plans stop there (see
    /// `PassInFlight`).
    next_arrival: Option<Timestamp>,
    /// Times at which a fault begins, ends or a worker comes back: decode plans stop
    /// there too.
    disruptions: BTreeSet<Timestamp>,
    faults: Vec<Fault>,
    /// Loss probabilities of the `EventLoss` faults under way, by fault.
    extra_loss: BTreeMap<usize, f64>,
    /// Delay added by the `EventLag` faults under way.
    extra_delay: Duration,
    heartbeat: Duration,
    /// Whether a round of heartbeats is scheduled, and how many heartbeats are on their
    /// way (they do not count as work that keeps heartbeats going).
    heartbeat_due: bool,
    heartbeats_in_flight: usize,
    /// Requests that found no worker up, first come first served.
    parked: VecDeque<usize>,
    /// To rebuild a worker after a crash.
    worker_config: ManagerConfig,
    hardware_profile: HardwareProfile,
    scheduler: SchedulerConfig,
    faults_applied: u64,
    requests_retried: u64,
    snapshots: u64,
    disk_blocks_lost: u64,
    disk_transfers_failed: u64,
    /// The prefill and decode pools and the handoffs between them; `None` when every
    /// worker is aggregated.
    disagg: Option<Disagg>,
    /// Workers an event touched besides the one it returns (a handoff reaches a decode
    /// worker, or lets a prefill worker's blocks go): settled and given a pass after it.
    also_touched: BTreeSet<WorkerIndex>,
    now: Timestamp,
}

/// Disaggregated serving: the pools, the fabric and the handoffs in flight.
struct Disagg {
    /// Workers `0..prefill_workers` prefill; the rest decode.
    prefill_workers: usize,
    frame_blocks: usize,
    bytes_per_block: u64,
    fabric: ClusterFabric,
    /// Fabric deadlines in the event queue.
    poll_at: BTreeSet<Timestamp>,
    /// Handoffs whose last frame has not landed, by request.
    handoffs: BTreeMap<usize, Handoff>,
    /// Handoffs waiting for a decode worker to be up, first come first served.
    unassigned: VecDeque<usize>,
    /// Every frame in flight, by fabric transfer id.
    frames_in_flight: BTreeMap<u64, FrameInFlight>,
    handoffs_done: u64,
    handoffs_aborted: u64,
    frames_aborted: u64,
    frames: u64,
    bytes: u64,
    header_bytes: u64,
    waits: u64,
    finished_at_prefill: u64,
    latency: Latencies,
    wait: Latencies,
    /// Per worker: requests handed off (prefill pool), handoffs received (decode pool).
    handed_off: Vec<u64>,
    received: Vec<u64>,
}

/// One request's KV handoff from a prefill worker to a decode worker.
struct Handoff {
    from: WorkerIndex,
    /// The decode worker; `None` while none is up (the handoff waits in
    /// `Disagg::unassigned`).
    to: Option<WorkerIndex>,
    /// Its frames' fabric ids, to abort those still in flight if an end crashes.
    frames: Vec<u64>,
    /// When the prefill ended.
    ready_at: Timestamp,
    /// When the frames were sent (the decode worker had blocks for them).
    sent_at: Option<Timestamp>,
    frames_left: usize,
    /// Whether it has waited for decode blocks (counted once).
    waited: bool,
}

/// A handoff frame on the fabric: its request, and the incarnations of the workers at
/// both ends when it was sent (a frame of a crashed worker's former self never counts).
struct FrameInFlight {
    request: usize,
    from: (WorkerIndex, Epoch),
    to: (WorkerIndex, Epoch),
}

impl Disagg {
    fn report(&self, simulated_ns: u64) -> DisaggregationReport {
        let workers = self.handed_off.len();
        let decode_workers = workers - self.prefill_workers;
        // The fabric links that carry handoffs, each summed over the pool that uses it.
        let mut links: Vec<(&'static str, LinkUsage, usize)> = vec![
            ("nic_out", LinkUsage::default(), self.prefill_workers),
            ("nic_in", LinkUsage::default(), decode_workers),
        ];
        for (link, usage) in self.fabric.usage() {
            let index = match link {
                FabricLink::NicOut(node) if node < self.prefill_workers => 0,
                FabricLink::NicIn(node) if node >= self.prefill_workers => 1,
                FabricLink::Switch => {
                    links.push(("switch", LinkUsage::default(), 1));
                    links.len() - 1
                }
                _ => continue,
            };
            let sum = &mut links[index].1;
            sum.bytes += usage.bytes;
            sum.busy_ns += usage.busy_ns;
            sum.transfers += usage.transfers;
        }
        DisaggregationReport {
            prefill_workers: self.prefill_workers,
            decode_workers,
            frame_blocks: self.frame_blocks,
            handoffs: self.handoffs_done,
            frames: self.frames,
            bytes: self.bytes,
            header_bytes: self.header_bytes,
            handoff_latency: Percentiles::of(self.latency.clone()),
            handoff_wait: Percentiles::of(self.wait.clone()),
            waits_for_decode_blocks: self.waits,
            handed_off_per_prefill_worker: self.handed_off[..self.prefill_workers].to_vec(),
            received_per_decode_worker: self.received[self.prefill_workers..].to_vec(),
            finished_at_prefill: self.finished_at_prefill,
            handoffs_aborted: self.handoffs_aborted,
            frames_aborted: self.frames_aborted,
            links: links
                .into_iter()
                .map(|(link, usage, nodes)| LinkReport {
                    link,
                    bytes: usage.bytes,
                    transfers: usage.transfers,
                    utilisation: usage.busy_ns as f64
                        / simulated_ns.max(1) as f64
                        / nodes.max(1) as f64,
                })
                .collect(),
        }
    }

    fn new(
        spec: Disaggregation,
        workers: usize,
        hardware: &HardwareProfile,
        bytes_per_block: u64,
    ) -> Self {
        Self {
            prefill_workers: spec.prefill_workers,
            frame_blocks: spec.frame_blocks.max(1),
            bytes_per_block,
            fabric: ClusterFabric::new(
                workers,
                hardware.nic_bytes_per_s,
                hardware.nic_latency_ns,
                spec.switch_bytes_per_s,
                spec.switch_latency_ns,
            ),
            poll_at: BTreeSet::new(),
            handoffs: BTreeMap::new(),
            unassigned: VecDeque::new(),
            frames_in_flight: BTreeMap::new(),
            handoffs_done: 0,
            handoffs_aborted: 0,
            frames_aborted: 0,
            frames: 0,
            bytes: 0,
            header_bytes: 0,
            waits: 0,
            finished_at_prefill: 0,
            latency: Latencies::new(),
            wait: Latencies::new(),
            handed_off: vec![0; workers],
            received: vec![0; workers],
        }
    }
}

/// The forward pass running now on a worker.
///
/// A pass of decodes only may stand for several consecutive passes (steps) with the same
/// members when every step but the last is *silent*: each member gains a token without
/// finishing, without needing a block, and without any other change a scheduler could
/// see. Such steps are applied together when the pass ends, which is what makes long
/// decode phases cheap to simulate. The plan stops at the first step that ends at or
/// after the next arrival, and before the worker's next transfer deadline: nothing can
/// touch the worker before its last step, so the run is step for step the one an
/// engine doing one pass at a time produces (a test compares both).
///
/// Disaggregated, a handoff landing on a decode worker touches it too, and one not yet
/// sent may be sent and land within a plan. So a decode worker's plan also stops at the
/// first step that ends at or after the next event that could send a handoff or land
/// one: the fabric's next deadline, and the end of any prefill worker's pass or its next
/// transfer deadline (which may start a pass). Stopping early only splits the steps into
/// more events.
#[derive(Debug)]
struct PassInFlight {
    /// Requests in it, with the tokens each processes.
    members: Vec<(usize, u64)>,
    /// When its prefill part ends.
    first_token_at: Timestamp,
    /// When its last step ends.
    ends_at: Timestamp,
    /// Steps it stands for (1 for an ordinary pass).
    steps: usize,
}

/// Steps one decode pass may stand for at most.
const MAX_PLANNED_STEPS: usize = 512;

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
}

/// The prompt blocks of `request` that can be cached: all of them, or only the full ones
/// when partial blocks are not cached ([`crate::scenario::WorkerSpec`]).
fn cacheable_blocks(request: &Request, block_size: u64, cache_partial_blocks: bool) -> usize {
    if cache_partial_blocks {
        request.blocks.len()
    } else {
        request
            .blocks
            .len()
            .min((request.input_tokens / block_size) as usize)
    }
}

/// Steps a decoding request can take after the current one that are silent: it neither
/// finishes nor needs another block for the token after (see `PassInFlight`).
fn silent_steps(
    live: &Live,
    state: Option<&State>,
    block_size: u64,
    batching: Batching,
    cache_output_blocks: bool,
) -> u64 {
    let Some(State::Decoding { held, extra, .. }) = state else {
        return 0;
    };
    let (input, output, generated) = (
        live.request.input_tokens,
        live.request.output_tokens,
        live.generated,
    );
    // Step j leaves `generated + j` tokens: silent while that is under `output` and the
    // token after still fits the blocks held.
    let by_output = output.saturating_sub(generated + 1);
    let by_blocks = if batching.decode_blocks {
        ((held.len() + extra.len()) as u64 * block_size).saturating_sub(input + generated + 1)
    } else {
        u64::MAX
    };
    // A step that fills a block registers it when generated blocks are cached, and the
    // step that ends the reasoning cools its blocks: both are seen by the pool.
    let by_fill = if cache_output_blocks {
        block_size - 1 - (input + generated - 1) % block_size
    } else {
        u64::MAX
    };
    let think = live.request.think_tokens;
    let by_think = if think > generated {
        think - generated - 1
    } else {
        u64::MAX
    };
    by_output.min(by_blocks).min(by_fill).min(by_think)
}

/// Whether the decode step that brings request `live` to `generated` tokens changes more
/// than token counts: it fills a block that is then cached, or it ends the reasoning.
fn step_is_visible(
    live: &Live,
    generated: u64,
    block_size: u64,
    cache_output_blocks: bool,
) -> bool {
    let computed = live.request.input_tokens + generated - 1;
    (cache_output_blocks && computed.is_multiple_of(block_size))
        || (live.request.think_tokens > 0 && generated == live.request.think_tokens)
}

/// The token hash of the `index`-th block filled by request `id`'s generated tokens:
/// unique in the run (the top bit keeps it apart from prompt hashes, which are trace ids
/// or generator counters well below it), so such blocks are shared by no other request.
fn output_local_hash(id: RequestId, index: usize) -> LocalBlockHash {
    LocalBlockHash::new(1 << 63 | (id.get() & ((1 << 43) - 1)) << 20 | (index as u64 & 0xf_ffff))
}

/// A router that routes to workers `0..workers` (at dp rank 0), all learnt from their
/// events. (Disaggregated, only the prefill pool is routable; the decode workers' events
/// still reach its index.)
fn router_of(scheduler: SchedulerConfig, workers: usize) -> Router {
    let mut router = Router::new(scheduler);
    for w in 0..workers {
        router.add_worker(
            WorkerKey {
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
pub fn simulate_stream(
    scenario: &Scenario,
    requests: impl IntoIterator<Item = Request>,
) -> Result<Report, SimError> {
    simulate_observed(scenario, requests, |_| {})
}

/// [`simulate_stream`], showing `observe` the cluster after every event (tests check
/// what must hold at every instant, not only at the end).
fn simulate_observed(
    scenario: &Scenario,
    requests: impl IntoIterator<Item = Request>,
    mut observe: impl FnMut(&Sim),
) -> Result<Report, SimError> {
    let base = scenario.worker.manager_config();
    let compute = scenario.hardware.compute_model()?;
    let device_capacity_blocks: u64 = base
        .tiers
        .iter()
        .filter(|t| t.tier == Tier::Device)
        .map(|t| t.capacity_blocks as u64)
        .sum();
    let block_size = base.block_size_tokens as u64;
    let cluster = &scenario.cluster;
    let mut scheduler = cluster.scheduler;
    scheduler.seed = stream_seed(scenario.seed ^ scheduler.seed, STREAM_SCHEDULER);
    let disagg = match cluster.disaggregation {
        Some(spec) if spec.prefill_workers == 0 || spec.prefill_workers >= cluster.workers => {
            return Err(SimError::EmptyPool {
                prefill_workers: spec.prefill_workers,
                workers: cluster.workers,
            });
        }
        Some(spec) => Some(Disagg::new(
            spec,
            cluster.workers,
            &scenario.hardware,
            base.bytes_per_block,
        )),
        None => None,
    };
    let routable = disagg
        .as_ref()
        .map_or(cluster.workers.max(1), |d| d.prefill_workers);
    let router = router_of(scheduler, routable);
    let mut workers = Vec::with_capacity(cluster.workers);
    for index in 0..cluster.workers.max(1) {
        let mut config = base.clone();
        config.worker_id = WorkerId::new(index as u64);
        let key = WorkerKey {
            worker: config.worker_id,
            dp_rank: config.dp_rank,
        };
        let hardware = SimHardware::new(scenario.hardware.clone(), config.block_size_tokens);
        workers.push(Worker {
            key,
            manager: Manager::new(hardware, config)?,
            states: BTreeMap::new(),
            waiting: VecDeque::new(),
            poll_at: BTreeSet::new(),
            replica: RegistryReplica::new(),
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
        });
    }
    let mut sim = Sim {
        live: FxHashMap::default(),
        arrived: 0,
        workers,
        queue: EventQueue::new(),
        routing: cluster.routing,
        router,
        event_plane: cluster.event_plane,
        event_rng: ChaCha8Rng::seed_from_u64(stream_seed(scenario.seed, STREAM_EVENT_PLANE)),
        events_delivered: 0,
        events_rejected: 0,
        events_dropped: 0,
        overlap_blocks: 0,
        events: EventCounts::default(),
        sources: BlockSources::default(),
        ttft: Latencies::new(),
        e2e: Latencies::new(),
        tpot: Latencies::new(),
        queueing: Latencies::new(),
        preemptions: 0,
        output_tokens: 0,
        completed: 0,
        too_large: 0,
        cache_output_blocks: scenario.worker.cache_output_blocks,
        output_blocks_cached: 0,
        think_blocks_cooled: 0,
        waits: 0,
        block_size,
        cache_partial_blocks: scenario.worker.cache_partial_blocks,
        device_capacity_blocks,
        compute,
        device_capacity_tokens: device_capacity_blocks * block_size,
        batching: scenario.worker.batching,
        passes: 0,
        engine_events: 0,
        next_arrival: None,
        disruptions: BTreeSet::new(),
        faults: scenario.faults.clone(),
        extra_loss: BTreeMap::new(),
        extra_delay: Duration::ZERO,
        heartbeat: Duration::from_millis(cluster.event_plane.heartbeat_ms),
        heartbeat_due: false,
        heartbeats_in_flight: 0,
        parked: VecDeque::new(),
        worker_config: base.clone(),
        hardware_profile: scenario.hardware.clone(),
        scheduler,
        faults_applied: 0,
        requests_retried: 0,
        snapshots: 0,
        disk_blocks_lost: 0,
        disk_transfers_failed: 0,
        disagg,
        also_touched: BTreeSet::new(),
        now: Timestamp::ZERO,
    };
    for (index, fault) in scenario.faults.iter().enumerate() {
        let at = Timestamp::ZERO.saturating_add(Duration::from_millis(fault.at_ms));
        sim.disruptions.insert(at);
        sim.queue.push(at, Event::FaultStarts(index));
    }
    sim.schedule_heartbeat();
    // At one instant, work already in the workers (passes, transfers, event deliveries)
    // finishes before new requests arrive, so a worker infinitely fast serves requests
    // one at a time, as a cache replay does.
    let mut arrivals = requests.into_iter().peekable();
    loop {
        let internal = sim.queue.peek_time();
        let arrival = arrivals.peek().map(|r| r.arrival.max(sim.now));
        sim.next_arrival = arrival;
        let (at, event) = match (internal, arrival) {
            (Some(t), Some(a)) if a < t => (a, None),
            (None, Some(a)) => (a, None),
            _ => match sim.queue.pop() {
                Some((at, event)) => (at, Some(event)),
                None => {
                    // Nothing is scheduled: only requests waiting on idle workers are
                    // left (after a preemption). Retry them once; if nothing starts,
                    // the rest cannot be served.
                    if sim.retry_idle_workers() {
                        sim.settle_also_touched();
                        continue;
                    }
                    break;
                }
            },
        };
        let event = match event {
            Some(event) => event,
            None => match arrivals.next() {
                Some(request) => Event::Arrival(sim.admit_new(request)),
                None => break,
            },
        };
        sim.now = at;
        sim.engine_events += 1;
        let touched = match event {
            Event::Arrival(i) => sim.arrive(i),
            Event::Poll(w, epoch) if sim.current(w, epoch) => {
                sim.set_clock(w);
                sim.workers[w].poll_at.remove(&at);
                Some(w)
            }
            Event::PassDone(w, epoch) if sim.current(w, epoch) => {
                sim.set_clock(w);
                sim.pass_done(w);
                Some(w)
            }
            Event::Deliver(w, epoch, event) => {
                if sim.current(w, epoch) {
                    sim.deliver(w, &event);
                }
                None
            }
            Event::Heartbeat => {
                sim.heartbeat();
                None
            }
            Event::HeartbeatArrives(w, epoch, latest) => {
                sim.heartbeats_in_flight -= 1;
                if sim.current(w, epoch) {
                    sim.heartbeat_arrives(w, latest);
                }
                None
            }
            Event::FaultStarts(index) => {
                sim.fault_starts(index);
                None
            }
            Event::FaultEnds(index) => {
                sim.fault_ends(index);
                None
            }
            Event::Restart(w) => {
                sim.restart(w);
                None
            }
            Event::ResyncCheck(w, epoch) => {
                if sim.current(w, epoch) {
                    sim.resync_if_behind(w);
                }
                None
            }
            Event::Fabric => {
                sim.fabric_due();
                None
            }
            // Scheduled by a worker's former incarnation.
            Event::Poll(..) | Event::PassDone(..) => None,
        };
        if let Some(w) = touched {
            sim.settle(w);
            sim.start_pass(w);
        }
        sim.settle_also_touched();
        observe(&sim);
    }
    Ok(sim.report(scenario))
}

impl Sim {
    /// Numbers a new request and holds it while it is in flight.
    fn admit_new(&mut self, request: Request) -> usize {
        let i = self.arrived as usize;
        self.arrived += 1;
        self.live.insert(
            i,
            Live {
                request,
                generated: 0,
                first_token_at: None,
                counted: false,
                scheduled: false,
                output_identities: Vec::new(),
                think_blocks: Vec::new(),
                thinking_done: false,
            },
        );
        i
    }

    fn request(&self, i: usize) -> &Request {
        &self.live[&i].request
    }

    fn set_clock(&self, w: WorkerIndex) {
        self.workers[w].manager.hardware().clock().set(self.now);
    }

    fn cacheable(&self, i: usize) -> usize {
        cacheable_blocks(self.request(i), self.block_size, self.cache_partial_blocks)
    }

    /// The prompt blocks of request `i` a lookup may hit: the cacheable ones, less the
    /// last when that would leave no prompt token to compute (engines compute at least
    /// one token to produce the first output, as vLLM caps its hits).
    fn hittable(&self, i: usize) -> usize {
        let request = self.request(i);
        if self.cache_partial_blocks {
            return request.blocks.len();
        }
        self.cacheable(i)
            .min((request.input_tokens.saturating_sub(1) / self.block_size) as usize)
    }

    fn hashes(&self, i: usize) -> Vec<SequenceHash> {
        self.request(i).blocks[..self.hittable(i)]
            .iter()
            .map(|b| b.sequence_hash)
            .collect()
    }

    /// Routes request `i` and admits it on its worker; returns the worker, or `None` for
    /// a request no worker could ever serve.
    fn arrive(&mut self, i: usize) -> Option<WorkerIndex> {
        let request = self.request(i);
        // Prompt and output together must fit the device, or no preemption can help.
        let blocks_needed =
            (request.input_tokens + request.output_tokens).div_ceil(self.block_size);
        if blocks_needed > self.device_capacity_blocks {
            self.too_large += 1;
            self.live.remove(&i);
            return None;
        }
        let w = match self.routing {
            Routing::RoundRobin => {
                let n = self.routable();
                match (0..n).map(|k| (i + k) % n).find(|w| self.workers[*w].up) {
                    Some(w) => w,
                    None => {
                        self.parked.push_back(i);
                        return None;
                    }
                }
            }
            Routing::Kv => {
                let query: Vec<LocalBlockHash> = request.blocks[..self.hittable(i)]
                    .iter()
                    .map(|b| b.local_hash)
                    .collect();
                let Some(decision) = self.router.route(&query, self.now) else {
                    // No worker is up: the request waits for one.
                    self.parked.push_back(i);
                    return None;
                };
                self.overlap_blocks += u64::from(decision.overlap_blocks);
                decision.worker.worker.get() as usize
            }
        };
        self.workers[w].routed += 1;
        self.set_clock(w);
        self.admit(w, i);
        Some(w)
    }

    /// Looks request `i` up on worker `w` and starts onboarding or prefilling it; or, for
    /// a handoff waiting on decode worker `w`, tries again to take blocks for it.
    fn admit(&mut self, w: WorkerIndex, i: usize) {
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

    fn start_prefill(
        &mut self,
        w: WorkerIndex,
        i: usize,
        held: BlockChain,
        device_hits: usize,
        onboarded: [usize; 4],
    ) {
        let live = self
            .live
            .get_mut(&i)
            .expect("an admitted request is in flight");
        let request = &live.request;
        let need = request.blocks.len() - held.len();
        let worker = &mut self.workers[w];
        match worker.manager.allocate(need, self.now) {
            Ok(computing) => {
                // A preempted request starting again is not a new request to count.
                if !live.counted {
                    live.counted = true;
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
                let remaining = (request.input_tokens + live.generated)
                    .saturating_sub(cached)
                    .max(1);
                worker.states.insert(
                    i,
                    State::Prefilling {
                        held,
                        computing,
                        remaining,
                        cached,
                    },
                );
                worker.prefill_queue.push_back(i);
            }
            Err(_) => {
                worker.manager.device().release(held);
                self.waits += 1;
                worker.waiting.push_back(i);
            }
        }
    }

    /// Starts worker `w`'s next forward pass if none is running and there is work: every
    /// decoding sequence generates one token, and prefill chunks fill the rest of the
    /// token budget, oldest request first (chunked prefill), up to `max_seqs` sequences.
    fn start_pass(&mut self, w: WorkerIndex) {
        if self.workers[w].pass.is_some() {
            return;
        }
        let handoff_horizon = self.handoff_horizon(w);
        let worker = &mut self.workers[w];
        let batching = self.batching;
        let mut pass = Pass::default();
        // The buffer of the last pass, emptied (no allocation per pass).
        let mut members = std::mem::take(&mut worker.spare_members);
        // Every decoding sequence is counted, so that a pass that could not take them all
        // is known not to be decodes-only (see the plan below).
        let mut decoding = 0;
        for (i, state) in &worker.states {
            if let State::Decoding { context, .. } = state {
                decoding += 1;
                if members.len() < batching.max_seqs {
                    pass.decodes += 1;
                    pass.decode_context += context;
                    members.push((*i, 1));
                }
            }
        }
        let mut budget = (batching.max_batch_tokens as u64).saturating_sub(pass.decodes);
        for i in &worker.prefill_queue {
            if budget == 0 || members.len() >= batching.max_seqs {
                break;
            }
            let Some(State::Prefilling {
                remaining, cached, ..
            }) = worker.states.get(i)
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
            // Its first pass: how long it queued (for blocks, a transfer, or the pass).
            if let Some(live) = self.live.get_mut(i) {
                if !live.scheduled {
                    live.scheduled = true;
                    self.queueing.push(
                        self.now
                            .saturating_duration_since(live.request.arrival)
                            .as_nanos() as u64,
                    );
                }
            }
        }
        if members.is_empty() {
            worker.spare_members = members;
            return;
        }
        let time = self.compute.pass(&pass, self.device_capacity_tokens);
        let (mut end, mut steps) = (self.now.saturating_add(time.total), 1);
        if batching.plan_decode_steps
            && pass.prefills.is_empty()
            && worker.prefill_queue.is_empty()
            && decoding == members.len()
        {
            // Decodes only, all of them: plan the silent steps that follow (see
            // `PassInFlight`): none starts at or after the next arrival (or, on a decode
            // worker, the next event that could hand it a request), and each ends before
            // the worker's next transfer deadline.
            let silent = members
                .iter()
                .map(|(i, _)| {
                    silent_steps(
                        &self.live[i],
                        worker.states.get(i),
                        self.block_size,
                        batching,
                        self.cache_output_blocks,
                    )
                })
                .min()
                .unwrap_or(0)
                .min((MAX_PLANNED_STEPS - 1) as u64);
            let deadline = worker.poll_at.first().copied();
            let mut step = Pass {
                prefills: Vec::new(),
                decodes: pass.decodes,
                decode_context: pass.decode_context,
            };
            for _ in 0..silent {
                if self.next_arrival.is_some_and(|arrival| end >= arrival)
                    || handoff_horizon.is_some_and(|horizon| end >= horizon)
                    || self
                        .disruptions
                        .range(self.now..)
                        .next()
                        .is_some_and(|at| end >= *at)
                {
                    break;
                }
                step.decode_context += step.decodes;
                let next =
                    end.saturating_add(self.compute.pass(&step, self.device_capacity_tokens).total);
                if deadline.is_some_and(|deadline| next >= deadline) {
                    break;
                }
                (end, steps) = (next, steps + 1);
            }
        }
        worker.pass = Some(PassInFlight {
            members,
            first_token_at: self.now.saturating_add(time.prefill),
            ends_at: end,
            steps,
        });
        let epoch = worker.epoch;
        self.queue.push(end, Event::PassDone(w, epoch));
    }

    /// For decode worker `w`, disaggregated: the earliest time something may send it a
    /// handoff or land one (see `PassInFlight`); `None` for other workers, or when
    /// nothing is pending anywhere.
    fn handoff_horizon(&self, w: WorkerIndex) -> Option<Timestamp> {
        let disagg = self.disagg.as_ref()?;
        if w < disagg.prefill_workers {
            return None;
        }
        let prefill = self.workers[..disagg.prefill_workers]
            .iter()
            .filter(|p| p.up)
            .flat_map(|p| {
                let pass = p.pass.as_ref().map(|pass| pass.ends_at);
                pass.into_iter().chain(p.poll_at.first().copied())
            });
        disagg
            .fabric
            .next_deadline()
            .into_iter()
            .chain(prefill)
            .min()
    }

    /// Applies worker `w`'s finished pass: prefill chunks advance (a finished prompt
    /// registers its blocks, and its first token counts from the end of the pass's
    /// prefill part), decoding sequences gain a token (a finished one releases its
    /// blocks).
    fn pass_done(&mut self, w: WorkerIndex) {
        let Some(pass) = self.workers[w].pass.take() else {
            return;
        };
        self.passes += pass.steps as u64;
        // The silent steps first: a token each, nothing else (see `PassInFlight`).
        let silent = (pass.steps - 1) as u64;
        if silent > 0 {
            for (i, _) in &pass.members {
                if let (Some(live), Some(State::Decoding { context, .. })) =
                    (self.live.get_mut(i), self.workers[w].states.get_mut(i))
                {
                    live.generated += silent;
                    *context += silent;
                }
            }
        }
        let mut finished = false;
        let mut members = pass.members;
        for (i, tokens) in members.drain(..) {
            let worker = &mut self.workers[w];
            // The common case in place: a decoding sequence that goes on and has room
            // for its next token, or gets a block for it without preempting anyone.
            if let Some(State::Decoding {
                held,
                extra,
                context,
            }) = worker.states.get_mut(&i)
            {
                let live = self
                    .live
                    .get_mut(&i)
                    .expect("a decoding request is in flight");
                let generated = live.generated + 1;
                if generated < live.request.output_tokens
                    && !step_is_visible(live, generated, self.block_size, self.cache_output_blocks)
                {
                    let next = live.request.input_tokens + generated;
                    let needed = if self.batching.decode_blocks {
                        (next + 1).div_ceil(self.block_size) as usize
                    } else {
                        0
                    };
                    let room = held.len() + extra.len() >= needed
                        || match worker.manager.allocate(1, self.now) {
                            Ok(mut block) => {
                                extra.append(&mut block);
                                held.len() + extra.len() >= needed
                            }
                            Err(_) => false,
                        };
                    if room {
                        live.generated = generated;
                        *context = next;
                        continue;
                    }
                }
            }
            match worker.states.remove(&i) {
                Some(State::Prefilling {
                    mut held,
                    mut computing,
                    remaining,
                    cached,
                }) if remaining > tokens => {
                    // Blocks filled by the chunks so far are registered now, as an
                    // engine's prefix cache does: a request arriving meanwhile can hit
                    // them.
                    let request = &self.live[&i].request;
                    let cacheable =
                        cacheable_blocks(request, self.block_size, self.cache_partial_blocks);
                    let full = (((cached + tokens) / self.block_size) as usize).min(cacheable);
                    if full > held.len() {
                        let done = full - held.len();
                        let complete = computing
                            .drain(..done)
                            .zip(&request.blocks[held.len()..full])
                            .map(|(block, identity)| block.apply_identity(*identity))
                            .collect();
                        held.extend(worker.manager.register(complete, self.now));
                    }
                    worker.states.insert(
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
                    mut computing,
                    ..
                }) => {
                    worker.prefill_queue.retain(|queued| *queued != i);
                    let live = self
                        .live
                        .get_mut(&i)
                        .expect("a prefilling request is in flight");
                    let request = &live.request;
                    // A partial last block that is not cached stays the request's own,
                    // like the blocks of generated tokens.
                    let cacheable =
                        cacheable_blocks(request, self.block_size, self.cache_partial_blocks);
                    let own = computing
                        .split_off(cacheable.saturating_sub(held.len()).min(computing.len()));
                    let complete = computing
                        .into_iter()
                        .zip(&request.blocks[held.len()..cacheable])
                        .map(|(block, identity)| block.apply_identity(*identity))
                        .collect();
                    held.extend(worker.manager.register(complete, self.now));
                    if live.first_token_at.is_none() {
                        live.first_token_at = Some(pass.first_token_at);
                        self.ttft.push(
                            pass.first_token_at
                                .saturating_duration_since(request.arrival)
                                .as_nanos() as u64,
                        );
                    }
                    // The prefill pass produces the next token.
                    live.generated += 1;
                    // Disaggregated, a prefill worker hands the request to the decode pool
                    // (unless that token was all it asked for).
                    if live.generated < live.request.output_tokens && self.is_prefill_worker(w) {
                        self.hand_off(w, i, held, own);
                    } else {
                        finished |= self.decoded(w, i, held, own);
                    }
                }
                Some(State::Decoding { held, extra, .. }) => {
                    if let Some(live) = self.live.get_mut(&i) {
                        live.generated += 1;
                    }
                    finished |= self.decoded(w, i, held, extra);
                }
                Some(other) => {
                    worker.states.insert(i, other);
                }
                None => {}
            }
        }
        self.workers[w].spare_members = members;
        if finished {
            self.retry_waiting(w);
        }
    }

    /// Request `i` on worker `w` has one more token: done, or decoding on with a block
    /// for the next token if it needs one (preempting the worker's newest running
    /// request when none is free). Returns whether it is done.
    fn decoded(
        &mut self,
        w: WorkerIndex,
        i: usize,
        mut held: BlockChain,
        mut extra: Vec<MutableBlock<Reset>>,
    ) -> bool {
        let live = &self.live[&i];
        let (input, output) = (live.request.input_tokens, live.request.output_tokens);
        if live.generated >= output {
            drop(extra);
            self.end_thinking(w, i);
            self.finish(w, i, held);
            return true;
        }
        let context = input + live.generated;
        // Room for the next token: prompt and generated tokens so far, plus one.
        let needed = if self.batching.decode_blocks {
            (context + 1).div_ceil(self.block_size) as usize
        } else {
            0
        };
        while held.len() + extra.len() < needed {
            let worker = &mut self.workers[w];
            match worker.manager.allocate(1, self.now) {
                Ok(mut block) => extra.append(&mut block),
                Err(_) => {
                    let newest = worker
                        .states
                        .iter()
                        .rev()
                        .find(|(_, s)| {
                            matches!(s, State::Decoding { .. } | State::Prefilling { .. })
                        })
                        .map(|(j, _)| *j)
                        .filter(|j| *j > i);
                    match newest {
                        Some(j) => self.preempt(w, j),
                        None => {
                            // It is the newest itself: it steps back.
                            drop(extra);
                            worker.manager.device().release(held);
                            self.preempted(w, i);
                            return false;
                        }
                    }
                }
            }
        }
        if self.cache_output_blocks {
            self.cache_filled_output_blocks(w, i, &mut held, &mut extra);
        }
        self.end_thinking(w, i);
        self.workers[w].states.insert(
            i,
            State::Decoding {
                held,
                extra,
                context,
            },
        );
        false
    }

    /// Registers the blocks of request `i` that its generated tokens have filled, as an
    /// engine with prefix caching does once the token that fills a block is computed
    /// (every token but the newest). `held` holds the registered blocks in order, prompt
    /// first; `extra` the rest, the next to fill first. Reasoning blocks (every token a
    /// prompt or reasoning token) are tagged `ThinkActive`, or `ThinkComplete` once the
    /// request answers.
    fn cache_filled_output_blocks(
        &mut self,
        w: WorkerIndex,
        i: usize,
        held: &mut BlockChain,
        extra: &mut Vec<MutableBlock<Reset>>,
    ) {
        let block_size = self.block_size;
        let Some(live) = self.live.get_mut(&i) else {
            return;
        };
        let request = &live.request;
        let (id, input, think) = (request.id, request.input_tokens, request.think_tokens);
        let prompt = cacheable_blocks(request, block_size, false);
        let prompt_last = request.blocks[..prompt].last().copied();
        let computed = input + live.generated - 1;
        let full = (computed / block_size) as usize;
        let count = full.saturating_sub(held.len()).min(extra.len());
        if count == 0 {
            return;
        }
        // Registered blocks are the prompt's, then outputs' (a worker that did not get
        // the whole prompt registered caches nothing of the output).
        let Some(first) = held.len().checked_sub(prompt) else {
            return;
        };
        while live.output_identities.len() < first + count {
            let index = live.output_identities.len();
            let parent = match index {
                0 => prompt_last.as_ref(),
                _ => live.output_identities.last(),
            };
            let identity = BlockIdentity::chained(parent, output_local_hash(id, index));
            live.output_identities.push(identity);
        }
        let complete = extra
            .drain(..count)
            .zip(&live.output_identities[first..first + count])
            .map(|(block, identity)| block.apply_identity(*identity))
            .collect();
        let manager = &mut self.workers[w].manager;
        held.extend(manager.register(complete, self.now));
        self.output_blocks_cached += count as u64;
        // Reasoning blocks: the output blocks that end within the reasoning tokens.
        let reasoning_end = input + think;
        let mut new_think = Vec::new();
        for index in first..first + count {
            let block_end = (prompt + index + 1) as u64 * block_size;
            if block_end <= reasoning_end && index == live.think_blocks.len() {
                let hash = live.output_identities[index].sequence_hash;
                live.think_blocks.push(hash);
                new_think.push(hash);
            }
        }
        if !new_think.is_empty() {
            let phase = if live.thinking_done {
                Phase::ThinkComplete
            } else {
                Phase::ThinkActive
            };
            manager.set_phase(&new_think, phase, self.now);
        }
    }

    /// At request `i`'s ExitThink point (its reasoning tokens all generated), tags its
    /// reasoning blocks `ThinkComplete`: never read again, the first the priority policy
    /// evicts and writes back (seed 004).
    fn end_thinking(&mut self, w: WorkerIndex, i: usize) {
        let Some(live) = self.live.get_mut(&i) else {
            return;
        };
        let think = live.request.think_tokens;
        if think == 0 || live.thinking_done || live.generated < think {
            return;
        }
        live.thinking_done = true;
        if !live.think_blocks.is_empty() {
            let cooled = self.workers[w].manager.set_phase(
                &live.think_blocks,
                Phase::ThinkComplete,
                self.now,
            );
            self.think_blocks_cooled += cooled as u64;
        }
    }

    /// Takes request `j` off worker `w`'s device (recompute preemption): its blocks go
    /// back and it waits at the head of the worker's queue to prefill its prompt and
    /// generated tokens again.
    fn preempt(&mut self, w: WorkerIndex, j: usize) {
        let worker = &mut self.workers[w];
        match worker.states.remove(&j) {
            Some(State::Decoding { held, extra, .. }) => {
                drop(extra);
                worker.manager.device().release(held);
            }
            Some(State::Prefilling {
                held, computing, ..
            }) => {
                drop(computing);
                worker.manager.device().release(held);
                worker.prefill_queue.retain(|queued| *queued != j);
            }
            Some(other) => {
                worker.states.insert(j, other);
                return;
            }
            None => return,
        }
        self.preempted(w, j);
    }

    fn preempted(&mut self, w: WorkerIndex, j: usize) {
        self.preemptions += 1;
        self.workers[w].waiting.push_front(j);
    }

    fn finish(&mut self, w: WorkerIndex, i: usize, held: BlockChain) {
        let routable = self.routable();
        let worker = &mut self.workers[w];
        worker.manager.device().release(held);
        // Done: the request leaves the run; only its latencies stay, in the statistics.
        let Some(Live {
            request,
            first_token_at,
            ..
        }) = self.live.remove(&i)
        else {
            return;
        };
        // Disaggregated, a decode worker is none of the router's business.
        if self.routing == Routing::Kv && w < routable {
            self.router.finish(worker.key, request.blocks.len() as u64);
        }
        if let Some(disagg) = self.disagg.as_mut().filter(|d| w < d.prefill_workers) {
            disagg.finished_at_prefill += 1;
        }
        self.e2e.push(
            self.now
                .saturating_duration_since(request.arrival)
                .as_nanos() as u64,
        );
        if let (true, Some(first)) = (request.output_tokens > 1, first_token_at) {
            let decoding = self.now.saturating_duration_since(first);
            self.tpot
                .push(decoding.as_nanos() as u64 / (request.output_tokens - 1));
        }
        self.output_tokens += request.output_tokens;
        self.completed += 1;
    }

    /// First come, first served: retries worker `w`'s waiting requests until one still
    /// does not fit.
    fn retry_waiting(&mut self, w: WorkerIndex) {
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
    fn retry_idle_workers(&mut self) -> bool {
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
    /// events into the event plane and schedules its next transfer deadline.
    fn settle(&mut self, w: WorkerIndex) {
        loop {
            let worker = &mut self.workers[w];
            worker.manager.handle_completions(self.now);
            let mut progressed = false;
            while let Some(output) = self.workers[w].manager.poll_output() {
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
            }
            if !progressed {
                break;
            }
        }
        let events = self.workers[w].manager.take_events();
        for event in events {
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
            let _ = self.workers[w].replica.apply(&event);
            self.publish(w, event);
        }
        let worker = &mut self.workers[w];
        if let Some(deadline) = worker.manager.poll_timeout() {
            if worker.poll_at.insert(deadline) {
                self.queue
                    .push(deadline.max(self.now), Event::Poll(w, worker.epoch));
            }
        }
    }

    /// Sends worker `w`'s event towards the router: lost with the plane's probability,
    /// applied now without delay, delivered later otherwise (in order: equal delays
    /// keep the queue's insertion order).
    fn publish(&mut self, w: WorkerIndex, event: KvCacheEvent) {
        if self.lost() {
            self.events_dropped += 1;
            return;
        }
        let delay = self.plane_delay();
        if delay.is_zero() {
            self.deliver(w, &event);
        } else {
            let at = self.now.saturating_add(delay);
            let epoch = self.workers[w].epoch;
            self.queue
                .push(at, Event::Deliver(w, epoch, Box::new(event)));
        }
    }

    /// Whether the next message on the event plane is lost (the plane's own loss, or a
    /// fault's, whichever is higher).
    fn lost(&mut self) -> bool {
        let p = self
            .extra_loss
            .values()
            .fold(self.event_plane.drop_probability, |a, b| a.max(*b));
        p > 0.0 && self.event_rng.gen::<f64>() < p
    }

    fn plane_delay(&self) -> Duration {
        Duration::from_micros(self.event_plane.delay_us) + self.extra_delay
    }

    /// The router applies worker `w`'s event, noting ids that went missing before it.
    fn deliver(&mut self, w: WorkerIndex, event: &KvCacheEvent) {
        self.events_delivered += 1;
        let worker = &mut self.workers[w];
        if worker
            .last_applied
            .is_some_and(|last| event.event_id != last.wrapping_add(1))
        {
            worker.gap_seen = true;
        }
        worker.last_applied = Some(event.event_id);
        let (id, gap, epoch) = (worker.key.worker, worker.gap_seen, worker.epoch);
        if self.router.apply(id, event).is_err() {
            self.events_rejected += 1;
        }
        if gap {
            // Not now: this may run inside the worker's own publishing, and a snapshot
            // must follow the events already on their way, not overtake them.
            self.queue.push(self.now, Event::ResyncCheck(w, epoch));
        }
    }

    /// Whether `epoch` is worker `w`'s current incarnation.
    fn current(&self, w: WorkerIndex, epoch: Epoch) -> bool {
        self.workers[w].epoch == epoch
    }

    /// Every worker that is up sends the id of its latest event over the plane; the
    /// next round is due while anything else is.
    fn heartbeat(&mut self) {
        self.heartbeat_due = false;
        // Heartbeats go on while anything else will happen, or the router is behind.
        let more = self.next_arrival.is_some()
            || self.queue.len() > self.heartbeats_in_flight
            || self.workers.iter().any(|w| w.up && w.gap_seen);
        for w in 0..self.workers.len() {
            if !self.workers[w].up || self.lost() {
                continue;
            }
            let worker = &self.workers[w];
            let latest = worker.manager.next_event_id().checked_sub(1);
            let at = self.now.saturating_add(self.plane_delay());
            self.queue
                .push(at, Event::HeartbeatArrives(w, worker.epoch, latest));
            self.heartbeats_in_flight += 1;
        }
        if more {
            self.schedule_heartbeat();
        }
    }

    /// Makes sure a round of heartbeats is due (when they are on at all).
    fn schedule_heartbeat(&mut self) {
        if !self.heartbeat.is_zero() && !self.heartbeat_due {
            self.heartbeat_due = true;
            self.queue
                .push(self.now.saturating_add(self.heartbeat), Event::Heartbeat);
        }
    }

    fn heartbeat_arrives(&mut self, w: WorkerIndex, latest: Option<u64>) {
        let worker = &mut self.workers[w];
        if latest.is_some_and(|latest| worker.last_applied.is_none_or(|last| last < latest)) {
            worker.gap_seen = true;
        } else if !worker.gap_seen {
            // In line: the next snapshot, if one is ever needed, is asked for promptly.
            worker.failed_snapshots = 0;
        }
        self.resync_if_behind(w);
    }

    /// Asks worker `w` for a snapshot of its caches if the router has missed some of its
    /// events and is not already waiting for one.
    fn resync_if_behind(&mut self, w: WorkerIndex) {
        let worker = &self.workers[w];
        if !(worker.up && worker.gap_seen) {
            return;
        }
        if self.now >= worker.quiet_until {
            self.resync(w);
        } else {
            // Waiting out the back-off: a later heartbeat asks again.
            self.schedule_heartbeat();
        }
    }

    /// Worker `w` publishes a snapshot of its caches to the router, which then waits
    /// before asking again: two plane delays plus a millisecond, doubled for every
    /// snapshot that did not bring it in line (a lossy plane loses parts of snapshots
    /// too), up to a minute.
    fn resync(&mut self, w: WorkerIndex) {
        let base = self.plane_delay() * 2 + Duration::from_millis(1);
        let worker = &mut self.workers[w];
        let quiet = base
            .saturating_mul(1 << worker.failed_snapshots.min(16))
            .min(Duration::from_secs(60))
            .max(base);
        worker.failed_snapshots += 1;
        worker.gap_seen = false;
        worker.quiet_until = self.now.saturating_add(quiet);
        self.snapshots += 1;
        self.set_clock(w);
        self.workers[w].manager.publish_snapshot();
        self.settle(w);
    }

    fn fault_starts(&mut self, index: usize) {
        let Some(fault) = self.faults.get(index).cloned() else {
            return;
        };
        self.faults_applied += 1;
        let until = |for_ms: u64, sim: &mut Sim| {
            let at = sim.now.saturating_add(Duration::from_millis(for_ms));
            sim.disruptions.insert(at);
            sim.queue.push(at, Event::FaultEnds(index));
        };
        match fault.kind {
            FaultKind::WorkerCrash { worker, down_ms } => self.crash(worker, down_ms),
            FaultKind::LinkSlowdown {
                worker,
                link,
                factor,
                for_ms,
            } => {
                self.slow_link(worker, link, factor);
                until(for_ms, self);
            }
            FaultKind::EventLoss {
                probability,
                for_ms,
            } => {
                self.extra_loss.insert(index, probability);
                until(for_ms, self);
            }
            FaultKind::EventLag { delay_us, for_ms } => {
                self.extra_delay += Duration::from_micros(delay_us);
                until(for_ms, self);
            }
            FaultKind::SsdFailure { worker, down_ms } => {
                self.fail_disk(worker);
                until(down_ms, self);
            }
            FaultKind::RouterRestart => {
                // Its state and the load it knew are gone; the workers it knows of send
                // snapshots (decode workers too: their blocks are in its index).
                self.router = router_of(self.scheduler, 0);
                let routable = self.routable();
                for w in 0..self.workers.len() {
                    let worker = &mut self.workers[w];
                    worker.last_applied = None;
                    if worker.up {
                        let key = worker.key;
                        if w < routable {
                            self.router.add_worker(key, WorkerMode::Events);
                        }
                        self.resync(w);
                    }
                }
            }
        }
    }

    fn fault_ends(&mut self, index: usize) {
        let Some(fault) = self.faults.get(index).cloned() else {
            return;
        };
        match fault.kind {
            FaultKind::LinkSlowdown {
                worker,
                link,
                factor,
                ..
            } => self.slow_link(worker, link, 1.0 / factor),
            FaultKind::EventLoss { .. } => {
                self.extra_loss.remove(&index);
            }
            FaultKind::EventLag { delay_us, .. } => {
                self.extra_delay = self
                    .extra_delay
                    .saturating_sub(Duration::from_micros(delay_us));
            }
            FaultKind::SsdFailure { worker, .. } => self.restore_disk(worker),
            FaultKind::WorkerCrash { .. } | FaultKind::RouterRestart => {}
        }
    }

    /// Worker `w`'s SSD fails: the hardware fails the transfers touching it, which go
    /// through the manager's failure path (an onboarding from disk ends with its blocks
    /// to compute, and the request goes on to prefill), then the manager forgets the
    /// disk tier, and its `Removed` events go out like any others.
    fn fail_disk(&mut self, w: WorkerIndex) {
        let Some(worker) = self.workers.get_mut(w) else {
            return;
        };
        worker.disk_failures += 1;
        if worker.disk_failures > 1 {
            // Already down: nothing more to lose.
            return;
        }
        self.set_clock(w);
        let now = self.now;
        let manager = &mut self.workers[w].manager;
        let stopped = manager.hardware_mut().fail_tier(Tier::Disk, now);
        manager.handle_completions(now);
        // Validated: the worker has a disk tier.
        let failure = manager.fail_tier(Tier::Disk, now).unwrap_or_default();
        self.disk_transfers_failed += (stopped + failure.transfers_failed) as u64;
        self.disk_blocks_lost += failure.blocks_lost as u64;
        if self.workers[w].up {
            self.settle(w);
            self.start_pass(w);
        }
    }

    /// Worker `w`'s SSD is back, empty, once no failure of it is under way.
    fn restore_disk(&mut self, w: WorkerIndex) {
        let Some(worker) = self.workers.get_mut(w) else {
            return;
        };
        worker.disk_failures = worker.disk_failures.saturating_sub(1);
        if worker.disk_failures > 0 {
            return;
        }
        self.set_clock(w);
        let now = self.now;
        let manager = &mut self.workers[w].manager;
        manager.hardware_mut().restore_tier(Tier::Disk);
        let _ = manager.restore_tier(Tier::Disk, now);
        if self.workers[w].up {
            // Write-back may copy down again at once.
            self.settle(w);
            self.start_pass(w);
        }
    }

    /// Multiplies the speed of `link` on worker `worker`'s node (every node if `None`).
    fn slow_link(&mut self, worker: Option<WorkerIndex>, link: Link, factor: f64) {
        let index = Link::ALL.iter().position(|l| *l == link).unwrap_or(0);
        for w in 0..self.workers.len() {
            if worker.is_some_and(|only| only != w) || !self.workers[w].up {
                continue;
            }
            let speed = {
                let speed = &mut self.workers[w].link_speed[index];
                *speed *= factor;
                *speed
            };
            let now = self.now;
            self.set_clock(w);
            self.workers[w]
                .manager
                .hardware_mut()
                .set_link_speed(link, speed, now);
            // The node's NIC carries its handoffs too.
            if let Some(disagg) = self.disagg.as_mut() {
                disagg.fabric.set_nic_speed(w, link, speed, now);
                self.schedule_fabric();
            }
            // Transfer deadlines moved.
            self.settle(w);
        }
    }

    /// Worker `w` stops: the router forgets it, its requests start again on other
    /// workers (as a frontend retries them), and it comes back empty after `down_ms`.
    /// Disaggregated, the handoffs from or to it are aborted first
    /// ([`Sim::abort_handoff`]), and its requests are prefilled again wherever the router
    /// sends them.
    fn crash(&mut self, w: WorkerIndex, down_ms: u64) {
        let Some(worker) = self.workers.get_mut(w) else {
            return;
        };
        if !worker.up {
            return;
        }
        let mut requests: Vec<usize> = worker
            .states
            .keys()
            .copied()
            .chain(worker.waiting.iter().copied())
            .collect();
        requests.sort_unstable();
        requests.dedup();
        // A plan ends at the first step that ends at or after a fault (see
        // `PassInFlight`): every step of it but the last is done by now, and an engine
        // going one pass at a time would have its tokens. They are kept; the last step
        // is lost with the worker.
        if let Some(pass) = worker.pass.take() {
            let silent = (pass.steps - 1) as u64;
            self.passes += silent;
            for (i, _) in &pass.members {
                if let Some(live) = self.live.get_mut(i) {
                    live.generated += silent;
                }
            }
        }
        worker.up = false;
        worker.epoch += 1;
        worker.states.clear();
        worker.waiting.clear();
        worker.prefill_queue.clear();
        worker.poll_at.clear();
        worker.last_applied = None;
        worker.gap_seen = false;
        worker.failed_snapshots = 0;
        worker.replica = RegistryReplica::new();
        let mut hardware = SimHardware::new(
            self.hardware_profile.clone(),
            self.worker_config.block_size_tokens,
        );
        for (link, speed) in Link::ALL.iter().zip(worker.link_speed) {
            if speed != 1.0 {
                hardware.set_link_speed(*link, speed, self.now);
            }
        }
        hardware.clock().set(self.now);
        // A disk that failed stays down across the restart.
        let disk_down = worker.disk_failures > 0;
        if disk_down {
            hardware.fail_tier(Tier::Disk, self.now);
        }
        let mut config = self.worker_config.clone();
        config.worker_id = worker.key.worker;
        worker.manager = Manager::new(hardware, config).expect("validated when the run began");
        if disk_down {
            // A fresh manager has nothing to lose.
            let _ = worker.manager.fail_tier(Tier::Disk, self.now);
        }
        let id = worker.key.worker;
        self.router.remove_worker(id);
        let back = self.now.saturating_add(Duration::from_millis(down_ms));
        self.disruptions.insert(back);
        self.queue.push(back, Event::Restart(w));
        // All aborts before any retry: the blocks they free on the other ends may serve
        // the retried requests (a prefill worker's stay cached there).
        for i in &requests {
            self.abort_handoff(*i);
        }
        for i in requests {
            self.requests_retried += 1;
            self.reroute(i);
        }
    }

    /// Aborts request `i`'s handoff, if it has one, because one of its ends crashed:
    /// its frames still on the fabric never land (the other transfers take their share
    /// of the links), the prefill worker, if up, lets the request's blocks go (they stay
    /// cached) and the router stops counting its load there, and the decode worker, if
    /// up, gives back the blocks it reserved (or drops the handoff from its queue). The
    /// request itself is the caller's to retry.
    fn abort_handoff(&mut self, i: usize) {
        let now = self.now;
        let Some(disagg) = self.disagg.as_mut() else {
            return;
        };
        let Some(handoff) = disagg.handoffs.remove(&i) else {
            return;
        };
        disagg.handoffs_aborted += 1;
        disagg.unassigned.retain(|waiting| *waiting != i);
        for id in &handoff.frames {
            if disagg.frames_in_flight.remove(id).is_some() && disagg.fabric.abort(*id, now) {
                disagg.frames_aborted += 1;
            }
        }
        // The others' rates went up: their landings may be earlier than scheduled.
        self.schedule_fabric();
        let p = handoff.from;
        if self.workers[p].up {
            self.set_clock(p);
            let worker = &mut self.workers[p];
            if let Some(State::Sending { held, own }) = worker.states.remove(&i) {
                drop(own);
                worker.manager.device().release(held);
                if self.routing == Routing::Kv {
                    let (key, blocks) = (worker.key, self.request(i).blocks.len() as u64);
                    self.router.finish(key, blocks);
                }
            }
            self.retry_waiting(p);
            self.also_touched.insert(p);
        }
        if let Some(d) = handoff.to.filter(|d| self.workers[*d].up) {
            self.set_clock(d);
            let worker = &mut self.workers[d];
            match worker.states.remove(&i) {
                Some(State::Receiving { blocks }) => drop(blocks),
                Some(other) => {
                    worker.states.insert(i, other);
                }
                None => worker.waiting.retain(|waiting| *waiting != i),
            }
            self.retry_waiting(d);
            self.also_touched.insert(d);
        }
    }

    /// Workers the router may send a request to: the prefill pool when disaggregated,
    /// every worker otherwise (they are the first ones either way).
    fn routable(&self) -> usize {
        self.disagg
            .as_ref()
            .map_or(self.workers.len(), |d| d.prefill_workers)
    }

    fn is_prefill_worker(&self, w: WorkerIndex) -> bool {
        self.disagg.as_ref().is_some_and(|d| w < d.prefill_workers)
    }

    /// Settles and starts a pass on every worker an event touched besides its own.
    fn settle_also_touched(&mut self) {
        while let Some(w) = self.also_touched.pop_first() {
            self.settle(w);
            self.start_pass(w);
        }
    }

    /// Request `i`, prefilled on prefill worker `p`, goes to the decode pool: `p` holds
    /// its blocks until the handoff lands, and a decode worker receives it
    /// ([`Sim::assign_decode_worker`]).
    fn hand_off(
        &mut self,
        p: WorkerIndex,
        i: usize,
        held: BlockChain,
        own: Vec<MutableBlock<Reset>>,
    ) {
        self.workers[p]
            .states
            .insert(i, State::Sending { held, own });
        let now = self.now;
        let Some(disagg) = self.disagg.as_mut() else {
            return;
        };
        disagg.handed_off[p] += 1;
        disagg.handoffs.insert(
            i,
            Handoff {
                from: p,
                to: None,
                frames: Vec::new(),
                ready_at: now,
                sent_at: None,
                frames_left: 0,
                waited: false,
            },
        );
        self.assign_decode_worker(i);
    }

    /// Gives request `i`'s handoff to the decode worker that is up with the fewest
    /// requests (the lowest index on a tie), which receives it. With none up it waits,
    /// first come first served, for one to come back (its blocks stay held on the
    /// prefill worker): nothing is handed to a crashed worker.
    fn assign_decode_worker(&mut self, i: usize) {
        let first = self.routable();
        // `min_by_key` keeps the first of equals: the lowest index.
        let d = (first..self.workers.len())
            .filter(|d| self.workers[*d].up)
            .min_by_key(|d| self.workers[*d].states.len() + self.workers[*d].waiting.len());
        let Some(disagg) = self.disagg.as_mut() else {
            return;
        };
        let Some(handoff) = disagg.handoffs.get_mut(&i) else {
            return;
        };
        match d {
            Some(d) => {
                handoff.to = Some(d);
                self.receive(d, i);
            }
            None => disagg.unassigned.push_back(i),
        }
    }

    /// Blocks request `i`'s handoff carries: its prompt's, and for a request prefilled
    /// again after a crash, those of the generated tokens recomputed with it (all but the
    /// newest, whose KV the decode worker computes).
    fn handoff_blocks(&self, i: usize) -> usize {
        let live = &self.live[&i];
        let request = &live.request;
        let computed = request.input_tokens + live.generated.saturating_sub(1);
        let beyond_prompt = computed
            .div_ceil(self.block_size)
            .saturating_sub(request.input_tokens.div_ceil(self.block_size));
        request.blocks.len() + beyond_prompt as usize
    }

    /// Decode worker `d` takes device blocks for request `i`'s prompt and the handoff's
    /// frames go out; without free blocks the handoff waits in `d`'s queue, first come
    /// first served, and is tried again when blocks come free there.
    fn receive(&mut self, d: WorkerIndex, i: usize) {
        let blocks = self.handoff_blocks(i);
        self.set_clock(d);
        // Taking blocks may evict cached ones: `d` has events to publish.
        self.also_touched.insert(d);
        match self.workers[d].manager.allocate(blocks, self.now) {
            Ok(blocks) => {
                self.workers[d]
                    .states
                    .insert(i, State::Receiving { blocks });
                self.send_frames(i);
            }
            Err(_) => {
                if let Some(disagg) = self.disagg.as_mut() {
                    if let Some(handoff) = disagg.handoffs.get_mut(&i) {
                        if !handoff.waited {
                            handoff.waited = true;
                            disagg.waits += 1;
                        }
                    }
                }
                self.workers[d].waiting.push_back(i);
            }
        }
    }

    /// Sends request `i`'s blocks over the fabric, `frame_blocks` to an MRDN frame, all
    /// frames at once (a prompt of no full block still sends one frame, its header).
    fn send_frames(&mut self, i: usize) {
        let blocks = self.handoff_blocks(i);
        let now = self.now;
        let workers = &self.workers;
        let Some(disagg) = self.disagg.as_mut() else {
            return;
        };
        let Some(handoff) = disagg.handoffs.get_mut(&i) else {
            return;
        };
        let Some(to) = handoff.to else {
            return;
        };
        let (from, to) = (
            (handoff.from, workers[handoff.from].epoch),
            (to, workers[to].epoch),
        );
        let mut sizes: Vec<usize> = frame_sizes(blocks, disagg.frame_blocks).collect();
        if sizes.is_empty() {
            sizes.push(0);
        }
        handoff.sent_at = Some(now);
        handoff.frames_left = sizes.len();
        disagg
            .wait
            .push(now.saturating_duration_since(handoff.ready_at).as_nanos() as u64);
        for size in sizes {
            let bytes = frame_bytes(size, disagg.bytes_per_block);
            let id = disagg.fabric.start(from.0, to.0, bytes, now);
            handoff.frames.push(id);
            disagg.frames_in_flight.insert(
                id,
                FrameInFlight {
                    request: i,
                    from,
                    to,
                },
            );
            disagg.frames += 1;
            disagg.bytes += bytes;
            disagg.header_bytes += frame_bytes(0, 0);
        }
        self.schedule_fabric();
    }

    /// Makes sure the fabric's next deadline is in the event queue.
    fn schedule_fabric(&mut self) {
        let Some(disagg) = self.disagg.as_mut() else {
            return;
        };
        if let Some(deadline) = disagg.fabric.next_deadline() {
            let at = deadline.max(self.now);
            if disagg.poll_at.insert(at) {
                self.queue.push(at, Event::Fabric);
            }
        }
    }

    /// A fabric deadline: frames that landed count down their handoffs, and every
    /// handoff whose last frame is in completes, in the order its frames landed.
    fn fabric_due(&mut self) {
        let now = self.now;
        let workers = &self.workers;
        let Some(disagg) = self.disagg.as_mut() else {
            return;
        };
        disagg.poll_at.remove(&now);
        disagg.fabric.advance(now);
        let mut complete = Vec::new();
        while let Some(id) = disagg.fabric.pop_landed(now) {
            let Some(frame) = disagg.frames_in_flight.remove(&id) else {
                continue;
            };
            // Sent by or to a crashed worker's former self: its handoff was aborted (and
            // the frame with it, so this is only a safeguard).
            let current =
                |(w, epoch): (WorkerIndex, Epoch)| workers[w].up && workers[w].epoch == epoch;
            if !(current(frame.from) && current(frame.to)) {
                continue;
            }
            let i = frame.request;
            if let Some(handoff) = disagg.handoffs.get_mut(&i) {
                handoff.frames_left = handoff.frames_left.saturating_sub(1);
                if handoff.frames_left == 0 {
                    complete.push(i);
                }
            }
        }
        for i in complete {
            self.handoff_landed(i);
        }
        self.schedule_fabric();
    }

    /// Every frame of request `i`'s handoff has landed: the prefill worker lets its
    /// blocks go (they stay cached there for prefix reuse) and takes waiting work, and
    /// the decode worker registers the prompt blocks (its prefix cache, announced to the
    /// router like any others) and decodes the request.
    fn handoff_landed(&mut self, i: usize) {
        let now = self.now;
        let Some(disagg) = self.disagg.as_mut() else {
            return;
        };
        let Some(handoff) = disagg.handoffs.remove(&i) else {
            return;
        };
        let (p, d) = (
            handoff.from,
            handoff
                .to
                .expect("a handoff whose frames landed was sent to a decode worker"),
        );
        disagg.handoffs_done += 1;
        disagg.received[d] += 1;
        if let Some(sent) = handoff.sent_at {
            disagg
                .latency
                .push(now.saturating_duration_since(sent).as_nanos() as u64);
        }
        let prompt_blocks = self.request(i).blocks.len() as u64;
        self.set_clock(p);
        let worker = &mut self.workers[p];
        if let Some(State::Sending { held, own }) = worker.states.remove(&i) {
            drop(own);
            worker.manager.device().release(held);
        }
        if self.routing == Routing::Kv {
            let key = self.workers[p].key;
            self.router.finish(key, prompt_blocks);
        }
        self.retry_waiting(p);
        self.also_touched.insert(p);
        self.set_clock(d);
        self.also_touched.insert(d);
        let Some(State::Receiving { mut blocks }) = self.workers[d].states.remove(&i) else {
            return;
        };
        let request = &self.live[&i].request;
        let cacheable =
            cacheable_blocks(request, self.block_size, self.cache_partial_blocks).min(blocks.len());
        // A partial last block that is not cached stays the request's own.
        let own = blocks.split_off(cacheable);
        let complete = blocks
            .into_iter()
            .zip(&request.blocks[..cacheable])
            .map(|(block, identity)| block.apply_identity(*identity))
            .collect();
        let held = self.workers[d].manager.register(complete, now);
        if self.decoded(d, i, held, own) {
            self.retry_waiting(d);
        }
    }

    /// Sends request `i` to a worker again (after a crash, or when one comes back).
    fn reroute(&mut self, i: usize) {
        if let Some(w) = self.arrive(i) {
            self.settle(w);
            self.start_pass(w);
        }
    }

    /// A crashed worker comes back empty; requests that found no worker go first.
    fn restart(&mut self, w: WorkerIndex) {
        let worker = &mut self.workers[w];
        if worker.up {
            return;
        }
        worker.up = true;
        let key = worker.key;
        if w < self.routable() {
            self.router.add_worker(key, WorkerMode::Events);
        }
        // A decode worker back takes the handoffs that waited for one, in their order.
        let unassigned = match self.disagg.as_mut() {
            Some(disagg) if w >= disagg.prefill_workers => std::mem::take(&mut disagg.unassigned),
            _ => VecDeque::new(),
        };
        for i in unassigned {
            self.assign_decode_worker(i);
        }
        for i in std::mem::take(&mut self.parked) {
            self.reroute(i);
        }
    }

    /// Whether the router's view of each worker is that worker's pools: it lists no
    /// block the worker does not hold (in exactly the tiers it holds it), and every block
    /// a prefix lookup can reach on the worker (its whole prefix held, in some tier). A
    /// block whose prefix left the worker may be missing from a view rebuilt from a
    /// snapshot: no query could use it. Without faults the view is the pools exactly.
    fn router_view_matches_pools(&self) -> bool {
        self.workers.iter().all(|worker| {
            let view = self.router.indexer().blocks_of(worker.key);
            if !worker.up {
                return view.is_empty();
            }
            let mut pools: BTreeMap<SequenceHash, u8> = BTreeMap::new();
            for tier in Tier::ALL {
                if let Some(pool) = worker.manager.pool(tier) {
                    for hash in pool.snapshot().registered.into_keys() {
                        *pools.entry(hash).or_default() |= 1 << tier.index();
                    }
                }
            }
            let reachable: BTreeSet<SequenceHash> = worker
                .manager
                .reachable_blocks()
                .into_iter()
                .map(|(identity, _)| identity.sequence_hash)
                .collect();
            view.iter()
                .all(|(hash, tiers)| pools.get(hash) == Some(tiers))
                && reachable
                    .iter()
                    .all(|hash| view.get(hash) == pools.get(hash))
        })
    }

    fn report(self, scenario: &Scenario) -> Report {
        let simulated_ns = self.now.as_nanos().max(1);
        // A snapshot leaves out the blocks no prefix lookup can reach (see
        // `Manager::publish_snapshot`): after one, only those may be missing.
        let rebuild_matches_pools = self.workers.iter().all(|worker| {
            let reachable: BTreeSet<(SequenceHash, Tier)> = worker
                .manager
                .reachable_blocks()
                .into_iter()
                .map(|(identity, tier)| (identity.sequence_hash, tier))
                .collect();
            Tier::ALL.iter().all(|tier| {
                let replica = worker.replica.hashes(*tier);
                match worker.manager.pool(*tier) {
                    Some(pool) => {
                        let pools: BTreeSet<SequenceHash> =
                            pool.snapshot().registered.into_keys().collect();
                        replica.is_subset(&pools)
                            && pools
                                .difference(replica)
                                .all(|hash| !reachable.contains(&(*hash, *tier)))
                    }
                    None => replica.is_empty(),
                }
            })
        });
        let view_matches_pools = self.router_view_matches_pools();
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
        let disaggregation = self.disagg.as_ref().map(|d| d.report(simulated_ns));
        let routed: u64 = self.workers.iter().map(|w| w.routed).sum();
        let routing = RoutingReport {
            mode: match self.routing {
                Routing::Kv => "kv",
                Routing::RoundRobin => "round_robin",
            },
            requests_per_worker: self.workers.iter().map(|w| w.routed).collect(),
            mean_overlap_blocks: if routed == 0 {
                0.0
            } else {
                self.overlap_blocks as f64 / routed as f64
            },
            events_applied: self.events_delivered - self.events_rejected,
            events_rejected: self.events_rejected,
            events_dropped: self.events_dropped,
            view_matches_pools,
        };
        Report {
            hit_token_ratio,
            scenario: scenario.name.clone(),
            seed: scenario.seed,
            workers: self.workers.len(),
            requests: self.arrived,
            completed: self.completed,
            rejected_too_large: self.too_large,
            waits_for_blocks: self.waits,
            blocks: sources,
            hit_ratio,
            ttft: Percentiles::of(self.ttft),
            end_to_end: Percentiles::of(self.e2e),
            tpot: Percentiles::of(self.tpot),
            queueing: Percentiles::of(self.queueing),
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
            routing,
            faults: FaultReport {
                applied: self.faults_applied,
                requests_retried: self.requests_retried,
                snapshots: self.snapshots,
                // Parked for a prefill worker, or prefilled and waiting for a decode one.
                requests_unserved: (self.parked.len()
                    + self.disagg.as_ref().map_or(0, |d| d.unassigned.len()))
                    as u64,
                disk_blocks_lost: self.disk_blocks_lost,
                disk_transfers_failed: self.disk_transfers_failed,
            },
            disaggregation,
            output_blocks: self.cache_output_blocks.then_some(OutputBlocksReport {
                cached: self.output_blocks_cached,
                reasoning_cooled: self.think_blocks_cooled,
            }),
            simulated_s: simulated_ns as f64 / 1e9,
            passes: self.passes,
            preemptions: self.preemptions,
            engine_events: self.engine_events,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hardware::Link;
    use crate::scenario::WorkloadSpec;
    use kvtwin::block::BlockIdentity;
    use kvtwin::manager::{OffloadPolicy, TierConfig};
    use kvtwin::pool::EvictionPolicyKind;
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
            think_tokens: 0,
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
        // A went into the first pass at once; B, arriving during it, into the second.
        assert_eq!((report.queueing.p50_ms, report.queueing.max_ms), (0.0, 0.1));
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

    /// `n` requests every `gap_us`, all starting with the same `shared` 16-token blocks
    /// (a system prompt), then `own` blocks of their own, `output` tokens out.
    fn shared_prefix_requests(
        n: u64,
        gap_us: u64,
        shared: u64,
        own: u64,
        output: u64,
    ) -> Vec<Request> {
        (0..n)
            .map(|i| {
                let locals: Vec<LocalBlockHash> = (0..shared)
                    .map(|b| LocalBlockHash::new(1 + b))
                    .chain((0..own).map(|b| LocalBlockHash::new(1_000_000 + i * 1000 + b)))
                    .collect();
                Request {
                    id: RequestId::new(i),
                    arrival: Timestamp::from_nanos(i * gap_us * 1000),
                    blocks: BlockIdentity::chain(&locals),
                    input_tokens: (shared + own) * 16,
                    output_tokens: output,
                    think_tokens: 0,
                }
            })
            .collect()
    }

    /// A small device writing back to host, and host to disk.
    fn tiers_with_write_back() -> Vec<TierConfig> {
        vec![
            TierConfig {
                tier: Tier::Device,
                capacity_blocks: 24,
                eviction: EvictionPolicyKind::Lru,
                offload: OffloadPolicy::WriteBack {
                    low_watermark_blocks: 8,
                },
            },
            TierConfig {
                tier: Tier::Host,
                capacity_blocks: 40,
                eviction: EvictionPolicyKind::Lru,
                offload: OffloadPolicy::WriteBack {
                    low_watermark_blocks: 8,
                },
            },
            TierConfig {
                tier: Tier::Disk,
                capacity_blocks: 60,
                eviction: EvictionPolicyKind::Lru,
                offload: OffloadPolicy::None,
            },
        ]
    }

    fn cluster(workers: usize, routing: Routing) -> Scenario {
        let mut scenario = scenario();
        scenario.cluster.workers = workers;
        scenario.cluster.routing = routing;
        scenario
    }

    #[test]
    fn kv_routing_spreads_a_shared_prefix_by_load_and_the_router_sees_every_pool() {
        // Every request shares its first 8 blocks: by overlap alone all would go to the
        // first worker that cached them (the hot spot); the load term spreads them.
        let requests = shared_prefix_requests(40, 20, 8, 2, 50);
        let report = simulate(&cluster(4, Routing::Kv), &requests).unwrap();
        assert_eq!(report.completed, 40);
        assert_eq!(report.routing.requests_per_worker.len(), 4);
        assert!(
            report.routing.requests_per_worker.iter().all(|n| *n >= 5),
            "{:?}",
            report.routing.requests_per_worker
        );
        // The router found the shared prefix on the worker it chose.
        assert!(report.routing.mean_overlap_blocks > 4.0, "{report:?}");
        assert!(report.routing.view_matches_pools);
        assert_eq!(report.routing.events_rejected, 0);
        assert_eq!(report.routing.events_applied, report.events.events);
    }

    #[test]
    fn round_robin_takes_turns_and_each_worker_computes_the_shared_prefix_once() {
        // 200 µs apart: a worker's previous prompt (160 µs of prefill) is cached by the
        // time its next request comes.
        let requests = shared_prefix_requests(40, 200, 8, 2, 50);
        let rr = simulate(&cluster(4, Routing::RoundRobin), &requests).unwrap();
        assert_eq!(rr.routing.requests_per_worker, vec![10, 10, 10, 10]);
        assert_eq!(rr.routing.mean_overlap_blocks, 0.0);
        // Each worker computes the shared prefix once: 4 × 8 blocks.
        assert_eq!(rr.blocks.total - rr.blocks.computed, 40 * 8 - 4 * 8);
        assert!(rr.routing.view_matches_pools);
    }

    #[test]
    fn a_tiered_worker_under_pressure_publishes_events_the_router_accepts_in_order() {
        // A small device writing back to host, and host to disk: blocks are copied down
        // and evicted in the same batches of events. Cross-tier order matters: a block stored on host must
        // reach the router before its parent leaves the device, or it is refused.
        let mut scenario = cluster(2, Routing::Kv);
        scenario.worker.tiers = tiers_with_write_back();
        let requests = shared_prefix_requests(60, 300, 4, 6, 20);
        let report = simulate(&scenario, &requests).unwrap();
        assert_eq!(report.completed, 60);
        assert!(
            report.offloaded_blocks[Tier::Host.index()] > 0,
            "{report:?}"
        );
        assert!(report.events.removed_blocks > 0, "{report:?}");
        assert_eq!(report.routing.events_rejected, 0, "{report:?}");
        assert!(report.routing.view_matches_pools);
        assert!(report.events.rebuild_matches_pools);
    }

    #[test]
    fn the_event_plane_delays_and_loses_events_as_configured() {
        let requests = shared_prefix_requests(20, 20, 4, 2, 10);
        // Delayed: every event still arrives (the run drains the plane), in order.
        let mut delayed = cluster(2, Routing::Kv);
        delayed.cluster.event_plane.delay_us = 5_000;
        let report = simulate(&delayed, &requests).unwrap();
        assert_eq!(report.routing.events_applied, report.events.events);
        assert_eq!(report.routing.events_dropped, 0);
        assert!(report.routing.view_matches_pools);
        // Lost: the router learns nothing, and the report says its view is wrong.
        let mut lossy = cluster(2, Routing::Kv);
        lossy.cluster.event_plane.drop_probability = 1.0;
        let report = simulate(&lossy, &requests).unwrap();
        assert_eq!(report.routing.events_dropped, report.events.events);
        assert_eq!(report.routing.events_applied, 0);
        assert!(!report.routing.view_matches_pools);
        assert_eq!(report.routing.mean_overlap_blocks, 0.0);
        // Half lost, drawn from the run's seed: the same seed loses the same events.
        let mut half = cluster(2, Routing::Kv);
        half.cluster.event_plane.drop_probability = 0.5;
        let (a, b) = (
            simulate(&half, &requests).unwrap(),
            simulate(&half, &requests).unwrap(),
        );
        assert_eq!(a.to_json(), b.to_json());
        assert!(
            a.routing.events_dropped > 0 && a.routing.events_applied > 0,
            "{a:?}"
        );
    }

    #[test]
    fn blocks_filled_by_earlier_prefill_chunks_are_hits_for_a_request_arriving_meanwhile() {
        // A's 160 tokens take two passes (100-token budget): after the first (100 µs) six
        // full blocks are registered, so B, same prompt, arriving at 150 µs, hits them.
        let mut requests = shared_prefix_requests(2, 150, 10, 0, 2);
        requests[1].arrival = Timestamp::from_nanos(150_000);
        let report = simulate(&scenario(), &requests).unwrap();
        assert_eq!(report.completed, 2);
        assert_eq!(report.blocks.device, 6, "{report:?}");
    }

    /// The report without `engine_events`, the one field planned decode steps change.
    fn outcome(report: &Report) -> String {
        let mut value: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
        value.as_object_mut().unwrap().remove("engine_events");
        value.to_string()
    }

    #[test]
    fn planned_decode_steps_change_nothing_but_the_engine_event_count() {
        let mut cases: Vec<(Scenario, Vec<Request>)> = Vec::new();
        for (workers, routing, gap_us) in [
            (1, Routing::Kv, 20),
            (3, Routing::Kv, 700),
            (4, Routing::RoundRobin, 3_000),
        ] {
            cases.push((
                cluster(workers, routing),
                shared_prefix_requests(30, gap_us, 4, 3, 120),
            ));
        }
        // Preemption: decode blocks run out.
        let mut tight = scenario();
        tight.worker.tiers[0].capacity_blocks = 12;
        cases.push((
            tight,
            vec![request(0, 1000, 32, 90), request(1, 2000, 32, 90)],
        ));
        // An arrival exactly at a step end: A's prefill ends at 96 µs, its decode steps at
        // 196, 296, ... µs; B comes at 496 µs and joins the pass after the one that
        // starts then.
        let mut late = request(1, 2000, 32, 5);
        late.arrival = Timestamp::from_nanos(496_000);
        cases.push((scenario(), vec![request(0, 1000, 96, 30), late]));
        // Transfers: write-back to host and disk, onboarding from them, and the
        // deadlines they bring.
        let mut tiered = cluster(2, Routing::Kv);
        tiered.worker.tiers = tiers_with_write_back();
        // Big blocks on 1 GB/s links: copies take milliseconds, decode steps 100 µs, so
        // onboarded requests become ready in the middle of decode phases.
        tiered.worker.bytes_per_block = 4 << 20;
        tiered.worker.onboard = kvtwin::manager::OnboardPolicy::Always;
        // Every tenth request repeats a prompt, by then copied down and evicted: onboarded.
        let mut repeats = shared_prefix_requests(60, 300, 4, 6, 120);
        for i in 10..repeats.len() {
            let earlier = repeats[i - 10].blocks.clone();
            repeats[i].blocks = earlier;
        }
        cases.push((tiered, repeats));
        // Generated blocks cached and reasoning cooled at ExitThink: steps that fill a
        // block or end the reasoning are never planned away.
        // Under pressure, with write-back: when blocks cool decides what is written back
        // and evicted first.
        let mut reasoning = cluster(2, Routing::Kv);
        reasoning.worker.cache_output_blocks = true;
        reasoning.worker.tiers = tiers_with_write_back();
        reasoning.worker.tiers[0].capacity_blocks = 48;
        for tier in &mut reasoning.worker.tiers[..2] {
            tier.eviction = EvictionPolicyKind::Priority;
        }
        reasoning.worker.bytes_per_block = 1 << 20;
        let mut thinking = shared_prefix_requests(20, 400, 3, 2, 150);
        for (k, request) in thinking.iter_mut().enumerate() {
            request.think_tokens = 40 + 7 * k as u64;
        }
        cases.push((reasoning, thinking));
        // A lossy, late event plane.
        let mut lossy = cluster(2, Routing::Kv);
        lossy.cluster.event_plane.delay_us = 250;
        lossy.cluster.event_plane.drop_probability = 0.2;
        cases.push((lossy, shared_prefix_requests(25, 100, 2, 2, 60)));
        // Disaggregated: handoffs land on decode workers in the middle of their decode
        // phases (64 KiB blocks take the fabric tens of microseconds), and prefills end
        // and send new ones while they decode.
        let mut disagg = disaggregated(2, 2, 4);
        disagg.cluster.routing = Routing::Kv;
        disagg.worker.bytes_per_block = 64 << 10;
        cases.push((disagg.clone(), shared_prefix_requests(30, 700, 4, 3, 120)));
        // Round-robin, every request at once: handoffs wait for decode blocks.
        let mut crowded = disaggregated(1, 2, 16);
        crowded.worker.tiers[0].capacity_blocks = 40;
        cases.push((crowded, shared_prefix_requests(12, 0, 2, 2, 150)));
        // Crashes, aggregated: a worker goes down in the middle of a plan.
        cases.push(faulty(vec![
            fault(
                7,
                FaultKind::WorkerCrash {
                    worker: 1,
                    down_ms: 5,
                },
            ),
            fault(
                13,
                FaultKind::WorkerCrash {
                    worker: 2,
                    down_ms: 3,
                },
            ),
        ]));
        // And crashes of both pools: aborted handoffs, none up for a while.
        disagg.faults = vec![
            fault(
                3,
                FaultKind::WorkerCrash {
                    worker: 0,
                    down_ms: 2,
                },
            ),
            fault(
                6,
                FaultKind::WorkerCrash {
                    worker: 2,
                    down_ms: 4,
                },
            ),
            fault(
                7,
                FaultKind::WorkerCrash {
                    worker: 3,
                    down_ms: 2,
                },
            ),
        ];
        cases.push((disagg, shared_prefix_requests(30, 700, 4, 3, 120)));
        for (planned, requests) in cases {
            let mut single = planned.clone();
            single.worker.batching.plan_decode_steps = false;
            let a = simulate(&planned, &requests).unwrap();
            let b = simulate(&single, &requests).unwrap();
            assert_eq!(outcome(&a), outcome(&b));
            assert!(
                a.engine_events < b.engine_events,
                "{} vs {}",
                a.engine_events,
                b.engine_events
            );
        }
    }

    #[test]
    fn generated_blocks_are_cached_and_reasoning_blocks_cool_at_exit_think() {
        // 32 prompt tokens (2 blocks of 16), 100 generated, the first 60 reasoning.
        // Blocks fill as tokens are computed (all but the newest): (32 + 100 - 1) / 16 = 8
        // full blocks, 6 of them output. Blocks 2, 3 and 4 end by token 80 <= 32 + 60:
        // reasoning; block 5 holds tokens 80-95, answer tokens among them.
        let mut scenario = scenario();
        scenario.worker.cache_output_blocks = true;
        scenario.worker.tiers[0].eviction = kvtwin::pool::EvictionPolicyKind::Priority;
        let mut thinker = request(0, 1000, 32, 100);
        thinker.think_tokens = 60;
        let report = simulate(&scenario, &[thinker.clone()]).unwrap();
        assert_eq!(
            report.output_blocks,
            Some(OutputBlocksReport {
                cached: 6,
                reasoning_cooled: 3,
            })
        );
        assert!(report.routing.view_matches_pools);
        assert!(report.events.rebuild_matches_pools);
        // Without output caching nothing is registered past the prompt, and the report
        // has no such section.
        scenario.worker.cache_output_blocks = false;
        let plain = simulate(&scenario, &[thinker]).unwrap();
        assert_eq!(plain.output_blocks, None);
        assert_eq!(report.events.stored_blocks, plain.events.stored_blocks + 6);
        assert!(!plain.to_json().contains("output_blocks"));
    }

    #[test]
    fn cached_outputs_need_decode_blocks_and_whole_prompt_blocks() {
        let mut text = String::from(
            r#"(name: "x", seed: 1,
            hardware: (name: "h", pcie_bytes_per_s: 1, pcie_latency_ns: 0,
                nvme_read_bytes_per_s: 1, nvme_write_bytes_per_s: 1, nvme_latency_ns: 0,
                nic_bytes_per_s: 1, nic_latency_ns: 0, prefill_ns_per_token: 1,
                decode_ns_per_token: 1, max_inflight_transfers: 1),
            worker: (block_size_tokens: 16, bytes_per_block: 1, onboard: CostAware,
                max_inflight_transfers: 1, tiers: [(tier: Device, capacity_blocks: 8)],
                cache_output_blocks: true, cache_partial_blocks: true),
            workload: MooncakeTrace(path: "t.jsonl"))"#,
        );
        let error = Scenario::parse(&text, Path::new("x.ron")).unwrap_err();
        assert!(error.to_string().contains("cache_output_blocks"), "{error}");
        text = text.replace(
            "cache_partial_blocks: true",
            "batching: (decode_blocks: false)",
        );
        assert!(Scenario::parse(&text, Path::new("x.ron")).is_err());
        text = text.replace("batching: (decode_blocks: false)", "");
        assert!(Scenario::parse(&text, Path::new("x.ron")).is_ok());
    }

    fn fault(at_ms: u64, kind: FaultKind) -> Fault {
        Fault { at_ms, kind }
    }

    /// 60 requests 500 µs apart over three workers, decodes long enough (60 tokens of
    /// 100 µs) that several are running on every worker at any time.
    fn faulty(faults: Vec<Fault>) -> (Scenario, Vec<Request>) {
        let mut scenario = cluster(3, Routing::Kv);
        scenario.faults = faults;
        (scenario, shared_prefix_requests(60, 500, 4, 3, 60))
    }

    #[test]
    fn a_crashed_workers_requests_finish_elsewhere_and_it_comes_back_empty() {
        let (scenario, requests) = faulty(vec![fault(
            10,
            FaultKind::WorkerCrash {
                worker: 1,
                down_ms: 10,
            },
        )]);
        let report = simulate(&scenario, &requests).unwrap();
        assert_eq!(report.completed, 60, "{report:?}");
        assert!(report.faults.requests_retried > 0, "{report:?}");
        assert_eq!(report.faults.applied, 1);
        assert!(report.routing.view_matches_pools);
        // It served before the crash and after it came back.
        assert!(report.routing.requests_per_worker[1] > report.faults.requests_retried);
        assert!(report.events.rebuild_matches_pools);
    }

    #[test]
    fn requests_wait_while_no_worker_is_up() {
        let (mut scenario, requests) = faulty(vec![fault(
            10,
            FaultKind::WorkerCrash {
                worker: 0,
                down_ms: 50,
            },
        )]);
        scenario.cluster.workers = 1;
        let report = simulate(&scenario, &requests).unwrap();
        assert_eq!(report.completed, 60);
        assert_eq!(report.faults.requests_unserved, 0);
        // Nothing was served between 10 and 60 ms: requests arriving then waited.
        assert!(report.ttft.max_ms > 20.0, "{report:?}");
        let mut round_robin = scenario.clone();
        round_robin.cluster.routing = Routing::RoundRobin;
        let report = simulate(&round_robin, &requests).unwrap();
        assert_eq!((report.completed, report.faults.requests_unserved), (60, 0));
        assert!(report.ttft.max_ms > 20.0, "{report:?}");
    }

    #[test]
    fn after_lost_events_heartbeats_and_snapshots_bring_the_router_back_in_line() {
        let loss = fault(
            10,
            FaultKind::EventLoss {
                probability: 0.5,
                for_ms: 60,
            },
        );
        let (mut scenario, requests) = faulty(vec![loss]);
        scenario.cluster.event_plane.heartbeat_ms = 5;
        let report = simulate(&scenario, &requests).unwrap();
        assert!(report.routing.events_dropped > 0);
        assert!(report.faults.snapshots > 0, "{report:?}");
        assert!(report.routing.view_matches_pools, "{report:?}");
        assert_eq!(report.completed, 60);
        // Without heartbeats the router never learns what it missed at the end.
        scenario.cluster.event_plane.heartbeat_ms = 0;
        scenario.faults[0].kind = FaultKind::EventLoss {
            probability: 1.0,
            for_ms: 1_000_000,
        };
        let report = simulate(&scenario, &requests).unwrap();
        assert!(!report.routing.view_matches_pools, "{report:?}");
    }

    #[test]
    fn a_restarted_router_rebuilds_its_view_from_snapshots() {
        let (scenario, requests) = faulty(vec![fault(60, FaultKind::RouterRestart)]);
        let report = simulate(&scenario, &requests).unwrap();
        assert_eq!(report.faults.snapshots, 3);
        assert!(report.routing.view_matches_pools, "{report:?}");
        assert_eq!(report.routing.events_rejected, 0);
        assert_eq!(report.completed, 60);
    }

    #[test]
    fn lagging_events_arrive_late_but_arrive() {
        let (scenario, requests) = faulty(vec![fault(
            5,
            FaultKind::EventLag {
                delay_us: 20_000,
                for_ms: 50,
            },
        )]);
        let report = simulate(&scenario, &requests).unwrap();
        assert_eq!(report.routing.events_applied, report.events.events);
        assert_eq!(report.faults.snapshots, 0);
        assert!(report.routing.view_matches_pools);
        // The events of those 50 ms went through the queue instead of straight through.
        let prompt = simulate(&faulty(Vec::new()).0, &requests).unwrap();
        assert!(report.engine_events > prompt.engine_events + 50);
    }

    #[test]
    fn a_slow_link_slows_the_copies_on_it_until_the_fault_ends() {
        // Write-back to host over a PCIe link slowed to a tenth for the whole run, or
        // for none of it.
        let run = |factor: f64| {
            let (mut scenario, requests) = faulty(vec![fault(
                0,
                FaultKind::LinkSlowdown {
                    worker: None,
                    link: Link::PcieDeviceToHost,
                    factor,
                    for_ms: 1_000_000,
                },
            )]);
            scenario.worker.tiers = tiers_with_write_back();
            scenario.worker.bytes_per_block = 1 << 20;
            simulate(&scenario, &requests).unwrap()
        };
        let (slow, normal) = (run(0.1), run(1.0));
        // Busy time per byte carried: ten times as long at a tenth of the speed. (It
        // carries fewer bytes too: blocks are evicted before their copies can start.)
        let per_byte = |r: &Report| {
            let link = r.links.iter().find(|l| l.link == "pcie_d2h").unwrap();
            link.utilisation / link.bytes as f64
        };
        let ratio = per_byte(&slow) / per_byte(&normal);
        assert!((9.0..11.0).contains(&ratio), "{ratio}");
        let carried = |r: &Report| r.links.iter().find(|l| l.link == "pcie_d2h").unwrap().bytes;
        assert!(carried(&slow) < carried(&normal));
        assert_eq!(slow.completed, 60);
    }

    /// Write-back to host and disk, 1 MiB blocks (a millisecond each on the 1 GB/s NVMe
    /// link, so copies are in flight at any time), every lower-tier hit onboarded, and
    /// from the tenth request on each one repeating the prompt of the one ten before it,
    /// by then written back and evicted: onboarded from host or disk.
    fn with_a_busy_disk(faults: Vec<Fault>) -> (Scenario, Vec<Request>) {
        let (mut scenario, mut requests) = faulty(faults);
        // A host small enough to write back to disk all the time.
        scenario.worker.tiers = tiers_with_write_back();
        scenario.worker.tiers[1].capacity_blocks = 12;
        scenario.worker.tiers[1].offload = OffloadPolicy::WriteBack {
            low_watermark_blocks: 4,
        };
        scenario.worker.bytes_per_block = 1 << 20;
        scenario.worker.onboard = kvtwin::manager::OnboardPolicy::Always;
        for i in 10..requests.len() {
            let earlier = requests[i - 10].blocks.clone();
            requests[i].blocks = earlier;
        }
        (scenario, requests)
    }

    #[test]
    fn a_failed_ssd_loses_its_blocks_is_never_read_while_down_and_comes_back_empty() {
        let (scenario, requests) = with_a_busy_disk(vec![fault(
            26,
            FaultKind::SsdFailure {
                worker: 0,
                down_ms: 10,
            },
        )]);
        // By 26 ms worker 0 has written some blocks back to disk and onboards from it;
        // the run lasts about 50 ms.
        let (fails, back) = (
            Timestamp::from_nanos(26_000_000),
            Timestamp::from_nanos(36_000_000),
        );
        // What worker 0's disk held just before the fault, what the manager had planned
        // to onboard from it when it failed, and what it had written when it came back.
        let mut held_before = 0;
        let mut at_failure = None;
        let mut written_at_return = None;
        let mut written_at_end = 0;
        let mut observed_down = 0;
        let report = simulate_observed(&scenario, requests.iter().cloned(), |sim| {
            let worker = &sim.workers[0];
            let manager = &worker.manager;
            let disk = manager.pool(Tier::Disk).unwrap().snapshot().registered;
            let stats = manager.stats();
            if sim.now < fails {
                held_before = disk.len();
            } else if sim.now < back {
                observed_down += 1;
                assert!(manager.tier_is_down(Tier::Disk));
                // Gone at once, from the pool and from the router's view of it.
                assert!(disk.is_empty(), "at {:?}: {disk:?}", sim.now);
                let view = sim.router.indexer().blocks_of(worker.key);
                assert!(
                    view.values()
                        .all(|tiers| tiers & (1 << Tier::Disk.index()) == 0),
                    "at {:?} the router still sees disk blocks",
                    sim.now
                );
                // Never planned from, never read, never written.
                let planned = stats.onboard_planned_blocks[Tier::Disk.index()];
                let then = *at_failure.get_or_insert((
                    planned,
                    stats.onboarded_blocks[Tier::Disk.index()],
                    stats.offloaded_blocks[Tier::Disk.index()],
                ));
                assert_eq!(
                    (
                        planned,
                        stats.onboarded_blocks[Tier::Disk.index()],
                        stats.offloaded_blocks[Tier::Disk.index()]
                    ),
                    then,
                    "at {:?}",
                    sim.now
                );
            } else {
                assert!(!manager.tier_is_down(Tier::Disk));
                if written_at_return.is_none() {
                    assert!(disk.is_empty(), "it comes back empty");
                }
                written_at_return.get_or_insert(stats.offloaded_blocks[Tier::Disk.index()]);
                written_at_end = stats.offloaded_blocks[Tier::Disk.index()];
            }
        })
        .unwrap();
        assert!(held_before > 0, "the disk held nothing to lose");
        assert!(observed_down > 10, "{observed_down} events while down");
        assert_eq!(
            report.faults.disk_blocks_lost, held_before as u64,
            "{report:?}"
        );
        assert!(report.faults.disk_transfers_failed > 0, "{report:?}");
        // Used again once back.
        assert!(
            written_at_end > written_at_return.unwrap_or(u64::MAX),
            "{report:?}"
        );
        // Converged: every request served, the router's view exact.
        assert_eq!(report.completed, 60);
        assert_eq!(report.faults.applied, 1);
        assert!(report.routing.view_matches_pools, "{report:?}");
        assert!(report.events.rebuild_matches_pools);
        assert_eq!(report.routing.events_rejected, 0, "{report:?}");
        assert!(report
            .to_string()
            .contains(&format!("SSD failures lost {held_before} disk blocks")));
        // The same run again gives the same report.
        assert_eq!(
            report.to_json(),
            simulate(&scenario, &requests).unwrap().to_json()
        );
    }

    #[test]
    fn an_ssd_failure_needs_a_disk_tier() {
        let mut scenario = faulty(Vec::new()).0;
        scenario.faults = vec![fault(
            1,
            FaultKind::SsdFailure {
                worker: 0,
                down_ms: 1,
            },
        )];
        let text = ron::to_string(&scenario).unwrap();
        let error = Scenario::parse(&text, Path::new("f.ron")).unwrap_err();
        assert!(error.to_string().contains("disk tier"), "{error}");
        scenario.worker.tiers = tiers_with_write_back();
        let text = ron::to_string(&scenario).unwrap();
        assert!(Scenario::parse(&text, Path::new("f.ron")).is_ok());
    }

    #[test]
    fn a_fault_naming_a_missing_worker_is_an_error() {
        let mut scenario = faulty(Vec::new()).0;
        scenario.faults = vec![fault(
            1,
            FaultKind::WorkerCrash {
                worker: 7,
                down_ms: 1,
            },
        )];
        let text = ron::to_string(&scenario).unwrap();
        let error = Scenario::parse(&text, Path::new("f.ron")).unwrap_err();
        assert!(
            error.to_string().starts_with("f.ron: faults[0]:"),
            "{error}"
        );
    }
    /// `prefill` prefill workers and `decode` decode workers of `scenario()` (1 GB/s
    /// NICs with `nic_latency_ns`), frames of `frame_blocks` blocks, no switch.
    fn disaggregated(prefill: usize, decode: usize, frame_blocks: usize) -> Scenario {
        let mut scenario = cluster(prefill + decode, Routing::RoundRobin);
        scenario.hardware.nic_latency_ns = 5_000;
        scenario.cluster.disaggregation = Some(Disaggregation {
            prefill_workers: prefill,
            frame_blocks,
            switch_bytes_per_s: 0,
            switch_latency_ns: 0,
        });
        scenario
    }

    /// Nanoseconds as the report's milliseconds.
    fn ms(ns: u64) -> f64 {
        ns as f64 / 1e6
    }

    #[test]
    fn a_disaggregated_request_prefills_hands_off_over_the_nic_and_decodes_elsewhere() {
        // 96 prompt tokens (6 blocks of 1,024 bytes), 3 out. The prefill worker's pass
        // takes 96 µs: the first token lands then. The handoff is one MRDN frame of
        // 6 × 1,024 + 32 = 6,176 bytes: 6,176 ns at 1 GB/s, then 5 µs of NIC latency,
        // so the decode worker has the prompt at 107,176 ns and decodes two tokens at
        // 100 µs a pass.
        let report = simulate(&disaggregated(1, 1, 16), &[request(0, 1000, 96, 3)]).unwrap();
        assert_eq!(report.completed, 1);
        assert_eq!(report.ttft.max_ms, ms(96_000));
        let landed = 96_000 + 6_176 + 5_000;
        assert_eq!(report.end_to_end.max_ms, ms(landed + 200_000));
        assert_eq!(report.tpot.max_ms, ms((landed + 200_000 - 96_000) / 2));
        let d = report.disaggregation.as_ref().unwrap();
        assert_eq!(
            (d.handoffs, d.frames, d.bytes, d.header_bytes),
            (1, 1, 6_176, 32)
        );
        assert_eq!(d.handoff_latency.max_ms, ms(6_176 + 5_000));
        assert_eq!(d.handoff_wait.max_ms, 0.0);
        assert_eq!(d.handed_off_per_prefill_worker, vec![1]);
        assert_eq!(d.received_per_decode_worker, vec![1]);
        assert_eq!(report.routing.requests_per_worker, vec![1, 0]);
        // Both workers registered the prompt's six blocks and told the router.
        assert_eq!(report.events.stored_blocks, 12);
        assert!(report.routing.view_matches_pools);
        assert!(report.events.rebuild_matches_pools);
        let nic_in = d.links.iter().find(|l| l.link == "nic_in").unwrap();
        assert_eq!((nic_in.bytes, nic_in.transfers), (6_176, 1));
        // Frames of 4 blocks: 4,128 and 2,080 bytes sent at once, through together
        // when all 6,208 bytes are (the link never idles), then the latency.
        let report = simulate(&disaggregated(1, 1, 4), &[request(0, 1000, 96, 3)]).unwrap();
        let d = report.disaggregation.as_ref().unwrap();
        assert_eq!((d.frames, d.bytes), (2, 6_208));
        assert_eq!(d.handoff_latency.max_ms, ms(6_208 + 5_000));
        assert_eq!(
            report.end_to_end.max_ms,
            ms(96_000 + 6_208 + 5_000 + 200_000)
        );
        // One output token: done on the prefill worker, nothing handed off.
        let report = simulate(&disaggregated(1, 1, 16), &[request(0, 1000, 96, 1)]).unwrap();
        let d = report.disaggregation.as_ref().unwrap();
        assert_eq!(
            (report.completed, d.handoffs, d.finished_at_prefill),
            (1, 0, 1)
        );
    }

    #[test]
    fn two_handoffs_into_one_decode_worker_share_its_nic_in() {
        // Two prefill workers (round-robin) finish their prompts at 96 µs and both hand
        // off to the one decode worker: 6,176 bytes each through its 1 GB/s NIC in at
        // half speed, twice as long as one alone.
        let requests = [request(0, 1000, 96, 3), request(1, 2000, 96, 3)];
        let report = simulate(&disaggregated(2, 1, 16), &requests).unwrap();
        let d = report.disaggregation.as_ref().unwrap();
        assert_eq!(d.received_per_decode_worker, vec![2]);
        assert_eq!(d.handoff_latency.p50_ms, ms(2 * 6_176 + 5_000));
        assert_eq!(d.handoff_latency.max_ms, ms(2 * 6_176 + 5_000));
        let nic_in = d.links.iter().find(|l| l.link == "nic_in").unwrap();
        assert_eq!(nic_in.bytes, 2 * 6_176);
        // Two decode workers: one handoff each (the fewer requests, then the lower
        // index), no sharing.
        let report = simulate(&disaggregated(2, 2, 16), &requests).unwrap();
        let d = report.disaggregation.as_ref().unwrap();
        assert_eq!(d.received_per_decode_worker, vec![1, 1]);
        assert_eq!(d.handoff_latency.max_ms, ms(6_176 + 5_000));
        // A switch slower than the NICs limits both, wherever they go.
        let mut switched = disaggregated(2, 2, 16);
        if let Some(d) = switched.cluster.disaggregation.as_mut() {
            d.switch_bytes_per_s = 500_000_000;
            d.switch_latency_ns = 1_000;
        }
        let report = simulate(&switched, &requests).unwrap();
        let d = report.disaggregation.as_ref().unwrap();
        assert_eq!(d.handoff_latency.max_ms, ms(4 * 6_176 + 6_000));
        assert!(d
            .links
            .iter()
            .any(|l| l.link == "switch" && l.bytes == 2 * 6_176));
    }

    #[test]
    fn a_slowed_nic_slows_the_handoffs_through_it() {
        // The decode node's NIC in at half speed for the whole run: 12,352 ns of wire.
        let mut scenario = disaggregated(1, 1, 16);
        scenario.faults = vec![fault(
            0,
            FaultKind::LinkSlowdown {
                worker: Some(1),
                link: Link::NicIn,
                factor: 0.5,
                for_ms: 1_000,
            },
        )];
        let report = simulate(&scenario, &[request(0, 1000, 96, 3)]).unwrap();
        let d = report.disaggregation.as_ref().unwrap();
        assert_eq!(d.handoff_latency.max_ms, ms(2 * 6_176 + 5_000));
    }

    #[test]
    fn a_handoff_waits_for_blocks_on_its_decode_worker() {
        // Twelve device blocks a worker. A (96 tokens, 80 out) decodes on the decode
        // worker from 102,176 ns on and holds 8 blocks by the time B (96 tokens: 6
        // blocks) is prefilled at 2.096 ms, so B's handoff waits until A is done, at
        // 102,176 ns + 79 passes of 100 µs, and lands 6,176 ns later.
        let mut scenario = disaggregated(1, 1, 16);
        scenario.hardware.nic_latency_ns = 0;
        scenario.worker.tiers[0].capacity_blocks = 12;
        let mut late = request(1, 2000, 96, 2);
        late.arrival = Timestamp::from_nanos(2_000_000);
        let report = simulate(&scenario, &[request(0, 1000, 96, 80), late]).unwrap();
        assert_eq!(report.completed, 2);
        let d = report.disaggregation.as_ref().unwrap();
        assert_eq!(d.waits_for_decode_blocks, 1);
        let a_done = 102_176 + 79 * 100_000;
        assert_eq!(d.handoff_wait.max_ms, ms(a_done - 2_096_000));
        // End to end: A's and B's, whose one decode pass follows its handoff.
        let b_done = a_done + 6_176 + 100_000;
        assert_eq!(report.end_to_end.max_ms, ms(a_done));
        assert_eq!(
            report.end_to_end.mean_ms,
            ms((a_done + b_done - 2_000_000) / 2)
        );
        assert!(report.routing.view_matches_pools);
    }

    #[test]
    fn a_decode_worker_out_of_blocks_preempts_and_recomputes_locally() {
        // Two long decodes on one decode worker of 10 blocks: the newer steps back,
        // prefills its prompt (still cached there) and tokens again, and finishes.
        let mut scenario = disaggregated(1, 1, 16);
        scenario.worker.tiers[0].capacity_blocks = 10;
        let requests = [request(0, 1000, 32, 100), request(1, 2000, 32, 100)];
        let report = simulate(&scenario, &requests).unwrap();
        assert_eq!(report.completed, 2);
        assert!(report.preemptions >= 1, "{report:?}");
        let d = report.disaggregation.as_ref().unwrap();
        assert_eq!(d.handoffs, 2);
        assert!(report.routing.view_matches_pools);
        assert!(report.events.rebuild_matches_pools);
    }

    #[test]
    fn disaggregated_runs_are_deterministic_and_the_router_sees_both_pools() {
        let mut scenario = disaggregated(2, 2, 4);
        scenario.cluster.routing = Routing::Kv;
        scenario.cluster.event_plane.delay_us = 50;
        scenario.worker.tiers = tiers_with_write_back();
        let requests = shared_prefix_requests(40, 150, 6, 3, 30);
        let decode_key = WorkerKey {
            worker: WorkerId::new(3),
            dp_rank: 0,
        };
        let mut decode_view = 0;
        let report = simulate_observed(&scenario, requests.iter().cloned(), |sim| {
            decode_view = sim.router.indexer().blocks_of(decode_key).len();
        })
        .unwrap();
        assert_eq!(report.completed, 40);
        assert!(
            decode_view > 0,
            "the decode worker's blocks reach the router"
        );
        assert!(report.routing.view_matches_pools, "{report:?}");
        assert!(report.events.rebuild_matches_pools);
        assert_eq!(report.routing.events_rejected, 0);
        // Only the prefill pool is routed to, and both decode workers decode.
        assert_eq!(report.routing.requests_per_worker[2..], [0, 0]);
        let d = report.disaggregation.as_ref().unwrap();
        assert!(d.received_per_decode_worker.iter().all(|n| *n > 0), "{d:?}");
        assert_eq!(d.handoffs, 40);
        assert!(report
            .to_string()
            .contains("disagg    2 prefill + 2 decode workers"));
        assert_eq!(
            report.to_json(),
            simulate(&scenario, &requests).unwrap().to_json()
        );
        // Aggregated, the report has no such section at all.
        scenario.cluster.disaggregation = None;
        let aggregated = simulate(&scenario, &requests).unwrap();
        assert!(aggregated.disaggregation.is_none());
        assert!(!aggregated.to_json().contains("disaggregation"));
        assert!(!aggregated.to_string().contains("disagg"));
    }

    /// What a test watches after every event: the time, the blocks held on `worker`'s
    /// device, and the handoff frames on the fabric.
    fn watch(sim: &Sim, worker: usize) -> (u64, usize, usize) {
        (
            sim.now.as_nanos(),
            sim.workers[worker].manager.device().counts().active,
            sim.disagg.as_ref().map_or(0, |d| d.frames_in_flight.len()),
        )
    }

    /// The last of `watched` by `ns`: (blocks held, frames in flight) then.
    fn watched_at(watched: &[(u64, usize, usize)], ns: u64) -> (usize, usize) {
        watched
            .iter()
            .rev()
            .find(|(now, ..)| *now <= ns)
            .map(|(_, active, frames)| (*active, *frames))
            .unwrap_or_default()
    }

    /// What holds at every instant, crashes or not: nothing lives on a worker that is
    /// down, every handoff's ends are up and hold it (the prefill worker sending, the
    /// decode worker receiving or queueing it), and every frame on the fabric belongs
    /// to a handoff.
    fn check_handoffs(sim: &Sim) {
        for (w, worker) in sim.workers.iter().enumerate() {
            if !worker.up {
                assert!(worker.states.is_empty() && worker.waiting.is_empty(), "{w}");
                assert!(worker.pass.is_none(), "{w}");
            }
        }
        let Some(disagg) = sim.disagg.as_ref() else {
            return;
        };
        for (i, handoff) in &disagg.handoffs {
            let from = &sim.workers[handoff.from];
            assert!(from.up, "handoff {i} from a crashed worker");
            assert!(matches!(from.states.get(i), Some(State::Sending { .. })));
            match handoff.to {
                Some(d) => {
                    let to = &sim.workers[d];
                    assert!(to.up, "handoff {i} to a crashed worker");
                    assert!(
                        matches!(to.states.get(i), Some(State::Receiving { .. }))
                            || to.waiting.contains(i)
                    );
                }
                None => assert!(disagg.unassigned.contains(i)),
            }
        }
        for frame in disagg.frames_in_flight.values() {
            assert!(disagg.handoffs.contains_key(&frame.request));
        }
    }

    #[test]
    fn a_prefill_worker_crashing_mid_handoff_aborts_its_frames_and_the_request_is_prefilled_elsewhere(
    ) {
        // Two prefill workers, one decode worker, blocks of 1 MiB in frames of two. A (96
        // tokens: 6 blocks, 3 out) is prefilled on worker 0 by 96 µs (its first token
        // then) and its three frames of 2,097,184 bytes share the NICs; at 1 ms, 904,000
        // bytes through, worker 0 crashes. The frames are aborted, worker 2 gives back
        // the 6 blocks it reserved, and A goes to worker 1: 96 prompt tokens and the one
        // generated, 97 µs, so its second token at 1.097 ms. The new handoff carries 7
        // blocks (the generated token's KV spills into a seventh), 2+2+2+1 in four
        // frames, 7,340,160 bytes through by 8,437,160 ns and landed 5 µs later; then
        // one decode pass of 100 µs.
        let mut scenario = disaggregated(2, 1, 2);
        scenario.worker.bytes_per_block = 1 << 20;
        scenario.faults = vec![fault(
            1,
            FaultKind::WorkerCrash {
                worker: 0,
                down_ms: 10,
            },
        )];
        let mut watched = Vec::new();
        let report = simulate_observed(&scenario, [request(0, 1000, 96, 3)], |sim| {
            check_handoffs(sim);
            watched.push(watch(sim, 2));
        })
        .unwrap();
        assert_eq!(report.completed, 1);
        assert_eq!(report.ttft.max_ms, ms(96_000));
        let landed = 1_097_000 + 7_340_160 + 5_000;
        assert_eq!(report.end_to_end.max_ms, ms(landed + 100_000));
        assert_eq!(report.faults.requests_retried, 1);
        assert_eq!(report.routing.requests_per_worker, vec![1, 1, 0]);
        let d = report.disaggregation.as_ref().unwrap();
        assert_eq!((d.handoffs_aborted, d.frames_aborted), (1, 3));
        assert_eq!((d.handoffs, d.frames), (1, 3 + 4));
        assert_eq!(d.bytes, 3 * 2_097_184 + 7_340_160);
        assert_eq!(d.handed_off_per_prefill_worker, vec![1, 1]);
        assert_eq!(d.received_per_decode_worker, vec![1]);
        assert_eq!(d.handoff_latency.max_ms, ms(7_340_160 + 5_000));
        // Only the bytes that went through before the crash count on the NIC.
        let nic_in = d.links.iter().find(|l| l.link == "nic_in").unwrap();
        assert!(
            nic_in.bytes.abs_diff(904_000 + 7_340_160) <= 3,
            "{}",
            nic_in.bytes
        );
        assert!(report.to_string().contains("1 handoffs aborted by crashes"));
        // Worker 2 held the 6 blocks of the first handoff until the crash, none until
        // the second, then 7.
        let at = |ns: u64| watched_at(&watched, ns);
        assert_eq!(at(999_999), (6, 3));
        assert_eq!(at(1_000_000), (0, 0));
        assert_eq!(at(1_097_000), (7, 4));
        assert!(report.routing.view_matches_pools, "{report:?}");
        assert!(report.events.rebuild_matches_pools);
    }

    #[test]
    fn a_crashed_decode_workers_requests_are_prefilled_again_and_decoded_elsewhere() {
        // One prefill worker, two decode workers: A (96 tokens, 3 out) goes to worker 1.
        // Receiving: 1 MiB blocks, one frame of 6,291,488 bytes, not in by 1 ms, when
        // worker 1 crashes. The frame is aborted and worker 0 lets A's blocks go; A is
        // prefilled there again, hitting 5 of its own blocks (the last is computed to
        // produce a token): 16 tokens and its generated one, 17 µs. Its 7 blocks (the
        // generated token's KV too) go to worker 2 in one frame of 7,340,064 bytes, and
        // it decodes its last token there.
        let mut receiving = disaggregated(1, 2, 16);
        receiving.worker.bytes_per_block = 1 << 20;
        receiving.faults = vec![fault(
            1,
            FaultKind::WorkerCrash {
                worker: 1,
                down_ms: 50,
            },
        )];
        let mut active = Vec::new();
        let report = simulate_observed(&receiving, [request(0, 1000, 96, 3)], |sim| {
            check_handoffs(sim);
            active.push(watch(sim, 0));
        })
        .unwrap();
        assert_eq!(report.completed, 1);
        let landed = 1_017_000 + 7_340_064 + 5_000;
        assert_eq!(report.end_to_end.max_ms, ms(landed + 100_000));
        assert_eq!(report.faults.requests_retried, 1);
        assert_eq!(report.blocks.computed, 6, "counted once, when first served");
        let d = report.disaggregation.as_ref().unwrap();
        assert_eq!((d.handoffs_aborted, d.frames_aborted), (1, 1));
        assert_eq!((d.handoffs, d.frames), (1, 2));
        assert_eq!(d.received_per_decode_worker, vec![0, 1]);
        assert_eq!(d.handed_off_per_prefill_worker, vec![2]);
        // Worker 0 held A's 6 blocks while sending, and let them go at the crash: the
        // retry takes 5 of them back, cached, and a new one, and sends its frame.
        assert_eq!(watched_at(&active, 999_999), (6, 1));
        assert_eq!(watched_at(&active, 1_000_000), (6, 0));
        assert_eq!(watched_at(&active, 1_017_000), (6, 1));
        assert!(report.routing.view_matches_pools, "{report:?}");
        assert!(report.events.rebuild_matches_pools);
        // Decoding: 1 KiB blocks, A (30 out) lands on worker 1 at 107,176 ns and has
        // generated 9 tokens by 1 ms (a pass every 100 µs from 107,176 ns; the one in
        // flight then is dropped with the crash). Prefilled again: 16 + 9 tokens, 25 µs;
        // 7 blocks in 7,200 bytes to worker 2 by 1,037,200 ns; 20 more passes.
        let mut decoding = disaggregated(1, 2, 16);
        decoding.faults = receiving.faults.clone();
        let report =
            simulate_observed(&decoding, [request(0, 1000, 96, 30)], check_handoffs).unwrap();
        assert_eq!(report.completed, 1);
        assert_eq!(report.ttft.max_ms, ms(96_000));
        assert_eq!(
            report.end_to_end.max_ms,
            ms(1_025_000 + 7_200 + 5_000 + 20 * 100_000)
        );
        let d = report.disaggregation.as_ref().unwrap();
        // Nothing was in flight: the handoff had landed.
        assert_eq!((d.handoffs_aborted, d.frames_aborted), (0, 0));
        assert_eq!(d.received_per_decode_worker, vec![1, 1]);
        assert_eq!(report.faults.requests_retried, 1);
        // 8 decode passes on worker 1 (the ninth dropped), 20 on worker 2, 2 prefills.
        assert_eq!(report.passes, 8 + 20 + 2);
        assert!(report.routing.view_matches_pools, "{report:?}");
        assert!(report.events.rebuild_matches_pools);
    }

    #[test]
    fn handoffs_wait_while_no_decode_worker_is_up_and_go_when_it_is_back() {
        // One decode worker, down from 1 to 6 ms. A (96 tokens, 30 out) decoding there
        // has 9 tokens at the crash and is prefilled again by 1,025,000 ns; B (96 tokens,
        // 3 out) arrives at 2 ms and is prefilled by 2,096,000 ns. Both handoffs wait,
        // their blocks held on the prefill worker, and go at 6 ms, in that order, sharing
        // worker 1's NIC: B's 6,176 bytes through at 12,352 ns, A's 7,200 at 13,376 ns,
        // each landing 5 µs later. B decodes alone from 6,017,352 ns, then with A: B is
        // done at 6,217,352 ns, A 19 passes later.
        let mut scenario = disaggregated(1, 1, 16);
        scenario.faults = vec![fault(
            1,
            FaultKind::WorkerCrash {
                worker: 1,
                down_ms: 5,
            },
        )];
        let mut late = request(1, 2000, 96, 3);
        late.arrival = Timestamp::from_nanos(2_000_000);
        let requests = [request(0, 1000, 96, 30), late];
        let mut held = Vec::new();
        let report = simulate_observed(&scenario, requests.iter().cloned(), |sim| {
            check_handoffs(sim);
            held.push(watch(sim, 0));
        })
        .unwrap();
        assert_eq!((report.completed, report.faults.requests_unserved), (2, 0));
        let (a_done, b_done) = (6_217_352 + 19 * 100_000, 6_217_352);
        assert_eq!(report.end_to_end.max_ms, ms(a_done));
        assert_eq!(
            report.end_to_end.mean_ms,
            ms((a_done + b_done - 2_000_000) / 2)
        );
        let d = report.disaggregation.as_ref().unwrap();
        assert_eq!(d.handoffs, 1 + 2);
        assert_eq!(d.received_per_decode_worker, vec![3]);
        assert_eq!(d.handoff_wait.max_ms, ms(6_000_000 - 1_025_000));
        assert_eq!(d.waits_for_decode_blocks, 0);
        // The prefill worker held both prompts (6 blocks each) while no decode worker
        // was up, and sent both when it came back.
        assert_eq!(watched_at(&held, 5_999_999), (12, 0));
        assert_eq!(watched_at(&held, 6_000_000), (12, 2));
        assert_eq!(watched_at(&held, 6_018_376), (0, 0));
        assert!(report.routing.view_matches_pools, "{report:?}");
        assert!(report.events.rebuild_matches_pools);
    }

    #[test]
    fn disaggregated_crashes_are_deterministic_and_the_cluster_converges() {
        // Both pools lose workers, one after another, with handoffs in flight (64 KiB
        // blocks take the fabric a while), and for a millisecond neither decode worker
        // is up.
        let mut scenario = disaggregated(2, 2, 4);
        scenario.cluster.routing = Routing::Kv;
        scenario.cluster.event_plane.delay_us = 50;
        scenario.worker.tiers = tiers_with_write_back();
        scenario.worker.bytes_per_block = 64 << 10;
        let crash = |at_ms: u64, worker: usize, down_ms: u64| {
            fault(at_ms, FaultKind::WorkerCrash { worker, down_ms })
        };
        scenario.faults = vec![
            crash(1, 0, 2),
            crash(2, 2, 2),
            crash(3, 3, 2),
            crash(4, 1, 1),
        ];
        let requests = shared_prefix_requests(40, 150, 6, 3, 30);
        let mut unassigned_max = 0;
        let report = simulate_observed(&scenario, requests.iter().cloned(), |sim| {
            check_handoffs(sim);
            let unassigned = sim.disagg.as_ref().map_or(0, |d| d.unassigned.len());
            unassigned_max = unassigned_max.max(unassigned);
        })
        .unwrap();
        assert!(unassigned_max > 0, "handoffs waited for a decode worker");
        assert_eq!(report.completed, 40, "{report:?}");
        assert_eq!(report.faults.requests_unserved, 0);
        assert!(report.faults.requests_retried > 0, "{report:?}");
        let d = report.disaggregation.as_ref().unwrap();
        assert!(d.handoffs_aborted > 0 && d.frames_aborted > 0, "{d:?}");
        // Every request was handed off once to the end, besides the aborted ones.
        assert_eq!(
            d.handed_off_per_prefill_worker.iter().sum::<u64>(),
            d.handoffs + d.handoffs_aborted
        );
        assert!(report.routing.view_matches_pools, "{report:?}");
        assert!(report.events.rebuild_matches_pools);
        assert_eq!(
            report.to_json(),
            simulate(&scenario, &requests).unwrap().to_json()
        );
    }

    #[test]
    fn disaggregation_needs_both_pools_and_frames_of_a_block() {
        let check = |prefill: usize, frame_blocks: usize| {
            let mut scenario = disaggregated(1, 1, 16);
            if let Some(d) = scenario.cluster.disaggregation.as_mut() {
                d.prefill_workers = prefill;
                d.frame_blocks = frame_blocks;
            }
            let text = ron::to_string(&scenario).unwrap();
            Scenario::parse(&text, Path::new("d.ron")).map(|_| ())
        };
        assert!(check(1, 16).is_ok());
        for prefill in [0, 2, 3] {
            let error = check(prefill, 16).unwrap_err().to_string();
            assert!(
                error.starts_with("d.ron: cluster: disaggregation.prefill_workers"),
                "{error}"
            );
        }
        let error = check(1, 0).unwrap_err().to_string();
        assert!(error.contains("frame_blocks"), "{error}");
        // A scenario built in code is checked by the run too.
        let mut scenario = disaggregated(1, 1, 16);
        scenario.cluster.workers = 1;
        assert!(matches!(
            simulate(&scenario, &[request(0, 1000, 96, 3)]),
            Err(SimError::EmptyPool { .. })
        ));
    }
}
