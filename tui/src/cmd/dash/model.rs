//! What the dashboard is fed: every source (a router's stream, an in-process router
//! replica, the simulator, a recording) turns its world into [`TimedUpdate`]s, and the
//! [`super::app::App`] folds them. A recording is these values, one JSON object per line.
//!
//! Owns: [`TimedUpdate`], [`Update`], [`Delta`] and what a delta carries ([`WorkerRow`],
//! [`Counters`], [`RouteRow`], [`LinkRow`], [`SimSignals`], [`SourceStatus`]), and
//! [`Control`] (what a key asks of the source: pause, step, speed, seek).
//! Never: read a clock or a socket, or know which source made a value. Times are
//! milliseconds on the source's own clock (since the dashboard started for live sources,
//! simulated time for the simulator), so the same updates give the same frames.

use serde::{Deserialize, Serialize};

/// Tiers in display order (as `kvtwin::tier::Tier::index`).
pub(crate) const TIER_NAMES: [&str; 4] = ["device", "host", "disk", "remote"];

/// Whether `value` is its type's default: such fields are left out of a recording's
/// lines (read back as the default), which keeps a thousand workers' rows small.
fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

/// The sum of `values`, stopping at `u64::MAX`: figures come from outside (a router,
/// a recording), and no value of theirs may overflow the app.
pub(crate) fn saturating_sum(values: impl IntoIterator<Item = u64>) -> u64 {
    values.into_iter().fold(0, u64::saturating_add)
}

/// A worker rank.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub(crate) struct WorkerKey {
    /// The worker id.
    pub(crate) worker: u64,
    /// The data-parallel rank.
    #[serde(default, skip_serializing_if = "is_default")]
    pub(crate) dp_rank: u32,
}

impl std::fmt::Display for WorkerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.dp_rank == 0 {
            write!(f, "{}", self.worker)
        } else {
            write!(f, "{}:{}", self.worker, self.dp_rank)
        }
    }
}

/// Where a worker stands, as its source knows it. Staleness (no event for a while) is
/// the dashboard's own judgement, not a source's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum WorkerState {
    /// Publishing and routed to.
    #[default]
    Up,
    /// Serving what it has, routed nothing more (simulator).
    Draining,
    /// Crashed (simulator).
    Down,
    /// Left the cluster (simulator).
    Removed,
}

/// One worker rank: the cumulative figures its source knows. `None` is "this source
/// does not know" (a real router knows no capacities or queues).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct WorkerRow {
    /// Which worker rank.
    pub(crate) key: WorkerKey,
    /// Where it stands.
    #[serde(default, skip_serializing_if = "is_default")]
    pub(crate) state: WorkerState,
    /// Blocks held per tier (index: [`TIER_NAMES`]).
    pub(crate) blocks: [u64; 4],
    /// Capacity per tier, where known; `None` for a tier it lacks or a source that
    /// cannot know.
    #[serde(default, skip_serializing_if = "is_default")]
    pub(crate) capacity: [Option<u64>; 4],
    /// KV events applied (router) or published (simulator), cumulative.
    pub(crate) events: u64,
    /// The last event id applied.
    #[serde(default, skip_serializing_if = "is_default")]
    pub(crate) last_event_id: Option<u64>,
    /// Event ids skipped.
    #[serde(default, skip_serializing_if = "is_default")]
    pub(crate) gaps: u64,
    /// Event ids at or below the last one.
    #[serde(default, skip_serializing_if = "is_default")]
    pub(crate) out_of_order: u64,
    /// Times its stream reconnected.
    #[serde(default, skip_serializing_if = "is_default")]
    pub(crate) reconnects: u64,
    /// Batches refused for a block size other than the router's.
    #[serde(default, skip_serializing_if = "is_default")]
    pub(crate) block_size_mismatches: u64,
    /// The block size its events announce while the router refuses it for that (another
    /// size than the router's).
    #[serde(default, skip_serializing_if = "is_default")]
    pub(crate) refused_block_size: Option<u32>,
    /// Batches neither its stream nor replay supplied.
    #[serde(default, skip_serializing_if = "is_default")]
    pub(crate) lost_batches: u64,
    /// Publisher restarts (each cleared what it held).
    #[serde(default, skip_serializing_if = "is_default")]
    pub(crate) restarts: u64,
    /// Requests waiting (simulator).
    #[serde(default, skip_serializing_if = "is_default")]
    pub(crate) queued: Option<u64>,
    /// Requests on it (simulator).
    #[serde(default, skip_serializing_if = "is_default")]
    pub(crate) running: Option<u64>,
    /// Requests routed to it, cumulative (simulator).
    #[serde(default, skip_serializing_if = "is_default")]
    pub(crate) routed: Option<u64>,
    /// Requests it finished, cumulative (simulator, or a router's engine).
    #[serde(default, skip_serializing_if = "is_default")]
    pub(crate) completed: Option<u64>,
    /// Its state is known, not inferred from its events (a router's health checks of its
    /// engine, or the simulator): up without events for a while is idle, not stale.
    #[serde(default, skip_serializing_if = "is_default")]
    pub(crate) checked: bool,
    /// Why it is down, when its source says.
    #[serde(default, skip_serializing_if = "is_default")]
    pub(crate) down_reason: Option<String>,
}

