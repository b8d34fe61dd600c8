//! Budget tests: caps hold, eviction takes least recently used leaves, and a bounded
//! index never answers more than the unbounded one would.

use super::tests::{chain_of, op, removed, stored, Op, CHAINS};
use super::*;
use crate::router::test_support::{key, query};
use proptest::prelude::*;

fn per_worker(cap: usize) -> KvIndexer {
    KvIndexer::with_budget(IndexBudget {
        max_blocks_per_worker: Some(cap),
        ..IndexBudget::UNBOUNDED
    })
}

#[test]
fn the_least_recently_stored_or_matched_leaves_go_first() {
    let mut index = per_worker(4);
    let worker = WorkerId::new(1);
    let (a, b, c) = (chain_of(&[1, 2]), chain_of(&[3, 4]), chain_of(&[5, 6]));
    index
        .apply(worker, &stored(1, None, &a, Tier::Device))
        .unwrap();
    index
        .apply(worker, &stored(2, None, &b, Tier::Device))
        .unwrap();
    // A is older than B, but a query uses it: B is now the least recently used.
    index.touch(&query(&[1, 2]));
    index
        .apply(worker, &stored(3, None, &c, Tier::Device))
        .unwrap();
    index.check_invariants();
    let score =
        |index: &KvIndexer, locals: &[u64]| index.find_matches(&query(locals), false).score(key(1));
    assert_eq!(
        [
            score(&index, &[1, 2]),
            score(&index, &[3, 4]),
            score(&index, &[5, 6])
        ],
        [2, 0, 2]
    );
    let stats = index.worker_stats(key(1));
    assert_eq!((stats.blocks, stats.evicted_blocks), (4, 2));
    assert_eq!(index.stats().evicted_blocks, 2);
}

#[test]
fn eviction_cuts_a_runs_tail_so_stores_under_survivors_still_chain() {
    let mut index = per_worker(3);
    let worker = WorkerId::new(1);
    let chain = chain_of(&[1, 2, 3, 4, 5]);
    index
        .apply(worker, &stored(1, None, &chain[..4], Tier::Device))
        .unwrap();
    // Block 4 (the leaf) went; 1..3 stay, a prefix.
    assert_eq!(index.find_matches(&query(&[1, 2, 3, 4]), false).max(), 3);
    // A store under a surviving parent chains as usual (and, over the cap again, the
    // newest leaf is the only one to go: it is the worker's only leaf).
    let under_survivor = stored(2, Some(chain[2].sequence_hash), &chain[3..4], Tier::Host);
    assert_eq!(index.apply(worker, &under_survivor), Ok(()));
    // Events about evicted blocks are no errors, and are counted apart.
    let under_evicted = stored(3, Some(chain[3].sequence_hash), &chain[4..5], Tier::Device);
    assert_eq!(index.apply(worker, &under_evicted), Ok(()));
    assert_eq!(
        index.apply(
            worker,
            &removed(
                4,
                &[chain[4].sequence_hash, chain[3].sequence_hash],
                Tier::Device
            )
        ),
        Ok(())
    );
    let stats = index.stats();
    assert_eq!(
        (
            stats.parent_not_found,
            stats.unknown_removals,
            stats.rejections()
        ),
        (0, 0, 0)
    );
    assert_eq!((stats.stored_under_evicted, stats.evicted_removals), (1, 2));
    // A block never stored is still an unknown removal.
    let never = chain_of(&[9])[0].sequence_hash;
    assert!(index
        .apply(worker, &removed(5, &[never], Tier::Device))
        .is_err());
    assert_eq!(index.stats().unknown_removals, 1);
    index.check_invariants();
}

