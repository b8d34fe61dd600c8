//! The folded world: what every update so far says, as of the app's clock.
//!
//! Owns: [`World`] (worker entries with their event-rate windows and last-event times,
//! counters, the bounded route ring and note log, links with byte-rate windows, the
//! simulator's signals, the source status, the chart history) and how an update folds
//! into it. A `World` is plain data so freezing the screen is a clone.
//! Never: read a clock (times come in with updates and ticks), iterate a hash map, or
//! grow without bound (routes, notes, rate windows and history are all capped).

use std::collections::{BTreeMap, VecDeque};

use super::filter::{Status, Subject};
use super::model::{
    saturating_sum, Counters, Delta, LinkRow, RouteRow, SimSignals, SourceStatus, TimedUpdate,
    Update, WorkerKey, WorkerRow, WorkerState,
};
use super::series::{History, RateWindow, Totals};

/// Routing decisions kept.
pub(crate) const ROUTES_MAX: usize = 200;
/// Notes kept.
pub(crate) const NOTES_MAX: usize = 200;

/// One worker rank as the dashboard knows it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct WorkerEntry {
    /// The source's latest row.
    pub(crate) row: WorkerRow,
    /// When the dashboard first saw it.
    pub(crate) first_seen_ms: u64,
    /// When its `events` last grew; `None` if they have not since it was first seen.
    pub(crate) last_event_ms: Option<u64>,
    /// Its events, for the rate.
    pub(crate) events: RateWindow,
}

/// One link as the dashboard knows it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct LinkEntry {
    /// The source's latest row.
    pub(crate) row: LinkRow,
    /// Its bytes, for the rate.
    pub(crate) bytes: RateWindow,
}

/// Everything folded so far. See the module doc.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct World {
    /// The app's clock, milliseconds on the source's clock.
    pub(crate) now_ms: u64,
    /// Worker ranks, in key order.
    pub(crate) workers: BTreeMap<WorkerKey, WorkerEntry>,
    /// The latest counters.
    pub(crate) counters: Option<Counters>,
    /// The last [`ROUTES_MAX`] decisions, oldest first.
    pub(crate) routes: VecDeque<RouteRow>,
    /// Decisions seen (kept or not), for a route rate when the source sends no counters.
    pub(crate) routes_seen: u64,
    /// Decisions the source could not keep for us, cumulative.
    pub(crate) routes_missed: u64,
    /// Links by (worker, name).
    pub(crate) links: BTreeMap<(Option<u64>, String), LinkEntry>,
    /// The simulator's latest signals.
    pub(crate) sim: Option<SimSignals>,
    /// The last [`NOTES_MAX`] notes with their times, oldest first.
    pub(crate) notes: VecDeque<(u64, String)>,
    /// The source's connection.
    pub(crate) status: Option<SourceStatus>,
    /// The engines' block size, once known.
    pub(crate) block_size: Option<u32>,
    /// Chart samples.
    pub(crate) history: History,
    /// Cluster events, for the header's rate.
    pub(crate) events_rate: RateWindow,
    /// Cluster routes, for the header's rate.
    pub(crate) routes_rate: RateWindow,
    /// Updates folded, for the status line.
    pub(crate) updates: u64,
}

impl World {
    /// An empty world keeping `history_s` chart samples.
    pub(crate) fn new(history_s: u64) -> Self {
        Self {
            now_ms: 0,
            workers: BTreeMap::new(),
            counters: None,
            routes: VecDeque::new(),
            routes_seen: 0,
            routes_missed: 0,
            links: BTreeMap::new(),
            sim: None,
            notes: VecDeque::new(),
            status: None,
            block_size: None,
            history: History::new(usize::try_from(history_s).unwrap_or(usize::MAX)),
            events_rate: RateWindow::default(),
            routes_rate: RateWindow::default(),
            updates: 0,
        }
    }

    /// Folds one update in. Rows upsert by key; `full` drops the rows it does not name.
    pub(crate) fn fold(&mut self, update: TimedUpdate) {
        self.updates += 1;
        let at = update.at_ms;
        match update.update {
            Update::Status(status) => self.status = Some(status),
            Update::Delta(delta) => self.fold_delta(at, delta),
        }
    }

