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
//! Owns: [`TierStore`] (save, lookup, load, flush), [`StoreConfig`], [`Found`],
//! [`StoreStats`], [`StoreError`], the bounded queue of the manager's events.
//! Never: know the engine's layout (the caller fills and drains block buffers), block on
//! a transfer except in [`TierStore::flush`], or keep a digest of a block no tier holds.

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
}

/// A block's digest and the tiers holding it (bit `1 << tier index`).
#[derive(Clone, Copy, Debug)]
struct Held {
    digest: blake3::Hash,
    tiers: u8,
}

/// The connector's tiers; see the module documentation.
pub struct TierStore {
    manager: Manager<HostHardware>,
    held: BTreeMap<SequenceHash, Held>,
    events: VecDeque<KvCacheEvent>,
    /// Blocks that became held (in some tier) or stopped being held since the last
    /// [`TierStore::take_held_changes`], in order; at most [`EVENT_QUEUE_BOUND`].
    changes: VecDeque<HeldChange>,
    stats: StoreStats,
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
        let hardware = HostHardware::new(HostConfig::for_manager(
            &manager_config,
            config.disk_dir.as_deref(),
        ))?;
        let manager = Manager::new(hardware, manager_config)?;
        Ok(Self {
            manager,
            held: BTreeMap::new(),
            events: VecDeque::new(),
            changes: VecDeque::new(),
            stats: StoreStats::default(),
        })
    }

    /// Bytes of one block.
    pub fn block_bytes(&self) -> usize {
        self.manager.hardware().block_bytes()
    }

    /// The counters.
    pub fn stats(&self) -> StoreStats {
        self.stats
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
            let now = self.now();
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
                    .or_insert(Held { digest, tiers: 0 });
                complete.push(block.apply_identity(*identity));
            }
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
    /// before the run's end says why, with the blocks before it in place.
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
            if let Err(e) = self.manager.hardware().read_block(tier, id, &mut buffer) {
                self.stats.corrupt_blocks += 1;
                return Err((position, corrupt(e.to_string())));
            }
            let digest = blake3::hash(&buffer);
            if digest != held.digest {
                self.stats.corrupt_blocks += 1;
                return Err((
                    position,
                    corrupt(format!(
                        "BLAKE3 {} where it was saved as {}",
                        digest.to_hex(),
                        held.digest.to_hex()
                    )),
                ));
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

    /// Waits (at most `patience`) until every copy down to disk has landed; whether they
    /// all did.
    pub fn flush(&mut self, patience: Duration) -> bool {
        let deadline = Instant::now() + patience;
        loop {
            self.pump();
            if self.manager.transfers_in_flight() == 0 {
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
                        held.tiers |= tier_bit(*tier);
                        if first {
                            self.change(HeldChange::Held(block.block_hash));
                        }
                    }
                }
                KvCacheEventData::Removed { block_hashes, tier } => {
                    for hash in block_hashes {
                        let Some(held) = self.held.get_mut(hash) else {
                            continue;
                        };
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
                    for hash in gone {
                        self.change(HeldChange::Gone(hash));
                    }
                }
            }
            push_bounded(&mut self.events, event, &mut self.stats.dropped_events);
        }
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
mod tests {
    use super::*;
    use kvtwin::ids::LocalBlockHash;

    const BYTES: usize = 4096;

    fn store(memory_blocks: usize, disk_blocks: usize, dir: &tempfile::TempDir) -> TierStore {
        TierStore::new(StoreConfig {
            block_bytes: BYTES,
            block_size_tokens: 16,
            memory_blocks,
            disk_blocks,
            disk_dir: Some(dir.path().to_path_buf()),
        })
        .unwrap()
    }

    /// A chain of `len` blocks of family `family` (equal families share prefixes).
    fn chain(family: u64, len: u64) -> Vec<BlockIdentity> {
        let locals: Vec<LocalBlockHash> = (0..len)
            .map(|i| LocalBlockHash::new(family * 1000 + i))
            .collect();
        BlockIdentity::chain(&locals)
    }

    fn hashes(chain: &[BlockIdentity]) -> Vec<SequenceHash> {
        chain.iter().map(|id| id.sequence_hash).collect()
    }

    /// Block `i`'s bytes: its index and sequence hash, repeated.
    fn content(id: &BlockIdentity) -> Vec<u8> {
        let seed = id.sequence_hash.get().to_le_bytes();
        (0..BYTES)
            .map(|i| seed[i % 8] ^ (i / 8) as u8 ^ id.position as u8)
            .collect()
    }

    fn save(store: &mut TierStore, chain: &[BlockIdentity]) -> usize {
        store
            .save(chain, |i, out: &mut [u8]| {
                out.copy_from_slice(&content(&chain[i]));
                Ok::<(), String>(())
            })
            .unwrap()
    }

    fn load(store: &mut TierStore, chain: &[BlockIdentity]) -> (Vec<Vec<u8>>, Option<LoadError>) {
        let mut blocks = Vec::new();
        let result = store.load(&hashes(chain), |i, bytes| {
            assert_eq!(i, blocks.len());
            blocks.push(bytes.to_vec());
        });
        (blocks, result.err().map(|(_, e)| e))
    }

    #[test]
    fn saved_blocks_come_back_byte_for_byte_from_memory_and_disk() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = store(4, 16, &dir);
        let blocks = chain(1, 6);
        assert_eq!(save(&mut store, &blocks), 6);
        assert!(store.flush(Duration::from_secs(10)));
        // Memory holds the last four; the first two were evicted and are only on disk
        // (the lookup may read more of the run from disk, where all six are).
        let found = store.lookup(&hashes(&blocks));
        assert_eq!(found.blocks(), 6);
        assert!(found.disk >= 2, "{found:?}");
        let (loaded, error) = load(&mut store, &blocks);
        assert_eq!(error, None);
        assert_eq!(loaded.len(), 6);
        for (bytes, id) in loaded.iter().zip(&blocks) {
            assert!(*bytes == content(id), "block {}", id.position);
        }
        let stats = store.stats();
        assert_eq!(
            (stats.loaded_memory_blocks, stats.loaded_disk_blocks),
            (found.memory as u64, found.disk as u64)
        );
        // A longer prompt of the same prefix finds the six and loads only them.
        let longer = chain(1, 9);
        assert_eq!(store.lookup(&hashes(&longer)).blocks(), 6);
        assert_eq!(load(&mut store, &longer).0.len(), 6);
        // Saving the longer one adds its three new blocks only.
        assert_eq!(save(&mut store, &longer), 3);
        assert_eq!(store.stats().already_held_blocks, 6);
    }

    #[test]
    fn a_corrupt_block_stops_the_load_there() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = store(8, 0, &dir);
        let blocks = chain(2, 4);
        save(&mut store, &blocks);
        // Block 2's bytes change under the store.
        let plan = store.manager.lookup(&hashes(&blocks), store.now());
        let id = plan.device_blocks().block_ids().nth(2).unwrap();
        drop(plan);
        store
            .manager
            .hardware()
            .write_block(Tier::Device, id, &vec![0xAB; BYTES])
            .unwrap();
        let (loaded, error) = load(&mut store, &blocks);
        assert_eq!(loaded.len(), 2, "the blocks before it are loaded");
        assert!(
            matches!(
                error,
                Some(LoadError::Corrupt {
                    position: 2,
                    tier: Tier::Device,
                    ..
                })
            ),
            "{error:?}"
        );
        assert_eq!(store.stats().corrupt_blocks, 1);
    }

    #[test]
    fn evicted_blocks_are_neither_found_nor_remembered() {
        let dir = tempfile::tempdir().unwrap();
        let mut store = store(2, 0, &dir);
        let first = chain(3, 2);
        let second = chain(4, 2);
        save(&mut store, &first);
        save(&mut store, &second);
        assert_eq!(store.lookup(&hashes(&first)), Found::default());
        assert_eq!(store.lookup(&hashes(&second)).blocks(), 2);
        // Only the held blocks' digests are kept.
        assert_eq!(store.held_blocks(), 2);
        // The events say so: two stored, two removed, two stored.
        let events = store.take_events();
        let removed: usize = events
            .iter()
            .map(|e| match &e.data {
                KvCacheEventData::Removed { block_hashes, .. } => block_hashes.len(),
                _ => 0,
            })
            .sum();
        assert_eq!(removed, 2);
        // And the changes a mirror applies: four held, the first two gone (a chain's
        // tail is evicted before its head).
        let (a, b) = (hashes(&first), hashes(&second));
        assert_eq!(
            store.take_held_changes(),
            vec![
                HeldChange::Held(a[0]),
                HeldChange::Held(a[1]),
                HeldChange::Gone(a[1]),
                HeldChange::Gone(a[0]),
                HeldChange::Held(b[0]),
                HeldChange::Held(b[1]),
            ]
        );
        assert!(store.take_held_changes().is_empty());
    }

    #[test]
    fn a_disk_tier_without_a_directory_is_refused() {
        let error = TierStore::new(StoreConfig {
            block_bytes: BYTES,
            block_size_tokens: 16,
            memory_blocks: 4,
            disk_blocks: 4,
            disk_dir: None,
        })
        .err()
        .expect("refused");
        assert_eq!(
            error.to_string(),
            "a disk tier of 4 blocks needs a directory (disk_dir)"
        );
    }
}
