//! The LRU hit-ratio curve: hits at every capacity from one pass over a trace, by
//! Mattson stack distances.
//!
//! Owns: [`HitCurve`] (built by [`HitCurve::lru`]) and [`Knee`].
//!
//! Why one pass is exact: under the semantics of [`super::replay`] with
//! `EvictionPolicyKind::Lru`, the pool is a plain LRU stack over one reference string.
//! A request first looks its blocks up (touching nothing), then touches them from the last
//! to the first, and `replay` drops each reference at once, so no block is ever held
//! while another is allocated: every touch moves one block to the top of the stack and an
//! allocation in a full pool evicts the bottom one. LRU is a stack algorithm (inclusion:
//! the cache of C blocks is always the top C of one stack), so block `b` is cached at
//! capacity C exactly when its stack distance `d(b)` (its 1-based depth, counted at the
//! request's lookup) is at most C. A request's prefix hit stops at the first miss, so
//! its i-th block hits at C exactly when `max(d(0..=i)) <= C`: that prefix maximum is the
//! smallest capacity at which the block hits, and one histogram over it gives hit blocks,
//! and (with each block's increment of min(hits × block tokens, input tokens)) hit tokens,
//! at every capacity. The tests check it against `replay` at every capacity.
//! Invariant: `row(c)` has exactly the counts, hence the ratios, of `replay(.., c, ..,
//! Lru)` for every c >= 1.
//! Never: model other policies (priority classes break inclusion), timing or tiers.

use super::CacheRow;
use crate::workload::Request;
use kvtwin::ids::SequenceHash;
use rustc_hash::FxHashMap;

/// Hits of one shared LRU cache at every capacity, from one pass over a trace.
#[derive(Clone, Debug, PartialEq)]
pub struct HitCurve {
    /// `hit_blocks_at[c]`: hit block references with a cache of `c` blocks, for `c` up to
    /// the saturation capacity (beyond it hits stop growing).
    hit_blocks_at: Vec<u64>,
    /// `hit_tokens_at[c]`: as `hit_blocks_at`, in hit prompt tokens.
    hit_tokens_at: Vec<u64>,
    all_blocks: u64,
    all_tokens: u64,
}

/// The smallest capacity that reaches a fraction of the reachable hits.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Knee {
    /// The fraction asked for (0.8 for "80 % of the reachable hits").
    pub fraction: f64,
    /// The smallest capacity, in blocks, whose hit blocks reach that fraction of the hit
    /// blocks of an unbounded cache.
    pub capacity_blocks: usize,
}

/// A Fenwick tree of 0/1 marks over reference times: a block's mark sits at the time of
/// its latest touch, so the marks at or after that time count the distinct blocks touched
/// since, i.e. its depth in the LRU stack. Shared with [`super::shards`], which runs the
/// same stack over the sampled references only.
pub(super) struct Marks {
    tree: Vec<i64>,
}

impl Marks {
    pub(super) fn new(len: usize) -> Self {
        Self {
            tree: vec![0; len + 1],
        }
    }

    pub(super) fn add(&mut self, time: usize, delta: i64) {
        let mut i = time + 1;
        while i < self.tree.len() {
            self.tree[i] += delta;
            i += i & i.wrapping_neg();
        }
    }

    /// Sum of the marks at times `0..=time`.
    pub(super) fn prefix(&self, time: usize) -> i64 {
        let mut i = time + 1;
        let mut sum = 0;
        while i > 0 {
            sum += self.tree[i];
            i -= i & i.wrapping_neg();
        }
        sum
    }
}

