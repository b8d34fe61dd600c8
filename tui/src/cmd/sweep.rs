//! `kvtwin sweep`: every run of a grid of overrides, in parallel, into a JSON-lines file
//! that survives a crash; `kvtwin sweep merge` joins the files of shards.
//!
//! Owns: the command line, loading the workload once, the thread pool, the one writer
//! that appends each finished run's line and flushes it, resuming a file that is already
//! there, the final rewrite in run order, and progress on stderr.
//! Never: decide which runs a sweep has or what a line says (`kvtwin_sim::plan::sweep`
//! does), or print anything but the final path on stdout.

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use kvtwin_sim::plan::run::{run_point, Workload};
use kvtwin_sim::plan::sweep::{self, Grid, Run, Shard, Sweep};
use kvtwin_sim::scenario::{Scenario, WorkloadSpec};
use kvtwin_sim::workload::read_mooncake_trace;
use rayon::prelude::*;
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Instant;

/// `kvtwin sweep`'s arguments.
#[derive(Args)]
#[command(
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true,
    after_help = "Runs are numbered in grid order (the first --grid slowest, seeds \
                  innermost). A file that already holds some runs of the same sweep is \
                  resumed; the finished file is sorted by run, whatever --jobs, --shard or \
                  restarts made it."
)]
pub(crate) struct SweepArgs {
    #[command(subcommand)]
    command: Option<SweepCommand>,
    /// The scenario file every run starts from.
    #[arg(required = true)]
    scenario: Option<PathBuf>,
    /// An axis of the grid: a scenario field by its dotted path and the values it takes,
    /// comma separated (repeatable; each VALUE as in `kvtwin run --set`: JSON, or a
    /// string; commas inside JSON brackets, braces or strings do not split).
    #[arg(long, value_name = "PATH=V1,V2,...")]
    grid: Vec<String>,
    /// Every point of a `kvtwin plan` space file (its axes become the grid, before any
    /// --grid): the exhaustive sweep a plan's search can be checked against
    /// (`kvtwin plan --from-sweep`).
    #[arg(long, value_name = "SPACE.ron")]
    space: Option<PathBuf>,
    /// The prices the space's points are costed with (as `kvtwin plan --prices`; only
    /// with --space).
    #[arg(long, value_name = "PRICES.ron", requires = "space")]
    prices: Option<PathBuf>,
    /// Seeds per grid point: the scenario's seed, seed + 1, ..., seed + K - 1.
    #[arg(long, value_name = "K", default_value_t = 1)]
    seeds: u64,
    /// Runs every point on this Mooncake-format trace instead of the scenario's workload.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Runs at once, one per thread (default: the machine's available parallelism).
    #[arg(long, value_name = "N")]
    jobs: Option<usize>,
    /// Runs only the runs whose number is I modulo N (0 ≤ I < N), for N machines; join
    /// their files with `kvtwin sweep merge`.
    #[arg(long, value_name = "I/N")]
    shard: Option<String>,
    /// Writes plots (SVG and PNG) of the finished sweep into this folder: p99 TTFT, p99
    /// TPOT and hit ratio against the first --grid axis (when numeric), and TTFT and
    /// TPOT CDFs of up to 8 runs.
    #[arg(long, value_name = "DIR")]
    plot: Option<PathBuf>,
    /// The JSON-lines file: one line per run, resumed if it exists.
    #[arg(long, required = true, value_name = "FILE.jsonl")]
    out: Option<PathBuf>,
}

#[derive(Subcommand)]
enum SweepCommand {
    /// Join the files of a sweep's shards (or restarts) into one file sorted by run;
    /// refuses parts of different sweeps, two different lines for one run, and missing
    /// runs.
    Merge {
        /// The shards' files.
        #[arg(required = true)]
        parts: Vec<PathBuf>,
        /// The merged file.
        #[arg(long)]
        out: PathBuf,
    },
}

