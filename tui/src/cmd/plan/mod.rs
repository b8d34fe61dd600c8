//! `kvtwin plan`: the cheapest configuration of a design space that meets an SLO.
//!
//! Owns: the flags, loading the scenario, space, prices and workload, the simulator as
//! the search's [`Evaluate`], reading an exhaustive sweep back (`--from-sweep`), and the
//! output: the chosen point with its margins and binding constraint, the two Pareto
//! fronts, as text, `--json` or `--csv`.
//! Never: decide anything itself: the search, the SLO and the fronts are
//! `kvtwin_sim::plan`'s.

pub(crate) mod output;

use anyhow::{bail, Context, Result};
use kvtwin_sim::plan::prices::Prices;
use kvtwin_sim::plan::run::{run_point, Workload};
use kvtwin_sim::plan::search::{self, Evaluate};
use kvtwin_sim::plan::slo::Slo;
use kvtwin_sim::plan::space::{PlanPoint, Points, Space};
use kvtwin_sim::plan::summary::RunSummary;
use kvtwin_sim::scenario::Scenario;
use output::Report;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// `kvtwin plan`.
#[derive(clap::Args)]
pub(crate) struct PlanArgs {
    /// The scenario every point starts from (its hardware, worker, cluster, workload).
    scenario: PathBuf,
    /// Upper bounds, e.g. `ttft_p99_ms=2000,tpot_p99_ms=60` (latency metrics of
    /// TTFT, TPOT, e2e and queueing: mean, p50, p90, p99).
    #[arg(long)]
    slo: String,
    /// The design space (RON): gpu, prefill_workers, routing, set (tried as they are);
    /// workers, device_blocks, host_blocks, disk_blocks (monotone, bisected).
    #[arg(long)]
    space: PathBuf,
    /// Prices (RON): gpu_usd_per_hour by GPU, dram_usd_per_gb_hour, ssd_usd_per_gb_hour;
    /// default: on-demand list prices of late 2025 (see `kvtwin_sim::plan::prices`).
    #[arg(long)]
    prices: Option<PathBuf>,
    /// Replaces the scenario's workload with a Mooncake-format trace.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Share of the workload (its first arrivals) screening runs use; 1: no screening.
    #[arg(long, default_value_t = 0.25)]
    screen: f64,
    /// Prints one JSON object instead of tables.
    #[arg(long)]
    json: bool,
    /// Prints every run made as CSV (with the chosen one and the fronts marked).
    #[arg(long, conflicts_with = "json")]
    csv: bool,
    /// Writes plots (SVG and PNG) into this folder: both Pareto fronts, the TTFT and
    /// TPOT CDFs of the chosen point and the cost front, and occupancy per tier over time
    /// for the chosen point (one more run).
    #[arg(long)]
    plot: Option<PathBuf>,
    /// Prints the `kvtwin sweep` arguments whose grid is this space (shell-quoted, to
    /// paste into a script), and stops. `kvtwin sweep SCENARIO --space SPACE` runs the
    /// same grid without them.
    #[arg(long)]
    print_grid: bool,
    /// Judges an exhaustive `kvtwin sweep` of the space (its output file) instead of
    /// searching: every point's run is read from it.
    #[arg(long, conflicts_with = "print_grid")]
    from_sweep: Option<PathBuf>,
}

/// The points of the space in file `space` over `base`, priced by `prices` (or the
/// default prices): what `plan` searches and `sweep --space` runs exhaustively.
pub(crate) fn space_points(base: &Scenario, space: &Path, prices: Option<&Path>) -> Result<Points> {
    let (prices, prices_file) = match prices {
        Some(path) => (Prices::load(path)?, path.display().to_string()),
        None => (Prices::default(), "the default prices".to_string()),
    };
    let space_file = space.display().to_string();
    Ok(Space::load(space)?.points(base, &prices, &space_file, &prices_file)?)
}

/// The simulator, as the search runs points.
struct Simulator<'a> {
    base: &'a Scenario,
    workload: &'a Workload,
    points: &'a Points,
    slo: &'a Slo,
}

impl Evaluate for Simulator<'_> {
    type Error = anyhow::Error;

    fn evaluate(&mut self, point: &PlanPoint, fraction: f64) -> Result<RunSummary> {
        let (_, summary) = run_point(
            self.base,
            &point.sets,
            self.base.seed,
            self.workload,
            fraction,
        )
        .with_context(|| format!("running {}", point.sets.join(" ")))?;
        let verdict = self.slo.judge(&summary);
        let binding = verdict.binding();
        eprintln!(
            "kvtwin plan: {} {}: {} {:.1} ms {}",
            if fraction < 1.0 { "screen" } else { "run   " },
            output::describe(self.points, point),
            binding.metric,
            binding.value,
            if verdict.holds() { "meets" } else { "fails" }
        );
        Ok(summary)
    }
}

