//! The twin of kvtwin's vLLM connector (`backends/connector`): the store's tiers as the
//! engine's scheduler and worker use them, so the twin of an engine started with the
//! connector finds what the connector would find, tier by tier.
//!
//! The real store (`kvtwin_connector::store::TierStore`) is a kvtwin [`Manager`] on the
//! host backend: host memory (the manager's `Device` tier, LRU) written through to a
//! disk tier (LRU), every block found loaded (`OnboardPolicy::Always`) but read where it
//! lies, never promoted. This twin runs the same manager with the same tiers on
//! [`SimHardware`] and makes the same calls in the same order:
//! - [`TwinStore::matched_tokens`] is the scheduler side's
//!   `get_num_new_matched_tokens`: the leading run of the prompt's full blocks the
//!   store holds (the last prompt token left to compute), beyond the engine's own hit;
//!   it asks the mirror of what some tier holds, which touches nothing;
//! - [`TwinStore::load`] is the worker's load before the forward pass (`held_run`: the
//!   manager's lookup, which refreshes each block's place in its tier's LRU order), by
//!   the tier each block is read from;
//! - [`TwinStore::save`] is the worker's save after it: the chain's leading run already
//!   held is looked up (and so refreshed), the rest allocated, registered and released,
//!   no more blocks at once than host memory holds.
//!
//! The store's bookkeeping does not depend on how long its copies take: the real one
//! waits for copies in flight before it allocates or registers more, and the twin lands
//! every copy (its clock a second on) before each call.
//!
//! Owns: [`ConnectorTiers`], [`TwinStore`], [`Loaded`]. Never: times anything for the
//! engine's steps (a load's time is the forward pass's, as on CPU), publishes the
//! connector's KV events, or models its load errors (a corrupt block).

use kvtwin::block::BlockIdentity;
use kvtwin::events::KvCacheEventData;
use kvtwin::ids::{SequenceHash, Timestamp, WorkerId};
use kvtwin::manager::{
    Manager, ManagerConfig, ManagerConfigError, OffloadPolicy, OnboardPolicy, TierConfig,
};
use kvtwin::pool::EvictionPolicyKind;
use kvtwin::tier::Tier;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

use crate::hardware::{HardwareProfile, SimHardware};

/// The connector's tiers (its `kv_connector_extra_config` in blocks: `host_bytes` and
/// `disk_bytes` over the engine's block bytes; a scenario's
/// `engine: Vllm((connector: Some((memory_blocks: 128, disk_blocks: 2048))))`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConnectorTiers {
    /// Blocks in host memory.
    pub memory_blocks: usize,
    /// Blocks on disk (0: none).
    pub disk_blocks: usize,
}

/// Blocks one load read, by the tier each was read from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Loaded {
    /// From host memory.
    pub memory: u64,
    /// From disk.
    pub disk: u64,
}

impl std::ops::AddAssign for Loaded {
    fn add_assign(&mut self, other: Self) {
        self.memory += other.memory;
        self.disk += other.disk;
    }
}

/// The twin of the connector's store; see the module documentation.
#[derive(Debug)]
pub struct TwinStore {
    manager: Manager<SimHardware>,
    now: Timestamp,
    /// Each block some tier holds, with the tiers (bit per `Tier::index`): the scheduler
    /// side's mirror is its keys.
    held: BTreeMap<SequenceHash, u8>,
}

/// What the twin's clock moves on before each call: far longer than any copy of a
/// block takes on [`STORE_NODE`].
const SETTLE: Duration = Duration::from_secs(1);

/// The node the twin's store runs on: a host's memory and an SSD. Its speeds only
/// decide when copies land, which the twin makes before every call anyway.
const STORE_NODE: &str = "(name: \"connector store\", pcie_bytes_per_s: 10000000000, \
    pcie_latency_ns: 5000, nvme_read_bytes_per_s: 2000000000, \
    nvme_write_bytes_per_s: 1000000000, nvme_latency_ns: 80000, \
    nic_bytes_per_s: 1250000000, nic_latency_ns: 50000, prefill_ns_per_token: 0, \
    decode_ns_per_token: 0, max_inflight_transfers: 64)";

impl TwinStore {
    /// Empty tiers for blocks of `block_size_tokens`.
    pub fn new(
        tiers: ConnectorTiers,
        block_size_tokens: usize,
    ) -> Result<Self, ManagerConfigError> {
        let lru = |tier, capacity_blocks, offload| TierConfig {
            tier,
            capacity_blocks,
            eviction: EvictionPolicyKind::Lru,
            offload,
        };
        let tiers = if tiers.disk_blocks > 0 {
            vec![
                lru(
                    Tier::Device,
                    tiers.memory_blocks,
                    OffloadPolicy::WriteThrough,
                ),
                lru(Tier::Disk, tiers.disk_blocks, OffloadPolicy::None),
            ]
        } else {
            vec![lru(Tier::Device, tiers.memory_blocks, OffloadPolicy::None)]
        };
        let config = ManagerConfig {
            worker_id: WorkerId::new(0),
            dp_rank: 0,
            block_size_tokens,
            bytes_per_block: 1,
            tiers,
            onboard: OnboardPolicy::Always,
            // As the real store's manager: copies past this many in flight are skipped.
            max_inflight_transfers: 64,
        };
        config.validate()?;
        let node: HardwareProfile = ron::from_str(STORE_NODE).expect("STORE_NODE is a profile");
        let manager = Manager::new(SimHardware::new(node, block_size_tokens), config)?;
        Ok(Self {
            manager,
            now: Timestamp::ZERO,
            held: BTreeMap::new(),
        })
    }

