//! kvtwin's indexer against a deliberately naive reference on workloads from kvtwin's own
//! generator, compared through the peer-bench checksum: the same definition of a match
//! result, folded the same way.

use kvtwin::events::KvCacheEventData;
use kvtwin::router::indexer::KvIndexer;
use kvtwin::router::workload::{
    generate_synthetic, replay, Checksum, SyntheticOptions, WorkloadOp,
};
use kvtwin::tokens::chain_sequence_hash;
use std::collections::{BTreeMap, HashMap};

/// Per worker: `block_hash → (parent, tokens_hash)`; a query walks `(parent, tokens_hash)`
/// links from the root, one worker at a time.
fn reference_checksum(ops: &[WorkloadOp]) -> Checksum {
    let mut workers: BTreeMap<u64, HashMap<u64, (Option<u64>, u64)>> = BTreeMap::new();
    let mut checksum = Checksum::default();
    for op in ops {
        match op {
            WorkloadOp::Event { worker, event } => {
                let blocks = workers.entry(worker.get()).or_default();
                match &event.data {
                    KvCacheEventData::Stored {
                        parent_hash,
                        blocks: chain,
                        ..
                    } => {
                        if parent_hash.is_some_and(|p| !blocks.contains_key(&p.get())) {
                            continue;
                        }
                        let mut parent = parent_hash.map(|p| p.get());
                        for block in chain {
                            blocks
                                .insert(block.block_hash.get(), (parent, block.tokens_hash.get()));
                            parent = Some(block.block_hash.get());
                        }
                    }
                    KvCacheEventData::Removed { block_hashes, .. } => {
                        for hash in block_hashes {
                            blocks.remove(&hash.get());
                        }
                    }
                    KvCacheEventData::Cleared => blocks.clear(),
                }
            }
            WorkloadOp::Match(query) => {
                let mut pairs = Vec::new();
                for (worker, blocks) in &workers {
                    let mut parent = None;
                    let mut score = 0;
                    for tokens in query {
                        let found = blocks
                            .iter()
                            .find(|(_, (p, t))| *p == parent && *t == tokens.get());
                        match found {
                            Some((hash, _)) => {
                                parent = Some(*hash);
                                score += 1;
                            }
                            None => break,
                        }
                    }
                    pairs.push((*worker, score));
                }
                checksum.add(&mut pairs);
            }
        }
    }
    checksum
}

#[test]
fn generated_workloads_follow_the_chain_rule() {
    let ops = generate_synthetic(&SyntheticOptions {
        seed: 1,
        workers: 3,
        stores: 200,
        queries: 50,
        capacity_blocks: 16,
        families: 3,
        interleaved: true,
        clear_every: 40,
    });
    for op in &ops {
        if let WorkloadOp::Event { event, .. } = op {
            if let KvCacheEventData::Stored {
                parent_hash,
                blocks,
                ..
            } = &event.data
            {
                let mut previous = *parent_hash;
                for block in blocks {
                    assert_eq!(
                        chain_sequence_hash(previous, block.tokens_hash),
                        block.block_hash
                    );
                    previous = Some(block.block_hash);
                }
            }
        }
    }
}

#[test]
fn indexer_checksum_equals_the_naive_reference_on_generated_workloads() {
    for seed in 0..12u64 {
        let options = SyntheticOptions {
            seed,
            workers: [1, 2, 5, 16][seed as usize % 4],
            stores: 400,
            queries: 300,
            capacity_blocks: [8, 32, 64][seed as usize % 3],
            families: 1 + seed as usize % 4,
            interleaved: seed % 2 == 0,
            clear_every: [0, 25, 100][seed as usize % 3],
        };
        let ops = generate_synthetic(&options);
        let mut index = KvIndexer::new();
        let got = replay(&ops, &mut index);
        let expected = reference_checksum(&ops);
        assert_eq!(got, expected, "seed {seed}: {options:?}");
        assert!(
            expected.hits > 0,
            "seed {seed}: the workload exercises matches"
        );
        let stats = index.stats();
        assert_eq!(stats.rejections(), 0, "seed {seed}: {stats:?}");
    }
}
