//! Property tests: whatever a source sends (any figures, times that go back, rows that
//! come and go), folding it and drawing every view at any size never panics.
//!
//! A router's stream and a recording are untrusted input: the stream client and the
//! recording reader check the syntax, and these tests check that no values inside well
//! formed updates can break the app or the render (overflowing sums, empty sets, NaN
//! speeds, a clock jumping back).

use super::app::{App, AppConfig, SourceKind};
use super::model::{
    Candidate, Counters, Delta, LatencyRow, LinkRow, RouteRow, SimSignals, SourceStatus,
    TimedUpdate, Update, WorkerKey, WorkerRow, WorkerState,
};
use super::ui::render_text;
use crossterm::event::{KeyCode, KeyEvent};
use proptest::prelude::*;

fn any_figure() -> impl Strategy<Value = u64> {
    prop_oneof![0..10u64, any::<u64>(), Just(u64::MAX)]
}

fn any_float() -> impl Strategy<Value = f64> {
    prop_oneof![
        0.0..1e6f64,
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(-1.0),
        Just(f64::MAX)
    ]
}

fn any_key() -> impl Strategy<Value = WorkerKey> {
    (0..6u64, 0..3u32).prop_map(|(worker, dp_rank)| WorkerKey { worker, dp_rank })
}

fn any_row() -> impl Strategy<Value = WorkerRow> {
    (
        any_key(),
        prop::array::uniform4(any_figure()),
        prop::array::uniform4(prop::option::of(any_figure())),
        any_figure(),
        prop::array::uniform4(any_figure()),
        prop::option::of(any_figure()),
        0..4u8,
    )
        .prop_map(
            |(key, blocks, capacity, events, integrity, queued, state)| WorkerRow {
                key,
                state: [
                    WorkerState::Up,
                    WorkerState::Draining,
                    WorkerState::Down,
                    WorkerState::Removed,
                ][usize::from(state)],
                blocks,
                capacity,
                events,
                last_event_id: queued,
                gaps: integrity[0],
                out_of_order: integrity[1],
                reconnects: integrity[2],
                block_size_mismatches: integrity[3],
                refused_block_size: queued.map(|q| q as u32),
                lost_batches: integrity[0],
                restarts: integrity[1],
                queued,
                running: queued,
                routed: queued,
                completed: queued,
                checked: state == 0,
                down_reason: (state == 2).then(|| "connection refused".to_string()),
            },
        )
}

fn any_delta() -> impl Strategy<Value = Delta> {
    (
        any::<bool>(),
        prop::collection::vec(any_row(), 0..6),
        prop::collection::vec(any_key(), 0..3),
        prop::array::uniform4(any_figure()),
        prop::collection::vec(
            (any_key(), prop::array::uniform4(any_figure()), any_float()),
            0..4,
        ),
        prop::collection::vec((any_figure(), any_float()), 0..3),
        prop::option::of((any_float(), any_figure(), any_float())),
    )
        .prop_map(
            |(full, workers, removed, counts, candidates, links, sim)| Delta {
                full,
                workers,
                removed,
                counters: Some(Counters {
                    events_applied: counts[0],
                    routes: counts[1],
                    lookup_blocks: counts[2],
                    hit_blocks: counts[3],
                    apply_latency_p99_s: Some(f64::NAN),
                    ..Counters::default()
                }),
                routes: vec![RouteRow {
                    seq: counts[0],
                    query_blocks: counts[2],
                    winner: candidates.first().map(|c| c.0),
                    score: "cost".into(),
                    candidates: candidates
                        .iter()
                        .map(|(key, overlap, score)| Candidate {
                            key: *key,
                            overlap: *overlap,
                            load: overlap[0],
                            score: *score,
                        })
                        .collect(),
                }],
                routes_missed: counts[1],
                links: links
                    .iter()
                    .map(|(bytes, utilisation)| LinkRow {
                        worker: Some(*bytes % 4),
                        link: "pcie".into(),
                        bytes: *bytes,
                        utilisation: Some(*utilisation),
                    })
                    .collect(),
                sim: sim.map(|(speed, count, latency)| SimSignals {
                    speed,
                    simulated_s: latency,
                    requests_completed: count,
                    requests_arrived: count,
                    ttft: LatencyRow {
                        p50_ms: latency,
                        p90_ms: latency,
                        p99_ms: latency,
                    },
                    ..SimSignals::default()
                }),
                notes: vec!["a note".into()],
                block_size: Some(16),
            },
        )
}

fn any_update() -> impl Strategy<Value = TimedUpdate> {
    (
        prop_oneof![0..100_000u64, any::<u64>()],
        prop_oneof![
            4 => any_delta().prop_map(Update::Delta),
            1 => any::<bool>().prop_map(|connected| Update::Status(SourceStatus {
                connected,
                text: "status".into(),
            })),
        ],
    )
        .prop_map(|(at_ms, update)| TimedUpdate { at_ms, update })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn any_updates_fold_and_every_view_draws_at_any_size(
        updates in prop::collection::vec(any_update(), 1..12),
        kind in 0..4usize,
        width in 1..200u16,
        height in 1..60u16,
    ) {
        let kind = [SourceKind::Router, SourceKind::Replica, SourceKind::Sim, SourceKind::Replay][kind];
        let mut app = App::new(AppConfig::new("test", kind));
        for update in updates {
            let at = update.at_ms;
            app.on_update(update);
            app.on_tick(at.saturating_add(500));
        }
        for key in [KeyCode::Tab, KeyCode::Tab, KeyCode::Tab, KeyCode::Tab, KeyCode::Tab] {
            render_text(&app, width, height);
            app.on_key(KeyEvent::from(KeyCode::Char('s')));
            app.on_key(KeyEvent::from(key));
        }
        app.on_key(KeyEvent::from(KeyCode::Enter));
        render_text(&app, width, height);
    }
}
