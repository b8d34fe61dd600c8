//! Which of an engine's blocks were stored under a cache salt, so a later batch that
//! continues a salted chain is hashed with the same salt.
//!
//! Owns: [`SaltTracker`] (engine block hash and rank → the salt it was stored under,
//! bounded, oldest evicted first and counted) and [`DEFAULT_SALTED_BLOCKS_MAX`].
//!
//! Why: vLLM sends a request's `cache_salt` in the `extra_keys` of the block that starts
//! the request only; a batch storing the request's later blocks names a salted parent
//! and carries no salt. Dynamo's router seeds every block of a salted request with the
//! salt, so those later blocks' tokens hashes must be salted too, which only the parent's
//! salt remembered here allows.
//! Bounded: only salted blocks are kept (an unsalted engine costs nothing), at most
//! `capacity` of them per engine; past it the oldest entry goes, counted in
//! [`SaltTracker::evicted`]. An evicted (or never seen) parent makes its children hash
//! unsalted, and they chain from the salted parent's sequence hash: no unsalted query
//! can reach them (its first block already differs) and a salted query's next block
//! hashes differently, so an eviction costs later misses on that chain, never a merge of
//! salted blocks with another request's.
//! Cleared: on an engine restart and on `AllBlocksCleared` (that rank); a removed block's
//! entry goes with it; a block stored again without a salt loses its entry.
//! Never: keep an unsalted block, or grow past `capacity`.

use rustc_hash::FxHashMap;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Salted blocks an engine's tracker keeps by default: 2^18, about 25 MB at most (an
/// entry is ~100 bytes with the maps' overhead; the salt itself is shared by every block
/// of a request). Above most engines' whole cache of salted blocks; past it, misses.
pub const DEFAULT_SALTED_BLOCKS_MAX: usize = 1 << 18;

/// A data-parallel rank and an engine block hash.
type Key = (u32, u64);

/// Salted blocks of one engine; see the module documentation.
#[derive(Clone, Debug)]
pub struct SaltTracker {
    /// Key → (its salt, its insertion number).
    entries: FxHashMap<Key, (Arc<str>, u64)>,
    /// Insertion number → key, oldest first: what eviction takes.
    order: BTreeMap<u64, Key>,
    next: u64,
    capacity: usize,
    evicted: u64,
}

impl Default for SaltTracker {
    fn default() -> Self {
        Self::new(DEFAULT_SALTED_BLOCKS_MAX)
    }
}

impl SaltTracker {
    /// A tracker keeping at most `capacity` salted blocks (0 keeps none: every
    /// continuation of a salted chain then hashes unsalted).
    pub fn new(capacity: usize) -> Self {
        Self {
            entries: FxHashMap::default(),
            order: BTreeMap::new(),
            next: 0,
            capacity,
            evicted: 0,
        }
    }

    /// The salt block `hash` of `rank` was stored under, if it was salted and is kept.
    pub fn salt_of(&self, rank: u32, hash: u64) -> Option<&Arc<str>> {
        self.entries.get(&(rank, hash)).map(|(salt, _)| salt)
    }

    /// Remembers that `hashes` of `rank` were stored under `salt`, evicting the oldest
    /// entries past the capacity.
    pub fn insert(&mut self, rank: u32, hashes: &[u64], salt: &Arc<str>) {
        if self.capacity == 0 {
            self.evicted += hashes.len() as u64;
            return;
        }
        for &hash in hashes {
            let seq = self.next;
            self.next += 1;
            if let Some((_, old)) = self.entries.insert((rank, hash), (salt.clone(), seq)) {
                self.order.remove(&old);
            }
            self.order.insert(seq, (rank, hash));
            while self.entries.len() > self.capacity {
                let Some((_, oldest)) = self.order.pop_first() else {
                    break;
                };
                self.entries.remove(&oldest);
                self.evicted += 1;
            }
        }
    }

    /// Forgets `hashes` of `rank` (removed, or stored again unsalted).
    pub fn remove(&mut self, rank: u32, hashes: &[u64]) {
        if self.entries.is_empty() {
            return;
        }
        for &hash in hashes {
            if let Some((_, seq)) = self.entries.remove(&(rank, hash)) {
                self.order.remove(&seq);
            }
        }
    }

    /// Forgets every block of `rank` (its cache was cleared).
    pub fn clear_rank(&mut self, rank: u32) {
        self.entries.retain(|(r, _), _| *r != rank);
        self.order.retain(|_, (r, _)| *r != rank);
    }

    /// Forgets everything (the engine restarted).
    pub fn clear(&mut self) {
        self.entries.clear();
        self.order.clear();
    }

    /// Salted blocks kept.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Entries evicted past the capacity, over the tracker's life.
    pub fn evicted(&self) -> u64 {
        self.evicted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn salted_blocks_are_kept_per_rank_and_forgotten_on_removal_and_clear() {
        let mut tracker = SaltTracker::new(10);
        let salt: Arc<str> = Arc::from("tenant-a");
        tracker.insert(0, &[1, 2, 3], &salt);
        tracker.insert(1, &[1], &salt);
        assert_eq!(tracker.salt_of(0, 2).map(|s| &**s), Some("tenant-a"));
        assert_eq!(tracker.salt_of(2, 2), None);
        tracker.remove(0, &[2, 99]);
        assert_eq!(tracker.salt_of(0, 2), None);
        assert_eq!(tracker.len(), 3);
        tracker.clear_rank(0);
        assert_eq!(tracker.len(), 1);
        assert!(tracker.salt_of(1, 1).is_some());
        tracker.clear();
        assert!(tracker.is_empty());
        assert_eq!(tracker.evicted(), 0);
    }

    #[test]
    fn past_its_capacity_the_oldest_goes_and_is_counted() {
        let mut tracker = SaltTracker::new(3);
        let a: Arc<str> = Arc::from("a");
        let b: Arc<str> = Arc::from("b");
        tracker.insert(0, &[1, 2, 3], &a);
        // Storing 1 again makes it the newest.
        tracker.insert(0, &[1], &b);
        tracker.insert(0, &[4, 5], &b);
        assert_eq!(tracker.len(), 3);
        assert_eq!(tracker.evicted(), 2);
        assert_eq!(tracker.salt_of(0, 2), None);
        assert_eq!(tracker.salt_of(0, 3), None);
        assert_eq!(tracker.salt_of(0, 1).map(|s| &**s), Some("b"));
        assert!(tracker.salt_of(0, 5).is_some());
        assert_eq!(tracker.order.len(), tracker.entries.len());

        let mut none = SaltTracker::new(0);
        none.insert(0, &[1, 2], &a);
        assert!(none.is_empty());
        assert_eq!(none.evicted(), 2);
    }
}
