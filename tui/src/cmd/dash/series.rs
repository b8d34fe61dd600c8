//! Rates and history over the source's clock: [`RateWindow`] turns a cumulative counter
//! into a per-second rate over the last few seconds, and [`History`] is the bounded ring
//! of one-per-second chart [`Sample`]s.
//!
//! Owns: the arithmetic of rates (differences of cumulative values over injected time).
//! Never: read a clock. A counter that goes down (a restarted source) restarts its
//! window rather than producing a negative or huge rate.

use std::collections::VecDeque;

/// How far back a [`RateWindow`] looks, milliseconds: long enough to smooth a source that
/// reports once a second, short enough that a stop shows within seconds.
pub(crate) const RATE_WINDOW_MS: u64 = 5_000;

/// Most samples a window keeps: a source that reports more often than this many times
/// per window only loses resolution, never memory.
const RATE_SAMPLES_MAX: usize = 64;

/// A cumulative counter's recent values, for its rate.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct RateWindow {
    /// `(at_ms, value)`, oldest first. The first is the anchor: the latest value at or
    /// before the window's start, so the rate spans the whole window.
    samples: VecDeque<(u64, u64)>,
}

impl RateWindow {
    /// Records `value` at `at_ms`. A value below the last one (the source restarted its
    /// counter) or a time before the last one (a seek back) starts the window afresh.
    pub(crate) fn push(&mut self, at_ms: u64, value: u64) {
        if let Some(&(last_at, last_value)) = self.samples.back() {
            if value < last_value || at_ms < last_at {
                self.samples.clear();
            } else if value == last_value {
                // Nothing moved: the anchor and the clock already say so.
                return;
            }
        }
        if self.samples.len() == RATE_SAMPLES_MAX {
            // Keep the anchor; drop the second oldest so the span stays the whole window.
            self.samples.remove(1);
        }
        self.samples.push_back((at_ms, value));
    }

    /// Drops samples that no longer matter at `now_ms` (all but one before the window).
    pub(crate) fn prune(&mut self, now_ms: u64) {
        let start = now_ms.saturating_sub(RATE_WINDOW_MS);
        while self.samples.len() >= 2 && self.samples[1].0 <= start {
            self.samples.pop_front();
        }
    }

    /// Per second over the window ending at `now_ms`; 0 before two values are known.
    /// The span runs to `now_ms`, not to the last change, so a counter that stops
    /// decays to 0 instead of showing its last rate for ever.
    pub(crate) fn rate_per_s(&self, now_ms: u64) -> f64 {
        let (Some(&(first_at, first)), Some(&(last_at, last))) =
            (self.samples.front(), self.samples.back())
        else {
            return 0.0;
        };
        let span_ms = now_ms.max(last_at).saturating_sub(first_at);
        if span_ms == 0 {
            return 0.0;
        }
        (last - first) as f64 * 1_000.0 / span_ms as f64
    }
}

/// One chart point: what the second (or more, when the clock jumped) before `at_ms` saw.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Sample {
    /// When it was taken, on the source's clock.
    pub(crate) at_ms: u64,
    /// Block events per second over the interval.
    pub(crate) events_per_s: f64,
    /// Routing decisions per second over the interval.
    pub(crate) routes_per_s: f64,
    /// Hit blocks over lookup blocks in the interval; `None` when nothing was looked up.
    pub(crate) hit_ratio: Option<f64>,
    /// Blocks held per tier, all workers.
    pub(crate) blocks: [u64; 4],
    /// Blocks over capacity per tier, over the workers whose capacity is known; `None`
    /// where no worker's is.
    pub(crate) occupancy: [Option<f64>; 4],
}

/// The cumulative totals a [`Sample`] is the difference of.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Totals {
    /// Block events.
    pub(crate) events: u64,
    /// Routing decisions.
    pub(crate) routes: u64,
    /// Prompt blocks looked up.
    pub(crate) lookup_blocks: u64,
    /// Of those, found cached.
    pub(crate) hit_blocks: u64,
}

/// The bounded ring of chart samples, one per second of source clock.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct History {
    /// Oldest first, at most `capacity`.
    samples: VecDeque<Sample>,
    /// How many samples to keep (the chart span in seconds).
    capacity: usize,
    /// The totals and time of the last sample (or of the start).
    base: Option<(u64, Totals)>,
}

