//! loom models of the pool's shared state: handles dropped, blocks allocated and blocks
//! registered on different threads. Run with
//! `RUSTFLAGS="--cfg loom" cargo test --release --test loom_pool`.
//! Models stay at two or three threads and a few operations each, so loom can explore
//! every interleaving.
#![cfg(loom)]

use kvtwin::block::BlockIdentity;
use kvtwin::events::KvCacheEventData;
use kvtwin::ids::LocalBlockHash;
use kvtwin::pool::{BlockPool, EvictionPolicyKind, ImmutableBlock, PoolConfig, PoolCounts};
use kvtwin::tier::Tier;
use loom::thread;

fn pool(capacity: usize) -> BlockPool {
    BlockPool::new(PoolConfig {
        tier: Tier::Device,
        capacity_blocks: capacity,
        block_size_tokens: 4,
        eviction: EvictionPolicyKind::Lru,
    })
    .unwrap()
}

fn identity(local: u64) -> BlockIdentity {
    BlockIdentity::chained(None, LocalBlockHash::new(local))
}

fn register(pool: &BlockPool, id: BlockIdentity) -> ImmutableBlock {
    pool.register(pool.allocate_one().unwrap().apply_identity(id))
}

#[test]
fn concurrent_handle_drops_lose_no_block() {
    loom::model(|| {
        let pool = pool(3);
        let a = register(&pool, identity(1));
        let a2 = a.clone();
        let b = pool.allocate_one().unwrap();
        let t1 = thread::spawn(move || drop(a));
        let t2 = thread::spawn(move || {
            drop(a2);
            drop(b);
        });
        t1.join().unwrap();
        t2.join().unwrap();
        assert_eq!(
            pool.check_invariants(),
            PoolCounts {
                capacity: 3,
                free: 2,
                cached: 1,
                active: 0
            }
        );
        assert_eq!(
            pool.snapshot()
                .registered
                .values()
                .copied()
                .collect::<Vec<_>>(),
            vec![0]
        );
    });
}

#[test]
fn allocation_racing_a_drop_never_hands_out_a_block_twice() {
    loom::model(|| {
        let pool = pool(2);
        let held = register(&pool, identity(1));
        let other = pool.allocate_one().unwrap();
        let allocator = pool.clone();
        let t1 = thread::spawn(move || drop(held));
        // Either the drop came first (the cached block is evicted and reused) or not
        // (the pool is exhausted): never a block in two places.
        let t2 = thread::spawn(move || allocator.allocate_one().ok().map(|b| b.block_id()));
        t1.join().unwrap();
        let got = t2.join().unwrap();
        if let Some(id) = got {
            assert_ne!(id, other.block_id());
        }
        drop(other);
        let counts = pool.check_invariants();
        assert_eq!(counts.active, 0);
        assert_eq!(counts.free + counts.cached, 2);
    });
}

#[test]
fn concurrent_registration_of_one_hash_registers_it_once() {
    loom::model(|| {
        let pool = pool(3);
        let p1 = pool.clone();
        let p2 = pool.clone();
        let t1 = thread::spawn(move || register(&p1, identity(9)).block_id());
        let t2 = thread::spawn(move || register(&p2, identity(9)).block_id());
        let a = t1.join().unwrap();
        let b = t2.join().unwrap();
        assert_eq!(a, b, "both registrations must resolve to the same block");
        let counts = pool.check_invariants();
        assert_eq!(
            counts,
            PoolCounts {
                capacity: 3,
                free: 2,
                cached: 1,
                active: 0
            }
        );
        let stored: usize = pool
            .take_events()
            .iter()
            .map(|e| match e {
                KvCacheEventData::Stored { blocks, .. } => blocks.len(),
                _ => 0,
            })
            .sum();
        assert_eq!(stored, 1, "one Stored for one registration");
    });
}

#[test]
fn events_from_two_threads_are_all_kept() {
    loom::model(|| {
        let pool = pool(2);
        let p1 = pool.clone();
        let p2 = pool.clone();
        let t1 = thread::spawn(move || drop(register(&p1, identity(1))));
        let t2 = thread::spawn(move || drop(register(&p2, identity(2))));
        t1.join().unwrap();
        t2.join().unwrap();
        let events = pool.take_events();
        assert_eq!(events.len(), 2, "{events:?}");
        assert_eq!(pool.check_invariants().cached, 2);
    });
}

#[test]
fn a_chain_dropped_on_another_thread_races_allocation_safely() {
    loom::model(|| {
        let pool = pool(3);
        let ids = [
            identity(1),
            BlockIdentity::chained(Some(&identity(1)), LocalBlockHash::new(2)),
        ];
        let blocks = pool.allocate(2).unwrap();
        let chain = pool.register_chain(
            blocks
                .into_iter()
                .zip(ids)
                .map(|(b, id)| b.apply_identity(id))
                .collect(),
        );
        let allocator = pool.clone();
        let t1 = thread::spawn(move || drop(chain));
        // One block is free; the other two become evictable only once the chain is gone.
        let t2 = thread::spawn(move || allocator.allocate(2).map(|b| b.len()).unwrap_or(0));
        t1.join().unwrap();
        let got = t2.join().unwrap();
        assert!(got == 0 || got == 2);
        let counts = pool.check_invariants();
        assert_eq!(counts.active, 0);
        assert_eq!(counts.free + counts.cached, 3);
    });
}
