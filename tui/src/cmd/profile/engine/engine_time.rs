//! The engine's own account of where a request's time went: vLLM's request histograms
//! (`vllm:request_queue_time_seconds` and `vllm:request_prefill_time_seconds`, their sums
//! and counts), read before and after a prefill point, so that a lone request's time to
//! first token splits into the engine's part (queued to scheduled, scheduled to its
//! first token: the step) and the rest (HTTP, the router, the tokenizer, the engine's
//! input and output queues between processes); and its inter-token latencies
//! (`vllm:inter_token_latency_seconds`, stamped by the engine core as each step's
//! outputs leave it), read around a decode point, for the step time no client could
//! see once its API server merges outputs into chunks.
//!
//! The same histogram's buckets say how often the engine stalled: gaps many times any
//! step (the table's `stalls`, [`Gaps::stalls`]).
//!
//! Owns: [`EngineClock`], [`Gaps`] and reading them off `/metrics`.
//! Never: judge the figures (the caller takes medians), or fail a profile: an engine
//! without these histograms (not vLLM) reads as `None`.

use super::get_ok;
use anyhow::Result;
use kvtwin_plane::service::frontend::engine_client::EngineClient;
use kvtwin_sim::compute::table::Stall;

/// The histograms' sums (seconds) and the requests they count, at one moment.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct EngineClock {
    queue_s: f64,
    prefill_s: f64,
    requests: f64,
    /// Gaps between a request's consecutive outputs, summed, and how many.
    itl_s: f64,
    gaps: f64,
    /// The gap histogram's cumulative counts by upper bound (seconds, +Inf last).
    itl_buckets: Vec<(f64, f64)>,
}

const QUEUE_SUM: &str = "vllm:request_queue_time_seconds_sum";
const PREFILL_SUM: &str = "vllm:request_prefill_time_seconds_sum";
const PREFILL_COUNT: &str = "vllm:request_prefill_time_seconds_count";
const ITL_SUM: &str = "vllm:inter_token_latency_seconds_sum";
const ITL_COUNT: &str = "vllm:inter_token_latency_seconds_count";
const ITL_BUCKET: &str = "vllm:inter_token_latency_seconds_bucket";

impl EngineClock {
    /// Reads the engine's histograms; `None` when it has none of them.
    pub(crate) async fn read(client: &EngineClient, url: &str) -> Result<Option<Self>> {
        let metrics = get_ok(client, url, "/metrics", 16 << 20).await?;
        Ok(Self::parse(&String::from_utf8_lossy(&metrics)))
    }

    /// The clock in a Prometheus text exposition: each figure summed over its label sets
    /// (one per engine of a data-parallel server).
    pub(super) fn parse(text: &str) -> Option<Self> {
        let mut clock = Self::default();
        let mut seen = false;
        for line in text.lines() {
            let Some((name, value)) = sample(line) else {
                continue;
            };
            if name == ITL_BUCKET {
                let Some(upper) = bucket_bound(line) else {
                    continue;
                };
                match clock.itl_buckets.iter_mut().find(|(le, _)| *le == upper) {
                    Some((_, count)) => *count += value,
                    None => clock.itl_buckets.push((upper, value)),
                }
                seen = true;
                continue;
            }
            let slot = match name {
                QUEUE_SUM => &mut clock.queue_s,
                PREFILL_SUM => &mut clock.prefill_s,
                PREFILL_COUNT => &mut clock.requests,
                ITL_SUM => &mut clock.itl_s,
                ITL_COUNT => &mut clock.gaps,
                _ => continue,
            };
            *slot += value;
            seen = true;
        }
        clock.itl_buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        seen.then_some(clock)
    }

    /// The engine's time per request finished since `earlier`, milliseconds (queued to
    /// first token), or `None` when none finished.
    pub(crate) fn ms_per_request_since(&self, earlier: &Self) -> Option<f64> {
        let requests = self.requests - earlier.requests;
        (requests >= 1.0).then(|| {
            let seconds = (self.queue_s - earlier.queue_s) + (self.prefill_s - earlier.prefill_s);
            seconds / requests * 1e3
        })
    }
}

impl EngineClock {
    /// Requests the engine finished since `earlier`.
    pub(crate) fn requests_since(&self, earlier: &Self) -> f64 {
        self.requests - earlier.requests
    }

    /// The engine's mean gap between a request's outputs since `earlier`, milliseconds,
    /// or `None` when it streamed no second output. Over a batch that decodes together
    /// this is its step time as the engine core saw it: vLLM stamps each gap when the
    /// step's outputs leave the core, before any process between it and the client
    /// could hold them back.
    pub(super) fn ms_per_gap_since(&self, earlier: &Self) -> Option<f64> {
        let gaps = self.gaps - earlier.gaps;
        (gaps >= 1.0).then(|| (self.itl_s - earlier.itl_s) / gaps * 1e3)
    }

