//! Indexer tests: examples, and a proptest against a deliberately naive reference.

use super::*;
use crate::block::BlockIdentity;
use crate::router::test_support::{key, query};
use proptest::prelude::*;
use std::collections::{BTreeMap, HashMap};

pub(super) fn chain_of(locals: &[u64]) -> Vec<BlockIdentity> {
    BlockIdentity::chain(
        &locals
            .iter()
            .map(|l| LocalBlockHash::new(*l))
            .collect::<Vec<_>>(),
    )
}

pub(super) fn stored(
    id: u64,
    parent: Option<SequenceHash>,
    blocks: &[BlockIdentity],
    tier: Tier,
) -> KvCacheEvent {
    let blocks = blocks
        .iter()
        .map(|b| StoredBlock {
            block_hash: b.sequence_hash,
            tokens_hash: b.local_hash,
        })
        .collect();
    KvCacheEvent {
        event_id: id,
        dp_rank: 0,
        data: KvCacheEventData::Stored {
            parent_hash: parent,
            blocks,
            tier,
        },
    }
}

pub(super) fn removed(id: u64, hashes: &[SequenceHash], tier: Tier) -> KvCacheEvent {
    KvCacheEvent {
        event_id: id,
        dp_rank: 0,
        data: KvCacheEventData::Removed {
            block_hashes: hashes.to_vec(),
            tier,
        },
    }
}

#[test]
fn scores_count_leading_blocks_per_worker_and_tier() {
    let mut index = KvIndexer::new();
    let chain = chain_of(&[1, 2, 3, 4]);
    index
        .apply(
            WorkerId::new(7),
            &stored(1, None, &chain[..3], Tier::Device),
        )
        .unwrap();
    index
        .apply(
            WorkerId::new(9),
            &stored(1, None, &chain[..2], Tier::Device),
        )
        .unwrap();
    index
        .apply(
            WorkerId::new(9),
            &stored(2, Some(chain[1].sequence_hash), &chain[2..4], Tier::Host),
        )
        .unwrap();
    let scores = index.find_matches(&query(&[1, 2, 3, 4, 5]), false);
    assert_eq!(scores.score(key(7)), 3);
    assert_eq!(scores.score(key(9)), 4);
    assert_eq!(scores.workers[1].by_tier, [2, 2, 0, 0]);
    assert_eq!(
        index.find_matches(&query(&[2, 3]), false),
        OverlapScores::default()
    );
    assert_eq!(index.pairs(), 7);
}

#[test]
fn bad_events_are_counted_and_leave_other_workers_alone() {
    let mut index = KvIndexer::new();
    let chain = chain_of(&[1, 2, 3]);
    index
        .apply(WorkerId::new(1), &stored(1, None, &chain, Tier::Device))
        .unwrap();
    let orphan = stored(1, Some(chain[1].sequence_hash), &chain[2..], Tier::Device);
    assert!(matches!(
        index.apply(WorkerId::new(2), &orphan),
        Err(ApplyEventError::ParentBlockNotFound { .. })
    ));
    let mut forged = chain_of(&[1, 2]);
    forged[1].sequence_hash = SequenceHash::new(42);
    assert!(matches!(
        index.apply(WorkerId::new(2), &stored(2, None, &forged, Tier::Device)),
        Err(ApplyEventError::ChainMismatch { .. })
    ));
    assert_eq!(
        index.apply(
            WorkerId::new(2),
            &removed(9, &[SequenceHash::new(5)], Tier::Device)
        ),
        Err(ApplyEventError::BlockNotFound { count: 1 })
    );
    let stats = index.stats();
    assert_eq!(
        (
            stats.parent_not_found,
            stats.chain_mismatches,
            stats.unknown_removals,
            stats.event_id_gaps
        ),
        (1, 1, 1, 1)
    );
    assert_eq!(stats.rejections(), 3);
    // Worker 2 kept the block before the forged one; worker 1 is untouched.
    let scores = index.find_matches(&query(&[1, 2, 3]), false);
    assert_eq!((scores.score(key(1)), scores.score(key(2))), (3, 1));
}

