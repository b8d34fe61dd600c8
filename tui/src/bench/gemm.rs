//! `kvtwin bench gemm`: a forward pass's GEMMs timed on the GPU with cuBLAS
//! (`kvtwin_backends::cuda::gemm`), beside what the compute profile's roofline predicts
//! for them, and the HBM bandwidth a device-to-device copy reaches beside the profile's.
//!
//! Owns: the flags and the printed table (or JSON line). Without feature `cuda` it says
//! how to build with it and fails.
//! Never: time anything itself (the library does, with CUDA events), or fit anything
//! (scripts/fit_compute_profiles.py fits; this checks).

use anyhow::Result;
use clap::Args;

#[derive(Args, Debug)]
pub(crate) struct GemmArgs {
    /// The GPU.
    #[arg(long, default_value_t = 0)]
    gpu: u32,
    /// The built-in roofline profile to compare with (Llama-3-8B's shapes are timed).
    #[arg(long, default_value = "h100-llama3-8b")]
    compute: String,
    /// Token counts (the GEMMs' M), comma separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,16,64,256,1024,4096,8192"
    )]
    tokens: Vec<usize>,
    /// Timed forwards per token count (the median is reported).
    #[arg(long, default_value_t = 5)]
    repeats: usize,
    /// Prints one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

#[cfg(feature = "cuda")]
pub(crate) fn run(args: &GemmArgs) -> Result<()> {
    use anyhow::bail;
    use kvtwin_backends::cuda::gemm::{self, GemmConfig};
    use kvtwin_sim::compute::{gemm_seconds, ComputeModel};

    let ComputeModel::Roofline {
        model,
        gpu,
        calibration,
    } = ComputeModel::builtin(&args.compute)?
    else {
        bail!("--compute {}: not a roofline profile", args.compute);
    };
    if gpu.count != 1 || model.name != "llama-3-8b" {
        bail!(
            "--compute {}: the benchmark times Llama-3-8B's GEMMs on one GPU; pick a \
             llama3-8b profile",
            args.compute
        );
    }
    let config = GemmConfig {
        ordinal: args.gpu,
        tokens: args.tokens.clone(),
        repeats: args.repeats,
        ..GemmConfig::default()
    };
    let report = gemm::run(&config)?;
    let predicted_ms =
        |tokens: usize| gemm_seconds(&model, &gpu, &calibration, tokens as f64) * 1e3;
    let peak = gpu.flops_per_s;
    let profile_hbm = gpu.hbm_bytes_per_s * calibration.hbm_efficiency;
    if args.json {
        let points: Vec<_> = report
            .points
            .iter()
            .map(|p| {
                serde_json::json!({
                    "tokens": p.tokens,
                    "measured_ms": p.time.as_secs_f64() * 1e3,
                    "kvtwin_ms": predicted_ms(p.tokens),
                    "tflops": p.flops_per_s / 1e12,
                    "fraction_of_peak": p.flops_per_s / peak,
                    "weight_gb_s": p.weight_bytes_per_s / 1e9,
                })
            })
            .collect();
        let json = serde_json::json!({
            "gpu": report.gpu,
            "model": report.model,
            "compute": args.compute,
            "gemm_params": report.gemm_params,
            "points": points,
            "copy_hbm_gb_s": report.copy_hbm_bytes_per_s / 1e9,
            "profile_weight_hbm_gb_s": profile_hbm / 1e9,
        });
        println!("{json}");
        return Ok(());
    }
    println!(
        "{}: {}'s GEMMs ({:.2e} weights a token, bf16, cuBLAS), median of {} forwards; \
         kvtwin: {}'s GEMM term",
        report.gpu, report.model, report.gemm_params as f64, config.repeats, args.compute
    );
    println!(
        "{:>7} {:>12} {:>11} {:>8} {:>8} {:>8} {:>12}",
        "tokens", "measured ms", "kvtwin ms", "error", "TFLOP/s", "of peak", "weights GB/s"
    );
    for p in &report.points {
        let measured = p.time.as_secs_f64() * 1e3;
        let kvtwin = predicted_ms(p.tokens);
        println!(
            "{:>7} {:>12.3} {:>11.3} {:>+7.1}% {:>8.1} {:>7.1}% {:>12.0}",
            p.tokens,
            measured,
            kvtwin,
            100.0 * (kvtwin / measured - 1.0),
            p.flops_per_s / 1e12,
            100.0 * p.flops_per_s / peak,
            p.weight_bytes_per_s / 1e9
        );
    }
    println!(
        "HBM: a device-to-device copy moves {:.0} GB/s ({:.1}% of {:.0}); the profile reads \
         weights at {:.0} GB/s",
        report.copy_hbm_bytes_per_s / 1e9,
        100.0 * report.copy_hbm_bytes_per_s / gpu.hbm_bytes_per_s,
        gpu.hbm_bytes_per_s / 1e9,
        profile_hbm / 1e9
    );
    Ok(())
}

#[cfg(not(feature = "cuda"))]
pub(crate) fn run(args: &GemmArgs) -> Result<()> {
    let _ = args;
    anyhow::bail!(
        "this kvtwin was built without CUDA: rebuild with \
         `cargo run --release -p kvtwin-tui --features cuda -- bench gemm` on a machine with an NVIDIA GPU"
    )
}
