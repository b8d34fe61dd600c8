//! Approximate mode: predicting the cache of workers that publish no events.
//!
//! Owns: [`PredictedCache`], one worker's predicted blocks. The router records every
//! request it sends to such a worker: the request's blocks are assumed cached there from
//! then on, until their TTL runs out or the worker's predicted capacity is exceeded (then
//! the blocks that expire first go first, and among those the deepest). Queries see only
//! blocks that have not expired at `now`, so a prediction fades instead of going stale.
//! Never: read a clock (every call takes `now`), or claim more blocks than the capacity.

use crate::ids::{LocalBlockHash, SequenceHash, Timestamp};
use crate::tokens::chain_sequence_hash;
use rustc_hash::FxHashMap;
use std::collections::BTreeSet;
use std::time::Duration;

/// One worker's predicted blocks.
#[derive(Clone, Debug)]
pub struct PredictedCache {
    ttl: Duration,
    capacity_blocks: usize,
    // Block → (expiry, depth); `order` holds the same entries sorted for eviction:
    // earliest expiry first, then deepest first, then by hash.
    blocks: FxHashMap<SequenceHash, (Timestamp, u32)>,
    order: BTreeSet<(Timestamp, std::cmp::Reverse<u32>, SequenceHash)>,
}

impl PredictedCache {
    /// A prediction keeping blocks for `ttl`, at most `capacity_blocks` of them.
    pub fn new(ttl: Duration, capacity_blocks: usize) -> Self {
        Self {
            ttl,
            capacity_blocks,
            blocks: FxHashMap::default(),
            order: BTreeSet::new(),
        }
    }

    /// Blocks predicted (expired ones included until they are pruned).
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// Whether nothing is predicted.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// The router sent a request with these token hashes (one per full block) to the
    /// worker at `now`: all its blocks are predicted cached until `now + ttl`.
    pub fn record_routed(&mut self, query: &[LocalBlockHash], now: Timestamp) {
        self.prune(now);
        let expiry = now.saturating_add(self.ttl);
        let mut previous = None;
        for (depth, tokens_hash) in query.iter().enumerate() {
            let hash = chain_sequence_hash(previous, *tokens_hash);
            previous = Some(hash);
            let depth = depth as u32;
            if let Some((old_expiry, old_depth)) = self.blocks.insert(hash, (expiry, depth)) {
                self.order
                    .remove(&(old_expiry, std::cmp::Reverse(old_depth), hash));
            }
            self.order.insert((expiry, std::cmp::Reverse(depth), hash));
        }
        while self.blocks.len() > self.capacity_blocks {
            let Some(first) = self.order.pop_first() else {
                break;
            };
            self.blocks.remove(&first.2);
        }
    }

    /// Forgets every block that expired by `now`.
    pub fn prune(&mut self, now: Timestamp) {
        while let Some(first) = self.order.first().copied() {
            if first.0 > now {
                break;
            }
            self.order.pop_first();
            self.blocks.remove(&first.2);
        }
    }

    /// How many leading blocks of `query` are predicted cached at `now`.
    pub fn overlap(&self, query: &[LocalBlockHash], now: Timestamp) -> u32 {
        let mut previous = None;
        let mut blocks = 0;
        for tokens_hash in query {
            let hash = chain_sequence_hash(previous, *tokens_hash);
            previous = Some(hash);
            match self.blocks.get(&hash) {
                Some((expiry, _)) if *expiry > now => blocks += 1,
                _ => break,
            }
        }
        blocks
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(locals: &[u64]) -> Vec<LocalBlockHash> {
        locals.iter().map(|l| LocalBlockHash::new(*l)).collect()
    }

    fn at(ms: u64) -> Timestamp {
        Timestamp::from_nanos(ms * 1_000_000)
    }

    #[test]
    fn routed_blocks_are_predicted_until_their_ttl() {
        let mut cache = PredictedCache::new(Duration::from_millis(100), 16);
        cache.record_routed(&query(&[1, 2, 3]), at(0));
        assert_eq!(cache.overlap(&query(&[1, 2, 9]), at(50)), 2);
        assert_eq!(
            cache.overlap(&query(&[1, 2, 3]), at(100)),
            0,
            "expired at the TTL"
        );
        // Routing again refreshes.
        cache.record_routed(&query(&[1, 2]), at(90));
        assert_eq!(cache.overlap(&query(&[1, 2, 3]), at(150)), 2);
        cache.prune(at(150));
        assert_eq!(cache.len(), 2);
    }

    #[test]
    fn the_capacity_evicts_the_oldest_and_deepest_first() {
        let mut cache = PredictedCache::new(Duration::from_secs(10), 4);
        cache.record_routed(&query(&[1, 2, 3]), at(0));
        cache.record_routed(&query(&[7, 8]), at(1));
        assert_eq!(cache.len(), 4);
        // The oldest request's leaf went first; its prefix still matches.
        assert_eq!(cache.overlap(&query(&[1, 2, 3]), at(2)), 2);
        assert_eq!(cache.overlap(&query(&[7, 8]), at(2)), 2);
    }
}
