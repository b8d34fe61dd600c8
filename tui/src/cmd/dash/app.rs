//! The dashboard's state: the folded [`World`] (live, and a frozen copy while frozen),
//! and what the user chose (view, selection, sort, filter, prompt, help, pause, speed).
//!
//! Owns: [`App`] and its entry points: [`App::on_update`] folds what a source says,
//! [`App::on_tick`] moves the clock and samples the charts, [`App::on_key`] (in
//! `keys.rs`) turns keys into state changes and [`Control`]s for the source.
//! Never: draw (`ui.rs` renders an `&App`), read a clock (time comes in with ticks and
//! updates), or do I/O.

use super::filter::{Filter, Subject};
use super::model::{saturating_sum, TimedUpdate, WorkerKey, TIER_NAMES};
use super::state::World;

#[cfg(doc)]
use super::model::Control;

/// What kind of source feeds the dashboard: it decides what the header and the routes
/// view can promise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SourceKind {
    /// A router's stream: routes, counters, no capacities.
    Router,
    /// An in-process router replica fed by the engines: it listens, it does not route.
    Replica,
    /// The simulator, on simulated time.
    Sim,
    /// A recording, on its recorded time.
    Replay,
}

impl SourceKind {
    /// Its name in the header.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Router => "router",
            Self::Replica => "replica",
            Self::Sim => "sim",
            Self::Replay => "replay",
        }
    }

    /// Whether pause, step, speed and seek mean anything to it.
    pub(crate) fn is_played(self) -> bool {
        matches!(self, Self::Sim | Self::Replay)
    }
}

/// How the dashboard starts.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct AppConfig {
    /// The source's label for the header ("http://router:8000", a scenario path).
    pub(crate) source: String,
    /// What kind of source it is.
    pub(crate) kind: SourceKind,
    /// An up worker with no event for this long is stale, milliseconds.
    pub(crate) stale_after_ms: u64,
    /// The charts' span, seconds (one sample a second).
    pub(crate) history_s: u64,
    /// The play speed a replay starts at (`--speed`).
    pub(crate) speed: f64,
}

impl AppConfig {
    /// `source` of `kind`, with the default stale limit (10 s) and chart span (300 s).
    pub(crate) fn new(source: impl Into<String>, kind: SourceKind) -> Self {
        Self {
            source: source.into(),
            kind,
            stale_after_ms: 10_000,
            history_s: 300,
            speed: 1.0,
        }
    }
}

impl Default for AppConfig {
    fn default() -> Self {
        Self::new("", SourceKind::Router)
    }
}

/// The top-level views, in Tab order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum View {
    /// The worker table.
    Workers,
    /// Rates, hit ratio and occupancy over time.
    Charts,
    /// The last routing decisions.
    Routes,
    /// Per-worker stream health.
    Integrity,
    /// Per-link traffic.
    Transfers,
}

impl View {
    /// Tab order.
    pub(crate) const ALL: [View; 5] = [
        View::Workers,
        View::Charts,
        View::Routes,
        View::Integrity,
        View::Transfers,
    ];

    /// Its name, as in `:name` and the tab bar.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Workers => "workers",
            Self::Charts => "charts",
            Self::Routes => "routes",
            Self::Integrity => "integrity",
            Self::Transfers => "transfers",
        }
    }

    /// The next (`step` 1) or previous (`step` -1) view, wrapping.
    pub(crate) fn cycle(self, step: isize) -> View {
        let at = View::ALL.iter().position(|&v| v == self).unwrap_or(0) as isize;
        View::ALL[(at + step).rem_euclid(View::ALL.len() as isize) as usize]
    }

    /// Whether it lists workers (so filter, sort and drill-in apply).
    pub(crate) fn lists_workers(self) -> bool {
        matches!(self, View::Workers | View::Integrity)
    }
}

