//! `kvtwin bench dash`: what `kvtwin dash` costs, as one JSON line (and a table on
//! stderr).
//!
//! Owns: the command's flags, the synthetic worlds it feeds the dashboard (built before
//! each clock starts) and five measurements around the dashboard's own code: frame cost
//! per view and terminal size, the router path's update ingest, the replica path at the
//! event rate (`RouterState` → `StreamCursor` → the app), key press to frame, and replay
//! speed. A clock is allowed here, at the edge; nothing asserts on what it reads.
//! Never: change what the dashboard computes or draws (it calls `App` and
//! `dash::ui::render` as the terminal loop does), or time the building of its inputs.
//!
//! Frames are drawn into a `TestBackend`: the render and ratatui's buffer diff are timed,
//! a real terminal's writes are not (after the first frame of a still world the diff
//! writes nothing anyway).

use crate::cmd::dash::app::{App, AppConfig, SourceKind, View};
use crate::cmd::dash::model::{
    Candidate, Counters, Delta, LinkRow, RouteRow, SimSignals, TimedUpdate, Update, WorkerKey,
    WorkerRow,
};
use crate::cmd::dash::plane_delta::delta_of_message;
use crate::cmd::dash::record::{Recorder, Recording};
use anyhow::{bail, Context, Result};
use clap::Args;
use crossterm::event::{KeyCode, KeyEvent};
use kvtwin::ids::WorkerId;
use kvtwin::stats::LatencySummary;
use kvtwin_plane::service::source::EventNumbering;
use kvtwin_plane::service::state::RouterState;
use kvtwin_plane::service::stream::StreamCursor;
use kvtwin_plane::service::synthetic::{SyntheticConfig, SyntheticEngine};
use kvtwin_plane::wire::WorkerEvent;
use ratatui::backend::TestBackend;
use ratatui::Terminal;
use serde_json::{json, Value};
use std::time::{Duration, Instant};
use xxhash_rust::xxh3::xxh3_64_with_seed;

/// The terminal sizes frames are drawn at: a roomy one and the smallest usable one.
const SIZES: [(u16, u16); 2] = [(160, 48), (80, 24)];
/// The dashboard's frame rate and a live source's update rate, per second.
const PER_S: f64 = 10.0;
/// Seconds of chart history fed before frames are timed (the app's span).
const HISTORY_S: u64 = 300;
/// Routing decisions the route ring holds when frames are timed.
const ROUTES: usize = 200;
/// Links per worker.
const LINKS: [&str; 4] = ["nvlink", "pcie", "nic", "ssd"];
/// Engines feeding the replica.
const ENGINES: usize = 8;
/// Block events between two reads of the replica's state: 100 ms at 1 M/s.
const BLOCKS_PER_READ: u64 = 100_000;
/// The event rate the replica must keep up with (the relay's target), block events/s.
const TARGET_EVENTS_PER_S: f64 = 1_000_000.0;
/// Replay: one update per 100 ms of source time, a tenth of the rows changing in each.
const REPLAY_UPDATE_MS: u64 = 100;
const REPLAY_CHANGED_SHARE: usize = 10;
/// Replay: one frame per 10 s of recording (100 ms of wall time at 100×).
const REPLAY_FRAME_MS: u64 = 10_000;

#[derive(Args, Debug)]
pub(crate) struct DashBenchArgs {
    /// Worker ranks in the dashboard's world.
    #[arg(long, default_value_t = 1000)]
    workers: usize,
    /// Frames timed per view and terminal size.
    #[arg(long, default_value_t = 300)]
    frames: usize,
    /// Block events applied through the replica path.
    #[arg(long, default_value_t = 5_000_000)]
    events: u64,
    /// Seconds of source time in the replay's recording.
    #[arg(long, default_value_t = 600)]
    seconds: u64,
}

/// A number from `a` and `b`, the same on every run.
fn mix(a: u64, b: u64) -> u64 {
    xxh3_64_with_seed(&a.to_le_bytes(), b)
}