    /// Whether some tier holds the block (the scheduler side's mirror).
    pub fn holds(&self, hash: SequenceHash) -> bool {
        self.held.contains_key(&hash)
    }

    /// Blocks each tier holds: (host memory, disk).
    pub fn blocks_by_tier(&self) -> (usize, usize) {
        let count = |tier: Tier| {
            self.held
                .values()
                .filter(|bits| *bits & (1 << tier.index()) != 0)
                .count()
        };
        (count(Tier::Device), count(Tier::Disk))
    }

    /// `get_num_new_matched_tokens`: prompt tokens beyond `local_tokens` (the engine's
    /// own hit) in the leading run of `blocks` (the prompt's full blocks, first first)
    /// the store holds, the last prompt token always computed; 0 when the run reaches
    /// no further.
    pub fn matched_tokens(
        &self,
        blocks: &[BlockIdentity],
        prompt_tokens: u64,
        local_tokens: u64,
        block_size: u64,
    ) -> u64 {
        let usable = usize::try_from(prompt_tokens.saturating_sub(1) / block_size.max(1))
            .unwrap_or(usize::MAX);
        let run = blocks
            .iter()
            .take(usable)
            .take_while(|block| self.holds(block.sequence_hash))
            .count() as u64;
        (run * block_size).saturating_sub(local_tokens)
    }

    /// The worker's load of `hashes` (a chain, parent first): the leading run the store
    /// holds, by the tier each block is read from.
    pub fn load(&mut self, hashes: &[SequenceHash]) -> Loaded {
        let (held, disk) = self.held_run(hashes);
        // Read where they lie: nothing is promoted.
        self.settle();
        Loaded {
            memory: (held - disk) as u64,
            disk: disk as u64,
        }
    }

    /// The manager's lookup of the leading run of `hashes` held (`TierStore::held_run`:
    /// it refreshes each block's place in its tier's LRU order): how many blocks, and
    /// how many of them are read from disk. The plan holds them only until it returns.
    fn held_run(&mut self, hashes: &[SequenceHash]) -> (usize, usize) {
        self.settle();
        let plan = self.manager.lookup(hashes, self.now);
        let disk = plan
            .onboard_blocks()
            .iter()
            .filter(|block| block.tier() == Tier::Disk)
            .count();
        let held = plan.device_blocks().block_ids().len() + plan.onboard_blocks().len();
        (held, disk)
    }

    /// The worker's save of `chain` (parent first): the blocks the store does not hold
    /// yet, past the leading run it does. How many were saved.
    pub fn save(&mut self, chain: &[BlockIdentity]) -> usize {
        let hashes: Vec<SequenceHash> = chain.iter().map(|id| id.sequence_hash).collect();
        let (start, _) = self.held_run(&hashes);
        let capacity = self.manager.device().capacity().max(1);
        let mut saved = 0;
        for run_start in (start..chain.len()).step_by(capacity) {
            self.settle();
            let run = &chain[run_start..chain.len().min(run_start + capacity)];
            let Ok(blocks) = self.manager.allocate(run.len(), self.now) else {
                // Host memory full of blocks in use: the real store gives up on the
                // save too (after waiting for copies, which the twin has landed).
                break;
            };
            let complete = blocks
                .into_iter()
                .zip(run)
                .map(|(block, identity)| block.apply_identity(*identity))
                .collect();
            let registered = self.manager.register(complete, self.now);
            self.manager.device().release(registered);
            saved += run.len();
        }
        self.settle();
        saved
    }

    /// Moves the clock on, lands every copy and files what the tiers did.
    fn settle(&mut self) {
        self.now = self.now.saturating_add(SETTLE);
        self.manager.handle_completions(self.now);
        while self.manager.poll_output().is_some() {}
        for event in self.manager.take_events() {
            match event.data {
                KvCacheEventData::Stored { blocks, tier, .. } => {
                    for block in blocks {
                        *self.held.entry(block.block_hash).or_default() |= 1 << tier.index();
                    }
                }
                KvCacheEventData::Removed { block_hashes, tier } => {
                    for hash in block_hashes {
                        if let Some(bits) = self.held.get_mut(&hash) {
                            *bits &= !(1 << tier.index());
                            if *bits == 0 {
                                self.held.remove(&hash);
                            }
                        }
                    }
                }
                KvCacheEventData::Cleared => self.held.clear(),
            }
        }
    }
}
