//! The index against hand-computed streams: what is an access, a copy, a duplicate; the
//! occupancy, reuse distances, hot and cold sets and recommendations they lead to; its
//! bounds.

use super::query::{Demotion, HolderView, OccupancyRow, Promotion, QueryOptions};
use super::*;
use crate::advisor::distance::DistanceBucket;

const A: u64 = 0xA;
const B: u64 = 0xB;
const C: u64 = 0xC;
const D: u64 = 0xD;
const E: u64 = 0xE;
const F: u64 = 0xF;
/// The shared store's worker id.
const STORE: u64 = 100;

/// A test stream: each event of a worker numbered after its last, unless told.
struct Stream {
    index: BlockIndex,
    next_ids: BTreeMap<u64, u64>,
    now: u64,
}

impl Stream {
    fn new(bounds: IndexBounds) -> Self {
        Self {
            index: BlockIndex::new(bounds, 1000),
            next_ids: BTreeMap::new(),
            now: 0,
        }
    }

    /// The next event of `worker` (rank 0) at the next time; its anomaly.
    fn send(&mut self, worker: u64, data: KvCacheEventData) -> Result<(), IndexAnomaly> {
        let id = self.next_ids.entry(worker).or_default();
        let event_id = *id;
        *id += 1;
        self.send_as(worker, 0, event_id, data)
    }

    fn send_as(
        &mut self,
        worker: u64,
        dp_rank: u32,
        event_id: u64,
        data: KvCacheEventData,
    ) -> Result<(), IndexAnomaly> {
        self.now += 1;
        let event = KvCacheEvent {
            event_id,
            dp_rank,
            data,
        };
        self.index
            .handle_event(WorkerId::new(worker), &event, self.now)
    }
}

fn stored(parent: Option<u64>, blocks: &[u64], tier: Tier) -> KvCacheEventData {
    KvCacheEventData::Stored {
        parent_hash: parent.map(SequenceHash::new),
        blocks: blocks
            .iter()
            .map(|&b| StoredBlock {
                block_hash: SequenceHash::new(b),
                tokens_hash: kvtwin::ids::LocalBlockHash::new(b),
            })
            .collect(),
        tier,
    }
}

fn removed(blocks: &[u64], tier: Tier) -> KvCacheEventData {
    KvCacheEventData::Removed {
        block_hashes: blocks.iter().map(|&b| SequenceHash::new(b)).collect(),
        tier,
    }
}

fn row(worker_id: u64, tier: &'static str, blocks: u64) -> OccupancyRow {
    OccupancyRow {
        worker_id,
        dp_rank: 0,
        tier,
        blocks,
        bytes: blocks * 1000,
    }
}

