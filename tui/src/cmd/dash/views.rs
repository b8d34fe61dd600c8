//! The table views: workers, integrity, transfers, and the drill-in on one worker.
//!
//! Owns: which columns fit the width (bars go first, then the less telling figures) and
//! the window of rows on screen.
//! Never: build a row that is not visible (1,000 workers cost what a screenful does,
//! beyond the sort), or change the app.

use ratatui::layout::{Alignment, Constraint, Layout, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span, Text};
use ratatui::widgets::{Cell, Paragraph, Row, Table, TableState};
use ratatui::Frame;

use super::app::{App, SortColumn};
use super::filter::{Status, Subject};
use super::model::{WorkerKey, TIER_NAMES};
use super::ui::{active_tiers, age, bar, bytes, count, label, percent, rate, warn_if};

/// The first row on screen so that `selected` is visible in `height` rows.
pub(super) fn window(selected: usize, height: usize) -> usize {
    if height == 0 {
        0
    } else {
        selected.saturating_sub(height - 1)
    }
}

/// Draws `rows` (only the visible ones: the caller slices) with `selected` highlighted.
fn draw_table(
    frame: &mut Frame,
    area: Rect,
    header: Vec<String>,
    widths: Vec<u16>,
    rows: Vec<Row<'static>>,
    selected: Option<usize>,
) {
    let header = Row::new(header.into_iter().map(Cell::from))
        .style(Style::new().add_modifier(Modifier::BOLD | Modifier::UNDERLINED));
    let table = Table::new(rows, widths.into_iter().map(Constraint::Length))
        .header(header)
        .column_spacing(1)
        .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED))
        .highlight_symbol(">");
    let mut state = TableState::default().with_selected(selected);
    frame.render_stateful_widget(table, area, &mut state);
}

/// A right-aligned cell.
fn right(text: String) -> Cell<'static> {
    Cell::from(Text::from(text).alignment(Alignment::Right))
}

/// The status cell: `restarted` when up with restarts, so the table shows it.
fn status_cell(s: &Subject) -> Cell<'static> {
    let status = s.status.unwrap_or(Status::Up);
    let text = match status {
        Status::Up if s.restarts > 0 => "restarted",
        other => other.name(),
    };
    Cell::from(text).style(warn_if(status != Status::Up || s.restarts > 0))
}

/// The workers view: one row per worker that passes the filter, in sort order.
pub(super) fn workers(app: &App, frame: &mut Frame, area: Rect) {
    let world = app.world();
    let rows = app.rows();
    if rows.is_empty() {
        let text = if world.workers.is_empty() {
            "no workers yet"
        } else {
            "no worker passes the filter (Esc clears it)"
        };
        frame.render_widget(Paragraph::new(label(text)), area);
        return;
    }
    let tiers = active_tiers(app);
    // Fixed columns: highlight 1, worker 8, status 9, events/s 9, age 7, gaps 6.
    let fixed: u16 = 1 + 8 + 9 + 9 + 7 + 6 + 5;
    let per_tier_number: u16 = 8;
    let spare = area
        .width
        .saturating_sub(fixed + tiers.len() as u16 * (per_tier_number + 1));
    let bar_width = (spare / tiers.len() as u16).saturating_sub(1).min(16);
    let bar_width = if bar_width >= 6 { bar_width } else { 0 };
    let tier_width = per_tier_number + if bar_width > 0 { bar_width + 1 } else { 0 };

    // Bars scale to capacity where known, else to the largest worker's blocks in the tier.
    let max_blocks: [u64; 4] = std::array::from_fn(|tier| {
        world
            .workers
            .values()
            .map(|e| e.row.blocks[tier])
            .max()
            .unwrap_or(0)
            .max(1)
    });
    let arrow = if app.descending { "▼" } else { "▲" };
    let title = |name: &str, column: SortColumn| {
        // Sorting by blocks under `tier=…` sorts by that tier's column.
        let scoped = app.sort == SortColumn::Blocks
            && app.filter.tier().map(SortColumn::Tier) == Some(column);
        if app.sort == column || scoped {
            format!("{name}{arrow}")
        } else {
            name.to_owned()
        }
    };
    let mut header = vec![
        title("worker", SortColumn::Worker),
        title("status", SortColumn::Status),
    ];
    let mut widths = vec![8, 9];
    for &tier in &tiers {
        let name = title(TIER_NAMES[tier], SortColumn::Tier(tier));
        header.push(format!("{name:>width$}", width = tier_width as usize));
        widths.push(tier_width);
    }
    header.extend([
        format!("{:>9}", title("events/s", SortColumn::Events)),
        format!("{:>7}", title("age", SortColumn::Age)),
        format!("{:>6}", title("gaps", SortColumn::Gaps)),
    ]);
    widths.extend([9, 7, 6]);

    let height = area.height.saturating_sub(1) as usize;
    let selected = app.selected(rows.len());
    let first = window(selected, height);
    let visible: Vec<Row> = rows
        .iter()
        .skip(first)
        .take(height)
        .map(|s| {
            let entry = &world.workers[&s.key];
            let mut cells = vec![Cell::from(s.key.to_string()), status_cell(s)];
            for &tier in &tiers {
                let blocks = s.blocks[tier];
                let number = format!("{:>7}", count(blocks));
                let text = if bar_width > 0 {
                    let share = match entry.row.capacity[tier] {
                        Some(cap) if cap > 0 => blocks as f64 / cap as f64,
                        _ => blocks as f64 / max_blocks[tier] as f64,
                    };
                    format!("{} {number}", bar(share, bar_width as usize))
                } else {
                    number
                };
                cells.push(right(text));
            }
            cells.push(right(rate(s.events_per_s)));
            cells.push(right(age(s.age_s)));
            cells.push(right(count(s.gaps)).style(warn_if(s.gaps > 0)));
            Row::new(cells)
        })
        .collect();
    draw_table(frame, area, header, widths, visible, Some(selected - first));
}

