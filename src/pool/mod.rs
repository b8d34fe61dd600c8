//! One tier's block pool: fixed capacity, active and inactive blocks, the registry, lazy
//! eviction and the pool's event outbox.
//!
//! Owns: every block of one tier from construction to drop. A block is always in exactly
//! one place:
//! - **free**: state Reset, in the free stack;
//! - **active**: held through a handle, either a [`MutableBlock`] (Reset / Partial /
//!   Complete, exclusive) or one or more [`ImmutableBlock`]s (Registered, refcount > 0);
//! - **cached**: Registered with refcount 0, in the eviction policy's order.
//!
//! A whole tier can be lost at once ([`BlockPool::invalidate_all`], a failed SSD), or
//! some of its blocks ([`BlockPool::invalidate`], bytes that failed their checksum): every
//! such registered block leaves the registry with a `Removed`; those still referenced stay
//! active, findable by nobody, until their last handle drops them back to free.
//!
//! free + cached + active = capacity, always. Registered blocks are found by
//! `SequenceHash`; registering a hash the pool already holds returns the existing block
//! (deduplication: a hash is registered at most once per tier). A cached block keeps its
//! hash until a new allocation needs it (lazy eviction, as vLLM), so a late prefix hit is
//! free; only then is `Removed` emitted. `Stored` is emitted on registration.
//!
//! Thread safety: handles may be dropped on any thread, so all state sits behind one
//! [`crate::sync::PoolLock`]: a mutex (loom-checked in `tests/loom_pool.rs`), or, for a
//! pool a simulator builds and runs on one thread (`new_single_threaded`), a lock without
//! atomic operations that panics on any other thread. Batch operations
//! (`allocate`, `match_prefix`, `register_chain`, `release`) take the lock once. The
//! pools of one manager also share [`SharedCounters`] (`counters.rs`): their events'
//! order across tiers and a count of changes, each pool writing its own slots. Events
//! wait in the pool's outbox (`outbox.rs`), whose block lists the manager hands back
//! for reuse ([`EventBuffers`]).
//! Never: move bytes, read a clock or talk to a transport.

mod checked;
mod counters;
mod handles;
mod list;
mod order;
mod outbox;
pub mod policy;

pub(crate) use counters::SharedCounters;
pub use handles::{BlockChain, ImmutableBlock, MutableBlock};
/// Index-linked lists over block ids (also the vLLM twin's free queue, in `kvtwin-sim`).
pub use list::IndexLists;
pub use outbox::EventBuffers;
pub use policy::{EvictionPolicy, EvictionPolicyKind, LruPolicy, Placement, PriorityPolicy};

use crate::block::{BlockIdentity, Complete, Reset};
use crate::events::KvCacheEventData;
use crate::ids::{BlockId, SequenceHash};
use crate::phase::Phase;
use crate::sync::{Arc, PoolLock};
use crate::tier::Tier;
use rustc_hash::FxHashMap;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// How a pool is built.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    /// The tier the pool's blocks live in (stamped on its events).
    pub tier: Tier,
    /// Number of blocks, fixed for the pool's life.
    pub capacity_blocks: usize,
    /// Tokens per block.
    pub block_size_tokens: usize,
    /// Eviction order of cached blocks.
    pub eviction: EvictionPolicyKind,
}

/// A pool could not be built.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PoolConfigError {
    /// Zero blocks.
    #[error("a pool needs at least one block")]
    ZeroCapacity,
    /// More blocks than a `BlockId` can name.
    #[error("{0} blocks exceed the largest pool ({max})", max = MAX_POOL_BLOCKS)]
    CapacityTooLarge(usize),
    /// Zero tokens per block.
    #[error("a block must hold at least one token")]
    ZeroBlockSize,
}

/// The largest pool: ids must fit in `u32` with room for the lists' sentinels.
pub const MAX_POOL_BLOCKS: usize = (u32::MAX - 16) as usize;