    fn fold_delta(&mut self, at: u64, delta: Delta) {
        if delta.full {
            let named: std::collections::BTreeSet<WorkerKey> =
                delta.workers.iter().map(|row| row.key).collect();
            self.workers.retain(|key, _| named.contains(key));
        }
        for row in delta.workers {
            match self.workers.get_mut(&row.key) {
                Some(entry) => {
                    if row.events > entry.row.events {
                        entry.last_event_ms = Some(at);
                    }
                    entry.events.push(at, row.events);
                    entry.row = row;
                }
                None => {
                    let mut events = RateWindow::default();
                    events.push(at, row.events);
                    self.workers.insert(
                        row.key,
                        WorkerEntry {
                            row,
                            first_seen_ms: at,
                            last_event_ms: None,
                            events,
                        },
                    );
                }
            }
        }
        for key in &delta.removed {
            self.workers.remove(key);
        }
        if let Some(counters) = delta.counters {
            self.counters = Some(counters);
        }
        self.routes_seen = self
            .routes_seen
            .saturating_add(delta.routes.len() as u64)
            .saturating_add(delta.routes_missed);
        self.routes_missed = self.routes_missed.saturating_add(delta.routes_missed);
        for route in delta.routes {
            if self.routes.len() == ROUTES_MAX {
                self.routes.pop_front();
            }
            self.routes.push_back(route);
        }
        // The source sends every link each time it knows any, so an empty list is "no
        // news", not "no links".
        if !delta.links.is_empty() {
            let mut links = BTreeMap::new();
            for row in delta.links {
                let id = (row.worker, row.link.clone());
                let mut bytes = self.links.remove(&id).map(|e| e.bytes).unwrap_or_default();
                bytes.push(at, row.bytes);
                links.insert(id, LinkEntry { row, bytes });
            }
            self.links = links;
        }
        if let Some(sim) = delta.sim {
            self.sim = Some(sim);
        }
        for note in delta.notes {
            if self.notes.len() == NOTES_MAX {
                self.notes.pop_front();
            }
            self.notes.push_back((at, note));
        }
        if delta.block_size.is_some() {
            self.block_size = delta.block_size;
        }
    }

    /// Moves the clock to `now_ms` and takes a chart sample when a second has passed. A
    /// clock that goes back (a replay's seek) clears the history and the rates, which
    /// would otherwise difference across the jump.
    pub(crate) fn tick(&mut self, now_ms: u64) {
        if now_ms < self.now_ms {
            self.history.clear();
            self.events_rate = RateWindow::default();
            self.routes_rate = RateWindow::default();
            for entry in self.workers.values_mut() {
                entry.events = RateWindow::default();
                entry.events.push(now_ms, entry.row.events);
                entry.last_event_ms = entry.last_event_ms.map(|t| t.min(now_ms));
                entry.first_seen_ms = entry.first_seen_ms.min(now_ms);
            }
            for link in self.links.values_mut() {
                link.bytes = RateWindow::default();
                link.bytes.push(now_ms, link.row.bytes);
            }
        }
        self.now_ms = now_ms;
        for entry in self.workers.values_mut() {
            entry.events.prune(now_ms);
        }
        for link in self.links.values_mut() {
            link.bytes.prune(now_ms);
        }
        let totals = self.totals();
        self.events_rate.push(now_ms, totals.events);
        self.events_rate.prune(now_ms);
        self.routes_rate.push(now_ms, totals.routes);
        self.routes_rate.prune(now_ms);
        let (blocks, occupancy) = self.occupancy();
        self.history.maybe_sample(now_ms, totals, blocks, occupancy);
    }

    /// The cumulative totals rates come from: the counters where the source sends them,
    /// else the sum of the workers' events and the decisions seen.
    pub(crate) fn totals(&self) -> Totals {
        match &self.counters {
            Some(c) => Totals {
                events: c.events_applied,
                routes: c.routes,
                lookup_blocks: c.lookup_blocks,
                hit_blocks: c.hit_blocks,
            },
            None => Totals {
                events: saturating_sum(self.workers.values().map(|e| e.row.events)),
                routes: self.routes_seen,
                lookup_blocks: 0,
                hit_blocks: 0,
            },
        }
    }

