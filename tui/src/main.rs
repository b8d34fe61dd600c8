//! `kvtwin`: the command line.
//!
//! `kvtwin` alone (what `cargo run --release` runs) simulates `scenarios/default.ron` and
//! prints its report; `kvtwin run` takes another scenario, seed or trace; `kvtwin cache`
//! answers "how big must the cache be for this trace?"; `kvtwin router` and `kvtwin
//! relay` run the event plane's services. All logic lives in the libraries.

mod args;
mod bench;
mod cmd;
mod logging;
mod plot;
mod progress;

use anyhow::{bail, Context, Result};
use args::trace::MismatchArg;
use clap::{Parser, Subcommand, ValueEnum};
use kvtwin::pool::EvictionPolicyKind;
use kvtwin_sim::cache;
use kvtwin_sim::cluster::{simulate, simulate_stream, Report};
use kvtwin_sim::scenario::{Scenario, WorkerEngine, WorkloadSpec};
use kvtwin_sim::workload::{
    read_mooncake_trace, MooncakeTraceReader, Request, TraceCheck, TraceMismatch,
};
use std::path::{Path, PathBuf};

const DEFAULT_SCENARIO: &str = "scenarios/default.ron";

#[derive(Parser)]
#[command(
    name = "kvtwin",
    version,
    about = "KV-cache block manager and digital twin of an LLM serving cluster"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Simulate a scenario and print its report.
    Run {
        /// The scenario file.
        #[arg(default_value = DEFAULT_SCENARIO)]
        scenario: PathBuf,
        /// Replaces the scenario's seed.
        #[arg(long)]
        seed: Option<u64>,
        /// Replaces the workload with a Mooncake-format trace.
        #[arg(long)]
        trace: Option<PathBuf>,
        /// Overrides a scenario field by its dotted path, e.g.
        /// `--set worker.tiers.0.capacity_blocks=8000` (repeatable; VALUE is JSON, or a
        /// string); an unknown path lists the valid ones.
        #[arg(long = "set", value_name = "FIELD=VALUE")]
        set: Vec<String>,
        /// Also writes the report as JSON to this file.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Plays the requests this many times as fast (arrivals divided by it): the
        /// scenario's `traffic.speedup`.
        #[arg(long)]
        speedup: Option<f64>,
        /// Writes the autoscaling charts (replicas and load over time) as SVG and PNG
        /// into this folder; the scenario needs an `autoscale` section.
        #[arg(long)]
        plot: Option<PathBuf>,
        /// A trace row whose input_length exceeds its hash_ids × the block size, or
        /// whose hash_ids run past its tokens: stop with an error naming it (the
        /// default, as DynoSim does), clamp or extend it; the report counts them.
        /// Replaces the scenario's `mismatch`.
        #[arg(long, value_enum)]
        trace_mismatch: Option<MismatchArg>,
    },
    /// Replay a trace through one cache of each capacity and print the hit ratios.
    Cache {
        /// A Mooncake-format trace.
        #[arg(long)]
        trace: PathBuf,
        /// Capacities to try, in blocks, comma separated (optional with `--curve`).
        #[arg(long, value_delimiter = ',', required_unless_present = "curve")]
        capacity_blocks: Vec<usize>,
        /// LRU's hits at every capacity from one pass (stack distances): the same rows as
        /// the replays, at once. Without `--capacity-blocks`, prints the curve at 1, 2, 4,
        /// ... blocks up to where hits stop growing, the capacity that reaches 80 % of the
        /// reachable hits, and the marginal hit blocks per GiB.
        #[arg(long)]
        curve: bool,
        /// Bytes of KV per block, for the GiB figures of the whole curve; default: block
        /// tokens × 131,072 (Llama-3-8B in fp16: 32 layers × 8 KV heads × 128 dims × K and
        /// V × 2 bytes; 64 MiB for 512-token blocks, as in the Mooncake reference).
        #[arg(long)]
        block_bytes: Option<u64>,
        /// Tokens per block.
        #[arg(long, default_value_t = 512)]
        block_tokens: usize,
        /// Eviction policy.
        #[arg(long, value_enum, default_value_t = Policy::Lru)]
        policy: Policy,
        /// Prints one JSON object instead of a table.
        #[arg(long)]
        json: bool,
        /// With `--curve`: estimates the curve from this share of the blocks (0 < R <= 1),
        /// sampled by a fixed hash of each block's sequence hash (SHARDS).
        #[arg(
            long,
            requires = "curve",
            value_name = "R",
            allow_negative_numbers = true
        )]
        sample_rate: Option<f64>,
        /// With `--sample-rate`: also computes the exact curve and prints the mean
        /// absolute error of hit_blocks and hit_tokens over the printed capacities.
        #[arg(long, requires = "sample_rate")]
        compare_exact: bool,
        /// With `--curve`: writes the hit-ratio curve (against GiB, log scale) as
        /// DIR/cache-curve.svg and DIR/cache-curve.png.
        #[arg(long, requires = "curve", value_name = "DIR")]
        plot: Option<PathBuf>,
        /// A row whose tokens and hash_ids disagree at --block-tokens: error (the
        /// default), clamp or extend; the count goes to stderr.
        #[arg(long, value_enum, default_value_t = MismatchArg::Error)]
        trace_mismatch: MismatchArg,
    },
    /// The cheapest configuration of a design space that meets an SLO (latency bounds),
    /// with the Pareto fronts of cost, latency and throughput.
    Plan(cmd::plan::PlanArgs),
    /// The compute model's static estimate for a batch of identical requests: TTFT,
    /// TPOT, latency, throughput and memory, named as AIConfigurator's `cli estimate`
    /// names them; no simulation.
    Estimate(cmd::estimate::EstimateArgs),
    /// One replica's capacity tables (prefill TTFT by ISL, decode ITL by KV usage and
    /// context) in the layout NVIDIA Dynamo's SLA planner reads.
    Profile(cmd::profile::ProfileArgs),
    /// Run every point of a grid of overrides (under K seeds) in parallel into a
    /// JSON-lines file, resumable and shardable; `kvtwin sweep merge` joins shards.
    Sweep(cmd::sweep::SweepArgs),
    /// Measure this machine through the host backend and write a hardware profile.
    Calibrate(cmd::calibrate::CalibrateArgs),
    /// Run a transfer script on the host backend and on the simulator, or (--engine) a
    /// workload through a running engine cluster and through its twin; compare them.
    Validate(cmd::calibrate::ValidateArgs),
    /// A routing service fed by engine KV events (ZMQ, one --zmq per engine, or NATS),
    /// answering over HTTP/JSON until Ctrl-C.
    Router(cmd::router::RouterArgs),
    /// Relay one engine's ZMQ KV events onto NATS as Dynamo RouterEvents until Ctrl-C.
    Relay(cmd::router::RelayArgs),
    /// The shared KV block store (G4): DRAM, disk and object tiers behind the Redis
    /// protocol, until Ctrl-C.
    Store(cmd::store::StoreArgs),
    /// The storage advisor: live on the event plane (--nats, --zmq), reports per-tier
    /// occupancy, reuse distance, hot and cold sets, promotions, demotions and tier sizes;
    /// or (--replay) a recorded KV event stream through a shared tier of each size under
    /// each tiering policy (LRU, LFU, S3-FIFO, ARC).
    Advisor(cmd::advisor::AdvisorArgs),
    /// A live dashboard of a router, the engines' events, a simulation or a recording.
    Dash(cmd::dash::cli::DashArgs),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(Bench),
}