/// The worker table's sort columns, in `s` order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SortColumn {
    /// Worker id, then rank.
    Worker,
    /// Status (up first).
    Status,
    /// Blocks, all tiers (or the filter's tier).
    Blocks,
    /// Blocks in one tier (index: [`TIER_NAMES`]).
    Tier(usize),
    /// Events per second.
    Events,
    /// Seconds since the last event.
    Age,
    /// Gaps.
    Gaps,
}

impl SortColumn {
    /// `s` order.
    pub(crate) const ALL: [SortColumn; 10] = [
        SortColumn::Worker,
        SortColumn::Status,
        SortColumn::Blocks,
        SortColumn::Tier(0),
        SortColumn::Tier(1),
        SortColumn::Tier(2),
        SortColumn::Tier(3),
        SortColumn::Events,
        SortColumn::Age,
        SortColumn::Gaps,
    ];

    /// Its name in the footer.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Worker => "worker",
            Self::Status => "status",
            Self::Blocks => "blocks",
            Self::Tier(tier) => TIER_NAMES[tier],
            Self::Events => "events/s",
            Self::Age => "age",
            Self::Gaps => "gaps",
        }
    }

    /// The direction a column starts in: names ascending, figures biggest first.
    fn default_descending(self) -> bool {
        !matches!(self, Self::Worker | Self::Status)
    }
}

/// An open prompt and what has been typed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Prompt {
    /// `/`: a filter.
    Filter(String),
    /// `:`: a command.
    Command(String),
}

/// The dashboard's state. See the module doc.
#[derive(Clone, Debug)]
pub(crate) struct App {
    /// How it was started.
    pub(super) config: AppConfig,
    /// What the updates say now.
    pub(super) live: World,
    /// What the screen shows while frozen: the live world at freeze time.
    pub(super) frozen: Option<World>,
    /// The current view.
    pub(super) view: View,
    /// The worker drilled into, over the view.
    pub(super) detail: Option<WorkerKey>,
    /// The selected row in the current view's list.
    pub(super) selected: usize,
    /// The worker table's sort column.
    pub(super) sort: SortColumn,
    /// Whether it sorts biggest first.
    pub(super) descending: bool,
    /// The applied filter.
    pub(super) filter: Filter,
    /// The open prompt.
    pub(super) prompt: Option<Prompt>,
    /// A message for the status line (an error, a hint), until the next key.
    pub(super) message: Option<String>,
    /// Whether the help overlay is shown.
    pub(super) help: bool,
    /// Whether the user paused the source.
    pub(super) paused: bool,
    /// The play speed factor the user asked for (for a replay; the simulator reports its
    /// own).
    pub(super) speed: f64,
    /// Whether the user asked to quit.
    pub(super) quit: bool,
}

impl App {
    /// A dashboard with nothing folded yet, on the workers view.
    pub(crate) fn new(config: AppConfig) -> App {
        let live = World::new(config.history_s);
        let speed = config.speed;
        App {
            config,
            live,
            frozen: None,
            view: View::Workers,
            detail: None,
            selected: 0,
            sort: SortColumn::Worker,
            descending: false,
            filter: Filter::default(),
            prompt: None,
            message: None,
            help: false,
            paused: false,
            speed,
            quit: false,
        }
    }

    /// Folds what a source said into the live world (also while frozen: unfreezing
    /// shows everything that came meanwhile), and moves the clock to the update's time:
    /// the world is then a function of the updates alone, so a recording replays to the
    /// same frames whatever the speed (played sources tick only this way).
    pub(crate) fn on_update(&mut self, update: TimedUpdate) {
        let at = update.at_ms;
        self.live.fold(update);
        if at >= self.live.now_ms {
            self.live.tick(at);
        }
    }

    /// The same dashboard (view, sort, filter, selection) with nothing folded: a replay
    /// seeking back folds its recording again from the start.
    pub(crate) fn rewound(&self) -> App {
        App {
            live: World::new(self.config.history_s),
            frozen: None,
            ..self.clone()
        }
    }