/// Two engines (1 and 2) and the shared store (100), 13 events; the expectations are
/// worked out in the comments.
fn two_engines_and_a_store() -> Stream {
    let mut s = Stream::new(IndexBounds::default());
    // t1: engine 1 computes A B C (3 first accesses; root A). Touched last to first:
    // stamps C0 B1 A2, so the stack is A B C.
    s.send(1, stored(None, &[A, B, C], Tier::Device)).unwrap();
    // t2: D after C (root A): stack D A B C.
    s.send(1, stored(Some(C), &[D], Tier::Device)).unwrap();
    // t3: offloaded to engine 1's host: copies.
    s.send(1, stored(None, &[A, B], Tier::Host)).unwrap();
    // t4: engine 1's device drops all four (A, B stay in its host).
    s.send(1, removed(&[A, B, C, D], Tier::Device)).unwrap();
    // t5: engine 2 computes A B: reuses, A at depth 2 (A, D), B at 3 (B, A, D).
    s.send(2, stored(None, &[A, B], Tier::Device)).unwrap();
    // t6: engine 1 onboards A B from its host (copies) and computes C again: a reuse at
    // depth 4 (C, D, B, A).
    s.send(1, stored(None, &[A, B, C], Tier::Device)).unwrap();
    // t7: the store takes A, which the engines hold: a copy.
    s.send(STORE, stored(None, &[A], Tier::Remote)).unwrap();
    // t8: the store takes E, which no engine is seen holding: a first access (root A).
    s.send(STORE, stored(Some(A), &[E], Tier::Remote)).unwrap();
    // t9: engine 2 never had B on disk.
    assert_eq!(
        s.send(2, removed(&[B], Tier::Disk)),
        Err(IndexAnomaly::UnknownRemoval {
            block: SequenceHash::new(B),
            tier: Tier::Disk
        })
    );
    // t10: engine 2's event 5 after its 1 (a gap), storing A again (a duplicate).
    assert_eq!(
        s.send_as(2, 0, 5, stored(None, &[A], Tier::Device)),
        Err(IndexAnomaly::EventIdGap {
            expected: 2,
            got: 5
        })
    );
    // t11: engine 2 starts another prefix, F.
    s.send_as(2, 0, 6, stored(None, &[F], Tier::Device))
        .unwrap();
    // t12, t13: engine 1 moves C from its device to its host.
    s.send(1, stored(Some(B), &[C], Tier::Host)).unwrap();
    s.send(1, removed(&[C], Tier::Device)).unwrap();
    s
}

#[test]
fn accesses_copies_duplicates_and_anomalies_are_counted_apart() {
    let s = two_engines_and_a_store();
    assert_eq!(
        *s.index.counters(),
        IndexCounters {
            events: 13,
            stored_events: 10,
            removed_events: 3,
            cleared_events: 0,
            stored_blocks: 16,
            // A B C, D, A B, C, E, F.
            accesses: 9,
            first_accesses: 6,
            reuses: 3,
            // t3's two, t6's two, t7's one, t12's one.
            copies: 6,
            duplicate_stores: 1,
            removed_blocks: 5,
            unknown_removals: 1,
            cleared_blocks: 0,
            event_id_gaps: 1,
            refused_events: 0,
            blocks_forgotten: 0,
            held_blocks_forgotten: 0,
            prefixes_forgotten: 0,
        }
    );
    assert_eq!(s.index.blocks_tracked(), 6);
    assert_eq!(s.index.prefixes_tracked(), 2);
}

#[test]
fn occupancy_is_per_rank_and_tier_and_totals_count_copies_and_blocks() {
    let s = two_engines_and_a_store();
    assert_eq!(
        s.index.occupancy(),
        [
            row(1, "device", 2),
            row(1, "host", 3),
            row(2, "device", 3),
            row(STORE, "remote", 2),
        ]
    );
    let totals: Vec<(&str, u64, u64, u64)> = s
        .index
        .tier_totals()
        .iter()
        .map(|t| (t.tier, t.blocks, t.distinct_blocks, t.bytes))
        .collect();
    assert_eq!(
        totals,
        [
            // A, B on both engines, F on engine 2.
            ("device", 5, 3, 5000),
            ("host", 3, 3, 3000),
            ("disk", 0, 0, 0),
            ("remote", 2, 2, 2000),
        ]
    );
}

#[test]
fn reuse_distances_are_lru_stack_depths_in_distinct_blocks() {
    let s = two_engines_and_a_store();
    let report = s.index.reuse_distance();
    assert_eq!(report.unit, "distinct_blocks");
    // 2, 3 and 4: nearest rank p50 is the 2nd of 3, p90 the 3rd.
    assert_eq!(
        (
            report.reuses,
            report.p50,
            report.p90,
            report.p99,
            report.max
        ),
        (3, Some(3), Some(4), Some(4), Some(4))
    );
    assert_eq!(
        report.histogram,
        [
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
        ]
    );
}