#[derive(Subcommand)]
enum Bench {
    /// Replay a kv-router-workload file (peer-bench's format) through kvtwin's indexer and
    /// print one JSON line with peer-bench's field names.
    Router {
        /// The workload file.
        #[arg(long)]
        workload: PathBuf,
        /// Event threads: 1 applies events on the replay thread; N > 1 shards the index by
        /// worker over N threads, with a barrier before each match that follows events.
        #[arg(long, default_value_t = 1)]
        threads: usize,
    },
    /// Run the full simulator on a trace (or the built-in synthetic workload) and print
    /// one JSON line: wall time, simulated requests and engine events per wall second,
    /// peak memory, and the headline outputs.
    Sim(bench::sim::SimArgs),
    /// Copy batches of KV blocks between pinned host memory and a GPU, and compare them
    /// with one large copy (CUDA events) and with `HostHardware`'s transfers (needs a
    /// build with `--features cuda` and a GPU).
    Cuda(bench::cuda::CudaArgs),
    /// Time Llama-3-8B's GEMMs on a GPU with cuBLAS (and one device-to-device copy),
    /// beside what a built-in compute profile's roofline predicts for them (needs a build
    /// with `--features cuda`, a GPU and libcublas).
    Gemm(bench::gemm::GemmArgs),
    /// Push synthetic vLLM events through ZMQ → relay → NATS → router on loopback (its
    /// own nats-server) and report block events per second and the added latency.
    Relay(bench::relay::RelayArgs),
    /// Run engines, relays, a JetStream nats-server and a router as processes for
    /// minutes, `kill -9` and restart each of the latter at seeded moments, and check the
    /// router against the engines, acknowledged events and RSS; one JSON line.
    Soak(bench::soak::SoakArgs),
    /// Time the dashboard: frames per view and size, update ingest, the replica path at
    /// the event rate, key press to frame and replay speed; one JSON line.
    Dash(bench::dash::DashBenchArgs),
    /// Load an OpenAI-compatible server (`kvtwin router --engine`, or one vLLM engine)
    /// with token-id completions: shared prefixes in a closed or open loop, or a
    /// Mooncake trace replayed; TTFT, ITL, end to end, throughput, cached tokens and
    /// requests per worker as one JSON line (a table on stderr).
    Serve(bench::serve::ServeArgs),
    /// A `kvtwin store` under concurrent SETs and GETs over twice its DRAM: torn reads
    /// (every value checked against its BLAKE3), RSS, evictions; one JSON line.
    Store(bench::store::StoreBenchArgs),
}

