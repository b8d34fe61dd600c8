//! `kvtwin dash --sim`: the simulator as a dashboard source, played at a chosen multiple
//! of simulated time.
//!
//! Owns: [`SimSource`] (a thread that owns the scenario and steps its `Cluster` at the
//! play speed, pausing, single-stepping and changing speed on request) and the
//! translation of a `ClusterSnapshot` into a [`Delta`].
//! Never: simulate anything itself (`kvtwin_sim::cluster::Cluster` does), or read the
//! wall clock for anything but pacing: every figure is on the simulated clock, so the
//! last frame of a run is the same whatever the speed.

use super::model::{
    Candidate, Control, Counters, Delta, LatencyRow, LinkRow, RouteRow, SimSignals, SourceStatus,
    TimedUpdate, Update, WorkerKey, WorkerRow, WorkerState,
};
use super::source::{Next, Source, SourceEvent};
use kvtwin::ids::Timestamp;
use kvtwin_sim::cluster::{Cluster, ClusterSnapshot, Observation, WorkerStatus};
use kvtwin_sim::scenario::Scenario;
use kvtwin_sim::workload::Request;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc as std_mpsc;
use std::sync::Arc;
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// How often the thread sends a snapshot while playing (wall time).
const FRAME_INTERVAL: Duration = Duration::from_millis(100);
/// Play bounds: simulated seconds per wall second.
const SPEED_RANGE: (f64, f64) = (1.0 / 64.0, 1.0e6);
/// The sliding window of the latency percentiles, simulated seconds.
const LATENCY_WINDOW: Duration = Duration::from_secs(60);
/// What the cluster keeps for us between frames: routing decisions, finished requests'
/// latencies (for the window), fault notes.
const OBSERVATION: Observation = Observation {
    routes: 256,
    latencies: 65_536,
    faults: 256,
    finished: 0,
};
/// Updates in flight from the thread to the terminal loop: the thread waits when the
/// loop falls behind rather than queueing frames.
const CHANNEL_BOUND: usize = 16;

/// The first error of a trace read as the run goes (the requests end there).
pub(crate) type TraceError = Arc<Mutex<Option<String>>>;

/// The simulator thread and its channels.
pub(crate) struct SimSource {
    updates: mpsc::Receiver<TimedUpdate>,
    controls: std_mpsc::Sender<Control>,
    clock_ms: Arc<AtomicU64>,
    label: String,
    ended: bool,
    thread: Option<JoinHandle<()>>,
}

impl SimSource {
    /// Starts simulating `scenario` over `requests` (in arrival order) at `speed` times
    /// real time; `f64::INFINITY` runs flat out (for `--once`).
    /// A trace's reader reports the error that ended it through `trace_error`, shown
    /// when the run finishes.
    pub(crate) fn start<I>(
        scenario: Scenario,
        requests: I,
        speed: f64,
        trace_error: TraceError,
    ) -> Self
    where
        I: IntoIterator<Item = Request> + Send + 'static,
        I::IntoIter: 'static,
    {
        let (update_tx, updates) = mpsc::channel(CHANNEL_BOUND);
        let (controls, control_rx) = std_mpsc::channel();
        let clock_ms = Arc::new(AtomicU64::new(0));
        let label = format!("{} (seed {})", scenario.name, scenario.seed);
        let clock = clock_ms.clone();
        let thread = std::thread::Builder::new()
            .name("kvtwin-dash-sim".into())
            .spawn(move || {
                let mut player = Player {
                    updates: update_tx,
                    controls: control_rx,
                    clock,
                    speed: if speed.is_infinite() {
                        speed
                    } else {
                        speed.clamp(SPEED_RANGE.0, SPEED_RANGE.1)
                    },
                    paused: false,
                    route_seq: 0,
                    scenario_name: scenario.name.clone(),
                    sent: BTreeMap::new(),
                    trace_error,
                };
                match Cluster::new(&scenario, requests) {
                    Ok(cluster) => player.play(cluster),
                    Err(error) => {
                        let _ = player.updates.blocking_send(TimedUpdate {
                            at_ms: 0,
                            update: Update::Status(SourceStatus {
                                connected: false,
                                text: format!("the scenario cannot run: {error}"),
                            }),
                        });
                    }
                }
            })
            .expect("spawning the simulator thread");
        Self {
            updates,
            controls,
            clock_ms,
            label,
            ended: false,
            thread: Some(thread),
        }
    }
}

