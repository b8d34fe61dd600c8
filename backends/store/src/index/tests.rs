//! The index alone: placement, room made down the tiers, leases, recovery, and a
//! property test that replays its steps on a model of the tiers' contents.

use super::*;
use proptest::prelude::*;
use std::collections::BTreeSet;

fn key(n: u64) -> Bytes {
    Bytes::from(format!("k{n}"))
}

fn put(index: &mut TierIndex, n: u64, size: u64) -> (Tier, Vec<Step>) {
    let copy = index.new_copy();
    index.place(key(n), copy, size, [0; 32]).expect("placed")
}

#[test]
fn values_fill_memory_then_move_down_least_recently_used_first() {
    let mut index = TierIndex::new([200, 200, 200]);
    assert_eq!(put(&mut index, 1, 100).0, Tier::Memory);
    assert_eq!(put(&mut index, 2, 100).0, Tier::Memory);
    // Key 1 read: key 2 is now the least recently used of memory.
    index.get(b"k1").expect("held");
    let (tier, steps) = put(&mut index, 3, 100);
    assert_eq!(tier, Tier::Memory);
    assert_eq!(
        steps,
        vec![Step::Demote {
            key: key(2),
            copy: 2,
            from: Tier::Memory,
            to: Tier::Disk
        }]
    );
    assert_eq!(index.peek(b"k2").map(|e| e.tier), Some(Tier::Disk));
    // Three more: memory's two oldest go to disk, disk's oldest to the object tier.
    for n in 4..=6 {
        put(&mut index, n, 100);
    }
    assert_eq!(
        Tier::ALL.map(|t| index.count(t)),
        [2, 2, 2],
        "every tier full"
    );
    // One more: the object tier's oldest (key 2) leaves the store.
    let (_, steps) = put(&mut index, 7, 100);
    assert!(steps.contains(&Step::Delete {
        key: key(2),
        copy: 2,
        tier: Tier::Object,
        evicted: true
    }));
    assert_eq!(index.peek(b"k2"), None);
    assert_eq!(index.len(), 6);
    for tier in Tier::ALL {
        assert!(index.used(tier) <= index.limit(tier));
    }
}

#[test]
fn a_value_too_large_for_memory_goes_to_the_first_tier_that_holds_it() {
    let mut index = TierIndex::new([100, 1000, 0]);
    assert_eq!(put(&mut index, 1, 500).0, Tier::Disk);
    let copy = index.new_copy();
    assert_eq!(
        index.place(key(2), copy, 5000, [0; 32]),
        Err(Full::TooLarge { size: 5000 })
    );
}

#[test]
fn a_leased_copy_is_not_moved_and_a_replaced_one_goes_with_its_last_lease() {
    let mut index = TierIndex::new([100, 100, 0]);
    put(&mut index, 1, 100);
    put(&mut index, 2, 100); // key 1 to disk
    let on_disk = index.get(b"k1").expect("held");
    assert_eq!(on_disk.tier, Tier::Disk);
    assert_eq!(index.leased(), 1);
    // Memory is full of key 2, disk of leased key 1: no room below, key 2 leaves.
    let (_, steps) = put(&mut index, 3, 100);
    assert_eq!(
        steps,
        vec![Step::Delete {
            key: key(2),
            copy: 2,
            tier: Tier::Memory,
            evicted: true
        }]
    );
    // Key 1 overwritten while read: its old copy is dead but still there.
    let (tier, steps) = put(&mut index, 1, 50);
    assert_eq!(tier, Tier::Memory);
    assert!(
        !steps
            .iter()
            .any(|s| matches!(s, Step::Delete { copy, .. } if *copy == on_disk.copy)),
        "{steps:?}"
    );
    assert_eq!(index.used(Tier::Disk), 100, "counted until read");
    // The reader is done: now it goes.
    assert_eq!(
        index.release(on_disk.copy),
        Some(Step::Delete {
            key: key(1),
            copy: on_disk.copy,
            tier: Tier::Disk,
            evicted: false
        })
    );
    assert_eq!(index.used(Tier::Disk), 0);
    assert_eq!(index.leased(), 0);
}

#[test]
fn a_tier_full_of_leased_copies_refuses_until_they_are_read() {
    let mut index = TierIndex::new([0, 100, 0]);
    put(&mut index, 1, 100);
    let read = index.get(b"k1").expect("held");
    let copy = index.new_copy();
    assert_eq!(
        index.place(key(2), copy, 10, [0; 32]),
        Err(Full::Leased {
            tier: Tier::Disk,
            leased: 100,
            limit: 100
        })
    );
    assert_eq!(index.len(), 1, "nothing changed");
    assert_eq!(index.release(read.copy), None, "still live");
    assert!(index.place(key(2), copy, 10, [0; 32]).is_ok());
}

