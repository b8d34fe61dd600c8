//! `kvtwin run` (and `kvtwin` alone): a scenario simulated and its report printed.
//!
//! Owns: [`RunOptions`] and what they change in the scenario (`--set`, `--seed`,
//! `--speedup`, `--trace`, `--trace-mismatch`), where a run's requests come from
//! ([`Requests`], [`requests_of`]; the dashboard's too), simulating a trace as it is read
//! ([`simulate_trace`]; `kvtwin bench sim`'s too), and the output: the report on stdout,
//! `--json`, `--plot` (drawn by `plot::autoscale`). A scenario of vLLM engines runs on
//! their twin (`kvtwin_sim::vllm`).
//! Never: simulate or report anything itself (`kvtwin_sim` does).

use crate::args::trace::{read_trace, MismatchArg};
use crate::plot;
use anyhow::{bail, Context, Result};
use kvtwin_sim::cluster::{simulate, simulate_stream, Report};
use kvtwin_sim::scenario::{Scenario, WorkerEngine, WorkloadSpec};
use kvtwin_sim::workload::{MooncakeTraceReader, Request, TraceCheck};
use std::path::{Path, PathBuf};

/// What `kvtwin run` was asked beyond its scenario.
pub(crate) struct RunOptions {
    pub(crate) seed: Option<u64>,
    pub(crate) trace: Option<PathBuf>,
    pub(crate) sets: Vec<String>,
    pub(crate) json: Option<PathBuf>,
    pub(crate) speedup: Option<f64>,
    pub(crate) plot: Option<PathBuf>,
    pub(crate) trace_mismatch: Option<MismatchArg>,
}

pub(crate) fn run(path: &Path, options: RunOptions) -> Result<()> {
    let RunOptions {
        seed,
        trace,
        sets,
        json,
        speedup,
        plot,
        trace_mismatch,
    } = options;
    let mut scenario = Scenario::load(path).with_context(|| {
        if path == Path::new(crate::DEFAULT_SCENARIO) {
            "run kvtwin from the repository root, or name a scenario: kvtwin run FILE".to_string()
        } else {
            format!("loading scenario {}", path.display())
        }
    })?;
    if !sets.is_empty() {
        scenario = scenario.with_overrides(&sets)?;
    }
    if let Some(seed) = seed {
        scenario.seed = seed;
    }
    if let Some(speedup) = speedup {
        scenario
            .traffic
            .get_or_insert_with(Default::default)
            .speedup = speedup;
    }
    if plot.is_some() && scenario.autoscale.is_none() {
        bail!(
            "--plot draws the autoscaling charts: {} has no autoscale section",
            path.display()
        );
    }
    let check = crate::args::trace::trace_check(&scenario, trace_mismatch);
    let mut requests = requests_of(&scenario, path, trace);
    let mut trace_input = None;
    if scenario.traffic.is_some() {
        // Reshaping time needs the whole stream: a trace is read at once.
        let all = match requests {
            Requests::Trace(trace) => {
                let read = read_trace(&trace, check)?;
                trace_input = Some(read.input);
                read.requests
            }
            Requests::Generated(requests) => requests,
        };
        requests = Requests::Generated(
            scenario
                .shape_traffic(all)
                .context("reshaping the traffic")?,
        );
    }
    if let WorkerEngine::Vllm(spec) = scenario.worker.engine {
        let requests = match requests {
            Requests::Trace(trace) => read_trace(&trace, check)?.requests,
            Requests::Generated(requests) => requests,
        };
        eprintln!(
            "kvtwin: serving {} requests of {} on the twin of {} vLLM engine(s)",
            requests.len(),
            scenario.name,
            scenario.cluster.workers
        );
        let report = kvtwin_sim::vllm::run::simulate(&scenario, &spec, &requests);
        println!("{report}");
        if let Some(json) = json {
            let text = serde_json::to_string(&report).context("the report as JSON")?;
            std::fs::write(&json, text + "\n")
                .with_context(|| format!("writing {}", json.display()))?;
        }
        return Ok(());
    }
    let report = match requests {
        Requests::Trace(trace) => {
            eprintln!(
                "kvtwin: simulating {} on the trace {}",
                scenario.name,
                trace.display()
            );
            simulate_trace(&scenario, &trace, check)?
        }
        Requests::Generated(requests) => {
            eprintln!(
                "kvtwin: simulating {} requests of {} ({})",
                requests.len(),
                scenario.name,
                path.display()
            );
            let mut report = simulate(&scenario, &requests).context("building the cluster")?;
            report.trace = trace_input;
            report
        }
    };
    println!("{report}");
    if let (Some(dir), Some(autoscale)) = (&plot, &report.autoscale) {
        for file in plot::autoscale::charts(dir, &report.scenario, autoscale)? {
            eprintln!("kvtwin: wrote {}", file.display());
        }
    }
    if let Some(json) = json {
        std::fs::write(&json, report.to_json() + "\n")
            .with_context(|| format!("writing {}", json.display()))?;
    }
    if !report.events.rebuild_matches_pools {
        bail!("invariant broken: replaying the events did not rebuild the pools' registries");
    }
    Ok(())
}

/// Where a run's requests come from: a trace, read as the run goes, or a generator.
pub(crate) enum Requests {
    Trace(PathBuf),
    Generated(Vec<Request>),
}

/// Where `scenario`'s requests come from: `trace` when given, the scenario's own
/// trace (beside the scenario file), or its generator.
pub(crate) fn requests_of(
    scenario: &Scenario,
    scenario_path: &Path,
    trace: Option<PathBuf>,
) -> Requests {
    if let Some(trace) = trace {
        return Requests::Trace(trace);
    }
    match &scenario.workload {
        WorkloadSpec::MooncakeTrace { path, .. } => {
            Requests::Trace(scenario_path.parent().unwrap_or(Path::new(".")).join(path))
        }
        synthetic => Requests::Generated(
            synthetic
                .generate(scenario.seed, scenario.worker.block_size_tokens)
                .unwrap_or_default(),
        ),
    }
}

/// Simulates `scenario` on a trace read a request at a time (memory follows the requests
/// in flight, not the trace), every row checked by `check`; a bad line stops the run with
/// an error naming it. The report says what the check found.
pub(crate) fn simulate_trace(
    scenario: &Scenario,
    trace: &Path,
    check: TraceCheck,
) -> Result<Report> {
    let mut reader = MooncakeTraceReader::open(trace, check)
        .with_context(|| format!("reading trace {}", trace.display()))?;
    let mut error = None;
    let mut report = simulate_stream(
        scenario,
        reader
            .by_ref()
            .map_while(|request| request.map_err(|e| error = Some(e)).ok()),
    )
    .context("building the cluster")?;
    if let Some(error) = error {
        return Err(error).with_context(|| format!("reading trace {}", trace.display()));
    }
    report.trace = Some(reader.input());
    Ok(report)
}
