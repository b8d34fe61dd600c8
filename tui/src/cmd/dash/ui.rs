//! A pure render of the [`App`]: header, tab bar, the current view, the status line and
//! the help overlay. [`render_text`] draws the same into a `TestBackend` for `--once`
//! and the snapshots.
//!
//! Owns: the screen's layout and the number formats shared by the views (`views.rs`,
//! `charts.rs` draw the bodies).
//! Never: change the app, read a clock, or depend on anything but the app and
//! `frame.area()` (a resize is just another render). What does not fit is dropped
//! (columns, charts, header figures at the line's end), never wrapped over other rows.

use ratatui::backend::TestBackend;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Clear, Paragraph};
use ratatui::{Frame, Terminal};

use super::app::{App, Prompt, SourceKind, View};
use super::keys::KEY_HELP;
use super::model::{LatencyRow, TIER_NAMES};
use super::{charts, views};

/// Draws the whole screen.
pub(crate) fn render(app: &App, frame: &mut Frame) {
    let area = frame.area();
    // The header gives way to the body on a short screen.
    let header = header_lines(app, area.width, if area.height < 30 { 4 } else { 6 });
    let [head, tabs, body, status] = Layout::vertical([
        Constraint::Length(header.len() as u16),
        Constraint::Length(1),
        Constraint::Min(0),
        Constraint::Length(1),
    ])
    .areas(area);
    frame.render_widget(Paragraph::new(header), head);
    frame.render_widget(Paragraph::new(tab_line(app)), tabs);
    match app.detail {
        Some(key) => views::detail(app, key, frame, body),
        None => match app.view {
            View::Workers => views::workers(app, frame, body),
            View::Charts => charts::charts(app, frame, body),
            View::Routes => charts::routes(app, frame, body),
            View::Integrity => views::integrity(app, frame, body),
            View::Transfers => views::transfers(app, frame, body),
        },
    }
    frame.render_widget(Paragraph::new(status_line(app)), status);
    if app.help {
        help(frame, area);
    }
}