/// Runs `kvtwin sweep` or `kvtwin sweep merge`.
pub(crate) fn run(args: &SweepArgs) -> Result<()> {
    if let Some(SweepCommand::Merge { parts, out }) = &args.command {
        return merge(parts, out);
    }
    let (Some(scenario_path), Some(out)) = (&args.scenario, &args.out) else {
        bail!("kvtwin sweep needs a scenario and --out (see kvtwin sweep --help)");
    };
    let base = Scenario::load(scenario_path)
        .with_context(|| format!("loading scenario {}", scenario_path.display()))?;
    let mut axes = Vec::new();
    if let Some(space) = &args.space {
        axes = crate::cmd::plan::space_points(&base, space, args.prices.as_deref())?.grid();
    }
    axes.extend(args.grid.iter().cloned());
    let grid = Grid::parse(&axes)?;
    let sweep = Sweep::new(&base, grid, args.seeds)?;
    let shard = match &args.shard {
        Some(text) => Shard::parse(text)?,
        None => Shard::ALL,
    };
    let jobs = match args.jobs {
        Some(0) => bail!("--jobs must be at least 1"),
        Some(jobs) => jobs,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let workload = workload_of(&base, scenario_path, args.trace.as_deref())?;

    let shown = out.display().to_string();
    let mut finished = if out.exists() {
        let text = std::fs::read_to_string(out).with_context(|| format!("reading {shown}"))?;
        let resumed = sweep::resume(&sweep, shard, &shown, &text)?;
        if let Some(line) = resumed.torn_line {
            eprintln!("kvtwin sweep: {shown}:{line} was cut mid-write; dropping it");
            let file = OpenOptions::new()
                .write(true)
                .open(out)
                .with_context(|| format!("opening {shown}"))?;
            file.set_len(resumed.keep_bytes as u64)
                .with_context(|| format!("truncating {shown}"))?;
        }
        resumed.finished
    } else {
        BTreeMap::new()
    };
    let todo: Vec<Run> = sweep
        .runs(shard)
        .filter(|run| !finished.contains_key(&run.index))
        .collect();
    let mine = finished.len() + todo.len();
    if !finished.is_empty() {
        eprintln!(
            "kvtwin sweep: {} of {mine} runs already in {shown}, skipped; {} to run",
            finished.len(),
            todo.len()
        );
    }

    let started = Instant::now();
    let fresh = execute(&base, &sweep, &workload, &todo, jobs, out)?;
    let wall_s = started.elapsed().as_secs_f64();
    let done = fresh.len();
    finished.extend(fresh);
    rewrite_sorted(out, &finished)?;

    let failed = finished.values().filter(|l| is_failure(l)).count();
    let per_core_s = if wall_s > 0.0 {
        done as f64 / (wall_s * jobs as f64)
    } else {
        0.0
    };
    eprintln!(
        "kvtwin sweep: {done} runs in {wall_s:.2} s on {jobs} threads ({per_core_s:.4} runs per \
         core-second); {} of {mine} runs in {shown}, {failed} failed",
        finished.len()
    );
    if let Some(dir) = &args.plot {
        let lines: Vec<sweep::SweepLine> = finished
            .values()
            .filter_map(|line| sweep::parse_line(line).ok())
            .collect();
        for file in crate::plot::sweep::plot(dir, &lines)? {
            eprintln!("kvtwin sweep: wrote {}", file.display());
        }
    }
    if failed > 0 {
        bail!("{failed} runs failed; their lines in {shown} say why");
    }
    Ok(())
}

/// The requests every run shares: `--trace`, else the scenario's own trace (its path
/// taken from the scenario file's folder), each read once; else generated per run.
pub(crate) fn workload_of(
    base: &Scenario,
    scenario_path: &Path,
    trace: Option<&Path>,
) -> Result<Workload> {
    let path = match (trace, &base.workload) {
        (Some(trace), _) => trace.to_path_buf(),
        (None, WorkloadSpec::MooncakeTrace { path, .. }) => {
            scenario_path.parent().unwrap_or(Path::new(".")).join(path)
        }
        (None, _) => return Ok(Workload::Synthetic),
    };
    // Read once at the base scenario's block size and policy.
    let check = base.workload.trace_check(base.worker.block_size_tokens);
    let requests = read_mooncake_trace(&path, check)
        .with_context(|| format!("reading trace {}", path.display()))?
        .requests;
    Ok(Workload::Trace(requests.into()))
}

/// Runs `todo` on `jobs` threads; one writer appends each finished line to `out` and
/// flushes it, so a crash loses no finished run. Returns the new lines by run.
fn execute(
    base: &Scenario,
    sweep: &Sweep,
    workload: &Workload,
    todo: &[Run],
    jobs: usize,
    out: &Path,
) -> Result<BTreeMap<usize, String>> {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(jobs)
        .thread_name(|i| format!("kvtwin-sweep-{i}"))
        .build()
        .context("starting the sweep's threads")?;
    let mut file = OpenOptions::new()
        .create(true)
        .append(true)
        .open(out)
        .with_context(|| format!("opening {}", out.display()))?;
    let progress = crate::progress::bar(
        todo.len(),
        "{elapsed_precise} [{bar:40}] {pos}/{len} runs, {per_sec}, ETA {eta}",
    );
    let total = sweep.total();
    let (sender, lines) = mpsc::channel::<(usize, String)>();
    std::thread::scope(|scope| {
        let writer = scope.spawn(|| -> Result<BTreeMap<usize, String>> {
            let mut written = BTreeMap::new();
            for (index, line) in lines {
                file.write_all(format!("{line}\n").as_bytes())
                    .and_then(|()| file.flush())
                    .with_context(|| format!("appending to {}", out.display()))?;
                progress.inc(1);
                written.insert(index, line);
            }
            Ok(written)
        });
        // A writer that failed drops the receiver: sends fail and the runs stop early.
        let _ = pool.install(|| {
            todo.par_iter()
                .with_max_len(1)
                .try_for_each_with(sender, |sender, run| {
                    sender.send((run.index, line_of(base, run, total, workload)))
                })
        });
        let written = writer.join().expect("the sweep's writer panicked");
        progress.finish_and_clear();
        written
    })
}

/// The line of `run`: its summary, or why it did not finish (a panic included, so that
/// one broken point does not lose the others).
fn line_of(base: &Scenario, run: &Run, total: usize, workload: &Workload) -> String {
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        run_point(base, &run.sets, run.seed, workload, 1.0)
    }));
    match outcome {
        Ok(Ok((_, summary))) => sweep::line(run, total, Ok(&summary)),
        Ok(Err(error)) => sweep::line(run, total, Err(&error.to_string())),
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("no message");
            sweep::line(
                run,
                total,
                Err(&format!("the simulator panicked: {message}")),
            )
        }
    }
}