impl Drop for SimSource {
    fn drop(&mut self) {
        // Closing the channel stops the thread at its next send.
        self.updates.close();
        while self.updates.try_recv().is_ok() {}
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Source for SimSource {
    fn next(&mut self) -> Next<'_> {
        Box::pin(async move {
            match self.updates.recv().await {
                Some(update) => SourceEvent::Update(update),
                None if !self.ended => {
                    self.ended = true;
                    SourceEvent::End
                }
                None => std::future::pending().await,
            }
        })
    }

    fn control(&mut self, control: Control) {
        let _ = self.controls.send(control);
    }

    fn now_ms(&self) -> u64 {
        self.clock_ms.load(Ordering::Relaxed)
    }

    fn label(&self) -> String {
        self.label.clone()
    }
}

/// The thread's side.
struct Player {
    updates: mpsc::Sender<TimedUpdate>,
    controls: std_mpsc::Receiver<Control>,
    clock: Arc<AtomicU64>,
    speed: f64,
    paused: bool,
    route_seq: u64,
    scenario_name: String,
    /// The rows last sent: later deltas carry only the rows that changed, which keeps
    /// a recording of a thousand workers small.
    sent: BTreeMap<WorkerKey, WorkerRow>,
    /// Where a trace's reader puts the error that ended it early.
    trace_error: TraceError,
}

impl Player {
    fn play(&mut self, mut cluster: Cluster<'_>) {
        cluster.observe(OBSERVATION);
        if !self.status(&cluster, format!("simulating {}", self.scenario_name))
            || !self.send(&mut cluster)
        {
            return;
        }
        // Simulated time follows the wall clock from this anchor at `speed`.
        let mut anchor_wall = Instant::now();
        let mut anchor_sim = cluster.now();
        while !cluster.is_done() {
            let mut stepped = false;
            loop {
                match self.controls.try_recv() {
                    Ok(control) => stepped |= self.obey(control, &mut cluster),
                    Err(std_mpsc::TryRecvError::Empty) => break,
                    Err(std_mpsc::TryRecvError::Disconnected) => return,
                }
                anchor_wall = Instant::now();
                anchor_sim = cluster.now();
            }
            if self.paused {
                if stepped && !self.send(&mut cluster) {
                    return;
                }
                match self.controls.recv_timeout(FRAME_INTERVAL) {
                    Ok(control) => {
                        if self.obey(control, &mut cluster) && !self.send(&mut cluster) {
                            return;
                        }
                        anchor_wall = Instant::now();
                        anchor_sim = cluster.now();
                    }
                    Err(std_mpsc::RecvTimeoutError::Timeout) => {}
                    Err(std_mpsc::RecvTimeoutError::Disconnected) => return,
                }
                if self.updates.is_closed() {
                    return;
                }
                continue;
            }
            let frame_end = Instant::now() + FRAME_INTERVAL;
            let target = if self.speed.is_infinite() {
                Timestamp::MAX
            } else {
                let elapsed = (frame_end - anchor_wall).as_secs_f64() * self.speed;
                anchor_sim.saturating_add(Duration::from_secs_f64(elapsed))
            };
            let caught_up = advance_until(&mut cluster, target, frame_end);
            if caught_up && !cluster.is_done() {
                cluster.advance_to(target);
                // Sleep out what is left of the frame: the simulation is ahead of the
                // wall clock.
                let now = Instant::now();
                if frame_end > now {
                    std::thread::sleep(frame_end - now);
                }
            } else if !caught_up {
                // Slower than the speed asked for: play on from where it got to.
                anchor_wall = Instant::now();
                anchor_sim = cluster.now();
            }
            if !self.send(&mut cluster) {
                return;
            }
        }
        let mut text = format!(
            "finished: {:.1} s simulated",
            cluster.now().as_nanos() as f64 / 1e9
        );
        let trace_error = self
            .trace_error
            .lock()
            .map(|e| e.clone())
            .unwrap_or_default();
        if let Some(error) = trace_error {
            text = format!("{text}; the trace ended early: {error}");
        }
        self.status(&cluster, text);
    }