    /// The output gaps the engine counted since `earlier`: their sum, milliseconds, and
    /// how many.
    pub(super) fn itl_since(&self, earlier: &Self) -> (f64, f64) {
        ((self.itl_s - earlier.itl_s) * 1e3, self.gaps - earlier.gaps)
    }
}

impl EngineClock {
    /// The output gaps the engine counted since `earlier`, by bucket.
    pub(super) fn gaps_since(&self, earlier: &Self) -> Gaps {
        let cumulative = |clock: &Self, upper: f64| {
            clock
                .itl_buckets
                .iter()
                .find(|(le, _)| *le == upper)
                .map_or(0.0, |(_, count)| *count)
        };
        let mut lower = 0.0;
        let mut below = 0.0;
        let mut buckets = Vec::with_capacity(self.itl_buckets.len());
        for &(upper, _) in &self.itl_buckets {
            let up_to = cumulative(self, upper) - cumulative(earlier, upper);
            buckets.push((lower, upper, (up_to - below).max(0.0)));
            below = up_to.max(below);
            lower = upper;
        }
        Gaps { buckets }
    }
}

/// Output gaps counted over a while (one engine's, or several added up): how many fell
/// in each of the histogram's buckets, (lower, upper] seconds.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Gaps {
    buckets: Vec<(f64, f64, f64)>,
}

impl Gaps {
    /// These gaps and `other`'s (an engine with the same buckets).
    pub(super) fn add(&mut self, other: &Gaps) {
        for &(lower, upper, count) in &other.buckets {
            match self.buckets.iter_mut().find(|(_, le, _)| *le == upper) {
                Some((_, _, mine)) => *mine += count,
                None => self.buckets.push((lower, upper, count)),
            }
        }
        self.buckets.sort_by(|a, b| a.1.total_cmp(&b.1));
    }

    /// How many gaps in all.
    pub(super) fn total(&self) -> f64 {
        self.buckets.iter().map(|(_, _, count)| count).sum()
    }

    /// The stalls among them: every bucket whose gaps are all at least `threshold_ms`,
    /// as a stall at the bucket's middle (the open last bucket at its lower bound) less
    /// `step_ms` (what the pass would have taken), and the share of all gaps it holds.
    /// vLLM counts a gap per request, so a stalled pass of a batch of `B` counts `B`
    /// times, as each of its `B` ordinary steps does: the share of gaps is the share of
    /// passes.
    pub(super) fn stalls(&self, threshold_ms: f64, step_ms: f64) -> Vec<Stall> {
        let total = self.total();
        if total < 1.0 {
            return Vec::new();
        }
        self.buckets
            .iter()
            .filter(|(lower, _, count)| lower * 1e3 >= threshold_ms && *count > 0.0)
            .map(|&(lower, upper, count)| {
                let middle_ms = if upper.is_finite() {
                    (lower + upper) / 2.0 * 1e3
                } else {
                    lower * 1e3
                };
                Stall {
                    ms: (middle_ms - step_ms).max(step_ms),
                    share: count / total,
                }
            })
            .collect()
    }
}

/// How often the engines stalled while the batches decoded, and from what length a gap
/// counts as a stall.
pub(super) struct Stalls {
    pub(super) threshold_ms: f64,
    pub(super) gaps: f64,
    pub(super) stalls: Vec<kvtwin_sim::compute::table::Stall>,
}

/// A gap this many times the slowest decode figure is a stall, not a slow step.
const STALL_FACTOR: f64 = 8.0;

/// The stalls in the engines' gap histograms between `started` and `ended` (every
/// engine that keeps one), or `None` when none does.
pub(super) fn stalls_of(
    started: &[Option<EngineClock>],
    ended: &[Option<EngineClock>],
    decode_points: &[(u64, u64, super::Repeats)],
) -> Option<Stalls> {
    let mut gaps = Gaps::default();
    let mut read = false;
    for (started, ended) in started.iter().zip(ended) {
        if let (Some(started), Some(ended)) = (started, ended) {
            gaps.add(&ended.gaps_since(started));
            read = true;
        }
    }
    if !read || gaps.total() < 1.0 {
        return None;
    }
    let medians = super::Repeats(decode_points.iter().map(|(_, _, r)| r.median()).collect());
    let threshold_ms = STALL_FACTOR * medians.max();
    Some(Stalls {
        threshold_ms,
        gaps: gaps.total(),
        stalls: gaps.stalls(threshold_ms, medians.median()),
    })
}

/// A bucket line's upper bound (its `le` label, seconds; `+Inf` as infinity).
fn bucket_bound(line: &str) -> Option<f64> {
    let at = line.find("le=\"")? + 4;
    let end = at + line[at..].find('"')?;
    match &line[at..end] {
        "+Inf" => Some(f64::INFINITY),
        bound => bound.parse().ok(),
    }
}

