//! The charts view (rates, hit ratio and occupancy over the history, as sparklines) and
//! the routes view (the last decisions, each candidate weighed).
//!
//! Owns: which charts fit (each needs three rows; the rest are dropped and counted) and
//! how a decision is laid out.
//! Never: change the app, or draw more history than the width shows.

use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Paragraph, Row, Sparkline, Table};
use ratatui::Frame;

use super::app::{App, SourceKind};
use super::model::TIER_NAMES;
use super::series::Sample;
use super::ui::{active_tiers, count, label, percent, rate};
use super::views::window;

/// Rows one chart takes: its title line and two of bars.
const CHART_ROWS: u16 = 3;
/// Rows the note log takes when there is room for it under the charts.
const NOTE_ROWS: u16 = 8;

/// One chart: a title, its points (`None`: no value that second) and the bars' top.
struct ChartSpec {
    title: String,
    points: Vec<Option<u64>>,
    max: Option<u64>,
}

/// Per-mille, for ratios drawn as bars.
fn per_mille(share: f64) -> u64 {
    (share.clamp(0.0, 1.0) * 1_000.0).round() as u64
}

/// The charts view.
pub(super) fn charts(app: &App, frame: &mut Frame, area: Rect) {
    let world = app.world();
    let samples = world.history.samples();
    if samples.is_empty() {
        frame.render_widget(
            Paragraph::new(label(
                "collecting: the charts take one sample a second of the source's clock",
            )),
            area,
        );
        return;
    }
    let columns = if area.width >= 120 { 2 } else { 1 };
    let chart_width = (area.width / columns).saturating_sub(1) as usize;
    // Only the newest points the width can show.
    let shown: Vec<&Sample> = samples
        .iter()
        .skip(samples.len().saturating_sub(chart_width))
        .collect();
    let span_s = match (shown.first(), shown.last()) {
        (Some(a), Some(b)) => (b.at_ms - a.at_ms) / 1_000,
        _ => 0,
    };
    let last = shown.last().copied();
    let now_max = |values: &[f64], unit: &str| {
        let max = values.iter().copied().fold(0.0, f64::max);
        format!(
            "now {}{unit} · max {}{unit}",
            rate(values.last().copied().unwrap_or(0.0)),
            rate(max)
        )
    };
    let events: Vec<f64> = shown.iter().map(|s| s.events_per_s).collect();
    let routes: Vec<f64> = shown.iter().map(|s| s.routes_per_s).collect();
    let mut specs = vec![
        ChartSpec {
            title: format!("block events/s · {}", now_max(&events, "/s")),
            points: events.iter().map(|v| Some(v.round() as u64)).collect(),
            max: None,
        },
        ChartSpec {
            title: format!("route requests/s · {}", now_max(&routes, "/s")),
            points: routes.iter().map(|v| Some(v.round() as u64)).collect(),
            max: None,
        },
        ChartSpec {
            title: format!(
                "hit ratio per second, 0-100% · now {}",
                last.and_then(|s| s.hit_ratio)
                    .map_or("-".to_owned(), percent)
            ),
            points: shown.iter().map(|s| s.hit_ratio.map(per_mille)).collect(),
            max: Some(1_000),
        },
    ];
    for tier in active_tiers(app) {
        let name = TIER_NAMES[tier];
        let spec = match last.and_then(|s| s.occupancy[tier]) {
            Some(share) => ChartSpec {
                title: format!(
                    "{name} occupancy, % of capacity 0-100% · now {}",
                    percent(share)
                ),
                points: shown
                    .iter()
                    .map(|s| s.occupancy[tier].map(per_mille))
                    .collect(),
                max: Some(1_000),
            },
            None => ChartSpec {
                title: format!(
                    "{name} blocks held · now {}",
                    count(last.map_or(0, |s| s.blocks[tier]))
                ),
                points: shown.iter().map(|s| Some(s.blocks[tier])).collect(),
                max: None,
            },
        };
        specs.push(spec);
    }

    let notes_fit = area.height >= 40 && !world.notes.is_empty();
    let [charts_area, notes_area] = Layout::vertical([
        Constraint::Min(0),
        Constraint::Length(if notes_fit { NOTE_ROWS } else { 0 }),
    ])
    .areas(area);
    let [caption, charts_area] =
        Layout::vertical([Constraint::Length(1), Constraint::Min(0)]).areas(charts_area);
    let per_column = (specs.len() as u16).div_ceil(columns);
    let rows_fit = (charts_area.height / CHART_ROWS).min(per_column);
    let fit = usize::from(rows_fit * columns).min(specs.len());
    let dropped = specs.len() - fit;
    let mut text = String::new();
    if dropped > 0 {
        text.push_str(&format!("{dropped} more when taller · "));
    }
    text.push_str(&format!(
        "last {span_s} s, a bar a second, newest right · {} s kept",
        world.history.capacity()
    ));
    frame.render_widget(Paragraph::new(label(text)), caption);
    if rows_fit == 0 {
        return;
    }
    let height = (charts_area.height / rows_fit).min(CHART_ROWS * 3);
    let column_areas = Layout::horizontal(vec![
        Constraint::Ratio(1, u32::from(columns));
        usize::from(columns)
    ])
    .split(charts_area);
    for (i, spec) in specs.into_iter().take(fit).enumerate() {
        let column = column_areas[i / usize::from(rows_fit)];
        let row = (i % usize::from(rows_fit)) as u16;
        let cell = Rect {
            x: column.x,
            y: column.y + row * height,
            width: column.width.saturating_sub(1),
            height,
        };
        let mut sparkline = Sparkline::default()
            .block(
                Block::new()
                    .borders(Borders::TOP)
                    .title(Line::from(Span::styled(
                        format!(" {} ", spec.title),
                        Style::new().add_modifier(Modifier::BOLD),
                    ))),
            )
            .style(Style::new().fg(Color::Cyan))
            .absent_value_symbol("·")
            .data(spec.points);
        if let Some(max) = spec.max {
            sparkline = sparkline.max(max);
        }
        frame.render_widget(sparkline, cell);
    }
    if notes_fit {
        let lines: Vec<Line> = world
            .notes
            .iter()
            .rev()
            .take(usize::from(NOTE_ROWS - 1))
            .map(|(at, note)| {
                Line::from(vec![
                    label(format!("{:>9.1} s  ", *at as f64 / 1e3)),
                    Span::raw(note.clone()),
                ])
            })
            .collect();
        frame.render_widget(
            Paragraph::new(lines).block(
                Block::new()
                    .borders(Borders::TOP)
                    .title(" notes, newest first "),
            ),
            notes_area,
        );
    }
}

