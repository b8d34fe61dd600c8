//! vLLM's block pool (`BlockPool` in `vllm/v1/core/block_pool.py`) for one full-attention
//! group whose block size is the hash block size (the engines of scripts/engines).
//!
//! Owns: every block's reference count and hash, the free queue, the hash → blocks map
//! (duplicates kept in insertion order, as `BlockHashToBlockMap` keeps them: a
//! recomputed block is cached beside the one it repeats), and the outbox of KV events
//! in the order vLLM queues them (one `Stored` per `cache_full_blocks` call, one
//! `Removed` per hash popped). Block 0 is vLLM's null block, taken at start-up and
//! never handed out. Never: know about requests or token counts (`cache`), or a
//! clock.
//!
//! Followed, function by function: `get_cached_block` (the first block cached under
//! a hash), `touch` (a hit leaves the free queue), `get_new_blocks` (from the front,
//! evicting the hash the block held), `cache_full_blocks` (hash the newly full blocks,
//! one event with the parent of the first), `free_blocks` (hashed blocks to the back,
//! unhashed ones to the front, in the order given: callers give a request's blocks
//! tail first).

use kvtwin::block::BlockIdentity;
use kvtwin::events::{KvCacheEventData, StoredBlock};
use kvtwin::ids::SequenceHash;
use kvtwin::pool::IndexLists;
use kvtwin::tier::Tier;
use rustc_hash::FxHashMap;
use smallvec::SmallVec;

/// The free queue's one list.
const FREE: usize = 0;

/// A block's index in the pool (vLLM's `block_id`).
pub type VllmBlockId = u32;

/// The pool; see the module documentation.
#[derive(Clone, Debug)]
pub struct BlockPool {
    ref_cnt: Vec<u32>,
    /// The identity a block is cached under (vLLM's `block_hash`), `None` when it is not.
    hash: Vec<Option<BlockIdentity>>,
    /// vLLM's `FreeKVCacheBlockQueue`: one list, front = next evicted.
    free: IndexLists,
    /// Hash → the blocks cached under it, first inserted first (looked up by key only:
    /// its iteration order is never observed).
    cached: FxHashMap<SequenceHash, SmallVec<[VllmBlockId; 1]>>,
    events: Vec<KvCacheEventData>,
}

impl BlockPool {
    /// vLLM's null block: taken from the queue at start-up, never allocated.
    pub const NULL_BLOCK: VllmBlockId = 0;

    /// A pool of `num_blocks` (vLLM's `num_gpu_blocks`; one is the null block, so
    /// `num_blocks - 1` are usable). `num_blocks` must be at least 2.
    pub fn new(num_blocks: u32) -> Self {
        assert!(
            num_blocks >= 2,
            "a vLLM pool needs the null block and one more"
        );
        let mut free = IndexLists::new(num_blocks as usize, 1);
        for block in 0..num_blocks {
            free.push_back(FREE, block);
        }
        let null = free.pop_front(FREE);
        debug_assert_eq!(null, Some(Self::NULL_BLOCK));
        Self {
            ref_cnt: vec![0; num_blocks as usize],
            hash: vec![None; num_blocks as usize],
            free,
            cached: FxHashMap::default(),
            events: Vec::new(),
        }
    }

    /// Blocks in the free queue (eviction candidates included).
    pub fn num_free_blocks(&self) -> usize {
        self.free.len(FREE)
    }

    /// Blocks in the pool, the null block included.
    pub fn num_blocks(&self) -> usize {
        self.ref_cnt.len()
    }

    /// The block a lookup of `hash` finds: the first one cached under it.
    pub fn get_cached_block(&self, hash: SequenceHash) -> Option<VllmBlockId> {
        self.cached
            .get(&hash)
            .and_then(|blocks| blocks.first().copied())
    }

    /// A block's reference count.
    pub fn ref_cnt(&self, block: VllmBlockId) -> u32 {
        self.ref_cnt[block as usize]
    }

    /// The identity `block` is cached under, if any.
    pub fn block_hash(&self, block: VllmBlockId) -> Option<BlockIdentity> {
        self.hash[block as usize]
    }

    /// Takes a reference on each of `blocks` (prefix hits), taking the unreferenced ones
    /// out of the free queue.
    pub fn touch(&mut self, blocks: &[VllmBlockId]) {
        for &block in blocks {
            if self.ref_cnt[block as usize] == 0 && block != Self::NULL_BLOCK {
                let removed = self.free.remove(block);
                debug_assert!(removed, "unreferenced block {block} not in the free queue");
            }
            self.ref_cnt[block as usize] += 1;
        }
    }

