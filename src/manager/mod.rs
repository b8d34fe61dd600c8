//! The tier manager: one pool per present tier, and the moves between them.
//!
//! Owns: [`Manager`], which answers prefix lookups with a [`LookupPlan`], onboards
//! lower-tier hits into device blocks (cost-aware), offloads registered blocks down
//! (write-through or write-back per tier), tracks transfers in flight, and numbers the
//! pools' events into one per-worker stream. A lower tier can fail and come back
//! ([`Manager::fail_tier`], [`Manager::restore_tier`]): while it is down nothing is
//! copied to it or onboarded from it.
//!
//! Architecture invariant: the manager is sans-IO. It never reads a clock (every input
//! takes `now`), never blocks and never spawns; bytes move only through
//! [`Hardware::submit`], and completions come back through
//! [`Manager::handle_completions`].
//! Never: publish events itself (drivers drain `take_events`), or hold a sink.

mod config;
mod plan;

pub use config::{ManagerConfig, ManagerConfigError, OffloadPolicy, OnboardPolicy, TierConfig};
pub use plan::{LookupPlan, ManagerOutput};

use crate::block::{BlockIdentity, Complete, Reset};
use crate::events::{KvCacheEvent, KvCacheEventData, StoredBlock};
use crate::hardware::{Completion, Hardware, SubmitError, TransferError, TransferRequest};
use crate::ids::{RequestId, SequenceHash, Timestamp, TransferId};
use crate::phase::Phase;
use crate::pool::{
    AllocError, BlockChain, BlockPool, ImmutableBlock, MutableBlock, PoolConfig, ResetError,
    SharedCounters,
};
use crate::sync::Arc;
use crate::tier::Tier;
use rustc_hash::FxHashSet;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::Ordering;
use std::time::Duration;

/// `start_onboard` could not start.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OnboardError {
    /// Not enough device blocks for the onboarded copies.
    #[error(transparent)]
    Alloc(#[from] AllocError),
    /// The hardware refused the first transfer.
    #[error(transparent)]
    Submit(#[from] SubmitError),
    /// Too many transfers in flight.
    #[error("{in_flight} transfers in flight, at most {max}")]
    TooManyTransfers {
        /// In flight now.
        in_flight: usize,
        /// The configured bound.
        max: usize,
    },
    /// The request already has an onboarding in flight.
    #[error("request {0:?} is already onboarding")]
    AlreadyOnboarding(RequestId),
}

/// `reset_cache` refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ClearError {
    /// A pool still has referenced registered blocks.
    #[error("{tier}: {source}")]
    InUse {
        /// The tier.
        tier: Tier,
        /// The pool's refusal.
        source: ResetError,
    },
    /// Transfers are still in flight.
    #[error("{0} transfers in flight")]
    TransfersInFlight(usize),
}

/// `fail_tier` or `restore_tier` refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TierFaultError {
    /// The manager has no such tier.
    #[error("tier {0} is not configured")]
    NotPresent(Tier),
    /// The device tier does not fail on its own: a worker whose GPU fails has crashed.
    #[error("the device tier cannot fail alone")]
    Device,
}

/// What [`Manager::fail_tier`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TierFailure {
    /// Registered blocks the tier lost, each announced in a `Removed` event.
    pub blocks_lost: usize,
    /// Transfers to or from the tier that were still in flight here, failed through the
    /// ordinary failure path (none when the hardware already reported them failed).
    pub transfers_failed: usize,
}

/// Cumulative counters of a manager.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManagerStats {
    /// Lookups answered.
    pub lookups: u64,
    /// Full blocks asked for by lookups.
    pub lookup_blocks: u64,
    /// Blocks found on device.
    pub device_hit_blocks: u64,
    /// Lower-tier hits planned for onboarding, per source tier (index = `Tier::index`).
    pub onboard_planned_blocks: [u64; 4],
    /// Blocks onboarded successfully, per source tier.
    pub onboarded_blocks: [u64; 4],
    /// Onboarded blocks whose transfer failed.
    pub onboard_failed_blocks: u64,
    /// Lower-tier hits recomputed because that was cheaper.
    pub recomputed_hit_blocks: u64,
    /// Blocks copied down, per destination tier.
    pub offloaded_blocks: [u64; 4],
    /// Blocks not offloaded (destination full of referenced blocks or down, or too many
    /// transfers in flight).
    pub offload_skipped_blocks: u64,
    /// Offloaded blocks whose transfer failed.
    pub offload_failed_blocks: u64,
    /// Lower-tier blocks forgotten because a transfer read them back corrupt (checksum
    /// mismatch): never offered again, so a fresh copy can take their place.
    #[serde(default)]
    pub corrupt_blocks_forgotten: u64,
    /// Blocks not offloaded because this worker holds their parent in no tier: prefix
    /// lookups cannot reach them, and a router would refuse their `Stored` event.
    pub orphans_not_offloaded: u64,
    /// Transfers submitted.
    pub transfers_submitted: u64,
    /// Bytes in submitted transfers.
    pub bytes_submitted: u64,
}

