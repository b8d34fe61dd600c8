//! A synthetic engine's KV event stream, for the event plane's tests and `kvtwin bench
//! relay`: batches as vLLM publishes them, deterministic from a seed.
//!
//! Owns: [`SyntheticEngine`] and its [`SyntheticConfig`]. The engine serves requests
//! that share a few system prompts and end in their own tokens; each request stores the
//! blocks its cache lacks (parent: the last block it had) and, past its capacity, the
//! engine evicts whole earlier requests' blocks leaf first, as a prefix cache does. Block
//! hashes are the engine's own: the chain of a per-engine salt, the parent's hash and the
//! tokens, so two engines hash the same tokens differently, as vLLM processes do.
//! Never: read a clock or an unseeded random source (the `ts` of a batch is its sequence
//! number in milliseconds), or encode (callers pick the wire format).

use crate::wire::{BlockRemoved, BlockStored, EngineBatch, EngineEvent};
use kvtwin::tier::Tier;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, VecDeque};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// The stream's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyntheticConfig {
    /// Seeds the requests and the engine's hash salt.
    pub seed: u64,
    /// Seeds the system prompts: engines with the same one share prompts (and so
    /// prefixes a router can find), whatever their own seed.
    pub prompt_seed: u64,
    /// Tokens per block.
    pub block_size: u32,
    /// The data-parallel rank written in each batch.
    pub dp_rank: Option<u32>,
    /// Requests (each one `BlockStored`, plus `BlockRemoved`s when it evicts) per batch.
    pub requests_per_batch: usize,
    /// Shared system prompts.
    pub prompts: usize,
    /// Blocks of a system prompt, at most.
    pub prompt_blocks: usize,
    /// Blocks of a request's own tokens, at most.
    pub own_blocks: usize,
    /// Blocks the engine caches before it evicts.
    pub capacity_blocks: usize,
    /// Tier of the blocks.
    pub tier: Tier,
}

impl SyntheticConfig {
    /// A small engine: 16-token blocks, 4 prompts of up to 8 blocks (prompt seed 0), up
    /// to 4 own blocks, 256 blocks of cache, 4 requests per batch, on device.
    pub fn small(seed: u64) -> Self {
        Self {
            seed,
            prompt_seed: 0,
            block_size: 16,
            dp_rank: Some(0),
            requests_per_batch: 4,
            prompts: 4,
            prompt_blocks: 8,
            own_blocks: 4,
            capacity_blocks: 256,
            tier: Tier::Device,
        }
    }
}

#[derive(Debug)]
struct Cached {
    parent: Option<u64>,
    children: u32,
}

/// The engine; see the module documentation.
#[derive(Debug)]
pub struct SyntheticEngine {
    config: SyntheticConfig,
    rng: ChaCha8Rng,
    salt: u64,
    prompts: Vec<Vec<u32>>,
    /// Engine hash → its parent and how many cached blocks hang off it.
    cached: BTreeMap<u64, Cached>,
    /// Each request's stored blocks, oldest request first (the eviction order).
    requests: VecDeque<Vec<u64>>,
    next_seq: u64,
}

impl SyntheticEngine {
    /// An engine with an empty cache.
    pub fn new(config: SyntheticConfig) -> Self {
        let mut rng = ChaCha8Rng::seed_from_u64(config.seed);
        let salt = rng.gen();
        let block = config.block_size.max(1) as usize;
        let mut prompt_rng = ChaCha8Rng::seed_from_u64(config.prompt_seed);
        let prompts = (0..config.prompts.max(1))
            .map(|_| {
                let blocks = prompt_rng.gen_range(1..=config.prompt_blocks.max(1));
                (0..blocks * block)
                    .map(|_| prompt_rng.gen_range(0..50_000))
                    .collect()
            })
            .collect();
        Self {
            config,
            rng,
            salt,
            prompts,
            cached: BTreeMap::new(),
            requests: VecDeque::new(),
            next_seq: 0,
        }
    }

    /// Blocks cached now.
    pub fn cached_blocks(&self) -> usize {
        self.cached.len()
    }

    /// The [`block_digest`](crate::service::translate::block_digest) of the blocks cached
    /// now (all in the configured tier): what a router that applied every batch so far
    /// reports for this engine in `GET /v1/workers`.
    pub fn block_digest(&self) -> u64 {
        let tiers = 1u8 << self.config.tier.index();
        crate::service::translate::block_digest(self.cached.keys().map(|&hash| (hash, tiers)))
    }

