//! `kvtwin sweep --plot DIR`: what a sweep says, drawn.
//!
//! Owns: the sweep's charts: p99 TTFT, p99 TPOT and the hit ratio against the grid's
//! first axis (one line per combination of the other axes, seeds averaged), when that
//! axis is numeric; and the TTFT and TPOT CDFs (to p99) of up to [`CDF_RUNS`] runs.
//! Never: run anything: it reads the sweep's lines.

use crate::plot::{self, Axes, Series};
use anyhow::{ensure, Result};
use kvtwin_sim::plan::summary::RunSummary;
use kvtwin_sim::plan::sweep::SweepLine;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Runs whose CDFs are drawn at most (spread over the sweep).
const CDF_RUNS: usize = 8;

/// Lines in one chart against the first axis at most.
const AXIS_SERIES: usize = 10;

/// `path=value`, with the path cut to its last two parts.
fn short(path: &str, value: &serde_json::Value) -> String {
    let parts: Vec<&str> = path.rsplitn(3, '.').collect();
    let tail = if parts.len() >= 2 {
        format!("{}.{}", parts[1], parts[0])
    } else {
        path.to_string()
    };
    let value = match value {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    format!("{tail}={value}")
}

/// A run's label: its overrides, short, and its seed when the sweep has several.
fn label(line: &SweepLine, seeds: bool) -> String {
    let mut words: Vec<String> = line.overrides.iter().map(|(p, v)| short(p, v)).collect();
    if seeds {
        words.push(format!("seed {}", line.seed));
    }
    words.join(" ")
}

/// Writes the sweep's charts into `dir`; returns the files written.
pub(crate) fn plot(dir: &Path, lines: &[SweepLine]) -> Result<Vec<PathBuf>> {
    let ran: Vec<(&SweepLine, &RunSummary)> = lines
        .iter()
        .filter_map(|l| l.summary.as_ref().map(|s| (l, s)))
        .collect();
    ensure!(!ran.is_empty(), "--plot: no run of the sweep finished");
    let seeds = {
        let mut seeds: Vec<u64> = ran.iter().map(|(l, _)| l.seed).collect();
        seeds.sort_unstable();
        seeds.dedup();
        seeds.len() > 1
    };
    let mut written = Vec::new();
    // Against the first axis, when its values are numbers.
    let numeric = ran
        .iter()
        .all(|(l, _)| l.overrides.first().is_some_and(|(_, v)| v.is_number()));
    if numeric {
        let axis = ran[0].0.overrides[0].0.clone();
        // (other overrides) → x → (sum of y per metric, count): seeds averaged.
        let mut groups: BTreeMap<String, BTreeMap<u64, ([f64; 3], f64)>> = BTreeMap::new();
        for (line, summary) in &ran {
            let rest: Vec<String> = line.overrides[1..]
                .iter()
                .map(|(p, v)| short(p, v))
                .collect();
            let x = line.overrides[0].1.as_f64().unwrap_or(f64::NAN);
            let entry = groups
                .entry(rest.join(" "))
                .or_default()
                .entry(x.to_bits())
                .or_insert(([0.0; 3], 0.0));
            entry.0[0] += summary.ttft.p99_ms;
            entry.0[1] += summary.tpot.p99_ms;
            entry.0[2] += summary.hit_ratio * 100.0;
            entry.1 += 1.0;
        }
        let charts = [
            ("ttft-p99", "p99 TTFT", "p99 TTFT (ms)"),
            ("tpot-p99", "p99 TPOT", "p99 TPOT (ms)"),
            ("hit-ratio", "hit ratio", "prompt blocks not computed (%)"),
        ];
        for (metric, (stem, what, y_label)) in charts.iter().enumerate() {
            let series: Vec<Series> = groups
                .iter()
                .take(AXIS_SERIES)
                .map(|(name, points)| {
                    let mut points: Vec<(f64, f64)> = points
                        .iter()
                        .map(|(x, (sums, n))| (f64::from_bits(*x), sums[metric] / n))
                        .collect();
                    points.sort_by(|a, b| a.0.total_cmp(&b.0));
                    Series {
                        name: if name.is_empty() {
                            what.to_string()
                        } else {
                            name.clone()
                        },
                        points,
                    }
                })
                .collect();
            let title = if seeds {
                format!("{what} against {axis} (mean over seeds)")
            } else {
                format!("{what} against {axis}")
            };
            written.extend(plot::lines(
                dir,
                stem,
                &Axes {
                    title: &title,
                    x_label: &axis,
                    y_label,
                    x_log: false,
                    y_log: false,
                },
                &series,
            )?);
        }
    }
    // CDFs of runs spread over the sweep.
    let step = ran.len().div_ceil(CDF_RUNS).max(1);
    let shown: Vec<&(&SweepLine, &RunSummary)> = ran.iter().step_by(step).collect();
    let runs: Vec<(String, &RunSummary)> = shown
        .iter()
        .map(|(line, summary)| (label(line, seeds), *summary))
        .collect();
    let what = format!("{} of {} runs", shown.len(), ran.len());
    written.extend(plot::latency_cdfs(dir, &what, &runs)?);
    Ok(written)
}
