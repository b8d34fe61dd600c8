//! The charts of an autoscaled run: each pool's workers over time, the load they
//! served (requests per second), and the share of requests within the SLO.
//!
//! Owns: the choice of series and axes for `kvtwin run --plot`.
//! Never: draw (`plot` does) or run anything.

use crate::plot::{self, Axes, Series};
use anyhow::{ensure, Result};
use kvtwin_sim::autoscale::AutoscaleReport;
use std::path::{Path, PathBuf};

/// Writes DIR/autoscale-replicas, DIR/autoscale-load and DIR/autoscale-slo (SVG and
/// PNG); returns the files.
pub(crate) fn charts(dir: &Path, scenario: &str, report: &AutoscaleReport) -> Result<Vec<PathBuf>> {
    ensure!(
        !report.intervals.is_empty(),
        "the run ended before its first interval: nothing to plot"
    );
    // Hours read better than seconds over a day; short runs stay in minutes.
    let span_s = report.intervals.last().map_or(0.0, |s| s.at_s);
    let (unit, per) = if span_s >= 3.0 * 3600.0 {
        ("hours", 3600.0)
    } else {
        ("minutes", 60.0)
    };
    let x_label = format!("simulated time ({unit})");
    let mut replicas: Vec<Series> = report
        .pools
        .iter()
        .enumerate()
        .map(|(p, pool)| Series {
            name: format!("{pool} serving"),
            points: report
                .intervals
                .iter()
                .map(|s| (s.at_s / per, s.serving[p] as f64))
                .collect(),
        })
        .collect();
    for (p, pool) in report.pools.iter().enumerate() {
        if report
            .intervals
            .iter()
            .any(|s| s.loading[p] + s.draining[p] > 0)
        {
            replicas.push(Series {
                name: format!("{pool} paid (loading, draining)"),
                points: report
                    .intervals
                    .iter()
                    .map(|s| {
                        (
                            s.at_s / per,
                            (s.serving[p] + s.loading[p] + s.draining[p]) as f64,
                        )
                    })
                    .collect(),
            });
        }
    }
    let title = format!("{scenario}: workers per pool ({})", report.planner);
    let mut files = plot::lines(
        dir,
        "autoscale-replicas",
        &Axes {
            title: &title,
            x_label: &x_label,
            y_label: "workers",
            x_log: false,
            y_log: false,
        },
        &replicas,
    )?;
    let load = [Series {
        name: "requests per second (arrived in the interval)".to_string(),
        points: report
            .intervals
            .iter()
            .map(|s| (s.at_s / per, s.request_rate))
            .collect(),
    }];
    let title = format!("{scenario}: load");
    files.extend(plot::lines(
        dir,
        "autoscale-load",
        &Axes {
            title: &title,
            x_label: &x_label,
            y_label: "requests per second",
            x_log: false,
            y_log: false,
        },
        &load,
    )?);
    let slo = [Series {
        name: "finished within the SLO".to_string(),
        points: report
            .intervals
            .iter()
            .filter(|s| s.finished > 0)
            .map(|s| (s.at_s / per, 100.0 * s.attainment))
            .collect(),
    }];
    let title = format!(
        "{scenario}: SLO attainment per interval ({})",
        report.planner
    );
    files.extend(plot::lines(
        dir,
        "autoscale-slo",
        &Axes {
            title: &title,
            x_label: &x_label,
            y_label: "% of the requests finished",
            x_log: false,
            y_log: false,
        },
        &slo,
    )?);
    Ok(files)
}