#[derive(Clone, Copy, ValueEnum)]
enum Policy {
    Lru,
    Priority,
}

/// A failure prints its message and its causes, as anyhow's report does, and never a
/// backtrace: Rust's own `main -> Result` prints anyhow's captured backtrace whenever
/// `RUST_BACKTRACE` is set, and a bad flag or field then reads as a crash. (A panic,
/// a bug, still prints its backtrace.)
fn main() -> std::process::ExitCode {
    match dispatch() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("{}", error_report(&error));
            std::process::ExitCode::FAILURE
        }
    }
}

/// `Error: MESSAGE`, then `Caused by:` and each cause (numbered when several).
fn error_report(error: &anyhow::Error) -> String {
    let mut report = format!("Error: {error}");
    let causes: Vec<String> = error.chain().skip(1).map(ToString::to_string).collect();
    if !causes.is_empty() {
        report.push_str("\n\nCaused by:");
        for (n, cause) in causes.iter().enumerate() {
            if causes.len() == 1 {
                report.push_str(&format!("\n    {cause}"));
            } else {
                report.push_str(&format!("\n    {n}: {cause}"));
            }
        }
    }
    report
}

fn dispatch() -> Result<()> {
    let cli = Cli::parse();
    match cli.command.unwrap_or(Command::Run {
        scenario: PathBuf::from(DEFAULT_SCENARIO),
        seed: None,
        trace: None,
        set: Vec::new(),
        json: None,
        speedup: None,
        plot: None,
        trace_mismatch: None,
    }) {
        Command::Run {
            scenario,
            seed,
            trace,
            set,
            json,
            speedup,
            plot,
            trace_mismatch,
        } => run(
            &scenario,
            RunOptions {
                seed,
                trace,
                sets: set,
                json,
                speedup,
                plot,
                trace_mismatch,
            },
        ),
        Command::Cache {
            trace,
            capacity_blocks,
            curve,
            block_bytes,
            block_tokens,
            policy,
            json,
            sample_rate,
            compare_exact,
            plot,
            trace_mismatch,
        } => {
            let check = TraceCheck {
                block_tokens: block_tokens as u64,
                mismatch: trace_mismatch.into(),
            };
            if curve {
                let extras = CurveExtras {
                    sample_rate,
                    compare_exact,
                    plot,
                };
                cache_curve(
                    TraceArg {
                        path: &trace,
                        check,
                    },
                    &capacity_blocks,
                    block_tokens,
                    block_bytes,
                    policy,
                    json,
                    &extras,
                )
            } else {
                let trace = TraceArg {
                    path: &trace,
                    check,
                };
                cache_sizes(trace, &capacity_blocks, block_tokens, policy, json)
            }
        }
        Command::Bench(Bench::Router { workload, threads }) => {
            bench::router::router(&workload, threads)
        }
        Command::Bench(Bench::Sim(args)) => bench::sim::run(&args),
        Command::Bench(Bench::Cuda(args)) => bench::cuda::run(&args),
        Command::Bench(Bench::Gemm(args)) => bench::gemm::run(&args),
        Command::Bench(Bench::Relay(args)) => bench::relay::run(&args),
        Command::Bench(Bench::Soak(args)) => bench::soak::run(&args),
        Command::Bench(Bench::Dash(args)) => bench::dash::run(&args),
        Command::Bench(Bench::Serve(args)) => bench::serve::run(&args),
        Command::Bench(Bench::Store(args)) => bench::store::run(&args),
        Command::Sweep(args) => cmd::sweep::run(&args),
        Command::Router(args) => cmd::router::router(&args),
        Command::Dash(args) => cmd::dash::cli::dash(&args),
        Command::Plan(args) => cmd::plan::plan(&args),
        Command::Profile(args) => cmd::profile::profile(&args),
        Command::Estimate(args) => cmd::estimate::run(&args),
        Command::Relay(args) => cmd::router::relay(&args),
        Command::Store(args) => cmd::store::store(&args),
        Command::Advisor(args) => cmd::advisor::advisor(&args),
        Command::Calibrate(args) => cmd::calibrate::calibrate(&args),
        Command::Validate(args) => cmd::calibrate::validate(&args),
    }
}

