//! The LRU hit-ratio curve estimated from a spatial sample of the blocks, in the manner of
//! SHARDS (Waldspurger et al., FAST'15).
//!
//! Owns: [`SampledCurve`] (built by [`SampledCurve::lru`]), [`SampleRate`] and
//! [`Adjustment`].
//!
//! A reference is kept when its key's hash, modulo `P` = 2^24, is below `T`, so the rate
//! is `R = T / P`. The kept references run through the same LRU stack as in
//! [`super::curve`] (so a sampled stack distance counts sampled blocks only), a sampled
//! distance `d` stands for a distance of `d / R`, and each kept reference for `1 / R`
//! references. The hash is fixed (a SplitMix64 finalizer with a fixed seed), so a curve
//! is a pure function of the trace and the rate.
//!
//! The key is the block's sequence hash, and that keeps the prefix semantics of
//! [`super::curve`] exact on the sample. A sequence hash chains the hashes of every block
//! before it, so a block's identity names its whole prefix, and any request that holds a
//! block holds all its ancestors. Requests touch their blocks from the last to the first,
//! so every touch of a block is followed (in the same request) by a touch of its parent:
//! at any lookup a parent sits strictly above each of its children in the stack, and a
//! block that was ever touched has ancestors that were too. Hence the prefix maximum of
//! stack distances that decides a hit in [`super::curve`] is the block's own distance: a
//! reference hits at capacity C exactly when its own distance is at most C, a condition
//! on one key, which is what spatial sampling estimates without bias. The sampled stack
//! keeps that order too (a subsequence of an order is the same order), so the pass below
//! can take the same prefix maximum as the exact one and gets the same answer. Other keys
//! would not do: a block's local hash (the trace's `hash_id`) alone may name different
//! prefixes, and a key per conversation or per first block samples whole prefix trees at
//! once, a few system prompts with thousands of descendants, so the estimate would hang
//! on a handful of trees and its variance would be far larger.
//!
//! Invariant: at rate 1 every reference is kept and the rows equal [`HitCurve::row`]'s
//! exactly; rows never shrink as capacity grows.
//! Never: read the full stack (that is [`super::curve`]'s job), model other policies,
//! timing or tiers.
//!
//! [`HitCurve::row`]: super::curve::HitCurve::row

use super::curve::{doubling_capacities, Knee, Marks};
use super::CacheRow;
use crate::workload::Request;
use kvtwin::ids::SequenceHash;
use rustc_hash::FxHashMap;

/// The modulus `P` of the spatial filter: rates are multiples of 1 / 2^24.
const MODULUS: u64 = 1 << 24;

/// Seed of the spatial hash, fixed so that every run samples the same blocks.
const SAMPLE_SEED: u64 = 0x6b76_7477_696e_5348; // "kvtwinSH"

/// A sampling rate `R = T / 2^24`, with `0 < R <= 1`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SampleRate {
    /// `T`: a reference is kept when its hash modulo 2^24 is below it.
    threshold: u64,
}

/// A rate that cannot be sampled at.
#[derive(Clone, Copy, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SampleRateError {
    /// Not a number in (0, 1].
    #[error("the sample rate must be greater than 0 and at most 1, not {rate}")]
    OutOfRange {
        /// The rate asked for.
        rate: f64,
    },
    /// Positive, but below the filter's resolution of 1 / 2^24.
    #[error("the sample rate {rate} is below the smallest one, 1/2^24 (about 6e-8)")]
    BelowResolution {
        /// The rate asked for.
        rate: f64,
    },
}

impl SampleRate {
    /// Every reference: the exact curve.
    pub const ALL: SampleRate = SampleRate { threshold: MODULUS };

    /// The multiple of 1 / 2^24 nearest to `rate`.
    pub fn new(rate: f64) -> Result<Self, SampleRateError> {
        if !(rate > 0.0 && rate <= 1.0) {
            return Err(SampleRateError::OutOfRange { rate });
        }
        let threshold = (rate * MODULUS as f64).round() as u64;
        if threshold == 0 {
            return Err(SampleRateError::BelowResolution { rate });
        }
        Ok(Self { threshold })
    }

