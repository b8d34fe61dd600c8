//! `kvtwin bench sim`: the whole simulator on a trace, timed, as one JSON line.
//!
//! Owns: the command's flags, the cluster they describe and the wall-clock and memory
//! measurements around one [`simulate`] call (a clock is allowed here, at the edge).
//! Never: change what the simulation computes: the same flags give a byte-identical
//! report, whose digest the line carries so that runs can be compared.
//!
//! The cluster is `scenarios/default.ron` (compiled in, so the command needs no file)
//! with the flags applied: `--workers` identical workers of `--device-blocks`,
//! `--host-blocks` and `--disk-blocks` blocks of `--block-tokens` tokens, each tier
//! writing back to the next one present, routed by `--routing`, timed by the `--compute`
//! profile (DynoSim's own timing by default, as the peer figures use), caching the
//! blocks generated tokens fill unless `--cache-output-blocks false` (DynoSim caches them).

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use kvtwin::manager::{OffloadPolicy, TierConfig};
use kvtwin::pool::EvictionPolicyKind;
use kvtwin::tier::Tier;
use kvtwin_sim::cluster::simulate;
use kvtwin_sim::hardware::ComputeChoice;
use kvtwin_sim::scenario::{Routing, Scenario, WorkloadSpec};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The scenario every `bench sim` starts from.
const BASE: &str = include_str!("../../../scenarios/default.ron");

/// KV bytes per token of Llama-3-8B in bf16 (the default scenario's model).
const KV_BYTES_PER_TOKEN: u64 = 128 * 1024;

#[derive(Args, Debug)]
pub(crate) struct SimArgs {
    /// A Mooncake-format trace (512-token blocks); without it, the default scenario's
    /// synthetic conversations.
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Workers in the cluster.
    #[arg(long, default_value_t = 16)]
    workers: usize,
    /// Device blocks per worker.
    #[arg(long, default_value_t = 1000)]
    device_blocks: usize,
    /// Host (DRAM) blocks per worker; 0 for none.
    #[arg(long, default_value_t = 4000)]
    host_blocks: usize,
    /// Disk (NVMe) blocks per worker; 0 for none.
    #[arg(long, default_value_t = 0)]
    disk_blocks: usize,
    /// Tokens per block.
    #[arg(long, default_value_t = 512)]
    block_tokens: usize,
    /// How requests pick their worker.
    #[arg(long, value_enum, default_value_t = RoutingArg::Kv)]
    routing: RoutingArg,
    /// Built-in compute profile (`dynosim`, `h100-llama3-8b`, ...).
    #[arg(long, default_value = "dynosim")]
    compute: String,
    /// The run's seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Whether blocks filled by generated tokens are cached, as DynoSim's vLLM model
    /// (and vLLM) do: `true` or `false`.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    cache_output_blocks: bool,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum RoutingArg {
    Kv,
    RoundRobin,
}

/// Write back when a tenth of the tier is all that is free, if a lower tier exists.
fn tier(tier: Tier, capacity_blocks: usize, lower: bool) -> TierConfig {
    TierConfig {
        tier,
        capacity_blocks,
        eviction: EvictionPolicyKind::Lru,
        offload: if lower {
            OffloadPolicy::WriteBack {
                low_watermark_blocks: (capacity_blocks / 10).max(1),
            }
        } else {
            OffloadPolicy::None
        },
    }
}

fn scenario(args: &SimArgs) -> Result<Scenario> {
    let mut scenario = Scenario::parse(BASE, Path::new("scenarios/default.ron"))?;
    scenario.name = "bench-sim".to_string();
    scenario.seed = args.seed;
    scenario.cluster.workers = args.workers;
    scenario.cluster.routing = match args.routing {
        RoutingArg::Kv => Routing::Kv,
        RoutingArg::RoundRobin => Routing::RoundRobin,
    };
    scenario.hardware.compute = Some(ComputeChoice::Builtin(args.compute.clone()));
    let worker = &mut scenario.worker;
    worker.block_size_tokens = args.block_tokens;
    worker.bytes_per_block = args.block_tokens as u64 * KV_BYTES_PER_TOKEN;
    worker.cache_output_blocks = args.cache_output_blocks;
    let (host, disk) = (args.host_blocks > 0, args.disk_blocks > 0);
    worker.tiers = vec![tier(Tier::Device, args.device_blocks, host || disk)];
    if host {
        worker.tiers.push(tier(Tier::Host, args.host_blocks, disk));
    }
    if disk {
        worker.tiers.push(tier(Tier::Disk, args.disk_blocks, false));
    }
    // Re-validate what the flags changed (an unknown compute profile, an empty tier).
    let text = ron::to_string(&scenario).context("serialising the scenario")?;
    Scenario::parse(&text, Path::new("bench sim flags")).map_err(Into::into)
}

/// The process's peak resident set (Linux `VmHWM`), if the platform reports it.
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

pub(crate) fn run(args: &SimArgs) -> Result<()> {
    if args.workers == 0 || args.device_blocks == 0 || args.block_tokens == 0 {
        bail!("--workers, --device-blocks and --block-tokens must be at least 1");
    }
    let scenario = scenario(args)?;
    // The trace is read as the run goes (and timed with it, as a peer reading its trace
    // would be): memory follows the requests in flight, not the trace.
    let (report, wall_s) = match &args.trace {
        Some(trace) => {
            let start = Instant::now();
            let check = crate::args::trace::trace_check(&scenario, None);
            let report = crate::cmd::run::simulate_trace(&scenario, trace, check)?;
            (report, start.elapsed().as_secs_f64())
        }
        None => {
            let WorkloadSpec::Conversations(spec) = &scenario.workload else {
                bail!("the base scenario names no workload");
            };
            let requests = spec.generate(scenario.seed, args.block_tokens);
            let start = Instant::now();
            let report = simulate(&scenario, &requests).context("building the cluster")?;
            (report, start.elapsed().as_secs_f64())
        }
    };
    let json = report.to_json();
    let per_s = |n: u64| n as f64 / wall_s.max(1e-9);
    let fraction = |n: u64| {
        if report.blocks.total == 0 {
            0.0
        } else {
            n as f64 / report.blocks.total as f64
        }
    };
    let line = serde_json::json!({
        "wall_s": wall_s,
        "requests": report.requests,
        "completed": report.completed,
        "requests_per_s": per_s(report.requests),
        "engine_events": report.engine_events,
        "events_per_s": per_s(report.engine_events),
        "kv_events": report.events.events,
        "peak_rss_bytes": peak_rss_bytes(),
        "simulated_s": report.simulated_s,
        "workers": report.workers,
        "routing": report.routing.mode,
        "ttft_p50_ms": report.ttft.p50_ms,
        "ttft_p99_ms": report.ttft.p99_ms,
        "ttft_mean_ms": report.ttft.mean_ms,
        "tpot_mean_ms": report.tpot.mean_ms,
        "hit_ratio": report.hit_ratio,
        "hit_token_ratio": report.hit_token_ratio,
        "hit_device": fraction(report.blocks.device),
        "hit_host": fraction(report.blocks.host),
        "hit_disk": fraction(report.blocks.disk),
        "preemptions": report.preemptions,
        "router_view_matches_pools": report.routing.view_matches_pools,
        "report_digest": format!("{:016x}", xxhash_rust::xxh3::xxh3_64(json.as_bytes())),
    });
    println!("{line}");
    Ok(())
}
