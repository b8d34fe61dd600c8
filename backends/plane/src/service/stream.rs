//! The router's change stream: what `GET /v1/stream` sends and what a dashboard reads,
//! whether from a router over HTTP or from a [`RouterState`] of its own.
//!
//! Owns: the message types ([`StreamMessage`], [`WorkerRow`], [`StreamCounters`],
//! [`RouteRecord`], [`RouteCandidate`], [`WorkerKey`], [`TierCounts`]; one definition,
//! serialized by the server and deserialized by clients) and [`StreamCursor`], which turns
//! a state into a full snapshot once and deltas after.
//!
//! Invariants: a reader that applies every message in order (a `full` one replaces its
//! whole table; otherwise rows replace rows by key, `removed` deletes keys) holds the
//! state's rows as of that message's `seq`. A cursor's work per call is one scan of the
//! rows plus the routes it hands out: O(workers), independent of events applied.
//! Never: lock anything (callers hold the state's lock for one `next`), or serialize
//! (callers do, outside the lock).
//!
//! Deserialization ignores unknown fields, so a dashboard keeps working against a newer
//! router that adds some.

use super::state::{EngineHealth, EngineSummary, RouterState, WorkerSummary};
use kvtwin::ids::{WorkerId, WorkerWithDpRank};
use kvtwin::tier::Tier;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A worker rank as the stream names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct WorkerKey {
    /// The worker id.
    pub worker: u64,
    /// Its data-parallel rank.
    pub dp_rank: u32,
}

impl From<WorkerWithDpRank> for WorkerKey {
    fn from(key: WorkerWithDpRank) -> Self {
        Self {
            worker: key.worker.get(),
            dp_rank: key.dp_rank,
        }
    }
}

impl From<WorkerKey> for WorkerWithDpRank {
    fn from(key: WorkerKey) -> Self {
        Self {
            worker: WorkerId::new(key.worker),
            dp_rank: key.dp_rank,
        }
    }
}

/// A count per tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TierCounts {
    /// `Tier::Device` (G1).
    pub device: u64,
    /// `Tier::Host` (G2).
    pub host: u64,
    /// `Tier::Disk` (G3).
    pub disk: u64,
    /// `Tier::Remote` (G4).
    pub remote: u64,
}

impl TierCounts {
    /// From counts indexed by `Tier::index`.
    pub fn from_array(counts: [u64; 4]) -> Self {
        Self {
            device: counts[Tier::Device.index()],
            host: counts[Tier::Host.index()],
            disk: counts[Tier::Disk.index()],
            remote: counts[Tier::Remote.index()],
        }
    }

    /// All tiers together.
    pub fn total(&self) -> u64 {
        self.device + self.host + self.disk + self.remote
    }
}

/// One worker rank's row: blocks and stream integrity (see `WorkerIntegrity`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerRow {
    /// The worker id.
    pub worker: u64,
    /// Its data-parallel rank.
    pub dp_rank: u32,
    /// Blocks held per tier.
    pub blocks: TierCounts,
    /// The highest event id seen since its last restart.
    pub last_event_id: Option<u64>,
    /// Events applied whole.
    pub events: u64,
    /// Gap occurrences (event ids skipped, or its source's sequence skipping).
    pub gaps: u64,
    /// Events at or below the last id.
    pub out_of_order: u64,
    /// Reconnects of its source.
    pub reconnects: u64,
    /// Batches refused for another block size.
    pub block_size_mismatches: u64,
    /// Batches lost for good.
    pub lost_batches: u64,
    /// Publisher restarts that cleared it.
    pub restarts: u64,
    /// Its messages, batches or events refused, every reason.
    pub dropped: u64,
    /// The block size its events announce while the router refuses them for it (another
    /// size than the router's); absent while it is usable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused_block_size: Option<u32>,
    /// Its engine, when the router fronts it (`--engine`): health, load and what it
    /// served. Absent for a worker known only by its events.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<EngineRow>,
}