    /// The rate actually sampled at (`T / 2^24`).
    pub fn get(self) -> f64 {
        self.threshold as f64 / MODULUS as f64
    }

    fn keeps(self, key: SequenceHash) -> bool {
        mix(key.get() ^ SAMPLE_SEED) % MODULUS < self.threshold
    }

    /// The sampled distance that stands for `capacity_blocks`: `floor(C × R)`.
    fn sampled_capacity(self, capacity_blocks: usize) -> usize {
        (capacity_blocks as u128 * self.threshold as u128 / MODULUS as u128) as usize
    }

    /// `count / R`: a sampled count scaled to the whole trace.
    fn scale(self, count: f64) -> f64 {
        count * MODULUS as f64 / self.threshold as f64
    }
}

/// SplitMix64's finalizer: every input bit flips about half the output bits. Sequence
/// hashes of first blocks are the trace's small integer ids, which `% 2^24` alone would
/// sample by id order.
fn mix(mut x: u64) -> u64 {
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// How sampled counts become whole-trace counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Adjustment {
    /// Plain SHARDS: every count scaled by `1 / R`.
    None,
    /// SHARDS-adj: the sample holds `R × N` references in expectation and some other
    /// number in fact; the difference is added at the smallest sampled distance, so the
    /// sample's misses (not its hits) are what gets scaled.
    #[default]
    FixedRate,
}

/// LRU's hits at every capacity, estimated from the references whose block is sampled.
#[derive(Clone, Debug, PartialEq)]
pub struct SampledCurve {
    rate: SampleRate,
    adjustment: Adjustment,
    /// `hit_blocks_at[d]`: kept references that hit with a sampled stack of `d` blocks.
    hit_blocks_at: Vec<u64>,
    /// As `hit_blocks_at`, in prompt tokens.
    hit_tokens_at: Vec<u64>,
    /// Kept references, and the prompt tokens they would add if they all hit.
    sampled_blocks: u64,
    sampled_tokens: u64,
    /// The whole trace's references and prompt tokens (counted exactly: it costs nothing).
    all_blocks: u64,
    all_tokens: u64,
    /// The prompt tokens all references would add if they all hit: `all_tokens` less
    /// what no block covers (a prompt longer than its blocks).
    all_block_tokens: u64,
}

/// One kept reference: its block, and the prompt tokens it adds to its request's hit
/// tokens when it hits.
struct Kept {
    key: SequenceHash,
    tokens: u64,
}