/// Allocation failed; nothing was allocated.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AllocError {
    /// Fewer free and cached blocks than requested: every other block is in use.
    #[error("{tier} pool exhausted: {requested} blocks requested, {available} free or cached")]
    Exhausted {
        /// The pool's tier.
        tier: Tier,
        /// Blocks asked for.
        requested: usize,
        /// Free plus cached blocks.
        available: usize,
    },
    /// A block asked for by its id is not free (cached, in use, out of range, or asked
    /// for twice).
    #[error("{tier} block {block:?} is not free")]
    NotFree {
        /// The pool's tier.
        tier: Tier,
        /// The block.
        block: BlockId,
    },
}

/// `reset_cache` refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ResetError {
    /// Registered blocks are still referenced; they cannot be forgotten under their users.
    #[error("{referenced} registered blocks are still referenced")]
    InUse {
        /// Referenced registered blocks.
        referenced: usize,
    },
}

/// Where the blocks are, right now.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolCounts {
    /// Fixed number of blocks.
    pub capacity: usize,
    /// Reset blocks nobody holds.
    pub free: usize,
    /// Registered blocks nobody holds (evictable, still findable).
    pub cached: usize,
    /// Blocks held through handles.
    pub active: usize,
}

/// Cumulative counters since the pool was built.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolStats {
    /// Blocks handed out by `allocate`.
    pub allocated_blocks: u64,
    /// Cached blocks evicted to satisfy allocations.
    pub evicted_blocks: u64,
    /// New registrations.
    pub registered_blocks: u64,
    /// Registrations answered with an existing block.
    pub deduplicated_blocks: u64,
    /// Blocks found by lookups while referenced.
    pub hits_active_blocks: u64,
    /// Blocks found by lookups while cached.
    pub hits_cached_blocks: u64,
    /// Allocation requests refused.
    pub failed_allocations: u64,
}

/// A consistent copy of a pool's registry and counts (for tests and reports).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PoolSnapshot {
    /// Block counts.
    pub counts: PoolCounts,
    /// Every registered hash with its refcount (0 = cached).
    pub registered: BTreeMap<SequenceHash, u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotState {
    Free,
    Mutable,
    Registered,
    /// Was registered, and left the registry while referenced (its tier failed, or its
    /// bytes did): the handles keep it until the last one drops it, straight back to free.
    Invalidated,
}

#[derive(Clone, Copy, Debug)]
struct Slot {
    state: SlotState,
    refcount: u32,
    phase: Phase,
    identity: BlockIdentity,
}

const EMPTY_IDENTITY: BlockIdentity = BlockIdentity {
    sequence_hash: SequenceHash::new(0),
    local_hash: crate::ids::LocalBlockHash::new(0),
    parent: None,
    position: 0,
};

#[derive(Debug)]
pub(crate) struct PoolInner {
    slots: Vec<Slot>,
    free: Vec<BlockId>,
    policy: order::EvictionOrder,
    registry: FxHashMap<SequenceHash, BlockId>,
    /// Queued events, each with its place in the order of events (see `next_stamp`).
    outbox: outbox::Outbox,
    /// The counters shared with the other pools of one manager, if any.
    shared: Option<Arc<SharedCounters>>,
    /// The order of a pool on its own.
    local_order: u64,
    stats: PoolStats,
    tier: Tier,
    /// Blocks that left the registry, ever (each with a `Removed`).
    removals: u64,
    /// The last of them (at most `checked::RECENT_REMOVALS`), oldest first.
    recent_removals: std::collections::VecDeque<SequenceHash>,
}

impl PoolInner {
    fn new(config: &PoolConfig) -> Self {
        let capacity = config.capacity_blocks;
        let slot = Slot {
            state: SlotState::Free,
            refcount: 0,
            phase: Phase::default(),
            identity: EMPTY_IDENTITY,
        };
        Self {
            slots: vec![slot; capacity],
            // Reversed so that blocks are handed out 0, 1, 2, ...: easier to read in traces.
            free: (0..capacity as u32).rev().map(BlockId::new).collect(),
            policy: order::EvictionOrder::new(
                policy::BuiltinPolicy::new(config.eviction, capacity),
                capacity,
            ),
            registry: FxHashMap::with_capacity_and_hasher(capacity, Default::default()),
            outbox: outbox::Outbox::default(),
            shared: None,
            local_order: 0,
            stats: PoolStats::default(),
            tier: config.tier,
            removals: 0,
            recent_removals: Default::default(),
        }
    }

    fn available(&self) -> usize {
        self.free.len() + self.policy.len()
    }