    /// Leaves in `delta` (a whole set of rows) only those that differ from the last sent;
    /// the first delta stays whole.
    fn keep_changed_rows(&mut self, delta: &mut Delta) {
        if self.sent.is_empty() {
            self.sent = delta
                .workers
                .iter()
                .map(|row| (row.key, row.clone()))
                .collect();
            return;
        }
        delta.full = false;
        delta
            .workers
            .retain(|row| self.sent.get(&row.key) != Some(row));
        for row in &delta.workers {
            self.sent.insert(row.key, row.clone());
        }
    }

    /// Says how the run goes in the status line; false when the dashboard has gone.
    fn status(&self, cluster: &Cluster<'_>, text: String) -> bool {
        self.updates
            .blocking_send(TimedUpdate {
                at_ms: cluster.now().as_nanos() / 1_000_000,
                update: Update::Status(SourceStatus {
                    connected: true,
                    text,
                }),
            })
            .is_ok()
    }

    /// Obeys one control; whether it moved the simulation.
    fn obey(&mut self, control: Control, cluster: &mut Cluster<'_>) -> bool {
        match control {
            Control::Pause(paused) => self.paused = paused,
            Control::Speed(factor) if self.speed.is_finite() => {
                self.speed = (self.speed * factor).clamp(SPEED_RANGE.0, SPEED_RANGE.1);
            }
            Control::Speed(_) => {}
            Control::Step => {
                self.paused = true;
                return cluster.step();
            }
            // The simulator only goes forward; a seek ahead plays up to there at once.
            Control::Seek(ms) if ms > 0 => {
                let target = cluster
                    .now()
                    .saturating_add(Duration::from_millis(ms as u64));
                cluster.advance_to(target);
                return true;
            }
            Control::Seek(_) => {}
        }
        false
    }

