//! `kvtwin plan`'s output: the chosen point, the search's effort and the Pareto fronts,
//! as text, JSON or CSV.
//!
//! Owns: [`Report`] (what is printed, computed once) and its three renderings, and
//! [`describe`], a point in a few words.
//! Never: run or search: it formats an [`Outcome`].

use kvtwin::tier::Tier;
use kvtwin_sim::plan::pareto::{front, Better, Row};
use kvtwin_sim::plan::search::Outcome;
use kvtwin_sim::plan::slo::{Slo, Verdict};
use kvtwin_sim::plan::space::{PlanPoint, Points};
use serde_json::json;
use std::fmt::Write;

/// A point in a few words: its category and the monotone dimensions the space varies.
pub(crate) fn describe(points: &Points, point: &PlanPoint) -> String {
    let mut words = vec![points.categories[point.category].clone()];
    for (dim, _) in &points.monotone_axes {
        let shape = &point.shape;
        words.push(match dim {
            0 => format!("{} workers", shape.workers),
            1 => format!("device {}", shape.blocks[Tier::Device.index()]),
            2 => format!(
                "host {} ({:.0} GB)",
                shape.blocks[Tier::Host.index()],
                shape.gb(Tier::Host)
            ),
            _ => format!(
                "disk {} ({:.0} GB)",
                shape.blocks[Tier::Disk.index()],
                shape.gb(Tier::Disk)
            ),
        });
    }
    words.join(", ")
}

/// What `kvtwin plan` prints.
pub(crate) struct Report<'a> {
    points: &'a Points,
    slo: &'a Slo,
    outcome: &'a Outcome,
    screen: f64,
    from_sweep: bool,
    /// Every full run, in point order.
    pub(crate) rows: Vec<Row>,
    /// Rows (indices into `rows`) on the front of cost against the SLO's first metric.
    pub(crate) front_cost: Vec<usize>,
    /// Rows on the front of tokens/s/gpu against tokens/s/user.
    pub(crate) front_throughput: Vec<usize>,
}

/// The statistic of `latency` the SLO bounds first (p99 when it bounds none).
fn statistic(slo: &Slo, latency: &str) -> String {
    slo.bounds
        .iter()
        .map(|(metric, _)| metric)
        .find(|metric| metric.starts_with(latency))
        .cloned()
        .unwrap_or_else(|| format!("{latency}p99_ms"))
}

impl<'a> Report<'a> {
    pub(crate) fn new(
        points: &'a Points,
        slo: &'a Slo,
        outcome: &'a Outcome,
        screen: f64,
        from_sweep: bool,
    ) -> Self {
        let (ttft, tpot) = (statistic(slo, "ttft_"), statistic(slo, "tpot_"));
        let rows: Vec<Row> = outcome
            .runs
            .iter()
            .map(|(index, run)| {
                Row::of(
                    points,
                    *index,
                    &run.summary,
                    run.verdict.holds(),
                    &ttft,
                    &tpot,
                )
            })
            .collect();
        let metric = &slo.bounds[0].0;
        let cost: Vec<(f64, f64)> = outcome
            .runs
            .values()
            .zip(&rows)
            .map(|(run, row)| {
                (
                    row.usd_per_hour,
                    run.summary.metric(metric).unwrap_or(f64::NAN),
                )
            })
            .collect();
        let throughput: Vec<(f64, f64)> = rows
            .iter()
            .map(|r| (r.tokens_per_s_per_user, r.tokens_per_s_per_gpu))
            .collect();
        Self {
            points,
            slo,
            outcome,
            screen,
            from_sweep,
            front_cost: front(&cost, Better::Lower, Better::Lower),
            front_throughput: front(&throughput, Better::Higher, Better::Higher),
            rows,
        }
    }

    /// The row of point `index`, if it was run.
    pub(crate) fn row(&self, index: usize) -> Option<&Row> {
        self.rows.iter().find(|r| r.point == index)
    }

    /// What the search found and did.
    pub(crate) fn outcome(&self) -> &Outcome {
        self.outcome
    }

    /// The space's points.
    pub(crate) fn points(&self) -> &Points {
        self.points
    }

    /// The SLO.
    pub(crate) fn slo(&self) -> &Slo {
        self.slo
    }

    fn verdict(&self, index: usize) -> &Verdict {
        &self.outcome.runs[&index].verdict
    }

    /// The search's effort in one sentence.
    fn effort(&self) -> String {
        let o = self.outcome;
        let total = self.points.points.len();
        if self.from_sweep {
            return format!(
                "judged an exhaustive sweep: {} runs of {total} points ({} invalid)",
                o.runs.len(),
                o.invalid
            );
        }
        let invalid = match self.points.points.iter().find_map(|p| p.invalid.as_deref()) {
            Some(example) => format!("{} invalid, e.g. {example}", o.invalid),
            None => "none invalid".to_string(),
        };
        format!(
            "searched {total} points ({invalid}): ran {} simulations ({} screens on the first {:.0} % \
             of the workload, {} on all of it, {} of them checking the optimum's neighbours); {} \
             decided by monotonicity without a run, {} dearer than the optimum",
            o.runs.len() + o.screens.len(),
            o.screens.len(),
            self.screen * 100.0,
            o.runs.len(),
            o.checks,
            o.inferred,
            o.pruned
        )
    }