impl WorkerRow {
    /// The row of a state's worker summary.
    pub fn from_summary(summary: &WorkerSummary) -> Self {
        let integrity = summary.integrity;
        Self {
            worker: summary.key.worker.get(),
            dp_rank: summary.key.dp_rank,
            blocks: TierCounts::from_array(summary.blocks),
            last_event_id: summary.last_event_id,
            events: integrity.events,
            gaps: integrity.gaps,
            out_of_order: integrity.out_of_order,
            reconnects: integrity.reconnects,
            block_size_mismatches: integrity.block_size_mismatches,
            lost_batches: integrity.lost_batches,
            restarts: integrity.restarts,
            dropped: integrity.dropped,
            refused_block_size: summary.refused_block_size,
            engine: None,
        }
    }

    /// The row of `summary` in `state`, with its engine's figures when it is one.
    pub fn of(summary: &WorkerSummary, state: &RouterState) -> Self {
        let mut row = Self::from_summary(summary);
        if summary.key.dp_rank == 0 {
            row.engine = state
                .serving()
                .engine(summary.key.worker)
                .map(|engine| EngineRow::of(&engine));
        }
        row
    }

    /// Its key.
    pub fn key(&self) -> WorkerKey {
        WorkerKey {
            worker: self.worker,
            dp_rank: self.dp_rank,
        }
    }
}

/// A fronted engine's figures in its worker's row.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EngineRow {
    /// `up`, `down` or `unknown` (not yet checked).
    pub health: String,
    /// Why it is down.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub down_reason: Option<String>,
    /// Requests running there.
    pub active_requests: u64,
    /// Blocks of those.
    pub active_blocks: u64,
    /// Requests sent there (each try).
    pub dispatched: u64,
    /// Requests it answered in full.
    pub succeeded: u64,
    /// Requests that failed there for good.
    pub failed: u64,
    /// Prompt tokens it served.
    pub prompt_tokens: u64,
    /// Of those, tokens it found cached.
    pub cached_tokens: u64,
}

impl EngineRow {
    /// The row of an engine's summary.
    pub fn of(engine: &EngineSummary) -> Self {
        Self {
            health: engine.health.name().to_string(),
            down_reason: match &engine.health {
                EngineHealth::Down { reason } => Some(reason.clone()),
                _ => None,
            },
            active_requests: engine.active_requests,
            active_blocks: engine.active_blocks,
            dispatched: engine.stats.dispatched,
            succeeded: engine.stats.succeeded,
            failed: engine.stats.failed_total(),
            prompt_tokens: engine.stats.prompt_tokens,
            cached_tokens: engine.stats.cached_tokens,
        }
    }
}

/// Percentile upper bounds of a latency histogram, seconds (bucket bounds, as
/// Prometheus' `histogram_quantile` reads them); `None` with no observation or above the
/// last bucket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Percentiles {
    /// Median.
    pub p50_s: Option<f64>,
    /// 90th percentile.
    pub p90_s: Option<f64>,
    /// 99th percentile.
    pub p99_s: Option<f64>,
}

impl Percentiles {
    fn of(histogram: &crate::service::metrics::Histogram) -> Self {
        let at = |q| histogram.quantile_seconds(q).filter(|s| s.is_finite());
        Self {
            p50_s: at(0.5),
            p90_s: at(0.9),
            p99_s: at(0.99),
        }
    }
}

/// What the front door served, all engines: requests, tokens, latencies.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ServingCounters {
    /// Engines configured.
    pub engines: u64,
    /// Of those, up.
    pub engines_up: u64,
    /// Requests in flight.
    pub in_flight: u64,
    /// Requests sent to engines (each try).
    pub dispatched: u64,
    /// Requests answered in full.
    pub succeeded: u64,
    /// Requests that failed for good on an engine.
    pub failed: u64,
    /// Requests retried on another engine.
    pub retried: u64,
    /// Requests refused before any engine.
    pub refused: u64,
    /// Prompt tokens served.
    pub prompt_tokens: u64,
    /// Of those, cached at their engine (its own report): the served hit ratio.
    pub cached_tokens: u64,
    /// Of those, predicted cached by the router at dispatch.
    pub predicted_cached_tokens: u64,
    /// Output tokens served.
    pub generation_tokens: u64,
    /// Time to first token (streamed requests).
    pub ttft: Percentiles,
    /// Inter-token latency (streamed requests).
    pub itl: Percentiles,
    /// End to end.
    pub e2e: Percentiles,
}

