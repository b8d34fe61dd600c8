//! Pool benchmarks: block lifecycle throughput and prefix lookups.
//!
//! - `cycle`: allocate → fill 16 tokens → commit (hash) → register → drop → drain the
//!   event outbox, in a pool kept full so that every allocation also evicts a cached block
//!   (the steady state);
//! - `lookup/{referenced,cached}/N`: `match_prefix` of N blocks that are still referenced
//!   elsewhere, or only cached (refcount 0, in the LRU list). Only the lookup is timed;
//!   the release that makes the next iteration find them cached again is not;
//! - `lookup_release/{referenced,cached}/N`: lookup plus dropping the returned chain (one
//!   lock, leaf first): the shape of kvbm-logical's `match_blocks_*_hit` benchmarks;
//! - `lookup_drop_each/{referenced,cached}/N`: lookup plus dropping handle by handle.
//!
//! Inputs are fixed; run with `cargo bench --bench pool`.

// criterion's group macros generate undocumented public functions.
#![allow(missing_docs)]

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kvtwin::block::BlockIdentity;
use kvtwin::ids::{LocalBlockHash, SequenceHash};
use kvtwin::pool::{BlockChain, BlockPool, EvictionPolicyKind, PoolConfig};
use kvtwin::tier::Tier;
use kvtwin::tokens::HashSeed;
use std::time::{Duration, Instant};

const BLOCK_TOKENS: usize = 16;

fn pool(capacity: usize) -> BlockPool {
    BlockPool::new(PoolConfig {
        tier: Tier::Device,
        capacity_blocks: capacity,
        block_size_tokens: BLOCK_TOKENS,
        eviction: EvictionPolicyKind::Lru,
    })
    .expect("valid pool")
}

/// Registers a chain of `len` blocks whose local hashes start at `base`, and lets go of
/// it so that it sits in the pool cached.
fn cached_chain(pool: &BlockPool, len: usize, base: u64) -> Vec<SequenceHash> {
    let locals: Vec<LocalBlockHash> = (0..len as u64)
        .map(|i| LocalBlockHash::new(base + i))
        .collect();
    let identities = BlockIdentity::chain(&locals);
    let blocks = pool.allocate(len).expect("room for the chain");
    let complete = blocks
        .into_iter()
        .zip(&identities)
        .map(|(b, id)| b.apply_identity(*id))
        .collect();
    pool.release(pool.register_chain(complete));
    identities.iter().map(|id| id.sequence_hash).collect()
}

fn bench_cycle(c: &mut Criterion) {
    let mut group = c.benchmark_group("cycle");
    group.throughput(Throughput::Elements(1));
    let pool = pool(1024);
    let mut tokens = [0u32; BLOCK_TOKENS];
    let mut next = 0u32;
    group.bench_function("allocate_fill_register_drop", |b| {
        b.iter(|| {
            for t in tokens.iter_mut() {
                *t = next;
                next = next.wrapping_add(1);
            }
            let mut block = pool
                .allocate_one()
                .expect("cached blocks are evictable")
                .init_sequence(None, HashSeed::default());
            block.add_tokens(&tokens);
            let complete = block.commit().expect("full block");
            black_box(pool.register(complete));
            // A driver drains the outbox every step; so does the bench, so the outbox
            // stays small as it would in a real run.
            black_box(pool.take_events());
        })
    });
    group.finish();
}

fn timed_lookups(pool: &BlockPool, hashes: &[SequenceHash], iters: u64) -> Duration {
    let mut out = BlockChain::new();
    out.reserve(hashes.len());
    let mut total = Duration::ZERO;
    for _ in 0..iters {
        let start = Instant::now();
        let found = pool.match_prefix_into(black_box(hashes), &mut out);
        total += start.elapsed();
        assert_eq!(found, hashes.len());
        // Untimed: let go, so cached blocks are cached again for the next iteration.
        drop(std::mem::take(&mut out));
        out.reserve(hashes.len());
    }
    total
}

fn bench_lookup(c: &mut Criterion) {
    let mut group = c.benchmark_group("lookup");
    for len in [8usize, 32, 128] {
        group.throughput(Throughput::Elements(len as u64));
        let referenced_pool = pool(4096);
        let hashes = cached_chain(&referenced_pool, len, 0x5eed);
        let holders = referenced_pool.match_prefix(&hashes);
        group.bench_with_input(BenchmarkId::new("referenced", len), &hashes, |b, hashes| {
            b.iter_custom(|iters| timed_lookups(&referenced_pool, hashes, iters))
        });
        drop(holders);
        let cached_pool = pool(4096);
        let hashes = cached_chain(&cached_pool, len, 0x5eed);
        // Other cached blocks around them, so the LRU list is not trivially short.
        let _ = cached_chain(&cached_pool, 2048, 0xbeef_0000);
        group.bench_with_input(BenchmarkId::new("cached", len), &hashes, |b, hashes| {
            b.iter_custom(|iters| timed_lookups(&cached_pool, hashes, iters))
        });
    }
    group.finish();

    // Lookup plus letting go, both timed: dropping the returned `BlockChain` (one lock,
    // leaf first), which is how kvbm-logical's `match_blocks` benchmarks measure theirs;
    // and dropping each handle on its own (one lock per handle) for comparison.
    for (name, batch) in [("lookup_release", true), ("lookup_drop_each", false)] {
        let mut group = c.benchmark_group(name);
        for len in [8usize, 32, 128] {
            group.throughput(Throughput::Elements(len as u64));
            for referenced in [true, false] {
                let pool = pool(4096);
                let hashes = cached_chain(&pool, len, 0x5eed);
                let holders = if referenced {
                    pool.match_prefix(&hashes)
                } else {
                    BlockChain::new()
                };
                let id = BenchmarkId::new(if referenced { "referenced" } else { "cached" }, len);
                group.bench_with_input(id, &hashes, |b, hashes| {
                    b.iter(|| {
                        let found = pool.match_prefix(black_box(hashes));
                        if batch {
                            drop(found);
                        } else {
                            found.into_iter().for_each(drop);
                        }
                    })
                });
                drop(holders);
            }
        }
        group.finish();
    }
}

criterion_group!(benches, bench_cycle, bench_lookup);
criterion_main!(benches);
