//! `kvtwin plan --plot DIR`: the planner's pictures.
//!
//! Owns: what is drawn for a plan: the two Pareto fronts (cost against the SLO's first
//! metric; tokens/s/gpu against tokens/s/user), one series and one front per category;
//! the TTFT and TPOT CDFs of the chosen point and the other points on the cost front; and
//! occupancy per tier over time for the chosen point (one more run, sampled).
//! Never: draw (`plot` does) or decide what is chosen (the search did).

use crate::cmd::plan::output::{describe, Report};
use crate::plot::{self, Axes, Series};
use anyhow::{Context, Result};
use kvtwin_sim::plan::pareto::{front, Better, Row};
use kvtwin_sim::plan::run::{configure, Workload};
use kvtwin_sim::plan::summary::RunSummary;
use kvtwin_sim::plan::timeline::run_with_occupancy;
use kvtwin_sim::scenario::Scenario;
use std::path::{Path, PathBuf};

/// Lines in one CDF chart at most (the chosen point and the cheapest of the front).
const CDF_SERIES: usize = 6;

/// Occupancy samples over the run of the chosen point.
const OCCUPANCY_SAMPLES: usize = 300;

/// Rows per category (in category order), as markers, and each category's front.
fn by_category(
    report: &Report,
    xy: impl Fn(&Row) -> (f64, f64),
    x: Better,
    y: Better,
) -> (Vec<Series>, Vec<Series>) {
    let mut labels: Vec<&str> = Vec::new();
    for row in &report.rows {
        if !labels.contains(&row.config.as_str()) {
            labels.push(&row.config);
        }
    }
    let mut markers = Vec::new();
    let mut fronts = Vec::new();
    for label in labels {
        let points: Vec<(f64, f64)> = report
            .rows
            .iter()
            .filter(|r| r.config == label)
            .map(&xy)
            .filter(|(a, b)| a.is_finite() && b.is_finite())
            .collect();
        let on = front(&points, x, y);
        fronts.push(Series {
            name: format!("{label} front"),
            points: on.iter().map(|i| points[*i]).collect(),
        });
        markers.push(Series {
            name: label.to_string(),
            points,
        });
    }
    (markers, fronts)
}

/// Writes the plan's plots into `dir`; returns the files written.
pub(crate) fn plot(
    dir: &Path,
    report: &Report,
    base: &Scenario,
    workload: &Workload,
) -> Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    let outcome = report.outcome();
    let points = report.points();
    // One cost chart per bound of the SLO: the binding one may be any of them.
    for (metric, bound) in &report.slo().bounds {
        let metric_of = |row: &Row| {
            outcome.runs[&row.point]
                .summary
                .metric(metric)
                .unwrap_or(f64::NAN)
        };
        let (markers, mut fronts) = by_category(
            report,
            |r| (r.usd_per_hour, metric_of(r)),
            Better::Lower,
            Better::Lower,
        );
        // The bound as a line across the runs' costs: what lies under it meets it.
        let (low, high) = report
            .rows
            .iter()
            .map(|r| r.usd_per_hour)
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), c| {
                (l.min(c), h.max(c))
            });
        if low.is_finite() && high.is_finite() {
            fronts.push(Series {
                name: format!("SLO: {metric} ≤ {bound} ms"),
                points: vec![(low, *bound), (high, *bound)],
            });
        }
        let title = format!("cost against {metric}, runs made");
        let y_label = format!("{metric} (ms)");
        written.extend(plot::scatter(
            dir,
            &format!("pareto-cost-{metric}"),
            &Axes {
                title: &title,
                x_label: "cost (US$ per hour)",
                y_label: &y_label,
                x_log: false,
                y_log: false,
            },
            &markers,
            &fronts,
        )?);
    }
    let (markers, fronts) = by_category(
        report,
        |r| (r.tokens_per_s_per_user, r.tokens_per_s_per_gpu),
        Better::Higher,
        Better::Higher,
    );
    written.extend(plot::scatter(
        dir,
        "pareto-throughput",
        &Axes {
            title: "throughput per GPU against speed per user, runs made",
            x_label: "tokens/s/user (1000 / mean TPOT)",
            y_label: "tokens/s/gpu (output tokens)",
            x_log: false,
            y_log: false,
        },
        &markers,
        &fronts,
    )?);
    // The chosen point first, then the cheapest others of the cost front.
    let mut shown: Vec<usize> = outcome.chosen.into_iter().collect();
    for index in report.front_cost.iter().map(|i| report.rows[*i].point) {
        if shown.len() < CDF_SERIES && !shown.contains(&index) {
            shown.push(index);
        }
    }
    let runs: Vec<(String, &RunSummary)> = shown
        .iter()
        .map(|index| {
            let name = describe(points, &points.points[*index]);
            let name = if Some(*index) == outcome.chosen {
                format!("chosen: {name}")
            } else {
                name
            };
            (name, &outcome.runs[index].summary)
        })
        .collect();
    if !runs.is_empty() {
        written.extend(plot::latency_cdfs(
            dir,
            "the chosen point and the cost front",
            &runs,
        )?);
    }
    if let Some(index) = outcome.chosen.or_else(|| outcome.closest()) {
        let point = &points.points[index];
        let scenario = configure(base, &point.sets, base.seed)?;
        let requests = workload.requests(&scenario);
        let (_, _, samples) = run_with_occupancy(&scenario, &requests, OCCUPANCY_SAMPLES)
            .context("running the chosen point for its occupancy")?;
        let title = format!("blocks in use per tier: {}", describe(points, point));
        written.extend(plot::occupancy(dir, "occupancy", &title, &samples)?);
    }
    Ok(written)
}