/// The integrity view: per worker, the health of its event stream.
pub(super) fn integrity(app: &App, frame: &mut Frame, area: Rect) {
    let world = app.world();
    let [summary, table] =
        Layout::vertical([Constraint::Length(1), Constraint::Min(0)]).areas(area);
    let mut spans = vec![label("cluster ")];
    match &world.counters {
        Some(c) => spans.push(Span::raw(format!(
            "batches {} · gaps {} · lost {} · restarts {} · dropped {}",
            count(c.batches),
            count(c.gaps),
            count(c.lost_batches),
            count(c.restarts),
            count(c.dropped)
        ))),
        None => spans.push(label("no counters from this source")),
    }
    if let Some(size) = world.block_size {
        spans.push(label(format!(" · block size {size}")));
    }
    frame.render_widget(Paragraph::new(Line::from(spans)), summary);

    let rows = app.rows();
    if rows.is_empty() {
        frame.render_widget(Paragraph::new(label("no worker to show")), table);
        return;
    }
    let header: Vec<String> = [
        "worker",
        "status",
        "  last id",
        "  gaps",
        "   ooo",
        "reconn",
        "bs-mis",
        "  lost",
        "rstrt",
        "stale",
        "   age",
    ]
    .map(String::from)
    .to_vec();
    let mut widths = vec![8, 9, 9, 6, 6, 6, 6, 6, 5, 5, 6];
    let mut header = header;
    // Drop from the right until it fits (1 for the highlight, 1 between columns).
    while widths.iter().sum::<u16>() + widths.len() as u16 + 1 > table.width && widths.len() > 2 {
        widths.pop();
        header.pop();
    }
    let height = table.height.saturating_sub(1) as usize;
    let selected = app.selected(rows.len());
    let first = window(selected, height);
    let visible: Vec<Row> = rows
        .iter()
        .skip(first)
        .take(height)
        .map(|s| {
            let entry = &world.workers[&s.key];
            let stale = s.status == Some(Status::Stale);
            let cells = vec![
                Cell::from(s.key.to_string()),
                status_cell(s),
                right(
                    entry
                        .row
                        .last_event_id
                        .map_or("-".to_owned(), |id| id.to_string()),
                ),
                right(count(s.gaps)).style(warn_if(s.gaps > 0)),
                right(count(s.out_of_order)).style(warn_if(s.out_of_order > 0)),
                right(count(s.reconnects)).style(warn_if(s.reconnects > 0)),
                right(count(s.mismatches)).style(warn_if(s.mismatches > 0)),
                right(count(s.lost)).style(warn_if(s.lost > 0)),
                right(count(s.restarts)).style(warn_if(s.restarts > 0)),
                Cell::from(if stale { "stale" } else { "" }).style(warn_if(stale)),
                right(age(s.age_s)),
            ];
            Row::new(cells.into_iter().take(widths.len()).collect::<Vec<_>>())
        })
        .collect();
    draw_table(
        frame,
        table,
        header,
        widths,
        visible,
        Some(selected - first),
    );
}