#[test]
fn hot_and_cold_sets_follow_accesses_and_idleness() {
    let s = two_engines_and_a_store();
    let now = 14;
    // A, B, C twice each; C most recently (t6), then A before B by hash.
    let hot: Vec<(u64, u64, Option<u64>)> = s
        .index
        .hot_blocks(now, 3)
        .iter()
        .map(|b| (b.block, b.accesses, b.last_access_at))
        .collect();
    assert_eq!(hot, [(C, 2, Some(6)), (A, 2, Some(5)), (B, 2, Some(5))]);
    let a = &s.index.hot_blocks(now, 3)[1];
    // Stored at t1, t3, t5, t6, t7 and t10 (the duplicate).
    assert_eq!((a.root, a.parent, a.stores, a.idle), (A, None, 6, 9));
    assert_eq!(
        a.holders,
        [
            HolderView {
                worker_id: 1,
                dp_rank: 0,
                tier: "device"
            },
            HolderView {
                worker_id: 1,
                dp_rank: 0,
                tier: "host"
            },
            HolderView {
                worker_id: 2,
                dp_rank: 0,
                tier: "device"
            },
            HolderView {
                worker_id: STORE,
                dp_rank: 0,
                tier: "remote"
            },
        ]
    );
    // Prefix A: A B C D E, 8 accesses; prefix F: 1.
    let prefixes: Vec<(u64, u64, u64, u64)> = s
        .index
        .hot_prefixes(10)
        .iter()
        .map(|p| (p.root, p.blocks, p.bytes, p.accesses))
        .collect();
    assert_eq!(prefixes, [(A, 5, 5000, 8), (F, 1, 1000, 1)]);
    // Held, idlest first: A and B (t5), C (t6), E (t8), F (t11); D is held nowhere.
    let cold: Vec<(u64, u64)> = s
        .index
        .cold_blocks(now, 10)
        .iter()
        .map(|b| (b.block, b.idle))
        .collect();
    assert_eq!(cold, [(A, 9), (B, 9), (C, 8), (E, 6), (F, 3)]);
}

#[test]
fn hot_blocks_off_the_devices_are_promoted_and_idle_copies_demoted() {
    let s = two_engines_and_a_store();
    let options = QueryOptions {
        top: 3,
        hot_accesses_min: 2,
        cold_idle_min: 5,
    };
    // C (2 accesses) is only in engine 1's host now; A and B are on devices.
    assert_eq!(
        s.index.promotions(&options),
        [Promotion {
            block: C,
            root: A,
            accesses: 2,
            worker_id: 1,
            dp_rank: 0,
            from: "host",
            to: "device",
        }]
    );
    let demotion = |block, worker_id, from, to| Demotion {
        block,
        worker_id,
        dp_rank: 0,
        from,
        to,
        idle: 9,
    };
    // At 14: A and B idle 9, C 8, E 6 (but only remote), F 3. The idlest first, A's
    // copies before B's.
    assert_eq!(
        s.index.demotions(14, &options),
        [
            demotion(A, 1, "device", "host"),
            demotion(A, 1, "host", "disk"),
            demotion(A, 2, "device", "host"),
        ]
    );
    let strict = QueryOptions {
        cold_idle_min: 9,
        top: 100,
        ..options
    };
    assert_eq!(s.index.demotions(14, &strict).len(), 6, "A's and B's three");
}

#[test]
fn a_block_only_the_store_holds_is_promoted_toward_its_last_engine() {
    let mut s = Stream::new(IndexBounds::default());
    s.send(1, stored(None, &[A], Tier::Device)).unwrap();
    s.send(STORE, stored(None, &[A], Tier::Remote)).unwrap();
    s.send(1, removed(&[A], Tier::Device)).unwrap();
    // Engine 2 fetches it from the store, uses it, drops it.
    s.send(2, stored(None, &[A], Tier::Device)).unwrap();
    s.send(2, removed(&[A], Tier::Device)).unwrap();
    let promotions = s.index.promotions(&QueryOptions::default());
    assert_eq!(
        promotions
            .iter()
            .map(|p| (p.block, p.worker_id, p.from, p.to))
            .collect::<Vec<_>>(),
        [(A, 2, "remote", "disk")]
    );
    // The reuse: A again at depth 1.
    assert_eq!(s.index.reuse_distance().p50, Some(1));
}