/// Worker `i`'s cumulative row at second `t` of the world: all four tiers with
/// capacities (the remote one unbounded), varied occupancy, every 50th worker silent
/// from second 200 on (stale), every 37th with gaps.
fn worker_row(i: usize, t_ms: u64, capacities: bool) -> WorkerRow {
    let i = i as u64;
    let t_s = t_ms / 1000;
    let seed = mix(i, 1);
    let capacity = [8_000, 32_000, 128_000, 0];
    let mut blocks = [0u64; 4];
    for (tier, held) in blocks.iter_mut().enumerate() {
        let cap = if capacity[tier] == 0 {
            20_000
        } else {
            capacity[tier]
        };
        *held = mix(seed ^ tier as u64, t_s / 5) % cap;
    }
    let active_until = if i.is_multiple_of(50) {
        200_000
    } else {
        u64::MAX
    };
    let events = (t_ms.min(active_until) / 100) * (50 + seed % 200);
    WorkerRow {
        key: WorkerKey {
            worker: i / 2,
            dp_rank: (i % 2) as u32,
        },
        blocks,
        capacity: if capacities {
            [
                Some(capacity[0]),
                Some(capacity[1]),
                Some(capacity[2]),
                None,
            ]
        } else {
            [None; 4]
        },
        events,
        last_event_id: Some(events),
        gaps: if i.is_multiple_of(37) {
            1 + t_s / 60
        } else {
            0
        },
        out_of_order: u64::from(i.is_multiple_of(101)),
        reconnects: u64::from(i.is_multiple_of(73)),
        ..WorkerRow::default()
    }
}

/// The cluster's counters at `t_ms` for `workers` ranks.
fn counters(workers: usize, t_ms: u64) -> Counters {
    let events = t_ms * workers as u64;
    Counters {
        events_applied: events,
        batches: events / 30,
        gaps: t_ms / 60_000,
        routes: t_ms / 10,
        lookup_blocks: t_ms * 3,
        hit_blocks: t_ms * 2,
        apply_latency_p99_s: Some(0.000_4),
        ..Counters::default()
    }
}

/// Routing decision `seq`: eight candidates.
fn route(seq: u64, workers: usize) -> RouteRow {
    let key = |n: u64| {
        let i = mix(seq, n) % workers.max(1) as u64;
        WorkerKey {
            worker: i / 2,
            dp_rank: (i % 2) as u32,
        }
    };
    let candidates: Vec<Candidate> = (0..8)
        .map(|n| Candidate {
            key: key(n),
            overlap: [mix(seq, n + 10) % 32, mix(seq, n + 20) % 16, 0, 0],
            load: mix(seq, n + 30) % 20_000,
            score: (mix(seq, n + 40) % 1000) as f64 / 10.0,
        })
        .collect();
    RouteRow {
        seq,
        query_blocks: 32,
        winner: Some(candidates[0].key),
        score: "overlap".into(),
        candidates,
    }
}

/// Every link's cumulative bytes at `t_ms`: four per worker.
fn links(workers: usize, t_ms: u64) -> Vec<LinkRow> {
    (0..workers)
        .flat_map(|i| {
            LINKS.iter().enumerate().map(move |(n, link)| LinkRow {
                worker: Some(i as u64),
                link: (*link).to_string(),
                bytes: t_ms * (1_000 + mix(i as u64, n as u64) % 100_000),
                utilisation: Some((mix(i as u64, n as u64 + 7) % 100) as f64 / 100.0),
            })
        })
        .collect()
}

fn delta_at(at_ms: u64, delta: Delta) -> TimedUpdate {
    TimedUpdate {
        at_ms,
        update: Update::Delta(delta),
    }
}

/// A dashboard of `kind` fed [`HISTORY_S`] seconds of a full world, one full delta per
/// second, so every chart is full and the route ring holds [`ROUTES`] decisions.
fn full_world(workers: usize, kind: SourceKind) -> App {
    let capacities = kind == SourceKind::Sim;
    let mut app = App::new(AppConfig::new("bench", kind));
    let per_second = ROUTES.div_ceil(HISTORY_S as usize) as u64;
    for t_s in 0..=HISTORY_S {
        let t_ms = t_s * 1000;
        let delta = Delta {
            full: true,
            workers: (0..workers)
                .map(|i| worker_row(i, t_ms, capacities))
                .collect(),
            counters: Some(counters(workers, t_ms)),
            routes: (t_s * per_second..(t_s + 1) * per_second)
                .map(|seq| route(seq, workers))
                .collect(),
            links: if capacities {
                links(workers, t_ms)
            } else {
                Vec::new()
            },
            sim: capacities.then(|| SimSignals {
                scenario: "bench".into(),
                simulated_s: t_s as f64,
                speed: 1.0,
                requests_arrived: t_s * 100,
                requests_completed: t_s * 99,
                window_s: 10.0,
                ..SimSignals::default()
            }),
            block_size: Some(16),
            ..Delta::default()
        };
        app.on_update(delta_at(t_ms, delta));
    }
    app
}

fn terminal(width: u16, height: u16) -> Result<Terminal<TestBackend>> {
    Terminal::new(TestBackend::new(width, height)).context("a test terminal")
}

