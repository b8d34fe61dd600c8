//! `kvtwin estimate`: the compute model's static predictions for a batch of identical
//! requests (TTFT, TPOT, latency, throughput, memory), one point or a grid, as a table or
//! JSON lines with AIConfigurator's field names.
//!
//! Owns: the flags, loading a profile (built-in name, file, or Dynamo planner profile
//! folder), expanding the grid and the output. Never: computes a figure itself; `kvtwin_sim::compute::estimate` does.

use anyhow::{bail, Context, Result};
use kvtwin_sim::autoscale::profile::{load_profiles, table_from_profiles};
use kvtwin_sim::compute::estimate::{estimate, Estimate, EstimateError, EstimateRequest};
use kvtwin_sim::compute::ComputeModel;
use std::path::Path;

/// `kvtwin estimate`.
#[derive(clap::Args)]
pub(crate) struct EstimateArgs {
    /// The compute profile: a built-in name (h100-llama3-8b, h100x4-llama3-70b,
    /// h200-llama3-8b, h200x2-llama3-70b, a100-llama3-8b, a100x8-llama3-70b, dynosim), a
    /// file holding one compute model in RON or JSON (`Roofline(...)`, `Table(...)`), or
    /// a folder of Dynamo planner profiles (selected_prefill_interpolation/raw_data.npz
    /// and selected_decode_interpolation/raw_data.npz, or prefill_raw_data.json and
    /// decode_raw_data.json) read as a measured table.
    #[arg(long)]
    compute: String,
    /// Prompt tokens per request, the cached prefix included.
    #[arg(long, default_value_t = 1024, allow_negative_numbers = true, value_parser = size)]
    isl: u64,
    /// Output tokens per request.
    #[arg(long, default_value_t = 1024, allow_negative_numbers = true, value_parser = size)]
    osl: u64,
    /// Requests in the batch (prefilled in one pass, then decoded together).
    #[arg(long, default_value_t = 1, allow_negative_numbers = true, value_parser = size)]
    batch: u64,
    /// Prompt tokens per request already in the KV cache.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true, value_parser = size)]
    prefix: u64,
    /// A grid axis, `KEY=V1,V2,...` with KEY one of isl, osl, batch, prefix; repeat for
    /// more axes. Every combination is estimated; the flags above fill the other keys.
    /// Points whose KV does not fit are skipped, each said on stderr.
    #[arg(long, value_name = "KEY=VALUES")]
    grid: Vec<String>,
    /// KV tokens the device holds, for DynoSim's utilisation term (default: what the
    /// GPU's memory holds after the weights; 1,048,576 when the profile does not say).
    #[arg(long)]
    capacity_tokens: Option<u64>,
    /// Prints one JSON object per point instead of a table.
    #[arg(long)]
    json: bool,
}

/// A count of tokens or requests: a whole number, not negative (zero is refused by the
/// estimate, naming the flag, where it is meaningless).
fn size(text: &str) -> Result<u64, String> {
    match text.trim().parse::<i64>() {
        Ok(value) if value < 0 => Err(format!("{value} is negative; sizes are counts")),
        Ok(value) => Ok(value as u64),
        Err(_) => Err(format!("{text:?} is not a whole number")),
    }
}

/// `kvtwin estimate`.
pub(crate) fn run(args: &EstimateArgs) -> Result<()> {
    let (name, model) = load_profile(&args.compute)?;
    let base = EstimateRequest {
        isl: args.isl,
        osl: args.osl,
        batch: args.batch,
        prefix: args.prefix,
        capacity_tokens: args.capacity_tokens,
    };
    let points = expand_grid(base, &args.grid)?;
    let mut estimates = Vec::with_capacity(points.len());
    let mut skipped = Vec::new();
    for (request, from_grid) in &points {
        match estimate(&model, request) {
            Ok(estimate) => estimates.push(estimate),
            // A grid shows what fits: a point that does not is said, not fatal.
            Err(error @ EstimateError::DoesNotFit { .. }) if points.len() > 1 => {
                skipped.push(flag_error(&error, from_grid));
            }
            Err(error) => return Err(flag_error(&error, from_grid)),
        }
    }
    for reason in &skipped {
        eprintln!("skipped: {reason}");
    }
    if estimates.is_empty() {
        bail!("no grid point fits: {} skipped", skipped.len());
    }
    if args.json {
        for estimate in &estimates {
            println!("{}", serde_json::to_string(estimate)?);
        }
    } else {
        print_table(&name, &model, &estimates);
    }
    Ok(())
}