/// `kvtwin plan`.
pub(crate) fn plan(args: &PlanArgs) -> Result<()> {
    let base = Scenario::load(&args.scenario)
        .with_context(|| format!("loading scenario {}", args.scenario.display()))?;
    let slo = Slo::parse(&args.slo)?;
    if !(args.screen > 0.0 && args.screen <= 1.0) {
        bail!(
            "--screen {}: a share of the workload, above 0 and at most 1",
            args.screen
        );
    }
    let points = space_points(&base, &args.space, args.prices.as_deref())?;
    if args.print_grid {
        let grid: Vec<String> = points
            .grid()
            .iter()
            .map(|g| format!("--grid '{g}'"))
            .collect();
        println!("{}", grid.join(" "));
        return Ok(());
    }
    // Read once: the search runs it, and so does the occupancy plot.
    let workload = if args.from_sweep.is_none() || args.plot.is_some() {
        crate::cmd::sweep::workload_of(&base, &args.scenario, args.trace.as_deref())?
    } else {
        Workload::Synthetic
    };
    let outcome = match &args.from_sweep {
        Some(file) => search::exhaustive(&points, &slo, read_sweep(file, &points)?),
        None => {
            let simulator = Simulator {
                base: &base,
                workload: &workload,
                points: &points,
                slo: &slo,
            };
            search::search(&points, &slo, simulator, args.screen)?
        }
    };
    let report = Report::new(
        &points,
        &slo,
        &outcome,
        args.screen,
        args.from_sweep.is_some(),
    );
    if args.json {
        println!("{}", report.json());
    } else if args.csv {
        print!("{}", report.csv());
    } else {
        print!("{}", report.text());
    }
    if !outcome.violations.is_empty() && (args.json || args.csv) {
        eprintln!(
            "kvtwin plan: {} pairs of runs break monotonicity (see the text report)",
            outcome.violations.len()
        );
    }
    if let Some(dir) = &args.plot {
        for file in crate::plot::plan::plot(dir, &report, &base, &workload)? {
            eprintln!("kvtwin plan: wrote {}", file.display());
        }
    }
    if outcome.chosen.is_none() {
        bail!("no point of the space meets the SLO ({})", slo.describe());
    }
    Ok(())
}

/// The runs of an exhaustive sweep, by the point of `points` whose overrides they have.
fn read_sweep(file: &Path, points: &Points) -> Result<BTreeMap<usize, RunSummary>> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("reading sweep {}", file.display()))?;
    // Overrides as sorted (path, JSON text) pairs: the same whatever their order.
    let canonical = |overrides: &BTreeMap<String, serde_json::Value>| -> Vec<(String, String)> {
        overrides
            .iter()
            .map(|(path, value)| (path.clone(), value.to_string()))
            .collect()
    };
    let mut by_overrides: BTreeMap<Vec<(String, String)>, usize> = BTreeMap::new();
    for (index, point) in points.points.iter().enumerate() {
        let overrides = point
            .sets
            .iter()
            .filter_map(|set| set.split_once('='))
            .map(|(path, raw)| (path.to_string(), kvtwin_sim::plan::sweep::value_of(raw)))
            .collect();
        by_overrides.insert(canonical(&overrides), index);
    }
    let mut summaries = BTreeMap::new();
    for (number, line) in text.lines().enumerate() {
        let at = || format!("{}:{}", file.display(), number + 1);
        let line = kvtwin_sim::plan::sweep::parse_line(line)
            .with_context(|| format!("{}: not a line of a sweep", at()))?;
        let overrides: BTreeMap<String, serde_json::Value> = line.overrides.into_iter().collect();
        let Some(&index) = by_overrides.get(&canonical(&overrides)) else {
            bail!(
                "{}: overrides {} are no point of the space (a sweep of another grid? \
                 `kvtwin plan --print-grid` gives this space's)",
                at(),
                serde_json::Value::from(serde_json::Map::from_iter(overrides))
            );
        };
        if let Some(summary) = line.summary {
            summaries.insert(index, summary);
        }
    }
    let missing = points
        .points
        .iter()
        .enumerate()
        .filter(|(i, p)| p.invalid.is_none() && !summaries.contains_key(i))
        .count();
    if missing > 0 {
        bail!(
            "{}: {missing} valid points of the space have no run in the sweep",
            file.display()
        );
    }
    Ok(summaries)
}
