//! Latency statistics in bounded memory.
//!
//! Owns: [`Latencies`]: the samples of one latency (TTFT, TPOT, end to end) of a run, and
//! the summary the report prints ([`crate::run::Percentiles`]).
//! Never: let memory grow with the length of a trace: a run of ten million requests keeps
//! the same few hundred kilobytes per latency as a run of a hundred thousand.
//!
//! Samples are kept exactly until there are [`EXACT_SAMPLES`] of them, so the
//! percentiles of ordinary runs (and of every test) are exact order statistics. Beyond
//! that they go into a log-linear histogram: values under 2¹⁰ ns exactly, larger ones in
//! 2¹⁰ buckets per power of two, so a percentile is off by less than 0.1 % of its value.
//! The mean is always exact (an integer sum), and so are the minimum and maximum.

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

    /// Heap bytes held (for the memory tests).
    pub fn heap_bytes(&self) -> usize {
        (self.exact.capacity() + self.histogram.capacity()) * std::mem::size_of::<u64>()
    }
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
}
