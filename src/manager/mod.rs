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
//!
//! One `impl` block per concern, one file each: this file builds the manager and holds
//! the accessors and helpers every concern shares; `onboard` answers lookups and brings
//! lower-tier hits up; `offload` takes computed blocks and copies them down
//! (write-through, write-back); `transfers` tracks what is in flight and acts on
//! completions; `events` drains outputs and the event stream; `faults` fails, restores
//! and resets tiers; `adopt` takes in what a reopened lower tier's storage holds.

mod adopt;
mod config;
mod drive;
mod events;
mod faults;
mod offload;
mod onboard;
mod plan;
mod transfers;

pub use adopt::{AdoptError, Adopted};
pub use config::{ManagerConfig, ManagerConfigError, OffloadPolicy, OnboardPolicy, TierConfig};
pub use drive::{settle, Driver};
pub use faults::{ClearError, TierFailure, TierFaultError};
pub use onboard::OnboardError;
pub use plan::{LookupPlan, ManagerOutput};

use crate::events::{KvCacheEvent, KvCacheEventData};
use crate::hardware::Hardware;
use crate::ids::{RequestId, SequenceHash, Timestamp, TransferId};
use crate::pool::{BlockPool, EventBuffers, PoolConfig, SharedCounters};
use crate::sync::Arc;
use crate::tier::Tier;
use onboard::OnboardJob;
use rustc_hash::FxHashSet;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, VecDeque};
use transfers::InFlight;

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

/// The block manager of one worker, generic over the hardware that moves its bytes.
///
/// # Driving it
/// Every input takes `now`, which must never go backwards. After each batch of inputs
/// (`lookup`, `start_onboard`, `allocate`, `register`, `set_phase`) a driver:
/// 1. calls [`Manager::handle_completions`] with the current time;
/// 2. drains [`Manager::poll_output`] until it returns `None`;
/// 3. drains [`Manager::take_events`] and publishes them in order;
/// 4. sleeps until [`Manager::poll_timeout`] (or until its backend wakes it).
///
/// [`settle`] runs steps 1 to 3 and returns step 4's deadline for any [`Driver`].
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
    /// Per write-back tier, the lower tier and its removal count when the tier's checked
    /// cold prefix (blocks known to have a copy there) was last trusted: once the lower
    /// tier has lost any block, the prefix is forgotten and checked again.
    writeback_checked_against: [Option<(Tier, u64)>; 4],
    /// The pools' counters: event order and change count.
    counters: Arc<SharedCounters>,
    /// The event count when the pools' outboxes were last emptied.
    events_collected: u64,
    /// The pools' events being put in order (empty between collections).
    ordered_events: Vec<(u64, KvCacheEventData)>,
    /// Block lists of events the driver gave back, for the pools' next events.
    event_buffers: EventBuffers,
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
            let pool_config = PoolConfig {
                tier: tier.tier,
                capacity_blocks: tier.capacity_blocks,
                block_size_tokens: config.block_size_tokens,
                eviction: tier.eviction,
            };
            let pool = if hardware.single_threaded() {
                BlockPool::new_single_threaded(pool_config)
            } else {
                BlockPool::new(pool_config)
            }
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
            writeback_checked_against: [None; 4],
            counters,
            events_collected: 0,
            ordered_events: Vec::new(),
            event_buffers: EventBuffers::default(),
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
}

#[cfg(test)]
mod tests;
