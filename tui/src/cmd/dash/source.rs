//! The one trait every dashboard source implements, and the replay of a recording.
//!
//! Owns: [`Source`] and [`SourceEvent`] (what the terminal loop awaits), [`LiveFeed`]
//! (the source side of a live source: updates its tasks send on the wall clock),
//! [`ReplaySource`]
//! (a [`Recording`] played at any speed, paused, stepped and seeked on the recording's
//! own clock).
//! Never: draw, or fold updates into state (the app does). A source's `next` must be
//! cancel-safe: the terminal loop drops it whenever a key or a tick comes first.

use super::model::{Control, SourceStatus, TimedUpdate, Update};
use super::record::Recording;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// What a source yields.
#[derive(Debug)]
// As with `Update`: nearly every event is an update, moved once into the app.
#[allow(clippy::large_enum_variant)]
pub(crate) enum SourceEvent {
    /// An update to fold.
    Update(TimedUpdate),
    /// Forget every update so far: a seek back replays from the start.
    Rewind,
    /// Nothing more will come (a recording's end, a finished simulation).
    End,
}

/// A boxed future a source's `next` returns.
pub(crate) type Next<'a> = Pin<Box<dyn Future<Output = SourceEvent> + Send + 'a>>;

/// Where the dashboard's updates come from.
pub(crate) trait Source: Send {
    /// The next event; cancel-safe (nothing is lost when the future is dropped).
    fn next(&mut self) -> Next<'_>;
    /// Obeys a key's request (sources that cannot, ignore it).
    fn control(&mut self, control: Control);
    /// The source's clock now, milliseconds: what the app's clock follows.
    fn now_ms(&self) -> u64;
    /// A label for the header and recordings.
    fn label(&self) -> String;
}

/// The wall clock of a live source: milliseconds since it started.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LiveClock {
    start: Instant,
}

impl LiveClock {
    /// A clock at zero now.
    pub(crate) fn start() -> Self {
        Self {
            start: Instant::now(),
        }
    }

    /// Milliseconds since the start.
    pub(crate) fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// A status line now.
    pub(crate) fn status(&self, connected: bool, text: String) -> TimedUpdate {
        TimedUpdate {
            at_ms: self.now_ms(),
            update: Update::Status(SourceStatus { connected, text }),
        }
    }
}

/// A live source as the loop sees it: what its tasks send, on the wall clock. Keys
/// cannot pause the world, so controls are ignored.
pub(crate) struct LiveFeed {
    updates: mpsc::Receiver<TimedUpdate>,
    clock: LiveClock,
    label: String,
    /// Stops the tasks and threads that feed it when dropped.
    _feeders: Box<dyn Send>,
}

impl LiveFeed {
    /// A feed of what comes on `updates`, stamped by `clock`; `feeders` is dropped
    /// with it.
    pub(crate) fn new(
        updates: mpsc::Receiver<TimedUpdate>,
        clock: LiveClock,
        label: String,
        feeders: impl Send + 'static,
    ) -> Self {
        Self {
            updates,
            clock,
            label,
            _feeders: Box::new(feeders),
        }
    }
}

impl Source for LiveFeed {
    fn next(&mut self) -> Next<'_> {
        Box::pin(async move {
            match self.updates.recv().await {
                Some(update) => SourceEvent::Update(update),
                None => SourceEvent::End,
            }
        })
    }

    fn control(&mut self, _control: Control) {}

    fn now_ms(&self) -> u64 {
        self.clock.now_ms()
    }

    fn label(&self) -> String {
        self.label.clone()
    }
}

/// Play bounds: a replay goes from 1/64 to 65,536 times real time (or flat out, for
/// `--once`).
const SPEED_RANGE: (f64, f64) = (1.0 / 64.0, 65_536.0);

/// A recording played back on its own clock.
pub(crate) struct ReplaySource {
    recording: Recording,
    label: String,
    /// The next update to give.
    next_index: usize,
    /// The recording's clock at `anchor_wall`.
    anchor_ms: f64,
    anchor_wall: Instant,
    speed: f64,
    paused: bool,
    /// A rewind to announce before the next update.
    rewind_pending: bool,
    ended: bool,
}

impl ReplaySource {
    /// Plays `recording` from its start at `speed` times real time; `f64::INFINITY`
    /// gives every update at once.
    pub(crate) fn new(recording: Recording, label: String, speed: f64) -> Self {
        let start = recording.updates.first().map_or(0, |update| update.at_ms) as f64;
        Self {
            recording,
            label,
            next_index: 0,
            anchor_ms: start,
            anchor_wall: Instant::now(),
            speed: if speed.is_infinite() {
                speed
            } else {
                speed.clamp(SPEED_RANGE.0, SPEED_RANGE.1)
            },
            paused: false,
            rewind_pending: false,
            ended: false,
        }
    }

    /// Ends the recording at `at_ms` on its clock: later updates are never given (`--once
    /// --at`).
    pub(crate) fn end_at(&mut self, at_ms: u64) {
        self.recording
            .updates
            .retain(|update| update.at_ms <= at_ms);
    }

    /// The recording's clock now.
    fn position_ms(&self) -> f64 {
        let end = self.recording.end_ms() as f64;
        if self.paused {
            return self.anchor_ms.min(end);
        }
        if self.speed.is_infinite() {
            return end;
        }
        (self.anchor_ms + self.anchor_wall.elapsed().as_secs_f64() * 1e3 * self.speed).min(end)
    }

