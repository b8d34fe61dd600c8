//! `kvtwin calibrate` and `kvtwin validate`: the command lines around
//! `kvtwin_backends::calibrate` and `kvtwin_backends::validate`.
//!
//! Owns: the flags, printing the tables and writing the profile file.
//! Never: measure or compare anything itself (the libraries do).

use anyhow::{Context, Result};
use clap::Args;
use kvtwin_backends::calibrate::{self as cal, CalibrateOptions};
use kvtwin_backends::validate;
use kvtwin_sim::validation::{load_profile, ValidationScenario};
use std::path::PathBuf;

#[derive(Args, Debug)]
pub(crate) struct CalibrateArgs {
    /// Where to write the profile (RON, the simulator's `HardwareProfile`).
    #[arg(long, default_value = "profile.ron")]
    out: PathBuf,
    /// Where the disk tier's files go (default: the system's temporary directory).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// A few seconds in all: fewer sizes and bytes per point.
    #[arg(long)]
    quick: bool,
    /// The GPU whose memory is the device tier (needs a build with `--features cuda`);
    /// by default GPU 0 when the build has the feature and the GPU opens.
    #[arg(long, conflicts_with = "no_gpu")]
    gpu: Option<u32>,
    /// Emulate the device tier in host memory even when a GPU is present.
    #[arg(long)]
    no_gpu: bool,
}

#[derive(Args, Debug)]
pub(crate) struct ValidateArgs {
    /// The validation script (RON).
    scenario: PathBuf,
    /// The hardware profile the simulator uses (from `kvtwin calibrate`).
    #[arg(long)]
    profile: PathBuf,
    /// Where the disk tier's files go (default: the system's temporary directory).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Prints one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// Runs the real backend this many times; each real figure is the median.
    #[arg(long, default_value_t = 3)]
    repeat: usize,
}

pub(crate) fn calibrate(args: &CalibrateArgs) -> Result<()> {
    let dir = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    let defaults = CalibrateOptions::new(&dir);
    let cuda_device = match (args.gpu, args.no_gpu) {
        (_, true) => None,
        (Some(ordinal), false) => Some(ordinal),
        (None, false) => defaults.cuda_device,
    };
    let options = CalibrateOptions {
        quick: args.quick,
        cuda_device,
        ..defaults
    };
    eprintln!(
        "calibrating{} (disk files in {})...",
        if args.quick { " (quick)" } else { "" },
        dir.display()
    );
    let calibration = cal::calibrate(&options).context("calibration failed")?;
    print!("{}", cal::table(&calibration));
    println!();
    print!("{}", calibration.fit_table());
    println!(
        "disk: {:?}; small disk transfers (64 KiB, 16 in flight): {:.0} reads/s, {:.0} writes/s; {} cores",
        calibration.disk_io,
        calibration.disk_ops_per_s.0,
        calibration.disk_ops_per_s.1,
        calibration.cores
    );
    println!("{}", calibration.gpu);
    let text = calibration.profile_ron()?;
    std::fs::write(&args.out, &text).with_context(|| format!("writing {}", args.out.display()))?;
    println!("profile written to {}", args.out.display());
    Ok(())
}

pub(crate) fn validate(args: &ValidateArgs) -> Result<()> {
    let script = ValidationScenario::load(&args.scenario)?;
    let profile = load_profile(&args.profile)?;
    let dir = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    let outcome = validate::validate(&script, &profile, &dir, args.repeat)?;
    if args.json {
        let json = serde_json::json!({
            "scenario": script.name,
            "profile": profile.name,
            "disk_io": format!("{:?}", outcome.disk_io),
            "worker_threads": outcome.worker_threads,
            "repeat": args.repeat.max(1),
            "metrics": outcome.metrics,
        });
        println!("{json}");
        return Ok(());
    }
    println!(
        "{}: real backend (HostHardware, {} workers, disk {:?}; median of {} runs) vs simulator (profile {})",
        script.name, outcome.worker_threads, outcome.disk_io, args.repeat.max(1), profile.name
    );
    if profile.transfer_workers != outcome.worker_threads {
        println!(
            "note: the profile models {} workers, the backend runs {}",
            profile.transfer_workers, outcome.worker_threads
        );
    }
    println!(
        "{:<40} {:>12} {:>12} {:>9}",
        "metric", "real", "sim", "error %"
    );
    for m in &outcome.metrics {
        println!(
            "{:<40} {:>12.3} {:>12.3} {:>+9.1}",
            m.name, m.real, m.sim, m.error_pct
        );
    }
    Ok(())
}