impl SampledCurve {
    /// One pass over the references of `requests` that `rate` keeps, with the semantics
    /// of [`super::replay`] (LRU, leaf-first touches) and `block_tokens` tokens per block.
    pub fn lru(
        requests: &[Request],
        block_tokens: usize,
        rate: SampleRate,
        adjustment: Adjustment,
    ) -> Self {
        let block_tokens = block_tokens as u64;
        let (mut all_blocks, mut all_tokens, mut all_block_tokens) = (0u64, 0u64, 0u64);
        // The sampled stream first, so the stack's tree is sized to it (about R × N).
        let mut kept: Vec<Kept> = Vec::new();
        let mut request_ends: Vec<usize> = Vec::with_capacity(requests.len());
        for request in requests {
            all_blocks += request.blocks.len() as u64;
            all_tokens += request.input_tokens;
            let tokens = |hits: u64| (hits * block_tokens).min(request.input_tokens);
            all_block_tokens += tokens(request.blocks.len() as u64);
            for (i, identity) in request.blocks.iter().enumerate() {
                if rate.keeps(identity.sequence_hash) {
                    let i = i as u64;
                    kept.push(Kept {
                        key: identity.sequence_hash,
                        tokens: tokens(i + 1) - tokens(i),
                    });
                }
            }
            request_ends.push(kept.len());
        }
        let mut marks = Marks::new(kept.len());
        let mut total_marks: i64 = 0;
        // Looked up, never iterated: nothing observable depends on its order.
        let mut last_touch: FxHashMap<SequenceHash, usize> = FxHashMap::default();
        let mut new_blocks_at: Vec<u64> = vec![0];
        let mut new_tokens_at: Vec<u64> = vec![0];
        let sampled_tokens = kept.iter().map(|k| k.tokens).sum();
        let (mut start, mut now) = (0usize, 0usize);
        for end in request_ends {
            let blocks = &kept[start..end];
            // Lookups see the sampled stack as it was before this request touches it.
            let mut prefix_max = 0usize;
            for block in blocks {
                let Some(&time) = last_touch.get(&block.key) else {
                    break;
                };
                let depth = (total_marks - marks.prefix(time) + 1) as usize;
                prefix_max = prefix_max.max(depth);
                if new_blocks_at.len() <= prefix_max {
                    new_blocks_at.resize(prefix_max + 1, 0);
                    new_tokens_at.resize(prefix_max + 1, 0);
                }
                new_blocks_at[prefix_max] += 1;
                new_tokens_at[prefix_max] += block.tokens;
            }
            for block in blocks.iter().rev() {
                match last_touch.insert(block.key, now) {
                    Some(time) => marks.add(time, -1),
                    None => total_marks += 1,
                }
                marks.add(now, 1);
                now += 1;
            }
            start = end;
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
            rate,
            adjustment,
            hit_blocks_at: accumulate(new_blocks_at),
            hit_tokens_at: accumulate(new_tokens_at),
            sampled_blocks: kept.len() as u64,
            sampled_tokens,
            all_blocks,
            all_tokens,
            all_block_tokens,
        }
    }

    /// The rate the curve was sampled at.
    pub fn rate(&self) -> SampleRate {
        self.rate
    }

    /// References kept in the sample.
    pub fn sampled_blocks(&self) -> u64 {
        self.sampled_blocks
    }

    /// The estimated smallest capacity at which hits stop growing.
    pub fn saturation_blocks(&self) -> usize {
        let sampled = self.hit_blocks_at.len() - 1;
        self.rate.scale(sampled as f64).ceil() as usize
    }

    /// Capacities for a printed curve: 1, 2, 4, ... below the estimated saturation, then
    /// that saturation.
    pub fn doubling_capacities(&self) -> Vec<usize> {
        doubling_capacities(self.saturation_blocks())
    }

    /// The estimated smallest capacity whose hit blocks reach `fraction` (clamped to
    /// 0..=1) of the hit blocks at saturation.
    pub fn knee(&self, fraction: f64) -> Knee {
        let fraction = fraction.clamp(0.0, 1.0);
        let saturated = self.hit_blocks_at.len() - 1;
        let target = fraction * self.sampled_hits(saturated).0;
        // The first sampled distance that reaches the target (about R × the distinct
        // blocks to scan), then the smallest capacity that stands for it, ceil(d / R).
        let depth = (0..=saturated)
            .find(|&d| self.sampled_hits(d).0 >= target)
            .unwrap_or(saturated);
        let capacity_blocks =
            (depth as u128 * MODULUS as u128).div_ceil(self.rate.threshold as u128) as usize;
        Knee {
            fraction,
            capacity_blocks,
        }
    }

    /// Hit references and their tokens in sampled units at sampled distance `depth`,
    /// adjusted but not yet scaled.
    fn sampled_hits(&self, depth: usize) -> (f64, f64) {
        let depth = depth.min(self.hit_blocks_at.len() - 1);
        let (mut blocks, mut tokens) = (
            self.hit_blocks_at[depth] as f64,
            self.hit_tokens_at[depth] as f64,
        );
        if depth >= 1 && self.adjustment == Adjustment::FixedRate {
            // Expected minus actual sampled references, in sampled units: R × N − N_s.
            let expected = |all: u64| all as f64 * self.rate.get();
            blocks += expected(self.all_blocks) - self.sampled_blocks as f64;
            tokens += expected(self.all_block_tokens) - self.sampled_tokens as f64;
        }
        (blocks.max(0.0), tokens.max(0.0))
    }

