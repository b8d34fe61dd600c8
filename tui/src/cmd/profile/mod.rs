//! `kvtwin profile`: one replica's capacity tables, written where NVIDIA Dynamo's SLA
//! planner reads them (its `--profile-results-dir`), and printed as two short tables:
//! predicted by the simulator for a scenario's worker, or measured on a running engine
//! (`--engine URL`, [`engine`]).
//!
//! Owns: the flags, loading the scenario, and the output. Never: measure or interpolate
//! anything itself: that is `kvtwin_sim::autoscale::profile`'s (or, for an engine,
//! `engine`'s).

pub(crate) mod engine;

use anyhow::{Context, Result};
use kvtwin_sim::autoscale::profile::{
    default_grid, gpus_per_replica, profile_decode, profile_prefill, write_profiles, DecodeProfile,
    PrefillProfile,
};
use kvtwin_sim::scenario::Scenario;
use std::path::PathBuf;

/// `kvtwin profile`.
#[derive(clap::Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["scenario", "engine"])))]
pub(crate) struct ProfileArgs {
    /// The scenario whose worker is profiled (one replica of it: its hardware, compute
    /// model and worker; the cluster, faults and workload are ignored).
    scenario: Option<PathBuf>,
    /// Measures a running engine instead of simulating one: its OpenAI-compatible URL
    /// (`http://HOST:PORT`; a vLLM engine, whose metrics give its cache's size and block
    /// size). Prefill time by prompt length and decode step time by batch and context,
    /// each `--repeats` times; also writes `compute.ron` (the `Table` compute model) and
    /// `engine_profile.json` (every repeat). Repeated, the engines of one cluster are
    /// measured together, each point on all of them at once: engines sharing a
    /// machine's cores slow each other, and their twin should step at that speed.
    #[arg(long, value_name = "URL", conflicts_with_all = ["set", "kv_usage"])]
    engine: Vec<String>,
    /// With --engine: sends every measuring request through this router (`kvtwin router`
    /// fronting the engines), pinned to the engine it measures (Dynamo's
    /// `nvext.backend_instance_id`), so the router's own work shares the machine as it
    /// does while serving. The engines' ids are read from the router's `/v1/engines`.
    #[arg(long, value_name = "URL", requires = "engine")]
    router: Option<String>,
    /// With --engine: times each point is measured (the median is kept, the spread
    /// printed and recorded) [default: 3].
    #[arg(long)]
    repeats: Option<usize>,
    /// With --engine: batch sizes to measure decode at (default 1,2,4,8,16,32, those
    /// that fit the cache).
    #[arg(long, value_delimiter = ',', value_name = "SEQUENCES")]
    batch: Option<Vec<u64>>,
    /// With --engine: output tokens of each decoding sequence [default: 32].
    #[arg(long)]
    osl: Option<u32>,
    /// The folder to write into, in Dynamo's layout:
    /// selected_prefill_interpolation/raw_data.npz,
    /// selected_decode_interpolation/raw_data.npz, prefill_raw_data.json and
    /// decode_raw_data.json.
    #[arg(long)]
    out: PathBuf,
    /// Input lengths to profile prefill at, tokens (default: 128 to 16,384 by powers of
    /// two, those that fit the device; with --engine, the block size doubled up to what
    /// the engine takes).
    #[arg(long, value_delimiter = ',', value_name = "TOKENS")]
    isl: Option<Vec<usize>>,
    /// Context lengths to profile decode at, tokens (default: 512 to 16,384 by powers of
    /// two, those of which two fit the device; with --engine, 4, 16 and 32 blocks).
    #[arg(long, value_delimiter = ',', value_name = "TOKENS")]
    context: Option<Vec<usize>>,
    /// KV usages to profile decode at, fractions of the device's KV tokens (default:
    /// 0.05,0.1,0.2,0.3,0.5,0.7,0.9).
    #[arg(long, value_delimiter = ',', value_name = "FRACTION")]
    kv_usage: Option<Vec<f64>>,
    /// Overrides a scenario field by its dotted path (as `kvtwin run --set`), e.g.
    /// `--set worker.tiers.0.capacity_blocks=8000`; repeatable.
    #[arg(long, value_name = "FIELD=VALUE")]
    set: Vec<String>,
}

/// `kvtwin profile`.
pub(crate) fn profile(args: &ProfileArgs) -> Result<()> {
    if !args.engine.is_empty() {
        let as_tokens = |list: &Option<Vec<usize>>| {
            list.as_ref()
                .map(|list| list.iter().map(|&n| n as u64).collect())
        };
        let grid = engine::EngineGrid {
            isl: as_tokens(&args.isl),
            contexts: as_tokens(&args.context),
            batches: args.batch.clone(),
            osl: args.osl.unwrap_or(32),
            repeats: args.repeats.unwrap_or(3),
        };
        return engine::profile_engine(&args.engine, args.router.as_deref(), &grid, &args.out);
    }
    if args.repeats.is_some() || args.batch.is_some() || args.osl.is_some() {
        anyhow::bail!(
            "--repeats, --batch and --osl measure a running engine: they need --engine URL"
        );
    }
    let Some(path) = &args.scenario else {
        anyhow::bail!("kvtwin profile needs a scenario or --engine URL");
    };
    let scenario = Scenario::load(path)?;
    let scenario = if args.set.is_empty() {
        scenario
    } else {
        scenario.with_overrides(&args.set)?
    };
    let (isls, contexts, usages) = default_grid(&scenario);
    let isls = args.isl.clone().unwrap_or(isls);
    let contexts = args.context.clone().unwrap_or(contexts);
    let usages = args.kv_usage.clone().unwrap_or(usages);
    let prefill = profile_prefill(&scenario, &isls).context("profiling prefill")?;
    let decode = profile_decode(&scenario, &contexts, &usages).context("profiling decode")?;
    let written = write_profiles(&args.out, &prefill, &decode)?;
    let gpus = gpus_per_replica(&scenario)?;
    println!(
        "{}: one replica, {gpus} GPU(s), {} KV tokens on the device (predictions of the \
         model, not measurements)",
        scenario.name, decode.max_kv_tokens
    );
    print_prefill(&prefill);
    print_decode(&decode);
    for path in written {
        println!("wrote {}", path.display());
    }
    Ok(())
}

fn print_prefill(prefill: &PrefillProfile) {
    println!("\nprefill: one request alone on an empty replica");
    println!("{:>8}  {:>10}  {:>14}", "ISL", "TTFT ms", "tokens/s/GPU");
    for i in 0..prefill.isl.len() {
        println!(
            "{:>8}  {:>10.2}  {:>14.0}",
            prefill.isl[i], prefill.ttft_ms[i], prefill.thpt_per_gpu[i]
        );
    }
}

fn print_decode(decode: &DecodeProfile) {
    println!(
        "\ndecode: a batch decoding together, its prompts cached (context = prompt + output / 2)"
    );
    println!(
        "{:>8}  {:>8}  {:>6}  {:>8}  {:>14}",
        "context", "KV usage", "batch", "ITL ms", "tokens/s/GPU"
    );
    for i in 0..decode.kv_usage.len() {
        let context = decode.context_length[i];
        let batch = (decode.kv_usage[i] * decode.max_kv_tokens as f64 / context).round();
        println!(
            "{:>8}  {:>8.3}  {:>6}  {:>8.2}  {:>14.0}",
            context, decode.kv_usage[i], batch, decode.itl_ms[i], decode.thpt_per_gpu[i]
        );
    }
}
