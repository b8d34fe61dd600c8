//! `kvtwin validate`: the command line around `kvtwin_backends::validate`, a transfer
//! script run on the host backend and on the simulator; with `--engine`, the twin of a
//! running engine cluster against the cluster ([`engine`]).
//!
//! Owns: the flags, the repeats' progress, and printing the comparison (the tables, with
//! `metric_table` shared with `validate --engine`, or `--json`).
//! Never: measure or compare anything itself (the libraries do).

pub(crate) mod engine;

use super::calibrate::GpuArgs;
use anyhow::{Context, Result};
use clap::Args;
use kvtwin_backends::calibrate::CalibrateOptions;
use kvtwin_backends::validate::{self, ProfileSource, Stage, Validation};
use kvtwin_sim::hardware::HardwareProfile;
use kvtwin_sim::validation::MetricSpread;
use kvtwin_sim::validation::{load_profile, ValidationScenario, Verdict};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub(crate) struct ValidateArgs {
    /// The validation script (RON): the simulator against the host backend.
    #[arg(required_unless_present = "engine", conflicts_with = "engine")]
    scenario: Option<PathBuf>,
    /// Validates the twin of a running engine cluster instead: the URL of its
    /// `kvtwin router --engine ...` front door. The workload (`--requests`,
    /// `--prefixes`, ..., or `--trace`) goes through it to the real engines and through
    /// the twin (their cache and block size from their metrics, `--compute` their
    /// measured profile); each repeat starts from empty caches.
    #[arg(long, value_name = "ROUTER_URL", conflicts_with_all = ["profile", "calibrate", "quick", "dir", "gpu", "no_gpu"])]
    engine: Option<String>,
    #[command(flatten)]
    engine_args: engine::EngineValidateArgs,
    /// With --engine: what is sent, and when.
    #[command(flatten)]
    workload: crate::bench::serve::WorkloadArgs,
    /// The hardware profile the simulator uses for every repeat (from an earlier
    /// `kvtwin calibrate`). Without it, each repeat calibrates first (`--calibrate`).
    #[arg(long, conflicts_with = "calibrate")]
    profile: Option<PathBuf>,
    /// Calibrates right before each repeat's real run and simulates that repeat with
    /// what it measured (the default when no `--profile` is given): a shared machine's
    /// memory and disk speeds drift within minutes.
    #[arg(long)]
    calibrate: bool,
    /// With calibration: the quick one (a few seconds, fewer sizes and bytes per point).
    #[arg(long)]
    quick: bool,
    /// Where the disk tier's files go (default: the system's temporary directory).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// The real arm's device tier (calibration measures the same links).
    #[command(flatten)]
    gpu: GpuArgs,
    /// Prints one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Repeats (real run, and its calibration when calibrating); each figure is the
    /// median over them, printed beside its error's range and the real spread.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
}

pub(crate) fn validate(args: &ValidateArgs) -> Result<()> {
    let Some(scenario) = &args.scenario else {
        let router = args
            .engine
            .as_deref()
            .context("a validation script or --engine")?;
        return engine::validate_engine(
            router,
            &args.engine_args,
            &args.workload,
            args.repeat.max(1),
            args.json,
        );
    };
    if args.workload != crate::bench::serve::WorkloadArgs::defaults() {
        anyhow::bail!(
            "the workload flags (--requests, --prefixes, --trace, ...) are for --engine; a validation script states its own"
        );
    }
    let script = ValidationScenario::load(scenario)?;
    let dir = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    let given = match &args.profile {
        Some(path) => Some(load_profile(path)?),
        None => None,
    };
    let defaults = CalibrateOptions::new(&dir);
    let cuda_device = args.gpu.device(defaults.cuda_device);
    let options = CalibrateOptions {
        quick: args.quick,
        // Calibrate the links the real arm uses: its GPU's, or the emulated device's.
        cuda_device,
        // The script's transfers are its chains: calibrate the links loaded with those,
        // one I/O per block as the backend does them.
        aggregate_block_bytes: Some(script.worker.bytes_per_block),
        blocks_per_transfer: script.chain_blocks.max(1),
        ..defaults
    };
    let source = match &given {
        Some(profile) => ProfileSource::Given(profile),
        None => ProfileSource::Calibrated(&options),
    };
    let repeats = args.repeat.max(1);
    let steps = if given.is_some() {
        repeats
    } else {
        2 * repeats
    };
    let bar = crate::progress::bar(steps, "{elapsed_precise} [{bar:30}] {pos}/{len} {msg}");
    let mut started = 0;
    let outcome = validate::validate(&script, source, &dir, cuda_device, repeats, |stage| {
        let line = match stage {
            Stage::Calibrating(n) => format!("repeat {n}/{repeats}: calibrating"),
            Stage::Running(n) => format!("repeat {n}/{repeats}: running the script"),
        };
        if bar.is_hidden() {
            eprintln!("{line}...");
        } else {
            bar.set_position(started);
            bar.set_message(line);
        }
        started += 1;
    });
    bar.finish_and_clear();
    let outcome = outcome?;
    let profile_name = match &given {
        Some(profile) => profile.name.clone(),
        None => format!(
            "calibrated before each repeat{}",
            if args.quick { " (quick)" } else { "" }
        ),
    };
    if args.json {
        let json = serde_json::json!({
            "scenario": script.name,
            "profile": profile_name,
            "disk_io": format!("{:?}", outcome.disk_io),
            "worker_threads": outcome.worker_threads,
            "device_tier": outcome.device_tier,
            "repeat": repeats,
            "metrics": outcome.metrics,
            "profiles": outcome.profiles.iter().map(link_rates).collect::<Vec<_>>(),
            // Every repeat's own figures, for readers who want more than the medians.
            "runs": outcome.runs,
        });
        println!("{json}");
        return Ok(());
    }
    print!("{}", table(&script.name, &profile_name, &outcome));
    Ok(())
}

