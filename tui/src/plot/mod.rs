//! Charts as files: every chart is written twice, as DIR/STEM.svg and DIR/STEM.png.
//!
//! Owns: [`Series`], [`Axes`] and the four chart shapes the command line draws: [`lines`],
//! [`scatter`] (points with their Pareto fronts), [`cdfs`] and [`occupancy`] (tiers over
//! time). Ranges come from the data with a margin; a point that is NaN or infinite, or not
//! positive on a log axis, is skipped, and a chart with nothing left to draw is an error.
//! Text is drawn with DejaVu Sans, embedded in the binary through the `dejavu` crate and
//! registered with plotters' `ab_glyph` renderer, so no system font library is needed.
//! What each command draws (the series, axes and file names) is chosen in a submodule:
//! [`autoscale`] (`kvtwin run --plot`), [`cache`] (`kvtwin cache --curve --plot`),
//! [`plan`] and [`sweep`].
//! Never: compute what it draws (callers pass finished numbers, with units in the axis
//! labels) or print anything.

pub(crate) mod autoscale;
pub(crate) mod cache;
pub(crate) mod plan;
pub(crate) mod sweep;

use anyhow::{bail, ensure, Context, Result};
use kvtwin::tier::Tier;
use kvtwin_sim::plan::summary::{RunSummary, CDF_PERCENTS};
use kvtwin_sim::plan::timeline::OccupancySample;
use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::{register_font, FontStyle};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// One named line or set of points.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Series {
    /// The legend's label.
    pub(crate) name: String,
    /// (x, y) in the caller's units.
    pub(crate) points: Vec<(f64, f64)>,
}

/// A chart's title and axes; labels carry their units, e.g. "capacity (GiB)".
#[derive(Clone, Copy, Debug)]
pub(crate) struct Axes<'a> {
    pub(crate) title: &'a str,
    pub(crate) x_label: &'a str,
    pub(crate) y_label: &'a str,
    pub(crate) x_log: bool,
    pub(crate) y_log: bool,
}

/// Pixels of the PNG (and the SVG's view box).
const SIZE: (u32, u32) = (1280, 800);
const TITLE_PX: u32 = 34;
const AXIS_LABEL_PX: u32 = 26;
const TICK_PX: u32 = 20;
const LEGEND_PX: u32 = 22;
const LINE_WIDTH: u32 = 3;
const MARKER_RADIUS: u32 = 5;
/// Lines with at most this many points also get a marker at each one, so the reader
/// sees where the data are and where the line only interpolates.
const MARKED_LINE_POINTS: usize = 60;

/// Tableau's ten colours: distinct, and told apart by most colour-blind readers.
const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// Writes DIR/STEM.svg and DIR/STEM.png (creating DIR); returns both paths.
pub(crate) fn lines(
    dir: &Path,
    stem: &str,
    axes: &Axes,
    series: &[Series],
) -> Result<Vec<PathBuf>> {
    let chart = Chart {
        axes,
        lines: series,
        markers: &[],
        y_range: None,
    };
    chart.write(dir, stem)
}

/// Points of each series as markers, plus `fronts` drawn as lines (a Pareto front per
/// series, in the colour of the series at the same index), legend for both.
pub(crate) fn scatter(
    dir: &Path,
    stem: &str,
    axes: &Axes,
    points: &[Series],
    fronts: &[Series],
) -> Result<Vec<PathBuf>> {
    let chart = Chart {
        axes,
        lines: fronts,
        markers: points,
        y_range: None,
    };
    chart.write(dir, stem)
}

/// CDFs: each series' points are (value, percent 0..=100); y axis "percent of requests".
pub(crate) fn cdfs(
    dir: &Path,
    stem: &str,
    title: &str,
    x_label: &str,
    series: &[Series],
) -> Result<Vec<PathBuf>> {
    let axes = Axes {
        title,
        x_label,
        y_label: "percent of requests",
        x_log: false,
        y_log: false,
    };
    let chart = Chart {
        axes: &axes,
        lines: series,
        markers: &[],
        // A little above 100 so that the top of each CDF is not hidden by the frame.
        y_range: Some(0.0..102.0),
    };
    chart.write(dir, stem)
}