/// Cluster-wide cumulative counters. Rates are the dashboard's: differences over time.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Counters {
    /// Block events applied (router) or published (simulator).
    pub(crate) events_applied: u64,
    /// Event batches received.
    #[serde(default, skip_serializing_if = "is_default")]
    pub(crate) batches: u64,
    /// Gaps in the sources' sequences.
    #[serde(default, skip_serializing_if = "is_default")]
    pub(crate) gaps: u64,
    /// Batches lost for good.
    #[serde(default, skip_serializing_if = "is_default")]
    pub(crate) lost_batches: u64,
    /// Publisher restarts.
    #[serde(default, skip_serializing_if = "is_default")]
    pub(crate) restarts: u64,
    /// Messages, batches or events dropped, all reasons.
    #[serde(default, skip_serializing_if = "is_default")]
    pub(crate) dropped: u64,
    /// Requests routed (route queries, and a front door's requests sent to engines).
    #[serde(default, skip_serializing_if = "is_default")]
    pub(crate) routes: u64,
    /// Prompt blocks looked up (routing queries, or the simulator's served prompts), or
    /// a front door's served prompt tokens.
    #[serde(default, skip_serializing_if = "is_default")]
    pub(crate) lookup_blocks: u64,
    /// Of those, found cached (for a front door, as its engines reported): hit ratio =
    /// `hit_blocks / lookup_blocks`.
    #[serde(default, skip_serializing_if = "is_default")]
    pub(crate) hit_blocks: u64,
    /// 99th percentile time to apply a batch, seconds (router).
    #[serde(default, skip_serializing_if = "is_default")]
    pub(crate) apply_latency_p99_s: Option<f64>,
    /// What a router's front door served (`--engine`).
    #[serde(default, skip_serializing_if = "is_default")]
    pub(crate) serving: Option<ServingSignals>,
}

/// A router's front door: requests and their latencies, as measured by the router.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct ServingSignals {
    /// Engines configured.
    pub(crate) engines: u64,
    /// Of those, up.
    pub(crate) engines_up: u64,
    /// Requests in flight.
    pub(crate) in_flight: u64,
    /// Requests answered in full.
    pub(crate) served: u64,
    /// Requests failed for good (engine errors, refusals before any engine).
    pub(crate) failed: u64,
    /// Requests retried on another engine.
    pub(crate) retried: u64,
    /// Time to first token (streamed requests; bucket bounds).
    pub(crate) ttft: Option<LatencyRow>,
    /// Inter-token latency (streamed requests; bucket bounds).
    pub(crate) itl: Option<LatencyRow>,
}

/// One candidate of a routing decision.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Candidate {
    /// The worker rank.
    pub(crate) key: WorkerKey,
    /// Its overlap with the request per tier, blocks.
    pub(crate) overlap: [u64; 4],
    /// Its load as the router weighed it (cached blocks for a real router, active
    /// blocks for the simulator's cost model).
    pub(crate) load: u64,
    /// Its score (see [`RouteRow::score`]).
    pub(crate) score: f64,
}

/// One routing decision.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct RouteRow {
    /// The source's sequence number of the decision.
    pub(crate) seq: u64,
    /// Full blocks in the request.
    pub(crate) query_blocks: u64,
    /// The chosen worker rank, if any.
    pub(crate) winner: Option<WorkerKey>,
    /// What the score is: "overlap" (higher wins) or "cost" (lower wins).
    pub(crate) score: String,
    /// Every candidate weighed.
    pub(crate) candidates: Vec<Candidate>,
}