    /// Free → active, or cached → (evicted) → active.
    fn take_block(&mut self) -> Option<BlockId> {
        self.touch();
        let id = match self.free.pop() {
            Some(id) => id,
            None => {
                let victim = self.policy.pop_victim()?;
                self.evict(victim);
                victim
            }
        };
        let slot = &mut self.slots[id.index()];
        debug_assert_eq!(slot.state, SlotState::Free);
        slot.state = SlotState::Mutable;
        self.stats.allocated_blocks += 1;
        Some(id)
    }

    /// Registered (cached, already out of the policy) → Reset; emits `Removed`.
    fn evict(&mut self, id: BlockId) {
        // No `touch`: the Removed event counts the change (`SharedCounters::version`).
        let slot = &mut self.slots[id.index()];
        assert!(
            slot.state == SlotState::Registered && slot.refcount == 0,
            "evicting a block that is not cached: {id:?} {slot:?}"
        );
        let hash = slot.identity.sequence_hash;
        slot.state = SlotState::Free;
        slot.phase = Phase::default();
        let removed = self.registry.remove(&hash);
        debug_assert_eq!(removed, Some(id));
        self.stats.evicted_blocks += 1;
        self.push_removed(hash);
    }

    /// The place of the next event in the order of events of every pool sharing it: a
    /// manager merges its pools' outboxes by it, so that a consumer sees a block stored
    /// in one tier before its parent leaves another.
    fn next_stamp(&mut self) -> u64 {
        match &self.shared {
            Some(shared) => shared.next_stamp(self.tier),
            None => {
                self.local_order += 1;
                self.local_order
            }
        }
    }

    /// Counts a state change that pushes no event in the shared counters.
    #[inline]
    fn touch(&self) {
        if let Some(shared) = &self.shared {
            shared.touch(self.tier);
        }
    }

    fn push_removed(&mut self, hash: SequenceHash) {
        self.removals += 1;
        if self.recent_removals.len() == checked::RECENT_REMOVALS {
            self.recent_removals.pop_front();
        }
        self.recent_removals.push_back(hash);
        let stamp = self.next_stamp();
        self.outbox.push_removed(stamp, hash, self.tier);
    }

    fn push_stored(&mut self, identity: &BlockIdentity) {
        let stamp = self.next_stamp();
        self.outbox.push_stored(stamp, identity, self.tier);
    }

    /// Active mutable → free.
    fn return_mutable(&mut self, id: BlockId) {
        self.touch();
        let slot = &mut self.slots[id.index()];
        assert_eq!(slot.state, SlotState::Mutable, "double return of {id:?}");
        slot.state = SlotState::Free;
        self.free.push(id);
    }

    /// Takes a reference to a registered block (cached → active if it was cached).
    #[inline]
    fn acquire(&mut self, id: BlockId) {
        self.touch();
        let slot = &mut self.slots[id.index()];
        debug_assert!(
            slot.state == SlotState::Registered
                || (slot.state == SlotState::Invalidated && slot.refcount > 0),
            "acquiring a block that is not registered: {id:?} {slot:?}"
        );
        if slot.refcount == 0 {
            self.policy.remove(id);
        }
        slot.refcount = slot.refcount.checked_add(1).expect("refcount overflow");
    }

    /// References the block registered under `hash`, counting no lookup hit (a pin).
    #[inline]
    fn pin(&mut self, hash: SequenceHash) -> Option<(BlockId, BlockIdentity)> {
        let id = *self.registry.get(&hash)?;
        self.acquire(id);
        Some((id, self.slots[id.index()].identity))
    }

    /// A lookup found `id`: reference it and count the hit by where it was.
    #[inline]
    fn acquire_hit(&mut self, id: BlockId) -> BlockIdentity {
        let slot = &self.slots[id.index()];
        if slot.refcount == 0 {
            self.stats.hits_cached_blocks += 1;
        } else {
            self.stats.hits_active_blocks += 1;
        }
        let identity = slot.identity;
        self.acquire(id);
        identity
    }

    /// Drops a reference; the last one makes the block cached.
    #[inline]
    fn release(&mut self, id: BlockId, placement: Placement) {
        self.release_as(id, placement, false);
    }