impl ServingCounters {
    /// The front door's figures of `state`, if it fronts engines.
    pub fn of(state: &RouterState) -> Option<Self> {
        let serving = state.serving();
        if !serving.has_engines() {
            return None;
        }
        let totals = serving.totals();
        Some(Self {
            engines: serving.engine_urls().len() as u64,
            engines_up: serving.engines_up() as u64,
            in_flight: serving.inflight() as u64,
            dispatched: totals.dispatched,
            succeeded: totals.succeeded,
            failed: totals.failed_total(),
            retried: totals.retried,
            refused: serving.refused().values().sum(),
            prompt_tokens: totals.prompt_tokens,
            cached_tokens: totals.cached_tokens,
            predicted_cached_tokens: totals.predicted_cached_tokens,
            generation_tokens: totals.generation_tokens,
            ttft: Percentiles::of(&totals.ttft),
            itl: Percentiles::of(&totals.itl),
            e2e: Percentiles::of(&totals.e2e),
        })
    }
}

/// The router's global counters (the `Metrics`, plus the index's sizes).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamCounters {
    /// Events applied to the index.
    pub events_applied: u64,
    /// Batches received from the sources (each timed in the apply latency).
    pub batches: u64,
    /// Gaps in the sources' sequences.
    pub gaps: u64,
    /// Events whose id skipped ahead of their rank's last one (the index's count).
    pub event_id_gaps: u64,
    /// Batches recovered through replay.
    pub replayed: u64,
    /// Batches lost for good.
    pub lost_batches: u64,
    /// Publisher restarts.
    pub restarts: u64,
    /// Source reconnects.
    pub reconnects: u64,
    /// Things refused, by reason.
    pub dropped: BTreeMap<String, u64>,
    /// Route decisions.
    pub routes: u64,
    /// Full blocks in their queries.
    pub route_query_blocks: u64,
    /// Of those, blocks the chosen worker held; hit ratio = this / `route_query_blocks`.
    pub route_hit_blocks: u64,
    /// Upper estimate (a bucket bound) of the 99th percentile time to apply a batch,
    /// seconds; `null` with no batch yet, or when it is above the histogram's last
    /// bound (25 ms: `batches` > 0 tells the two apart).
    pub apply_latency_p99_s: Option<f64>,
    /// (worker, block) pairs in the index.
    pub index_pairs: u64,
    /// What the front door served, when the router fronts engines.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serving: Option<ServingCounters>,
}

impl StreamCounters {
    /// The counters of `state` now.
    pub fn of(state: &RouterState) -> Self {
        let metrics = state.metrics();
        Self {
            events_applied: metrics.events_applied,
            batches: metrics.batches,
            gaps: metrics.gaps,
            event_id_gaps: state.indexer().stats().event_id_gaps,
            replayed: metrics.replayed,
            lost_batches: metrics.lost_batches,
            restarts: metrics.restarts,
            reconnects: metrics.reconnects,
            dropped: metrics
                .dropped()
                .iter()
                .map(|(reason, count)| ((*reason).to_string(), *count))
                .collect(),
            routes: metrics.routes,
            route_query_blocks: metrics.route_query_blocks,
            route_hit_blocks: metrics.route_hit_blocks,
            apply_latency_p99_s: metrics
                .apply_latency
                .quantile_seconds(0.99)
                .filter(|p99| p99.is_finite()),
            index_pairs: state.indexer().pairs() as u64,
            serving: ServingCounters::of(state),
        }
    }
}

/// One candidate of a route decision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteCandidate {
    /// The worker id.
    pub worker: u64,
    /// Its data-parallel rank.
    pub dp_rank: u32,
    /// Its overlap with the query, by the fastest tier holding each block.
    pub overlap: TierCounts,
    /// Blocks it held in all (the tie-break prefers fewer).
    pub load: u64,
    /// Its overlap in blocks, all tiers (the longest wins).
    pub score: u64,
    /// The query's leading blocks a shared store holds beyond its overlap (credited by
    /// the scheduler at the shared credit); absent when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub shared: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// One answered route.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteRecord {
    /// Its sequence number: 1, 2, 3, ... per router.
    pub seq: u64,
    /// Full blocks in the query.
    pub query_blocks: u64,
    /// The chosen worker rank, `null` when none was known.
    pub winner: Option<WorkerKey>,
    /// Every worker rank with an overlap, plus the winner, in key order.
    pub candidates: Vec<RouteCandidate>,
}

