//! Cache sizing: replay a trace through one `BlockPool` (no timing) and count prefix hits.
//!
//! Owns: [`replay`] and [`CacheRow`]; [`curve`] gives LRU's hits at every capacity in one
//! pass, [`shards`] estimates them from a spatial sample of the blocks. The semantics are
//! those of `shared/data/mooncake/README.md`: a request's hits are its leading blocks
//! found in the cache; then its blocks are touched from the last to the first (a cached
//! block becomes most recent, a missing one is inserted, evicting the least recent), so a
//! parent always ends up more recent than its children and eviction takes leaves first.
//! This is exactly how kvtwin's pool behaves when a request's blocks are released leaf
//! first.
//! Never: model time or other tiers (the simulator does).

pub mod curve;
pub mod shards;

use crate::workload::Request;
use kvtwin::pool::{BlockPool, EvictionPolicyKind, PoolConfig, PoolConfigError};
use kvtwin::tier::Tier;
use serde::Serialize;

/// Hits at one capacity.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct CacheRow {
    /// Cache size in blocks.
    pub capacity_blocks: usize,
    /// Hit blocks over all block references.
    pub hit_blocks: f64,
    /// Over all requests: min(hit blocks × block tokens, input tokens) over input tokens.
    pub hit_tokens: f64,
}

/// Replays `requests` through one pool of `capacity_blocks` blocks.
pub fn replay(
    requests: &[Request],
    capacity_blocks: usize,
    block_tokens: usize,
    eviction: EvictionPolicyKind,
) -> Result<CacheRow, PoolConfigError> {
    let pool = BlockPool::new(PoolConfig {
        tier: Tier::Device,
        capacity_blocks,
        block_size_tokens: block_tokens,
        eviction,
    })?;
    let (mut hit_blocks, mut all_blocks, mut hit_tokens, mut all_tokens) = (0u64, 0u64, 0u64, 0u64);
    for request in requests {
        let hashes: Vec<_> = request.blocks.iter().map(|b| b.sequence_hash).collect();
        let hits = pool.prefix_len(&hashes) as u64;
        hit_blocks += hits;
        all_blocks += hashes.len() as u64;
        hit_tokens += (hits * block_tokens as u64).min(request.input_tokens);
        all_tokens += request.input_tokens;
        for identity in request.blocks.iter().rev() {
            match pool.get(identity.sequence_hash) {
                Some(block) => drop(block),
                None => {
                    let Ok(block) = pool.allocate_one() else {
                        continue;
                    };
                    drop(pool.register(block.apply_identity(*identity)));
                }
            }
        }
        // Nobody reads the events of a what-if replay.
        let _ = pool.take_events();
    }
    let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    Ok(CacheRow {
        capacity_blocks,
        hit_blocks: ratio(hit_blocks, all_blocks),
        hit_tokens: ratio(hit_tokens, all_tokens),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvtwin::block::BlockIdentity;
    use kvtwin::ids::{LocalBlockHash, RequestId, Timestamp};

    fn request(ids: &[u64]) -> Request {
        let locals: Vec<LocalBlockHash> = ids.iter().map(|i| LocalBlockHash::new(*i)).collect();
        Request {
            id: RequestId::new(0),
            arrival: Timestamp::ZERO,
            blocks: BlockIdentity::chain(&locals),
            input_tokens: ids.len() as u64 * 4,
            output_tokens: 1,
            think_tokens: 0,
        }
    }

    #[test]
    fn repeated_prefixes_hit_and_small_caches_evict_leaves_first() {
        let requests = vec![
            request(&[1, 2, 3]),
            request(&[1, 2, 4]),
            request(&[1, 2, 3]),
        ];
        let big = replay(&requests, 16, 4, EvictionPolicyKind::Lru).unwrap();
        // Hits: 0, then 2 (1, 2), then 3 (1, 2, 3) of 9 references.
        assert!((big.hit_blocks - 5.0 / 9.0).abs() < 1e-12);
        // With 3 blocks, request 2 evicts leaf 3 (the oldest leaf), so request 3 hits 2.
        let small = replay(&requests, 3, 4, EvictionPolicyKind::Lru).unwrap();
        assert!((small.hit_blocks - 4.0 / 9.0).abs() < 1e-12);
    }
}