#[test]
fn a_cleared_rank_holds_nothing_and_other_ranks_keep_theirs() {
    let mut s = Stream::new(IndexBounds::default());
    s.send_as(1, 0, 0, stored(None, &[A, B], Tier::Device))
        .unwrap();
    s.send_as(1, 0, 1, stored(None, &[A], Tier::Host)).unwrap();
    s.send_as(1, 1, 0, stored(None, &[A], Tier::Device))
        .unwrap();
    s.send_as(1, 0, 2, KvCacheEventData::Cleared).unwrap();
    let c = s.index.counters();
    assert_eq!((c.cleared_events, c.cleared_blocks), (1, 3));
    assert_eq!(
        s.index.occupancy(),
        [OccupancyRow {
            worker_id: 1,
            dp_rank: 1,
            tier: "device",
            blocks: 1,
            bytes: 1000
        }]
    );
    // A cleared block stored again by the rank is a reuse.
    s.send_as(1, 0, 3, stored(None, &[B], Tier::Device))
        .unwrap();
    assert_eq!(s.index.counters().reuses, 2, "rank 1 took A, rank 0 took B");
}

#[test]
fn the_bounds_hold_and_what_they_drop_is_counted() {
    let bounds = IndexBounds {
        blocks_max: 3,
        ranks_max: 2,
        prefixes_max: 1,
        recent_distances_max: 2,
    };
    let mut s = Stream::new(bounds);
    // A B C held, then removed: D and E push the unheld ones out first.
    s.send(1, stored(None, &[A, B, C], Tier::Device)).unwrap();
    s.send(1, removed(&[A, B], Tier::Device)).unwrap();
    s.send(1, stored(None, &[D, E], Tier::Device)).unwrap();
    assert_eq!(s.index.blocks_tracked(), 3);
    let c = s.index.counters().clone();
    assert_eq!((c.blocks_forgotten, c.held_blocks_forgotten), (2, 0));
    // One prefix at a time: D's root pushed A's out.
    assert_eq!((s.index.prefixes_tracked(), c.prefixes_forgotten), (1, 1));
    // F: all three held, the least recently seen (C) is forgotten with its holding.
    s.send(1, stored(None, &[F], Tier::Device)).unwrap();
    let c = s.index.counters().clone();
    assert_eq!((c.blocks_forgotten, c.held_blocks_forgotten), (3, 1));
    assert_eq!(s.index.occupancy(), [row(1, "device", 3)]);
    // A forgotten block comes back as a first access.
    s.send(2, stored(None, &[A], Tier::Device)).unwrap();
    assert_eq!(s.index.counters().reuses, 0);
    // A third rank is refused whole.
    assert_eq!(
        s.send(3, stored(None, &[B], Tier::Device)),
        Err(IndexAnomaly::RanksMax {
            worker: WorkerId::new(3),
            dp_rank: 0,
            ranks_max: 2
        })
    );
    assert_eq!(s.index.counters().refused_events, 1);
    assert_eq!(s.index.ranks_tracked(), 2);
}

#[test]
fn distances_survive_the_clocks_compactions() {
    // Two blocks tracked at most, two engines taking turns at one block: every access
    // after the first two is a reuse at depth 2, across many compactions of a clock of
    // five slots.
    let bounds = IndexBounds {
        blocks_max: 2,
        ..IndexBounds::default()
    };
    let mut s = Stream::new(bounds);
    for round in 0..50u64 {
        let block = if round % 2 == 0 { A } else { B };
        let worker = 1 + round % 2;
        s.send(worker, stored(None, &[block], Tier::Device))
            .unwrap();
        s.send(worker, removed(&[block], Tier::Device)).unwrap();
    }
    let report = s.index.reuse_distance();
    assert_eq!(report.reuses, 48);
    assert_eq!((report.p50, report.max), (Some(2), Some(2)));
}