    /// [`PoolInner::release`]; a block that becomes cached with `checked` (placed cold)
    /// joins the checked cold prefix (see `order.rs`).
    #[inline]
    fn release_as(&mut self, id: BlockId, placement: Placement, checked: bool) {
        self.touch();
        let slot = &mut self.slots[id.index()];
        assert!(
            matches!(slot.state, SlotState::Registered | SlotState::Invalidated)
                && slot.refcount > 0,
            "refcount underflow on {id:?}: {slot:?}"
        );
        slot.refcount -= 1;
        if slot.refcount == 0 {
            if slot.state == SlotState::Invalidated {
                // Nobody can find it any more: it is not cached, it is free.
                slot.state = SlotState::Free;
                slot.phase = Phase::default();
                self.free.push(id);
                return;
            }
            let phase = slot.phase;
            if checked {
                debug_assert_eq!(placement, Placement::Cold);
                self.policy.insert_cold_checked(id, phase);
            } else {
                self.policy.insert(id, phase, placement);
            }
        }
    }

    /// Every registered block leaves the registry, leaf first (by position, then hash,
    /// descending), each with a `Removed`: cached ones become free, referenced ones
    /// `Invalidated`. Returns how many left.
    fn invalidate_all(&mut self) -> usize {
        let registered: Vec<(u32, SequenceHash, BlockId)> = self
            .registry
            .iter()
            .map(|(hash, id)| (self.slots[id.index()].identity.position, *hash, *id))
            .collect();
        self.invalidate_entries(registered)
    }

    /// The registered blocks among `hashes` leave the registry as in `invalidate_all`;
    /// hashes not registered are skipped. Returns how many left.
    fn invalidate(&mut self, hashes: &[SequenceHash]) -> usize {
        let registered: Vec<(u32, SequenceHash, BlockId)> = hashes
            .iter()
            .filter_map(|hash| {
                let id = *self.registry.get(hash)?;
                Some((self.slots[id.index()].identity.position, *hash, id))
            })
            .collect();
        self.invalidate_entries(registered)
    }

    fn invalidate_entries(&mut self, mut registered: Vec<(u32, SequenceHash, BlockId)>) -> usize {
        self.touch();
        // A fixed order (never the map's or the caller's): the events are observable.
        registered.sort_unstable_by(|a, b| b.cmp(a));
        registered.dedup();
        for (_, hash, id) in &registered {
            self.registry.remove(hash);
            let slot = &mut self.slots[id.index()];
            if slot.refcount == 0 {
                self.policy.remove(*id);
                slot.state = SlotState::Free;
                slot.phase = Phase::default();
                self.free.push(*id);
            } else {
                slot.state = SlotState::Invalidated;
            }
            self.push_removed(*hash);
        }
        registered.len()
    }

    /// Complete (mutable) → Registered, or the existing block of the same hash.
    /// Returns the registered block and whether it was a duplicate.
    fn register(&mut self, id: BlockId, identity: &BlockIdentity) -> (BlockId, bool) {
        // A new registration's Stored event counts the change (`SharedCounters::version`).
        if let Some(&existing) = self.registry.get(&identity.sequence_hash) {
            self.touch();
            self.acquire(existing);
            self.return_mutable(id);
            self.stats.deduplicated_blocks += 1;
            return (existing, true);
        }
        let slot = &mut self.slots[id.index()];
        assert_eq!(
            slot.state,
            SlotState::Mutable,
            "registering a block not held mutably"
        );
        slot.state = SlotState::Registered;
        slot.refcount = 1;
        slot.identity = *identity;
        self.registry.insert(identity.sequence_hash, id);
        self.stats.registered_blocks += 1;
        self.push_stored(identity);
        (id, false)
    }

    fn set_phase(&mut self, id: BlockId, phase: Phase) {
        self.touch();
        let slot = &mut self.slots[id.index()];
        if slot.phase == phase {
            return;
        }
        slot.phase = phase;
        if slot.refcount == 0 {
            self.policy.reclassify(id, phase);
        }
    }

    fn counts(&self, capacity: usize) -> PoolCounts {
        let free = self.free.len();
        let cached = self.policy.len();
        PoolCounts {
            capacity,
            free,
            cached,
            active: capacity - free - cached,
        }
    }
}

