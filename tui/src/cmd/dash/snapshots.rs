//! Screen snapshots: a deterministic fixture (12 workers, some stale, some with gaps, a
//! restart, a drain and a crash; route decisions; links; simulator signals) folded on an
//! injected clock, rendered through `TestBackend` at 80×24 and 160×48 for every view.
//!
//! Owns: the fixture and the snapshot tests (`snapshots/*.snap`, reviewed by eye).
//! Never: read a clock or depend on anything but the updates it builds.

use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

use super::app::{App, AppConfig, SourceKind, View};
use super::model::{
    Candidate, Counters, Delta, LatencyRow, LinkRow, RouteRow, SimSignals, SourceStatus,
    TimedUpdate, Update, WorkerKey, WorkerRow, WorkerState,
};
use super::ui::render_text;

/// Seconds of source time the fixture plays.
const FIXTURE_S: u64 = 30;

fn key_of(worker: u64) -> WorkerKey {
    // Worker 4 runs two data-parallel ranks' worth of keys: show one as `4:1`.
    WorkerKey {
        worker,
        dp_rank: u32::from(worker == 4),
    }
}

/// Worker `w`'s row at second `t`.
fn worker_row(w: u64, t: u64, capacity: bool) -> WorkerRow {
    // Workers 10 and 11 stop publishing after 5 s: stale (10) and crashed (11).
    let active_s = if w >= 10 { t.min(5) } else { t };
    let events = active_s * (20 + w * 7);
    let device = (300 + w * 97 + t * 11) % 2_000;
    let host = if w.is_multiple_of(3) {
        0
    } else {
        1_000 + w * 250 + t * 5
    };
    let disk = if w % 4 == 1 { 4_000 + w * 100 } else { 0 };
    WorkerRow {
        key: key_of(w),
        state: match w {
            9 => WorkerState::Draining,
            11 if t > 5 => WorkerState::Down,
            _ => WorkerState::Up,
        },
        blocks: [device, host, disk, 0],
        capacity: if capacity {
            [Some(2_000), Some(8_000), Some(16_000), None]
        } else {
            [None; 4]
        },
        events,
        last_event_id: Some(events / 3),
        gaps: if w == 3 { 2 } else { 0 },
        out_of_order: if w == 6 { 1 } else { 0 },
        reconnects: if w == 3 { 1 } else { 0 },
        block_size_mismatches: 0,
        refused_block_size: None,
        lost_batches: if w == 3 && t > 10 { 1 } else { 0 },
        restarts: if w == 7 { 1 } else { 0 },
        queued: capacity.then_some(w % 4),
        running: capacity.then_some(8 + w % 5),
        routed: capacity.then_some(t * 3 + w),
        completed: capacity.then_some(t * 3),
        ..WorkerRow::default()
    }
}

/// Two decisions at second `t`, three candidates each, the cost model's.
fn route_rows(t: u64) -> Vec<RouteRow> {
    (0..2)
        .map(|i| {
            let seq = t * 2 + i;
            let candidates: Vec<Candidate> = (0..3)
                .map(|c| {
                    let w = (seq + c * 4) % 9;
                    Candidate {
                        key: key_of(w),
                        overlap: [(seq * 3 + c * 5) % 17, (c * 7 + seq) % 11, 0, 0],
                        load: 100 + (w * 37 + seq) % 400,
                        score: ((seq * 13 + c * 29) % 100) as f64 / 10.0,
                    }
                })
                .collect();
            let winner = candidates
                .iter()
                .min_by(|a, b| a.score.total_cmp(&b.score))
                .map(|c| c.key);
            RouteRow {
                seq,
                query_blocks: 16 + seq % 24,
                winner,
                score: "cost".into(),
                candidates,
            }
        })
        .collect()
}

/// The fixture: a simulator source played for [`FIXTURE_S`] seconds, ticked each second.
fn fixture(kind: SourceKind, workers: u64) -> App {
    let sim = kind == SourceKind::Sim;
    let mut app = App::new(AppConfig::new("scenarios/fixture.ron", kind));
    app.on_update(TimedUpdate {
        at_ms: 0,
        update: Update::Status(SourceStatus {
            connected: true,
            text: "simulating fixture, seed 7".into(),
        }),
    });
    for t in 0..=FIXTURE_S {
        let rows: Vec<WorkerRow> = (0..workers).map(|w| worker_row(w, t, sim)).collect();
        let events = rows.iter().map(|r| r.events).sum();
        let lookup = t * 400;
        let delta = Delta {
            full: t == 0,
            workers: rows,
            counters: Some(Counters {
                events_applied: events,
                batches: events / 8,
                gaps: 2,
                lost_batches: u64::from(t > 10),
                restarts: 1,
                dropped: 3,
                routes: t * 2,
                lookup_blocks: lookup,
                // Cumulative, so it only grows: the per-second ratio wanders around 55%.
                hit_blocks: lookup * 55 / 100 + t * t,
                apply_latency_p99_s: (!sim).then_some(0.00042),
                serving: None,
            }),
            routes: if kind == SourceKind::Replica {
                Vec::new()
            } else {
                route_rows(t)
            },
            links: if sim {
                let mut links: Vec<LinkRow> = (0..3)
                    .map(|w| LinkRow {
                        worker: Some(w),
                        link: "device-host pcie".into(),
                        bytes: t * (w + 1) * 48 * 1024 * 1024,
                        utilisation: Some(0.1 * (w + 1) as f64),
                    })
                    .collect();
                links.push(LinkRow {
                    worker: None,
                    link: "rdma fabric".into(),
                    bytes: (t * 3) << 30,
                    utilisation: Some(0.72),
                });
                links
            } else {
                Vec::new()
            },
            sim: sim.then(|| SimSignals {
                scenario: "fixture".into(),
                simulated_s: t as f64,
                speed: 4.0,
                requests_arrived: t * 10,
                requests_completed: t * 9,
                requests_in_flight: 12,
                passes: t * 50,
                window_s: 10.0,
                ttft: LatencyRow {
                    p50_ms: 38.0,
                    p90_ms: 80.0,
                    p99_ms: 141.0,
                },
                tpot: LatencyRow {
                    p50_ms: 7.5,
                    p90_ms: 9.0,
                    p99_ms: 12.25,
                },
                ..SimSignals::default()
            }),
            notes: match t {
                5 => vec!["crash worker 11".into()],
                12 => vec!["slow_link rdma fabric ×0.5".into()],
                _ => Vec::new(),
            },
            block_size: Some(16),
            ..Delta::default()
        };
        app.on_update(TimedUpdate {
            at_ms: t * 1_000,
            update: Update::Delta(delta),
        });
        app.on_tick(t * 1_000);
    }
    app
}

