//! Unit tests of the pool: allocation, registration, deduplication, lazy eviction,
//! policies and events.

use super::*;
use crate::block::BlockState;
use crate::events::KvCacheEventData;
use crate::ids::LocalBlockHash;
use crate::tokens::HashSeed;

fn pool(capacity: usize, eviction: EvictionPolicyKind) -> BlockPool {
    BlockPool::new(PoolConfig {
        tier: Tier::Device,
        capacity_blocks: capacity,
        block_size_tokens: 4,
        eviction,
    })
    .unwrap()
}

fn chain(n: u64) -> Vec<BlockIdentity> {
    let locals: Vec<LocalBlockHash> = (0..n).map(|i| LocalBlockHash::new(1000 + i)).collect();
    BlockIdentity::chain(&locals)
}

fn register_chain(pool: &BlockPool, identities: &[BlockIdentity]) -> BlockChain {
    let blocks = pool.allocate(identities.len()).unwrap();
    let complete = blocks
        .into_iter()
        .zip(identities)
        .map(|(b, id)| b.apply_identity(*id))
        .collect();
    pool.register_chain(complete)
}

fn hashes(identities: &[BlockIdentity]) -> Vec<SequenceHash> {
    identities.iter().map(|i| i.sequence_hash).collect()
}

#[test]
fn rejects_degenerate_configs() {
    let config = PoolConfig {
        tier: Tier::Host,
        capacity_blocks: 0,
        block_size_tokens: 4,
        eviction: EvictionPolicyKind::Lru,
    };
    assert_eq!(
        BlockPool::new(config).unwrap_err(),
        PoolConfigError::ZeroCapacity
    );
    let config = PoolConfig {
        capacity_blocks: 1,
        block_size_tokens: 0,
        ..config
    };
    assert_eq!(
        BlockPool::new(config).unwrap_err(),
        PoolConfigError::ZeroBlockSize
    );
}

#[test]
fn dropping_a_mutable_block_returns_it_free() {
    let pool = pool(4, EvictionPolicyKind::Lru);
    let blocks = pool.allocate(3).unwrap();
    assert_eq!(
        pool.counts(),
        PoolCounts {
            capacity: 4,
            free: 1,
            cached: 0,
            active: 3
        }
    );
    assert_eq!(blocks[0].state(), BlockState::Reset);
    drop(blocks);
    assert_eq!(
        pool.check_invariants(),
        PoolCounts {
            capacity: 4,
            free: 4,
            cached: 0,
            active: 0
        }
    );
}

#[test]
fn allocation_is_all_or_nothing() {
    let pool = pool(2, EvictionPolicyKind::Lru);
    let held = pool.allocate(1).unwrap();
    let error = pool.allocate(2).unwrap_err();
    assert_eq!(
        error,
        AllocError::Exhausted {
            tier: Tier::Device,
            requested: 2,
            available: 1
        }
    );
    assert_eq!(pool.counts().active, 1);
    assert_eq!(pool.stats().failed_allocations, 1);
    drop(held);
}

#[test]
fn blocks_are_taken_by_id_only_when_free_and_all_or_nothing() {
    let pool = pool(4, EvictionPolicyKind::Lru);
    let ids = |list: &[u32]| list.iter().map(|&i| BlockId::new(i)).collect::<Vec<_>>();
    let taken = pool.allocate_ids(&ids(&[2, 0])).unwrap();
    assert_eq!(
        taken.iter().map(MutableBlock::block_id).collect::<Vec<_>>(),
        ids(&[2, 0])
    );
    // Registered and cached, block 2 is not free; neither is one out of range, or one
    // asked for twice; a refusal takes nothing.
    let identities = chain(2);
    let complete = taken
        .into_iter()
        .zip(&identities)
        .map(|(block, identity)| block.apply_identity(*identity))
        .collect();
    drop(pool.register_chain(complete));
    for refused in [&[1, 2][..], &[9], &[3, 3]] {
        let error = pool.allocate_ids(&ids(refused)).unwrap_err();
        assert!(
            matches!(
                error,
                AllocError::NotFree {
                    tier: Tier::Device,
                    ..
                }
            ),
            "{error}"
        );
        assert_eq!(pool.counts().free, 2, "{refused:?} took nothing");
    }
    assert_eq!(pool.check_invariants().cached, 2);
    assert!(pool.contains(identities[1].sequence_hash));
    // The rest of the free blocks are handed out as before, then the cached ones.
    let rest = pool.allocate(2).unwrap();
    assert_eq!(
        rest.iter().map(MutableBlock::block_id).collect::<Vec<_>>(),
        ids(&[1, 3])
    );
    drop(rest);
    pool.check_invariants();
}

