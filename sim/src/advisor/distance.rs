//! Reuse distances of an unbounded access stream in bounded memory: the distance of a
//! block's access is its LRU stack depth, the number of distinct blocks accessed since
//! its previous access, itself included (1: nothing else in between). It is the smallest
//! LRU cache, in blocks, that would still have held the block: the unit and the rule of
//! `kvtwin cache --curve` (`crate::cache::curve`), counted over the advisor's accesses.
//!
//! Owns: [`StackClock`] (a Fenwick tree of 0/1 marks over access stamps: a block's mark
//! sits at the stamp of its latest access, so the marks from a stamp on count the distinct
//! blocks accessed since) and [`DistanceStats`] (a power-of-two histogram over every
//! distance, and the last `recent_max` distances for exact percentiles).
//! Bounds: the tree has `2 × marks_max + 1` slots, however long the stream; when the
//! stamps reach its end they are renumbered in order ([`StackClock::compact`], the
//! caller hands the live stamps), which costs O(n log n) once per `marks_max` accesses.
//! The histogram has 64 buckets; the recent distances are a ring of `recent_max`.
//! Never: decide what an access is (the index does), or hold block hashes.

use serde::Serialize;
use std::collections::VecDeque;

/// Access stamps and their marks.
#[derive(Clone, Debug)]
pub struct StackClock {
    /// Fenwick tree over the stamps (1-based inside).
    tree: Vec<i64>,
    /// The next stamp handed out.
    next: u64,
    /// Marks set (blocks with a latest access).
    marks: u64,
    marks_max: usize,
}

impl StackClock {
    /// A clock for at most `marks_max` marked blocks at a time.
    pub fn new(marks_max: usize) -> Self {
        let slots = 2 * marks_max.max(1) + 1;
        Self {
            tree: vec![0; slots + 1],
            next: 0,
            marks: 0,
            marks_max: marks_max.max(1),
        }
    }

    fn slots(&self) -> u64 {
        (self.tree.len() - 1) as u64
    }

    fn add(&mut self, stamp: u64, delta: i64) {
        debug_assert!(stamp < self.next);
        let mut i = (stamp + 1) as usize;
        while i < self.tree.len() {
            self.tree[i] += delta;
            i += i & i.wrapping_neg();
        }
    }

    /// Marks at stamps before `stamp`.
    fn before(&self, stamp: u64) -> i64 {
        let mut i = stamp as usize;
        let mut sum = 0;
        while i > 0 {
            sum += self.tree[i];
            i -= i & i.wrapping_neg();
        }
        sum
    }

    /// The distance of a block whose latest access was at `stamp`, were it accessed now
    /// (changes nothing).
    pub fn depth(&self, stamp: u64) -> u64 {
        (self.marks as i64 - self.before(stamp)) as u64
    }

    /// Whether the next access needs a [`compact`](Self::compact) first.
    pub fn full(&self) -> bool {
        self.next >= self.slots()
    }

    /// An access of a block whose latest access was at `previous` (none: its first, or
    /// one forgotten): its new stamp, and its distance when it had a previous one.
    /// Precondition: not [`full`](Self::full), and fewer than `marks_max` marks unless
    /// `previous` is one of them.
    pub fn access(&mut self, previous: Option<u64>) -> (u64, Option<u64>) {
        assert!(
            !self.full(),
            "StackClock::access on a full clock: compact first"
        );
        let distance = previous.map(|stamp| {
            let since = self.marks as i64 - self.before(stamp);
            debug_assert!(since >= 1, "a previous stamp without its mark");
            self.add(stamp, -1);
            self.marks -= 1;
            since as u64
        });
        debug_assert!((self.marks as usize) < self.marks_max);
        let stamp = self.next;
        self.next += 1;
        self.add(stamp, 1);
        self.marks += 1;
        (stamp, distance)
    }

    /// A marked block is forgotten: its mark goes.
    pub fn forget(&mut self, stamp: u64) {
        self.add(stamp, -1);
        self.marks -= 1;
    }

    /// Renumbers the live stamps `0..n` in their order, so the tree has room again.
    /// `live` is every marked block's stamp, each once, in any order; each is replaced
    /// by its new stamp.
    pub fn compact(&mut self, live: &mut [&mut u64]) {
        debug_assert_eq!(live.len() as u64, self.marks);
        live.sort_unstable_by_key(|stamp| **stamp);
        self.tree.iter_mut().for_each(|slot| *slot = 0);
        self.next = 0;
        self.marks = 0;
        for stamp in live.iter_mut() {
            **stamp = self.next;
            self.next += 1;
            self.add(**stamp, 1);
            self.marks += 1;
        }
    }

    /// Blocks marked.
    pub fn marks(&self) -> u64 {
        self.marks
    }
}

/// One histogram bucket: distances `from..=to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct DistanceBucket {
    /// The smallest distance in it (a power of two).
    pub from: u64,
    /// The largest (the next power of two, less one).
    pub to: u64,
    /// Reuses at those distances.
    pub count: u64,
}

