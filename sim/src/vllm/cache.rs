//! vLLM's KV cache manager for one full-attention group (`KVCacheManager` in
//! `vllm/v1/core/kv_cache_manager.py` over `FullAttentionManager` in
//! `single_type_kv_cache_manager.py`), prefix caching on, no connector, no
//! speculative decoding, block size equal to the hash block size.
//!
//! Owns: each request's blocks (`req_to_blocks`) and how many of them are cached
//! (`num_cached_block`), the watermark, the prefix-cache counters, and the
//! [`BlockPool`] under them. Followed: `get_computed_blocks` (the longest cached
//! prefix of the request's block hashes, at most `num_tokens - 1` tokens: a fully
//! cached prompt recomputes its last block), `allocate_slots` (the admission check with
//! hits that sit in the free queue counted as taken, touch the hits, allocate the rest
//! from the front of the free queue, then cache the blocks that the scheduled tokens
//! fill), `free` (the request's blocks tail first) and `record_prefix_cache_stats`.
//! Never: choose which requests run or how many tokens (`scheduler`).

use super::pool::{BlockPool, VllmBlockId};
use super::request::{RequestStatus, VllmRequest};
use kvtwin::events::KvCacheEventData;
use kvtwin::ids::RequestId;
use std::collections::BTreeMap;

/// What the cache is built with (the engine's `--block-size`, its block count, its
/// `--max-model-len`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct VllmCacheConfig {
    /// Blocks in the pool, the null block included (vLLM's `num_gpu_blocks`).
    pub num_gpu_blocks: u32,
    /// Tokens a block holds.
    pub block_size: u64,
    /// The longest sequence the engine takes.
    pub max_model_len: u64,
    /// Blocks kept free when admitting a waiting request while others run, as a
    /// fraction of the pool (vLLM's default is 0).
    pub watermark: f64,
}

/// Prefix hits found for a request (`get_computed_blocks`): its first blocks, cached.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ComputedBlocks {
    /// The cached blocks, first first.
    pub blocks: Vec<VllmBlockId>,
    /// The tokens they hold.
    pub tokens: u64,
}

/// vLLM's prefix-cache counters (`PrefixCacheStats`): tokens looked up and found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    /// Lookups.
    pub requests: u64,
    /// Tokens looked up (each request's `num_tokens`).
    pub queries: u64,
    /// Tokens found.
    pub hits: u64,
    /// Lookups of preempted requests.
    pub preempted_requests: u64,
}

/// The manager; see the module documentation.
#[derive(Clone, Debug)]
pub struct VllmKvCache {
    pool: BlockPool,
    config: VllmCacheConfig,
    watermark_blocks: usize,
    req_to_blocks: BTreeMap<RequestId, Vec<VllmBlockId>>,
    num_cached_block: BTreeMap<RequestId, usize>,
    stats: PrefixCacheStats,
}

impl VllmKvCache {
    /// An empty cache.
    pub fn new(config: VllmCacheConfig) -> Self {
        assert!(config.block_size > 0, "a block holds at least one token");
        // int(watermark * num_blocks): the fraction is a configuration value.
        let watermark_blocks = (config.watermark * f64::from(config.num_gpu_blocks)) as usize;
        Self {
            pool: BlockPool::new(config.num_gpu_blocks),
            config,
            watermark_blocks,
            req_to_blocks: BTreeMap::new(),
            num_cached_block: BTreeMap::new(),
            stats: PrefixCacheStats::default(),
        }
    }

    /// What it was built with.
    pub fn config(&self) -> &VllmCacheConfig {
        &self.config
    }

    /// The pool under it.
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// The prefix-cache counters so far.
    pub fn stats(&self) -> PrefixCacheStats {
        self.stats
    }

    /// The blocks `request` holds, first first.
    pub fn blocks_of(&self, request: RequestId) -> &[VllmBlockId] {
        self.req_to_blocks.get(&request).map_or(&[], Vec::as_slice)
    }

    /// The longest cached prefix of `request`'s block hashes, up to `num_tokens - 1`
    /// tokens (the last token is always computed, for its logits).
    pub fn get_computed_blocks(&self, request: &VllmRequest) -> ComputedBlocks {
        let block_size = self.config.block_size;
        let max_hit_tokens = request.num_tokens().saturating_sub(1);
        let max_blocks = usize::try_from(max_hit_tokens / block_size).unwrap_or(usize::MAX);
        let mut blocks = Vec::new();
        for identity in request.block_hashes(block_size).iter().take(max_blocks) {
            match self.pool.get_cached_block(identity.sequence_hash) {
                Some(block) => blocks.push(block),
                None => break,
            }
        }
        let tokens = blocks.len() as u64 * block_size;
        ComputedBlocks { blocks, tokens }
    }

    /// Counts one lookup of `request` that found `hits` tokens.
    pub fn record_prefix_cache_stats(&mut self, request: &VllmRequest, hits: u64) {
        self.stats.requests += 1;
        self.stats.queries += request.num_tokens();
        self.stats.hits += hits;
        if request.num_preemptions > 0 {
            self.stats.preempted_requests += 1;
        }
    }