/// A built-in profile by name, or a file's compute model; its name for the header.
fn load_profile(compute: &str) -> Result<(String, ComputeModel)> {
    if let Ok(model) = ComputeModel::builtin(compute) {
        return Ok((compute.to_string(), model));
    }
    let path = Path::new(compute);
    if path.is_dir() {
        let (prefill, decode) =
            load_profiles(path).with_context(|| format!("--compute: {compute}"))?;
        let table = table_from_profiles(compute, &prefill, &decode)
            .with_context(|| format!("--compute: {compute}"))?;
        return Ok((compute.to_string(), ComputeModel::Table(table)));
    }
    if !path.is_file() {
        let unknown = ComputeModel::builtin(compute).unwrap_err();
        bail!(
            "--compute: {unknown}; or a file holding a compute model (RON or JSON), or a \
             folder of Dynamo planner profiles"
        );
    }
    let model: ComputeModel = if path.extension().is_some_and(|e| e == "json") {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("--compute: reading {compute}"))?;
        serde_json::from_str(&text).with_context(|| format!("--compute: {compute}"))?
    } else {
        // As every RON input is read: errors name the file, line and column.
        kvtwin_sim::ron_file::load(path).context("--compute")?
    };
    if let ComputeModel::Table(table) = &model {
        table
            .validate()
            .with_context(|| format!("--compute: {compute}"))?;
    }
    Ok((compute.to_string(), model))
}

/// Every combination of the grid's axes over `base`, each with the grid's `KEY=VALUE`s
/// that made it (for errors).
fn expand_grid(base: EstimateRequest, axes: &[String]) -> Result<Vec<(EstimateRequest, String)>> {
    let mut points = vec![(base, String::new())];
    for axis in axes {
        let (key, values) = axis
            .split_once('=')
            .with_context(|| format!("--grid {axis}: expected KEY=V1,V2,..."))?;
        let values = values
            .split(',')
            .map(|v| size(v).map_err(|reason| anyhow::anyhow!("--grid {axis}: {reason}")))
            .collect::<Result<Vec<u64>>>()?;
        let set: fn(&mut EstimateRequest, u64) = match key.trim() {
            "isl" => |r, v| r.isl = v,
            "osl" => |r, v| r.osl = v,
            "batch" => |r, v| r.batch = v,
            "prefix" => |r, v| r.prefix = v,
            other => bail!("--grid {axis}: unknown key {other:?} (isl, osl, batch or prefix)"),
        };
        points = points
            .into_iter()
            .flat_map(|(request, label)| {
                values.iter().map(move |&value| {
                    let mut request = request;
                    set(&mut request, value);
                    let label = format!("{label} {}={value}", key.trim());
                    (request, label)
                })
            })
            .collect();
    }
    Ok(points)
}

/// The error in terms of the flag (or grid point) that caused it.
fn flag_error(error: &EstimateError, from_grid: &str) -> anyhow::Error {
    let at = if from_grid.is_empty() {
        String::new()
    } else {
        format!(" (grid point{from_grid})")
    };
    match error {
        EstimateError::Zero { field } => anyhow::anyhow!("--{field} must be at least 1{at}"),
        EstimateError::PrefixTooLong { prefix, isl } => anyhow::anyhow!(
            "--prefix {prefix} must be below --isl {isl}: at least one prompt token is \
             prefilled{at}"
        ),
        EstimateError::DoesNotFit { .. } | EstimateError::TooLarge { .. } => {
            anyhow::anyhow!("--{error}{at}")
        }
    }
}

fn print_table(name: &str, model: &ComputeModel, estimates: &[Estimate]) {
    println!(
        "{name}: static estimate of the compute model on {} GPU(s) (one batch alone: no \
         queueing, cache or scheduler)",
        model.gpus()
    );
    println!(
        "{:>7} {:>6} {:>6} {:>5} {:>10} {:>9} {:>11} {:>8} {:>10} {:>12} {:>13} {:>10} {:>10}",
        "isl",
        "osl",
        "prefix",
        "bs",
        "ttft ms",
        "tpot ms",
        "latency ms",
        "seq/s",
        "tokens/s",
        "tokens/s/gpu",
        "tokens/s/user",
        "memory GB",
        "KV/seq MB"
    );
    for e in estimates {
        let optional = |value: Option<f64>| value.map_or("-".to_string(), |v| format!("{v:.2}"));
        println!(
            "{:>7} {:>6} {:>6} {:>5} {:>10.2} {:>9.2} {:>11.1} {:>8.2} {:>10.1} {:>12.1} {:>13.1} {:>10} {:>10}",
            e.isl,
            e.osl,
            e.prefix,
            e.batch_size,
            e.ttft,
            e.tpot,
            e.request_latency,
            e.seq_per_second,
            e.tokens_per_second,
            e.tokens_per_second_per_gpu,
            e.tokens_per_second_per_user,
            optional(e.memory),
            optional(e.kv_bytes_per_sequence.map(|b| b as f64 / 1e6)),
        );
    }
}
