//! A router's stream message as a dashboard delta: the one translation both live sources
//! share (`--router` reads the messages off `/v1/stream`, a replica makes them with the
//! router's own `StreamCursor`).
//!
//! Owns: [`delta_of_message`].
//! Never: decide what changed (the router's cursor did).

use super::model::{saturating_sum, Candidate, Counters, Delta, RouteRow, WorkerKey, WorkerRow};
use kvtwin_plane::service::stream::{StreamMessage, TierCounts};

fn tiers(counts: &TierCounts) -> [u64; 4] {
    [counts.device, counts.host, counts.disk, counts.remote]
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
            routes: counters.routes,
            lookup_blocks: counters.route_query_blocks,
            hit_blocks: counters.route_hit_blocks,
            apply_latency_p99_s: counters.apply_latency_p99_s,
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