/// The TTFT and TPOT CDFs of `runs` (label, summary) up to p99 (the maximum alone would
/// stretch the axis tenfold), as `cdf-ttft` and `cdf-tpot`; `what` ends their titles.
pub(crate) fn latency_cdfs(
    dir: &Path,
    what: &str,
    runs: &[(String, &RunSummary)],
) -> Result<Vec<PathBuf>> {
    let series = |pick: fn(&RunSummary) -> &Vec<f64>| -> Vec<Series> {
        runs.iter()
            .map(|(name, summary)| Series {
                name: name.clone(),
                points: pick(summary)
                    .iter()
                    .copied()
                    .zip(CDF_PERCENTS)
                    .filter(|(_, percent)| *percent <= 99.0)
                    .collect(),
            })
            .collect()
    };
    let mut written = cdfs(
        dir,
        "cdf-ttft",
        &format!("TTFT up to p99: {what}"),
        "time to first token (ms)",
        &series(|s| &s.ttft_cdf_ms),
    )?;
    written.extend(cdfs(
        dir,
        "cdf-tpot",
        &format!("TPOT up to p99: {what}"),
        "time per output token (ms)",
        &series(|s| &s.tpot_cdf_ms),
    )?);
    Ok(written)
}

/// Occupancy per tier over time, percent of capacity, one line per tier that has capacity.
pub(crate) fn occupancy(
    dir: &Path,
    stem: &str,
    title: &str,
    samples: &[OccupancySample],
) -> Result<Vec<PathBuf>> {
    ensure!(!samples.is_empty(), "occupancy chart {stem}: no samples");
    let series: Vec<Series> = Tier::ALL
        .iter()
        .filter_map(|tier| {
            let i = tier.index();
            let capacity = samples.iter().map(|s| s.capacity_blocks[i]).max()?;
            (capacity > 0).then(|| Series {
                name: format!("{tier} ({capacity} blocks)"),
                points: samples
                    .iter()
                    .filter(|s| s.capacity_blocks[i] > 0)
                    .map(|s| {
                        let percent = 100.0 * s.used_blocks[i] as f64 / s.capacity_blocks[i] as f64;
                        (s.at_s, percent)
                    })
                    .collect(),
            })
        })
        .collect();
    ensure!(
        !series.is_empty(),
        "occupancy chart {stem}: no tier has any capacity"
    );
    let axes = Axes {
        title,
        x_label: "simulated time (s)",
        y_label: "occupancy (% of capacity)",
        x_log: false,
        y_log: false,
    };
    let chart = Chart {
        axes: &axes,
        lines: &series,
        markers: &[],
        y_range: Some(0.0..105.0),
    };
    chart.write(dir, stem)
}

/// What one chart draws: `lines[i]` and `markers[i]` share colour `i`.
struct Chart<'a> {
    axes: &'a Axes<'a>,
    lines: &'a [Series],
    markers: &'a [Series],
    /// A fixed y range (percentages), or `None` for one from the data.
    y_range: Option<Range<f64>>,
}

impl Chart<'_> {
    fn write(&self, dir: &Path, stem: &str) -> Result<Vec<PathBuf>> {
        ensure!(
            !stem.is_empty() && !stem.contains(['/', '\\']),
            "chart name {stem:?}: a file stem, without a directory"
        );
        if self.lines.is_empty() && self.markers.is_empty() {
            bail!("chart {stem}: no series to draw");
        }
        let drawable =
            Drawable::of(self).with_context(|| format!("chart {stem} ({})", self.axes.title))?;
        fonts()?;
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let svg = dir.join(format!("{stem}.svg"));
        let png = dir.join(format!("{stem}.png"));
        drawable
            .render(SVGBackend::new(&svg, SIZE).into_drawing_area())
            .with_context(|| format!("writing {}", svg.display()))?;
        drawable
            .render(BitMapBackend::new(&png, SIZE).into_drawing_area())
            .with_context(|| format!("writing {}", png.display()))?;
        Ok(vec![svg, png])
    }
}

/// Registers the embedded font once per process.
fn fonts() -> Result<()> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let registered = *REGISTERED.get_or_init(|| {
        register_font("sans-serif", FontStyle::Normal, dejavu::sans::regular()).is_ok()
            && register_font("sans-serif", FontStyle::Bold, dejavu::sans::bold()).is_ok()
    });
    ensure!(registered, "the embedded DejaVu Sans font did not load");
    Ok(())
}