fn press(app: &mut App, code: KeyCode) {
    app.on_key(KeyEvent::new(code, KeyModifiers::NONE));
}

fn show(app: &mut App, view: View) {
    press(app, KeyCode::Char(':'));
    for c in view.name().chars() {
        press(app, KeyCode::Char(c));
    }
    press(app, KeyCode::Enter);
}

fn snap(name: &str, app: &App) {
    insta::assert_snapshot!(format!("{name}_80x24"), render_text(app, 80, 24));
    insta::assert_snapshot!(format!("{name}_160x48"), render_text(app, 160, 48));
}

#[test]
fn every_view_at_both_sizes() {
    for view in View::ALL {
        let mut app = fixture(SourceKind::Sim, 12);
        show(&mut app, view);
        snap(&format!("sim_{}", view.name()), &app);
    }
}

#[test]
fn router_source_without_capacities() {
    let mut app = fixture(SourceKind::Router, 12);
    snap("router_workers", &app);
    show(&mut app, View::Transfers);
    snap("router_transfers", &app);
}

#[test]
fn replica_says_it_does_not_route() {
    let mut app = fixture(SourceKind::Replica, 12);
    show(&mut app, View::Routes);
    assert!(
        render_text(&app, 80, 24).contains("this source does not route (a replica only listens)")
    );
}

#[test]
fn drill_in_help_filter_and_sort() {
    let mut app = fixture(SourceKind::Sim, 12);
    press(&mut app, KeyCode::Down);
    press(&mut app, KeyCode::Down);
    press(&mut app, KeyCode::Down);
    press(&mut app, KeyCode::Enter);
    snap("sim_detail", &app);
    press(&mut app, KeyCode::Esc);
    press(&mut app, KeyCode::Char('?'));
    snap("sim_help", &app);
    press(&mut app, KeyCode::Esc);
    press(&mut app, KeyCode::Char('/'));
    for c in "tier=host blocks>3000".chars() {
        press(&mut app, KeyCode::Char(c));
    }
    press(&mut app, KeyCode::Enter);
    press(&mut app, KeyCode::Char('s'));
    press(&mut app, KeyCode::Char('s'));
    press(&mut app, KeyCode::Char(' '));
    snap("sim_filtered_sorted_frozen", &app);
    press(&mut app, KeyCode::Char('/'));
    for c in " gaps>x".chars() {
        press(&mut app, KeyCode::Char(c));
    }
    press(&mut app, KeyCode::Enter);
    insta::assert_snapshot!("sim_filter_error_80x24", render_text(&app, 80, 24));
    press(&mut app, KeyCode::Char('/'));
    press(&mut app, KeyCode::Char(' '));
    press(&mut app, KeyCode::Char('g'));
    insta::assert_snapshot!("sim_filter_prompt_80x24", render_text(&app, 80, 24));
}

#[test]
fn a_thousand_workers_render_only_the_visible_rows() {
    let mut app = fixture(SourceKind::Sim, 1_000);
    press(&mut app, KeyCode::Char('G'));
    let text = render_text(&app, 160, 48);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 48);
    assert!(text.contains("1000 of 1000 workers"), "{text}");
    assert!(
        lines.iter().any(|l| l.starts_with(">999 ")),
        "the last worker is selected and shown:\n{text}"
    );
    assert!(
        !lines.iter().any(|l| l.starts_with(" 0 ")),
        "the first is scrolled away"
    );
    // Every size from tiny up renders without a panic.
    for (w, h) in [(1, 1), (10, 5), (40, 12), (80, 24), (200, 60)] {
        assert_eq!(render_text(&app, w, h).lines().count(), usize::from(h));
    }
}

#[test]
fn rates_follow_the_injected_clock() {
    let app = fixture(SourceKind::Sim, 12);
    let world = app.world();
    // Worker 0 publishes 20 events a second; its window spans the last 5 s.
    let w0 = world.subject(&world.workers[&key_of(0)], 10_000);
    assert_eq!(w0.events_per_s, 20.0);
    assert_eq!(w0.age_s, Some(0.0));
    let w10 = world.subject(&world.workers[&key_of(10)], 10_000);
    assert_eq!(w10.events_per_s, 0.0);
    assert_eq!(w10.age_s, Some(25.0));
    assert_eq!(w10.status, Some(super::filter::Status::Stale));
    let last = world.history.last().unwrap();
    assert_eq!(last.routes_per_s, 2.0);
    assert_eq!(world.history.samples().len(), FIXTURE_S as usize);
}