    /// Blocks per tier over all workers, and blocks over capacity over the workers whose
    /// capacity in that tier is known.
    pub(crate) fn occupancy(&self) -> ([u64; 4], [Option<f64>; 4]) {
        let mut blocks = [0u64; 4];
        let mut known = [(0u64, 0u64); 4];
        let mut any = [false; 4];
        for entry in self.workers.values() {
            for tier in 0..4 {
                blocks[tier] = blocks[tier].saturating_add(entry.row.blocks[tier]);
                if let Some(capacity) = entry.row.capacity[tier] {
                    known[tier].0 = known[tier].0.saturating_add(entry.row.blocks[tier]);
                    known[tier].1 = known[tier].1.saturating_add(capacity);
                    any[tier] = true;
                }
            }
        }
        let share = std::array::from_fn(|tier| {
            (any[tier] && known[tier].1 > 0).then(|| known[tier].0 as f64 / known[tier].1 as f64)
        });
        (blocks, share)
    }

    /// Capacity per tier over all workers, where every worker holding that tier knows it.
    pub(crate) fn capacity(&self) -> [Option<u64>; 4] {
        std::array::from_fn(|tier| {
            let mut total = 0u64;
            let mut any = false;
            for entry in self.workers.values() {
                match entry.row.capacity[tier] {
                    Some(c) => {
                        total = total.saturating_add(c);
                        any = true;
                    }
                    None if entry.row.blocks[tier] > 0 => return None,
                    None => {}
                }
            }
            any.then_some(total)
        })
    }

    /// A worker's status at the clock: its source's state, or stale when up with no event
    /// for `stale_after_ms` (counted from when it was first seen if it never had one).
    pub(crate) fn status(&self, entry: &WorkerEntry, stale_after_ms: u64) -> Status {
        match entry.row.state {
            WorkerState::Draining => Status::Draining,
            WorkerState::Down => Status::Down,
            WorkerState::Removed => Status::Removed,
            // Its engine answers its health check: quiet is idle, not stale.
            WorkerState::Up if entry.row.checked => Status::Up,
            WorkerState::Up => {
                let since = entry.last_event_ms.unwrap_or(entry.first_seen_ms);
                if self.now_ms.saturating_sub(since) >= stale_after_ms {
                    Status::Stale
                } else {
                    Status::Up
                }
            }
        }
    }

    /// Seconds since the worker's events last grew.
    pub(crate) fn age_s(&self, entry: &WorkerEntry) -> Option<f64> {
        entry
            .last_event_ms
            .map(|t| self.now_ms.saturating_sub(t) as f64 / 1_000.0)
    }

    /// The figures a filter and the tables look at.
    pub(crate) fn subject(&self, entry: &WorkerEntry, stale_after_ms: u64) -> Subject {
        let row = &entry.row;
        Subject {
            key: row.key,
            blocks: row.blocks,
            events_per_s: entry.events.rate_per_s(self.now_ms),
            age_s: self.age_s(entry),
            gaps: row.gaps,
            out_of_order: row.out_of_order,
            reconnects: row.reconnects,
            mismatches: row.block_size_mismatches,
            lost: row.lost_batches,
            restarts: row.restarts,
            queued: row.queued,
            running: row.running,
            status: Some(self.status(entry, stale_after_ms)),
        }
    }