#[test]
fn fills_commits_and_registers_a_block_from_tokens() {
    let pool = pool(2, EvictionPolicyKind::Lru);
    let mut partial = pool
        .allocate_one()
        .unwrap()
        .init_sequence(None, HashSeed::default());
    assert_eq!(partial.add_tokens(&[1, 2, 3]), 3);
    let (mut partial, error) = partial.commit().unwrap_err();
    assert!(matches!(
        error,
        crate::block::BlockError::NotFull {
            tokens: 3,
            block_size: 4
        }
    ));
    assert_eq!(partial.add_tokens(&[4, 5]), 1);
    let complete = partial.commit().unwrap();
    assert_eq!(
        complete.identity().sequence_hash.get(),
        14643705804678351452
    );
    let registered = pool.register(complete);
    assert!(pool.contains(registered.sequence_hash()));
    assert_eq!(pool.counts().active, 1);
    drop(registered);
    assert_eq!(
        pool.check_invariants(),
        PoolCounts {
            capacity: 2,
            free: 1,
            cached: 1,
            active: 0
        }
    );
}

#[test]
fn duplicate_registration_returns_the_existing_block_and_frees_the_new_one() {
    let pool = pool(4, EvictionPolicyKind::Lru);
    let ids = chain(1);
    let first = register_chain(&pool, &ids);
    let second = pool.allocate_one().unwrap().apply_identity(ids[0]);
    let (dup, duplicate) = pool.register_reporting(second);
    assert!(duplicate);
    assert_eq!(Some(dup.block_id()), first.block_ids().next());
    assert_eq!(
        pool.snapshot().registered.get(&ids[0].sequence_hash),
        Some(&2)
    );
    assert_eq!(
        pool.check_invariants(),
        PoolCounts {
            capacity: 4,
            free: 3,
            cached: 0,
            active: 1
        }
    );
    let events = pool.take_events();
    assert_eq!(
        events.len(),
        1,
        "a duplicate is not stored twice: {events:?}"
    );
}

#[test]
fn cached_blocks_keep_their_hash_until_reused_and_then_emit_removed() {
    let pool = pool(2, EvictionPolicyKind::Lru);
    let ids = chain(2);
    pool.release(register_chain(&pool, &ids));
    assert_eq!(pool.counts().cached, 2);
    // A late prefix hit on a cached block is free.
    let hit = pool.match_prefix(&hashes(&ids));
    assert_eq!(hit.len(), 2);
    assert_eq!(pool.stats().hits_cached_blocks, 2);
    pool.release(hit);
    let _ = pool.take_events();
    // Reuse evicts the leaf first: it was released first.
    let reused = pool.allocate_one().unwrap();
    assert!(!pool.contains(ids[1].sequence_hash));
    assert!(pool.contains(ids[0].sequence_hash));
    let events = pool.take_events();
    assert_eq!(
        events,
        vec![KvCacheEventData::Removed {
            block_hashes: vec![ids[1].sequence_hash],
            tier: Tier::Device
        }]
    );
    drop(reused);
    pool.check_invariants();
}

#[test]
fn evicts_lru_unreferenced_block_first() {
    let pool = pool(3, EvictionPolicyKind::Lru);
    let a = chain(1);
    let b: Vec<BlockIdentity> = BlockIdentity::chain(&[LocalBlockHash::new(7)]).to_vec();
    let c: Vec<BlockIdentity> = BlockIdentity::chain(&[LocalBlockHash::new(8)]).to_vec();
    pool.release(register_chain(&pool, &a));
    pool.release(register_chain(&pool, &b));
    pool.release(register_chain(&pool, &c));
    // Touch a: b is now the least recently used.
    pool.release(pool.match_prefix(&hashes(&a)));
    let _block = pool.allocate_one().unwrap();
    assert!(!pool.contains(b[0].sequence_hash));
    assert!(pool.contains(a[0].sequence_hash) && pool.contains(c[0].sequence_hash));
}