/// One frame of `app`, timed.
fn draw(terminal: &mut Terminal<TestBackend>, app: &App) -> Result<Duration> {
    let start = Instant::now();
    terminal
        .draw(|frame| crate::cmd::dash::ui::render(app, frame))
        .context("drawing a frame")?;
    Ok(start.elapsed())
}

fn ms(span: Duration) -> f64 {
    span.as_secs_f64() * 1e3
}

/// 1. Frame cost per view and size.
fn frames(args: &DashBenchArgs) -> Result<Value> {
    let mut app = full_world(args.workers, SourceKind::Sim);
    let mut rows = Vec::new();
    let mut worst_share = 0.0f64;
    for (width, height) in SIZES {
        let mut terminal = terminal(width, height)?;
        // The app starts on the first view and Tab walks them in this order.
        for view in View::ALL {
            let view = view.name();
            let mut samples = Vec::with_capacity(args.frames);
            for _ in 0..args.frames {
                samples.push(draw(&mut terminal, &app)?);
            }
            let summary = LatencySummary::of(samples);
            let mean_ms = summary.mean_ns / 1e6;
            let share = mean_ms / 1e3 * PER_S;
            worst_share = worst_share.max(share);
            rows.push(json!({
                "view": view,
                "size": format!("{width}x{height}"),
                "mean_ms": mean_ms,
                "p99_ms": ms(summary.p99),
                "core_share_at_10fps": share,
            }));
            app.on_key(KeyEvent::from(KeyCode::Tab));
        }
    }
    Ok(json!({
        "per_view": rows,
        "worst_core_share_at_10fps": worst_share,
        "under_10_percent": worst_share < 0.10,
    }))
}

/// 2. The router path: every worker changed in every delta, ten deltas a second.
fn ingest(args: &DashBenchArgs) -> Value {
    let mut app = full_world(args.workers, SourceKind::Router);
    let start_ms = HISTORY_S * 1000;
    let deltas = 600u64;
    let mut spent = Duration::ZERO;
    let mut samples = Vec::with_capacity(deltas as usize);
    for n in 1..=deltas {
        let t_ms = start_ms + n * REPLAY_UPDATE_MS;
        let update = delta_at(
            t_ms,
            Delta {
                workers: (0..args.workers)
                    .map(|i| worker_row(i, t_ms, false))
                    .collect(),
                counters: Some(counters(args.workers, t_ms)),
                routes: vec![route(n, args.workers)],
                ..Delta::default()
            },
        );
        let start = Instant::now();
        app.on_update(update);
        let took = start.elapsed();
        spent += took;
        samples.push(took);
    }
    let summary = LatencySummary::of(samples);
    let mean_ms = ms(spent) / deltas as f64;
    json!({
        "deltas": deltas,
        "rows_per_delta": args.workers,
        "mean_ms": mean_ms,
        "p99_ms": ms(summary.p99),
        "core_share_at_10_per_s": mean_ms / 1e3 * PER_S,
    })
}

/// The engines' events for the replica, in arrival order (engines round robin), with
/// each batch's block count: built before the clock starts, as the source threads'
/// decode would have made them.
fn replica_events(blocks: u64) -> Result<Vec<(Vec<WorkerEvent>, u64)>> {
    let mut engines: Vec<(SyntheticEngine, EventNumbering)> = (0..ENGINES)
        .map(|e| {
            let config = SyntheticConfig {
                seed: 1 + e as u64,
                requests_per_batch: 16,
                prompts: 8,
                prompt_blocks: 32,
                own_blocks: 8,
                capacity_blocks: 4096,
                ..SyntheticConfig::small(1)
            };
            (SyntheticEngine::new(config), EventNumbering::default())
        })
        .collect();
    let mut batches = Vec::new();
    let mut total = 0;
    'fill: loop {
        for (e, (engine, numbering)) in engines.iter_mut().enumerate() {
            if total >= blocks {
                break 'fill;
            }
            let batch = engine.next_batch();
            if batch.events.is_empty() {
                continue;
            }
            let mut events = Vec::with_capacity(batch.events.len());
            batch
                .worker_events(WorkerId::new(e as u64), &mut events)
                .context("converting a synthetic batch")?;
            numbering.number(&mut events);
            let count = batch.block_count() as u64;
            total += count;
            batches.push((events, count));
        }
    }
    Ok(batches)
}