#[test]
fn clearing_and_removing_a_worker_forget_only_its_blocks() {
    let mut index = KvIndexer::new();
    let chain = chain_of(&[1, 2]);
    for worker in [1, 2] {
        index
            .apply(
                WorkerId::new(worker),
                &stored(1, None, &chain, Tier::Device),
            )
            .unwrap();
    }
    let cleared = KvCacheEvent {
        event_id: 2,
        dp_rank: 0,
        data: KvCacheEventData::Cleared,
    };
    index.apply(WorkerId::new(1), &cleared).unwrap();
    assert_eq!(index.find_matches(&query(&[1, 2]), false).workers.len(), 1);
    index.remove_worker(WorkerId::new(2));
    assert_eq!(
        index.find_matches(&query(&[1, 2]), false),
        OverlapScores::default()
    );
    assert_eq!((index.pairs(), index.distinct_blocks()), (0, 0));
}

/// Overlaps come out sorted by worker whether the index ranks its slots (at most
/// `RANKED_SLOTS`) or sorts at the end (more), with workers joining in scrambled order,
/// dp ranks, and a worker leaving and coming back (its slot reused, the ranks redone).
#[test]
fn overlaps_are_sorted_by_worker_with_few_slots_and_with_many() {
    let chain = chain_of(&[1, 2, 3, 4, 5, 6, 7]);
    for workers in [5u64, RANKED_SLOTS as u64 + 6] {
        let mut index = KvIndexer::new();
        let mut expected = BTreeMap::new();
        for i in 0..workers {
            // Ids not in the order the slots are taken; two dp ranks for some.
            let worker = (i * 37) % 101;
            let ranks: &[u32] = if i % 3 == 0 { &[1, 0] } else { &[0] };
            for &dp_rank in ranks {
                let held = 1 + ((i + u64::from(dp_rank)) % 7) as usize;
                let mut event = stored(1, None, &chain[..held], Tier::Device);
                event.dp_rank = dp_rank;
                index.apply(WorkerId::new(worker), &event).unwrap();
                expected.insert((worker, dp_rank), held as u32);
            }
        }
        let gone = (3 * 37) % 101;
        index.remove_worker(WorkerId::new(gone));
        expected.retain(|(worker, _), _| *worker != gone);
        index
            .apply(
                WorkerId::new(1000),
                &stored(1, None, &chain[..2], Tier::Host),
            )
            .unwrap();
        expected.insert((1000, 0), 2);
        let got: Vec<((u64, u32), u32)> = index
            .find_matches(&query(&[1, 2, 3, 4, 5, 6, 7]), false)
            .workers
            .iter()
            .map(|w| ((w.worker.worker.get(), w.worker.dp_rank), w.blocks))
            .collect();
        let want: Vec<((u64, u32), u32)> = expected.into_iter().collect();
        assert_eq!(got, want, "{workers} workers");
    }
}