#[test]
fn prefix_match_stops_at_the_first_miss() {
    let pool = pool(4, EvictionPolicyKind::Lru);
    let ids = chain(3);
    let held = register_chain(&pool, &ids[..2]);
    let found = pool.match_prefix(&hashes(&ids));
    assert_eq!(found.len(), 2);
    assert_eq!(pool.prefix_len(&hashes(&ids)), 2);
    let missing_first = [ids[2].sequence_hash, ids[0].sequence_hash];
    assert!(pool.match_prefix(&missing_first).is_empty());
    drop((held, found));
    assert_eq!(pool.check_invariants().cached, 2);
}

#[test]
fn consecutive_registrations_of_a_chain_form_one_stored_event() {
    let pool = pool(4, EvictionPolicyKind::Lru);
    let ids = chain(3);
    let _held = register_chain(&pool, &ids);
    let events = pool.take_events();
    assert_eq!(events.len(), 1);
    match &events[0] {
        KvCacheEventData::Stored {
            parent_hash,
            blocks,
            tier,
        } => {
            assert_eq!(*parent_hash, None);
            assert_eq!(*tier, Tier::Device);
            assert_eq!(
                blocks.iter().map(|b| b.block_hash).collect::<Vec<_>>(),
                hashes(&ids)
            );
        }
        other => panic!("expected Stored, got {other:?}"),
    }
}

#[test]
fn priority_policy_evicts_finished_reasoning_first() {
    let pool = pool(3, EvictionPolicyKind::Priority);
    let answer = BlockIdentity::chain(&[LocalBlockHash::new(1)]);
    let think = BlockIdentity::chain(&[LocalBlockHash::new(2)]);
    let newest = BlockIdentity::chain(&[LocalBlockHash::new(3)]);
    pool.release(register_chain(&pool, &answer));
    let think_blocks = register_chain(&pool, &think);
    assert_eq!(pool.set_phase(&hashes(&think), Phase::ThinkComplete), 1);
    pool.release(think_blocks);
    pool.release(register_chain(&pool, &newest));
    // LRU alone would evict `answer`; the priority policy takes the finished reasoning.
    let _block = pool.allocate_one().unwrap();
    assert!(!pool.contains(think[0].sequence_hash));
    assert!(pool.contains(answer[0].sequence_hash));
    // Re-tagging a cached block moves it between classes.
    assert_eq!(
        pool.set_phase(&[newest[0].sequence_hash], Phase::ThinkComplete),
        1
    );
    let _block2 = pool.allocate_one().unwrap();
    assert!(!pool.contains(newest[0].sequence_hash));
    pool.check_invariants();
}

#[test]
fn cold_release_makes_a_block_the_next_victim() {
    let pool = pool(2, EvictionPolicyKind::Lru);
    let a = BlockIdentity::chain(&[LocalBlockHash::new(1)]);
    let b = BlockIdentity::chain(&[LocalBlockHash::new(2)]);
    pool.release(register_chain(&pool, &a));
    let b_blocks = register_chain(&pool, &b);
    pool.release_cold(b_blocks);
    assert_eq!(
        pool.coldest_cached(2)
            .iter()
            .map(|i| i.sequence_hash)
            .collect::<Vec<_>>(),
        vec![b[0].sequence_hash, a[0].sequence_hash]
    );
}

#[test]
fn reset_cache_refuses_while_blocks_are_referenced_then_forgets_everything() {
    let pool = pool(3, EvictionPolicyKind::Lru);
    let ids = chain(2);
    let held = register_chain(&pool, &ids);
    assert_eq!(pool.reset_cache(), Err(ResetError::InUse { referenced: 2 }));
    pool.release(held);
    let _ = pool.take_events();
    assert_eq!(pool.reset_cache(), Ok(2));
    assert!(!pool.contains(ids[0].sequence_hash));
    assert_eq!(pool.take_events().len(), 1);
    assert_eq!(pool.check_invariants().free, 3);
}