    /// Estimated hit block references and hit prompt tokens at `capacity_blocks`.
    fn hits(&self, capacity_blocks: usize) -> (f64, f64) {
        let (blocks, tokens) = self.sampled_hits(self.rate.sampled_capacity(capacity_blocks));
        (self.rate.scale(blocks), self.rate.scale(tokens))
    }

    /// The estimate of the row `replay` gives at `capacity_blocks` (capacity 0: no hits).
    pub fn row(&self, capacity_blocks: usize) -> CacheRow {
        let (blocks, tokens) = self.hits(capacity_blocks);
        let ratio = |a: f64, b: u64| {
            if b == 0 {
                0.0
            } else {
                (a / b as f64).min(1.0)
            }
        };
        CacheRow {
            capacity_blocks,
            hit_blocks: ratio(blocks, self.all_blocks),
            hit_tokens: ratio(tokens, self.all_tokens),
        }
    }
}

/// Mean absolute differences of hit blocks and of hit tokens between two lists of rows
/// of the same capacities (0 for none): how far a sampled curve is from the exact one.
pub fn mean_absolute_error(estimate: &[CacheRow], exact: &[CacheRow]) -> (f64, f64) {
    let n = estimate.len().min(exact.len());
    if n == 0 {
        return (0.0, 0.0);
    }
    let (blocks, tokens) = estimate
        .iter()
        .zip(exact)
        .fold((0.0, 0.0), |(b, t), (e, x)| {
            (
                b + (e.hit_blocks - x.hit_blocks).abs(),
                t + (e.hit_tokens - x.hit_tokens).abs(),
            )
        });
    (blocks / n as f64, tokens / n as f64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::curve::HitCurve;
    use kvtwin::block::BlockIdentity;
    use kvtwin::ids::{LocalBlockHash, RequestId, Timestamp};
    use proptest::prelude::*;

    fn request(ids: &[u64], input_tokens: u64) -> Request {
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

    /// A synthetic trace with shared prefixes at several depths: `conversations`
    /// conversations of growing prompts under a few system prompts.
    fn conversations(conversations: u64, turns: u64) -> Vec<Request> {
        let mut requests = Vec::new();
        for turn in 0..turns {
            for c in 0..conversations {
                let mut ids = vec![c % 5, 1_000 + c % 17];
                ids.extend((0..=turn).map(|t| 10_000 + c * 100 + t));
                let input = ids.len() as u64 * 4 - 1;
                requests.push(request(&ids, input));
            }
        }
        requests
    }

    #[test]
    fn rates_outside_zero_to_one_are_refused() {
        for rate in [0.0, -0.5, 1.5, f64::NAN, f64::INFINITY] {
            assert!(matches!(
                SampleRate::new(rate),
                Err(SampleRateError::OutOfRange { .. })
            ));
        }
        assert!(matches!(
            SampleRate::new(1e-9),
            Err(SampleRateError::BelowResolution { .. })
        ));
        assert_eq!(SampleRate::new(1.0), Ok(SampleRate::ALL));
        assert!((SampleRate::new(0.01).unwrap().get() - 0.01).abs() < 1e-7);
    }

    #[test]
    fn the_sample_keeps_about_the_rate_of_the_blocks() {
        // Sampling is by block, not by reference: count distinct blocks.
        let requests = conversations(400, 10);
        let blocks: std::collections::BTreeSet<SequenceHash> = requests
            .iter()
            .flat_map(|r| r.blocks.iter().map(|b| b.sequence_hash))
            .collect();
        let rate = SampleRate::new(0.1).unwrap();
        let kept = blocks.iter().filter(|b| rate.keeps(**b)).count();
        let share = kept as f64 / blocks.len() as f64;
        assert!(
            (share - 0.1).abs() < 0.02,
            "kept {share} of {}",
            blocks.len()
        );
    }

    #[test]
    fn sampled_rows_never_shrink_as_capacity_grows() {
        let requests = conversations(300, 8);
        for adjustment in [Adjustment::None, Adjustment::FixedRate] {
            let curve = SampledCurve::lru(&requests, 4, SampleRate::new(0.05).unwrap(), adjustment);
            let mut previous = curve.row(0);
            assert_eq!((previous.hit_blocks, previous.hit_tokens), (0.0, 0.0));
            for capacity in 1..=curve.saturation_blocks() + 50 {
                let row = curve.row(capacity);
                assert!(row.hit_blocks >= previous.hit_blocks, "capacity {capacity}");
                assert!(row.hit_tokens >= previous.hit_tokens, "capacity {capacity}");
                assert!(row.hit_blocks <= 1.0 && row.hit_tokens <= 1.0);
                previous = row;
            }
        }
    }

    #[test]
    fn the_same_trace_and_rate_give_the_same_curve() {
        let requests = conversations(200, 6);
        let rate = SampleRate::new(0.1).unwrap();
        let a = SampledCurve::lru(&requests, 4, rate, Adjustment::FixedRate);
        let b = SampledCurve::lru(&requests, 4, rate, Adjustment::FixedRate);
        assert_eq!(a, b);
        let other = SampledCurve::lru(&requests, 4, SampleRate::new(0.2).unwrap(), a.adjustment);
        assert_ne!(a.sampled_blocks(), other.sampled_blocks());
    }

    #[test]
    fn a_sampled_curve_is_close_to_the_exact_one_on_a_large_trace() {
        let requests = conversations(2_000, 12);
        let exact = HitCurve::lru(&requests, 4);
        let capacities = exact.doubling_capacities();
        let exact_rows: Vec<CacheRow> = capacities.iter().map(|c| exact.row(*c)).collect();
        let sampled = SampledCurve::lru(
            &requests,
            4,
            SampleRate::new(0.1).unwrap(),
            Adjustment::FixedRate,
        );
        let rows: Vec<CacheRow> = capacities.iter().map(|c| sampled.row(*c)).collect();
        let (blocks, tokens) = mean_absolute_error(&rows, &exact_rows);
        assert!(blocks < 0.05 && tokens < 0.05, "MAE {blocks} {tokens}");
    }

    fn small_traces() -> impl Strategy<Value = Vec<Request>> {
        let prompt = (prop::collection::vec(0u64..4, 1..6), 0u64..24).prop_map(|(ids, extra)| {
            let input_tokens = (ids.len() as u64 - 1) * 4 + 1 + extra % 4;
            request(&ids, input_tokens)
        });
        prop::collection::vec(prompt, 0..24)
    }

    proptest! {
        #[test]
        fn rate_one_equals_the_exact_curve_at_every_capacity(requests in small_traces()) {
            let exact = HitCurve::lru(&requests, 4);
            for adjustment in [Adjustment::None, Adjustment::FixedRate] {
                let sampled = SampledCurve::lru(&requests, 4, SampleRate::ALL, adjustment);
                prop_assert_eq!(sampled.saturation_blocks(), exact.saturation_blocks());
                prop_assert_eq!(sampled.doubling_capacities(), exact.doubling_capacities());
                for fraction in [0.0, 0.5, 0.8, 1.0] {
                    prop_assert_eq!(sampled.knee(fraction), exact.knee(fraction));
                }
                let references: usize = requests.iter().map(|r| r.blocks.len()).sum();
                for capacity in 0..=references + 1 {
                    prop_assert_eq!(sampled.row(capacity), exact.row(capacity), "capacity {}", capacity);
                }
            }
        }
    }
}
