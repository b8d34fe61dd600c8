//! Tier sizes from what was observed: the recent window of the stream's accesses (each
//! `Stored` event, as [`Access::of_event`] makes it, the reference string of `kvtwin
//! advisor --replay`) replayed through a shared tier under each policy
//! ([`super::replay`], the one implementation), and for each the smallest size that
//! reaches a fraction (90 %, 95 %) of its asymptotic hit ratio (its hits with room for
//! every distinct block of the window, where nothing is ever evicted).
//!
//! The search doubles the size from 1 until the target is reached, then bisects between
//! the last two sizes. For LRU, a stack algorithm whose hits never fall as the tier
//! grows, that is the smallest such size; for LFU, S3-FIFO and ARC, whose hits may dip as
//! the tier grows, it is a size that reaches the target, found the same way.
//!
//! Owns: [`AccessWindow`] (bounded by block references: `blocks_max`; past it the
//! oldest accesses are dropped and counted; one access longer than the bound is kept
//! alone), [`tier_sizes`], [`TierSize`], [`SizeAt`].
//! Never: a second replay or policy, a clock, or a hash map's order in its output.

use super::policy::Policy;
use super::{replay, Access, ReplayRow};
use kvtwin::ids::SequenceHash;
use rustc_hash::FxHashSet;
use serde::Serialize;
use std::collections::BTreeMap;

/// The latest accesses, at most `blocks_max` block references in all.
#[derive(Clone, Debug)]
pub struct AccessWindow {
    accesses: Vec<Access>,
    /// The first access still in the window.
    start: usize,
    blocks: usize,
    blocks_max: usize,
    dropped_accesses: u64,
}

/// What the window holds and dropped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct WindowStats {
    /// Accesses held.
    pub accesses: usize,
    /// Block references held.
    pub blocks: usize,
    /// The bound on `blocks`.
    pub blocks_max: usize,
    /// Accesses dropped (the oldest) to keep the bound.
    pub dropped_accesses: u64,
}

impl AccessWindow {
    /// An empty window of at most `blocks_max` block references.
    pub fn new(blocks_max: usize) -> Self {
        Self {
            accesses: Vec::new(),
            start: 0,
            blocks: 0,
            blocks_max: blocks_max.max(1),
            dropped_accesses: 0,
        }
    }

    /// Appends `access`, dropping the oldest ones past the bound.
    pub fn push(&mut self, access: Access) {
        self.blocks += access.blocks.len();
        self.accesses.push(access);
        while self.blocks > self.blocks_max && self.accesses.len() - self.start > 1 {
            self.blocks -= self.accesses[self.start].blocks.len();
            self.accesses[self.start].blocks = Vec::new();
            self.start += 1;
            self.dropped_accesses += 1;
        }
        if self.start > self.accesses.len() / 2 {
            self.accesses.drain(..self.start);
            self.start = 0;
        }
    }

    /// The accesses held, oldest first.
    pub fn accesses(&self) -> &[Access] {
        &self.accesses[self.start..]
    }

    /// What it holds and dropped.
    pub fn stats(&self) -> WindowStats {
        WindowStats {
            accesses: self.accesses.len() - self.start,
            blocks: self.blocks,
            blocks_max: self.blocks_max,
            dropped_accesses: self.dropped_accesses,
        }
    }
}

/// The size reaching one fraction of the asymptotic hits.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SizeAt {
    /// The fraction asked for.
    pub fraction: f64,
    /// The size found, blocks.
    pub capacity_blocks: usize,
    /// Its hit ratio.
    pub hit_ratio: f64,
}

/// One policy's sizes.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TierSize {
    /// The policy.
    pub policy: &'static str,
    /// Blocks looked up over the window.
    pub lookup_blocks: u64,
    /// Distinct blocks in the window (the asymptotic size).
    pub distinct_blocks: usize,
    /// The hit ratio with room for all of them.
    pub asymptotic_hit_ratio: f64,
    /// One per fraction asked, in order.
    pub sizes: Vec<SizeAt>,
}

/// Each policy's sizes reaching each of `fractions` (clamped to 0..=1) of its
/// asymptotic hits over `accesses`.
pub fn tier_sizes(accesses: &[Access], policies: &[Policy], fractions: &[f64]) -> Vec<TierSize> {
    // Counted, never iterated.
    let distinct = accesses
        .iter()
        .flat_map(|a| a.blocks.iter().copied())
        .collect::<FxHashSet<SequenceHash>>()
        .len();
    policies
        .iter()
        .map(|&policy| {
            let mut rows: BTreeMap<usize, ReplayRow> = BTreeMap::new();
            let mut row = |capacity: usize| -> ReplayRow {
                rows.entry(capacity)
                    .or_insert_with(|| replay(accesses, policy, capacity, 0))
                    .clone()
            };
            let full = row(distinct);
            let sizes = fractions
                .iter()
                .map(|&fraction| {
                    let fraction = fraction.clamp(0.0, 1.0);
                    let target = (fraction * full.hit_blocks as f64).ceil() as u64;
                    let capacity = smallest_reaching(distinct, target, |c| row(c).hit_blocks);
                    SizeAt {
                        fraction,
                        capacity_blocks: capacity,
                        hit_ratio: row(capacity).hit_ratio,
                    }
                })
                .collect();
            TierSize {
                policy: policy.name(),
                lookup_blocks: full.lookup_blocks,
                distinct_blocks: distinct,
                asymptotic_hit_ratio: full.hit_ratio,
                sizes,
            }
        })
        .collect()
}