#[derive(Debug)]
enum Segment {
    Pending,
    Done(BlockChain),
    Failed(usize),
}

#[derive(Debug)]
struct OnboardJob {
    segments: Vec<Segment>,
    pending: usize,
}

#[derive(Debug)]
enum InFlight {
    Onboard {
        request: RequestId,
        segment: usize,
        sources: Vec<ImmutableBlock>,
        targets: Vec<MutableBlock<Reset>>,
    },
    Offload {
        sources: Vec<ImmutableBlock>,
        targets: Vec<MutableBlock<Reset>>,
        policy: OffloadPolicy,
    },
}

impl InFlight {
    /// The tiers the transfer reads from and writes to.
    fn tiers(&self) -> (Tier, Tier) {
        match self {
            InFlight::Onboard { sources, .. } => (
                sources.first().map_or(Tier::Device, ImmutableBlock::tier),
                Tier::Device,
            ),
            InFlight::Offload {
                sources, targets, ..
            } => (
                sources.first().map_or(Tier::Device, ImmutableBlock::tier),
                targets.first().map_or(Tier::Device, MutableBlock::tier),
            ),
        }
    }
}

/// The block manager of one worker, generic over the hardware that moves its bytes.
///
/// # Driving it
/// Every input takes `now`, which must never go backwards. After each batch of inputs
/// (`lookup`, `start_onboard`, `allocate`, `register`, `set_phase`) a driver:
/// 1. calls [`Manager::handle_completions`] with the current time;
/// 2. drains [`Manager::poll_output`] until it returns `None`;
/// 3. drains [`Manager::take_events`] and publishes them in order;
/// 4. sleeps until [`Manager::poll_timeout`] (or until its backend wakes it).
#[derive(Debug)]
pub struct Manager<H: Hardware> {
    hardware: H,
    config: ManagerConfig,
    pools: [Option<BlockPool>; 4],
    in_flight: BTreeMap<TransferId, InFlight>,
    onboarding: BTreeMap<RequestId, OnboardJob>,
    // Blocks being copied into a tier, so a block is never copied twice at once.
    /// Copies on their way down (membership only: never iterated).
    offloading: FxHashSet<(Tier, SequenceHash)>,
    writeback_pinned: [usize; 4],
    // Per tier, what the write-back pump last saw when it found nothing more to copy.
    /// Per write-back tier, the pools' change count when its pump last found nothing to
    /// do: until it moves, the answer is the same.
    writeback_seen: [Option<u64>; 4],
    /// The pools' counters: event order and change count.
    counters: Arc<SharedCounters>,
    /// The event count when the pools' outboxes were last emptied.
    events_collected: u64,
    outputs: VecDeque<ManagerOutput>,
    events: Vec<KvCacheEvent>,
    next_event_id: u64,
    stats: ManagerStats,
    /// Tiers that failed and have not come back (index: `Tier::index`).
    down: [bool; 4],
    last_now: Timestamp,
}

