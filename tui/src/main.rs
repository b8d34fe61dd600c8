//! `kvtwin`: the command line.
//!
//! `kvtwin` alone (what `cargo run --release` runs) simulates `scenarios/default.ron` and
//! prints its report; `kvtwin run` takes another scenario, seed or trace; `kvtwin cache`
//! answers "how big must the cache be for this trace?"; `kvtwin router` and `kvtwin
//! relay` run the event plane's services. All logic lives in the libraries.
//!
//! Owns: parsing the command line ([`Cli`]: the subcommands, and the flags of `run`,
//! `cache` and `bench router`), dispatching to the subcommand's module, and how a
//! failure is printed. Never: a subcommand's own work, which is its module's: `cmd` (one
//! per subcommand), `bench` (one per benchmark); flags several share are in `args`,
//! charts in `plot`.

mod args;
mod bench;
mod cmd;
mod logging;
mod plot;
mod progress;
mod runtime;

use anyhow::Result;
use args::trace::MismatchArg;
use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;

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
    Validate(cmd::validate::ValidateArgs),
    /// A routing service fed by engine KV events (ZMQ, one --zmq per engine, or NATS),
    /// answering over HTTP/JSON until Ctrl-C.
    Router(cmd::router::RouterArgs),
    /// Relay one engine's ZMQ KV events onto NATS as Dynamo RouterEvents until Ctrl-C.
    Relay(cmd::relay::RelayArgs),
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
        /// Replay through no index (each event's and query's first hash read, nothing
        /// done): the replay's own cost, which every figure of this method includes.
        /// Prints `"impl": "floor"`; one thread only.
        #[arg(long)]
        floor: bool,
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
        } => cmd::run::run(
            &scenario,
            cmd::run::RunOptions {
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
        } => cmd::cache::cache(cmd::cache::CacheOptions {
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
        }),
        Command::Bench(Bench::Router {
            workload,
            threads,
            floor,
        }) => bench::router::router(&workload, threads, floor),
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
        Command::Relay(args) => cmd::relay::relay(&args),
        Command::Store(args) => cmd::store::store(&args),
        Command::Advisor(args) => cmd::advisor::advisor(&args),
        Command::Calibrate(args) => cmd::calibrate::calibrate(&args),
        Command::Validate(args) => cmd::validate::validate(&args),
    }
}
