//! `kvtwin calibrate`: the command line around `kvtwin_backends::calibrate`, which
//! measures this machine through the host backend.
//!
//! Owns: the flags (with [`GpuArgs`], which `kvtwin validate` shares), printing the
//! tables and writing the profile file.
//! Never: measure anything itself (the library does).

use anyhow::{Context, Result};
use clap::Args;
use kvtwin_backends::calibrate::{self as cal, CalibrateOptions};
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
    #[command(flatten)]
    gpu: GpuArgs,
    /// Your block size in bytes: the points with many transfers in flight, which fit
    /// each link's aggregate rate and servers, move blocks of this size (default 4 MiB;
    /// 1 MiB with --quick), and when given, one transfer's rate is taken at this shape
    /// (with --blocks-per-transfer) rather than from the line through all sizes.
    #[arg(long, alias = "block-bytes")]
    aggregate_bytes: Option<u64>,
    /// Blocks each of those transfers moves, one I/O per block (a chain of that many
    /// blocks of --aggregate-bytes each), as a manager moves a prefix's blocks together.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=64))]
    blocks_per_transfer: u64,
}

/// Which GPU's memory is the device tier, for `calibrate` and `validate`.
#[derive(Args, Debug)]
pub(crate) struct GpuArgs {
    /// The GPU whose memory is the device tier, with the host tier pinned for it (needs
    /// a build with `--features cuda`); by default GPU 0 when the build has the feature
    /// and the GPU opens.
    #[arg(long, conflicts_with = "no_gpu")]
    gpu: Option<u32>,
    /// Emulate the device tier in host memory even when a GPU is present.
    #[arg(long)]
    no_gpu: bool,
}

impl GpuArgs {
    /// The GPU asked for, or `default` (`CalibrateOptions::new`'s: GPU 0 if this build
    /// can open it, found once).
    pub(super) fn device(&self, default: Option<u32>) -> Option<u32> {
        match (self.gpu, self.no_gpu) {
            (_, true) => None,
            (Some(ordinal), false) => Some(ordinal),
            (None, false) => default,
        }
    }
}

pub(crate) fn calibrate(args: &CalibrateArgs) -> Result<()> {
    let dir = args.dir.clone().unwrap_or_else(std::env::temp_dir);
    let defaults = CalibrateOptions::new(&dir);
    let options = CalibrateOptions {
        quick: args.quick,
        cuda_device: args.gpu.device(defaults.cuda_device),
        aggregate_block_bytes: args.aggregate_bytes,
        blocks_per_transfer: args.blocks_per_transfer as usize,
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