impl<H: Hardware> Manager<H> {
    /// A manager with every block of every tier free.
    pub fn new(hardware: H, config: ManagerConfig) -> Result<Self, ManagerConfigError> {
        config.validate()?;
        let mut pools: [Option<BlockPool>; 4] = Default::default();
        let counters = Arc::new(SharedCounters::default());
        for tier in &config.tiers {
            let pool = BlockPool::new(PoolConfig {
                tier: tier.tier,
                capacity_blocks: tier.capacity_blocks,
                block_size_tokens: config.block_size_tokens,
                eviction: tier.eviction,
            })
            .map_err(|source| ManagerConfigError::Pool {
                tier: tier.tier,
                source,
            })?;
            pool.share_counters(counters.clone());
            pools[tier.tier.index()] = Some(pool);
        }
        Ok(Self {
            hardware,
            config,
            pools,
            in_flight: BTreeMap::new(),
            onboarding: BTreeMap::new(),
            offloading: FxHashSet::default(),
            writeback_pinned: [0; 4],
            writeback_seen: [None; 4],
            counters,
            events_collected: 0,
            outputs: VecDeque::new(),
            events: Vec::new(),
            next_event_id: 0,
            stats: ManagerStats::default(),
            down: [false; 4],
            last_now: Timestamp::ZERO,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ManagerConfig {
        &self.config
    }

    /// The hardware.
    pub fn hardware(&self) -> &H {
        &self.hardware
    }

    /// The hardware, mutably (drivers inject faults or poke backends through it).
    pub fn hardware_mut(&mut self) -> &mut H {
        &mut self.hardware
    }

    /// The pool of `tier`, if present.
    pub fn pool(&self, tier: Tier) -> Option<&BlockPool> {
        self.pools[tier.index()].as_ref()
    }

    /// The device pool (always present).
    pub fn device(&self) -> &BlockPool {
        self.pools[Tier::Device.index()]
            .as_ref()
            .expect("validated: a device tier exists")
    }

    /// Counters since construction.
    pub fn stats(&self) -> ManagerStats {
        self.stats
    }

    /// Transfers in flight.
    pub fn transfers_in_flight(&self) -> usize {
        self.in_flight.len()
    }

    fn tick(&mut self, now: Timestamp) {
        debug_assert!(
            now >= self.last_now,
            "time went backwards: {now:?} < {:?}",
            self.last_now
        );
        self.last_now = self.last_now.max(now);
    }

    fn present_tiers(&self) -> impl Iterator<Item = Tier> + '_ {
        self.config.tiers.iter().map(|t| t.tier)
    }

    fn lower_tier(&self, tier: Tier) -> Option<Tier> {
        self.present_tiers().find(|t| *t > tier)
    }

    fn offload_policy(&self, tier: Tier) -> OffloadPolicy {
        self.config
            .tiers
            .iter()
            .find(|t| t.tier == tier)
            .map_or(OffloadPolicy::None, |t| t.offload)
    }

    /// Whether any tier has `hash` registered.
    fn holds_anywhere(&self, hash: SequenceHash) -> bool {
        self.pools.iter().flatten().any(|pool| pool.contains(hash))
    }

    fn pool_of(&self, tier: Tier) -> BlockPool {
        self.pools[tier.index()]
            .clone()
            .expect("only present tiers are addressed")
    }

    /// Looks `hashes` (one per full block, in order) up: the device prefix, then the
    /// longest continuation found in lower tiers (each block from the fastest tier that
    /// holds it), cut where onboarding stops paying off (`OnboardPolicy::CostAware`).
    /// The plan references every block it names.
    pub fn lookup(&mut self, hashes: &[SequenceHash], now: Timestamp) -> LookupPlan {
        self.tick(now);
        let device = self.device().match_prefix(hashes);
        let on_device = device.len();
        // A tier that is down holds nothing, and is not asked.
        let lower: Vec<BlockPool> = self
            .present_tiers()
            .skip(1)
            .filter(|t| !self.down[t.index()])
            .map(|t| self.pool_of(t))
            .collect();
        let mut found_tiers: Vec<Tier> = Vec::new();
        for hash in &hashes[on_device..] {
            match lower.iter().find(|pool| pool.contains(*hash)) {
                Some(pool) => found_tiers.push(pool.tier()),
                None => break,
            }
        }
        let onboard_len = match self.config.onboard {
            OnboardPolicy::Always => found_tiers.len(),
            OnboardPolicy::CostAware => self.cheapest_cut(&found_tiers),
        };
        let mut onboard = Vec::with_capacity(onboard_len);
        for (hash, tier) in hashes[on_device..].iter().zip(&found_tiers[..onboard_len]) {
            match self.pool_of(*tier).get(*hash) {
                Some(block) => onboard.push(block),
                None => break,
            }
        }
        let stats = &mut self.stats;
        stats.lookups += 1;
        stats.lookup_blocks += hashes.len() as u64;
        stats.device_hit_blocks += on_device as u64;
        for block in &onboard {
            stats.onboard_planned_blocks[block.tier().index()] += 1;
        }
        let recomputed_hits = found_tiers.len() - onboard.len();
        stats.recomputed_hit_blocks += recomputed_hits as u64;
        LookupPlan {
            device,
            onboard,
            recomputed_hits,
            query_blocks: hashes.len(),
        }
    }

    /// How many of the lower-tier hits (tiers in prefix order) to onboard: the cut that
    /// minimises estimated transfer time of the onboarded blocks plus recompute time of
    /// the rest. Cuts are tried at tier-run boundaries (the cost is linear within a run);
    /// ties go to onboarding more, which saves compute for other requests.
    fn cheapest_cut(&self, found_tiers: &[Tier]) -> usize {
        let total = found_tiers.len();
        let recompute = |blocks: usize| self.hardware.estimate_recompute(blocks);
        let mut best = (recompute(total), 0);
        let mut transfer = Duration::ZERO;
        let mut start = 0;
        while start < total {
            let tier = found_tiers[start];
            let run = found_tiers[start..]
                .iter()
                .take_while(|t| **t == tier)
                .count();
            let bytes = self.config.bytes_per_block.saturating_mul(run as u64);
            transfer += self.hardware.estimate_transfer(tier, Tier::Device, bytes);
            start += run;
            let cost = transfer + recompute(total - start);
            if cost <= best.0 {
                best = (cost, start);
            }
        }
        best.1
    }

    /// Starts bringing the plan's lower-tier blocks to device: allocates device blocks
    /// and submits one transfer per source tier. The plan keeps its device blocks; the
    /// onboarded ones arrive in [`ManagerOutput::OnboardComplete`] for `request`.
    /// Returns the number of transfers started (0 when there is nothing to onboard, and
    /// then no output follows). On error nothing was started and the plan is unchanged.
    pub fn start_onboard(
        &mut self,
        request: RequestId,
        plan: &mut LookupPlan,
        now: Timestamp,
    ) -> Result<usize, OnboardError> {
        self.tick(now);
        if plan.onboard.is_empty() {
            return Ok(0);
        }
        if self.onboarding.contains_key(&request) {
            return Err(OnboardError::AlreadyOnboarding(request));
        }
        let mut runs: Vec<(Tier, usize)> = Vec::new();
        for block in &plan.onboard {
            match runs.last_mut() {
                Some((tier, len)) if *tier == block.tier() => *len += 1,
                _ => runs.push((block.tier(), 1)),
            }
        }
        let max = self.config.max_inflight_transfers;
        if self.in_flight.len() + runs.len() > max {
            return Err(OnboardError::TooManyTransfers {
                in_flight: self.in_flight.len(),
                max,
            });
        }
        let mut targets = self.device().allocate(plan.onboard.len())?;
        let mut sources = std::mem::take(&mut plan.onboard);
        let mut job = OnboardJob {
            segments: Vec::with_capacity(runs.len()),
            pending: 0,
        };
        let mut first_error = None;
        for (segment, (tier, len)) in runs.into_iter().enumerate() {
            let run_sources: Vec<ImmutableBlock> = sources.drain(..len).collect();
            let run_targets: Vec<MutableBlock<Reset>> = targets.drain(..len).collect();
            let request_bytes = self.config.bytes_per_block.saturating_mul(len as u64);
            let transfer = TransferRequest {
                src_tier: tier,
                src_blocks: run_sources.iter().map(ImmutableBlock::block_id).collect(),
                dst_tier: Tier::Device,
                dst_blocks: run_targets.iter().map(MutableBlock::block_id).collect(),
                bytes: request_bytes,
            };
            // A plan made before its tier failed names blocks that are gone: refused
            // as the hardware would refuse them.
            let submitted = if self.down[tier.index()] {
                Err(SubmitError::TierUnavailable(tier))
            } else {
                self.hardware.submit(transfer, now)
            };
            match submitted {
                Ok(id) => {
                    self.count_submit(request_bytes);
                    job.segments.push(Segment::Pending);
                    job.pending += 1;
                    let flight = InFlight::Onboard {
                        request,
                        segment,
                        sources: run_sources,
                        targets: run_targets,
                    };
                    self.in_flight.insert(id, flight);
                }
                Err(error) => {
                    if segment == 0 {
                        // Nothing started: give the plan back as it was.
                        plan.onboard = run_sources;
                        plan.onboard.append(&mut sources);
                        return Err(error.into());
                    }
                    first_error.get_or_insert(error);
                    self.stats.onboard_failed_blocks += len as u64;
                    job.segments.push(Segment::Failed(len));
                }
            }
        }
        self.onboarding.insert(request, job);
        self.pump_writeback(now);
        Ok(self.onboarding.get(&request).map_or(0, |job| job.pending))
    }

    fn count_submit(&mut self, bytes: u64) {
        self.stats.transfers_submitted += 1;
        self.stats.bytes_submitted += bytes;
    }

    /// Takes `count` device blocks in state Reset for blocks to compute (evicting cached
    /// blocks as needed), then tops up write-back.
    pub fn allocate(
        &mut self,
        count: usize,
        now: Timestamp,
    ) -> Result<Vec<MutableBlock<Reset>>, AllocError> {
        self.tick(now);
        let blocks = self.device().allocate(count)?;
        self.pump_writeback(now);
        Ok(blocks)
    }

    /// Registers computed device blocks (a chain, parent first) and, if the device tier
    /// writes through, starts copying them down.
    pub fn register(&mut self, blocks: Vec<MutableBlock<Complete>>, now: Timestamp) -> BlockChain {
        self.tick(now);
        assert!(
            blocks.iter().all(|b| b.tier() == Tier::Device),
            "register takes device blocks"
        );
        let registered = self.device().register_chain(blocks);
        if self.offload_policy(Tier::Device) == OffloadPolicy::WriteThrough {
            self.offload(Tier::Device, registered.clone().into_vec(), now);
        }
        registered
    }

    /// Tags device blocks with `phase` (for example `ThinkComplete` when a request leaves
    /// its reasoning phase); the priority policy evicts and writes back such blocks first.
    /// Returns how many were found.
    pub fn set_phase(&mut self, hashes: &[SequenceHash], phase: Phase, now: Timestamp) -> usize {
        self.tick(now);
        let found = self.device().set_phase(hashes, phase);
        self.pump_writeback(now);
        found
    }

    /// Copies `sources` (blocks of `from`) to the next lower tier, skipping blocks already
    /// there or already on their way. Blocks that find no room are skipped and counted.
    fn offload(&mut self, from: Tier, sources: Vec<ImmutableBlock>, now: Timestamp) {
        let Some(to) = self.lower_tier(from) else {
            return;
        };
        if self.down[to.index()] || self.down[from.index()] {
            self.stats.offload_skipped_blocks += sources.len() as u64;
            return;
        }
        let policy = self.offload_policy(from);
        let dst = self.pool_of(to);
        let mut kept_sources = Vec::with_capacity(sources.len());
        let mut targets = Vec::with_capacity(sources.len());
        let mut skipped = 0u64;
        for source in sources {
            let hash = source.sequence_hash();
            if dst.contains(hash) || self.offloading.contains(&(to, hash)) {
                continue;
            }
            // A block whose parent left every tier (the parent was copied down, evicted
            // from the device first as the colder copy, then evicted below) is
            // unreachable: copying it would waste the lower tier.
            if source
                .identity()
                .parent
                .is_some_and(|parent| !self.holds_anywhere(parent))
            {
                self.stats.orphans_not_offloaded += 1;
                continue;
            }
            if self.in_flight.len() >= self.config.max_inflight_transfers {
                skipped += 1;
                continue;
            }
            match dst.allocate_one() {
                Ok(target) => {
                    targets.push(target);
                    kept_sources.push(source);
                }
                Err(_) => skipped += 1,
            }
        }
        self.stats.offload_skipped_blocks += skipped;
        if kept_sources.is_empty() {
            return;
        }
        let bytes = self
            .config
            .bytes_per_block
            .saturating_mul(kept_sources.len() as u64);
        let transfer = TransferRequest {
            src_tier: from,
            src_blocks: kept_sources.iter().map(ImmutableBlock::block_id).collect(),
            dst_tier: to,
            dst_blocks: targets.iter().map(MutableBlock::block_id).collect(),
            bytes,
        };
        match self.hardware.submit(transfer, now) {
            Ok(id) => {
                self.count_submit(bytes);
                for source in &kept_sources {
                    self.offloading.insert((to, source.sequence_hash()));
                }
                if matches!(policy, OffloadPolicy::WriteBack { .. }) {
                    self.writeback_pinned[from.index()] += kept_sources.len();
                }
                self.in_flight.insert(
                    id,
                    InFlight::Offload {
                        sources: kept_sources,
                        targets,
                        policy,
                    },
                );
            }
            Err(_) => self.stats.offload_skipped_blocks += kept_sources.len() as u64,
        }
    }

    /// For every write-back tier: make sure the blocks the next allocations would evict
    /// are already copied down. Allocations take free blocks first, then the coldest
    /// cached ones, so with `free` free blocks and a watermark `w`, the coldest
    /// `w - free` cached blocks (less those already being copied) must be copied.
    fn pump_writeback(&mut self, now: Timestamp) {
        let tiers: Vec<(Tier, usize)> = self
            .config
            .tiers
            .iter()
            .filter_map(|t| match t.offload {
                OffloadPolicy::WriteBack {
                    low_watermark_blocks,
                } => Some((t.tier, low_watermark_blocks)),
                _ => None,
            })
            .collect();
        for (tier, watermark) in tiers {
            let Some(to) = self.lower_tier(tier) else {
                continue;
            };
            if self.down[to.index()] || self.down[tier.index()] {
                // Nothing to copy to: the tier evicts without copying until it is back.
                continue;
            }
            // The coldest blocks and which of them the lower tier has change only when
            // the pools do; unchanged since a look that found nothing to do, skip it (a
            // full device with everything already copied would rescan every call).
            let changes = self.counters.changes.load(Ordering::Relaxed);
            if self.writeback_seen[tier.index()] == Some(changes) {
                continue;
            }
            let pool = self.pool_of(tier);
            let dst = self.pool_of(to);
            let counts = pool.counts();
            let need = watermark.saturating_sub(counts.free + self.writeback_pinned[tier.index()]);
            if need == 0 {
                self.writeback_seen[tier.index()] = Some(changes);
                continue;
            }
            if self.in_flight.len() >= self.config.max_inflight_transfers {
                // No room for a transfer: a completion (which changes the pools) makes
                // some, and the next call looks again.
                continue;
            }
            // Only blocks that `offload` will copy are pinned: a pinned block that went
            // back would move to the hot end of its eviction order, and a scan must not
            // reorder the cache it is looking at.
            let mut coldest = pool.coldest_cached(need);
            dst.retain_missing(&mut coldest);
            coldest.retain(|identity| {
                !self.offloading.contains(&(to, identity.sequence_hash))
                    && identity
                        .parent
                        .is_none_or(|parent| self.holds_anywhere(parent))
            });
            let candidates: Vec<ImmutableBlock> = coldest
                .into_iter()
                .filter_map(|identity| pool.pin(identity.sequence_hash))
                .collect();
            if candidates.is_empty() {
                self.writeback_seen[tier.index()] = Some(changes);
            } else {
                self.writeback_seen[tier.index()] = None;
                self.offload(tier, candidates, now);
            }
        }
    }

    /// Takes every transfer the hardware finished by `now` and acts on it: registers
    /// onboarded and offloaded copies, releases sources, queues outputs.
    pub fn handle_completions(&mut self, now: Timestamp) {
        self.tick(now);
        while let Some(completion) = self.hardware.poll_completion(now) {
            self.handle_completion(completion, now);
        }
        self.pump_writeback(now);
    }

    /// Acts on one finished transfer (for drivers whose backend reports completions
    /// directly). An unknown id is ignored: it was not this manager's.
    pub fn handle_completion(&mut self, completion: Completion, now: Timestamp) {
        self.tick(now);
        let Some(flight) = self.in_flight.remove(&completion.id) else {
            return;
        };
        match flight {
            InFlight::Onboard {
                request,
                segment,
                sources,
                targets,
            } => {
                let source_tier = sources.first().map_or(Tier::Device, ImmutableBlock::tier);
                let outcome = match completion.result {
                    Ok(()) => {
                        let complete = copies_of(&sources, targets);
                        self.stats.onboarded_blocks[source_tier.index()] += sources.len() as u64;
                        Segment::Done(self.device().register_chain(complete))
                    }
                    Err(error) => {
                        self.stats.onboard_failed_blocks += sources.len() as u64;
                        self.forget_corrupt(&error, &sources);
                        Segment::Failed(sources.len())
                    }
                };
                self.pool_of(source_tier).release(sources);
                self.finish_segment(request, segment, outcome);
            }
            InFlight::Offload {
                sources,
                targets,
                policy,
            } => {
                let from = sources.first().map_or(Tier::Device, ImmutableBlock::tier);
                let to = targets.first().map_or(Tier::Device, MutableBlock::tier);
                for source in &sources {
                    self.offloading.remove(&(to, source.sequence_hash()));
                }
                if matches!(policy, OffloadPolicy::WriteBack { .. }) {
                    self.writeback_pinned[from.index()] -= sources.len();
                }
                let blocks = sources.len();
                match completion.result {
                    Ok(()) => {
                        // The parent of a block may have left every tier while the copy
                        // was in flight: such a copy is an orphan (see `offload`) and
                        // its target goes back unregistered.
                        let (complete, orphans): (Vec<_>, Vec<_>) =
                            copies_of(&sources, targets).into_iter().partition(|copy| {
                                copy.identity()
                                    .parent
                                    .is_none_or(|parent| self.holds_anywhere(parent))
                            });
                        self.stats.orphans_not_offloaded += orphans.len() as u64;
                        drop(orphans);
                        let copies = self.pool_of(to).register_chain(complete);
                        self.stats.offloaded_blocks[to.index()] += blocks as u64;
                        self.outputs
                            .push_back(ManagerOutput::Offloaded { from, to, blocks });
                        if self.offload_policy(to) == OffloadPolicy::WriteThrough {
                            self.offload(to, copies.clone().into_vec(), now);
                        }
                        self.pool_of(to).release(copies);
                        // A written-back block is clean now: it may go first.
                        match policy {
                            OffloadPolicy::WriteBack { .. } => {
                                self.pool_of(from).release_cold(sources)
                            }
                            _ => self.pool_of(from).release(sources),
                        }
                    }
                    Err(error) => {
                        self.forget_corrupt(&error, &sources);
                        self.pool_of(from).release(sources);
                        self.stats.offload_failed_blocks += blocks as u64;
                        self.outputs
                            .push_back(ManagerOutput::OffloadFailed { from, to, blocks });
                    }
                }
            }
        }
    }

    /// A transfer whose sources failed their checksum when read: those copies are no
    /// copies. They leave their tier (with `Removed`) so that lookups stop offering them
    /// and the next offload can write a good copy in their place; the hardware names
    /// the tier, not the block, so every source of the transfer goes. Other failures
    /// (an I/O error, a tier going down) leave the sources where they are.
    fn forget_corrupt(&mut self, error: &TransferError, sources: &[ImmutableBlock]) {
        let Some(tier) = sources.first().map(ImmutableBlock::tier) else {
            return;
        };
        if *error != (TransferError::Corrupt { tier }) {
            return;
        }
        let hashes: Vec<SequenceHash> = sources.iter().map(ImmutableBlock::sequence_hash).collect();
        let forgotten = self.pool_of(tier).invalidate(&hashes);
        self.stats.corrupt_blocks_forgotten += forgotten as u64;
    }

    fn finish_segment(&mut self, request: RequestId, segment: usize, outcome: Segment) {
        let Some(job) = self.onboarding.get_mut(&request) else {
            return;
        };
        job.segments[segment] = outcome;
        job.pending -= 1;
        if job.pending > 0 {
            return;
        }
        let Some(job) = self.onboarding.remove(&request) else {
            return;
        };
        let mut blocks = BlockChain::new();
        let mut failed_blocks = 0;
        for segment in job.segments {
            match segment {
                Segment::Done(done) if failed_blocks == 0 => blocks.append(done),
                // After a hole the prefix is broken: later copies stay cached on device
                // (they are valid) but are not part of this request's prefix.
                Segment::Done(done) => failed_blocks += done.len(),
                Segment::Failed(len) => failed_blocks += len,
                Segment::Pending => unreachable!("job finished with a pending segment"),
            }
        }
        self.outputs.push_back(ManagerOutput::OnboardComplete {
            request,
            blocks,
            failed_blocks,
        });
    }

    /// The next finished piece of work, oldest first.
    #[must_use]
    pub fn poll_output(&mut self) -> Option<ManagerOutput> {
        self.outputs.pop_front()
    }

    /// The events of every tier since the last call, numbered for this worker, in the
    /// order they happened.
    #[must_use]
    pub fn take_events(&mut self) -> Vec<KvCacheEvent> {
        self.collect_pool_events();
        std::mem::take(&mut self.events)
    }

    /// Moves the pools' events into the manager's stream in the order they happened
    /// across tiers (a block offloaded to host before its parent left the device must be
    /// stored before the parent is removed, or a router would refuse it).
    fn collect_pool_events(&mut self) {
        let events = self.counters.events.load(Ordering::Relaxed);
        if events == self.events_collected {
            return;
        }
        self.events_collected = events;
        let mut ordered: Vec<(u64, KvCacheEventData)> = Vec::new();
        for pool in self.pools.iter().flatten() {
            ordered.extend(pool.take_ordered_events());
        }
        ordered.sort_by_key(|(stamp, _)| *stamp);
        for (_, data) in ordered {
            self.push_event(data);
        }
    }

    fn push_event(&mut self, data: KvCacheEventData) {
        let event = KvCacheEvent {
            event_id: self.next_event_id,
            dp_rank: self.config.dp_rank,
            data,
        };
        self.next_event_id += 1;
        self.events.push(event);
    }

    /// When the hardware will next finish something, if it knows.
    pub fn poll_timeout(&self) -> Option<Timestamp> {
        self.hardware.next_deadline()
    }

    /// The id the next event will carry (events so far, counting from 0).
    pub fn next_event_id(&self) -> u64 {
        self.next_event_id
    }

    /// Publishes the registered state of every tier as events, for a consumer that lost
    /// track (a restarted router, or one that saw a gap in the event ids): a `Cleared`,
    /// then a `Stored` per block, parents before children. Blocks that no prefix lookup
    /// can reach (a block of their prefix is in no tier) are left out: a router would
    /// refuse them, and no query could use them. Returns the blocks published.
    pub fn publish_snapshot(&mut self) -> usize {
        // Events already queued keep their place before the snapshot.
        self.collect_pool_events();
        self.push_event(KvCacheEventData::Cleared);
        let blocks = self.reachable_blocks();
        for (identity, tier) in &blocks {
            self.push_event(KvCacheEventData::Stored {
                parent_hash: identity.parent,
                blocks: vec![StoredBlock {
                    block_hash: identity.sequence_hash,
                    tokens_hash: identity.local_hash,
                }],
                tier: *tier,
            });
        }
        blocks.len()
    }

    /// Every registered block a prefix lookup can reach (its whole prefix is registered
    /// in some tier), with its tier, parents before children (by position, then tier,
    /// then hash). A block held in two tiers is listed once per tier.
    pub fn reachable_blocks(&self) -> Vec<(BlockIdentity, Tier)> {
        let mut blocks: Vec<(BlockIdentity, Tier)> = Vec::new();
        for pool in self.pools.iter().flatten() {
            blocks.extend(
                pool.registered_identities()
                    .into_iter()
                    .map(|identity| (identity, pool.tier())),
            );
        }
        blocks.sort_by_key(|(identity, tier)| (identity.position, *tier, identity.sequence_hash));
        let mut reachable: FxHashSet<SequenceHash> = FxHashSet::default();
        blocks.retain(|(identity, _)| {
            let keep = identity
                .parent
                .is_none_or(|parent| reachable.contains(&parent));
            if keep {
                reachable.insert(identity.sequence_hash);
            }
            keep
        });
        blocks
    }

    /// Whether `tier` failed and has not come back.
    pub fn tier_is_down(&self, tier: Tier) -> bool {
        self.down[tier.index()]
    }

    fn check_faultable(&self, tier: Tier) -> Result<(), TierFaultError> {
        if tier == Tier::Device {
            return Err(TierFaultError::Device);
        }
        if self.pools[tier.index()].is_none() {
            return Err(TierFaultError::NotPresent(tier));
        }
        Ok(())
    }

    /// The storage of `tier` (host, disk or remote) is gone, as when an SSD fails: up →
    /// down. Transfers to or from it still in flight fail through the same path as a
    /// transfer the hardware reports failed (an onboard's blocks are then to be
    /// computed; an offload's sources stay where they were); every block registered in
    /// it is forgotten with a `Removed` event, so a router's view stays exact. Until
    /// [`Manager::restore_tier`], lookups do not look there, nothing is copied there,
    /// and a plan made before naming its blocks is refused by `start_onboard`. Failing
    /// a tier that is already down loses nothing more.
    ///
    /// A driver should first let the hardware report its own failed transfers (and
    /// call [`Manager::handle_completions`]); those still in flight are failed here, and
    /// a later completion of theirs is ignored.
    pub fn fail_tier(&mut self, tier: Tier, now: Timestamp) -> Result<TierFailure, TierFaultError> {
        self.tick(now);
        self.check_faultable(tier)?;
        self.down[tier.index()] = true;
        let touching: Vec<TransferId> = self
            .in_flight
            .iter()
            .filter(|(_, flight)| {
                let (src, dst) = flight.tiers();
                src == tier || dst == tier
            })
            .map(|(id, _)| *id)
            .collect();
        for id in &touching {
            let result = Err(TransferError::Failed { tier });
            self.handle_completion(Completion { id: *id, result }, now);
        }
        let blocks_lost = self.pool_of(tier).invalidate_all();
        Ok(TierFailure {
            blocks_lost,
            transfers_failed: touching.len(),
        })
    }

    /// A failed tier is back, empty: down → up. Offloads go to it again (write-back
    /// catches up on what the tier above holds) and lookups find what lands there.
    pub fn restore_tier(&mut self, tier: Tier, now: Timestamp) -> Result<(), TierFaultError> {
        self.tick(now);
        self.check_faultable(tier)?;
        if !std::mem::replace(&mut self.down[tier.index()], false) {
            return Ok(());
        }
        // What the pumps last saw was with the tier down.
        self.writeback_seen = [None; 4];
        self.pump_writeback(now);
        Ok(())
    }

    /// Forgets every cached block of every tier and emits one `Cleared`. Refuses while
    /// transfers are in flight or registered blocks are referenced.
    pub fn reset_cache(&mut self, now: Timestamp) -> Result<(), ClearError> {
        self.tick(now);
        if !self.in_flight.is_empty() {
            return Err(ClearError::TransfersInFlight(self.in_flight.len()));
        }
        for pool in self.pools.iter().flatten() {
            let referenced = pool.referenced_registered();
            if referenced > 0 {
                return Err(ClearError::InUse {
                    tier: pool.tier(),
                    source: ResetError::InUse { referenced },
                });
            }
        }
        // Earlier events keep their place before the Cleared.
        self.collect_pool_events();
        for pool in self.pools.iter().flatten() {
            pool.reset_cache().map_err(|source| ClearError::InUse {
                tier: pool.tier(),
                source,
            })?;
            // The per-block removals are implied by Cleared.
            let _ = pool.take_events();
        }
        self.push_event(KvCacheEventData::Cleared);
        Ok(())
    }
}

/// The landed copies of `sources`: each target takes its source's identity
/// (Reset → Complete), ready to register in the target's tier.
fn copies_of(
    sources: &[ImmutableBlock],
    targets: Vec<MutableBlock<Reset>>,
) -> Vec<MutableBlock<Complete>> {
    targets
        .into_iter()
        .zip(sources)
        .map(|(target, source)| target.apply_identity(*source.identity()))
        .collect()
}

#[cfg(test)]
mod tests;