#[derive(Debug)]
pub(crate) struct PoolShared {
    config: PoolConfig,
    inner: PoolLock<PoolInner>,
}

/// One tier's pool of blocks. Cheap to clone: clones share the same blocks.
#[derive(Clone, Debug)]
pub struct BlockPool {
    shared: Arc<PoolShared>,
}

impl BlockPool {
    /// A pool with every block free; its handles may be used and dropped on any thread.
    pub fn new(config: PoolConfig) -> Result<Self, PoolConfigError> {
        Self::build(config, PoolLock::shared)
    }

    /// A pool with every block free for the calling thread alone (a simulator's): it
    /// locks without atomic operations, and using it or its handles on any other thread
    /// panics ([`crate::sync::PoolLock`]).
    pub fn new_single_threaded(config: PoolConfig) -> Result<Self, PoolConfigError> {
        Self::build(config, PoolLock::owned_by_this_thread)
    }

    fn build(
        config: PoolConfig,
        lock: fn(PoolInner) -> PoolLock<PoolInner>,
    ) -> Result<Self, PoolConfigError> {
        if config.capacity_blocks == 0 {
            return Err(PoolConfigError::ZeroCapacity);
        }
        if config.capacity_blocks > MAX_POOL_BLOCKS {
            return Err(PoolConfigError::CapacityTooLarge(config.capacity_blocks));
        }
        if config.block_size_tokens == 0 {
            return Err(PoolConfigError::ZeroBlockSize);
        }
        let inner = lock(PoolInner::new(&config));
        Ok(Self {
            shared: Arc::new(PoolShared { config, inner }),
        })
    }

    /// The pool's configuration.
    pub fn config(&self) -> &PoolConfig {
        &self.shared.config
    }

    /// The pool's tier.
    pub fn tier(&self) -> Tier {
        self.shared.config.tier
    }

    /// Number of blocks.
    pub fn capacity(&self) -> usize {
        self.shared.config.capacity_blocks
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.shared.config.block_size_tokens
    }

    /// Takes `count` blocks in state Reset: free blocks first, then cached blocks in
    /// eviction order (each eviction emits `Removed`). All or nothing.
    pub fn allocate(&self, count: usize) -> Result<Vec<MutableBlock<Reset>>, AllocError> {
        let mut inner = self.shared.inner.lock();
        let available = inner.available();
        if count > available {
            inner.stats.failed_allocations += 1;
            return Err(AllocError::Exhausted {
                tier: inner.tier,
                requested: count,
                available,
            });
        }
        let mut blocks = Vec::with_capacity(count);
        for _ in 0..count {
            let id = inner
                .take_block()
                .expect("availability checked under the same lock");
            blocks.push(MutableBlock::new(Arc::clone(&self.shared), id));
        }
        Ok(blocks)
    }

    /// Takes the blocks `ids`, in that order and state Reset, each of which must be free
    /// (neither cached nor in use): for reopening a tier whose bytes outlive its process
    /// (a disk tier's file), where each block's place is known. All or nothing; evicts
    /// nothing.
    pub fn allocate_ids(&self, ids: &[BlockId]) -> Result<Vec<MutableBlock<Reset>>, AllocError> {
        let mut inner = self.shared.inner.lock();
        let mut wanted = vec![false; inner.slots.len()];
        for &id in ids {
            let free = inner
                .slots
                .get(id.index())
                .is_some_and(|slot| slot.state == SlotState::Free);
            if !free || std::mem::replace(&mut wanted[id.index()], true) {
                inner.stats.failed_allocations += 1;
                return Err(AllocError::NotFree {
                    tier: inner.tier,
                    block: id,
                });
            }
        }
        inner.touch();
        inner.free.retain(|id| !wanted[id.index()]);
        let mut blocks = Vec::with_capacity(ids.len());
        for &id in ids {
            inner.slots[id.index()].state = SlotState::Mutable;
            inner.stats.allocated_blocks += 1;
            blocks.push(MutableBlock::new(Arc::clone(&self.shared), id));
        }
        Ok(blocks)
    }