#[test]
fn the_global_cap_evicts_from_the_worker_holding_the_most() {
    let mut index = KvIndexer::with_budget(IndexBudget {
        max_blocks: Some(6),
        ..IndexBudget::UNBOUNDED
    });
    index
        .apply(
            WorkerId::new(1),
            &stored(1, None, &chain_of(&[1, 2, 3, 4, 5]), Tier::Device),
        )
        .unwrap();
    index
        .apply(
            WorkerId::new(2),
            &stored(1, None, &chain_of(&[7, 8, 9]), Tier::Device),
        )
        .unwrap();
    index.check_invariants();
    assert_eq!(index.distinct_blocks(), 6);
    assert_eq!(index.worker_stats(key(1)).blocks, 3);
    assert_eq!(index.worker_stats(key(1)).evicted_blocks, 2);
    assert_eq!(index.worker_stats(key(2)).blocks, 3);
}

#[test]
fn an_unbounded_index_keeps_no_recency() {
    let mut index = KvIndexer::new();
    index
        .apply(
            WorkerId::new(1),
            &stored(1, None, &chain_of(&[1, 2]), Tier::Device),
        )
        .unwrap();
    index.touch(&query(&[1, 2]));
    assert!(index.recency.is_none());
    assert_eq!(index.worker_stats(key(1)).blocks, 2);
    assert_eq!(index.budget(), IndexBudget::UNBOUNDED);
}

fn names(view: &BTreeMap<SequenceHash, u8>) -> Vec<(Vec<u64>, u8)> {
    let mut out = Vec::new();
    for (hash, tiers) in view {
        for chain in CHAINS {
            let ids = chain_of(&chain);
            if let Some(i) = ids.iter().position(|b| b.sequence_hash == *hash) {
                out.push((chain[..=i].to_vec(), *tiers));
                break;
            }
        }
    }
    out
}

/// Whether every block of `view` (blocks of `CHAINS`) has its parent in `view` too.
fn prefix_closed(view: &BTreeMap<SequenceHash, u8>) -> bool {
    let mut parent = BTreeMap::new();
    for chain in CHAINS {
        let identities = chain_of(&chain);
        for pair in identities.windows(2) {
            parent.insert(pair[1].sequence_hash, pair[0].sequence_hash);
        }
    }
    view.keys()
        .all(|hash| parent.get(hash).is_none_or(|p| view.contains_key(p)))
}

