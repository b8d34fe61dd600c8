//! The twin of the store (`kvtwin_sim::vllm::connector::TwinStore`) against the store
//! itself: the same saves and loads, in the same order, on host memory and a disk tier
//! small enough that both evict; after every call both must hold the same blocks in
//! each tier and every load must find the same blocks in each.
//!
//! It found a bug in the store: a block its own save evicted from every tier and then
//! saved again came out held by the manager but forgotten by the store (the eviction's
//! Removed was filed after the save had kept the block's new digest, and dropped it),
//! so its loads failed and the engine's scheduler side never offered it. The store now
//! files what an allocation evicted before it keeps the run's digests.

use kvtwin::block::BlockIdentity;
use kvtwin::ids::{LocalBlockHash, SequenceHash};
use kvtwin_connector::{StoreConfig, TierStore};
use kvtwin_sim::vllm::{ConnectorTiers, TwinStore};

const BYTES: usize = 1024;
const BLOCK_TOKENS: usize = 32;

/// Prompt `family`'s first `len` blocks (equal families share prefixes).
fn chain(family: u64, len: u64) -> Vec<BlockIdentity> {
    let locals: Vec<LocalBlockHash> = (0..len)
        .map(|i| LocalBlockHash::new(family * 1000 + i))
        .collect();
    BlockIdentity::chain(&locals)
}

fn hashes(chain: &[BlockIdentity]) -> Vec<SequenceHash> {
    chain.iter().map(|id| id.sequence_hash).collect()
}

/// A seeded stream of numbers below `n` (xorshift).
struct Draws(u64);

impl Draws {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn run(memory_blocks: usize, disk_blocks: usize, longest: u64, seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let mut real = TierStore::new(StoreConfig {
        block_bytes: BYTES,
        block_size_tokens: BLOCK_TOKENS,
        memory_blocks,
        disk_blocks,
        disk_dir: Some(dir.path().to_path_buf()),
        persistent: false,
    })
    .unwrap();
    let mut twin = TwinStore::new(
        ConnectorTiers {
            memory_blocks,
            disk_blocks,
        },
        BLOCK_TOKENS,
    )
    .unwrap();
    let mut draws = Draws(seed);
    let (mut from_memory, mut from_disk) = (0u64, 0u64);
    for call in 0..600 {
        let family = draws.below(14);
        // Families are 1,000 apart in local hashes.
        debug_assert!(longest < 1000);
        let len = 1 + draws.below(longest);
        let prompt = chain(family, len);
        if draws.below(3) == 0 {
            // A load of the prompt's blocks past a hit of its own (as after the engine's
            // own prefix hit).
            let skip = draws.below(len) as usize;
            let stats = real.stats();
            real.load(&hashes(&prompt[skip..]), |_, _| {})
                .unwrap_or_else(|(n, e)| panic!("call {call}: load failed at {n}: {e}"));
            let after = real.stats();
            let loaded = twin.load(&hashes(&prompt[skip..]));
            let real_loaded = (
                after.loaded_memory_blocks - stats.loaded_memory_blocks,
                after.loaded_disk_blocks - stats.loaded_disk_blocks,
            );
            assert_eq!(
                (loaded.memory, loaded.disk),
                real_loaded,
                "call {call}: load of family {family}, blocks {skip}..{len}"
            );
            from_memory += loaded.memory;
            from_disk += loaded.disk;
        } else {
            let start = draws.below(len) as usize;
            let chain = &prompt[start..];
            let saved = real.save(chain, |_, out: &mut [u8]| {
                out.fill(family as u8);
                Ok::<(), String>(())
            });
            assert_eq!(
                twin.save(chain),
                saved.unwrap(),
                "call {call}: save of family {family}, blocks {start}..{len}"
            );
        }
        assert!(real.flush(std::time::Duration::from_secs(10)));
        assert_eq!(
            twin.blocks_by_tier(),
            real.blocks_by_tier(),
            "call {call}: blocks held (memory, disk)"
        );
    }
    // Both tiers were reached and both evicted: the check above saw the orders matter.
    assert!(from_memory > 0, "no load from memory");
    assert!(disk_blocks == 0 || from_disk > 0, "no load from disk");
    let saved = real.stats().saved_blocks;
    assert!(
        saved > 3 * (memory_blocks + disk_blocks) as u64,
        "{saved} blocks saved: too few to evict"
    );
}

#[test]
fn the_twin_holds_and_finds_what_the_store_does_call_for_call() {
    run(48, 120, 24, 0x9e37_79b9_7f4a_7c15);
    run(64, 0, 24, 0x2545_f491_4f6c_dd1d);
    // Saves longer than the 64 copies the manager lets fly, and than host memory.
    run(96, 400, 160, 0x5851_f42d_4c95_7f2d);
}