    /// Takes one block in state Reset (see [`BlockPool::allocate`]).
    pub fn allocate_one(&self) -> Result<MutableBlock<Reset>, AllocError> {
        let mut inner = self.shared.inner.lock();
        match inner.take_block() {
            Some(id) => Ok(MutableBlock::new(Arc::clone(&self.shared), id)),
            None => {
                inner.stats.failed_allocations += 1;
                Err(AllocError::Exhausted {
                    tier: inner.tier,
                    requested: 1,
                    available: 0,
                })
            }
        }
    }

    /// The longest prefix of `hashes` this pool holds, as references; cached blocks found
    /// become active. Stops at the first miss.
    pub fn match_prefix(&self, hashes: &[SequenceHash]) -> BlockChain {
        let mut out = BlockChain::for_pool(&self.shared, hashes.len());
        self.match_prefix_into(hashes, &mut out);
        out
    }

    /// [`BlockPool::match_prefix`] appending to `out` (a chain of this pool, or empty);
    /// returns the number of blocks found.
    pub fn match_prefix_into(&self, hashes: &[SequenceHash], out: &mut BlockChain) -> usize {
        out.adopt_pool(&self.shared);
        let mut inner = self.shared.inner.lock();
        let mut found = 0;
        for hash in hashes {
            let Some(&id) = inner.registry.get(hash) else {
                break;
            };
            let identity = inner.acquire_hit(id);
            out.push_counted(id, identity);
            found += 1;
        }
        found
    }

    /// A reference to the block registered under `hash`, if any.
    pub fn get(&self, hash: SequenceHash) -> Option<ImmutableBlock> {
        let mut inner = self.shared.inner.lock();
        let id = *inner.registry.get(&hash)?;
        let identity = inner.acquire_hit(id);
        Some(ImmutableBlock::new(Arc::clone(&self.shared), id, identity))
    }

    /// A reference to the block registered under `hash`, without counting a lookup hit:
    /// for the manager pinning a block while it copies it to another tier.
    pub fn pin(&self, hash: SequenceHash) -> Option<ImmutableBlock> {
        let (id, identity) = self.shared.inner.lock().pin(hash)?;
        Some(ImmutableBlock::new(Arc::clone(&self.shared), id, identity))
    }

    /// Whether `hash` is registered here (touches nothing).
    pub fn contains(&self, hash: SequenceHash) -> bool {
        self.shared.inner.lock().registry.contains_key(&hash)
    }

    /// The block registered under `hash`, if any, touching nothing (no reference, no hit,
    /// no change of its place in the eviction order): for indexing where blocks lie.
    pub fn block_id_of(&self, hash: SequenceHash) -> Option<BlockId> {
        self.shared.inner.lock().registry.get(&hash).copied()
    }

    /// How many leading `hashes` are registered here (touches nothing).
    pub fn prefix_len(&self, hashes: &[SequenceHash]) -> usize {
        let inner = self.shared.inner.lock();
        hashes
            .iter()
            .take_while(|h| inner.registry.contains_key(h))
            .count()
    }

    /// Complete → Registered. If the hash is already registered, `block` returns to the
    /// free blocks and the existing block is referenced instead (deduplication).
    pub fn register(&self, block: MutableBlock<Complete>) -> ImmutableBlock {
        self.register_reporting(block).0
    }

    /// [`BlockPool::register`], also telling whether the block was a duplicate.
    pub fn register_reporting(&self, block: MutableBlock<Complete>) -> (ImmutableBlock, bool) {
        assert!(
            block.belongs_to(&self.shared),
            "block registered in another pool"
        );
        let (id, identity) = block.into_registration();
        let mut inner = self.shared.inner.lock();
        let (registered, duplicate) = inner.register(id, &identity);
        let identity = inner.slots[registered.index()].identity;
        (
            ImmutableBlock::new(Arc::clone(&self.shared), registered, identity),
            duplicate,
        )
    }

    /// Registers a chain parent first under one lock; consecutive blocks are published as
    /// one `Stored` event.
    pub fn register_chain(&self, mut blocks: Vec<MutableBlock<Complete>>) -> BlockChain {
        let mut out = BlockChain::for_pool(&self.shared, blocks.len());
        let mut inner = self.shared.inner.lock();
        for block in &mut blocks {
            assert!(
                block.belongs_to(&self.shared),
                "block registered in another pool"
            );
            let (id, identity) = block.hand_to_registry();
            let (registered, duplicate) = inner.register(id, identity);
            // A duplicate's identity is the registered block's; a new one's is `identity`
            // (not read back from the slot just written: a load spanning the stores that
            // wrote it waits for them, issue 33).
            let identity = if duplicate {
                inner.slots[registered.index()].identity
            } else {
                *identity
            };
            out.push_counted(registered, identity);
        }
        drop(inner);
        // Every handle was handed on: dropping them returns nothing to the pool.
        drop(blocks);
        out
    }

