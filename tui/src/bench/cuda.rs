//! `kvtwin bench cuda`: the command line around `kvtwin_backends::cuda::bench`.
//!
//! Owns: the flags and the printed table (or JSON line). Without feature `cuda` it says
//! how to build with it and fails.
//! Never: time anything itself (the library does, with CUDA events).

use anyhow::Result;
use clap::Args;

#[derive(Args, Debug)]
pub(crate) struct CudaArgs {
    /// The GPU.
    #[arg(long, default_value_t = 0)]
    gpu: u32,
    /// Bytes of one block, in MiB.
    #[arg(long, default_value_t = 2)]
    block_mib: usize,
    /// Blocks copied per run.
    #[arg(long, default_value_t = 512)]
    blocks: usize,
    /// Blocks per transfer on the `HostHardware` path.
    #[arg(long, default_value_t = 32)]
    blocks_per_transfer: usize,
    /// Timed runs per figure (the median is reported).
    #[arg(long, default_value_t = 10)]
    repeats: usize,
    /// Prints one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

#[cfg(feature = "cuda")]
pub(crate) fn run(args: &CudaArgs) -> Result<()> {
    use kvtwin_backends::cuda::bench::{self, BlockCopyConfig};
    let config = BlockCopyConfig {
        ordinal: args.gpu,
        block_bytes: args.block_mib << 20,
        blocks: args.blocks,
        blocks_per_transfer: args.blocks_per_transfer,
        repeats: args.repeats,
    };
    let report = bench::run(config)?;
    let gb = |bytes_per_s: f64| bytes_per_s / 1e9;
    if args.json {
        let direction = |d: &bench::DirectionFigures| {
            serde_json::json!({
                "bulk_gb_s": gb(d.bulk_bytes_per_s),
                "blocks_gb_s": gb(d.blocks_bytes_per_s),
                "hardware_gb_s": gb(d.hardware_bytes_per_s),
                "blocks_ratio": d.blocks_ratio(),
                "hardware_ratio": d.hardware_ratio(),
            })
        };
        let json = serde_json::json!({
            "gpu": report.gpu,
            "block_bytes": config.block_bytes,
            "blocks": config.blocks,
            "blocks_per_transfer": config.blocks_per_transfer,
            "h2d": direction(&report.host_to_device),
            "d2h": direction(&report.device_to_host),
        });
        println!("{json}");
        return Ok(());
    }
    println!(
        "{}: {} blocks of {} MiB, median of {} runs",
        report.gpu, config.blocks, args.block_mib, config.repeats
    );
    println!(
        "{:<5} {:>10} {:>12} {:>8} {:>20} {:>8}",
        "dir", "bulk GB/s", "blocks GB/s", "ratio", "HostHardware GB/s", "ratio"
    );
    for (name, d) in [
        ("H2D", &report.host_to_device),
        ("D2H", &report.device_to_host),
    ] {
        println!(
            "{:<5} {:>10.2} {:>12.2} {:>7.1}% {:>20.2} {:>7.1}%",
            name,
            gb(d.bulk_bytes_per_s),
            gb(d.blocks_bytes_per_s),
            100.0 * d.blocks_ratio(),
            gb(d.hardware_bytes_per_s),
            100.0 * d.hardware_ratio()
        );
    }
    Ok(())
}

#[cfg(not(feature = "cuda"))]
pub(crate) fn run(args: &CudaArgs) -> Result<()> {
    let _ = args;
    anyhow::bail!(
        "this kvtwin was built without CUDA: rebuild with \
         `cargo run --release -p kvtwin-tui --features cuda -- bench cuda` on a machine with an NVIDIA GPU"
    )
}