/// The screen as plain text, `width` × `height`, one line per row, trailing spaces
/// trimmed: `kvtwin dash --once` and the snapshots.
pub(crate) fn render_text(app: &App, width: u16, height: u16) -> String {
    let mut terminal =
        Terminal::new(TestBackend::new(width, height)).expect("a TestBackend terminal cannot fail");
    terminal
        .draw(|frame| render(app, frame))
        .expect("a TestBackend cannot fail to draw");
    let buffer = terminal.backend().buffer();
    let mut out = String::new();
    for y in 0..buffer.area.height {
        let mut line = String::new();
        for x in 0..buffer.area.width {
            line.push_str(buffer[(x, y)].symbol());
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// A dim label followed by a plain value.
pub(super) fn label<'a>(text: impl Into<String>) -> Span<'a> {
    Span::styled(text.into(), Style::new().fg(Color::DarkGray))
}

/// The separator between header figures.
fn sep<'a>() -> Span<'a> {
    label(" │ ")
}

/// A count, short: 1234, 12.3k, 4.56M, 7.89G.
pub(super) fn count(n: u64) -> String {
    match n {
        0..=9_999 => n.to_string(),
        10_000..=999_999 => format!("{:.1}k", n as f64 / 1e3),
        1_000_000..=999_999_999 => format!("{:.2}M", n as f64 / 1e6),
        _ => format!("{:.2}G", n as f64 / 1e9),
    }
}

/// A rate per second, short.
pub(super) fn rate(per_s: f64) -> String {
    if per_s < 10.0 {
        format!("{per_s:.1}")
    } else if per_s < 10_000.0 {
        format!("{per_s:.0}")
    } else if per_s < 1e6 {
        format!("{:.1}k", per_s / 1e3)
    } else if per_s < 1e9 {
        format!("{:.1}M", per_s / 1e6)
    } else {
        format!("{:.1}G", per_s / 1e9)
    }
}

/// Bytes, short, in powers of 1024.
pub(super) fn bytes(n: f64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{value:.0} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// A share as a percentage.
pub(super) fn percent(share: f64) -> String {
    format!("{:.1}%", share * 100.0)
}

/// Seconds, short: 850ms, 4.2s, 12m.
pub(super) fn age(seconds: Option<f64>) -> String {
    match seconds {
        None => "-".to_owned(),
        Some(s) if s < 1.0 => format!("{:.0}ms", s * 1e3),
        Some(s) if s < 100.0 => format!("{s:.1}s"),
        Some(s) if s < 6_000.0 => format!("{:.0}m", s / 60.0),
        Some(s) => format!("{:.0}h", s / 3_600.0),
    }
}

/// A horizontal bar `width` cells wide, filled to `share` in eighths.
pub(super) fn bar(share: f64, width: usize) -> String {
    const EIGHTHS: [char; 8] = [' ', '▏', '▎', '▍', '▌', '▋', '▊', '▉'];
    let eighths = (share.clamp(0.0, 1.0) * (width * 8) as f64).round() as usize;
    let mut out = "█".repeat(eighths / 8);
    if !eighths.is_multiple_of(8) {
        out.push(EIGHTHS[eighths % 8]);
    }
    while out.chars().count() < width {
        out.push('░');
    }
    out
}

/// The tiers worth a column: any worker holds blocks there or knows a capacity. At least
/// the device tier, so an empty cluster still has one.
pub(super) fn active_tiers(app: &App) -> Vec<usize> {
    let world = app.world();
    let tiers: Vec<usize> = (0..4)
        .filter(|&tier| {
            world
                .workers
                .values()
                .any(|e| e.row.blocks[tier] > 0 || e.row.capacity[tier].is_some())
        })
        .collect();
    if tiers.is_empty() {
        vec![0]
    } else {
        tiers
    }
}

/// The header: a title line, then the figures packed into at most `max_rows` lines.
fn header_lines(app: &App, width: u16, max_rows: usize) -> Vec<Line<'static>> {
    let world = app.world();
    let bold = Style::new().add_modifier(Modifier::BOLD);
    let mut title = vec![
        Span::styled("kvtwin dash", bold),
        sep(),
        Span::raw(format!("{} {}", app.config.kind.name(), app.config.source)),
    ];
    let flag = |text: String| Span::styled(text, Style::new().fg(Color::Black).bg(Color::Yellow));
    if app.is_frozen() {
        title.push(Span::raw(" "));
        title.push(flag(" FROZEN ".into()));
    }
    let sim = world.sim.as_ref();
    let paused = match app.config.kind {
        SourceKind::Sim => sim.map_or(app.paused, |s| s.paused),
        SourceKind::Replay => app.paused,
        _ => false,
    };
    if paused {
        title.push(Span::raw(" "));
        title.push(flag(" PAUSED ".into()));
    }
    let speed = match app.config.kind {
        SourceKind::Sim => sim.map(|s| s.speed),
        SourceKind::Replay => Some(app.speed),
        _ => None,
    };
    match speed {
        // The simulator says 0 when it runs flat out (`--once`).
        Some(speed) if speed > 0.0 => title.push(label(format!(" ×{speed}"))),
        Some(_) => title.push(label(" flat out".to_string())),
        None => {}
    }
    title.push(sep());
    match &world.status {
        Some(status) => title.push(Span::styled(
            status.text.clone(),
            Style::new().fg(if status.connected {
                Color::Green
            } else {
                Color::Red
            }),
        )),
        None => title.push(label("waiting for the source")),
    }

    // The figures after the title, in the order they are dropped last to first when
    // the width and the header's rows run out.
    let mut groups: Vec<Vec<Span<'static>>> = Vec::new();
    let (up, stale, restarted, down) = world.worker_counts(app.config.stale_after_ms);
    groups.push(vec![
        label("workers "),
        Span::raw(format!("{up} up")),
        label(" · "),
        Span::styled(format!("{stale} stale"), warn_if(stale > 0)),
        label(" · "),
        Span::styled(format!("{restarted} restarted"), warn_if(restarted > 0)),
        label(" · "),
        Span::styled(format!("{down} down"), warn_if(down > 0)),
    ]);
    let (blocks, _) = world.occupancy();
    let capacity = world.capacity();
    let mut block_group = vec![label("blocks")];
    for tier in active_tiers(app) {
        block_group.push(label(format!(" {} ", TIER_NAMES[tier])));
        match capacity[tier] {
            Some(cap) if cap > 0 && width >= 120 => block_group.push(Span::raw(format!(
                "{} of {} ({})",
                count(blocks[tier]),
                count(cap),
                percent(blocks[tier] as f64 / cap as f64)
            ))),
            Some(cap) if cap > 0 => {
                block_group.push(Span::raw(percent(blocks[tier] as f64 / cap as f64)))
            }
            _ => block_group.push(Span::raw(count(blocks[tier]))),
        }
    }
    groups.push(block_group);

    let now = world.now_ms;
    let mut hit = vec![label("hit ")];
    match &world.counters {
        Some(c) if c.lookup_blocks > 0 => hit.push(Span::raw(percent(
            c.hit_blocks as f64 / c.lookup_blocks as f64,
        ))),
        _ => hit.push(Span::raw("-")),
    }
    if let Some(ratio) = world.history.last().and_then(|s| s.hit_ratio) {
        hit.push(label(" (last 1 s "));
        hit.push(Span::raw(percent(ratio)));
        hit.push(label(")"));
    }
    groups.push(hit);
    // What the cluster served comes before the plane's own figures: on an 80x24 screen
    // (four header rows) those are the ones that give way.
    if let Some(s) = sim {
        groups.push(vec![
            label("requests "),
            Span::raw(format!(
                "{} in flight · {} done · ",
                count(s.requests_in_flight),
                count(s.requests_completed),
            )),
            Span::styled(
                format!("{} rejected", count(s.requests_rejected)),
                warn_if(s.requests_rejected > 0),
            ),
        ]);
        groups.push(vec![
            label("TTFT p50/p99 "),
            Span::raw(format!("{:.0}/{:.0} ms", s.ttft.p50_ms, s.ttft.p99_ms)),
            label(" · TPOT "),
            Span::raw(format!("{:.1}/{:.1} ms", s.tpot.p50_ms, s.tpot.p99_ms)),
            label(" (model)"),
        ]);
    }
    if let Some(serving) = world.counters.as_ref().and_then(|c| c.serving.as_ref()) {
        groups.push(vec![
            label("requests "),
            Span::raw(format!(
                "{} in flight · {} served · ",
                count(serving.in_flight),
                count(serving.served)
            )),
            Span::styled(
                format!("{} failed", count(serving.failed)),
                warn_if(serving.failed > 0),
            ),
        ]);
        let ms = |row: Option<LatencyRow>| {
            row.map_or_else(
                || "-".to_string(),
                |row| format!("{}/{}", millis(row.p50_ms), millis(row.p99_ms)),
            )
        };
        groups.push(vec![
            label("TTFT p50/p99 "),
            Span::raw(format!("{} ms", ms(serving.ttft))),
            label(" · ITL "),
            Span::raw(format!("{} ms", ms(serving.itl))),
        ]);
    }
    groups.push(vec![
        label("events "),
        Span::raw(format!("{}/s", rate(world.events_rate.rate_per_s(now)))),
    ]);
    groups.push(vec![
        label("routes "),
        Span::raw(format!("{}/s", rate(world.routes_rate.rate_per_s(now)))),
    ]);
    if let Some(c) = &world.counters {
        groups.push(vec![
            label("gaps "),
            Span::styled(count(c.gaps), warn_if(c.gaps > 0)),
            label(" · lost "),
            Span::styled(count(c.lost_batches), warn_if(c.lost_batches > 0)),
        ]);
        if let Some(p99) = c.apply_latency_p99_s {
            groups.push(vec![
                label("apply p99 "),
                Span::raw(format!("{:.2} ms", p99 * 1e3)),
            ]);
        }
    }
    if let Some(s) = sim {
        // The title names the scenario; this is the simulated clock.
        let done = if s.done { " done" } else { "" };
        groups.push(vec![
            label("sim "),
            Span::raw(format!("t={:.1} s{done}", s.simulated_s)),
        ]);
    }
    let mut lines = vec![Line::from(title)];
    lines.extend(pack(groups, width, max_rows.saturating_sub(1)));
    lines
}

/// Milliseconds for the header: "-" when unknown (a percentile above the last bucket).
fn millis(ms: f64) -> String {
    if ms.is_finite() {
        format!("{ms:.0}")
    } else {
        "-".to_string()
    }
}

/// Lays `groups` out left to right, `│` between, starting a new line where one would
/// overflow `width`; at most `max_rows` lines, the groups that do not fit dropped.
fn pack(groups: Vec<Vec<Span<'static>>>, width: u16, max_rows: usize) -> Vec<Line<'static>> {
    let mut lines: Vec<Line<'static>> = Vec::new();
    for group in groups {
        let group_width: usize = group.iter().map(Span::width).sum();
        let fits = lines
            .last()
            .is_some_and(|line| line.width() + 3 + group_width <= usize::from(width));
        if let (true, Some(line)) = (fits, lines.last_mut()) {
            line.spans.push(sep());
            line.spans.extend(group);
        } else if lines.len() < max_rows {
            lines.push(Line::from(group));
        }
    }
    lines
}

/// Yellow when `bad`, for figures that should be zero.
pub(super) fn warn_if(bad: bool) -> Style {
    if bad {
        Style::new().fg(Color::Yellow)
    } else {
        Style::new()
    }
}

fn tab_line(app: &App) -> Line<'static> {
    let mut spans = Vec::new();
    for view in View::ALL {
        if view == app.view && app.detail.is_none() {
            spans.push(Span::styled(
                format!("[{}]", view.name()),
                Style::new().add_modifier(Modifier::BOLD | Modifier::REVERSED),
            ));
        } else {
            spans.push(label(format!(" {} ", view.name())));
        }
    }
    if let Some(key) = app.detail {
        spans.push(Span::styled(
            format!("[worker {key}]"),
            Style::new().add_modifier(Modifier::BOLD | Modifier::REVERSED),
        ));
    }
    Line::from(spans)
}

fn status_line(app: &App) -> Line<'static> {
    if let Some(prompt) = &app.prompt {
        let (sigil, text) = match prompt {
            Prompt::Filter(text) => ("/", text),
            Prompt::Command(text) => (":", text),
        };
        return Line::from(vec![
            Span::styled(sigil.to_owned(), Style::new().add_modifier(Modifier::BOLD)),
            Span::raw(text.clone()),
            Span::styled("▏", Style::new().add_modifier(Modifier::SLOW_BLINK)),
        ]);
    }
    if let Some(message) = &app.message {
        return Line::from(Span::styled(
            message.clone(),
            Style::new().fg(Color::Yellow),
        ));
    }
    let mut spans = Vec::new();
    if app.view.lists_workers() && app.detail.is_none() {
        let shown = app.rows().len();
        let total = app.world().workers.len();
        let arrow = if app.descending { "↓" } else { "↑" };
        spans.extend([
            label("sort "),
            Span::raw(format!("{} {arrow}", app.sort.name())),
            label(" · filter "),
            Span::raw(if app.filter.is_empty() {
                "none".to_owned()
            } else {
                app.filter.text().to_owned()
            }),
            label(" · "),
            Span::raw(format!("{shown} of {total} workers")),
            label(" · "),
        ]);
    }
    let hint = match app.detail {
        Some(_) => "Esc back · ? help · q quit",
        None if app.view.lists_workers() => "? help",
        None => "? help · / filter · s sort · Tab view · q quit",
    };
    spans.push(label(hint));
    Line::from(spans)
}

fn help(frame: &mut Frame, area: Rect) {
    let width = area.width.saturating_sub(2).min(76);
    let height = area.height.saturating_sub(2).min(KEY_HELP.len() as u16 + 2);
    let popup = Rect {
        x: area.x + (area.width - width) / 2,
        y: area.y + (area.height - height) / 2,
        width,
        height,
    };
    let lines: Vec<Line> = KEY_HELP
        .iter()
        .map(|(keys, what)| {
            Line::from(vec![
                Span::styled(
                    format!("{keys:>14}  "),
                    Style::new().add_modifier(Modifier::BOLD),
                ),
                Span::raw(*what),
            ])
        })
        .collect();
    frame.render_widget(Clear, popup);
    frame.render_widget(
        Paragraph::new(lines).block(
            Block::new()
                .borders(Borders::ALL)
                .title(" keys · ? or Esc closes "),
        ),
        popup,
    );
}
