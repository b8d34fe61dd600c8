//! Reading a decode batch's streamed answers: the step time a client saw, the single
//! steps among its gaps, and their pooled percentiles (the table's `step_spread`).
//!
//! The profile reads steps this way only off an engine that does not report its own
//! inter-token latency; the percentiles serve both ways.
//!
//! Owns: what is a burst (chunks an API server held back and then sent at once) and the
//! window in which a whole batch decodes. Never: sends requests or reads the engine's
//! metrics (the caller brings both).

use super::Repeats;
use kvtwin_plane::bench::serve::RequestRecord;
use std::time::Duration;

/// Single steps a spread needs at least: fewer say little about its tails.
pub(super) const MIN_SINGLE_STEPS: usize = 20;

/// The 101 percentiles of `ratios` (0 to 100, linear between order statistics), or none
/// with fewer than [`MIN_SINGLE_STEPS`] of them.
pub(super) fn percentiles(ratios: &[f64]) -> Vec<f64> {
    let mut sorted: Vec<f64> = ratios
        .iter()
        .copied()
        .filter(|r| r.is_finite() && *r > 0.0)
        .collect();
    if sorted.len() < MIN_SINGLE_STEPS {
        return Vec::new();
    }
    sorted.sort_by(f64::total_cmp);
    let last = (sorted.len() - 1) as f64;
    (0..=100)
        .map(|percent| {
            let at = f64::from(percent) / 100.0 * last;
            let lower = at.floor() as usize;
            let upper = (lower + 1).min(sorted.len() - 1);
            sorted[lower] + (sorted[upper] - sorted[lower]) * (at - lower as f64)
        })
        .collect()
}

/// A gap shorter than this share of its batch's median gap is a burst: chunks the API
/// server held back and then sent at once (seen on the 2-core VM with both engines
/// busy: gaps of 0.02 ms between 15 ms steps). The burst and the gap before it (which
/// holds the steps the burst brings) are not single steps.
const BURST_SHARE: f64 = 0.25;

/// The step time of a batch and the single steps it saw: the median gap between output
/// chunks while every request of the batch decodes, and those gaps, bursts left out.
/// Falls back on every gap after each first token when that window holds none (a
/// batch whose members never all decode at once). When an answer came in fewer chunks
/// than tokens (a busy API server merges outputs into one chunk: on the 2-core VM with
/// two engines busy, all 8 of a lone request's tokens came in one), or bursts leave no
/// gap, gaps are not steps: then the median over the batch of each request's time per
/// token after its first, and no single steps.
pub(super) fn step_ms(records: &[RequestRecord]) -> Option<(f64, Vec<f64>)> {
    let per_token = || {
        let per_token: Vec<f64> = records
            .iter()
            .filter_map(RequestRecord::time_per_output_token)
            .map(|tpot| tpot.as_secs_f64() * 1e3)
            .collect();
        (!per_token.is_empty()).then(|| (Repeats(per_token).median(), Vec::new()))
    };
    if records.iter().any(RequestRecord::merged_chunks) {
        return per_token();
    }
    // Each request's first token and last chunk, from the batch's origin.
    let spans: Vec<(Duration, Duration)> = records
        .iter()
        .filter_map(|record| {
            let first = record.started + record.ttft?;
            Some((first, first + record.itl.iter().sum::<Duration>()))
        })
        .collect();
    let all_decoding = spans.iter().map(|(first, _)| *first).max()?;
    let one_done = spans.iter().map(|(_, last)| *last).min()?;
    // Bursts are judged against the batch's gaps pooled: one answer of 7 gaps may be
    // mostly bursts (behind a router that fell behind its engine, every other gap was
    // one), and its own median would call them steps.
    let pooled = Repeats(
        records
            .iter()
            .flat_map(|record| record.itl.iter().map(Duration::as_secs_f64))
            .collect(),
    )
    .median();
    let steps: Vec<(Duration, Duration)> = records
        .iter()
        .flat_map(|record| single_steps(record, pooled))
        .collect();
    let ms = |(from, to): &(Duration, Duration)| (*to - *from).as_secs_f64() * 1e3;
    let mut inside: Vec<f64> = steps
        .iter()
        .filter(|(from, to)| *from >= all_decoding && *to <= one_done)
        .map(ms)
        .collect();
    if inside.is_empty() {
        inside = steps.iter().map(ms).collect();
    }
    if inside.is_empty() {
        return per_token();
    }
    let step = Repeats(inside.clone()).median();
    Some((step, inside))
}

/// A streamed answer's gaps that are single steps, as (from, to) since the batch's
/// origin: every gap after its first token but the bursts (against `median`, the
/// batch's median gap in seconds) and the gaps before them ([`BURST_SHARE`]).
pub(super) fn single_steps(record: &RequestRecord, median: f64) -> Vec<(Duration, Duration)> {
    let Some(ttft) = record.ttft else {
        return Vec::new();
    };
    // At most, so that answers of nothing but bursts (a median of 0) are all bursts.
    let burst = |gap: &Duration| gap.as_secs_f64() <= BURST_SHARE * median;
    let mut at = record.started + ttft;
    let mut steps = Vec::with_capacity(record.itl.len());
    for (i, gap) in record.itl.iter().enumerate() {
        let next_is_burst = record.itl.get(i + 1).is_some_and(burst);
        if !burst(gap) && !next_is_burst {
            steps.push((at, at + *gap));
        }
        at += *gap;
    }
    steps
}