    /// Header counts: (up, stale, restarted, down). Draining counts as up, removed as down.
    pub(crate) fn worker_counts(&self, stale_after_ms: u64) -> (usize, usize, usize, usize) {
        let mut counts = (0, 0, 0, 0);
        for entry in self.workers.values() {
            match self.status(entry, stale_after_ms) {
                Status::Up | Status::Draining => counts.0 += 1,
                Status::Stale => counts.1 += 1,
                Status::Down | Status::Removed => counts.3 += 1,
            }
            if entry.row.restarts > 0 {
                counts.2 += 1;
            }
        }
        counts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(worker: u64, events: u64) -> WorkerRow {
        WorkerRow {
            key: WorkerKey { worker, dp_rank: 0 },
            events,
            blocks: [events, 0, 0, 0],
            ..WorkerRow::default()
        }
    }

    fn delta(at_ms: u64, delta: Delta) -> TimedUpdate {
        TimedUpdate {
            at_ms,
            update: Update::Delta(delta),
        }
    }

    #[test]
    fn rows_upsert_and_full_replaces_the_set() {
        let mut w = World::new(10);
        w.fold(delta(
            0,
            Delta {
                workers: vec![row(1, 0), row(2, 0)],
                ..Delta::default()
            },
        ));
        w.fold(delta(
            100,
            Delta {
                workers: vec![row(3, 0)],
                ..Delta::default()
            },
        ));
        assert_eq!(w.workers.len(), 3);
        w.fold(delta(
            200,
            Delta {
                full: true,
                workers: vec![row(2, 5)],
                ..Delta::default()
            },
        ));
        assert_eq!(
            w.workers.keys().map(|k| k.worker).collect::<Vec<_>>(),
            vec![2]
        );
        assert_eq!(
            w.workers[&WorkerKey {
                worker: 2,
                dp_rank: 0
            }]
                .first_seen_ms,
            0,
            "kept its history"
        );
        w.fold(delta(
            300,
            Delta {
                removed: vec![WorkerKey {
                    worker: 2,
                    dp_rank: 0,
                }],
                ..Delta::default()
            },
        ));
        assert!(w.workers.is_empty());
    }

    #[test]
    fn last_event_time_follows_growth_and_stale_follows_it() {
        let mut w = World::new(10);
        let key = WorkerKey {
            worker: 1,
            dp_rank: 0,
        };
        w.fold(delta(
            0,
            Delta {
                workers: vec![row(1, 10)],
                ..Delta::default()
            },
        ));
        w.fold(delta(
            1_000,
            Delta {
                workers: vec![row(1, 20)],
                ..Delta::default()
            },
        ));
        w.fold(delta(
            2_000,
            Delta {
                workers: vec![row(1, 20)],
                ..Delta::default()
            },
        ));
        w.tick(2_000);
        let e = &w.workers[&key];
        assert_eq!(e.last_event_ms, Some(1_000));
        assert_eq!(w.age_s(e), Some(1.0));
        assert_eq!(w.status(e, 10_000), Status::Up);
        assert_eq!(w.subject(e, 10_000).events_per_s, 5.0, "10 events over 2 s");
        w.tick(11_000);
        assert_eq!(w.status(&w.workers[&key], 10_000), Status::Stale);
        assert_eq!(w.worker_counts(10_000), (0, 1, 0, 0));
    }

    #[test]
    fn routes_and_notes_are_bounded() {
        let mut w = World::new(10);
        for i in 0..250 {
            w.fold(delta(
                i,
                Delta {
                    routes: vec![RouteRow {
                        seq: i,
                        ..RouteRow::default()
                    }],
                    notes: vec![format!("note {i}")],
                    ..Delta::default()
                },
            ));
        }
        assert_eq!(w.routes.len(), ROUTES_MAX);
        assert_eq!(w.routes.front().unwrap().seq, 50);
        assert_eq!(w.notes.len(), NOTES_MAX);
        assert_eq!(w.routes_seen, 250);
    }

    #[test]
    fn ticks_sample_counter_rates_and_a_seek_back_clears_them() {
        let mut w = World::new(10);
        let counters = |events, lookup, hit| Counters {
            events_applied: events,
            routes: events / 10,
            lookup_blocks: lookup,
            hit_blocks: hit,
            ..Counters::default()
        };
        w.fold(delta(
            0,
            Delta {
                counters: Some(counters(0, 0, 0)),
                ..Delta::default()
            },
        ));
        w.tick(0);
        w.fold(delta(
            1_000,
            Delta {
                counters: Some(counters(500, 100, 25)),
                ..Delta::default()
            },
        ));
        w.tick(1_000);
        let s = w.history.last().unwrap();
        assert_eq!(
            (s.events_per_s, s.routes_per_s, s.hit_ratio),
            (500.0, 50.0, Some(0.25))
        );
        assert_eq!(w.events_rate.rate_per_s(1_000), 500.0);
        w.tick(500);
        assert!(w.history.samples().is_empty());
    }

    #[test]
    fn occupancy_is_over_known_capacity() {
        let mut w = World::new(10);
        let mut a = row(1, 50);
        a.capacity = [Some(100), None, None, None];
        let mut b = row(2, 30);
        b.capacity = [Some(100), None, None, None];
        b.blocks[1] = 7;
        w.fold(delta(
            0,
            Delta {
                workers: vec![a, b],
                ..Delta::default()
            },
        ));
        let (blocks, share) = w.occupancy();
        assert_eq!(blocks, [80, 7, 0, 0]);
        assert_eq!(share, [Some(0.4), None, None, None]);
        assert_eq!(w.capacity(), [Some(200), None, None, None]);
    }
}