    /// Lets go of a chain (parent first, as lookups return it) leaf first, under one lock,
    /// so that among blocks released together the leaves are evicted first. Dropping a
    /// [`BlockChain`] does the same; this also takes a `Vec` of handles of one pool.
    pub fn release(&self, blocks: impl Into<BlockChain>) {
        drop(blocks.into());
    }

    /// Like [`BlockPool::release`], but blocks whose last reference this is become the
    /// next to evict (used after a block was copied to a lower tier).
    pub fn release_cold(&self, blocks: impl Into<BlockChain>) {
        blocks.into().release_cold();
    }

    /// Tags registered blocks with `phase` (the priority policy orders by it); returns how
    /// many of `hashes` were found. `hashes` is a chain, parent first.
    pub fn set_phase(&self, hashes: &[SequenceHash], phase: Phase) -> usize {
        let mut inner = self.shared.inner.lock();
        let mut found = 0;
        // Leaf first: re-tagged cached blocks join their class's hot end one by one, so
        // the leaf must go in first to stay colder than its parent.
        for hash in hashes.iter().rev() {
            if let Some(&id) = inner.registry.get(hash) {
                inner.set_phase(id, phase);
                found += 1;
            }
        }
        found
    }

    /// Up to `limit` cached blocks in the order they would be evicted.
    pub fn coldest_cached(&self, limit: usize) -> Vec<BlockIdentity> {
        let inner = self.shared.inner.lock();
        let mut ids = Vec::with_capacity(limit.min(inner.policy.len()));
        inner.policy.coldest(limit, &mut ids);
        ids.iter()
            .map(|id| inner.slots[id.index()].identity)
            .collect()
    }

    /// Registered blocks that are referenced (not cached).
    pub fn referenced_registered(&self) -> usize {
        let inner = self.shared.inner.lock();
        inner.registry.len() - inner.policy.len()
    }

    /// Forgets every cached block (emitting `Removed` for them); refuses while a
    /// registered block is referenced. Returns the number of blocks forgotten.
    pub fn reset_cache(&self) -> Result<usize, ResetError> {
        let mut inner = self.shared.inner.lock();
        let referenced = inner.registry.len() - inner.policy.len();
        if referenced > 0 {
            return Err(ResetError::InUse { referenced });
        }
        let mut forgotten = 0;
        while let Some(victim) = inner.policy.pop_victim() {
            inner.evict(victim);
            inner.free.push(victim);
            forgotten += 1;
        }
        Ok(forgotten)
    }

    /// Forgets every registered block at once, referenced or not, emitting `Removed` for
    /// each (leaves first): the tier's storage is gone (a failed SSD). Cached blocks
    /// become free now; referenced ones can no longer be found, and become free when
    /// their last handle drops (not cached: their bytes are lost). Returns the number of
    /// blocks forgotten.
    pub fn invalidate_all(&self) -> usize {
        self.shared.inner.lock().invalidate_all()
    }

    /// Forgets the registered blocks among `hashes` the same way (their bytes in this
    /// tier are bad: a read failed its checksum), leaf first, each with a `Removed`.
    /// Hashes not registered here are skipped. Returns the number of blocks forgotten.
    pub fn invalidate(&self, hashes: &[SequenceHash]) -> usize {
        self.shared.inner.lock().invalidate(hashes)
    }

    /// Takes the queued events, oldest first.
    #[must_use]
    pub fn take_events(&self) -> Vec<KvCacheEventData> {
        self.shared
            .inner
            .lock()
            .outbox
            .take()
            .into_iter()
            .map(|(_, data)| data)
            .collect()
    }