/// Doubling from 1 (capped at `distinct`, which reaches every target), then bisection
/// between the last size short of `target` and the first reaching it.
fn smallest_reaching(distinct: usize, target: u64, mut hits: impl FnMut(usize) -> u64) -> usize {
    if target == 0 || distinct == 0 {
        return 0;
    }
    let mut high = 1usize;
    while high < distinct && hits(high) < target {
        high = (high * 2).min(distinct);
    }
    let mut low = high / 2;
    // Invariant: hits(high) >= target; low is 0 or short of it.
    while low + 1 < high {
        let middle = low + (high - low) / 2;
        if hits(middle) >= target {
            high = middle;
        } else {
            low = middle;
        }
    }
    high
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvtwin::ids::WorkerId;

    fn access(blocks: &[u64]) -> Access {
        Access {
            worker: WorkerId::new(0),
            blocks: blocks.iter().map(|b| SequenceHash::new(*b)).collect(),
        }
    }

    #[test]
    fn the_window_drops_the_oldest_accesses_past_its_bound() {
        let mut window = AccessWindow::new(5);
        for blocks in [&[1, 2][..], &[3, 4], &[5, 6], &[7, 8, 9, 10, 11, 12]] {
            window.push(access(blocks));
        }
        // 2 + 2 + 2 = 6 > 5 drops [1, 2]; then the long one drops the rest but stays.
        assert_eq!(window.accesses(), [access(&[7, 8, 9, 10, 11, 12])]);
        assert_eq!(
            window.stats(),
            WindowStats {
                accesses: 1,
                blocks: 6,
                blocks_max: 5,
                dropped_accesses: 3
            }
        );
    }

    #[test]
    fn lru_sizes_are_the_smallest_reaching_each_fraction() {
        // A cycle over 4 blocks, 10 times: LRU hits nothing below 4 blocks and
        // everything after the first round at 4. Then 1 and 2 alternate 20 times: hits
        // at 2 blocks (and 1, 2 are at the top of the stack).
        let mut accesses = Vec::new();
        for _ in 0..10 {
            for b in [11, 12, 13, 14] {
                accesses.push(access(&[b]));
            }
        }
        for i in 0..20 {
            accesses.push(access(&[1 + i % 2]));
        }
        let sizes = tier_sizes(&accesses, &[Policy::Lru], &[0.5, 0.9, 1.0]);
        let lru = &sizes[0];
        assert_eq!((lru.distinct_blocks, lru.lookup_blocks), (6, 60));
        // Asymptotic: 36 of the cycle's 40 and 18 of the pairs' 20: 54 of 60.
        assert_eq!(lru.asymptotic_hit_ratio, 54.0 / 60.0);
        // 50 % is 27 hits: 2 blocks give the pairs' 18 only; 4 give 36 + 18.
        // 90 % is 49 (ceil 48.6): 4 blocks. 100 %: 4 blocks too (the cycle fits).
        let found: Vec<(usize, f64)> = lru
            .sizes
            .iter()
            .map(|s| (s.capacity_blocks, s.hit_ratio))
            .collect();
        assert_eq!(
            found,
            [(4, 54.0 / 60.0), (4, 54.0 / 60.0), (4, 54.0 / 60.0)]
        );
        let three = replay(&accesses, Policy::Lru, 3, 0);
        assert_eq!(three.hit_blocks, 18, "the cycle thrashes 3 blocks");
    }

    #[test]
    fn every_policy_has_a_size_and_an_empty_window_needs_none() {
        let accesses: Vec<Access> = (0..200u64).map(|i| access(&[i % 7, 100 + i % 3])).collect();
        for size in tier_sizes(&accesses, &Policy::ALL, &[0.9, 0.95]) {
            for at in &size.sizes {
                assert!(at.capacity_blocks <= size.distinct_blocks, "{size:?}");
                assert!(
                    at.hit_ratio >= at.fraction * size.asymptotic_hit_ratio - 1e-12,
                    "{size:?}"
                );
            }
        }
        let none = tier_sizes(&[], &[Policy::Arc], &[0.9]);
        assert_eq!(none[0].sizes[0].capacity_blocks, 0);
        assert_eq!(none[0].asymptotic_hit_ratio, 0.0);
    }

    #[test]
    fn the_search_bisects_between_the_doublings() {
        let hits = |c: usize| if c >= 13 { 10 } else { 0 };
        assert_eq!(smallest_reaching(100, 10, hits), 13);
        assert_eq!(smallest_reaching(100, 0, hits), 0);
        assert_eq!(smallest_reaching(9, 10, |c| if c >= 9 { 10 } else { 0 }), 9);
        assert_eq!(smallest_reaching(1, 1, |_| 1), 1);
    }
}