#[test]
fn clones_share_a_reference_count() {
    let pool = pool(2, EvictionPolicyKind::Lru);
    let ids = chain(1);
    let block = register_chain(&pool, &ids).into_vec().pop().unwrap();
    let clone = block.clone();
    drop(block);
    assert_eq!(pool.counts().active, 1);
    drop(clone);
    assert_eq!(pool.counts().cached, 1);
    pool.check_invariants();
}

#[test]
fn handles_dropped_on_other_threads_return_their_blocks() {
    let pool = pool(8, EvictionPolicyKind::Lru);
    let ids = chain(4);
    let registered = register_chain(&pool, &ids);
    let mutable = pool.allocate(4).unwrap();
    let worker = std::thread::spawn(move || {
        drop(registered);
        drop(mutable);
    });
    worker.join().unwrap();
    assert_eq!(
        pool.check_invariants(),
        PoolCounts {
            capacity: 8,
            free: 4,
            cached: 4,
            active: 0
        }
    );
}

#[test]
fn dropping_a_chain_releases_its_leaves_first() {
    let pool = pool(4, EvictionPolicyKind::Lru);
    let ids = chain(3);
    drop(register_chain(&pool, &ids));
    let order: Vec<SequenceHash> = pool
        .coldest_cached(4)
        .iter()
        .map(|i| i.sequence_hash)
        .collect();
    assert_eq!(
        order,
        vec![
            ids[2].sequence_hash,
            ids[1].sequence_hash,
            ids[0].sequence_hash
        ]
    );
    // A cold release keeps the leaf coldest too.
    pool.release_cold(pool.match_prefix(&hashes(&ids)));
    let order: Vec<SequenceHash> = pool
        .coldest_cached(4)
        .iter()
        .map(|i| i.sequence_hash)
        .collect();
    assert_eq!(
        order,
        vec![
            ids[2].sequence_hash,
            ids[1].sequence_hash,
            ids[0].sequence_hash
        ]
    );
}

#[test]
fn chains_append_and_convert_without_losing_references() {
    let pool = pool(4, EvictionPolicyKind::Lru);
    let ids = chain(3);
    let mut held = register_chain(&pool, &ids[..1]);
    held.append(register_chain(&pool, &ids[1..]));
    let copy = held.clone();
    assert_eq!(
        pool.snapshot()
            .registered
            .values()
            .copied()
            .collect::<Vec<_>>(),
        vec![2, 2, 2]
    );
    let handles = copy.into_vec();
    assert_eq!(handles.len(), 3);
    let back: BlockChain = handles.into_iter().collect();
    assert_eq!(back.sequence_hashes().collect::<Vec<_>>(), hashes(&ids));
    drop((held, back));
    assert_eq!(pool.check_invariants().cached, 3);
}

#[test]
#[should_panic(expected = "a chain cannot span two pools")]
fn a_chain_refuses_blocks_of_another_pool() {
    let device = pool(2, EvictionPolicyKind::Lru);
    let host = BlockPool::new(PoolConfig {
        tier: Tier::Host,
        ..*device.config()
    })
    .unwrap();
    let ids = chain(2);
    let mut mixed = register_chain(&device, &ids[..1]);
    mixed.append(register_chain(&host, &ids[1..]));
}

#[test]
fn invalidating_some_blocks_forgets_only_those_leaf_first_and_skips_unknown_hashes() {
    let pool = pool(8, EvictionPolicyKind::Lru);
    let ids = chain(4);
    let held = register_chain(&pool, &ids[1..3]);
    drop(register_chain(&pool, &ids[..1]));
    drop(register_chain(&pool, &ids[3..]));
    let _ = pool.take_events();
    let unknown = SequenceHash::new(12345);
    // Given in any order, with a repeat and an unknown hash.
    let asked = [
        ids[1].sequence_hash,
        unknown,
        ids[2].sequence_hash,
        ids[1].sequence_hash,
    ];
    assert_eq!(pool.invalidate(&asked), 2);
    assert_eq!(
        pool.take_events(),
        vec![KvCacheEventData::Removed {
            block_hashes: vec![ids[2].sequence_hash, ids[1].sequence_hash],
            tier: Tier::Device,
        }]
    );
    assert_eq!(
        pool.snapshot()
            .registered
            .into_keys()
            .collect::<Vec<_>>()
            .len(),
        2
    );
    assert!(pool.contains(ids[0].sequence_hash) && pool.contains(ids[3].sequence_hash));
    // The referenced pair stays active until dropped, then is free, not cached.
    assert_eq!(pool.check_invariants().active, 2);
    drop(held);
    let counts = pool.check_invariants();
    assert_eq!((counts.free, counts.cached, counts.active), (6, 2, 0));
}