/// A chart's series with only the points that can be drawn, and its ranges.
struct Drawable<'a> {
    axes: &'a Axes<'a>,
    lines: Vec<(&'a str, Vec<(f64, f64)>)>,
    markers: Vec<(&'a str, Vec<(f64, f64)>)>,
    x: Range<f64>,
    y: Range<f64>,
}

impl<'a> Drawable<'a> {
    fn of(chart: &Chart<'a>) -> Result<Self> {
        let axes = chart.axes;
        let keep = |series: &'a [Series]| -> Vec<(&'a str, Vec<(f64, f64)>)> {
            series
                .iter()
                .map(|s| {
                    let points = s
                        .points
                        .iter()
                        .copied()
                        .filter(|&(x, y)| {
                            x.is_finite()
                                && y.is_finite()
                                && (!axes.x_log || x > 0.0)
                                && (!axes.y_log || y > 0.0)
                        })
                        .collect();
                    (s.name.as_str(), points)
                })
                .collect()
        };
        let lines = keep(chart.lines);
        let markers = keep(chart.markers);
        let all = || {
            lines
                .iter()
                .chain(&markers)
                .flat_map(|(_, points)| points.iter().copied())
        };
        let Some(x) = range_of(all().map(|p| p.0), axes.x_log) else {
            bail!(
                "no point to draw (every point is NaN, infinite{})",
                if axes.x_log || axes.y_log {
                    " or not positive on a log axis"
                } else {
                    ""
                }
            );
        };
        let y = match &chart.y_range {
            Some(fixed) => fixed.clone(),
            None => range_of(all().map(|p| p.1), axes.y_log).unwrap_or(0.0..1.0),
        };
        Ok(Self {
            axes,
            lines,
            markers,
            x,
            y,
        })
    }

    fn render<DB>(&self, root: DrawingArea<DB, Shift>) -> Result<()>
    where
        DB: DrawingBackend,
        DB::ErrorType: 'static,
    {
        root.fill(&WHITE)?;
        let (x, y) = (self.x.clone(), self.y.clone());
        // Log axes get their own ticks: plotters' own start at the first power of ten,
        // leaving everything below it unlabelled.
        let log = |range: Range<f64>| {
            let (bold, light) = log_ticks(&range);
            range
                .log_scale()
                .with_key_points(bold)
                .with_light_points(light)
        };
        match (self.axes.x_log, self.axes.y_log) {
            (false, false) => self.draw(&root, x, y)?,
            (true, false) => self.draw(&root, log(x), y)?,
            (false, true) => self.draw(&root, x, log(y))?,
            (true, true) => self.draw(&root, log(x), log(y))?,
        }
        root.present()?;
        Ok(())
    }

    fn draw<DB, X, Y>(&self, root: &DrawingArea<DB, Shift>, x: X, y: Y) -> Result<()>
    where
        DB: DrawingBackend,
        DB::ErrorType: 'static,
        X: AsRangedCoord<Value = f64>,
        Y: AsRangedCoord<Value = f64>,
        X::CoordDescType: ValueFormatter<f64>,
        Y::CoordDescType: ValueFormatter<f64>,
    {
        let mut chart = ChartBuilder::on(root)
            .caption(self.axes.title, ("sans-serif", TITLE_PX))
            .margin(24)
            .x_label_area_size(70)
            .y_label_area_size(100)
            .build_cartesian_2d(x, y)?;
        chart
            .configure_mesh()
            .x_desc(self.axes.x_label)
            .y_desc(self.axes.y_label)
            .x_labels(12)
            .y_labels(11)
            .x_label_formatter(&|v| number(*v))
            .y_label_formatter(&|v| number(*v))
            .label_style(("sans-serif", TICK_PX))
            .axis_desc_style(("sans-serif", AXIS_LABEL_PX))
            .bold_line_style(RGBColor(200, 200, 200))
            .light_line_style(RGBColor(236, 236, 236))
            .draw()?;
        for (i, (name, points)) in self.lines.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            chart
                .draw_series(LineSeries::new(
                    points.iter().copied(),
                    color.stroke_width(LINE_WIDTH),
                ))?
                .label(*name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 28, y)], color.stroke_width(LINE_WIDTH))
                });
            if points.len() <= MARKED_LINE_POINTS {
                chart.draw_series(
                    points
                        .iter()
                        .map(|p| Circle::new(*p, MARKER_RADIUS - 1, color.filled())),
                )?;
            }
        }
        for (i, (name, points)) in self.markers.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            chart
                .draw_series(
                    points
                        .iter()
                        .map(|p| Circle::new(*p, MARKER_RADIUS, color.filled())),
                )?
                .label(*name)
                .legend(move |(x, y)| Circle::new((x + 14, y), MARKER_RADIUS, color.filled()));
        }
        chart
            .configure_series_labels()
            .position(self.legend_corner())
            .label_font(("sans-serif", LEGEND_PX))
            // Room for the 28-pixel line sample before the text.
            .legend_area_size(44)
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(160, 160, 160))
            .margin(12)
            .draw()?;
        Ok(())
    }

    /// The corner of the plot with the fewest data in it, for the legend: lines are
    /// sampled along their segments, since a line crosses corners between its points.
    fn legend_corner(&self) -> SeriesLabelPosition {
        let unit = |v: f64, range: &Range<f64>, log: bool| {
            let (v, lo, hi) = if log {
                (v.ln(), range.start.ln(), range.end.ln())
            } else {
                (v, range.start, range.end)
            };
            (v - lo) / (hi - lo)
        };
        let mut crowd = [0usize; 4];
        let corners = [
            SeriesLabelPosition::UpperLeft,
            SeriesLabelPosition::UpperRight,
            SeriesLabelPosition::LowerRight,
            SeriesLabelPosition::LowerLeft,
        ];
        let mut count = |x: f64, y: f64| {
            let (u, v) = (
                unit(x, &self.x, self.axes.x_log),
                unit(y, &self.y, self.axes.y_log),
            );
            let (left, right, low, high) = (u < 0.4, u > 0.6, v < 0.4, v > 0.6);
            for (corner, inside) in [high && left, high && right, low && right, low && left]
                .into_iter()
                .enumerate()
            {
                crowd[corner] += usize::from(inside);
            }
        };
        for (_, points) in &self.lines {
            for pair in points.windows(2) {
                let ((x0, y0), (x1, y1)) = (pair[0], pair[1]);
                for step in 0..16 {
                    let t = step as f64 / 16.0;
                    count(x0 + (x1 - x0) * t, y0 + (y1 - y0) * t);
                }
            }
            if let Some(&(x, y)) = points.last() {
                count(x, y);
            }
        }
        for (_, points) in &self.markers {
            for &(x, y) in points {
                count(x, y);
            }
        }
        let best = (0..4).min_by_key(|&i| crowd[i]).unwrap_or(0);
        corners[best].clone()
    }
}