    /// Moves the clock to `position_ms` and holds the play state.
    fn anchor(&mut self, position_ms: f64) {
        self.anchor_ms = position_ms;
        self.anchor_wall = Instant::now();
    }

    /// The update at `index`, once the clock reaches it (or at once while the clock is
    /// past it).
    fn due_in(&self, index: usize) -> Option<Duration> {
        let at = self.recording.updates[index].at_ms as f64;
        let position = self.position_ms();
        if at <= position {
            return Some(Duration::ZERO);
        }
        if self.paused {
            return None;
        }
        Some(Duration::from_secs_f64((at - position) / 1e3 / self.speed))
    }
}

impl Source for ReplaySource {
    fn next(&mut self) -> Next<'_> {
        Box::pin(async move {
            if self.rewind_pending {
                self.rewind_pending = false;
                return SourceEvent::Rewind;
            }
            if self.next_index >= self.recording.updates.len() {
                if self.ended {
                    std::future::pending::<()>().await;
                }
                self.ended = true;
                return SourceEvent::End;
            }
            match self.due_in(self.next_index) {
                Some(wait) => tokio::time::sleep(wait).await,
                None => std::future::pending::<()>().await,
            }
            // Only now, past the last await, does anything change: dropping the future
            // earlier loses nothing.
            let update = self.recording.updates[self.next_index].clone();
            self.next_index += 1;
            SourceEvent::Update(update)
        })
    }

    fn control(&mut self, control: Control) {
        let position = self.position_ms();
        match control {
            Control::Pause(paused) => {
                self.anchor(position);
                self.paused = paused;
            }
            Control::Step => {
                // Paused: the clock moves to the next update, which then comes.
                if let Some(update) = self.recording.updates.get(self.next_index) {
                    self.anchor((update.at_ms as f64).max(position));
                }
                self.paused = true;
            }
            Control::Speed(factor) => {
                self.anchor(position);
                self.speed = (self.speed * factor).clamp(SPEED_RANGE.0, SPEED_RANGE.1);
            }
            Control::Seek(delta_ms) => {
                let start = self.recording.updates.first().map_or(0, |u| u.at_ms) as f64;
                let target =
                    (position + delta_ms as f64).clamp(start, self.recording.end_ms() as f64);
                if target < position {
                    // The app's state cannot be unfolded: start again and fold the
                    // updates up to the target at once.
                    self.next_index = 0;
                    self.rewind_pending = true;
                    self.ended = false;
                }
                self.anchor(target);
            }
        }
    }

    fn now_ms(&self) -> u64 {
        self.position_ms() as u64
    }

    fn label(&self) -> String {
        self.label.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::dash::model::{SourceStatus, Update};

    fn recording(times: &[u64]) -> Recording {
        Recording {
            source: "test".into(),
            updates: times
                .iter()
                .map(|&at_ms| TimedUpdate {
                    at_ms,
                    update: Update::Status(SourceStatus {
                        connected: true,
                        text: at_ms.to_string(),
                    }),
                })
                .collect(),
            torn_tail: false,
        }
    }

    async fn times(source: &mut ReplaySource, n: usize) -> Vec<Option<u64>> {
        let mut seen = Vec::new();
        for _ in 0..n {
            seen.push(match source.next().await {
                SourceEvent::Update(update) => Some(update.at_ms),
                SourceEvent::Rewind => None,
                SourceEvent::End => Some(u64::MAX),
            });
        }
        seen
    }

    #[tokio::test(start_paused = true)]
    async fn a_replay_plays_on_the_recordings_clock_at_its_speed() {
        let mut source = ReplaySource::new(recording(&[0, 1_000, 61_000]), "r".into(), 10.0);
        let started = Instant::now();
        assert_eq!(
            times(&mut source, 3).await,
            [Some(0), Some(1_000), Some(61_000)]
        );
        // 61 s of recording at 10x: 6.1 s of (tokio's paused) wall time.
        let wall = started.elapsed().as_secs_f64();
        assert!((wall - 6.1).abs() < 0.01, "{wall}");
        assert_eq!(times(&mut source, 1).await, [Some(u64::MAX)]);
        assert_eq!(source.now_ms(), 61_000);
    }

    #[tokio::test(start_paused = true)]
    async fn seeking_back_rewinds_and_refolds_up_to_the_target() {
        let mut source =
            ReplaySource::new(recording(&[0, 10_000, 20_000, 30_000]), "r".into(), 1.0);
        assert_eq!(
            times(&mut source, 3).await,
            [Some(0), Some(10_000), Some(20_000)]
        );
        source.control(Control::Seek(-15_000));
        // A rewind, then everything up to 5 s at once, then 10 s when its time comes.
        assert_eq!(times(&mut source, 2).await, [None, Some(0)]);
        assert_eq!(source.now_ms(), 5_000);
        let before = Instant::now();
        assert_eq!(times(&mut source, 1).await, [Some(10_000)]);
        assert!((before.elapsed().as_secs_f64() - 5.0).abs() < 0.01);
    }

    #[tokio::test(start_paused = true)]
    async fn paused_a_replay_gives_nothing_until_stepped() {
        let mut source = ReplaySource::new(recording(&[0, 10_000]), "r".into(), 1.0);
        assert_eq!(times(&mut source, 1).await, [Some(0)]);
        source.control(Control::Pause(true));
        let waited = tokio::time::timeout(Duration::from_secs(60), source.next()).await;
        assert!(waited.is_err(), "a paused replay gave an update");
        source.control(Control::Step);
        assert_eq!(times(&mut source, 1).await, [Some(10_000)]);
        assert_eq!(source.now_ms(), 10_000);
    }
}