/// The transfers view: per link, bytes/s from its cumulative bytes, and utilisation.
pub(super) fn transfers(app: &App, frame: &mut Frame, area: Rect) {
    let world = app.world();
    if world.links.is_empty() {
        frame.render_widget(
            Paragraph::new(label("no transfer data from this source")),
            area,
        );
        return;
    }
    let bar_width = area
        .width
        .saturating_sub(1 + 8 + 22 + 11 + 12 + 7 + 6)
        .clamp(0, 30);
    let mut header: Vec<String> = ["worker", "link", "      total", "     bytes/s", "  util"]
        .map(String::from)
        .to_vec();
    let mut widths = vec![8, 22, 11, 12, 6];
    if bar_width >= 6 {
        header.push(String::new());
        widths.push(bar_width);
    }
    let height = area.height.saturating_sub(1) as usize;
    let selected = app.selected(world.links.len());
    let first = window(selected, height);
    let now = world.now_ms;
    let visible: Vec<Row> = world
        .links
        .values()
        .skip(first)
        .take(height)
        .map(|link| {
            let who = link
                .row
                .worker
                .map_or("fabric".to_owned(), |w| w.to_string());
            let util = link.row.utilisation;
            let mut cells = vec![
                Cell::from(who),
                Cell::from(link.row.link.clone()),
                right(bytes(link.row.bytes as f64)),
                right(format!("{}/s", bytes(link.bytes.rate_per_s(now)))),
                right(util.map_or("-".to_owned(), |u| format!("{:.0}%", u * 100.0))),
            ];
            if bar_width >= 6 {
                cells.push(Cell::from(
                    util.map_or(String::new(), |u| bar(u, bar_width as usize)),
                ));
            }
            Row::new(cells)
        })
        .collect();
    draw_table(frame, area, header, widths, visible, Some(selected - first));
}

/// The drill-in: every figure the dashboard has for one worker.
pub(super) fn detail(app: &App, key: WorkerKey, frame: &mut Frame, area: Rect) {
    let world = app.world();
    let Some(entry) = world.workers.get(&key) else {
        frame.render_widget(
            Paragraph::new(label(format!("worker {key} is gone (Esc back)"))),
            area,
        );
        return;
    };
    let s = world.subject(entry, app.config.stale_after_ms);
    let row = &entry.row;
    let status = s.status.unwrap_or(Status::Up);
    let pair = |name: &str, value: String| vec![label(format!("{name:>22}  ")), Span::raw(value)];
    let mut lines = vec![
        Line::from(pair(
            "worker",
            format!("{key} (id {}, rank {})", key.worker, key.dp_rank),
        )),
        Line::from(pair("status", status.name().to_owned())),
        Line::from(pair(
            "first seen",
            format!(
                "{} ago",
                age(Some(
                    world.now_ms.saturating_sub(entry.first_seen_ms) as f64 / 1e3
                ))
            ),
        )),
        Line::from(pair(
            "last event",
            match s.age_s {
                Some(a) => format!("{} ago", age(Some(a))),
                None => "none since first seen".to_owned(),
            },
        )),
        Line::from(pair(
            "events",
            format!("{} total · {}/s", count(row.events), rate(s.events_per_s)),
        )),
    ];
    let bar_width = (area.width as usize).saturating_sub(24 + 30).min(30);
    for (tier, name) in TIER_NAMES.iter().enumerate() {
        let blocks = row.blocks[tier];
        let value = match row.capacity[tier] {
            Some(cap) if cap > 0 => {
                let share = blocks as f64 / cap as f64;
                let bar = if bar_width >= 6 {
                    format!("  {}", bar(share, bar_width))
                } else {
                    String::new()
                };
                format!(
                    "{} of {} ({}){bar}",
                    count(blocks),
                    count(cap),
                    percent(share)
                )
            }
            Some(_) => format!("{} (no capacity)", count(blocks)),
            None => count(blocks),
        };
        lines.push(Line::from(pair(&format!("{name} blocks"), value)));
    }
    let figures = [
        (
            "last event id",
            row.last_event_id
                .map_or("-".to_owned(), |id| id.to_string()),
        ),
        ("gaps", count(row.gaps)),
        ("out of order", count(row.out_of_order)),
        ("reconnects", count(row.reconnects)),
        ("block-size mismatches", count(row.block_size_mismatches)),
        ("lost batches", count(row.lost_batches)),
        ("restarts", count(row.restarts)),
    ];
    for (name, value) in figures {
        lines.push(Line::from(pair(name, value)));
    }
    if let Some(size) = row.refused_block_size {
        // Why the router leaves this worker out: its blocks can never match a query.
        lines.push(Line::from(pair(
            "refused",
            format!("its events announce {size}-token blocks, not the router's"),
        )));
    }
    if let Some(reason) = &row.down_reason {
        lines.push(Line::from(pair("down", reason.clone())));
    }
    let known = |v: Option<u64>| v.map_or("-".to_owned(), count);
    lines.push(Line::from(pair(
        "requests",
        format!(
            "queued {} · running {} · routed {} · completed {}",
            known(row.queued),
            known(row.running),
            known(row.routed),
            known(row.completed)
        ),
    )));
    let decided = world.routes.len();
    let won = world
        .routes
        .iter()
        .filter(|r| r.winner == Some(key))
        .count();
    if decided > 0 {
        lines.push(Line::from(pair(
            "routes won",
            format!("{won} of the last {decided} decisions"),
        )));
    }
    frame.render_widget(Paragraph::new(lines), area);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_window_keeps_the_selection_visible() {
        assert_eq!(window(0, 10), 0);
        assert_eq!(window(9, 10), 0);
        assert_eq!(window(10, 10), 1);
        assert_eq!(window(500, 0), 0);
    }
}