    /// Moves the clock to `now_ms` on the source's clock and samples the charts once a
    /// second of it. A clock going back (a seek) restarts the charts and rates.
    pub(crate) fn on_tick(&mut self, now_ms: u64) {
        self.live.tick(now_ms);
    }

    /// Whether the user asked to quit.
    pub(crate) fn should_quit(&self) -> bool {
        self.quit
    }

    /// The world on screen: the frozen copy while frozen, else the live one.
    pub(crate) fn world(&self) -> &World {
        self.frozen.as_ref().unwrap_or(&self.live)
    }

    /// Whether the screen is frozen.
    pub(crate) fn is_frozen(&self) -> bool {
        self.frozen.is_some()
    }

    /// Freezes the screen on the live world as it is, or unfreezes to live.
    pub(crate) fn toggle_freeze(&mut self) {
        self.frozen = match self.frozen.take() {
            Some(_) => None,
            None => Some(self.live.clone()),
        };
    }

    /// The on-screen workers that pass the filter, in sort order (ties by key), with
    /// their figures. The table draws only the visible slice of it.
    pub(crate) fn rows(&self) -> Vec<Subject> {
        let world = self.world();
        let stale = self.config.stale_after_ms;
        let mut rows: Vec<Subject> = world
            .workers
            .values()
            .map(|entry| world.subject(entry, stale))
            .filter(|subject| self.filter.matches(subject))
            .collect();
        let tier = self.filter.tier();
        let blocks = |s: &Subject| match tier {
            Some(tier) => s.blocks[tier],
            None => saturating_sum(s.blocks),
        };
        let by = |a: &Subject, b: &Subject| match self.sort {
            SortColumn::Worker => a.key.cmp(&b.key),
            SortColumn::Status => a.status.cmp(&b.status),
            SortColumn::Blocks => blocks(a).cmp(&blocks(b)),
            SortColumn::Tier(t) => a.blocks[t].cmp(&b.blocks[t]),
            SortColumn::Events => a.events_per_s.total_cmp(&b.events_per_s),
            // A worker with no event yet is the oldest.
            SortColumn::Age => a
                .age_s
                .unwrap_or(f64::INFINITY)
                .total_cmp(&b.age_s.unwrap_or(f64::INFINITY)),
            SortColumn::Gaps => a.gaps.cmp(&b.gaps),
        };
        rows.sort_by(|a, b| {
            let order = by(a, b);
            let order = if self.descending {
                order.reverse()
            } else {
                order
            };
            order.then(a.key.cmp(&b.key))
        });
        rows
    }

    /// How many rows the current view's list has (for moving the selection).
    pub(crate) fn list_len(&self) -> usize {
        if self.detail.is_some() {
            return 0;
        }
        match self.view {
            View::Workers | View::Integrity => self.rows().len(),
            View::Routes => self.world().routes.len(),
            View::Transfers => self.world().links.len(),
            View::Charts => 0,
        }
    }

    /// The selection, clamped to the list.
    pub(crate) fn selected(&self, len: usize) -> usize {
        self.selected.min(len.saturating_sub(1))
    }

    /// Cycles the sort column, each starting in its natural direction.
    pub(crate) fn cycle_sort(&mut self) {
        let at = SortColumn::ALL
            .iter()
            .position(|&c| c == self.sort)
            .unwrap_or(0);
        self.sort = SortColumn::ALL[(at + 1) % SortColumn::ALL.len()];
        self.descending = self.sort.default_descending();
    }

    /// Sets the filter from `text`; on a parse error keeps the old one and says why.
    pub(crate) fn apply_filter(&mut self, text: &str) {
        match Filter::parse(text) {
            Ok(filter) => {
                self.filter = filter;
                self.selected = 0;
            }
            Err(err) => self.message = Some(format!("filter not applied: {err}")),
        }
    }
}