/// One message of the stream; see the module documentation for how to apply it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct StreamMessage {
    /// The state's change sequence this message brings a reader up to.
    pub seq: u64,
    /// Whether `workers` is every row (replace the table) rather than those changed.
    pub full: bool,
    /// The router's block size, tokens (0 while it is still to be learned).
    pub block_size: u64,
    /// Rows, in key order: all (`full`) or those changed since the last message.
    pub workers: Vec<WorkerRow>,
    /// Rows gone since the last message (empty when `full`).
    pub removed: Vec<WorkerKey>,
    /// The counters now.
    pub counters: StreamCounters,
    /// Route decisions since the last message, oldest first (the first message: those
    /// the router still keeps).
    pub routes: Vec<RouteRecord>,
    /// Route decisions since the last message no longer kept (the ring of 256 overran).
    pub routes_missed: u64,
}

/// Where a reader is in a state's changes: hands out a full snapshot first, then deltas.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamCursor {
    /// The change sequence last handed out; `None` before the first message.
    seq: Option<u64>,
    /// The last route sequence handed out.
    route_seq: u64,
}

impl StreamCursor {
    /// A cursor that has seen nothing: its first message is full.
    pub fn new() -> Self {
        Self::default()
    }

    /// What changed in `state` since the last call: everything (`full`) the first time,
    /// or when removals this cursor missed were pruned; otherwise the rows changed,
    /// rows removed, counters and new route records; `None` when nothing changed.
    pub fn next(&mut self, state: &RouterState) -> Option<StreamMessage> {
        let now = state.change_seq();
        if self.seq == Some(now) {
            return None;
        }
        let delta = self
            .seq
            .and_then(|after| Some((after, state.removed_since(after)?)));
        let (full, workers, removed) = match delta {
            Some((after, removed)) => (false, state.workers_changed_since(after), removed),
            None => (true, state.workers(), Vec::new()),
        };
        let (routes, missed) = state.routes_since(self.route_seq);
        let message = StreamMessage {
            seq: now,
            full,
            // 0 while a router without --block-size has not learned it yet.
            block_size: state.block_size().map_or(0, |size| size as u64),
            workers: workers
                .iter()
                .map(|row| WorkerRow::of(row, state))
                .collect(),
            removed: removed.into_iter().map(WorkerKey::from).collect(),
            counters: StreamCounters::of(state),
            routes,
            // A first message is a snapshot: nothing was promised before it.
            routes_missed: if self.seq.is_some() { missed } else { 0 },
        };
        self.seq = Some(now);
        self.route_seq = state.route_seq();
        Some(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::WorkerEvent;
    use kvtwin::ids::LocalBlockHash;

    fn stored(
        worker: u64,
        event_id: u64,
        parent: Option<u64>,
        blocks: &[(u64, u64)],
    ) -> WorkerEvent {
        crate::wire::worker::stored_event(worker, event_id, parent, blocks, Tier::Device)
    }

    fn keys(message: &StreamMessage) -> Vec<u64> {
        message.workers.iter().map(|row| row.worker).collect()
    }

    #[test]
    fn the_first_message_is_full_then_only_changed_rows_and_none_when_idle() {
        let mut state = RouterState::new(4);
        state.apply_batch(&[
            stored(1, 0, None, &[(0x1, 10)]),
            stored(2, 0, None, &[(0x2, 20)]),
        ]);
        let mut cursor = StreamCursor::new();
        let first = cursor.next(&state).unwrap();
        assert!(first.full);
        assert_eq!(keys(&first), [1, 2]);
        assert_eq!(first.workers[0].blocks.device, 1);
        assert_eq!(first.counters.events_applied, 2);
        assert_eq!(first.block_size, 4);
        assert_eq!(cursor.next(&state), None);

        state.apply_batch(&[stored(2, 1, Some(0x2), &[(0x3, 30)])]);
        let delta = cursor.next(&state).unwrap();
        assert!(!delta.full);
        assert_eq!(keys(&delta), [2]);
        assert_eq!(delta.workers[0].blocks.device, 2);
        assert_eq!(delta.workers[0].last_event_id, Some(1));
        assert_eq!(delta.seq, state.change_seq());
        assert_eq!(cursor.next(&state), None);

        // Counters alone changing still makes a message, with no rows.
        state.drop_one("bad_json");
        let counters = cursor.next(&state).unwrap();
        assert!(counters.workers.is_empty());
        assert_eq!(counters.counters.dropped.get("bad_json"), Some(&1));

        // The message survives JSON both ways.
        let json = serde_json::to_string(&delta).unwrap();
        assert_eq!(serde_json::from_str::<StreamMessage>(&json).unwrap(), delta);
    }

    #[test]
    fn removed_rows_are_reported_once_and_pruned_removals_force_a_full_message() {
        let mut state = RouterState::new(4);
        state.apply_batch(&[
            stored(1, 0, None, &[(0x1, 10)]),
            stored(2, 0, None, &[(0x2, 20)]),
        ]);
        let mut cursor = StreamCursor::new();
        cursor.next(&state).unwrap();
        let key = WorkerWithDpRank {
            worker: WorkerId::new(1),
            dp_rank: 0,
        };
        assert!(state.forget_rank(key));
        assert!(!state.forget_rank(key));
        let delta = cursor.next(&state).unwrap();
        assert!(!delta.full);
        assert!(delta.workers.is_empty());
        assert_eq!(
            delta.removed,
            [WorkerKey {
                worker: 1,
                dp_rank: 0
            }]
        );
        assert_eq!(cursor.next(&state), None);

        // A cursor left behind while more removals than are kept happen starts over.
        let mut behind = StreamCursor::new();
        behind.next(&state).unwrap();
        for worker in 10..(10 + crate::service::state::REMOVALS_KEPT as u64 + 2) {
            state.apply_batch(&[stored(worker, 0, None, &[(worker, worker)])]);
            state.forget_rank(WorkerWithDpRank {
                worker: WorkerId::new(worker),
                dp_rank: 0,
            });
        }
        let again = behind.next(&state).unwrap();
        assert!(again.full);
        assert_eq!(keys(&again), [2]);
        assert!(again.removed.is_empty());
    }

    #[test]
    fn route_records_arrive_once_and_an_overrun_ring_says_how_many_were_missed() {
        let mut state = RouterState::new(4);
        state.apply_batch(&[
            stored(1, 0, None, &[(0x1, 10), (0x2, 20)]),
            stored(2, 0, None, &[(0x3, 10)]),
        ]);
        let mut cursor = StreamCursor::new();
        cursor.next(&state).unwrap();
        let query: Vec<LocalBlockHash> = [10, 20, 30].map(LocalBlockHash::new).to_vec();
        let answer = state.route(&query);
        assert_eq!(state.record_route(&answer), 1);
        let delta = cursor.next(&state).unwrap();
        assert_eq!(delta.routes_missed, 0);
        let record = &delta.routes[0];
        assert_eq!(record.seq, 1);
        assert_eq!(record.query_blocks, 3);
        assert_eq!(
            record.winner,
            Some(WorkerKey {
                worker: 1,
                dp_rank: 0
            })
        );
        let scores: Vec<(u64, u64, u64)> = record
            .candidates
            .iter()
            .map(|c| (c.worker, c.score, c.load))
            .collect();
        assert_eq!(scores, [(1, 2, 2), (2, 1, 1)]);
        assert_eq!(record.candidates[0].overlap.device, 2);
        assert_eq!(delta.counters.routes, 1);
        assert_eq!(delta.counters.route_query_blocks, 3);
        assert_eq!(delta.counters.route_hit_blocks, 2);

        let total = crate::service::state::ROUTE_RECORDS_KEPT as u64 + 10;
        for _ in 0..total {
            state.record_route(&answer);
        }
        let overrun = cursor.next(&state).unwrap();
        assert_eq!(
            overrun.routes.len(),
            crate::service::state::ROUTE_RECORDS_KEPT
        );
        assert_eq!(overrun.routes_missed, 10);
        assert_eq!(overrun.routes.last().unwrap().seq, total + 1);
        assert_eq!(cursor.next(&state), None);
    }
}