impl HitCurve {
    /// One pass over `requests` with the semantics of [`super::replay`] (LRU, leaf-first
    /// touches) and `block_tokens` tokens per block.
    pub fn lru(requests: &[Request], block_tokens: usize) -> Self {
        let references: usize = requests.iter().map(|r| r.blocks.len()).sum();
        let mut marks = Marks::new(references);
        let mut total_marks: i64 = 0;
        // Looked up, never iterated: nothing observable depends on its order.
        let mut last_touch: FxHashMap<SequenceHash, usize> = FxHashMap::default();
        // Indexed by the smallest capacity at which a reference hits (its prefix maximum
        // of stack distances); at most the number of distinct blocks.
        let mut new_blocks_at: Vec<u64> = vec![0];
        let mut new_tokens_at: Vec<u64> = vec![0];
        let (mut all_blocks, mut all_tokens) = (0u64, 0u64);
        let mut now = 0usize;
        let block_tokens = block_tokens as u64;
        for request in requests {
            all_blocks += request.blocks.len() as u64;
            all_tokens += request.input_tokens;
            // Lookups see the stack as it was before this request touches anything.
            let mut prefix_max = 0usize;
            for (i, identity) in request.blocks.iter().enumerate() {
                let Some(&time) = last_touch.get(&identity.sequence_hash) else {
                    break;
                };
                let depth = (total_marks - marks.prefix(time) + 1) as usize;
                prefix_max = prefix_max.max(depth);
                if new_blocks_at.len() <= prefix_max {
                    new_blocks_at.resize(prefix_max + 1, 0);
                    new_tokens_at.resize(prefix_max + 1, 0);
                }
                new_blocks_at[prefix_max] += 1;
                let i = i as u64;
                let tokens = |hits: u64| (hits * block_tokens).min(request.input_tokens);
                new_tokens_at[prefix_max] += tokens(i + 1) - tokens(i);
            }
            for identity in request.blocks.iter().rev() {
                match last_touch.insert(identity.sequence_hash, now) {
                    Some(time) => marks.add(time, -1),
                    None => total_marks += 1,
                }
                marks.add(now, 1);
                now += 1;
            }
        }
        let accumulate = |counts: Vec<u64>| {
            counts
                .into_iter()
                .scan(0u64, |sum, c| {
                    *sum += c;
                    Some(*sum)
                })
                .collect::<Vec<u64>>()
        };
        Self {
            hit_blocks_at: accumulate(new_blocks_at),
            hit_tokens_at: accumulate(new_tokens_at),
            all_blocks,
            all_tokens,
        }
    }

    /// The smallest capacity at which hits stop growing (an unbounded cache's hits).
    pub fn saturation_blocks(&self) -> usize {
        self.hit_blocks_at.len() - 1
    }

    /// Hit block references with a cache of `capacity_blocks`.
    pub fn hit_block_count(&self, capacity_blocks: usize) -> u64 {
        self.hit_blocks_at[capacity_blocks.min(self.saturation_blocks())]
    }

    /// Hit prompt tokens with a cache of `capacity_blocks`.
    pub fn hit_token_count(&self, capacity_blocks: usize) -> u64 {
        self.hit_tokens_at[capacity_blocks.min(self.saturation_blocks())]
    }

    /// The row `replay` gives at `capacity_blocks` (for capacity 0: no hits).
    pub fn row(&self, capacity_blocks: usize) -> CacheRow {
        let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
        CacheRow {
            capacity_blocks,
            hit_blocks: ratio(self.hit_block_count(capacity_blocks), self.all_blocks),
            hit_tokens: ratio(self.hit_token_count(capacity_blocks), self.all_tokens),
        }
    }

    /// The smallest capacity whose hit blocks reach `fraction` (clamped to 0..=1) of the
    /// hit blocks at saturation.
    pub fn knee(&self, fraction: f64) -> Knee {
        let fraction = fraction.clamp(0.0, 1.0);
        let reachable = self.hit_block_count(self.saturation_blocks()) as f64;
        let target = (fraction * reachable).ceil() as u64;
        // Hits never shrink as capacity grows, so the first one at the target is found by
        // bisection.
        let capacity_blocks = self.hit_blocks_at.partition_point(|&hits| hits < target);
        Knee {
            fraction,
            capacity_blocks,
        }
    }