mod model {
    //! The index against a deliberately naive model: holders in one `BTreeSet`, the
    //! access rule spelled out, distances by scanning every touch so far.

    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[derive(Default)]
    struct Naive {
        holders: BTreeSet<(u64, Tier, u64)>,
        touches: Vec<u64>,
        accesses: u64,
        reuses: u64,
        copies: u64,
        duplicates: u64,
        distances: Vec<u64>,
    }

    impl Naive {
        fn stored(&mut self, worker: u64, blocks: &[u64], tier: Tier) {
            let mut accessed = Vec::new();
            for &block in blocks {
                if self.holders.contains(&(worker, tier, block)) {
                    self.duplicates += 1;
                    continue;
                }
                let rank_holds = self.holders.iter().any(|h| h.0 == worker && h.2 == block);
                let others_hold = self.holders.iter().any(|h| h.0 != worker && h.2 == block);
                self.holders.insert((worker, tier, block));
                if rank_holds || (tier == Tier::Remote && others_hold) {
                    self.copies += 1;
                } else {
                    accessed.push(block);
                }
            }
            for &block in &accessed {
                self.accesses += 1;
                if let Some(at) = self.touches.iter().rposition(|b| *b == block) {
                    let distinct: BTreeSet<u64> = self.touches[at..].iter().copied().collect();
                    self.reuses += 1;
                    self.distances.push(distinct.len() as u64);
                }
            }
            self.touches.extend(accessed.iter().rev());
        }
    }

    fn tier_of(i: u8) -> Tier {
        Tier::ALL[usize::from(i % 4)]
    }

    proptest! {
        #[test]
        fn the_index_agrees_with_a_naive_model(
            events in proptest::collection::vec(
                (0u64..3, 0u8..3, 0u8..4, proptest::collection::vec(0u64..10, 1..4)),
                1..120,
            ),
        ) {
            let mut s = Stream::new(IndexBounds::default());
            let mut naive = Naive::default();
            for (worker, kind, tier, blocks) in &events {
                let tier = tier_of(*tier);
                match kind {
                    0 | 1 => {
                        let _ = s.send(*worker, stored(None, blocks, tier));
                        naive.stored(*worker, blocks, tier);
                    }
                    _ => {
                        let _ = s.send(*worker, removed(blocks, tier));
                        for block in blocks {
                            naive.holders.remove(&(*worker, tier, *block));
                        }
                    }
                }
            }
            let c = s.index.counters();
            prop_assert_eq!(
                (c.accesses, c.reuses, c.copies, c.duplicate_stores),
                (naive.accesses, naive.reuses, naive.copies, naive.duplicates)
            );
            let mut expected = Vec::new();
            for worker in 0..3u64 {
                for tier in Tier::ALL {
                    let blocks = naive
                        .holders
                        .iter()
                        .filter(|h| h.0 == worker && h.1 == tier)
                        .count() as u64;
                    if blocks > 0 {
                        expected.push(OccupancyRow {
                            worker_id: worker,
                            dp_rank: 0,
                            tier: tier.name(),
                            blocks,
                            bytes: blocks * 1000,
                        });
                    }
                }
            }
            prop_assert_eq!(s.index.occupancy(), expected);
            let mut sorted = naive.distances.clone();
            sorted.sort_unstable();
            let report = s.index.reuse_distance();
            prop_assert_eq!(report.max, sorted.last().copied());
            let histogram: u64 = report.histogram.iter().map(|b| b.count).sum();
            prop_assert_eq!(histogram, naive.distances.len() as u64);
            for bucket in &report.histogram {
                let count = naive
                    .distances
                    .iter()
                    .filter(|d| (bucket.from..=bucket.to).contains(*d))
                    .count() as u64;
                prop_assert_eq!(bucket.count, count);
            }
        }
    }
}