/// One link's traffic, cumulative.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct LinkRow {
    /// The worker whose link it is; `None` for a fabric link.
    pub(crate) worker: Option<u64>,
    /// The link's name.
    pub(crate) link: String,
    /// Bytes carried so far.
    pub(crate) bytes: u64,
    /// Busy time over time so far, 0 to 1, where known.
    #[serde(default, skip_serializing_if = "is_default")]
    pub(crate) utilisation: Option<f64>,
}

/// Percentiles of a latency, milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct LatencyRow {
    /// Median.
    pub(crate) p50_ms: f64,
    /// 90th percentile.
    pub(crate) p90_ms: f64,
    /// 99th percentile.
    pub(crate) p99_ms: f64,
}

/// The simulator's own signals.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct SimSignals {
    /// The scenario's name.
    pub(crate) scenario: String,
    /// Simulated seconds so far.
    pub(crate) simulated_s: f64,
    /// Whether the run has finished.
    pub(crate) done: bool,
    /// Play speed: simulated seconds per wall second.
    pub(crate) speed: f64,
    /// Whether play is paused.
    pub(crate) paused: bool,
    /// Requests arrived so far.
    pub(crate) requests_arrived: u64,
    /// Requests finished so far.
    pub(crate) requests_completed: u64,
    /// Requests in flight.
    pub(crate) requests_in_flight: u64,
    /// Requests refused (too large).
    pub(crate) requests_rejected: u64,
    /// Forward passes run.
    pub(crate) passes: u64,
    /// Requests preempted.
    pub(crate) preemptions: u64,
    /// Faults that began.
    pub(crate) faults_applied: u64,
    /// The sliding window the latencies cover, seconds.
    pub(crate) window_s: f64,
    /// Time to first token over the window.
    pub(crate) ttft: LatencyRow,
    /// Time per output token over the window.
    pub(crate) tpot: LatencyRow,
}

/// A change in what the source knows. Rows upsert by key; `full` replaces them all.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct Delta {
    /// The rows are every worker rank there is (rows not given are gone).
    #[serde(default, skip_serializing_if = "is_default")]
    pub(crate) full: bool,
    /// Worker rows that changed.
    #[serde(default, skip_serializing_if = "is_default")]
    pub(crate) workers: Vec<WorkerRow>,
    /// Worker ranks that went away.
    #[serde(default, skip_serializing_if = "is_default")]
    pub(crate) removed: Vec<WorkerKey>,
    /// The counters, when they changed.
    #[serde(default, skip_serializing_if = "is_default")]
    pub(crate) counters: Option<Counters>,
    /// Routing decisions since the last delta, oldest first.
    #[serde(default, skip_serializing_if = "is_default")]
    pub(crate) routes: Vec<RouteRow>,
    /// Decisions the source could not keep for us (its record overran).
    #[serde(default, skip_serializing_if = "is_default")]
    pub(crate) routes_missed: u64,
    /// Every link's traffic, when the source knows links (the whole set each time).
    #[serde(default, skip_serializing_if = "is_default")]
    pub(crate) links: Vec<LinkRow>,
    /// The simulator's signals.
    #[serde(default, skip_serializing_if = "is_default")]
    pub(crate) sim: Option<SimSignals>,
    /// Things that happened (faults, commands), oldest first.
    #[serde(default, skip_serializing_if = "is_default")]
    pub(crate) notes: Vec<String>,
    /// The engines' block size, when the source knows it.
    #[serde(default, skip_serializing_if = "is_default")]
    pub(crate) block_size: Option<u32>,
}

/// The source's connection, for the status line.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct SourceStatus {
    /// Whether data is flowing.
    pub(crate) connected: bool,
    /// What to tell the user ("connected to http://…", "retrying in 4 s: …").
    pub(crate) text: String,
}

/// One thing a source says.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
// Nearly every update is a delta, moved once from the source into the app: boxing it
// would add an allocation to the common case to shrink the rare one.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Update {
    /// What changed.
    Delta(Delta),
    /// How the source is doing.
    Status(SourceStatus),
}

/// An [`Update`] at a time on the source's clock.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct TimedUpdate {
    /// Milliseconds on the source's clock.
    pub(crate) at_ms: u64,
    /// What it says.
    #[serde(flatten)]
    pub(crate) update: Update,
}

/// What a key asks of the source (only the simulator and a replay obey; live sources
/// ignore them).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Control {
    /// Pause (true) or play.
    Pause(bool),
    /// Advance one step while paused.
    Step,
    /// Multiply the play speed by this factor.
    Speed(f64),
    /// Jump this many milliseconds on the source's clock (negative: back).
    Seek(i64),
}
