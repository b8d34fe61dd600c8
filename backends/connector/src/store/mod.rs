//! The connector's tiers: a kvtwin [`Manager`] on the host backend holding the blocks an
//! engine saved, found again by their sequence hashes and checked with BLAKE3.
//!
//! The manager's first tier is always called `Device`; here it is the connector's own
//! host memory (the engine's cache is vLLM's, not kvtwin's), written through to a disk
//! tier when there is one. Whoever publishes the store's events names that tier CPU.
//! Each saved block's BLAKE3 digest is kept beside it for as long as some tier holds it
//! (the manager's Stored and Removed events say which), and a load that reads bytes
//! with another digest stops there: the caller reports the rest as not loaded and the
//! engine computes them.
//!
//! A persistent disk tier (`StoreConfig::persistent`) outlives the store: its extent
//! file is kept, and [`crate::journal`] records which block each slot holds as disk
//! copies land and leave. A new store on the same directory reads the journal back,
//! adopts those blocks into its disk tier where they lie ([`Manager::adopt`]) and starts
//! a fresh journal of what it kept; its host memory starts empty. Nothing is read at
//! start: a slot that does not hold what the journal says fails its digest at its
//! first load, like any corrupt block.
//!
//! Owns: [`TierStore`] (save, lookup, load, flush), [`StoreConfig`], [`Found`],
//! [`StoreStats`], [`StoreError`], the bounded queue of the manager's events, and where
//! each disk block lies (for the journal).
//! Never: know the engine's layout (the caller fills and drains block buffers), block on
//! a transfer except in [`TierStore::flush`], or keep a digest of a block no tier holds.

use crate::journal::{Entry, Geometry, Journal};
use kvtwin::block::BlockIdentity;
use kvtwin::events::{KvCacheEvent, KvCacheEventData};
use kvtwin::hardware::{Clock, Hardware};
use kvtwin::ids::{BlockId, SequenceHash, Timestamp, WorkerId};
use kvtwin::manager::{
    LookupPlan, Manager, ManagerConfig, ManagerConfigError, OffloadPolicy, OnboardPolicy,
    TierConfig,
};
use kvtwin::pool::{AllocError, EvictionPolicyKind};
use kvtwin::tier::Tier;
use kvtwin_backends::host::{BlockAccessError, HostConfig, HostError, HostHardware};
use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use thiserror::Error;

/// How long a save waits for host memory held by copies to disk.
pub const SAVE_PATIENCE: Duration = Duration::from_secs(10);

/// Events kept for the publisher at most; older ones are dropped (and counted) first.
pub const EVENT_QUEUE_BOUND: usize = 65_536;

/// How the store is sized (from vLLM's `kv_connector_extra_config`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreConfig {
    /// Bytes of one block, all layers (the engine's page bytes × layers).
    pub block_bytes: usize,
    /// Tokens of one block (the engine's block size).
    pub block_size_tokens: usize,
    /// Blocks in host memory.
    pub memory_blocks: usize,
    /// Blocks on disk (0: no disk tier).
    pub disk_blocks: usize,
    /// The directory of the disk tier's file; needed with a disk tier.
    pub disk_dir: Option<PathBuf>,
    /// Keeps the disk tier across stores: its file and its journal stay in `disk_dir`,
    /// and the next store there finds the blocks they hold. One live store per
    /// directory (the file is locked).
    pub persistent: bool,
}