/// One `MatchScratch` kept across queries, as the router and the bench keep it: answers
/// that grow, shrink and vanish, on an index of a few slots (answers written over the last
/// one's) and one of more than `RANKED_SLOTS` (sorted), in turns, each equal to a fresh
/// scratch's answer.
#[test]
fn a_reused_scratch_answers_as_a_fresh_one() {
    let chain = chain_of(&[1, 2, 3, 4, 5, 6, 7, 8]);
    let other = chain_of(&[50, 51]);
    let indexes: Vec<KvIndexer> = [6u64, RANKED_SLOTS as u64 + 3]
        .into_iter()
        .map(|workers| {
            let mut index = KvIndexer::new();
            for worker in 0..workers {
                let held = 1 + (worker % 8) as usize;
                let event = stored(1, None, &chain[..held], Tier::Device);
                index.apply(WorkerId::new(worker), &event).unwrap();
            }
            index
                .apply(WorkerId::new(workers), &stored(1, None, &other, Tier::Host))
                .unwrap();
            index
        })
        .collect();
    // Every worker (whoever holds the first block answers) at three depths, then none
    // (no such prompt), then one (another prompt), then every worker again.
    let queries = [
        query(&[1, 2, 3, 4, 5, 6, 7, 8]),
        query(&[1, 2, 3, 4, 5, 6, 7, 8, 9]),
        query(&[1, 2, 3, 9]),
        query(&[99, 1]),
        query(&[50, 51, 52]),
        query(&[1]),
    ];
    let mut scratch = MatchScratch::default();
    let mut answers = 0;
    for round in 0..2 {
        for q in &queries {
            for (i, index) in indexes.iter().enumerate() {
                let fresh = index.find_matches(q, false).workers;
                let reused = index.find_matches_with(q, false, &mut scratch).to_vec();
                assert_eq!(reused, fresh, "round {round}, index {i}, query {q:?}");
                answers += fresh.len();
            }
        }
    }
    // Per round: 4 queries answered by every worker of both indexes, one by one worker.
    assert_eq!(answers, 2 * (4 * (6 + RANKED_SLOTS + 3) + 2), "{answers}");
}

/// The naive reference: per worker, `block_hash → (parent, tokens_hash, tiers)` and a
/// walk from the root by `(parent, tokens_hash)`, like peer-bench's `check`.
#[derive(Default)]
struct Reference {
    workers: BTreeMap<u64, WorkerBlocks>,
}

/// `block_hash → (parent, tokens_hash, tier bits)` of one worker.
type WorkerBlocks = HashMap<u64, (Option<u64>, u64, u8)>;

impl Reference {
    fn apply(&mut self, worker: u64, event: &KvCacheEvent) {
        let blocks = self.workers.entry(worker).or_default();
        match &event.data {
            KvCacheEventData::Stored {
                parent_hash,
                blocks: chain,
                tier,
            } => {
                if parent_hash.is_some_and(|p| !blocks.contains_key(&p.get())) {
                    return;
                }
                let mut parent = parent_hash.map(|p| p.get());
                for block in chain {
                    let expected =
                        chain_sequence_hash(parent.map(SequenceHash::new), block.tokens_hash);
                    if expected != block.block_hash {
                        return;
                    }
                    let entry = blocks.entry(block.block_hash.get()).or_insert((
                        parent,
                        block.tokens_hash.get(),
                        0,
                    ));
                    entry.2 |= tier_bit(*tier);
                    parent = Some(block.block_hash.get());
                }
            }
            KvCacheEventData::Removed { block_hashes, tier } => {
                for hash in block_hashes {
                    if let Some(entry) = blocks.get_mut(&hash.get()) {
                        entry.2 &= !tier_bit(*tier);
                        if entry.2 == 0 {
                            blocks.remove(&hash.get());
                        }
                    }
                }
            }
            KvCacheEventData::Cleared => blocks.clear(),
        }
    }

    /// (block, worker) pairs held, in any tier.
    fn pairs(&self) -> usize {
        self.workers.values().map(HashMap::len).sum()
    }

    /// Per worker holding the first block: (worker, leading blocks held, of those how many
    /// are held best in each tier).
    fn scores(&self, query: &[LocalBlockHash]) -> Vec<(u64, u32, [u32; 4])> {
        let mut out = Vec::new();
        for (worker, blocks) in &self.workers {
            let mut parent: Option<u64> = None;
            let mut score = 0;
            let mut by_tier = [0; 4];
            for tokens in query {
                let child = blocks
                    .iter()
                    .find(|(_, (p, t, _))| *p == parent && *t == tokens.get());
                match child {
                    Some((hash, (_, _, tiers))) => {
                        score += 1;
                        by_tier[tiers.trailing_zeros() as usize] += 1;
                        parent = Some(*hash);
                    }
                    None => break,
                }
            }
            if score > 0 {
                out.push((*worker, score, by_tier));
            }
        }
        out
    }
}