    /// Gives `request` slots for `num_new_tokens` more tokens after its computed ones,
    /// `new_computed` (its prefix hits, on its first allocation) and
    /// `num_external_computed` (tokens a KV connector loads after them), and caches the
    /// blocks those tokens fill. `None`, with nothing changed, when the free blocks (less the
    /// watermark for a waiting request while others are scheduled) are too few; with
    /// `full_sequence_must_fit`, also when its whole sequence would not fit.
    pub fn allocate_slots(
        &mut self,
        request: &VllmRequest,
        num_new_tokens: u64,
        new_computed: &ComputedBlocks,
        has_scheduled_reqs: bool,
        full_sequence_must_fit: bool,
        num_external_computed: u64,
    ) -> Option<Vec<VllmBlockId>> {
        let num_local_computed = request.num_computed_tokens + new_computed.tokens;
        let total_computed =
            (num_local_computed + num_external_computed).min(self.config.max_model_len);
        let waiting = matches!(
            request.status,
            RequestStatus::Waiting | RequestStatus::Preempted
        );
        let watermark = if has_scheduled_reqs && waiting {
            self.watermark_blocks
        } else {
            0
        };
        if full_sequence_must_fit {
            let full = request.num_tokens().min(self.config.max_model_len);
            let needed = self.blocks_to_allocate(request.id, full, new_computed);
            if needed + watermark > self.pool.num_free_blocks() {
                return None;
            }
        }
        let need_slot = (total_computed + num_new_tokens).min(self.config.max_model_len);
        let needed = self.blocks_to_allocate(request.id, need_slot, new_computed);
        if needed + watermark > self.pool.num_free_blocks() {
            return None;
        }
        if !new_computed.blocks.is_empty() {
            // add_local_computed_blocks: only on a first allocation.
            self.pool.touch(&new_computed.blocks);
            let blocks = self.req_to_blocks.entry(request.id).or_default();
            debug_assert!(blocks.is_empty(), "hits added to a running request");
            blocks.extend_from_slice(&new_computed.blocks);
            self.num_cached_block.insert(request.id, blocks.len());
        }
        let required =
            usize::try_from(need_slot.div_ceil(self.config.block_size)).unwrap_or(usize::MAX);
        let held = self.blocks_of(request.id).len();
        let new_blocks = match required.checked_sub(held) {
            Some(n) if n > 0 => self.pool.get_new_blocks(n)?,
            _ => Vec::new(),
        };
        self.req_to_blocks
            .entry(request.id)
            .or_default()
            .extend_from_slice(&new_blocks);
        let to_cache = (total_computed + num_new_tokens).min(request.num_tokens());
        self.cache_blocks(request, to_cache);
        Some(new_blocks)
    }

    /// `get_num_blocks_to_allocate`: blocks to take from the free queue to hold
    /// `num_tokens`, hits still in the free queue included.
    fn blocks_to_allocate(
        &self,
        request: RequestId,
        num_tokens: u64,
        new_computed: &ComputedBlocks,
    ) -> usize {
        let required =
            usize::try_from(num_tokens.div_ceil(self.config.block_size)).unwrap_or(usize::MAX);
        let held = self.blocks_of(request).len();
        if self.num_cached_block.contains_key(&request) {
            // A running request finds no new hits.
            return required.saturating_sub(held);
        }
        let new = required.saturating_sub(new_computed.blocks.len() + held);
        let evictable = new_computed
            .blocks
            .iter()
            .filter(|&&block| self.pool.ref_cnt(block) == 0 && block != BlockPool::NULL_BLOCK)
            .count();
        new + evictable
    }

    /// Caches the request's blocks that `num_tokens` fill.
    fn cache_blocks(&mut self, request: &VllmRequest, num_tokens: u64) {
        let num_cached = self.num_cached_block.get(&request.id).copied().unwrap_or(0);
        let num_full = usize::try_from(num_tokens / self.config.block_size).unwrap_or(usize::MAX);
        if num_cached >= num_full {
            return;
        }
        let blocks = self
            .req_to_blocks
            .get(&request.id)
            .map_or(&[][..], Vec::as_slice);
        let identities = request.block_hashes(self.config.block_size);
        self.pool
            .cache_full_blocks(blocks, identities, num_cached, num_full);
        self.num_cached_block.insert(request.id, num_full);
    }

    /// Frees `request`'s blocks, tail first (so its last blocks are evicted first).
    pub fn free(&mut self, request: RequestId) {
        let blocks = self.req_to_blocks.remove(&request).unwrap_or_default();
        self.num_cached_block.remove(&request);
        self.pool.free_blocks(blocks.into_iter().rev());
    }

    /// The KV events queued since the last call, in order.
    pub fn take_events(&mut self) -> Vec<KvCacheEventData> {
        self.pool.take_events()
    }

    /// Free blocks (eviction candidates included).
    pub fn num_free_blocks(&self) -> usize {
        self.pool.num_free_blocks()
    }

    /// The fraction of usable blocks in use (vLLM's `kv_cache_usage_perc`).
    pub fn usage(&self) -> f64 {
        let usable = self.pool.num_blocks().saturating_sub(1);
        if usable == 0 {
            return 0.0;
        }
        1.0 - self.pool.num_free_blocks() as f64 / usable as f64
    }
}
