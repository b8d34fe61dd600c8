//! Warnings a flood of bad input cannot turn into a flood of log lines: at most one
//! `tracing` warning per kind per interval, carrying how many of that kind were not
//! logged since the last one.
//!
//! Owns: [`WarnLimiter`].
//! Never: decide what is counted (the metrics count every occurrence; this only bounds
//! the log), or hold more than one slot per kind (kinds are names in the code).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How often one kind of warning is logged at most.
pub const WARN_INTERVAL: Duration = Duration::from_secs(10);

/// Per kind, when it was last logged and how many occurrences were held back since.
#[derive(Debug)]
pub struct WarnLimiter {
    interval: Duration,
    kinds: BTreeMap<&'static str, (Option<Instant>, u64)>,
}

impl Default for WarnLimiter {
    fn default() -> Self {
        Self::new(WARN_INTERVAL)
    }
}

impl WarnLimiter {
    /// A limiter logging each kind at most once per `interval`.
    pub fn new(interval: Duration) -> Self {
        Self {
            interval,
            kinds: BTreeMap::new(),
        }
    }

    /// Whether an occurrence of `kind` at `now` is logged: `Some(held back)` with the
    /// occurrences not logged since the last one that was, `None` when this one is held
    /// back (and counted for the next).
    pub fn admit(&mut self, kind: &'static str, now: Instant) -> Option<u64> {
        let (last, held) = self.kinds.entry(kind).or_insert((None, 0));
        match last {
            Some(at) if now.saturating_duration_since(*at) < self.interval => {
                *held += 1;
                None
            }
            _ => {
                *last = Some(now);
                Some(std::mem::take(held))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_warning_per_kind_per_interval_with_the_held_back_count() {
        let mut limiter = WarnLimiter::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(limiter.admit("gap", t0), Some(0));
        for i in 1..=1000 {
            assert_eq!(limiter.admit("gap", t0 + Duration::from_millis(i)), None);
        }
        // Another kind is not held back by the first.
        assert_eq!(limiter.admit("lost", t0), Some(0));
        assert_eq!(
            limiter.admit("gap", t0 + Duration::from_secs(10)),
            Some(1000)
        );
        assert_eq!(limiter.admit("gap", t0 + Duration::from_secs(11)), None);
        assert_eq!(limiter.admit("gap", t0 + Duration::from_secs(21)), Some(1));
    }
}