/// Why the store could not start or do what it was asked.
#[derive(Debug, Error)]
pub enum StoreError {
    /// The tiers do not make a manager.
    #[error("the connector's tiers: {0}")]
    Config(#[from] ManagerConfigError),
    /// The host backend could not start (memory, the disk file).
    #[error("the connector's host backend: {0}")]
    Hardware(#[from] HostError),
    /// A disk tier without a directory.
    #[error("a disk tier of {0} blocks needs a directory (disk_dir)")]
    NoDiskDir(usize),
    /// The disk tier's journal could not be read or started.
    #[error("the disk tier's journal in {dir}: {source}")]
    Journal {
        /// The directory.
        dir: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The blocks the journal names could not be adopted (a journal naming slots the
    /// tier does not have).
    #[error("the disk tier's journal: {0}")]
    Adopt(#[from] kvtwin::manager::AdoptError),
    /// A block of the wrong size, or a tier's read or write failed.
    #[error("block access: {0}")]
    Access(#[from] BlockAccessError),
    /// Host memory had no block to give (every one held by a load).
    #[error("host memory: {0}")]
    Alloc(#[from] AllocError),
    /// The caller could not fill a block to save.
    #[error("block {position} of the chain could not be read from the engine: {reason}")]
    Fill {
        /// Its index in the chain.
        position: usize,
        /// Why.
        reason: String,
    },
}

/// Why a load stopped before the end; the blocks before `loaded` are in place.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum LoadError {
    /// The block is no longer in any tier (evicted since the lookup).
    #[error("block {position} ({hash:?}) is no longer held")]
    Missing {
        /// Its index in the chain.
        position: usize,
        /// Its sequence hash.
        hash: SequenceHash,
    },
    /// Its bytes do not have the digest it was saved with, or its tier's own check
    /// failed (a disk block's checksum).
    #[error("block {position} ({hash:?}) is corrupt in {tier}: {reason}")]
    Corrupt {
        /// Its index in the chain.
        position: usize,
        /// Its sequence hash.
        hash: SequenceHash,
        /// Where it was read from.
        tier: Tier,
        /// What failed.
        reason: String,
    },
}

/// What a lookup found: the leading run of the chain the store holds, by the tier each
/// block is read from (the fastest holding it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Found {
    /// Blocks in host memory.
    pub memory: usize,
    /// Blocks only on disk.
    pub disk: usize,
}

impl Found {
    /// Blocks found in all.
    pub fn blocks(&self) -> usize {
        self.memory + self.disk
    }
}

/// Counters since the store started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Blocks saved (copied in and registered).
    pub saved_blocks: u64,
    /// Blocks a save skipped as already held.
    pub already_held_blocks: u64,
    /// Blocks loaded from host memory.
    pub loaded_memory_blocks: u64,
    /// Blocks loaded from disk.
    pub loaded_disk_blocks: u64,
    /// Loads that stopped at a corrupt block.
    pub corrupt_blocks: u64,
    /// Loads that stopped at a block evicted since the lookup.
    pub missing_blocks: u64,
    /// Events dropped from the full queue.
    pub dropped_events: u64,
    /// Blocks a persistent disk tier found at start and kept.
    pub adopted_blocks: u64,
    /// Blocks its journal named that were not kept (their parent was gone).
    pub orphaned_blocks: u64,
    /// Journal writes that failed; after the first the tier goes on unjournaled (it
    /// works, and the next store finds what the journal had until then).
    pub journal_errors: u64,
}

/// A block's identity, its digest and the tiers holding it (bit `1 << tier index`).
#[derive(Clone, Copy, Debug)]
struct Held {
    identity: BlockIdentity,
    digest: blake3::Hash,
    tiers: u8,
}

/// A journaled disk tier: the journal, where each disk block lies (and in what order
/// it landed, for a compaction that keeps the eviction order), and what to append.
struct DiskIndex {
    journal: Option<Journal>,
    dir: PathBuf,
    slots: BTreeMap<SequenceHash, (u64, BlockId)>,
    landed: u64,
    stored: Vec<Entry>,
    removed: Vec<(BlockId, SequenceHash)>,
    /// Records past which the journal is compacted.
    compact_at: u64,
}

/// The connector's tiers; see the module documentation.
pub struct TierStore {
    manager: Manager<HostHardware>,
    held: BTreeMap<SequenceHash, Held>,
    /// Blocks of `held` in host memory and on disk ([`tier_slot`]).
    in_tier: [usize; 2],
    events: VecDeque<KvCacheEvent>,
    /// Blocks that became held (in some tier) or stopped being held since the last
    /// [`TierStore::take_held_changes`], in order; at most [`EVENT_QUEUE_BOUND`].
    changes: VecDeque<HeldChange>,
    stats: StoreStats,
    /// With a persistent disk tier.
    index: Option<DiskIndex>,
}

/// A block that became held by some tier, or is held by none any more.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeldChange {
    /// Some tier holds it now, none did before.
    Held(SequenceHash),
    /// No tier holds it now.
    Gone(SequenceHash),
}

impl TierStore {
    /// Host memory of `memory_blocks`, written through to `disk_blocks` on disk.
    pub fn new(config: StoreConfig) -> Result<Self, StoreError> {
        let lru = |tier, capacity_blocks, offload| TierConfig {
            tier,
            capacity_blocks,
            eviction: EvictionPolicyKind::Lru,
            offload,
        };
        let mut tiers = Vec::new();
        if config.disk_blocks > 0 {
            if config.disk_dir.is_none() {
                return Err(StoreError::NoDiskDir(config.disk_blocks));
            }
            tiers.push(lru(
                Tier::Device,
                config.memory_blocks,
                OffloadPolicy::WriteThrough,
            ));
            tiers.push(lru(Tier::Disk, config.disk_blocks, OffloadPolicy::None));
        } else {
            tiers.push(lru(Tier::Device, config.memory_blocks, OffloadPolicy::None));
        }
        let manager_config = ManagerConfig {
            worker_id: WorkerId::new(0),
            dp_rank: 0,
            block_size_tokens: config.block_size_tokens,
            bytes_per_block: config.block_bytes as u64,
            tiers,
            // Every block found is loaded: the engine asked for it.
            onboard: OnboardPolicy::Always,
            max_inflight_transfers: 64,
        };
        manager_config.validate()?;
        let persistent = config.persistent && config.disk_blocks > 0;
        let hardware = HostHardware::new(HostConfig {
            disk_persistent: persistent,
            ..HostConfig::for_manager(&manager_config, config.disk_dir.as_deref())
        })?;
        let manager = Manager::new(hardware, manager_config)?;
        let mut store = Self {
            manager,
            held: BTreeMap::new(),
            in_tier: [0; 2],
            events: VecDeque::new(),
            changes: VecDeque::new(),
            stats: StoreStats::default(),
            index: None,
        };
        if let (true, Some(dir)) = (persistent, &config.disk_dir) {
            store.reopen_disk(dir, &config)?;
        }
        Ok(store)
    }

    /// Adopts what the journal in `dir` says the disk tier's reopened file holds, then
    /// starts a fresh journal of what was kept.
    fn reopen_disk(
        &mut self,
        dir: &std::path::Path,
        config: &StoreConfig,
    ) -> Result<(), StoreError> {
        let journal_error = |source| StoreError::Journal {
            dir: dir.to_path_buf(),
            source,
        };
        let geometry = Geometry {
            block_bytes: config.block_bytes as u64,
            block_tokens: config.block_size_tokens as u64,
            capacity: config.disk_blocks as u64,
        };
        // A fresh extent (none there, or of another size) holds nothing, whatever the
        // journal says.
        let entries = if self.manager.hardware().disk_reopened() {
            Journal::read(dir, Some(geometry)).map_err(journal_error)?.0
        } else {
            Vec::new()
        };
        for entry in &entries {
            self.held.insert(
                entry.identity.sequence_hash,
                Held {
                    identity: entry.identity,
                    digest: blake3::Hash::from_bytes(entry.digest),
                    tiers: 0,
                },
            );
        }
        let placed: Vec<(BlockId, BlockIdentity)> =
            entries.iter().map(|e| (e.slot, e.identity)).collect();
        let now = self.now();
        let adopted = self.manager.adopt(Tier::Disk, &placed, now)?;
        self.stats.adopted_blocks = adopted.blocks as u64;
        self.stats.orphaned_blocks = adopted.orphans as u64;
        self.index = Some(DiskIndex {
            journal: None,
            dir: dir.to_path_buf(),
            slots: BTreeMap::new(),
            landed: 0,
            stored: Vec::new(),
            removed: Vec::new(),
            compact_at: 2 * config.disk_blocks as u64 + 1024,
        });
        // Files the adopted blocks (their Stored events) as held, on disk.
        self.pump();
        self.held.retain(|_, held| held.tiers != 0);
        let kept: Vec<Entry> = entries
            .into_iter()
            .filter(|entry| self.held.contains_key(&entry.identity.sequence_hash))
            .collect();
        // The pump above had no journal to append to: what it filed is in `kept`.
        let journal = Journal::create(dir, geometry, &kept).map_err(journal_error)?;
        if let Some(index) = &mut self.index {
            index.journal = Some(journal);
        }
        Ok(())
    }

    /// Bytes of one block.
    pub fn block_bytes(&self) -> usize {
        self.manager.hardware().block_bytes()
    }

    /// The counters.
    pub fn stats(&self) -> StoreStats {
        self.stats
    }

    /// Blocks in host memory and on disk (a block written through is in both).
    pub fn blocks_by_tier(&self) -> (usize, usize) {
        (self.in_tier[0], self.in_tier[1])
    }

    /// Blocks whose digest the store keeps: those some tier holds.
    pub fn held_blocks(&self) -> usize {
        self.held.len()
    }

    /// Saves the blocks of `chain` (parent first) the store does not hold yet; `fill`
    /// writes block `i`'s bytes into the buffer it is given. How many were saved.
    pub fn save<E: std::fmt::Display>(
        &mut self,
        chain: &[BlockIdentity],
        mut fill: impl FnMut(usize, &mut [u8]) -> Result<(), E>,
    ) -> Result<usize, StoreError> {
        let hashes: Vec<SequenceHash> = chain.iter().map(|id| id.sequence_hash).collect();
        let start = self.lookup(&hashes).blocks();
        self.stats.already_held_blocks += start as u64;
        let mut buffer = vec![0u8; self.block_bytes()];
        let capacity = self.manager.device().capacity().max(1);
        let mut saved = 0;
        // No more blocks at once than host memory holds: each run is registered (and
        // written through) before the next one evicts it.
        for run_start in (start..chain.len()).step_by(capacity) {
            let run = &chain[run_start..chain.len().min(run_start + capacity)];
            let blocks = self.allocate(run.len())?;
            // What the allocation evicted is filed before this run's blocks are: a block
            // it evicted from every tier and this run saves again must come out held
            // (filed after, its Removed would drop the digest the run just kept).
            self.pump();
            let mut complete = Vec::with_capacity(run.len());
            for (offset, (block, identity)) in blocks.into_iter().zip(run).enumerate() {
                let position = run_start + offset;
                fill(position, &mut buffer).map_err(|e| StoreError::Fill {
                    position,
                    reason: e.to_string(),
                })?;
                self.manager
                    .hardware()
                    .write_block(Tier::Device, block.block_id(), &buffer)?;
                let digest = blake3::hash(&buffer);
                self.held
                    .entry(identity.sequence_hash)
                    .and_modify(|held| held.digest = digest)
                    .or_insert(Held {
                        identity: *identity,
                        digest,
                        tiers: 0,
                    });
                complete.push(block.apply_identity(*identity));
            }
            // Registering starts the copy to disk, which is skipped, not queued, when as
            // many copies are in flight as the manager allows: wait for room, so that
            // every saved block reaches the disk tier.
            self.wait_for_transfer_room();
            let now = self.now();
            let registered = self.manager.register(complete, now);
            self.manager.device().release(registered);
            saved += run.len();
            self.pump();
        }
        self.stats.saved_blocks += saved as u64;
        Ok(saved)
    }

    /// The leading run of `hashes` the store holds, by tier.
    pub fn lookup(&mut self, hashes: &[SequenceHash]) -> Found {
        let (_plan, sources) = self.held_run(hashes);
        let disk = sources.iter().filter(|s| s.0 == Tier::Disk).count();
        Found {
            memory: sources.len() - disk,
            disk,
        }
    }

    /// The manager's plan for the leading run of `hashes` held (which keeps every block
    /// it names from eviction while it lives) and, per block, the tier it is read from,
    /// its id there and its sequence hash.
    fn held_run(
        &mut self,
        hashes: &[SequenceHash],
    ) -> (LookupPlan, Vec<(Tier, BlockId, SequenceHash)>) {
        self.pump();
        let now = self.now();
        let plan = self.manager.lookup(hashes, now);
        let sources = plan
            .device_blocks()
            .block_ids()
            .zip(plan.device_blocks().sequence_hashes())
            .map(|(id, hash)| (Tier::Device, id, hash))
            .chain(
                plan.onboard_blocks()
                    .iter()
                    .map(|b| (b.tier(), b.block_id(), b.sequence_hash())),
            )
            .collect();
        (plan, sources)
    }

    /// Loads the leading run of `hashes` the store holds, each block's bytes handed to
    /// `sink(i, bytes)` once its digest checks. How many were loaded; a load that stops
    /// before the run's end says why, with the blocks before it in place. A corrupt
    /// block leaves the tier it was read from.
    pub fn load(
        &mut self,
        hashes: &[SequenceHash],
        mut sink: impl FnMut(usize, &[u8]),
    ) -> Result<usize, (usize, LoadError)> {
        let (plan, sources) = self.held_run(hashes);
        let count = sources.len();
        let mut buffer = vec![0u8; self.block_bytes()];
        for (position, (tier, id, hash)) in sources.into_iter().enumerate() {
            let corrupt = |reason: String| LoadError::Corrupt {
                position,
                hash,
                tier,
                reason,
            };
            let Some(held) = self.held.get(&hash).copied() else {
                self.stats.missing_blocks += 1;
                return Err((position, LoadError::Missing { position, hash }));
            };
            let bad = match self.manager.hardware().read_block(tier, id, &mut buffer) {
                Err(e) => Some(e.to_string()),
                Ok(()) => {
                    let digest = blake3::hash(&buffer);
                    (digest != held.digest).then(|| {
                        format!(
                            "BLAKE3 {} where it was saved as {}",
                            digest.to_hex(),
                            held.digest.to_hex()
                        )
                    })
                }
            };
            if let Some(reason) = bad {
                // Its copy there is no copy: the tier forgets it (a Removed event), so
                // the engine's recompute saves it again instead of finding it held.
                self.stats.corrupt_blocks += 1;
                self.manager.forget_corrupt_blocks(tier, &[hash]);
                drop(plan);
                self.pump();
                return Err((position, corrupt(reason)));
            }
            match tier {
                Tier::Disk => self.stats.loaded_disk_blocks += 1,
                _ => self.stats.loaded_memory_blocks += 1,
            }
            sink(position, &buffer);
        }
        // The plan held every block it named until here.
        drop(plan);
        Ok(count)
    }

    /// Waits (at most `patience`) until every copy down to disk has landed (and, for a
    /// persistent disk tier, its journal is written out); whether they all did.
    pub fn flush(&mut self, patience: Duration) -> bool {
        let deadline = Instant::now() + patience;
        loop {
            self.pump();
            if self.manager.transfers_in_flight() == 0 {
                if let Some(journal) = self.index.as_ref().and_then(|i| i.journal.as_ref()) {
                    if journal.sync().is_err() {
                        self.stats.journal_errors += 1;
                    }
                }
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            self.manager
                .hardware()
                .wait_completion(Duration::from_millis(20));
        }
    }

    /// The manager's events since the last call, oldest first (at most
    /// [`EVENT_QUEUE_BOUND`]; older ones were dropped and counted).
    pub fn take_events(&mut self) -> Vec<KvCacheEvent> {
        self.pump();
        self.events.drain(..).collect()
    }

    /// `count` blocks of host memory. When every block is still being written through
    /// to disk, the save waits for those copies (at most [`SAVE_PATIENCE`]): the disk's
    /// speed is the store's backpressure.
    fn allocate(
        &mut self,
        count: usize,
    ) -> Result<Vec<kvtwin::pool::MutableBlock<kvtwin::block::Reset>>, StoreError> {
        let deadline = Instant::now() + SAVE_PATIENCE;
        loop {
            let now = self.now();
            match self.manager.allocate(count, now) {
                Ok(blocks) => return Ok(blocks),
                Err(AllocError::Exhausted { .. })
                    if self.manager.transfers_in_flight() > 0 && Instant::now() < deadline =>
                {
                    self.manager
                        .hardware()
                        .wait_completion(Duration::from_millis(20));
                    self.pump();
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Waits (at most [`SAVE_PATIENCE`]) while the manager has as many copies in flight
    /// as it allows.
    fn wait_for_transfer_room(&mut self) {
        let limit = self.manager.config().max_inflight_transfers;
        let deadline = Instant::now() + SAVE_PATIENCE;
        while self.manager.transfers_in_flight() >= limit && Instant::now() < deadline {
            self.manager
                .hardware()
                .wait_completion(Duration::from_millis(20));
            self.pump();
        }
    }

    /// Which blocks became held or stopped being held since the last call, in order:
    /// what a mirror of the store's contents (the connector's scheduler side, in another
    /// process) applies. A mirror that misses changes (more than [`EVENT_QUEUE_BOUND`]
    /// between calls; counted in `dropped_events`) only costs load errors, which the
    /// engine recomputes.
    pub fn take_held_changes(&mut self) -> Vec<HeldChange> {
        self.pump();
        self.changes.drain(..).collect()
    }

    fn change(&mut self, change: HeldChange) {
        push_bounded(&mut self.changes, change, &mut self.stats.dropped_events);
    }

    fn now(&self) -> Timestamp {
        self.manager.hardware().clock().now()
    }

    /// Lands finished copies and files the manager's events: which tiers hold which
    /// blocks (digests of blocks no tier holds are dropped), and the publisher's queue.
    fn pump(&mut self) {
        let now = self.now();
        self.manager.handle_completions(now);
        while self.manager.poll_output().is_some() {}
        for event in self.manager.take_events() {
            match &event.data {
                KvCacheEventData::Stored { blocks, tier, .. } => {
                    for block in blocks {
                        let Some(held) = self.held.get_mut(&block.block_hash) else {
                            continue;
                        };
                        let first = held.tiers == 0;
                        if held.tiers & tier_bit(*tier) == 0 {
                            self.in_tier[tier_slot(*tier)] += 1;
                        }
                        held.tiers |= tier_bit(*tier);
                        let held = *held;
                        if *tier == Tier::Disk {
                            self.landed_on_disk(block.block_hash, held);
                        }
                        if first {
                            self.change(HeldChange::Held(block.block_hash));
                        }
                    }
                }
                KvCacheEventData::Removed { block_hashes, tier } => {
                    for hash in block_hashes {
                        if *tier == Tier::Disk {
                            self.left_disk(*hash);
                        }
                        let Some(held) = self.held.get_mut(hash) else {
                            continue;
                        };
                        if held.tiers & tier_bit(*tier) != 0 {
                            self.in_tier[tier_slot(*tier)] -= 1;
                        }
                        held.tiers &= !tier_bit(*tier);
                        if held.tiers == 0 {
                            self.held.remove(hash);
                            self.change(HeldChange::Gone(*hash));
                        }
                    }
                }
                KvCacheEventData::Cleared => {
                    let gone: Vec<SequenceHash> = self.held.keys().copied().collect();
                    self.held.clear();
                    self.in_tier = [0; 2];
                    for hash in gone {
                        self.left_disk(hash);
                        self.change(HeldChange::Gone(hash));
                    }
                }
            }
            push_bounded(&mut self.events, event, &mut self.stats.dropped_events);
        }
        self.write_journal();
    }

    /// A disk copy of `hash` landed: where, for the journal.
    fn landed_on_disk(&mut self, hash: SequenceHash, held: Held) {
        let Some(index) = &mut self.index else {
            return;
        };
        let Some(slot) = self
            .manager
            .pool(Tier::Disk)
            .and_then(|pool| pool.block_id_of(hash))
        else {
            return;
        };
        index.landed += 1;
        index.slots.insert(hash, (index.landed, slot));
        index.stored.push(Entry {
            slot,
            identity: held.identity,
            digest: *held.digest.as_bytes(),
        });
    }

    /// `hash` left the disk tier.
    fn left_disk(&mut self, hash: SequenceHash) {
        let Some(index) = &mut self.index else {
            return;
        };
        if let Some((_, slot)) = index.slots.remove(&hash) {
            index
                .stored
                .retain(|entry| entry.identity.sequence_hash != hash);
            index.removed.push((slot, hash));
        }
    }

    /// Appends what landed on and left the disk since the last call to the journal, and
    /// compacts it when it has grown past its bound. A failed write stops journaling.
    fn write_journal(&mut self) {
        let Some(index) = &mut self.index else {
            return;
        };
        let stored = std::mem::take(&mut index.stored);
        let removed = std::mem::take(&mut index.removed);
        let Some(journal) = &mut index.journal else {
            return;
        };
        let mut written = journal.append(&stored, &removed);
        if written.is_ok() && journal.records() > index.compact_at {
            let mut live: Vec<(u64, Entry)> = index
                .slots
                .iter()
                .filter_map(|(hash, &(order, slot))| {
                    let held = self.held.get(hash)?;
                    Some((
                        order,
                        Entry {
                            slot,
                            identity: held.identity,
                            digest: *held.digest.as_bytes(),
                        },
                    ))
                })
                .collect();
            live.sort_by_key(|(order, _)| *order);
            let live: Vec<Entry> = live.into_iter().map(|(_, entry)| entry).collect();
            written = journal.rewrite(&live);
        }
        if written.is_err() {
            self.stats.journal_errors += 1;
            index.journal = None;
        }
    }

    /// Where the persistent disk tier keeps its file and journal, if it has one.
    pub fn disk_dir(&self) -> Option<&std::path::Path> {
        self.index.as_ref().map(|index| index.dir.as_path())
    }
}

/// Appends `item`, dropping (and counting in `dropped`) the oldest when `queue` holds
/// [`EVENT_QUEUE_BOUND`] already.
fn push_bounded<T>(queue: &mut VecDeque<T>, item: T, dropped: &mut u64) {
    if queue.len() == EVENT_QUEUE_BOUND {
        queue.pop_front();
        *dropped += 1;
    }
    queue.push_back(item);
}

fn tier_bit(tier: Tier) -> u8 {
    match tier {
        Tier::Device => 1,
        Tier::Host => 2,
        Tier::Disk => 4,
        Tier::Remote => 8,
    }
}

#[cfg(test)]
mod tests;

/// Where a tier's count is in [`TierStore::blocks_by_tier`]: the store's tiers are its
/// host memory (the manager's first) and its disk.
fn tier_slot(tier: Tier) -> usize {
    match tier {
        Tier::Disk => 1,
        _ => 0,
    }
}