/// A sample line's metric name and value (labels dropped), if it is one.
fn sample(line: &str) -> Option<(&str, f64)> {
    if line.starts_with('#') {
        return None;
    }
    let name_end = line.find(['{', ' '])?;
    let value = line.rsplit(' ').next()?.parse().ok()?;
    Some((&line[..name_end], value))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engines_part_of_a_request_is_read_from_its_histograms() {
        let before = "# HELP x\n\
            vllm:request_queue_time_seconds_sum{engine=\"0\",model_name=\"m\"} 0.5\n\
            vllm:request_prefill_time_seconds_sum{engine=\"0\",model_name=\"m\"} 2.0\n\
            vllm:request_prefill_time_seconds_count{engine=\"0\",model_name=\"m\"} 10.0\n\
            vllm:request_prefill_time_seconds_bucket{le=\"0.3\"} 10.0\n";
        let after = "vllm:request_queue_time_seconds_sum{engine=\"0\"} 0.502\n\
            vllm:request_prefill_time_seconds_sum{engine=\"0\"} 2.04\n\
            vllm:request_prefill_time_seconds_count{engine=\"0\"} 11.0\n\
            vllm:request_prefill_time_seconds_sum{engine=\"1\"} 1.0\n\
            vllm:request_prefill_time_seconds_count{engine=\"1\"} 1.0\n";
        let (before, after) = (
            EngineClock::parse(before).unwrap(),
            EngineClock::parse(after).unwrap(),
        );
        // Two requests finished (one per engine): (0.002 + 0.04 + 1.0) s over two.
        let ms = after.ms_per_request_since(&before).unwrap();
        assert!((ms - 521.0).abs() < 1e-9, "{ms}");
        assert_eq!(before.ms_per_request_since(&before), None);
        assert_eq!(EngineClock::parse("other_metric 1.0\n"), None);
        // No output gaps in either: no step time.
        assert_eq!(after.ms_per_gap_since(&before), None);
    }

    #[test]
    fn the_engines_step_is_its_mean_gap_between_outputs() {
        let before = "vllm:inter_token_latency_seconds_sum{engine=\"0\"} 6.0\n\
            vllm:inter_token_latency_seconds_count{engine=\"0\"} 700.0\n\
            vllm:inter_token_latency_seconds_bucket{engine=\"0\",le=\"0.01\"} 600.0\n";
        let after = "vllm:inter_token_latency_seconds_sum{engine=\"0\"} 6.112\n\
            vllm:inter_token_latency_seconds_count{engine=\"0\"} 714.0\n";
        let (before, after) = (
            EngineClock::parse(before).unwrap(),
            EngineClock::parse(after).unwrap(),
        );
        // 14 gaps (two requests of 8 outputs) in 0.112 s: 8 ms a gap.
        let ms = after.ms_per_gap_since(&before).unwrap();
        assert!((ms - 8.0).abs() < 1e-9, "{ms}");
        assert_eq!(before.ms_per_gap_since(&before), None);
        // Prefills finished there are none of it.
        assert_eq!(after.ms_per_request_since(&before), None);
    }

    fn bucket(engine: u32, le: &str, count: f64) -> String {
        format!(
            "vllm:inter_token_latency_seconds_bucket{{engine=\"{engine}\",le=\"{le}\",model_name=\"m\"}} {count}\n"
        )
    }

    #[test]
    fn stalls_are_the_gaps_in_buckets_far_beyond_a_step_as_a_share_of_all_gaps() {
        let reading = |counts: [f64; 5]| {
            let text: String = ["0.01", "0.1", "0.5", "2.5", "+Inf"]
                .iter()
                .zip(counts)
                .map(|(le, count)| bucket(0, le, count))
                .collect();
            EngineClock::parse(&text).unwrap()
        };
        let before = reading([100.0, 150.0, 150.0, 151.0, 151.0]);
        // 1,000 gaps more: 940 steps, 50 of 10 to 100 ms, 8 of 0.1 to 0.5 s, 2 of 0.5 to
        // 2.5 s.
        let after = reading([1040.0, 1140.0, 1148.0, 1151.0, 1151.0]);
        let mut gaps = after.gaps_since(&before);
        assert_eq!(gaps.total(), 1000.0);
        // Beyond 80 ms (8 steps of 10 ms) only the buckets from 0.1 s count, each at its
        // middle less a step.
        let stalls = gaps.stalls(80.0, 10.0);
        assert_eq!(stalls.len(), 2, "{stalls:?}");
        assert!((stalls[0].ms - 290.0).abs() < 1e-9 && (stalls[0].share - 0.008).abs() < 1e-12);
        assert!((stalls[1].ms - 1490.0).abs() < 1e-9 && (stalls[1].share - 0.002).abs() < 1e-12);
        // A second engine's gaps add to the first's.
        let other = EngineClock::parse(&(bucket(1, "0.01", 1000.0) + &bucket(1, "+Inf", 1000.0)))
            .unwrap()
            .gaps_since(&EngineClock::default());
        gaps.add(&other);
        assert_eq!(gaps.total(), 2000.0);
        assert!((gaps.stalls(80.0, 10.0)[1].share - 0.001).abs() < 1e-12);
        // No gaps, no stalls.
        assert!(before.gaps_since(&before).stalls(80.0, 10.0).is_empty());
    }
}
