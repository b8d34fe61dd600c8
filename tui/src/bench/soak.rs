//! `kvtwin bench soak`: the command line around `kvtwin_plane::bench::soak`.
//!
//! Owns: the flags, the tracing logs (stderr), a progress bar when stderr is a terminal,
//! and where the report goes (one JSON line on stdout, the table on stderr); a failed
//! verdict is a non-zero exit naming it. Without `nats-server` it fails with a message
//! saying how to get one.
//! Never: start, kill or check anything itself (the library runs the soak).

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use kvtwin_plane::bench::soak::{
    interrupt_flag, run_soak, Chaos, SoakConfig, SoakError, SoakProgress,
};
use kvtwin_plane::nats::NatsError;
use std::time::Duration;

#[derive(Args, Debug)]
pub(crate) struct SoakArgs {
    /// Minutes the engines publish.
    #[arg(long, default_value_t = 1.0, conflicts_with = "seconds")]
    minutes: f64,
    /// Seconds the engines publish, instead of --minutes (short runs: tests, trials).
    #[arg(long)]
    seconds: Option<f64>,
    /// Synthetic engines, each with its relay process.
    #[arg(long, default_value_t = 2)]
    engines: usize,
    /// Blocks stored per second, all engines together (removals follow once caches are
    /// full).
    #[arg(long, default_value_t = 100, value_name = "BLOCKS_PER_S")]
    rate: u64,
    /// Blocks each engine caches before it evicts.
    #[arg(long, default_value_t = 512)]
    capacity_blocks: usize,
    /// Seeds the engines' streams and the kill schedule.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// `kill -9` and restart the nats-server, a relay and the router during the run.
    #[arg(long, value_enum, default_value_t = ChaosArg::On)]
    chaos: ChaosArg,
    /// Log lines as text or as one JSON object each (filter with RUST_LOG, default info).
    #[arg(long, value_enum, default_value_t = crate::logging::LogFormat::Text)]
    log_format: crate::logging::LogFormat,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum ChaosArg {
    On,
    Off,
}

pub(crate) fn run(args: &SoakArgs) -> Result<()> {
    let seconds = args.seconds.unwrap_or(args.minutes * 60.0);
    if !(seconds.is_finite() && seconds >= 4.0) {
        bail!("the run must last at least 4 seconds");
    }
    // The soak's own NATS clients (the stream's setup, counts and rebuild) are short-lived
    // helpers: async-nats's "connected successfully" and "event: closed" at each would
    // interleave with the soak's progress. The children keep theirs, in their logs.
    crate::logging::init(args.log_format, "info,async_nats=warn")?;
    let config = SoakConfig {
        duration: Duration::from_secs_f64(seconds),
        engines: args.engines,
        rate_blocks_per_s: args.rate,
        capacity_blocks: args.capacity_blocks,
        seed: args.seed,
        chaos: match args.chaos {
            ChaosArg::On => Chaos::On,
            ChaosArg::Off => Chaos::Off,
        },
        ..SoakConfig::new()
    };
    let exe = std::env::current_exe().context("finding the kvtwin executable")?;
    let bar = crate::progress::bar(
        config.duration.as_secs() as usize,
        "{elapsed_precise} [{bar:30}] {pos}/{len} s {msg}",
    );
    let mut on_progress = |progress: &SoakProgress| {
        bar.set_position(progress.elapsed.as_secs());
        bar.set_message(format!("{}, {} kills", progress.phase, progress.kills));
    };
    let result = run_soak(&config, &exe, interrupt_flag(), &mut on_progress);
    bar.finish_and_clear();
    let report = match result {
        Ok(report) => report,
        Err(SoakError::Nats(error @ NatsError::ServerNotFound { .. })) => {
            return Err(error).context(
                "kvtwin bench soak starts its own nats-server and found none \
                 (Debian: apt-get install nats-server)",
            )
        }
        Err(error) => return Err(error).context("kvtwin bench soak"),
    };
    println!("{}", report.to_json());
    eprint!("{report}");
    let failed: Vec<&str> = report
        .verdicts
        .iter()
        .filter(|verdict| !verdict.passed)
        .map(|verdict| verdict.name)
        .collect();
    if !failed.is_empty() {
        bail!("kvtwin bench soak: verdicts failed: {}", failed.join(", "));
    }
    Ok(())
}