#[derive(Clone, Debug)]
pub(super) enum Op {
    Store {
        worker: u64,
        chain: usize,
        from: usize,
        to: usize,
        tier: Tier,
        skip_parent: bool,
    },
    Forge {
        worker: u64,
    },
    Remove {
        worker: u64,
        chain: usize,
        from: usize,
        to: usize,
        leaf_first: bool,
        tier: Tier,
    },
    RemoveWorker {
        worker: u64,
    },
    Clear {
        worker: u64,
    },
    Match {
        chain: usize,
        len: usize,
    },
}

pub(super) const CHAIN_LEN: usize = 7;
pub(super) const CHAINS: [[u64; CHAIN_LEN]; 4] = [
    [1, 2, 3, 4, 5, 6, 7],
    [1, 2, 3, 4, 8, 9, 10],
    [1, 2, 11, 12, 13, 14, 15],
    [16, 2, 3, 4, 5, 6, 7],
];

pub(super) fn op() -> impl Strategy<Value = Op> {
    let tier = prop::sample::select(vec![Tier::Device, Tier::Host, Tier::Disk]);
    prop_oneof![
        4 => (0u64..3, 0usize..CHAINS.len(), 0usize..CHAIN_LEN, 1usize..=CHAIN_LEN, tier.clone(), any::<bool>()).prop_map(
            |(worker, chain, from, to, tier, skip_parent)| Op::Store { worker, chain, from, to, tier, skip_parent }
        ),
        1 => (0u64..3).prop_map(|worker| Op::Forge { worker }),
        3 => (0u64..3, 0usize..CHAINS.len(), 0usize..CHAIN_LEN, 1usize..=CHAIN_LEN, any::<bool>(), tier).prop_map(
            |(worker, chain, from, to, leaf_first, tier)| Op::Remove { worker, chain, from: from.min(to - 1), to, leaf_first, tier }
        ),
        1 => (0u64..3).prop_map(|worker| Op::Clear { worker }),
        1 => (0u64..3).prop_map(|worker| Op::RemoveWorker { worker }),
        3 => (0usize..CHAINS.len(), 1usize..=CHAIN_LEN).prop_map(|(chain, len)| Op::Match { chain, len }),
    ]
}