/// A profile's link rates, GB/s, for showing how calibrations drifted.
fn link_rates(profile: &HardwareProfile) -> serde_json::Value {
    let gbps = |bytes_per_s: u64| bytes_per_s as f64 / 1e9;
    serde_json::json!({
        "pcie_gbps": gbps(profile.pcie_bytes_per_s),
        "nvme_read_gbps": gbps(profile.nvme_read_bytes_per_s),
        "nvme_write_gbps": gbps(profile.nvme_write_bytes_per_s),
        "pcie_transfer_gbps": gbps(profile.pcie_transfer_bytes_per_s),
        "nvme_read_transfer_gbps": gbps(profile.nvme_read_transfer_bytes_per_s),
        "nvme_write_transfer_gbps": gbps(profile.nvme_write_transfer_bytes_per_s),
    })
}

/// The validation as a table: per metric the medians, the error (median and range over
/// the repeats), the real spread, the target and the verdict; then the profiles used.
fn table(script: &str, profile: &str, outcome: &Validation) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let repeats = outcome.runs.len();
    let _ = writeln!(
        out,
        "{script}: real backend (HostHardware, {} workers, disk {:?}) vs simulator (profile {profile}); {repeats} repeat(s), medians",
        outcome.worker_threads, outcome.disk_io
    );
    let _ = writeln!(out, "real device tier: {}", outcome.device_tier);
    if let Some(p) = outcome
        .profiles
        .iter()
        .find(|p| p.transfer_workers != outcome.worker_threads)
    {
        let _ = writeln!(
            out,
            "note: the profile models {} workers, the backend runs {}",
            p.transfer_workers, outcome.worker_threads
        );
    }
    out.push_str(&metric_table(&outcome.metrics, "sim"));
    if outcome.profiles.len() > 1 && outcome.profiles.windows(2).any(|w| w[0] != w[1]) {
        let _ = writeln!(
            out,
            "calibrated link rates per repeat, GB/s (pcie, nvme read, nvme write):"
        );
        for (n, p) in outcome.profiles.iter().enumerate() {
            let _ = writeln!(
                out,
                "  {}: {:.3} {:.3} {:.3}",
                n + 1,
                p.pcie_bytes_per_s as f64 / 1e9,
                p.nvme_read_bytes_per_s as f64 / 1e9,
                p.nvme_write_bytes_per_s as f64 / 1e9
            );
        }
    }
    out
}

/// Metrics summarised over repeats as a table (per metric the medians, the error's
/// median and range, the real spread, the target and the verdict) and a line counting
/// the verdicts; `model` heads the modelled column ("sim", "twin").
fn metric_table(metrics: &[MetricSpread], model: &str) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<38} {:>11} {:>11} {:>8} {:>17} {:>9} {:>7}  verdict",
        "metric", "real", model, "error %", "error range %", "spread %", "target"
    );
    for m in metrics {
        let target = m.target_pct.map_or(String::new(), |t| format!("{t:.0} %"));
        let verdict = if m.noisy {
            format!("{} (spread > target)", m.verdict.label())
        } else {
            m.verdict.label().to_string()
        };
        let _ = writeln!(
            out,
            "{:<38} {:>11.3} {:>11.3} {:>+8.1} {:>+8.1}..{:<+7.1} {:>9.1} {:>7}  {}",
            m.name,
            m.real,
            m.sim,
            m.error_pct,
            m.error_min_pct,
            m.error_max_pct,
            m.real_spread_pct,
            target,
            verdict
        );
    }
    let count = |v: Verdict| metrics.iter().filter(|m| m.verdict == v).count();
    let _ = writeln!(
        out,
        "targets: {} within, {} beyond the target but within the real spread, {} outside both; {} with a real spread above the target",
        count(Verdict::Within),
        count(Verdict::WithinNoise),
        count(Verdict::Outside),
        metrics.iter().filter(|m| m.noisy).count()
    );
    out
}
