//! The replay against `kvtwin cache --curve` (LRU, one tier) and the policies' bounds.

use super::*;
use crate::cache::curve::HitCurve;
use crate::workload::ConversationSpec;
use proptest::prelude::*;

fn requests() -> Vec<crate::workload::Request> {
    ConversationSpec {
        conversations: 60,
        system_prompts: 4,
        system_prompt_blocks: 6,
        turns: (1, 5),
        blocks_per_turn: (1, 4),
        output_tokens: (16, 64),
        mean_interarrival_ms: 100,
        mean_think_time_ms: 1000,
    }
    .generate(7, 16)
}

fn accesses_of(requests: &[crate::workload::Request]) -> Vec<Access> {
    requests
        .iter()
        .map(|r| Access {
            worker: WorkerId::new(r.id.get() % 4),
            blocks: r.blocks.iter().map(|b| b.sequence_hash).collect(),
        })
        .collect()
}

#[test]
fn lru_replay_of_whole_requests_is_the_cache_curve_at_every_size() {
    let requests = requests();
    let curve = HitCurve::lru(&requests, 16);
    let accesses = accesses_of(&requests);
    for capacity in [1, 2, 5, 16, 64, 200, 1000, 5000] {
        let row = replay(&accesses, Policy::Lru, capacity, 1);
        // The same counts over the same total: the same ratio, to the last bit.
        assert_eq!(
            row.hit_ratio,
            curve.row(capacity).hit_blocks,
            "at {capacity} blocks"
        );
    }
}

#[test]
fn a_tier_of_no_blocks_serves_nothing_and_a_larger_one_serves_more_across_workers() {
    let accesses = accesses_of(&requests());
    for policy in Policy::ALL {
        let none = replay(&accesses, policy, 0, 64);
        assert_eq!(
            (none.hit_blocks, none.inserted_blocks),
            (0, 0),
            "{policy:?}"
        );
        let big = replay(&accesses, policy, 1 << 20, 64);
        assert!(
            big.hit_blocks > 0 && big.cross_worker_hit_blocks > 0,
            "{policy:?}"
        );
        assert_eq!(big.evicted_blocks, 0, "{policy:?}: nothing to evict");
        assert_eq!(big.read_bytes, big.hit_blocks * 64);
        // The same stream, the same answer.
        assert_eq!(
            replay(&accesses, policy, 300, 64),
            replay(&accesses, policy, 300, 64)
        );
    }
}

proptest! {
    /// Whatever the stream and size: no policy holds more than its size, every block
    /// written is either still held or was evicted, and hits never exceed lookups.
    #[test]
    fn every_policy_keeps_its_bound(
        capacity in 0usize..40,
        stream in proptest::collection::vec(proptest::collection::vec(0u64..60, 1..6), 1..150),
    ) {
        for policy in Policy::ALL {
            let mut tier = policy.cache(capacity);
            let (mut inserted, mut evicted) = (0usize, 0usize);
            for access in &stream {
                for &b in access.iter().rev() {
                    let block = SequenceHash::new(b);
                    if tier.contains(block) {
                        tier.hit(block);
                    } else {
                        evicted += tier.insert(block).len();
                        inserted += usize::from(tier.contains(block));
                    }
                    prop_assert!(tier.len() <= capacity, "{:?} holds {} of {}", policy, tier.len(), capacity);
                }
            }
            prop_assert!(inserted >= evicted);
            prop_assert_eq!(inserted - evicted, tier.len(), "{:?}", policy);
            let accesses: Vec<Access> = stream.iter().map(|a| Access { worker: WorkerId::new(0), blocks: a.iter().map(|&b| SequenceHash::new(b)).collect() }).collect();
            let row = replay(&accesses, policy, capacity, 1);
            prop_assert!(row.hit_blocks <= row.lookup_blocks);
        }
    }
}