/// The routes view: the last decisions, newest first, one row per candidate.
pub(super) fn routes(app: &App, frame: &mut Frame, area: Rect) {
    let world = app.world();
    if world.routes.is_empty() {
        let text = match app.config.kind {
            SourceKind::Replica => "this source does not route (a replica only listens)".to_owned(),
            _ if world.routes_missed > 0 => {
                format!(
                    "no decision kept ({} missed: the source's record overran)",
                    world.routes_missed
                )
            }
            _ => "no routing decisions yet".to_owned(),
        };
        frame.render_widget(Paragraph::new(label(text)), area);
        return;
    }
    let [caption, table] =
        Layout::vertical([Constraint::Length(1), Constraint::Min(0)]).areas(area);
    let newest = world.routes.back().map_or("", |r| r.score.as_str());
    let rule = match newest {
        "cost" => "score: cost, lower wins",
        "overlap" => "score: overlap, higher wins",
        _ => "score as the source weighs it",
    };
    frame.render_widget(
        Paragraph::new(label(format!(
            "last {} decisions, newest first · {} missed · {rule} · * winner",
            world.routes.len(),
            count(world.routes_missed)
        ))),
        caption,
    );
    let header = Row::new(
        [
            "decision",
            "",
            "worker",
            "  device",
            "    host",
            "    disk",
            "  remote",
            "     load",
            "    score",
        ]
        .map(Cell::from),
    )
    .style(Style::new().add_modifier(Modifier::BOLD | Modifier::UNDERLINED));
    let widths = [12, 1, 8, 8, 8, 8, 8, 9, 9].map(Constraint::Length);
    let height = table.height.saturating_sub(1) as usize;
    let selected = app.selected(world.routes.len());
    let first = window(selected, height.max(1));
    let mut rows = Vec::new();
    let mut highlight = None;
    'decisions: for (i, route) in world.routes.iter().rev().enumerate().skip(first) {
        if i == selected {
            highlight = Some(rows.len());
        }
        let decision = format!("#{} {}blk", route.seq, route.query_blocks);
        if route.candidates.is_empty() {
            rows.push(Row::new(vec![
                Cell::from(decision.clone()),
                Cell::from(""),
                Cell::from("no candidate"),
            ]));
        }
        for (c, candidate) in route.candidates.iter().enumerate() {
            if rows.len() == height {
                break 'decisions;
            }
            let won = route.winner == Some(candidate.key);
            let mut cells = vec![
                Cell::from(if c == 0 {
                    decision.clone()
                } else {
                    String::new()
                }),
                Cell::from(if won { "*" } else { "" }),
                Cell::from(candidate.key.to_string()),
            ];
            cells.extend(
                candidate
                    .overlap
                    .iter()
                    .map(|&o| Cell::from(format!("{:>8}", count(o)))),
            );
            cells.push(Cell::from(format!("{:>9}", count(candidate.load))));
            cells.push(Cell::from(format!("{:>9.2}", candidate.score)));
            let style = if won {
                Style::new().fg(Color::Green)
            } else {
                Style::new()
            };
            rows.push(Row::new(cells).style(style));
        }
        if rows.len() >= height {
            break;
        }
    }
    let mut state = ratatui::widgets::TableState::default().with_selected(highlight);
    let table_widget = Table::new(rows, widths)
        .header(header)
        .column_spacing(1)
        .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED))
        .highlight_symbol(">");
    frame.render_stateful_widget(table_widget, table, &mut state);
}
