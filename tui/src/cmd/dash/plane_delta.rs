//! A router's stream message as a dashboard delta: the one translation both live sources
//! share (`--router` reads the messages off `/v1/stream`, a replica makes them with the
//! router's own `StreamCursor`).
//!
//! Owns: [`delta_of_message`].
//! Never: decide what changed (the router's cursor did).

use super::model::{
    saturating_sum, Candidate, Counters, Delta, LatencyRow, RouteRow, ServingSignals, WorkerKey,
    WorkerRow, WorkerState,
};
use kvtwin_plane::service::stream::{Percentiles, StreamMessage, TierCounts};

fn tiers(counts: &TierCounts) -> [u64; 4] {
    [counts.device, counts.host, counts.disk, counts.remote]
}

/// Milliseconds of a router's percentiles, when it has a median.
fn latency(percentiles: &Percentiles) -> Option<LatencyRow> {
    let ms = |s: Option<f64>| s.map_or(f64::NAN, |s| s * 1e3);
    percentiles.p50_s.map(|p50| LatencyRow {
        p50_ms: p50 * 1e3,
        p90_ms: ms(percentiles.p90_s),
        p99_ms: ms(percentiles.p99_s),
    })
}

/// `message` as a delta.
pub(crate) fn delta_of_message(message: &StreamMessage) -> Delta {
    let counters = &message.counters;
    Delta {
        full: message.full,
        workers: message
            .workers
            .iter()
            .map(|row| WorkerRow {
                key: WorkerKey {
                    worker: row.worker,
                    dp_rank: row.dp_rank,
                },
                blocks: tiers(&row.blocks),
                events: row.events,
                last_event_id: row.last_event_id,
                gaps: row.gaps,
                out_of_order: row.out_of_order,
                reconnects: row.reconnects,
                block_size_mismatches: row.block_size_mismatches,
                refused_block_size: row.refused_block_size,
                lost_batches: row.lost_batches,
                restarts: row.restarts,
                state: match row.engine.as_ref().map(|e| e.health.as_str()) {
                    Some("down") => WorkerState::Down,
                    _ => WorkerState::Up,
                },
                checked: row.engine.as_ref().is_some_and(|e| e.health == "up"),
                down_reason: row.engine.as_ref().and_then(|e| e.down_reason.clone()),
                running: row.engine.as_ref().map(|e| e.active_requests),
                routed: row.engine.as_ref().map(|e| e.dispatched),
                completed: row.engine.as_ref().map(|e| e.succeeded),
                ..WorkerRow::default()
            })
            .collect(),
        removed: message
            .removed
            .iter()
            .map(|key| WorkerKey {
                worker: key.worker,
                dp_rank: key.dp_rank,
            })
            .collect(),
        counters: Some(Counters {
            events_applied: counters.events_applied,
            batches: counters.batches,
            // As the rows count them: gaps in a source's batch sequence and in a
            // rank's event ids, each occurrence once.
            gaps: counters.gaps.saturating_add(counters.event_id_gaps),
            lost_batches: counters.lost_batches,
            restarts: counters.restarts,
            dropped: saturating_sum(counters.dropped.values().copied()),
            // A front door's hit ratio is its served requests' (what the engines found
            // cached), not its route queries', which may never have been sent.
            routes: counters
                .routes
                .saturating_add(counters.serving.as_ref().map_or(0, |s| s.dispatched)),
            lookup_blocks: counters
                .serving
                .as_ref()
                .map_or(counters.route_query_blocks, |s| s.prompt_tokens),
            hit_blocks: counters
                .serving
                .as_ref()
                .map_or(counters.route_hit_blocks, |s| s.cached_tokens),
            apply_latency_p99_s: counters.apply_latency_p99_s,
            serving: counters.serving.as_ref().map(|s| ServingSignals {
                engines: s.engines,
                engines_up: s.engines_up,
                in_flight: s.in_flight,
                served: s.succeeded,
                failed: s.failed.saturating_add(s.refused),
                retried: s.retried,
                ttft: latency(&s.ttft),
                itl: latency(&s.itl),
            }),
        }),
        routes: message
            .routes
            .iter()
            .map(|record| RouteRow {
                seq: record.seq,
                query_blocks: record.query_blocks,
                winner: record.winner.map(|key| WorkerKey {
                    worker: key.worker,
                    dp_rank: key.dp_rank,
                }),
                score: "overlap".into(),
                candidates: record
                    .candidates
                    .iter()
                    .map(|candidate| Candidate {
                        key: WorkerKey {
                            worker: candidate.worker,
                            dp_rank: candidate.dp_rank,
                        },
                        overlap: tiers(&candidate.overlap),
                        load: candidate.load,
                        score: candidate.score as f64,
                    })
                    .collect(),
            })
            .collect(),
        routes_missed: message.routes_missed,
        block_size: u32::try_from(message.block_size).ok(),
        ..Delta::default()
    }
}
