//! Latency statistics: the one percentile definition kvtwin uses, in bounded memory.
//!
//! Owns: [`Latencies`], the samples of one latency (a simulated TTFT, a relay's added
//! latency, an indexer's match time), its [`LatencySummary`], and [`nearest_rank`] for
//! callers that already hold a sorted slice (calibration rates, validation metrics).
//! Every percentile in kvtwin's reports, benches and validation is the nearest-rank one:
//! the `q` quantile of `n` samples is the sample of rank ⌈q·n⌉ (1-based), so it is always
//! a value that was observed and `q = 1` is the maximum.
//! Never: let memory grow with the number of samples (a run of ten million requests
//! keeps the same few hundred kilobytes per latency as a run of a hundred thousand), or
//! read a clock: samples are handed in.
//!
//! Samples are kept exactly until there are [`EXACT_SAMPLES`] of them, so the
//! percentiles of ordinary runs (and of every test) are exact order statistics. Beyond
//! that they go into a log-linear histogram: values under 2¹⁰ ns exactly, larger ones in
//! 2¹⁰ buckets per power of two, so a percentile is off by less than 0.1 % of its value.
//! The mean is always exact (an integer sum), and so are the minimum and maximum.

use std::time::Duration;

/// Samples kept exactly before the histogram takes over (512 KiB of `u64`).
pub const EXACT_SAMPLES: usize = 1 << 16;

/// Sub-buckets per power of two, as a power of two.
const SUB_BITS: u32 = 10;
const SUB: u64 = 1 << SUB_BITS;

/// The samples of one latency, in nanoseconds.
#[derive(Clone, Debug, Default)]
pub struct Latencies {
    /// The samples while there are at most [`EXACT_SAMPLES`]; empty once `histogram` holds
    /// them.
    exact: Vec<u64>,
    /// Counts per bucket, once the exact samples overflowed.
    histogram: Vec<u64>,
    count: u64,
    sum: u128,
    min: u64,
    max: u64,
}

/// The bucket of `value`: the value itself below `SUB`, else its power of two and its top
/// `SUB_BITS` bits after the leading one.
fn bucket(value: u64) -> usize {
    if value < SUB {
        return value as usize;
    }
    let exponent = 63 - value.leading_zeros();
    let shift = exponent - SUB_BITS;
    let mantissa = (value >> shift) - SUB;
    ((u64::from(shift) + 1) * SUB + mantissa) as usize
}

/// The middle of bucket `index` (its value, below `SUB`).
fn bucket_value(index: usize) -> u64 {
    let index = index as u64;
    if index < SUB {
        return index;
    }
    let shift = index / SUB - 1;
    let mantissa = index % SUB;
    let low = (SUB + mantissa) << shift;
    low + ((1u64 << shift) >> 1)
}

impl Latencies {
    /// No samples.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a sample.
    pub fn push(&mut self, nanos: u64) {
        if self.count == 0 {
            (self.min, self.max) = (nanos, nanos);
        } else {
            self.min = self.min.min(nanos);
            self.max = self.max.max(nanos);
        }
        self.count += 1;
        self.sum += u128::from(nanos);
        if self.histogram.is_empty() && self.exact.len() < EXACT_SAMPLES {
            self.exact.push(nanos);
            return;
        }
        if self.histogram.is_empty() {
            for sample in std::mem::take(&mut self.exact) {
                self.count_in_histogram(sample);
            }
        }
        self.count_in_histogram(nanos);
    }

    fn count_in_histogram(&mut self, nanos: u64) {
        let index = bucket(nanos);
        if self.histogram.len() <= index {
            self.histogram.resize(index + 1, 0);
        }
        self.histogram[index] += 1;
    }

    /// Samples added.
    pub fn len(&self) -> u64 {
        self.count
    }

    /// Whether no sample was added.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The exact mean, in nanoseconds (0 without samples).
    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum as f64 / self.count as f64
        }
    }

    /// The `q` quantile (0 < q ≤ 1) as the sample of rank ⌈q·n⌉, in nanoseconds: exact
    /// while the samples are, within 0.1 % after; `q = 1` is the exact maximum.
    pub fn quantile(&mut self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        if rank == self.count {
            return self.max;
        }
        if self.histogram.is_empty() {
            // Sorting in place keeps later pushes correct: order does not matter.
            self.exact.sort_unstable();
            return self.exact[(rank - 1) as usize];
        }
        let mut seen = 0;
        for (index, count) in self.histogram.iter().enumerate() {
            seen += count;
            if seen >= rank {
                return bucket_value(index).clamp(self.min, self.max);
            }
        }
        self.max
    }

    /// Adds a sample given as a span (saturating at `u64::MAX` nanoseconds).
    pub fn push_duration(&mut self, span: Duration) {
        self.push(u64::try_from(span.as_nanos()).unwrap_or(u64::MAX));
    }

    /// The usual percentiles, the exact mean and the count (all zero without samples).
    pub fn summary(&mut self) -> LatencySummary {
        let mut at = |q: f64| Duration::from_nanos(self.quantile(q));
        let (p50, p90, p99, p999, max) = (at(0.50), at(0.90), at(0.99), at(0.999), at(1.0));
        LatencySummary {
            samples: self.count,
            mean_ns: self.mean(),
            p50,
            p90,
            p99,
            p999,
            max,
        }
    }

    /// Heap bytes held (for the memory tests).
    pub fn heap_bytes(&self) -> usize {
        (self.exact.capacity() + self.histogram.capacity()) * std::mem::size_of::<u64>()
    }
}