#[test]
fn recovery_keeps_each_keys_newest_copy_and_trims_to_the_bounds() {
    let mut index = TierIndex::new([100, 200, 0]);
    let steps = index.recover(vec![
        (key(1), 5, Tier::Disk, 100, [0; 32]),
        (key(1), 3, Tier::Disk, 100, [0; 32]),
        (key(2), 4, Tier::Disk, 100, [0; 32]),
        (key(3), 6, Tier::Disk, 100, [0; 32]),
    ]);
    // Key 1's copy 3 is older than its copy 5; then disk holds 300 of 200 bytes: the
    // least recent (by copy: key 2's 4) goes.
    assert_eq!(
        steps,
        vec![
            Step::Delete {
                key: key(1),
                copy: 3,
                tier: Tier::Disk,
                evicted: false
            },
            Step::Delete {
                key: key(2),
                copy: 4,
                tier: Tier::Disk,
                evicted: true
            },
        ]
    );
    assert_eq!(index.peek(b"k1").map(|e| e.copy), Some(5));
    assert_eq!(index.new_copy(), 7, "copies go on after the newest found");
}

/// What a sequence of calls does.
#[derive(Clone, Debug)]
enum Op {
    Put(u8, u16),
    Get(u8),
    Release(usize),
    Remove(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0u8..12, 1u16..120).prop_map(|(k, s)| Op::Put(k, s)),
        (0u8..12).prop_map(Op::Get),
        (0usize..8).prop_map(Op::Release),
        (0u8..12).prop_map(Op::Remove),
    ]
}

proptest! {
    /// The steps, carried out on a model of what each tier holds, always leave exactly
    /// the index's live and dead copies there, and no tier over its bound.
    #[test]
    fn the_steps_keep_the_tiers_as_the_index_says(
        limits in (0u64..300, 0u64..300, 0u64..300),
        ops in proptest::collection::vec(op(), 1..200),
    ) {
        let limits = [limits.0, limits.1, limits.2];
        let mut index = TierIndex::new(limits);
        // (tier, copy) → key: what lies where.
        let mut tiers: BTreeSet<(Tier, u64, Bytes)> = BTreeSet::new();
        let mut held: Vec<u64> = Vec::new();
        let apply = |tiers: &mut BTreeSet<(Tier, u64, Bytes)>, steps: Vec<Step>| {
            for step in steps {
                match step {
                    Step::Demote { key, copy, from, to } => {
                        assert!(tiers.remove(&(from, copy, key.clone())), "demoted what was not there");
                        assert!(from < to);
                        tiers.insert((to, copy, key));
                    }
                    Step::Delete { key, copy, tier, .. } => {
                        assert!(tiers.remove(&(tier, copy, key)), "deleted what was not there");
                    }
                }
            }
        };
        for op in ops {
            match op {
                Op::Put(k, size) => {
                    let copy = index.new_copy();
                    if let Ok((tier, steps)) = index.place(key(u64::from(k)), copy, u64::from(size), [0; 32]) {
                        apply(&mut tiers, steps);
                        tiers.insert((tier, copy, key(u64::from(k))));
                    }
                }
                Op::Get(k) => {
                    if let Some(entry) = index.get(format!("k{k}").as_bytes()) {
                        if entry.tier != Tier::Memory {
                            held.push(entry.copy);
                        }
                    }
                }
                Op::Release(i) => {
                    if !held.is_empty() {
                        let copy = held.remove(i % held.len());
                        apply(&mut tiers, index.release(copy).into_iter().collect());
                    }
                }
                Op::Remove(k) => {
                    if let Some(steps) = index.remove(format!("k{k}").as_bytes()) {
                        apply(&mut tiers, steps);
                    }
                }
            }
            // What lies on the tiers: every live entry where the index says, plus the
            // dead copies still read.
            let live: BTreeSet<(Tier, u64, Bytes)> = index
                .entries
                .iter()
                .map(|(key, e)| (e.tier, e.copy, key.clone()))
                .collect();
            let dead: BTreeSet<(Tier, u64, Bytes)> = index
                .dead
                .iter()
                .map(|(copy, key)| (index.leases[copy].1, *copy, key.clone()))
                .collect();
            prop_assert_eq!(&tiers, &live.union(&dead).cloned().collect());
            for tier in Tier::ALL {
                prop_assert!(index.used(tier) <= index.limit(tier), "{:?} over its bound", tier);
            }
        }
        for copy in held {
            apply(&mut tiers, index.release(copy).into_iter().collect());
        }
        prop_assert!(index.dead.is_empty() && index.leases.is_empty());
        prop_assert_eq!(index.pinned, [0; 3]);
    }
}