/// Whether a line records a failed run.
fn is_failure(line: &str) -> bool {
    sweep::parse_line(line).is_ok_and(|l| l.error.is_some())
}

/// Replaces `out` with `lines` in run order: written beside it, then renamed over it, so
/// the file is whole at every moment.
fn rewrite_sorted(out: &Path, lines: &BTreeMap<usize, String>) -> Result<()> {
    let mut text = String::with_capacity(lines.values().map(|l| l.len() + 1).sum());
    for line in lines.values() {
        text.push_str(line);
        text.push('\n');
    }
    write_whole(out, &text)
}

/// Writes `text` to `out` through `out.tmp` and a rename.
fn write_whole(out: &Path, text: &str) -> Result<()> {
    let mut tmp = out.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut file = File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, out)
        .with_context(|| format!("renaming {} to {}", tmp.display(), out.display()))
}

/// `kvtwin sweep merge`.
fn merge(parts: &[PathBuf], out: &Path) -> Result<()> {
    let mut texts = Vec::with_capacity(parts.len());
    for part in parts {
        let text =
            std::fs::read_to_string(part).with_context(|| format!("reading {}", part.display()))?;
        texts.push((part.display().to_string(), text));
    }
    let merged = sweep::merge(&texts)?;
    write_whole(out, &merged)?;
    eprintln!(
        "kvtwin sweep merge: {} runs from {} parts into {}",
        merged.lines().count(),
        parts.len(),
        out.display()
    );
    Ok(())
}