    /// Moves the queued events, with their places in the shared event order, onto the
    /// end of `out`; the queue keeps its allocation (a simulation collects events at
    /// most settles, and a fresh queue each time regrew from nothing). The pool's spare
    /// event lists are topped up from `buffers` under the same lock.
    pub(crate) fn move_ordered_events_into(
        &self,
        out: &mut Vec<(u64, KvCacheEventData)>,
        buffers: &mut EventBuffers,
    ) {
        self.shared.inner.lock().outbox.move_into(out, buffers);
    }

    /// Counts this pool's events and state changes together with every pool given the
    /// same counters (one manager's tiers), for [`BlockPool::move_ordered_events_into`] and
    /// the manager's change checks.
    pub(crate) fn share_counters(&self, counters: Arc<SharedCounters>) {
        self.shared.inner.lock().shared = Some(counters);
    }

    /// Number of queued events.
    pub fn outbox_len(&self) -> usize {
        self.shared.inner.lock().outbox.len()
    }

    /// Where the blocks are now.
    pub fn counts(&self) -> PoolCounts {
        self.shared.inner.lock().counts(self.capacity())
    }

    /// Cumulative counters.
    pub fn stats(&self) -> PoolStats {
        self.shared.inner.lock().stats
    }

    /// The registry with refcounts, and the counts, taken under one lock.
    pub fn snapshot(&self) -> PoolSnapshot {
        let inner = self.shared.inner.lock();
        let registered = inner
            .registry
            .iter()
            .map(|(hash, id)| (*hash, inner.slots[id.index()].refcount))
            .collect();
        PoolSnapshot {
            counts: inner.counts(self.capacity()),
            registered,
        }
    }

    /// The identities of the registered blocks, parents before children (by position,
    /// then hash).
    pub fn registered_identities(&self) -> Vec<BlockIdentity> {
        let inner = self.shared.inner.lock();
        let mut identities: Vec<BlockIdentity> = inner
            .registry
            .values()
            .map(|id| inner.slots[id.index()].identity)
            .collect();
        identities.sort_unstable_by_key(|identity| (identity.position, identity.sequence_hash));
        identities
    }

    /// Checks every internal invariant and panics with a description on the first broken
    /// one (a broken invariant is a bug, not an input error). Returns the counts.
    pub fn check_invariants(&self) -> PoolCounts {
        let inner = self.shared.inner.lock();
        let capacity = self.capacity();
        let (mut free, mut cached, mut active) = (0, 0, 0);
        let mut in_free = vec![false; capacity];
        for id in &inner.free {
            assert!(!in_free[id.index()], "{id:?} twice in the free stack");
            in_free[id.index()] = true;
        }
        for (index, slot) in inner.slots.iter().enumerate() {
            let id = BlockId::new(index as u32);
            match slot.state {
                SlotState::Free => {
                    assert!(in_free[index], "free {id:?} missing from the free stack");
                    free += 1;
                }
                SlotState::Mutable => {
                    assert!(!in_free[index], "mutable {id:?} in the free stack");
                    active += 1;
                }
                SlotState::Invalidated => {
                    assert!(!in_free[index], "invalidated {id:?} in the free stack");
                    assert!(slot.refcount > 0, "invalidated {id:?} with no reference");
                    assert_ne!(
                        inner.registry.get(&slot.identity.sequence_hash),
                        Some(&id),
                        "invalidated {id:?} still in the registry"
                    );
                    active += 1;
                }
                SlotState::Registered => {
                    assert!(!in_free[index], "registered {id:?} in the free stack");
                    assert_eq!(
                        inner.registry.get(&slot.identity.sequence_hash),
                        Some(&id),
                        "registered {id:?} not in the registry under its hash"
                    );
                    if slot.refcount == 0 {
                        cached += 1;
                    } else {
                        active += 1;
                    }
                }
            }
        }
        assert_eq!(free, inner.free.len(), "free stack length");
        assert_eq!(
            cached,
            inner.policy.len(),
            "policy holds exactly the cached blocks"
        );
        assert_eq!(
            inner.registry.len(),
            inner
                .slots
                .iter()
                .filter(|s| s.state == SlotState::Registered)
                .count()
        );
        assert_eq!(free + cached + active, capacity);
        PoolCounts {
            capacity,
            free,
            cached,
            active,
        }
    }
}

#[cfg(test)]
mod tests;