    /// `n` blocks from the front of the free queue, each with one reference; a block
    /// that was cached loses its hash (a `Removed` event). `None`, with nothing taken,
    /// when fewer than `n` are free.
    pub fn get_new_blocks(&mut self, n: usize) -> Option<Vec<VllmBlockId>> {
        if n > self.free.len(FREE) {
            return None;
        }
        let mut blocks = Vec::with_capacity(n);
        for _ in 0..n {
            let block = self.free.pop_front(FREE)?;
            self.evict_cached(block);
            debug_assert_eq!(self.ref_cnt[block as usize], 0);
            self.ref_cnt[block as usize] = 1;
            blocks.push(block);
        }
        Some(blocks)
    }

    /// `_maybe_evict_cached_block`: drops `block`'s hash from the map, queueing a
    /// `Removed` event when the map had it under that hash.
    fn evict_cached(&mut self, block: VllmBlockId) {
        let Some(identity) = self.hash[block as usize].take() else {
            return;
        };
        let hash = identity.sequence_hash;
        let Some(blocks) = self.cached.get_mut(&hash) else {
            return;
        };
        let Some(at) = blocks.iter().position(|&b| b == block) else {
            return;
        };
        blocks.remove(at);
        if blocks.is_empty() {
            self.cached.remove(&hash);
        }
        self.events.push(KvCacheEventData::Removed {
            block_hashes: vec![hash],
            tier: Tier::Device,
        });
    }

    /// Caches `blocks[num_cached..num_full]` under `identities[num_cached..num_full]`
    /// (the request's blocks and its full blocks' identities, both from the first),
    /// queueing one `Stored` event whose parent is the block before the first. A hash
    /// already cached on another block is cached again beside it (and stored again).
    pub fn cache_full_blocks(
        &mut self,
        blocks: &[VllmBlockId],
        identities: &[BlockIdentity],
        num_cached: usize,
        num_full: usize,
    ) {
        if num_cached >= num_full {
            return;
        }
        let mut stored = Vec::with_capacity(num_full - num_cached);
        for (&block, identity) in blocks[num_cached..num_full]
            .iter()
            .zip(&identities[num_cached..num_full])
        {
            debug_assert!(
                self.hash[block as usize].is_none(),
                "block {block} is cached"
            );
            let entry = self.cached.entry(identity.sequence_hash).or_default();
            if !entry.contains(&block) {
                entry.push(block);
            }
            self.hash[block as usize] = Some(*identity);
            stored.push(StoredBlock {
                block_hash: identity.sequence_hash,
                tokens_hash: identity.local_hash,
            });
        }
        let parent_hash = num_cached
            .checked_sub(1)
            .map(|parent| identities[parent].sequence_hash);
        self.events.push(KvCacheEventData::Stored {
            parent_hash,
            blocks: stored,
            tier: Tier::Device,
        });
    }

    /// Drops one reference from each of `ordered` (first = evicted first); blocks left
    /// unreferenced go back to the free queue: cached ones to the back (reused last, for
    /// LRU), uncached ones to the front (reused first).
    pub fn free_blocks(&mut self, ordered: impl IntoIterator<Item = VllmBlockId>) {
        let mut evict_first = Vec::new();
        let mut evict_last = Vec::new();
        for block in ordered {
            let count = &mut self.ref_cnt[block as usize];
            debug_assert!(*count > 0, "block {block} freed more often than taken");
            *count -= 1;
            if *count == 0 && block != Self::NULL_BLOCK {
                if self.hash[block as usize].is_none() {
                    evict_first.push(block);
                } else {
                    evict_last.push(block);
                }
            }
        }
        // prepend_n and append_n: both keep the order given.
        for &block in evict_first.iter().rev() {
            self.free.push_front(FREE, block);
        }
        for &block in &evict_last {
            self.free.push_back(FREE, block);
        }
    }

    /// The events queued since the last call, in order.
    pub fn take_events(&mut self) -> Vec<KvCacheEventData> {
        std::mem::take(&mut self.events)
    }

    /// The free queue, front (next evicted) first.
    pub fn free_queue(&self) -> Vec<VllmBlockId> {
        self.free.iter(FREE).collect()
    }

    /// Every cached hash with the number of blocks cached under it, sorted by hash.
    pub fn cached_hashes(&self) -> Vec<(SequenceHash, usize)> {
        let mut hashes: Vec<_> = self
            .cached
            .iter()
            .map(|(hash, blocks)| (*hash, blocks.len()))
            .collect();
        hashes.sort_unstable();
        hashes
    }
}