/// What the reuse distances were: the unit, percentiles of the recent ones, the histogram
/// of all.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DistanceReport {
    /// Always "distinct_blocks" (see the module documentation).
    pub unit: &'static str,
    /// Reuses measured since the start.
    pub reuses: u64,
    /// Reuses the percentiles are computed over (the most recent ones).
    pub recent: usize,
    /// Nearest-rank percentiles of the recent distances (none before a reuse).
    pub p50: Option<u64>,
    /// See `p50`.
    pub p90: Option<u64>,
    /// See `p50`.
    pub p99: Option<u64>,
    /// The largest recent distance.
    pub max: Option<u64>,
    /// Every reuse since the start by power-of-two bucket, the empty ones left out.
    pub histogram: Vec<DistanceBucket>,
}

/// Distances observed.
#[derive(Clone, Debug)]
pub struct DistanceStats {
    buckets: [u64; 64],
    reuses: u64,
    recent: VecDeque<u64>,
    recent_max: usize,
}

impl DistanceStats {
    /// Keeping the last `recent_max` distances for percentiles.
    pub fn new(recent_max: usize) -> Self {
        Self {
            buckets: [0; 64],
            reuses: 0,
            recent: VecDeque::with_capacity(recent_max.min(1 << 16)),
            recent_max: recent_max.max(1),
        }
    }

    /// One reuse at `distance` (at least 1).
    pub fn record(&mut self, distance: u64) {
        debug_assert!(distance >= 1);
        self.buckets[distance.max(1).ilog2() as usize] += 1;
        self.reuses += 1;
        if self.recent.len() == self.recent_max {
            self.recent.pop_front();
        }
        self.recent.push_back(distance);
    }

    /// Reuses recorded.
    pub fn reuses(&self) -> u64 {
        self.reuses
    }

    /// The report: percentiles by nearest rank (the smallest distance with at least that
    /// share of the recent ones at or under it).
    pub fn report(&self) -> DistanceReport {
        let mut sorted: Vec<u64> = self.recent.iter().copied().collect();
        sorted.sort_unstable();
        let rank = |q: f64| -> Option<u64> {
            if sorted.is_empty() {
                return None;
            }
            let index = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
            Some(sorted[index])
        };
        DistanceReport {
            unit: "distinct_blocks",
            reuses: self.reuses,
            recent: sorted.len(),
            p50: rank(0.5),
            p90: rank(0.9),
            p99: rank(0.99),
            max: sorted.last().copied(),
            histogram: self
                .buckets
                .iter()
                .enumerate()
                .filter(|(_, count)| **count > 0)
                .map(|(k, &count)| DistanceBucket {
                    from: 1u64 << k,
                    to: if k == 63 {
                        u64::MAX
                    } else {
                        (1u64 << (k + 1)) - 1
                    },
                    count,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// The naive stack distance: distinct blocks in `trace[previous..]`, by scanning.
    fn naive(trace: &[u64], block: u64) -> Option<u64> {
        let previous = trace.iter().rposition(|b| *b == block)?;
        let mut distinct: Vec<u64> = trace[previous..].to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        Some(distinct.len() as u64)
    }

    #[test]
    fn distances_count_the_distinct_blocks_since_the_previous_access() {
        // a b c a b b d a: the 4th (a) after b, c: 3 distinct with itself; the 5th (b)
        // after c, a: 3; the 6th (b) right after b: 1; the last (a) after b, b, d: 3.
        let mut clock = StackClock::new(8);
        let mut stamps: BTreeMap<char, u64> = BTreeMap::new();
        let mut distances = Vec::new();
        for block in "abcabbda".chars() {
            let (stamp, distance) = clock.access(stamps.get(&block).copied());
            stamps.insert(block, stamp);
            distances.push(distance);
        }
        assert_eq!(
            distances,
            [None, None, None, Some(3), Some(3), Some(1), None, Some(3)]
        );
        assert_eq!(clock.marks(), 4);
    }

    #[test]
    fn percentiles_are_nearest_rank_over_the_recent_distances() {
        let mut stats = DistanceStats::new(4);
        for d in [100, 1, 2, 3, 4] {
            stats.record(d);
        }
        let report = stats.report();
        // 100 fell out of the recent four; the histogram keeps it.
        assert_eq!(report.reuses, 5);
        assert_eq!(
            (report.p50, report.p90, report.max),
            (Some(2), Some(4), Some(4))
        );
        assert_eq!(
            report.histogram,
            [
                DistanceBucket {
                    from: 1,
                    to: 1,
                    count: 1
                },
                DistanceBucket {
                    from: 2,
                    to: 3,
                    count: 2
                },
                DistanceBucket {
                    from: 4,
                    to: 7,
                    count: 1
                },
                DistanceBucket {
                    from: 64,
                    to: 127,
                    count: 1
                },
            ]
        );
        assert_eq!(DistanceStats::new(3).report().p50, None);
    }

    proptest! {
        /// Whatever the trace and however often the clock compacts (a bound of 8
        /// blocks, fewer distinct ones), distances are the naive ones.
        #[test]
        fn distances_match_a_naive_scan_across_compactions(
            trace in proptest::collection::vec(0u64..8, 1..300),
        ) {
            let mut clock = StackClock::new(8);
            let mut stamps: BTreeMap<u64, u64> = BTreeMap::new();
            for (i, &block) in trace.iter().enumerate() {
                if clock.full() {
                    let mut live: Vec<&mut u64> = stamps.values_mut().collect();
                    clock.compact(&mut live);
                }
                let (stamp, distance) = clock.access(stamps.get(&block).copied());
                prop_assert_eq!(distance, naive(&trace[..i], block));
                stamps.insert(block, stamp);
            }
        }
    }
}