/// The range of `values` with a margin: 5 % of the span on a linear axis (not below 0 if
/// no value is), a factor of 1.3 on a log axis; `None` without values.
fn range_of(values: impl Iterator<Item = f64>, log: bool) -> Option<Range<f64>> {
    let (lo, hi) = values.fold(None, |range: Option<(f64, f64)>, v| match range {
        None => Some((v, v)),
        Some((lo, hi)) => Some((lo.min(v), hi.max(v))),
    })?;
    if log {
        let (lo, hi) = if lo == hi {
            (lo / 2.0, hi * 2.0)
        } else {
            (lo, hi)
        };
        return Some(lo / 1.3..hi * 1.3);
    }
    let span = if hi > lo { hi - lo } else { lo.abs().max(1.0) };
    let start = lo - 0.05 * span;
    let start = if lo >= 0.0 { start.max(0.0) } else { start };
    Some(start..hi + 0.05 * span)
}

/// Labelled and light ticks of a log axis over `range` (positive): 1, 2, 5 × 10^k over
/// two or three decades, powers of ten over more, every digit over one; light lines at
/// every digit × 10^k.
fn log_ticks(range: &Range<f64>) -> (Vec<f64>, Vec<f64>) {
    let (lo, hi) = (range.start, range.end);
    let decades = (hi / lo).log10();
    let digits: &[f64] = if decades > 3.5 {
        &[1.0]
    } else if decades > 1.2 {
        &[1.0, 2.0, 5.0]
    } else {
        &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]
    };
    let ticks = |digits: &[f64]| -> Vec<f64> {
        let (first, last) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
        (first..=last)
            .flat_map(|k| digits.iter().map(move |d| d * 10f64.powi(k)))
            .filter(|v| (lo..=hi).contains(v))
            .collect()
    };
    (
        ticks(digits),
        ticks(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]),
    )
}