/// Where a run's requests come from: a trace, read as the run goes, or a generator.
pub(crate) enum Requests {
    Trace(PathBuf),
    Generated(Vec<Request>),
}

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

/// A trace named on the command line and the check to read it with.
#[derive(Clone, Copy)]
struct TraceArg<'a> {
    path: &'a Path,
    check: TraceCheck,
}

/// Reads `trace` whole with `check`, saying on stderr what the check changed.
fn read_trace(trace: &Path, check: TraceCheck) -> Result<kvtwin_sim::workload::TraceRead> {
    let read = read_mooncake_trace(trace, check)
        .with_context(|| format!("reading trace {}", trace.display()))?;
    if read.input.mismatched_rows() > 0 {
        eprintln!(
            "kvtwin: {}: {} of {} rows {} (--trace-mismatch {}): {} with tokens past their \
             hash_ids, {} with hash_ids past their tokens at {} tokens a block",
            trace.display(),
            read.input.mismatched_rows(),
            read.input.rows,
            if read.input.mismatch == TraceMismatch::Clamp {
                "clamped"
            } else {
                "extended"
            },
            read.input.mismatch.name(),
            read.input.tokens_past_hash_ids,
            read.input.hash_ids_past_tokens,
            read.input.block_tokens,
        );
    }
    Ok(read)
}

/// What `kvtwin run` was asked beyond its scenario.
struct RunOptions {
    seed: Option<u64>,
    trace: Option<PathBuf>,
    sets: Vec<String>,
    json: Option<PathBuf>,
    speedup: Option<f64>,
    plot: Option<PathBuf>,
    trace_mismatch: Option<MismatchArg>,
}