/// The summary of one latency: nearest-rank percentiles, the exact mean and the count.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LatencySummary {
    /// Samples summarised.
    pub samples: u64,
    /// The exact mean, in nanoseconds (fractional: a sum over a count).
    pub mean_ns: f64,
    /// Median.
    pub p50: Duration,
    /// 90th percentile.
    pub p90: Duration,
    /// 99th percentile.
    pub p99: Duration,
    /// 99.9th percentile.
    pub p999: Duration,
    /// The largest sample.
    pub max: Duration,
}

impl LatencySummary {
    /// The summary of `samples`, in any order.
    pub fn of(samples: impl IntoIterator<Item = Duration>) -> Self {
        let mut latencies = Latencies::new();
        samples
            .into_iter()
            .for_each(|span| latencies.push_duration(span));
        latencies.summary()
    }
}

/// The nearest-rank `q` quantile (0 < q ≤ 1) of `sorted`, ascending: the element of rank
/// ⌈q·n⌉; `None` when it is empty. The definition [`Latencies::quantile`] uses, for
/// callers that hold a sorted slice of some other unit.
pub fn nearest_rank<T: Copy>(sorted: &[T], q: f64) -> Option<T> {
    let n = sorted.len();
    if n == 0 {
        return None;
    }
    let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
    Some(sorted[rank - 1])
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn buckets_are_exact_below_1024_and_within_a_thousandth_above() {
        for value in [
            0,
            1,
            1023,
            1024,
            1025,
            4096,
            190_000,
            1_756_700_000,
            u64::MAX / 3,
        ] {
            let middle = bucket_value(bucket(value));
            let error = (middle as f64 - value as f64).abs() / (value.max(1) as f64);
            assert!(error < 1.0 / 1024.0, "{value}: {middle}");
            if value < 1024 {
                assert_eq!(middle, value);
            }
        }
        // Buckets are ordered like their values.
        assert!(bucket(2047) < bucket(2048) && bucket(2048) < bucket(2050));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// Past the exact samples, every quantile stays within 0.1 % of the exact one, and
        /// the mean, minimum and maximum stay exact.
        #[test]
        fn the_histogram_keeps_quantiles_within_a_thousandth(
            samples in proptest::collection::vec(1u64..10_000_000_000, 1..400),
            extra in 0usize..3,
        ) {
            let mut latencies = Latencies::new();
            // Enough copies to overflow the exact samples.
            let copies = EXACT_SAMPLES / samples.len() + 1 + extra;
            let mut all = Vec::new();
            for _ in 0..copies {
                for sample in &samples {
                    latencies.push(*sample);
                    all.push(*sample);
                }
            }
            prop_assert!(latencies.exact.is_empty());
            all.sort_unstable();
            for q in [0.5, 0.9, 0.99, 1.0] {
                let rank = ((q * all.len() as f64).ceil() as usize).clamp(1, all.len());
                let exact = all[rank - 1] as f64;
                let got = latencies.quantile(q) as f64;
                prop_assert!((got - exact).abs() <= exact / 1000.0, "q {}: {} vs {}", q, got, exact);
            }
            let mean = all.iter().map(|s| u128::from(*s)).sum::<u128>() as f64 / all.len() as f64;
            prop_assert_eq!(latencies.mean(), mean);
            prop_assert!(latencies.heap_bytes() <= 8 * (EXACT_SAMPLES + 70 * 1024));
        }
    }

    #[test]
    fn few_samples_give_exact_order_statistics() {
        let mut latencies = Latencies::new();
        for s in [150_000, 190_000, 170_000] {
            latencies.push(s);
        }
        assert_eq!(latencies.quantile(0.5), 170_000);
        assert_eq!(latencies.quantile(0.01), 150_000);
        assert_eq!(latencies.quantile(1.0), 190_000);
        assert_eq!(latencies.mean(), 170_000.0);
        assert_eq!(Latencies::new().quantile(0.5), 0);
    }

    #[test]
    fn summaries_and_sorted_slices_take_the_same_nearest_rank() {
        let spans: Vec<Duration> = (1..=1000).rev().map(Duration::from_micros).collect();
        let summary = LatencySummary::of(spans.iter().copied());
        assert_eq!(summary.samples, 1000);
        assert_eq!(summary.p50, Duration::from_micros(500));
        assert_eq!(summary.p99, Duration::from_micros(990));
        assert_eq!(summary.p999, Duration::from_micros(999));
        assert_eq!(summary.max, Duration::from_micros(1000));
        assert_eq!(summary.mean_ns, 500_500.0);
        let sorted: Vec<f64> = (1..=4).map(f64::from).collect();
        assert_eq!(nearest_rank(&sorted, 0.5), Some(2.0));
        assert_eq!(nearest_rank(&sorted, 0.51), Some(3.0));
        assert_eq!(nearest_rank(&sorted, 1.0), Some(4.0));
        assert_eq!(nearest_rank::<f64>(&[], 0.5), None);
        assert_eq!(LatencySummary::of([]), LatencySummary::default());
    }
}