/// A tick label: at most three significant decimals, no trailing zeros, and powers of
/// ten for very large or small magnitudes.
fn number(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        return "0".to_string();
    }
    if !(1e-3..1e6).contains(&a) {
        return format!("{v:.1e}").replace(".0e", "e");
    }
    let decimals = match a {
        a if a >= 100.0 => 0,
        a if a >= 10.0 => 1,
        a if a >= 1.0 => 2,
        _ => 3,
    };
    let text = format!("{v:.decimals$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(name: &str, points: &[(f64, f64)]) -> Series {
        Series {
            name: name.to_string(),
            points: points.to_vec(),
        }
    }

    /// Keeps a test's charts in `KVTWIN_PLOT_SAMPLES` (when set) for a person to look at.
    fn keep(paths: &[PathBuf]) {
        let Ok(dir) = std::env::var("KVTWIN_PLOT_SAMPLES") else {
            return;
        };
        std::fs::create_dir_all(&dir).unwrap();
        for path in paths {
            std::fs::copy(path, Path::new(&dir).join(path.file_name().unwrap())).unwrap();
        }
    }

    const PNG_SIGNATURE: [u8; 8] = [0x89, b'P', b'N', b'G', b'\r', b'\n', 0x1a, b'\n'];

    fn check_files(paths: &[PathBuf], texts: &[&str]) {
        assert_eq!(paths.len(), 2);
        let svg = std::fs::read_to_string(&paths[0]).unwrap();
        for text in texts {
            assert!(svg.contains(text), "the SVG lacks {text:?}");
        }
        let png = std::fs::read(&paths[1]).unwrap();
        assert_eq!(png[..8], PNG_SIGNATURE);
        assert!(png.len() > 10_000, "a PNG of {} bytes is blank", png.len());
    }

    #[test]
    fn lines_write_an_svg_with_the_title_and_labels_and_a_png() {
        let dir = tempfile::tempdir().unwrap();
        let axes = Axes {
            title: "hit ratio by capacity",
            x_label: "capacity (GiB)",
            y_label: "hit ratio (%)",
            x_log: true,
            y_log: false,
        };
        let curve: Vec<(f64, f64)> = (0..14)
            .map(|i| {
                (
                    0.0625 * 2f64.powi(i),
                    36.0 * (1.0 - (-(i as f64) / 4.0).exp()),
                )
            })
            .collect();
        let paths = lines(
            dir.path(),
            "curve",
            &axes,
            &[
                series("hit_blocks", &curve),
                series("zero first", &[(0.0, 1.0), (1.0, 2.0)]),
            ],
        )
        .unwrap();
        assert_eq!(paths[0], dir.path().join("curve.svg"));
        assert_eq!(paths[1], dir.path().join("curve.png"));
        check_files(
            &paths,
            &[
                "hit ratio by capacity",
                "capacity (GiB)",
                "hit ratio (%)",
                "hit_blocks",
            ],
        );
    }

    #[test]
    fn scatter_cdfs_and_occupancy_render_synthetic_data() {
        let dir = tempfile::tempdir().unwrap();
        let nested = dir.path().join("a/b");
        let axes = Axes {
            title: "cost against p99 TTFT",
            x_label: "GPU hours per 1,000 requests",
            y_label: "p99 TTFT (ms)",
            x_log: false,
            y_log: true,
        };
        let cloud = |seed: u64, scale: f64| -> Vec<(f64, f64)> {
            (0..40u64)
                .map(|i| {
                    let h = (i * 2_654_435_761 + seed * 97) % 1_000;
                    let x = 1.0 + (i as f64) * 0.2;
                    (x, scale * (200.0 / x + h as f64 / 10.0))
                })
                .collect()
        };
        let front = |points: &[(f64, f64)]| -> Vec<(f64, f64)> {
            let mut sorted = points.to_vec();
            sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
            let mut best = f64::INFINITY;
            sorted.retain(|p| {
                let keep = p.1 < best;
                best = best.min(p.1);
                keep
            });
            sorted
        };
        let (a, b) = (cloud(1, 1.0), cloud(2, 1.6));
        let paths = scatter(
            &nested,
            "pareto",
            &axes,
            &[series("LRU", &a), series("priority", &b)],
            &[
                series("LRU front", &front(&a)),
                series("priority front", &front(&b)),
            ],
        )
        .unwrap();
        check_files(
            &paths,
            &["cost against p99 TTFT", "p99 TTFT (ms)", "LRU front"],
        );
        keep(&paths);

        let cdf = |scale: f64| -> Vec<(f64, f64)> {
            (0..=100)
                .map(|p| (scale * (-(1.0 - p as f64 / 100.5).ln()), p as f64))
                .collect()
        };
        let paths = cdfs(
            dir.path(),
            "ttft",
            "time to first token",
            "TTFT (ms)",
            &[
                series("1 worker", &cdf(300.0)),
                series("4 workers", &cdf(80.0)),
            ],
        )
        .unwrap();
        check_files(
            &paths,
            &["time to first token", "TTFT (ms)", "percent of requests"],
        );
        keep(&paths);

        let samples: Vec<OccupancySample> = (0..200)
            .map(|i| {
                let t = i as f64 * 3.0;
                OccupancySample {
                    at_s: t,
                    used_blocks: [
                        (8_000.0 * (1.0 - (-t / 60.0).exp())) as u64,
                        (40_000.0 * (1.0 - (-t / 300.0).exp())) as u64,
                        0,
                        0,
                    ],
                    capacity_blocks: [8_000, 64_000, 0, 0],
                }
            })
            .collect();
        let paths = occupancy(dir.path(), "occupancy", "tier occupancy", &samples).unwrap();
        check_files(
            &paths,
            &[
                "tier occupancy",
                "device (8000 blocks)",
                "host (64000 blocks)",
            ],
        );
        let svg = std::fs::read_to_string(&paths[0]).unwrap();
        assert!(!svg.contains("disk ("), "a tier without capacity is drawn");
        keep(&paths);
    }

    #[test]
    fn empty_and_non_finite_input_is_an_error_not_a_panic() {
        let dir = tempfile::tempdir().unwrap();
        let axes = Axes {
            title: "t",
            x_label: "x",
            y_label: "y",
            x_log: true,
            y_log: true,
        };
        assert!(lines(dir.path(), "none", &axes, &[]).is_err());
        assert!(lines(dir.path(), "empty", &axes, &[series("a", &[])]).is_err());
        let bad = [
            (f64::NAN, 1.0),
            (1.0, f64::INFINITY),
            (0.0, 1.0),
            (-1.0, 2.0),
        ];
        let error = lines(dir.path(), "bad", &axes, &[series("a", &bad)]).unwrap_err();
        assert!(
            format!("{error:#}").contains("no point to draw"),
            "{error:#}"
        );
        assert!(occupancy(dir.path(), "o", "t", &[]).is_err());
        let no_capacity = OccupancySample {
            at_s: 0.0,
            used_blocks: [0; 4],
            capacity_blocks: [0; 4],
        };
        assert!(occupancy(dir.path(), "o", "t", &[no_capacity]).is_err());
        assert!(lines(
            dir.path(),
            "../escape",
            &axes,
            &[series("a", &[(1.0, 1.0)])]
        )
        .is_err());
        // NaN beside good points: the good ones are drawn.
        let mixed = [
            (f64::NAN, 1.0),
            (1.0, 2.0),
            (2.0, 3.0),
            (f64::NEG_INFINITY, 0.5),
        ];
        let paths = lines(dir.path(), "mixed", &axes, &[series("a", &mixed)]).unwrap();
        check_files(&paths, &["t"]);
        // One point: the range still has a width.
        let paths = cdfs(
            dir.path(),
            "one",
            "one",
            "x",
            &[series("a", &[(5.0, 100.0)])],
        )
        .unwrap();
        check_files(&paths, &["one"]);
    }

    #[test]
    fn log_axes_are_labelled_below_their_first_power_of_ten() {
        let (bold, light) = log_ticks(&(25.0..560.0));
        assert_eq!(bold, vec![50.0, 100.0, 200.0, 500.0]);
        assert_eq!(light.first(), Some(&30.0));
        let (bold, _) = log_ticks(&(0.05..12_800.0));
        assert_eq!(bold, vec![0.1, 1.0, 10.0, 100.0, 1_000.0, 10_000.0]);
        let (bold, _) = log_ticks(&(2.5..9.0));
        assert_eq!(bold, vec![3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]);
    }

    #[test]
    fn tick_labels_are_short() {
        assert_eq!(number(0.0), "0");
        assert_eq!(number(0.125), "0.125");
        assert_eq!(number(1.5), "1.5");
        assert_eq!(number(40.0), "40");
        assert_eq!(number(12_500.0), "12500");
        assert_eq!(number(2_000_000.0), "2e6");
        assert_eq!(number(-0.25), "-0.25");
    }
}