/// 3. The replica path at the event rate, on one thread.
fn replica(args: &DashBenchArgs) -> Result<Value> {
    let batches = replica_events(args.events)?;
    let mut state = RouterState::new(16);
    let mut cursor = StreamCursor::new();
    let mut app = App::new(AppConfig::new("bench", SourceKind::Replica));
    let mut terminal = terminal(SIZES[0].0, SIZES[0].1)?;
    let (mut applied, mut since_read, mut at_ms, mut reads) = (0u64, 0u64, 0u64, 0u64);
    let mut reading = Duration::ZERO;
    let start = Instant::now();
    for (events, blocks) in &batches {
        state.apply_batch(events);
        applied += blocks;
        since_read += blocks;
        if since_read >= BLOCKS_PER_READ {
            since_read -= BLOCKS_PER_READ;
            at_ms += 100;
            reads += 1;
            let read = Instant::now();
            if let Some(message) = cursor.next(&state) {
                app.on_update(delta_at(at_ms, delta_of_message(&message)));
            }
            reading += read.elapsed();
        }
    }
    let wall = start.elapsed();
    // The frames the dashboard would draw over the same span, drawn after: a frame
    // reads the app, never the state, so it adds its own cost beside this one.
    let frame = draw(&mut terminal, &app)?;
    let per_s = applied as f64 / wall.as_secs_f64().max(1e-9);
    Ok(json!({
        "engines": ENGINES,
        "block_events": applied,
        "batches": batches.len(),
        "reads": reads,
        "wall_s": wall.as_secs_f64(),
        "block_events_per_s": per_s.round(),
        "read_and_fold_share": reading.as_secs_f64() / wall.as_secs_f64().max(1e-9),
        "read_and_fold_mean_ms": ms(reading) / reads.max(1) as f64,
        "frame_ms": ms(frame),
        "keeps_up_at_1m": per_s > TARGET_EVENTS_PER_S,
        "note": "one thread: RouterState::apply_batch, StreamCursor::next every 100,000 \
                 blocks, delta_of_message, App::on_update; the ZMQ decode runs on the \
                 source threads beside this (kvtwin bench relay measures decode)",
    }))
}

/// 4. Key press to frame at 160×48.
fn keys(args: &DashBenchArgs) -> Result<Value> {
    let mut app = full_world(args.workers, SourceKind::Sim);
    let mut terminal = terminal(SIZES[0].0, SIZES[0].1)?;
    draw(&mut terminal, &app)?;
    let mut press = |keys: &[KeyCode]| -> Result<f64> {
        let mut worst = Duration::ZERO;
        for &code in keys {
            let start = Instant::now();
            app.on_key(KeyEvent::from(code));
            terminal
                .draw(|frame| crate::cmd::dash::ui::render(&app, frame))
                .context("drawing a frame")?;
            worst = worst.max(start.elapsed());
        }
        Ok(ms(worst))
    };
    let sort = press(&[KeyCode::Char('s'); 3])?;
    let mut filter_keys = vec![KeyCode::Char('/')];
    filter_keys.extend("blocks>1000".chars().map(KeyCode::Char));
    filter_keys.push(KeyCode::Enter);
    let filter = press(&filter_keys)?;
    let tab = press(&[KeyCode::Tab; 5])?;
    let freeze = press(&[KeyCode::Char('f'); 2])?;
    let max = sort.max(filter).max(tab).max(freeze);
    Ok(json!({
        "sort_max_ms": sort,
        "filter_max_ms": filter,
        "tab_max_ms": tab,
        "freeze_max_ms": freeze,
        "max_ms": max,
        "under_50_ms": max < 50.0,
    }))
}

/// The recording [`replay`] plays: `seconds` of source time, an update every 100 ms.
fn write_recording(path: &std::path::Path, workers: usize, seconds: u64) -> Result<u64> {
    let mut recorder = Recorder::create(path, "bench")?;
    let changed = workers.div_ceil(REPLAY_CHANGED_SHARE);
    let updates = seconds * 1000 / REPLAY_UPDATE_MS;
    for n in 0..=updates {
        let t_ms = n * REPLAY_UPDATE_MS;
        let rows: Vec<WorkerRow> = if n == 0 {
            (0..workers).map(|i| worker_row(i, t_ms, false)).collect()
        } else {
            // A different tenth each time, so every row moves once a second.
            let first = (n as usize % REPLAY_CHANGED_SHARE) * changed;
            (first..(first + changed).min(workers))
                .map(|i| worker_row(i, t_ms, false))
                .collect()
        };
        let update = delta_at(
            t_ms,
            Delta {
                full: n == 0,
                workers: rows,
                counters: Some(counters(workers, t_ms)),
                routes: (0..3).map(|r| route(n * 3 + r, workers)).collect(),
                block_size: (n == 0).then_some(16),
                ..Delta::default()
            },
        );
        recorder.append(&update)?;
    }
    recorder.flush()?;
    Ok(recorder.written())
}