proptest! {
    // Structural bugs (merges after a worker's removal) took thousands of cases to show.
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn indexer_matches_the_naive_reference_at_every_step(ops in prop::collection::vec(op(), 1..120)) {
        let mut index = KvIndexer::new();
        let mut reference = Reference::default();
        let mut next_id: BTreeMap<u64, u64> = BTreeMap::new();
        for op in &ops {
            let mut event = |worker: u64, data: KvCacheEventData| {
                let id = next_id.entry(worker).or_default();
                *id += 1;
                (worker, KvCacheEvent { event_id: *id, dp_rank: 0, data })
            };
            let applied = match op {
                Op::Store { worker, chain, from, to, tier, skip_parent } => {
                    let identities = chain_of(&CHAINS[*chain]);
                    let (from, to) = ((*from).min(*to - 1), *to);
                    let parent = if *skip_parent || from == 0 { None } else { Some(identities[from - 1].sequence_hash) };
                    let start = if *skip_parent { from.min(1) } else { from };
                    let blocks = identities[start..to].iter().map(|b| StoredBlock { block_hash: b.sequence_hash, tokens_hash: b.local_hash }).collect();
                    Some(event(*worker, KvCacheEventData::Stored { parent_hash: parent, blocks, tier: *tier }))
                }
                Op::Forge { worker } => {
                    let blocks = vec![StoredBlock { block_hash: SequenceHash::new(99), tokens_hash: LocalBlockHash::new(1) }];
                    Some(event(*worker, KvCacheEventData::Stored { parent_hash: None, blocks, tier: Tier::Device }))
                }
                Op::Remove { worker, chain, from, to, leaf_first, tier } => {
                    let mut hashes: Vec<SequenceHash> = chain_of(&CHAINS[*chain])[*from..*to].iter().map(|b| b.sequence_hash).collect();
                    if *leaf_first {
                        hashes.reverse();
                    }
                    Some(event(*worker, KvCacheEventData::Removed { block_hashes: hashes, tier: *tier }))
                }
                Op::RemoveWorker { worker } => {
                    index.remove_worker(WorkerId::new(*worker));
                    reference.workers.remove(worker);
                    next_id.remove(worker);
                    None
                }
                Op::Clear { worker } => Some(event(*worker, KvCacheEventData::Cleared)),
                Op::Match { chain, len } => {
                    let query: Vec<LocalBlockHash> = CHAINS[*chain][..*len].iter().map(|l| LocalBlockHash::new(*l)).collect();
                    let got: Vec<(u64, u32, [u32; 4])> = index.find_matches(&query, false).workers.iter().map(|w| (w.worker.worker.get(), w.blocks, w.by_tier)).collect();
                    prop_assert_eq!(got, reference.scores(&query));
                    None
                }
            };
            if let Some((worker, event)) = applied {
                let _ = index.apply(WorkerId::new(worker), &event);
                reference.apply(worker, &event);
            }
            index.check_invariants();
            prop_assert_eq!(index.pairs(), reference.pairs());
        }
        // Dump and rebuild: the same answers to every prefix of every chain.
        let mut rebuilt = KvIndexer::new();
        for (key, event) in index.dump() {
            prop_assert!(rebuilt.apply(key.worker, &event).is_ok(), "dumped event rejected: {:?}", event);
        }
        for chain in CHAINS {
            for len in 1..=chain.len() {
                let query: Vec<LocalBlockHash> = chain[..len].iter().map(|l| LocalBlockHash::new(*l)).collect();
                prop_assert_eq!(rebuilt.find_matches(&query, false), index.find_matches(&query, false));
            }
        }
    }
}

#[test]
fn blocks_of_lists_what_a_worker_holds_with_its_tiers() {
    let mut index = KvIndexer::new();
    let chain = chain_of(&[1, 2, 3]);
    index
        .apply(WorkerId::new(1), &stored(1, None, &chain, Tier::Device))
        .unwrap();
    index
        .apply(WorkerId::new(1), &stored(2, None, &chain[..1], Tier::Host))
        .unwrap();
    index
        .apply(WorkerId::new(2), &stored(1, None, &chain[..2], Tier::Disk))
        .unwrap();
    let held = index.blocks_of(key(1));
    let device = 1 << Tier::Device.index();
    let host = 1 << Tier::Host.index();
    assert_eq!(held.into_iter().collect::<Vec<_>>(), {
        let mut expected = vec![
            (chain[0].sequence_hash, device | host),
            (chain[1].sequence_hash, device),
            (chain[2].sequence_hash, device),
        ];
        expected.sort();
        expected
    });
    assert_eq!(index.blocks_of(key(2)).len(), 2);
    assert!(index.blocks_of(key(3)).is_empty());
    // Every worker's at once: the same lists, for exactly the workers known.
    let all = index.blocks_by_worker();
    assert_eq!(
        all.keys().copied().collect::<Vec<_>>(),
        vec![key(1), key(2)]
    );
    for (worker, blocks) in all {
        let one: Vec<_> = index.blocks_of(worker).into_iter().collect();
        assert_eq!(blocks, one, "{worker:?}");
    }
}