/// The event an op stands for (None for queries and worker removals), numbered per
/// worker; as the reference proptest builds them.
fn event_of(op: &Op, next_id: &mut BTreeMap<u64, u64>) -> Option<(u64, KvCacheEvent)> {
    let mut event = |worker: u64, data: KvCacheEventData| {
        let id = next_id.entry(worker).or_default();
        *id += 1;
        Some((
            worker,
            KvCacheEvent {
                event_id: *id,
                dp_rank: 0,
                data,
            },
        ))
    };
    match op {
        Op::Store {
            worker,
            chain,
            from,
            to,
            tier,
            skip_parent,
        } => {
            let identities = chain_of(&CHAINS[*chain]);
            let (from, to) = ((*from).min(*to - 1), *to);
            let parent = if *skip_parent || from == 0 {
                None
            } else {
                Some(identities[from - 1].sequence_hash)
            };
            let start = if *skip_parent { from.min(1) } else { from };
            let blocks = identities[start..to]
                .iter()
                .map(|b| StoredBlock {
                    block_hash: b.sequence_hash,
                    tokens_hash: b.local_hash,
                })
                .collect();
            event(
                *worker,
                KvCacheEventData::Stored {
                    parent_hash: parent,
                    blocks,
                    tier: *tier,
                },
            )
        }
        Op::Forge { worker } => {
            let blocks = vec![StoredBlock {
                block_hash: SequenceHash::new(99),
                tokens_hash: LocalBlockHash::new(1),
            }];
            event(
                *worker,
                KvCacheEventData::Stored {
                    parent_hash: None,
                    blocks,
                    tier: Tier::Device,
                },
            )
        }
        Op::Remove {
            worker,
            chain,
            from,
            to,
            leaf_first,
            tier,
        } => {
            let mut hashes: Vec<SequenceHash> = chain_of(&CHAINS[*chain])[*from..*to]
                .iter()
                .map(|b| b.sequence_hash)
                .collect();
            if *leaf_first {
                hashes.reverse();
            }
            event(
                *worker,
                KvCacheEventData::Removed {
                    block_hashes: hashes,
                    tier: *tier,
                },
            )
        }
        Op::Clear { worker } => event(*worker, KvCacheEventData::Cleared),
        Op::RemoveWorker { .. } | Op::Match { .. } => None,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn a_bounded_index_keeps_its_caps_and_answers_a_prefix_of_the_unbounded_one(
        ops in prop::collection::vec(op(), 1..120),
        max_blocks in prop::option::of(1usize..16),
        per_worker_cap in prop::option::of(1usize..10),
    ) {
        let budget = IndexBudget {
            max_blocks,
            max_blocks_per_worker: per_worker_cap,
            ..IndexBudget::UNBOUNDED
        };
        let mut bounded = KvIndexer::with_budget(budget);
        let mut unbounded = KvIndexer::new();
        let mut next_id = BTreeMap::new();
        for op in &ops {
            match op {
                Op::RemoveWorker { worker } => {
                    bounded.remove_worker(WorkerId::new(*worker));
                    unbounded.remove_worker(WorkerId::new(*worker));
                    next_id.remove(worker);
                }
                Op::Match { chain, len } => {
                    let query: Vec<LocalBlockHash> =
                        CHAINS[*chain][..*len].iter().map(|l| LocalBlockHash::new(*l)).collect();
                    bounded.touch(&query);
                }
                _ => {
                    if let Some((worker, event)) = event_of(op, &mut next_id) {
                        let _ = bounded.apply(WorkerId::new(worker), &event);
                        let _ = unbounded.apply(WorkerId::new(worker), &event);
                    }
                }
            }
            bounded.check_invariants();
            if let Some(cap) = max_blocks {
                prop_assert!(bounded.distinct_blocks() <= cap);
            }
            for worker in 0..3 {
                let mine = bounded.blocks_of(key(worker));
                if let Some(cap) = per_worker_cap {
                    prop_assert!(mine.len() <= cap);
                    prop_assert_eq!(bounded.worker_stats(key(worker)).blocks as usize, mine.len());
                }
                // Never more than the unbounded view: each block, each tier.
                let theirs = unbounded.blocks_of(key(worker));
                // Eviction takes leaves only: a view the events kept prefix-closed stays so.
                if prefix_closed(&theirs) {
                    prop_assert!(prefix_closed(&mine), "evicted a block under a kept one: {:?} vs {:?}", names(&mine), names(&theirs));
                }
                for (hash, tiers) in &mine {
                    let all = theirs.get(hash).copied().unwrap_or(0);
                    prop_assert_eq!(tiers & !all, 0, "block {:?} not in the unbounded view", hash);
                }
            }
            // Every answer is a prefix of the unbounded one, worker by worker.
            for chain in CHAINS {
                for len in 1..=chain.len() {
                    let query: Vec<LocalBlockHash> =
                        chain[..len].iter().map(|l| LocalBlockHash::new(*l)).collect();
                    let full = unbounded.find_matches(&query, false);
                    for overlap in bounded.find_matches(&query, false).workers {
                        prop_assert!(overlap.blocks <= full.score(overlap.worker));
                    }
                }
            }
            // Events about evicted blocks are never counted as errors.
            let (b, u) = (bounded.stats(), unbounded.stats());
            prop_assert!(b.unknown_removals <= u.unknown_removals);
            prop_assert!(b.parent_not_found <= u.parent_not_found);
        }
        if !budget.is_bounded() {
            prop_assert_eq!(bounded.stats().evicted_blocks, 0);
        }
    }
}