    /// Sends the cluster as it is now; false when the dashboard has gone.
    fn send(&mut self, cluster: &mut Cluster<'_>) -> bool {
        let snapshot = cluster.snapshot();
        let window = cluster.latency_window(LATENCY_WINDOW);
        let at_ms = snapshot.at.as_nanos() / 1_000_000;
        let mut delta = delta_of(&snapshot, &self.scenario_name);
        self.keep_changed_rows(&mut delta);
        if let Some(sim) = &mut delta.sim {
            // JSON has no infinity: 0 says "flat out".
            sim.speed = if self.speed.is_finite() {
                self.speed
            } else {
                0.0
            };
            sim.paused = self.paused;
            sim.done = cluster.is_done();
            sim.window_s = LATENCY_WINDOW.as_secs_f64();
            sim.ttft = latency_row(&window.ttft);
            sim.tpot = latency_row(&window.tpot);
        }
        for record in cluster.drain_routes() {
            self.route_seq += 1;
            delta.routes.push(RouteRow {
                seq: self.route_seq,
                query_blocks: record.query_blocks as u64,
                winner: Some(key_of(record.chosen.worker.get(), record.chosen.dp_rank)),
                score: "cost".into(),
                candidates: record
                    .candidates
                    .iter()
                    .map(|candidate| Candidate {
                        key: key_of(candidate.worker.worker.get(), candidate.worker.dp_rank),
                        overlap: candidate.overlap_by_tier.map(u64::from),
                        load: candidate.load.active_blocks,
                        score: candidate.cost,
                    })
                    .collect(),
            });
        }
        delta.routes_missed = cluster.routes_dropped();
        delta.notes = cluster
            .drain_faults()
            .into_iter()
            .map(|note| format!("{:.1} s: {}", note.at.as_nanos() as f64 / 1e9, note.text))
            .collect();
        self.clock.store(at_ms, Ordering::Relaxed);
        self.updates
            .blocking_send(TimedUpdate {
                at_ms,
                update: Update::Delta(delta),
            })
            .is_ok()
    }
}

/// Steps `cluster` up to `target` or until the wall clock reaches `deadline`; whether it
/// got there (or to the end).
fn advance_until(cluster: &mut Cluster<'_>, target: Timestamp, deadline: Instant) -> bool {
    let mut steps = 0u32;
    while let Some(at) = cluster.next_deadline() {
        if at > target {
            return true;
        }
        if !cluster.step() {
            return true;
        }
        steps += 1;
        // Looking at the clock costs more than a step; every 256 steps is often enough.
        if steps.is_multiple_of(256) && Instant::now() >= deadline {
            return false;
        }
    }
    true
}

fn key_of(worker: u64, dp_rank: u32) -> WorkerKey {
    WorkerKey { worker, dp_rank }
}

fn latency_row(percentiles: &kvtwin_sim::cluster::Percentiles) -> LatencyRow {
    LatencyRow {
        p50_ms: percentiles.p50_ms,
        p90_ms: percentiles.p90_ms,
        p99_ms: percentiles.p99_ms,
    }
}

/// A snapshot as a delta: every worker (the set is whole), the counters, the links and
/// the simulator's signals; routes, notes and the latency window are the caller's.
pub(crate) fn delta_of(snapshot: &ClusterSnapshot, scenario: &str) -> Delta {
    let workers = snapshot
        .workers
        .iter()
        .map(|worker| WorkerRow {
            key: key_of(worker.id.get(), 0),
            state: match worker.status {
                WorkerStatus::Serving => WorkerState::Up,
                WorkerStatus::Draining => WorkerState::Draining,
                WorkerStatus::Down => WorkerState::Down,
                _ => WorkerState::Removed,
            },
            blocks: worker
                .blocks
                .map(|tier| tier.map_or(0, |t| (t.active + t.cached) as u64)),
            capacity: worker.blocks.map(|tier| tier.map(|t| t.capacity as u64)),
            events: worker.events_published,
            queued: Some(worker.queued as u64),
            running: Some(worker.running as u64),
            routed: Some(worker.routed),
            completed: Some(worker.completed),
            // The simulator knows its workers' state: one with nothing to do is idle,
            // never stale (as when a simulation has finished).
            checked: true,
            ..WorkerRow::default()
        })
        .collect();
    let router = &snapshot.router;
    let sources = &snapshot.blocks;
    Delta {
        full: true,
        workers,
        counters: Some(Counters {
            events_applied: router.events_applied,
            dropped: router.events_dropped + router.events_rejected,
            routes: router.routed,
            lookup_blocks: sources.total,
            hit_blocks: sources.total - sources.computed,
            ..Counters::default()
        }),
        links: snapshot
            .links
            .iter()
            .map(|link| LinkRow {
                worker: link.worker.map(|w| w.get()),
                link: link.link.to_string(),
                bytes: link.bytes,
                utilisation: Some(link.utilisation),
            })
            .collect(),
        sim: Some(SimSignals {
            scenario: scenario.to_string(),
            simulated_s: snapshot.at.as_nanos() as f64 / 1e9,
            requests_arrived: snapshot.requests_arrived,
            requests_completed: snapshot.requests_completed,
            requests_in_flight: snapshot.requests_in_flight as u64,
            requests_rejected: snapshot.requests_rejected,
            passes: snapshot.passes,
            preemptions: snapshot.preemptions,
            faults_applied: snapshot.faults_applied,
            ..SimSignals::default()
        }),
        ..Delta::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cmd::dash::model::Update;

    fn source(speed: f64) -> SimSource {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../scenarios/cluster-kv.ron");
        let scenario = Scenario::load(std::path::Path::new(path)).unwrap();
        let mut requests = scenario
            .workload
            .generate(scenario.seed, scenario.worker.block_size_tokens)
            .unwrap();
        requests.sort_by_key(|request| request.arrival);
        SimSource::start(scenario, requests, speed, TraceError::default())
    }

    /// The next delta (skipping status lines), with its time.
    async fn delta(source: &mut SimSource) -> (u64, Delta) {
        loop {
            match source.next().await {
                SourceEvent::Update(TimedUpdate {
                    at_ms,
                    update: Update::Delta(delta),
                }) => return (at_ms, delta),
                SourceEvent::Update(_) => {}
                other => panic!("the simulation ended: {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn the_player_pauses_steps_changes_speed_and_seeks_on_request() {
        let mut source = source(1.0);
        let (at, first) = delta(&mut source).await;
        assert_eq!(at, 0);
        assert!(first.full);
        assert_eq!(first.workers.len(), 8);
        source.control(Control::Pause(true));
        // Whatever was on its way before the pause; then nothing moves.
        let mut paused_at = at;
        while let Ok((at, delta)) =
            tokio::time::timeout(Duration::from_millis(400), delta(&mut source)).await
        {
            paused_at = at;
            if delta.sim.as_ref().is_some_and(|sim| sim.paused) {
                break;
            }
        }
        let idle = tokio::time::timeout(Duration::from_millis(400), delta(&mut source)).await;
        assert!(idle.is_err(), "a paused simulation sent {idle:?}");
        source.control(Control::Step);
        let (stepped_at, stepped) = delta(&mut source).await;
        assert!(stepped_at >= paused_at);
        assert!(stepped.sim.as_ref().unwrap().paused);
        assert!(!stepped.full, "later deltas carry only changed rows");
        source.control(Control::Seek(60_000));
        let (sought_at, _) = delta(&mut source).await;
        assert!(
            sought_at >= stepped_at + 60_000,
            "{sought_at} after {stepped_at}"
        );
        source.control(Control::Speed(4.0));
        source.control(Control::Pause(false));
        let (_, playing) = delta(&mut source).await;
        let sim = playing.sim.unwrap();
        assert_eq!((sim.speed, sim.paused), (4.0, false));
        assert!(source.now_ms() >= sought_at);
    }

    #[tokio::test]
    async fn flat_out_the_run_ends_with_its_last_snapshot_then_end() {
        let mut source = source(f64::INFINITY);
        let mut last = None;
        loop {
            match source.next().await {
                SourceEvent::Update(TimedUpdate {
                    update: Update::Delta(delta),
                    ..
                }) => last = delta.sim,
                SourceEvent::Update(_) => {}
                SourceEvent::End => break,
                SourceEvent::Rewind => panic!("a simulation never rewinds"),
            }
        }
        let last = last.unwrap();
        assert!(last.done);
        assert_eq!(last.speed, 0.0, "flat out says 0");
        assert_eq!(last.requests_completed, last.requests_arrived);
    }

    #[tokio::test]
    async fn a_finished_simulations_idle_workers_are_up_not_stale() {
        let mut source = source(f64::INFINITY);
        let mut world = crate::cmd::dash::state::World::new(300);
        let mut end = 0;
        while let SourceEvent::Update(update) = source.next().await {
            end = end.max(update.at_ms);
            world.fold(update);
        }
        // A minute after the end, with nothing left to do, none has published.
        world.tick(end + 60_000);
        let (up, stale, _, down) = world.worker_counts(10_000);
        assert_eq!((stale, down), (0, 0), "{up} up");
        assert!(up > 0);
    }
}
