//! The soak's seeded plan: when which process is killed, and the windows RSS is judged
//! over.
//!
//! Owns: [`Target`], [`Kill`], `kill_schedule` and `Windows`. Pure: the same seed,
//! duration and engine count give the same schedule.
//! Never: read a clock or an unseeded random source.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::time::Duration;

/// What a kill hits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Target {
    /// The nats-server (restarted on the same port and store).
    NatsServer,
    /// The relay of engine `0..engines`.
    Relay(usize),
    /// The router.
    Router,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::NatsServer => write!(f, "nats-server"),
            Target::Relay(engine) => write!(f, "relay-{}", engine + 1),
            Target::Router => write!(f, "router"),
        }
    }
}

/// One planned `kill -9` and restart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kill {
    /// When, from the start of publishing.
    pub at: Duration,
    /// What.
    pub target: Target,
}

/// The RSS windows of a run: warm-up and last window are each 25 % of it, capped at
/// 60 s.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Windows {
    /// How long a process warms up from its start (or restart).
    pub(super) warm_up: Duration,
    /// The last window's length, ending with the run.
    pub(super) last: Duration,
    /// The run.
    pub(super) duration: Duration,
}

impl Windows {
    pub(super) fn of(duration: Duration) -> Self {
        let quarter = (duration / 4).min(Duration::from_secs(60));
        Self {
            warm_up: quarter,
            last: quarter,
            duration,
        }
    }

    /// The start of the last window.
    pub(super) fn last_start(&self) -> Duration {
        self.duration.saturating_sub(self.last)
    }

    /// The "after warm-up" window of a process started at `started`: from its warm-up's
    /// end (no later than the last window's start) for a tenth of the run, at least 2 s
    /// (but not past the run's end).
    pub(super) fn after_warm_up(&self, started: Duration) -> (Duration, Duration) {
        let from = (started + self.warm_up).min(self.last_start());
        let length = (self.duration / 10).max(Duration::from_secs(2));
        (from, (from + length).min(self.duration))
    }
}

/// Kill rounds: one per started five minutes.
fn rounds(duration: Duration) -> usize {
    (duration.as_secs().div_ceil(300) as usize).max(1)
}

/// The kills of a run of `duration` with `engines` relays, in time order: each round
/// kills the nats-server, one relay and the router, at moments drawn uniformly from
/// `[warm-up, 40 % of the run)`.
pub(super) fn kill_schedule(seed: u64, duration: Duration, engines: usize) -> Vec<Kill> {
    // A stream of its own: the engines' seeds never collide with the schedule's.
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x6b69_6c6c_2d73_6f61);
    let windows = Windows::of(duration);
    let from = windows.warm_up.as_secs_f64();
    let to = (duration.as_secs_f64() * 0.4).max(from + 1e-3);
    let mut kills = Vec::new();
    for _ in 0..rounds(duration) {
        let relay = rng.gen_range(0..engines.max(1));
        for target in [Target::NatsServer, Target::Relay(relay), Target::Router] {
            kills.push(Kill {
                at: Duration::from_secs_f64(rng.gen_range(from..to)),
                target,
            });
        }
    }
    kills.sort_by_key(|kill| (kill.at, kill.target));
    kills
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_is_seeded_and_kills_each_kind_inside_its_window() {
        let minute = Duration::from_secs(60);
        let kills = kill_schedule(7, minute, 3);
        assert_eq!(kills, kill_schedule(7, minute, 3));
        assert_ne!(kills, kill_schedule(8, minute, 3));
        assert_eq!(kills.len(), 3);
        for target in [Target::NatsServer, Target::Router] {
            assert_eq!(kills.iter().filter(|k| k.target == target).count(), 1);
        }
        assert!(kills
            .iter()
            .any(|k| matches!(k.target, Target::Relay(r) if r < 3)));
        for kill in &kills {
            assert!(kill.at >= Duration::from_secs(15) && kill.at < Duration::from_secs(24));
        }
        assert!(kills.windows(2).all(|pair| pair[0].at <= pair[1].at));
        // Ten minutes: two rounds, inside [60 s, 240 s).
        let long = kill_schedule(7, Duration::from_secs(600), 2);
        assert_eq!(long.len(), 6);
        assert!(long
            .iter()
            .all(|k| k.at >= Duration::from_secs(60) && k.at < Duration::from_secs(240)));
    }

    #[test]
    fn windows_are_a_quarter_capped_at_a_minute_and_a_late_start_is_pulled_back() {
        let short = Windows::of(Duration::from_secs(20));
        assert_eq!(short.warm_up, Duration::from_secs(5));
        assert_eq!(short.last_start(), Duration::from_secs(15));
        assert_eq!(
            short.after_warm_up(Duration::ZERO),
            (Duration::from_secs(5), Duration::from_secs(7))
        );
        // Restarted at 12 s: its warm-up would end at 17 s, inside the last window.
        assert_eq!(
            short.after_warm_up(Duration::from_secs(12)),
            (Duration::from_secs(15), Duration::from_secs(17))
        );
        let long = Windows::of(Duration::from_secs(600));
        assert_eq!(long.warm_up, Duration::from_secs(60));
        assert_eq!(long.last_start(), Duration::from_secs(540));
        assert_eq!(
            long.after_warm_up(Duration::from_secs(100)),
            (Duration::from_secs(160), Duration::from_secs(220))
        );
    }
}