/// A chain held in two tiers losing one tier leaf first, a block at a time, then getting
/// it back root first (a cache evicting and onboarding): every step leaves two runs at
/// most (the shortcuts of `tree/retag.rs` move the blocks between them), the answer per
/// tier follows, and another worker sharing the chain keeps its own view.
#[test]
fn a_tier_leaving_leaf_first_and_coming_back_root_first_keeps_two_runs() {
    let mut index = KvIndexer::new();
    let chain = chain_of(&[1, 2, 3, 4, 5, 6]);
    let hashes: Vec<SequenceHash> = chain.iter().map(|b| b.sequence_hash).collect();
    for (id, tier) in [(1, Tier::Device), (2, Tier::Host)] {
        index
            .apply(WorkerId::new(1), &stored(id, None, &chain, tier))
            .unwrap();
    }
    index
        .apply(
            WorkerId::new(2),
            &stored(1, None, &chain[..4], Tier::Device),
        )
        .unwrap();
    let q = query(&[1, 2, 3, 4, 5, 6]);
    let tiers_of_1 = |index: &KvIndexer| {
        let scores = index.find_matches(&q, false);
        let w = scores.workers.iter().find(|w| w.worker == key(1)).unwrap();
        (
            w.blocks,
            w.by_tier[Tier::Device.index()],
            w.by_tier[Tier::Host.index()],
        )
    };
    let mut event_id = 3;
    for on_device in (0..6).rev() {
        index
            .apply(
                WorkerId::new(1),
                &removed(event_id, &hashes[on_device..on_device + 1], Tier::Device),
            )
            .unwrap();
        event_id += 1;
        index.check_invariants();
        assert_eq!(
            tiers_of_1(&index),
            (6, on_device as u32, 6 - on_device as u32)
        );
        assert!(index.runs() <= 4, "{} runs", index.runs());
    }
    for on_device in 1..=6 {
        let parent = (on_device > 1).then(|| hashes[on_device - 2]);
        index
            .apply(
                WorkerId::new(1),
                &stored(
                    event_id,
                    parent,
                    &chain[on_device - 1..on_device],
                    Tier::Device,
                ),
            )
            .unwrap();
        event_id += 1;
        index.check_invariants();
        assert_eq!(
            tiers_of_1(&index),
            (6, on_device as u32, 6 - on_device as u32)
        );
        assert!(index.runs() <= 4, "{} runs", index.runs());
    }
    assert_eq!(index.find_matches(&q, false).score(key(2)), 4);
    assert_eq!(index.pairs(), 6 + 4);
}

#[test]
fn position_table_stays_near_twice_its_entries_under_churn() {
    // A cache at steady state: one worker holds 1,024 chains of 8 blocks; every step
    // evicts the oldest chain (leaf first) and stores a new one. hashbrown left to
    // itself fills its table with tombstones and doubles it (four buckets per block).
    const CHAINS: u64 = 1024;
    const LEN: u64 = 8;
    let worker = WorkerId::new(1);
    let mut index = KvIndexer::new();
    let mut live = std::collections::VecDeque::new();
    let mut event_id = 0;
    for step in 0..20 * CHAINS {
        if live.len() as u64 == CHAINS {
            let chain: Vec<BlockIdentity> = live.pop_front().unwrap();
            let leaf_first: Vec<SequenceHash> =
                chain.iter().rev().map(|b| b.sequence_hash).collect();
            event_id += 1;
            index
                .apply(worker, &removed(event_id, &leaf_first, Tier::Device))
                .unwrap();
        }
        let locals: Vec<u64> = (0..LEN).map(|i| (step + 1) << 8 | i).collect();
        let chain = chain_of(&locals);
        event_id += 1;
        index
            .apply(worker, &stored(event_id, None, &chain, Tier::Device))
            .unwrap();
        live.push_back(chain);
    }
    index.check_invariants();
    let blocks = (CHAINS * LEN) as usize;
    assert_eq!(index.pairs(), blocks);
    let per_block = index.tree.location_table_bytes() as f64 / blocks as f64;
    // 8,192 entries need 16,384 buckets of 9 bytes: 18 bytes a block (not 36).
    assert!(per_block <= 20.0, "{per_block:.1} table bytes per block");
    assert!(index.position_rebuilds() > 0);
    for chain in &live {
        let locals: Vec<u64> = chain.iter().map(|b| b.local_hash.get()).collect();
        let scores = index.find_matches(&query(&locals), false);
        assert_eq!(scores.score(key(1)), LEN as u32);
    }
}