    /// A warning when runs broke the search's premise, or `None`.
    fn violations(&self) -> Option<String> {
        let (low, high) = *self.outcome.violations.first()?;
        let describe = |i: usize| describe(self.points, &self.points.points[i]);
        Some(format!(
            "warning: {} pairs of runs break monotonicity, e.g. {} meets the SLO and {} fails; \
             {}",
            self.outcome.violations.len(),
            describe(low),
            describe(high),
            if self.from_sweep {
                "the model is not monotone in this space"
            } else {
                "the search assumes it does not, so confirm with an exhaustive sweep \
                 (kvtwin plan --print-grid gives its grid; then --from-sweep)"
            }
        ))
    }

    /// The human report.
    pub(crate) fn text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "SLO: {}", self.slo.describe());
        let _ = writeln!(out, "{}", self.effort());
        if let Some(warning) = self.violations() {
            let _ = writeln!(out, "{warning}");
        }
        match self.outcome.chosen {
            Some(index) => {
                let point = &self.points.points[index];
                let row = self.row(index).expect("the chosen point was run");
                let _ = writeln!(out, "\ncheapest configuration meeting the SLO:");
                let _ = writeln!(out, "  {}", describe(self.points, point));
                let _ = writeln!(
                    out,
                    "  {} GPUs ({} × {} per worker); per worker {} device blocks, {:.1} GB host DRAM, {:.1} GB SSD",
                    point.shape.gpus(),
                    point.shape.gpu.count,
                    point.shape.gpu.name,
                    row.device_blocks,
                    row.host_gb,
                    row.disk_gb
                );
                let _ = writeln!(
                    out,
                    "  ${:.2} per hour, ${:.3} per million output tokens; hits: device {:.1} %, host {:.1} %, disk {:.1} %",
                    row.usd_per_hour,
                    row.usd_per_mtok,
                    row.hit_device * 100.0,
                    row.hit_host * 100.0,
                    row.hit_disk * 100.0
                );
                if point.shape.shared_blocks > 0 {
                    let _ = writeln!(
                        out,
                        "  shared tier: {} blocks ({:.1} GB) for the cluster; {:.1} % of prompt blocks read from it",
                        point.shape.shared_blocks,
                        row.shared_gb,
                        row.hit_shared * 100.0
                    );
                }
                let verdict = self.verdict(index);
                let binding = verdict.binding().metric.clone();
                for judged in &verdict.judged {
                    let _ = writeln!(
                        out,
                        "  {:<16} {:>10.1} ms ≤ {:<8} margin {:>5.1} %{}",
                        judged.metric,
                        judged.value,
                        judged.bound,
                        judged.margin() * 100.0,
                        if judged.metric == binding {
                            "  ← binding"
                        } else {
                            ""
                        }
                    );
                }
                let sets: Vec<String> = point.sets.iter().map(|s| format!("--set '{s}'")).collect();
                let _ = writeln!(out, "  as overrides: {}", sets.join(" "));
            }
            None => {
                let _ = writeln!(out, "\nno point meets the SLO.");
                if let Some(index) = self.outcome.closest() {
                    let _ = writeln!(
                        out,
                        "closest: {}",
                        describe(self.points, &self.points.points[index])
                    );
                    let verdict = self.verdict(index);
                    if verdict.unserved > 0 {
                        let _ = writeln!(out, "  leaves {} requests unserved", verdict.unserved);
                    }
                    for judged in &verdict.judged {
                        let _ = writeln!(
                            out,
                            "  {:<16} {:>10.1} ms against {:<8} {}",
                            judged.metric,
                            judged.value,
                            judged.bound,
                            if judged.holds() {
                                "holds".to_string()
                            } else {
                                format!("FAILS, over by {:.1} %", -judged.margin() * 100.0)
                            }
                        );
                    }
                }
            }
        }
        let _ = writeln!(
            out,
            "\nPareto front of the runs made: $ per hour against {}",
            self.slo.bounds[0].0
        );
        out.push_str(&table(self.front_cost.iter().map(|i| &self.rows[*i])));
        let _ = writeln!(
            out,
            "\nPareto front of the runs made: tokens/s/gpu against tokens/s/user"
        );
        out.push_str(&table(self.front_throughput.iter().map(|i| &self.rows[*i])));
        out
    }

    /// One JSON object.
    pub(crate) fn json(&self) -> String {
        let o = self.outcome;
        let chosen = self.outcome.chosen.map(|index| {
            let verdict = self.verdict(index);
            let mut row = serde_json::to_value(self.row(index)).unwrap_or_default();
            row["sets"] = json!(self.points.points[index].sets);
            row["margins"] = verdict
                .judged
                .iter()
                .map(|j| (j.metric.clone(), json!(j.margin())))
                .collect::<serde_json::Map<_, _>>()
                .into();
            row["binding"] = json!(verdict.binding().metric);
            row
        });
        let closest = match (o.chosen, o.closest()) {
            (None, Some(index)) => {
                let verdict = self.verdict(index);
                let mut row = serde_json::to_value(self.row(index)).unwrap_or_default();
                row["sets"] = json!(self.points.points[index].sets);
                row["unserved"] = json!(verdict.unserved);
                row["failing"] = verdict
                    .judged
                    .iter()
                    .filter(|j| !j.holds())
                    .map(|j| {
                        json!({"metric": j.metric, "value": j.value, "bound": j.bound,
                               "over_pct": -j.margin() * 100.0})
                    })
                    .collect();
                Some(row)
            }
            _ => None,
        };
        let rows =
            |indices: &[usize]| -> Vec<&Row> { indices.iter().map(|i| &self.rows[*i]).collect() };
        json!({
            "slo": self.slo.bounds.iter().map(|(m, b)| (m.clone(), json!(b))).collect::<serde_json::Map<_, _>>(),
            "search": {
                "points": self.points.points.len(),
                "invalid": o.invalid,
                "exhaustive": self.from_sweep,
                "simulations": o.runs.len() + o.screens.len(),
                "full_runs": o.runs.len(),
                "screens": o.screens.len(),
                "screen_fraction": self.screen,
                "checks": o.checks,
                "inferred": o.inferred,
                "pruned": o.pruned,
                "monotone_violations": o.violations.len(),
            },
            "chosen": chosen,
            "closest": closest,
            "front_cost": rows(&self.front_cost),
            "front_throughput": rows(&self.front_throughput),
        })
        .to_string()
    }

    /// Every run as CSV, with the chosen one and the fronts marked.
    pub(crate) fn csv(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{},chosen,front_cost,front_throughput",
            COLUMNS.join(",")
        );
        for (i, row) in self.rows.iter().enumerate() {
            let mut cells: Vec<String> = cells(row).into_iter().map(|c| csv_field(&c)).collect();
            cells.push((Some(row.point) == self.outcome.chosen).to_string());
            cells.push(self.front_cost.contains(&i).to_string());
            cells.push(self.front_throughput.contains(&i).to_string());
            let _ = writeln!(out, "{}", cells.join(","));
        }
        out
    }
}