/// 5. Replay speed: open the recording, fold it all, a frame per 10 s of it.
fn replay(args: &DashBenchArgs) -> Result<Value> {
    let path = std::env::temp_dir().join(format!("kvtwin-bench-dash-{}.jsonl", std::process::id()));
    let written = write_recording(&path, args.workers, args.seconds)?;
    let bytes = std::fs::metadata(&path)
        .with_context(|| format!("reading {}", path.display()))?
        .len();
    let mut terminal = terminal(SIZES[0].0, SIZES[0].1)?;
    let start = Instant::now();
    let recording = Recording::open(&path);
    let loaded = start.elapsed();
    std::fs::remove_file(&path).with_context(|| format!("removing {}", path.display()))?;
    let recording = recording?;
    let mut app = App::new(AppConfig::new(recording.source.clone(), SourceKind::Replay));
    let mut next_frame_ms = 0;
    let mut frames = 0u64;
    let mut last_ms = 0;
    for update in recording.updates {
        last_ms = update.at_ms;
        app.on_update(update);
        if last_ms >= next_frame_ms {
            terminal
                .draw(|frame| crate::cmd::dash::ui::render(&app, frame))
                .context("drawing a frame")?;
            frames += 1;
            next_frame_ms += REPLAY_FRAME_MS;
        }
    }
    let wall = start.elapsed();
    let speed = last_ms as f64 / 1e3 / wall.as_secs_f64().max(1e-9);
    Ok(json!({
        "recorded_s": last_ms as f64 / 1e3,
        "updates": written,
        "frames": frames,
        "open_s": loaded.as_secs_f64(),
        "wall_s": wall.as_secs_f64(),
        "speed_x": speed,
        "at_least_100x": speed >= 100.0,
        "file_bytes": bytes,
        "bytes_per_update": bytes as f64 / written.max(1) as f64,
    }))
}

/// Writes the human table to stderr.
fn table(line: &Value) {
    let f = |v: &Value| v.as_f64().unwrap_or(f64::NAN);
    eprintln!("frame cost (mean / p99 ms, share of a core at 10 frames/s):");
    for row in line["frames"]["per_view"].as_array().into_iter().flatten() {
        eprintln!(
            "  {:<10} {:>7}  {:>7.2} / {:>7.2}  {:>5.1} %",
            row["view"].as_str().unwrap_or(""),
            row["size"].as_str().unwrap_or(""),
            f(&row["mean_ms"]),
            f(&row["p99_ms"]),
            f(&row["core_share_at_10fps"]) * 100.0
        );
    }
    let ingest = &line["ingest"];
    eprintln!(
        "ingest (router path): {:.2} ms per delta of {} rows, {:.1} % of a core at 10/s",
        f(&ingest["mean_ms"]),
        ingest["rows_per_delta"],
        f(&ingest["core_share_at_10_per_s"]) * 100.0
    );
    let replica = &line["replica"];
    eprintln!(
        "replica path: {:.2} M block events/s on one thread (keeps up at 1 M/s: {})",
        f(&replica["block_events_per_s"]) / 1e6,
        replica["keeps_up_at_1m"]
    );
    let keys = &line["keys"];
    eprintln!(
        "key to frame: max {:.2} ms (sort {:.2}, filter {:.2}, tab {:.2}, freeze {:.2})",
        f(&keys["max_ms"]),
        f(&keys["sort_max_ms"]),
        f(&keys["filter_max_ms"]),
        f(&keys["tab_max_ms"]),
        f(&keys["freeze_max_ms"])
    );
    let replay = &line["replay"];
    eprintln!(
        "replay: {:.0}x real time ({} s recorded, {} bytes, {:.0} bytes per update)",
        f(&replay["speed_x"]),
        f(&replay["recorded_s"]),
        replay["file_bytes"],
        f(&replay["bytes_per_update"])
    );
}

pub(crate) fn run(args: &DashBenchArgs) -> Result<()> {
    if args.workers == 0 || args.frames == 0 || args.seconds == 0 {
        bail!("--workers, --frames and --seconds must be at least 1");
    }
    let line = json!({
        "workers": args.workers,
        "frames": frames(args)?,
        "ingest": ingest(args),
        "replica": replica(args)?,
        "keys": keys(args)?,
        "replay": replay(args)?,
    });
    table(&line);
    println!("{line}");
    Ok(())
}