    /// The next batch (sequence numbers from 0).
    pub fn next_batch(&mut self) -> EngineBatch {
        let mut events = Vec::new();
        for _ in 0..self.config.requests_per_batch.max(1) {
            self.request(&mut events);
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        EngineBatch::new(seq, seq as f64 / 1000.0, events, self.config.dp_rank)
    }

    fn request(&mut self, events: &mut Vec<EngineEvent>) {
        let block = self.config.block_size.max(1) as usize;
        let prompt = self.rng.gen_range(0..self.prompts.len());
        let own = self.rng.gen_range(1..=self.config.own_blocks.max(1));
        let mut tokens = self.prompts[prompt].clone();
        tokens.extend((0..own * block).map(|_| self.rng.gen_range(0..50_000u32)));
        // Walk the cache; store what it lacks under the last block it has.
        let mut parent: Option<u64> = None;
        let mut stored = BlockStored {
            block_size: self.config.block_size,
            medium: Some(self.config.tier),
            ..BlockStored::default()
        };
        for chunk in tokens.chunks_exact(block) {
            let hash = self.hash(parent, chunk);
            if stored.block_hashes.is_empty() && self.cached.contains_key(&hash) {
                parent = Some(hash);
                continue;
            }
            if stored.block_hashes.is_empty() {
                stored.parent_block_hash = parent;
            }
            stored.block_hashes.push(hash);
            stored.token_ids.extend_from_slice(chunk);
            parent = Some(hash);
        }
        if stored.block_hashes.is_empty() {
            return;
        }
        let mut previous = stored.parent_block_hash;
        for hash in &stored.block_hashes {
            if let Some(parent) = previous.and_then(|p| self.cached.get_mut(&p)) {
                parent.children += 1;
            }
            self.cached.insert(
                *hash,
                Cached {
                    parent: previous,
                    children: 0,
                },
            );
            previous = Some(*hash);
        }
        self.requests.push_back(stored.block_hashes.clone());
        events.push(EngineEvent::BlockStored(stored));
        self.evict(events);
    }

    /// Evicts the oldest requests' blocks, leaf first, until the cache fits; a block
    /// something still hangs off stays.
    fn evict(&mut self, events: &mut Vec<EngineEvent>) {
        while self.cached.len() > self.config.capacity_blocks && self.requests.len() > 1 {
            let Some(blocks) = self.requests.pop_front() else {
                break;
            };
            let mut removed = Vec::new();
            for hash in blocks.iter().rev() {
                let Some(entry) = self.cached.get(hash) else {
                    continue;
                };
                if entry.children > 0 {
                    break;
                }
                let parent = entry.parent;
                self.cached.remove(hash);
                if let Some(parent) = parent.and_then(|p| self.cached.get_mut(&p)) {
                    parent.children -= 1;
                }
                removed.push(*hash);
            }
            if !removed.is_empty() {
                events.push(EngineEvent::BlockRemoved(BlockRemoved {
                    block_hashes: removed,
                    medium: Some(self.config.tier),
                    group_idx: None,
                    kv_cache_spec_kind: None,
                }));
            }
        }
    }

    /// The engine's hash of a block: its salt, its parent's hash and its tokens.
    fn hash(&self, parent: Option<u64>, tokens: &[u32]) -> u64 {
        let mut bytes = Vec::with_capacity(8 + tokens.len() * 4);
        bytes.extend_from_slice(&parent.unwrap_or(0).to_le_bytes());
        for token in tokens {
            bytes.extend_from_slice(&token.to_le_bytes());
        }
        xxh3_64_with_seed(&bytes, self.salt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_is_deterministic_shares_prefixes_and_stays_within_capacity() {
        let config = SyntheticConfig::small(7);
        let (mut a, mut b) = (SyntheticEngine::new(config), SyntheticEngine::new(config));
        let mut stored_blocks = 0;
        let mut removed_blocks = 0;
        let mut with_parent = 0;
        for _ in 0..200 {
            let batch = a.next_batch();
            assert_eq!(batch, b.next_batch());
            for event in &batch.events {
                match event {
                    EngineEvent::BlockStored(stored) => {
                        stored_blocks += stored.block_hashes.len();
                        with_parent += usize::from(stored.parent_block_hash.is_some());
                        assert_eq!(stored.token_ids.len(), stored.block_hashes.len() * 16);
                    }
                    EngineEvent::BlockRemoved(removed) => {
                        removed_blocks += removed.block_hashes.len()
                    }
                    EngineEvent::AllBlocksCleared => {}
                }
            }
            assert!(a.cached_blocks() <= 256 + 12, "{}", a.cached_blocks());
        }
        assert_eq!(stored_blocks - removed_blocks, a.cached_blocks());
        assert_eq!(a.block_digest(), b.block_digest());
        assert_ne!(a.block_digest(), 0);
        assert!(
            removed_blocks > 0 && with_parent > 100,
            "{removed_blocks} {with_parent}"
        );
        // A router fed every batch holds exactly the engine's cache.
        let mut router = crate::service::state::RouterState::new(16);
        let mut replay = SyntheticEngine::new(config);
        for _ in 0..200 {
            let mut events = Vec::new();
            replay
                .next_batch()
                .worker_events(kvtwin::ids::WorkerId::new(4), &mut events)
                .unwrap();
            router.apply_batch(&events);
        }
        let row = &router.workers()[0];
        assert_eq!(row.block_digest, a.block_digest());
        assert_eq!(row.blocks[0], a.cached_blocks() as u64);
        assert_eq!(row.indexed_blocks, a.cached_blocks() as u64);
        // Another engine shares the prompts and hashes them differently.
        let other = SyntheticEngine::new(SyntheticConfig { seed: 8, ..config });
        assert_eq!(other.prompts, a.prompts);
        assert_ne!(other.salt, a.salt);
    }
}