    /// Capacities for a printed curve: 1, 2, 4, ... below saturation, then saturation.
    pub fn doubling_capacities(&self) -> Vec<usize> {
        doubling_capacities(self.saturation_blocks())
    }
}

/// 1, 2, 4, ... below `saturation_blocks`, then `saturation_blocks` (at least 1).
pub fn doubling_capacities(saturation_blocks: usize) -> Vec<usize> {
    let saturation = saturation_blocks.max(1);
    let mut capacities: Vec<usize> = std::iter::successors(Some(1usize), |c| c.checked_mul(2))
        .take_while(|c| *c < saturation)
        .collect();
    capacities.push(saturation);
    capacities
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::cache::replay;
    use kvtwin::block::BlockIdentity;
    use kvtwin::ids::{LocalBlockHash, RequestId, Timestamp};
    use kvtwin::pool::EvictionPolicyKind;
    use proptest::prelude::*;

    /// A request for the prefix `ids` of `input_tokens` tokens (the sampled curve's tests
    /// use it too).
    pub(crate) fn request(ids: &[u64], input_tokens: u64) -> Request {
        let locals: Vec<LocalBlockHash> = ids.iter().map(|i| LocalBlockHash::new(*i)).collect();
        Request {
            id: RequestId::new(0),
            arrival: Timestamp::ZERO,
            blocks: BlockIdentity::chain(&locals),
            input_tokens,
            output_tokens: 1,
            think_tokens: 0,
        }
    }

    #[test]
    fn curve_matches_the_replay_of_cache_rs_example() {
        let requests = vec![
            request(&[1, 2, 3], 12),
            request(&[1, 2, 4], 12),
            request(&[1, 2, 3], 12),
        ];
        let curve = HitCurve::lru(&requests, 4);
        assert_eq!(curve.hit_block_count(16), 5);
        assert_eq!(curve.hit_block_count(3), 4);
        // The third request's block 3 sits under 1, 2 and 4.
        assert_eq!(curve.saturation_blocks(), 4);
        assert_eq!(curve.knee(1.0).capacity_blocks, 4);
        assert_eq!(curve.doubling_capacities(), vec![1, 2, 4]);
    }

    #[test]
    fn hit_tokens_stop_at_the_prompt_length() {
        // Two blocks of 4 tokens, the last one partial (6 tokens in all).
        let requests = vec![request(&[1, 2], 6), request(&[1, 2], 6)];
        let curve = HitCurve::lru(&requests, 4);
        assert_eq!(curve.hit_token_count(1), 4);
        assert_eq!(curve.hit_token_count(2), 6);
        assert_eq!(
            curve.row(2),
            replay(&requests, 2, 4, EvictionPolicyKind::Lru).unwrap()
        );
    }

    /// Small traces with shared prefixes (the sampled curve's tests use them too).
    pub(crate) fn small_traces() -> impl Strategy<Value = Vec<Request>> {
        // Few distinct ids per position so that prefixes are shared and capacities bite.
        let prompt = (prop::collection::vec(0u64..4, 1..6), 0u64..24).prop_map(|(ids, extra)| {
            let input_tokens = (ids.len() as u64 - 1) * 4 + 1 + extra % 4;
            request(&ids, input_tokens)
        });
        prop::collection::vec(prompt, 0..24)
    }

    proptest! {
        #[test]
        fn curve_equals_per_capacity_lru_replays_at_every_capacity(requests in small_traces()) {
            let curve = HitCurve::lru(&requests, 4);
            let references: usize = requests.iter().map(|r| r.blocks.len()).sum();
            for capacity in 1..=references + 1 {
                let expected = replay(&requests, capacity, 4, EvictionPolicyKind::Lru).unwrap();
                prop_assert_eq!(curve.row(capacity), expected, "capacity {}", capacity);
            }
        }
    }
}