#[test]
fn invalidating_a_tier_forgets_cached_and_referenced_blocks_and_frees_them_when_dropped() {
    let pool = pool(8, EvictionPolicyKind::Lru);
    let ids = chain(5);
    let held = register_chain(&pool, &ids[..2]);
    let cached = register_chain(&pool, &ids[2..]);
    drop(cached);
    let extra = held.clone();
    let _ = pool.take_events();

    assert_eq!(pool.invalidate_all(), 5);
    // Leaves first, one Removed event for all of them.
    let mut removed = hashes(&ids);
    removed.reverse();
    assert_eq!(
        pool.take_events(),
        vec![KvCacheEventData::Removed {
            block_hashes: removed,
            tier: Tier::Device,
        }]
    );
    assert_eq!(pool.prefix_len(&hashes(&ids)), 0);
    assert!(pool.snapshot().registered.is_empty());
    // The three cached blocks are free; the two held stay active until dropped.
    let counts = pool.check_invariants();
    assert_eq!((counts.free, counts.cached, counts.active), (6, 0, 2));
    drop(held);
    assert_eq!(
        pool.check_invariants().active,
        2,
        "a clone still holds them"
    );
    // The hash can be registered afresh meanwhile, in another block.
    let again = register_chain(&pool, &ids[..1]);
    assert_eq!(pool.prefix_len(&hashes(&ids)), 1);
    drop(extra);
    drop(again);
    let counts = pool.check_invariants();
    assert_eq!((counts.free, counts.cached, counts.active), (7, 1, 0));
    // Nothing more to remove: the invalidated blocks went back without an event.
    assert!(pool
        .take_events()
        .iter()
        .all(|e| !matches!(e, KvCacheEventData::Removed { .. })));
}

fn single_threaded_pool(capacity: usize) -> BlockPool {
    BlockPool::new_single_threaded(PoolConfig {
        tier: Tier::Device,
        capacity_blocks: capacity,
        block_size_tokens: 4,
        eviction: EvictionPolicyKind::Lru,
    })
    .unwrap()
}

#[test]
fn a_single_threaded_pool_does_what_a_shared_one_does_on_its_thread() {
    // Registration, hits, lazy eviction, release order and events, on both kinds of lock.
    let run = |pool: BlockPool| {
        let ids = chain(6);
        drop(register_chain(&pool, &ids[..3]));
        let held = register_chain(&pool, &ids[3..5]);
        let hit = pool.match_prefix(&hashes(&ids[..2]));
        let evicting = register_chain(&pool, &ids[5..]);
        drop(hit);
        let outcome = (pool.snapshot(), pool.stats(), pool.take_events());
        drop((held, evicting));
        (outcome, pool.check_invariants(), pool.snapshot())
    };
    let shared = run(pool(5, EvictionPolicyKind::Lru));
    let single = run(single_threaded_pool(5));
    assert_eq!(single, shared);
    assert!(
        shared.0 .1.evicted_blocks > 0,
        "the run should evict: {shared:?}"
    );
}

#[test]
fn a_single_threaded_pool_refuses_other_threads_and_keeps_its_blocks() {
    let pool = single_threaded_pool(8);
    let ids = chain(4);
    let registered = register_chain(&pool, &ids);
    let elsewhere = pool.clone();
    let hash = ids[0].sequence_hash;
    let refused = std::thread::spawn(move || elsewhere.contains(hash)).join();
    assert!(
        refused.is_err(),
        "another thread read a single-threaded pool"
    );
    assert!(pool.contains(hash));
    drop(registered);
    assert_eq!(
        pool.check_invariants(),
        PoolCounts {
            capacity: 8,
            free: 4,
            cached: 4,
            active: 0
        }
    );
}
