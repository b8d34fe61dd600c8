//! The LRU hit-ratio curve estimated from a spatial sample of the blocks, in the manner of
//! SHARDS (Waldspurger et al., FAST'15).
//!
//! Owns: [`SampledCurve`] (built by [`SampledCurve::lru`]), [`SampleRate`],
//! [`Estimator`] and [`mean_absolute_error`].
//!
//! A reference is kept when its key's hash, modulo `P` = 2^24, is below `T`, so the rate
//! is `R = T / P`. The kept references run through the same LRU stack as in
//! [`super::curve`] (so a sampled stack distance counts sampled blocks only), a sampled
//! distance `d` stands for a distance of `d / R`, and each kept reference for `1 / R`
//! references. The hash is fixed (a SplitMix64 finalizer with a fixed seed), so a curve
//! is a pure function of the trace and the rate.
//!
//! How sampled counts become whole-trace estimates is an [`Estimator`]: plain SHARDS,
//! SHARDS-adj, and two refinements the Mooncake trace needed to get within 0.01 (mean
//! absolute error of the hit ratio) at 1 %: the roots, the hottest blocks, kept exactly,
//! and the other blocks post-stratified by position (the default). BENCHMARKS.md has the
//! figures of each.
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

    /// Whether the spatial filter with hash seed `seed` keeps `key`.
    fn keeps_with(self, key: SequenceHash, seed: u64) -> bool {
        mix(key.get() ^ seed) % MODULUS < self.threshold
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
pub enum Estimator {
    /// Plain SHARDS: every block sampled, every count scaled by `1 / R`.
    Shards,
    /// SHARDS-adj: the sample holds `R × N` references in expectation and some other
    /// number in fact; the difference is added at the smallest distance (it stands for
    /// the references of hot blocks the sample missed, or took too many of), so the
    /// sample's misses more than its hits are what gets scaled.
    ShardsAdj,
    /// SHARDS-adj over the blocks below the roots, with every root (a block at position
    /// 0) kept and counted once. A request that holds a block holds its parent, so
    /// references never grow down a prefix tree and the roots are the hottest blocks:
    /// in the Mooncake conversation trace one root is in all 12,031 requests (4.2 % of the
    /// references, 11 % of the hits). Sampled, such a block counts `1 / R` times or not
    /// at all, and that one coin flip is most of SHARDS's error; kept, it costs one stack
    /// entry per distinct root.
    ExactRoots,
    /// As `ExactRoots`, with the other blocks post-stratified by position (1, 2–3, 4–7,
    /// ..., 128 and deeper): each stratum's hits are its sampled hit share times its
    /// exact reference count. That is SHARDS-adj per stratum with the rate the stratum
    /// actually got, and it removes the spread in how many blocks of each depth the
    /// hash happened to keep (the miss share depends strongly on depth).
    #[default]
    Stratified,
}

/// Strata of references: 0 holds the roots kept exactly; 1..STRATA sampled blocks.
const STRATA: usize = 9;

impl Estimator {
    /// The stratum of a block at `position` (0: a root).
    fn stratum(self, position: usize) -> usize {
        match self {
            Estimator::Shards | Estimator::ShardsAdj => 1,
            Estimator::ExactRoots if position == 0 => 0,
            Estimator::ExactRoots => 1,
            Estimator::Stratified => match position {
                0 => 0,
                p => 1 + (p.ilog2() as usize).min(STRATA - 2),
            },
        }
    }
}

/// LRU's hits at every capacity, estimated from the references whose block is sampled.
///
/// A kept reference's distance is estimated as `roots + sampled / R`, the kept roots and
/// the other kept blocks above it in the stack (itself included); it is stored times
/// `T` (`roots × T + sampled × 2^24`) so that every comparison is in integers and rate
/// 1 is exact.
#[derive(Clone, Debug, PartialEq)]
pub struct SampledCurve {
    rate: SampleRate,
    estimator: Estimator,
    /// Per stratum: estimated distances × T of the kept references that hit at some
    /// capacity, sorted, and the running sums of their prompt tokens (from 0).
    distances: [Vec<u64>; STRATA],
    hit_tokens_upto: [Vec<u64>; STRATA],
    /// Per stratum: kept references, and the prompt tokens they would add if they all hit.
    kept_blocks: [u64; STRATA],
    kept_tokens: [u64; STRATA],
    /// As `kept_*`, over every reference of the trace in the stratum.
    population_blocks: [u64; STRATA],
    population_tokens: [u64; STRATA],
    /// Every reference and prompt token of the trace.
    all_blocks: u64,
    all_tokens: u64,
}

/// One kept reference: its block, the prompt tokens it adds to its request's hit tokens
/// when it hits, and its stratum.
struct Kept {
    key: SequenceHash,
    tokens: u64,
    stratum: usize,
}

impl SampledCurve {
    /// One pass over the references of `requests` that `rate` keeps, with the semantics
    /// of [`super::replay`] (LRU, leaf-first touches) and `block_tokens` tokens per block.
    pub fn lru(
        requests: &[Request],
        block_tokens: usize,
        rate: SampleRate,
        estimator: Estimator,
    ) -> Self {
        Self::lru_seeded(requests, block_tokens, rate, estimator, SAMPLE_SEED)
    }

    /// [`Self::lru`] with another seed of the spatial hash: for measuring the spread of
    /// the estimate over samples.
    fn lru_seeded(
        requests: &[Request],
        block_tokens: usize,
        rate: SampleRate,
        estimator: Estimator,
        seed: u64,
    ) -> Self {
        let block_tokens = block_tokens as u64;
        let (mut all_blocks, mut all_tokens) = (0u64, 0u64);
        let mut population_blocks = [0u64; STRATA];
        let mut population_tokens = [0u64; STRATA];
        // The kept stream first, so the stack's trees are sized to it (about R × N).
        let mut kept: Vec<Kept> = Vec::new();
        let mut request_ends: Vec<usize> = Vec::with_capacity(requests.len());
        for request in requests {
            all_blocks += request.blocks.len() as u64;
            all_tokens += request.input_tokens;
            let tokens = |hits: u64| (hits * block_tokens).min(request.input_tokens);
            for (i, identity) in request.blocks.iter().enumerate() {
                let tokens = tokens(i as u64 + 1) - tokens(i as u64);
                let stratum = estimator.stratum(i);
                population_blocks[stratum] += 1;
                population_tokens[stratum] += tokens;
                if stratum == 0 || rate.keeps_with(identity.sequence_hash, seed) {
                    kept.push(Kept {
                        key: identity.sequence_hash,
                        tokens,
                        stratum,
                    });
                }
            }
            request_ends.push(kept.len());
        }
        // Marks at each kept block's latest touch (see `Marks`), one tree for the roots
        // kept exactly ([0]) and one for sampled blocks ([1]): they weigh 1 and 1 / R.
        let weight = |stratum: usize| usize::from(stratum > 0);
        let mut marks = [Marks::new(kept.len()), Marks::new(kept.len())];
        let mut total_marks = [0i64; 2];
        // Looked up, never iterated: nothing observable depends on its order.
        let mut last_touch: FxHashMap<SequenceHash, usize> = FxHashMap::default();
        let mut hits: [Vec<(u64, u64)>; STRATA] = Default::default();
        let (mut start, mut now) = (0usize, 0usize);
        for end in request_ends {
            let blocks = &kept[start..end];
            // Lookups see the kept stack as it was before this request touches it.
            let mut prefix_max = 0u64;
            for block in blocks {
                let Some(&time) = last_touch.get(&block.key) else {
                    break;
                };
                let mut above = [0u64; 2];
                for w in 0..2 {
                    above[w] = (total_marks[w] - marks[w].prefix(time)) as u64;
                }
                above[weight(block.stratum)] += 1;
                let distance = above[0] * rate.threshold + above[1] * MODULUS;
                // Estimated distances keep the exact ones' order along a prefix (a
                // parent's blocks above are a subset of its child's), so this is the
                // block's own distance; the maximum states the rule, as in `curve`.
                prefix_max = prefix_max.max(distance);
                hits[block.stratum].push((prefix_max, block.tokens));
            }
            for block in blocks.iter().rev() {
                let w = weight(block.stratum);
                match last_touch.insert(block.key, now) {
                    Some(time) => marks[w].add(time, -1),
                    None => total_marks[w] += 1,
                }
                marks[w].add(now, 1);
                now += 1;
            }
            start = end;
        }
        let mut distances: [Vec<u64>; STRATA] = Default::default();
        let mut hit_tokens_upto: [Vec<u64>; STRATA] = Default::default();
        for (stratum, mut hits) in hits.into_iter().enumerate() {
            hits.sort_unstable();
            distances[stratum] = hits.iter().map(|h| h.0).collect();
            hit_tokens_upto[stratum] = std::iter::once(0)
                .chain(hits.iter().scan(0u64, |sum, h| {
                    *sum += h.1;
                    Some(*sum)
                }))
                .collect();
        }
        let (mut kept_blocks, mut kept_tokens) = ([0u64; STRATA], [0u64; STRATA]);
        for block in &kept {
            kept_blocks[block.stratum] += 1;
            kept_tokens[block.stratum] += block.tokens;
        }
        Self {
            rate,
            estimator,
            distances,
            hit_tokens_upto,
            kept_blocks,
            kept_tokens,
            population_blocks,
            population_tokens,
            all_blocks,
            all_tokens,
        }
    }

    /// The rate the curve was sampled at.
    pub fn rate(&self) -> SampleRate {
        self.rate
    }

    /// References kept in the sample (roots kept exactly included).
    pub fn kept_blocks(&self) -> u64 {
        self.kept_blocks.iter().sum()
    }

    /// The estimated smallest capacity at which hits stop growing.
    pub fn saturation_blocks(&self) -> usize {
        let largest = self.distances.iter().filter_map(|d| d.last()).max();
        largest.map_or(0, |d| d.div_ceil(self.rate.threshold) as usize)
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
        let saturation = self.saturation_blocks();
        let target = fraction * self.hits(saturation).0;
        // Hits never shrink as capacity grows: bisect for the first that reaches it.
        let (mut lo, mut hi) = (0usize, saturation);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.hits(mid).0 >= target {
                hi = mid;
            } else {
                lo = mid + 1;
            }
        }
        Knee {
            fraction,
            capacity_blocks: lo,
        }
    }

    /// Estimated hit block references and hit prompt tokens at `capacity_blocks`.
    fn hits(&self, capacity_blocks: usize) -> (f64, f64) {
        let limit = capacity_blocks as u128 * self.rate.threshold as u128;
        let mut blocks = [0f64; STRATA];
        let mut tokens = [0f64; STRATA];
        for stratum in 0..STRATA {
            let n = self.distances[stratum].partition_point(|&d| u128::from(d) <= limit);
            blocks[stratum] = n as f64;
            tokens[stratum] = self.hit_tokens_upto[stratum][n] as f64;
        }
        let sampled = 1..STRATA;
        let sum = |values: &[f64; STRATA]| values[sampled.clone()].iter().sum::<f64>();
        let total = |values: &[u64; STRATA]| values[sampled.clone()].iter().sum::<u64>() as f64;
        let (estimate_blocks, estimate_tokens) = match self.estimator {
            Estimator::Shards => (self.rate.scale(sum(&blocks)), self.rate.scale(sum(&tokens))),
            Estimator::ShardsAdj | Estimator::ExactRoots => {
                // Expected minus actual sampled references, in sample units: R × N − N_s,
                // at the smallest distance (so from capacity 1 on).
                let adjust = |hits: f64, population: &[u64; STRATA], kept: &[u64; STRATA]| {
                    let adjustment = if capacity_blocks >= 1 {
                        total(population) * self.rate.get() - total(kept)
                    } else {
                        0.0
                    };
                    self.rate.scale((hits + adjustment).max(0.0))
                };
                (
                    adjust(sum(&blocks), &self.population_blocks, &self.kept_blocks),
                    adjust(sum(&tokens), &self.population_tokens, &self.kept_tokens),
                )
            }
            Estimator::Stratified => {
                // A stratum the hash left empty takes the pooled share of the others.
                let stratified =
                    |hits: &[f64; STRATA], population: &[u64; STRATA], kept: &[u64; STRATA]| {
                        let pooled = sum(hits) / total(kept).max(1.0);
                        sampled
                            .clone()
                            .map(|s| {
                                let share = if kept[s] == 0 {
                                    pooled
                                } else {
                                    hits[s] / kept[s] as f64
                                };
                                share * population[s] as f64
                            })
                            .sum::<f64>()
                    };
                (
                    stratified(&blocks, &self.population_blocks, &self.kept_blocks),
                    stratified(&tokens, &self.population_tokens, &self.kept_tokens),
                )
            }
        };
        (blocks[0] + estimate_blocks, tokens[0] + estimate_tokens)
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
    use crate::cache::curve::tests::{request, small_traces};
    use crate::cache::curve::HitCurve;
    use proptest::prelude::*;

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
        let kept = blocks
            .iter()
            .filter(|b| rate.keeps_with(**b, SAMPLE_SEED))
            .count();
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
        for estimator in [
            Estimator::Shards,
            Estimator::ShardsAdj,
            Estimator::ExactRoots,
        ] {
            let curve = SampledCurve::lru(&requests, 4, SampleRate::new(0.05).unwrap(), estimator);
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
        let a = SampledCurve::lru(&requests, 4, rate, Estimator::ShardsAdj);
        let b = SampledCurve::lru(&requests, 4, rate, Estimator::ShardsAdj);
        assert_eq!(a, b);
        let other = SampledCurve::lru(&requests, 4, SampleRate::new(0.2).unwrap(), a.estimator);
        assert_ne!(a.kept_blocks(), other.kept_blocks());
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
            Estimator::ShardsAdj,
        );
        let rows: Vec<CacheRow> = capacities.iter().map(|c| sampled.row(*c)).collect();
        let (blocks, tokens) = mean_absolute_error(&rows, &exact_rows);
        assert!(blocks < 0.05 && tokens < 0.05, "MAE {blocks} {tokens}");
    }

    proptest! {
        #[test]
        fn rate_one_equals_the_exact_curve_at_every_capacity(requests in small_traces()) {
            let exact = HitCurve::lru(&requests, 4);
            for estimator in [Estimator::Shards, Estimator::ShardsAdj, Estimator::ExactRoots, Estimator::Stratified] {
                let sampled = SampledCurve::lru(&requests, 4, SampleRate::ALL, estimator);
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

    #[test]
    fn stratified_estimates_spread_less_than_plain_shards_over_seeds() {
        // Hot roots shared by every request and conversations of many depths, as in
        // the Mooncake trace.
        let requests = conversations(1_000, 10);
        let exact = HitCurve::lru(&requests, 4);
        let capacities = exact.doubling_capacities();
        let exact_rows: Vec<CacheRow> = capacities.iter().map(|c| exact.row(*c)).collect();
        let rate = SampleRate::new(0.05).unwrap();
        let mean_error = |estimator: Estimator| {
            let errors: f64 = (1..=16u64)
                .map(|seed| {
                    let curve = SampledCurve::lru_seeded(&requests, 4, rate, estimator, seed);
                    let rows: Vec<CacheRow> = capacities.iter().map(|c| curve.row(*c)).collect();
                    mean_absolute_error(&rows, &exact_rows).0
                })
                .sum();
            errors / 16.0
        };
        let (plain, stratified) = (
            mean_error(Estimator::Shards),
            mean_error(Estimator::Stratified),
        );
        assert!(stratified < plain, "stratified {stratified}, plain {plain}");
    }
}