fn run(path: &Path, options: RunOptions) -> Result<()> {
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
        if path == Path::new(DEFAULT_SCENARIO) {
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
    let check = args::trace::trace_check(&scenario, trace_mismatch);
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

fn cache_sizes(
    trace: TraceArg<'_>,
    capacities: &[usize],
    block_tokens: usize,
    policy: Policy,
    json: bool,
) -> Result<()> {
    let requests = read_trace(trace.path, trace.check)?.requests;
    let eviction = match policy {
        Policy::Lru => EvictionPolicyKind::Lru,
        Policy::Priority => EvictionPolicyKind::Priority,
    };
    let mut rows = Vec::with_capacity(capacities.len());
    for &capacity in capacities {
        rows.push(
            cache::replay(&requests, capacity, block_tokens, eviction)
                .with_context(|| format!("capacity {capacity}"))?,
        );
    }
    print_rows(&rows, json);
    Ok(())
}

/// `kvtwin cache`'s rows as the JSON objects of its `"rows"` list, comma separated.
fn rows_json(rows: &[cache::CacheRow]) -> String {
    let rows: Vec<String> = rows
        .iter()
        .map(|r| {
            format!(
                "{{\"capacity_blocks\":{},\"hit_blocks\":{:.6},\"hit_tokens\":{:.6}}}",
                r.capacity_blocks, r.hit_blocks, r.hit_tokens
            )
        })
        .collect();
    rows.join(",")
}

/// `kvtwin cache`'s rows: a table, or `{"rows":[...]}` on one line.
fn print_rows(rows: &[cache::CacheRow], json: bool) {
    if json {
        println!("{{\"rows\":[{}]}}", rows_json(rows));
    } else {
        println!(
            "{:>15} {:>10} {:>10}",
            "capacity_blocks", "hit_blocks", "hit_tokens"
        );
        for row in rows {
            println!(
                "{:>15} {:>10.4} {:>10.4}",
                row.capacity_blocks, row.hit_blocks, row.hit_tokens
            );
        }
    }
}

/// KV bytes per token of Llama-3-8B in fp16 (see `--block-bytes`).
const LLAMA3_8B_KV_BYTES_PER_TOKEN: u64 = 131_072;

/// Share of the reachable hits that defines the printed knee.
const KNEE_FRACTION: f64 = 0.8;

/// `--curve`'s options beyond the exact curve: sampling, its check, and a chart.
struct CurveExtras {
    sample_rate: Option<f64>,
    compare_exact: bool,
    plot: Option<PathBuf>,
}

/// The curve `kvtwin cache --curve` prints: exact, or estimated from a sample.
enum Curve {
    Exact(cache::curve::HitCurve),
    // Boxed: its per-stratum arrays make it ten times the size of the exact one.
    Sampled(Box<cache::shards::SampledCurve>),
}

impl Curve {
    fn row(&self, capacity_blocks: usize) -> cache::CacheRow {
        match self {
            Curve::Exact(curve) => curve.row(capacity_blocks),
            Curve::Sampled(curve) => curve.row(capacity_blocks),
        }
    }

    fn saturation_blocks(&self) -> usize {
        match self {
            Curve::Exact(curve) => curve.saturation_blocks(),
            Curve::Sampled(curve) => curve.saturation_blocks(),
        }
    }

    fn knee(&self, fraction: f64) -> cache::curve::Knee {
        match self {
            Curve::Exact(curve) => curve.knee(fraction),
            Curve::Sampled(curve) => curve.knee(fraction),
        }
    }
}

/// `kvtwin cache --curve`: the listed rows, or the whole curve with its knee; sampled
/// with `--sample-rate` (and checked against the exact one with `--compare-exact`),
/// drawn with `--plot`.
fn cache_curve(
    trace: TraceArg<'_>,
    capacities: &[usize],
    block_tokens: usize,
    block_bytes: Option<u64>,
    policy: Policy,
    json: bool,
    extras: &CurveExtras,
) -> Result<()> {
    if matches!(policy, Policy::Priority) {
        bail!(
            "--curve computes LRU's stack distances; --policy priority has no inclusion \
             property, so replay each capacity without --curve"
        );
    }
    if block_tokens == 0 {
        bail!("--block-tokens must be at least 1");
    }
    if let Some(&zero) = capacities.iter().find(|c| **c == 0) {
        bail!("capacity {zero}: a cache needs at least one block");
    }
    let rate = extras
        .sample_rate
        .map(|r| cache::shards::SampleRate::new(r).with_context(|| format!("--sample-rate {r}")))
        .transpose()?;
    let requests = read_trace(trace.path, trace.check)?.requests;
    let timed = |what: &str, started: std::time::Instant| {
        eprintln!(
            "kvtwin: {what} in {:.1} ms",
            started.elapsed().as_secs_f64() * 1e3
        );
    };
    let exact = if rate.is_none() || extras.compare_exact || extras.plot.is_some() {
        let started = std::time::Instant::now();
        let exact = cache::curve::HitCurve::lru(&requests, block_tokens);
        if extras.compare_exact {
            timed("exact curve", started);
        }
        Some(exact)
    } else {
        None
    };
    let curve = match (rate, &exact) {
        (Some(rate), _) => {
            let started = std::time::Instant::now();
            let sampled = cache::shards::SampledCurve::lru(
                &requests,
                block_tokens,
                rate,
                cache::shards::Estimator::Stratified,
            );
            if extras.compare_exact {
                timed(&format!("sampled curve ({})", percent(rate.get())), started);
            }
            Curve::Sampled(Box::new(sampled))
        }
        (None, Some(exact)) => Curve::Exact(exact.clone()),
        (None, None) => unreachable!("the exact curve is computed whenever nothing is sampled"),
    };
    let block_bytes = block_bytes.unwrap_or(block_tokens as u64 * LLAMA3_8B_KV_BYTES_PER_TOKEN);
    let gib = |blocks: usize| blocks as f64 * block_bytes as f64 / (1u64 << 30) as f64;
    if let (Some(dir), Some(exact)) = (&extras.plot, &exact) {
        plot_curve(dir, exact, &curve, gib)?;
    }
    let listed = !capacities.is_empty();
    let capacities = if listed {
        capacities.to_vec()
    } else {
        cache::curve::doubling_capacities(curve.saturation_blocks())
    };
    let rows: Vec<cache::CacheRow> = capacities.iter().map(|c| curve.row(*c)).collect();
    // The sampled rate and, with --compare-exact, the error over the printed capacities.
    let mut notes = Vec::new();
    if let Curve::Sampled(sampled) = &curve {
        notes.push((
            format!("\"sample_rate\":{}", sampled.rate().get()),
            format!(
                "sampled {} of the blocks ({} references kept)",
                percent(sampled.rate().get()),
                sampled.kept_blocks()
            ),
        ));
    }
    if let (true, Some(exact)) = (extras.compare_exact, &exact) {
        let exact_rows: Vec<cache::CacheRow> = capacities.iter().map(|c| exact.row(*c)).collect();
        let (blocks, tokens) = cache::shards::mean_absolute_error(&rows, &exact_rows);
        notes.push((
            format!("\"mae\":{{\"hit_blocks\":{blocks:.6},\"hit_tokens\":{tokens:.6}}}"),
            format!(
                "mean absolute error against the exact curve over these {} capacities: \
                 hit_blocks {blocks:.4}, hit_tokens {tokens:.4}",
                capacities.len()
            ),
        ));
    }
    let json_notes: String = notes.iter().map(|(j, _)| format!(",{j}")).collect();
    if listed {
        if json {
            println!("{{\"rows\":[{}]{json_notes}}}", rows_json(&rows));
        } else {
            print_rows(&rows, false);
            notes.iter().for_each(|(_, text)| println!("{text}"));
        }
        return Ok(());
    }
    let knee = curve.knee(KNEE_FRACTION);
    let saturation = curve.saturation_blocks();
    if json {
        let rows = rows_json(&rows);
        println!(
            "{{\"rows\":[{}],\"saturation_blocks\":{saturation},\"block_bytes\":{block_bytes},\
             \"knee\":{{\"fraction\":{},\"capacity_blocks\":{}}}{json_notes}}}",
            rows, knee.fraction, knee.capacity_blocks
        );
        return Ok(());
    }
    println!(
        "{:>15} {:>10} {:>10} {:>10} {:>22}",
        "capacity_blocks", "hit_blocks", "hit_tokens", "GiB", "marginal_pp_per_GiB"
    );
    let mut previous = curve.row(0);
    for row in &rows {
        // Percentage points of hit blocks gained per GiB added since the previous row.
        let marginal = 100.0 * (row.hit_blocks - previous.hit_blocks)
            / (gib(row.capacity_blocks) - gib(previous.capacity_blocks));
        println!(
            "{:>15} {:>10.4} {:>10.4} {:>10.1} {:>22.4}",
            row.capacity_blocks,
            row.hit_blocks,
            row.hit_tokens,
            gib(row.capacity_blocks),
            marginal
        );
        previous = *row;
    }
    let reachable = curve.row(saturation);
    println!(
        "hits stop growing at {saturation} blocks ({:.1} GiB): hit_blocks {:.4}, hit_tokens {:.4}",
        gib(saturation),
        reachable.hit_blocks,
        reachable.hit_tokens
    );
    println!(
        "{:.0} % of the reachable hits at {} blocks ({:.1} GiB; hit_blocks {:.4}); {block_bytes} bytes per block",
        knee.fraction * 100.0,
        knee.capacity_blocks,
        gib(knee.capacity_blocks),
        curve.row(knee.capacity_blocks).hit_blocks
    );
    notes.iter().for_each(|(_, text)| println!("{text}"));
    Ok(())
}

/// A sampling rate as a percentage with three significant digits (rates are multiples
/// of 1/2^24, so 1 % is 0.99999905 %).
fn percent(rate: f64) -> String {
    let percent = 100.0 * rate;
    let decimals = (2 - percent.log10().floor() as i32).clamp(0, 6) as usize;
    let text = format!("{percent:.decimals$}");
    let text = if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.')
    } else {
        &text
    };
    format!("{text} %")
}

/// `--plot DIR`: hit blocks and hit tokens (in %) against GiB, exact and (when sampled)
/// estimated, at four capacities per doubling, with the exact curve's 80 % knee.
fn plot_curve(
    dir: &Path,
    exact: &cache::curve::HitCurve,
    curve: &Curve,
    gib: impl Fn(usize) -> f64,
) -> Result<()> {
    let saturation = exact.saturation_blocks().max(curve.saturation_blocks());
    let mut capacities: Vec<usize> = (0..)
        .map(|i| 2f64.powf(f64::from(i) / 4.0).round() as usize)
        .take_while(|c| *c < saturation)
        .collect();
    capacities.dedup();
    capacities.push(saturation);
    let series = |name: &str, row: &dyn Fn(usize) -> cache::CacheRow, tokens: bool| plot::Series {
        name: name.to_string(),
        points: capacities
            .iter()
            .map(|c| {
                let row = row(*c);
                (
                    gib(*c),
                    100.0
                        * if tokens {
                            row.hit_tokens
                        } else {
                            row.hit_blocks
                        },
                )
            })
            .collect(),
    };
    let exact_row = |c: usize| exact.row(c);
    let mut all = vec![
        series("hit_blocks (exact)", &exact_row, false),
        series("hit_tokens (exact)", &exact_row, true),
    ];
    if let Curve::Sampled(sampled) = curve {
        let rate = percent(sampled.rate().get());
        let sampled_row = |c: usize| sampled.row(c);
        all.push(series(
            &format!("hit_blocks (sampled, {rate})"),
            &sampled_row,
            false,
        ));
        all.push(series(
            &format!("hit_tokens (sampled, {rate})"),
            &sampled_row,
            true,
        ));
    }
    let knee = exact.knee(KNEE_FRACTION);
    all.push(plot::Series {
        name: format!(
            "{:.0} % of reachable hits (exact): {:.1} GiB",
            KNEE_FRACTION * 100.0,
            gib(knee.capacity_blocks)
        ),
        points: vec![
            (gib(knee.capacity_blocks), 0.0),
            (
                gib(knee.capacity_blocks),
                100.0 * exact.row(knee.capacity_blocks).hit_blocks,
            ),
        ],
    });
    let axes = plot::Axes {
        title: "LRU prefix-cache hit ratio by capacity",
        x_label: "cache capacity (GiB)",
        y_label: "hit ratio (%)",
        x_log: true,
        y_log: false,
    };
    let paths = plot::lines(dir, "cache-curve", &axes, &all)?;
    for path in paths {
        eprintln!("kvtwin: wrote {}", path.display());
    }
    Ok(())
}