impl History {
    /// An empty history keeping `capacity` samples (at least one).
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            samples: VecDeque::new(),
            capacity: capacity.max(1),
            base: None,
        }
    }

    /// Takes a sample at `now_ms` if a second has passed since the last one. The first
    /// call only sets the base. One sample covers however long the clock jumped, so a
    /// simulator at 100× speed does not flood the ring with copies.
    pub(crate) fn maybe_sample(
        &mut self,
        now_ms: u64,
        totals: Totals,
        blocks: [u64; 4],
        occupancy: [Option<f64>; 4],
    ) {
        let Some((base_at, base)) = self.base else {
            self.base = Some((now_ms, totals));
            return;
        };
        if now_ms < base_at.saturating_add(1_000) {
            return;
        }
        let secs = (now_ms - base_at) as f64 / 1_000.0;
        let d_lookup = totals.lookup_blocks.saturating_sub(base.lookup_blocks);
        let d_hit = totals.hit_blocks.saturating_sub(base.hit_blocks);
        let sample = Sample {
            at_ms: now_ms,
            events_per_s: totals.events.saturating_sub(base.events) as f64 / secs,
            routes_per_s: totals.routes.saturating_sub(base.routes) as f64 / secs,
            hit_ratio: (d_lookup > 0).then(|| d_hit as f64 / d_lookup as f64),
            blocks,
            occupancy,
        };
        if self.samples.len() == self.capacity {
            self.samples.pop_front();
        }
        self.samples.push_back(sample);
        self.base = Some((now_ms, totals));
    }

    /// Forgets everything (the clock went back: a seek).
    pub(crate) fn clear(&mut self) {
        self.samples.clear();
        self.base = None;
    }

    /// The samples, oldest first.
    pub(crate) fn samples(&self) -> &VecDeque<Sample> {
        &self.samples
    }

    /// The newest sample.
    pub(crate) fn last(&self) -> Option<&Sample> {
        self.samples.back()
    }

    /// How many samples it keeps.
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_is_the_difference_over_the_window() {
        let mut w = RateWindow::default();
        w.push(0, 0);
        w.push(1_000, 100);
        w.push(2_000, 200);
        assert_eq!(w.rate_per_s(2_000), 100.0);
    }

    #[test]
    fn rate_decays_when_the_counter_stops() {
        let mut w = RateWindow::default();
        for s in 0..=5 {
            w.push(s * 1_000, s * 100);
        }
        w.prune(20_000);
        assert_eq!(w.rate_per_s(20_000), 0.0);
    }

    #[test]
    fn a_counter_going_down_restarts_the_window() {
        let mut w = RateWindow::default();
        w.push(0, 1_000);
        w.push(1_000, 2_000);
        w.push(2_000, 10);
        assert_eq!(w.rate_per_s(2_000), 0.0);
        w.push(3_000, 110);
        assert_eq!(w.rate_per_s(3_000), 100.0);
    }

    #[test]
    fn history_samples_once_per_second_and_is_bounded() {
        let mut h = History::new(3);
        let t = |e: u64, l: u64, hit: u64| Totals {
            events: e,
            routes: e / 10,
            lookup_blocks: l,
            hit_blocks: hit,
        };
        h.maybe_sample(0, t(0, 0, 0), [0; 4], [None; 4]);
        h.maybe_sample(500, t(50, 0, 0), [0; 4], [None; 4]);
        assert!(h.samples().is_empty());
        h.maybe_sample(
            1_000,
            t(100, 10, 5),
            [1, 0, 0, 0],
            [Some(0.5), None, None, None],
        );
        let s = h.last().unwrap();
        assert_eq!(
            (s.events_per_s, s.routes_per_s, s.hit_ratio),
            (100.0, 10.0, Some(0.5))
        );
        for i in 2..10 {
            h.maybe_sample(i * 1_000, t(100 * i, 10, 5), [0; 4], [None; 4]);
        }
        assert_eq!(h.samples().len(), 3);
        assert_eq!(h.last().unwrap().hit_ratio, None);
    }
}