/// The table columns, AIConfigurator's names first.
const COLUMNS: [&str; 19] = [
    "config",
    "tokens/s/gpu",
    "tokens/s/user",
    "TTFT",
    "TPOT",
    "replicas",
    "gpus/replica",
    "workers",
    "device_blocks",
    "host_gb",
    "disk_gb",
    "hit_device",
    "hit_host",
    "hit_disk",
    "shared_gb",
    "hit_shared",
    "usd_per_hour",
    "usd_per_mtok",
    "meets_slo",
];

fn cells(r: &Row) -> Vec<String> {
    vec![
        r.config.clone(),
        format!("{:.1}", r.tokens_per_s_per_gpu),
        format!("{:.1}", r.tokens_per_s_per_user),
        format!("{:.1}", r.ttft_ms),
        format!("{:.2}", r.tpot_ms),
        r.replicas.to_string(),
        r.gpus_per_replica.to_string(),
        r.workers.clone(),
        r.device_blocks.to_string(),
        format!("{:.1}", r.host_gb),
        format!("{:.1}", r.disk_gb),
        format!("{:.4}", r.hit_device),
        format!("{:.4}", r.hit_host),
        format!("{:.4}", r.hit_disk),
        format!("{:.1}", r.shared_gb),
        format!("{:.4}", r.hit_shared),
        format!("{:.2}", r.usd_per_hour),
        format!("{:.3}", r.usd_per_mtok),
        r.meets_slo.to_string(),
    ]
}

/// A CSV field, quoted when it holds a comma, quote or line break.
fn csv_field(field: &str) -> String {
    if field.contains([',', '"', '\n']) {
        format!("\"{}\"", field.replace('"', "\"\""))
    } else {
        field.to_string()
    }
}

/// Rows as an aligned table.
fn table<'r>(rows: impl Iterator<Item = &'r Row>) -> String {
    let body: Vec<Vec<String>> = rows.map(cells).collect();
    let mut widths: Vec<usize> = COLUMNS.iter().map(|c| c.chars().count()).collect();
    for row in &body {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (c, w))| {
                if i == 0 {
                    format!("{c:<w$}")
                } else {
                    format!("{c:>w$}")
                }
            })
            .collect();
        padded.join("  ").trim_end().to_string() + "\n"
    };
    let header: Vec<String> = COLUMNS.iter().map(|c| c.to_string()).collect();
    let mut out = line(&header);
    for row in &body {
        out.push_str(&line(row));
    }
    out
}
